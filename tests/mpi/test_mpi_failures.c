/* The MPI transport under failure: a rank that never arrives makes the others return
 * SELDP_ERR_TIMEOUT naming it, and seldp_comm_abort on one rank (on any communicator of
 * the world, from any thread) makes the others return SELDP_ERR_ABORTED, pending calls
 * included, well within the timeout. Every such world stays aborted.
 *
 * A failed check never leaves the test early: every rank makes every collective of the
 * test, the checks are noted as they go and asserted at the end, so that no rank waits
 * in a collective that a failing rank skipped. */
#define _POSIX_C_SOURCE 200809L

#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mpi_test.h"

#define SHORT_TIMEOUT_S 0.3
#define LONG_TIMEOUT_S  20.0

static void sleep_s(double s)
{
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

/* What went wrong on this rank so far in the current test. */
typedef struct notes {
    char text[4096];
    int count;
} notes;

#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
static void
note(notes *ns, const char *fmt, ...)
{
    size_t used = strlen(ns->text);
    va_list ap;
    va_start(ap, fmt);
    if (used + 2 < sizeof ns->text) {
        if (used)
            ns->text[used++] = '\n';
        vsnprintf(ns->text + used, sizeof ns->text - used, fmt, ap);
    }
    va_end(ap);
    ns->count++;
}

static void expect_status(notes *ns, seldp_status st, seldp_status expected, const char *needle)
{
    if (st != expected || (needle && !strstr(seldp_last_error(), needle)))
        note(ns, "rank %d: got %s (%s), expected %s mentioning \"%s\"", mt_rank,
             seldp_status_name(st), seldp_last_error(), seldp_status_name(expected),
             needle ? needle : "");
}

/* The end of a test, after its last collective: fail it with every note. */
static void assert_no_notes(const notes *ns)
{
    if (ns->count)
        fail_msg("rank %d: %d check(s) failed:\n%s", mt_rank, ns->count, ns->text);
}

typedef enum call {
    CALL_BARRIER,
    CALL_BROADCAST,
    CALL_ALLREDUCE,
    CALL_ALLGATHERV,
    CALL_ALLTOALLV,
    CALL_SPLIT,
    CALL_COUNT
} call;

static const char *const call_names[] = {"barrier",    "broadcast", "allreduce",
                                         "allgatherv", "alltoallv", "split"};

/* One collective of the kind `c` with small buffers. */
static seldp_status run_call(seldp_comm *comm, call c)
{
    int n = seldp_comm_size(comm);
    double data[64] = {0}, out[64] = {0};
    size_t counts[16], displs[16], lens[16];
    void *blob = NULL;
    seldp_comm *group = NULL;
    seldp_status st = SELDP_OK;
    for (int p = 0; p < n && p < 16; p++) {
        counts[p] = 1;
        displs[p] = (size_t)p;
    }
    switch (c) {
    case CALL_BARRIER:
        st = seldp_comm_barrier(comm);
        break;
    case CALL_BROADCAST:
        st = seldp_comm_broadcast(comm, data, 8, SELDP_F64, 0, SELDP_HOST_DEVICE);
        break;
    case CALL_ALLREDUCE:
        st = seldp_comm_allreduce(comm, data, out, 8, SELDP_F64, SELDP_HOST_DEVICE);
        break;
    case CALL_ALLGATHERV:
        st = seldp_comm_allgatherv(comm, data, 16, &blob, lens);
        free(blob);
        break;
    case CALL_ALLTOALLV:
        st = seldp_comm_alltoallv(comm, data, counts, displs, out, counts, displs, SELDP_F64,
                                  SELDP_HOST_DEVICE);
        break;
    default:
        st = seldp_comm_split(comm, 0, 0, &group);
        seldp_comm_destroy(group);
        break;
    }
    return st;
}

/* The last rank skips one collective of each kind: the others time out after the
 * timeout and name it; when it arrives late it finds the world aborted by the timeout. */
static void test_a_rank_that_never_arrives(void **state)
{
    (void)state;
    int last = mt_size - 1;
    char who[32];
    notes ns = {"", 0};
    snprintf(who, sizeof who, "rank %d", last);
    for (int c = 0; c < CALL_COUNT; c++) {
        seldp_comm *world = mt_world(SHORT_TIMEOUT_S);
        if (mt_rank != last) {
            double t0 = mt_now();
            seldp_status st = run_call(world, (call)c);
            double waited = mt_now() - t0;
            expect_status(&ns, st, SELDP_ERR_TIMEOUT, call_names[c]);
            expect_status(&ns, st, SELDP_ERR_TIMEOUT, who);
            if (waited < 0.8 * SHORT_TIMEOUT_S || waited > SHORT_TIMEOUT_S + 5.0)
                note(&ns, "rank %d: %s gave up after %.3f s with a timeout of %g s", mt_rank,
                     call_names[c], waited, SHORT_TIMEOUT_S);
        } else {
            sleep_s(SHORT_TIMEOUT_S + 1.0);
            double t0 = mt_now();
            seldp_status st = run_call(world, (call)c);
            expect_status(&ns, st, SELDP_ERR_TIMEOUT, "aborted");
            if (mt_now() - t0 > 5.0)
                note(&ns, "rank %d: the late %s took %.3f s to see the aborted world", mt_rank,
                     call_names[c], mt_now() - t0);
        }
        /* The world stays aborted. */
        expect_status(&ns, seldp_comm_barrier(world), SELDP_ERR_TIMEOUT, "aborted");
        seldp_comm_destroy(world);
        mt_sync();
    }
    assert_no_notes(&ns);
}

/* Rank 0 aborts through a split group while the others wait in a world allreduce. */
static void test_abort_reaches_ranks_waiting_in_a_collective(void **state)
{
    (void)state;
    seldp_comm *world = mt_world(LONG_TIMEOUT_S), *group = NULL;
    notes ns = {"", 0};
    expect_status(&ns, seldp_comm_split(world, mt_rank % 2, mt_rank, &group), SELDP_OK, NULL);
    double data[4] = {1, 2, 3, 4}, out[4];
    if (mt_rank == 0) {
        sleep_s(0.2);
        seldp_comm_abort(group ? group : world);
        expect_status(&ns, seldp_comm_allreduce(world, data, out, 4, SELDP_F64, SELDP_HOST_DEVICE),
                      SELDP_ERR_ABORTED, "rank 0 aborted the world");
    } else {
        double t0 = mt_now();
        seldp_status st = seldp_comm_allreduce(world, data, out, 4, SELDP_F64, SELDP_HOST_DEVICE);
        double waited = mt_now() - t0;
        expect_status(&ns, st, SELDP_ERR_ABORTED, "rank 0 aborted the world");
        if (waited > 5.0)
            note(&ns, "rank %d: the abort took %.3f s to arrive", mt_rank, waited);
    }
    /* Every communicator of the world is aborted, on every rank. */
    if (group)
        expect_status(&ns, seldp_comm_barrier(group), SELDP_ERR_ABORTED, "aborted");
    expect_status(&ns, seldp_comm_barrier(world), SELDP_ERR_ABORTED, "aborted");
    seldp_comm_destroy(group);
    seldp_comm_destroy(world);
    assert_no_notes(&ns);
}

/* An abort before the others call: their next collective fails at once. */
static void test_abort_before_the_others_call(void **state)
{
    (void)state;
    seldp_comm *world = mt_world(LONG_TIMEOUT_S);
    notes ns = {"", 0};
    int aborter = mt_size - 1;
    if (mt_rank == aborter)
        seldp_comm_abort(world);
    mt_sync();
    double t0 = mt_now();
    uint64_t word = 7;
    seldp_status st = seldp_comm_broadcast(world, &word, 1, SELDP_U64, 0, SELDP_HOST_DEVICE);
    char needle[64];
    snprintf(needle, sizeof needle, "rank %d aborted the world", aborter);
    expect_status(&ns, st, SELDP_ERR_ABORTED, needle);
    if (mt_now() - t0 > 5.0)
        note(&ns, "rank %d: the broadcast took %.3f s to fail", mt_rank, mt_now() - t0);
    seldp_comm_destroy(world);
    assert_no_notes(&ns);
}

/* seldp_comm_abort from a watchdog thread of rank 0, as ncclCommAbort is used. */
typedef struct watchdog {
    seldp_comm *comm;
    double after_s;
} watchdog;

static void *watchdog_main(void *p)
{
    watchdog *wd = p;
    sleep_s(wd->after_s);
    seldp_comm_abort(wd->comm);
    return NULL;
}

/* While rank 0's own thread waits inside a broadcast for the others (who come 1 s late),
 * its watchdog thread aborts: rank 0 returns at once, the others find the world aborted. */
static void test_abort_from_a_watchdog_thread_during_a_call(void **state)
{
    (void)state;
    seldp_comm *world = mt_world(LONG_TIMEOUT_S);
    notes ns = {"", 0};
    watchdog wd = {world, 0.2};
    pthread_t thread;
    bool started = false;
    double buf[1024] = {0}, t0 = mt_now();
    if (mt_rank == 0)
        started = pthread_create(&thread, NULL, watchdog_main, &wd) == 0;
    else
        sleep_s(1.0);
    seldp_status st = seldp_comm_broadcast(world, buf, 1024, SELDP_F64, 0, SELDP_HOST_DEVICE);
    double took = mt_now() - t0;
    expect_status(&ns, st, SELDP_ERR_ABORTED, "rank 0 aborted the world");
    if (mt_rank == 0 && took > 0.9)
        note(&ns, "rank 0: the broadcast returned %.3f s after the start, the abort came at 0.2 s",
             took);
    if (started)
        pthread_join(thread, NULL);
    else if (mt_rank == 0)
        note(&ns, "rank 0: the watchdog thread could not start");
    expect_status(&ns, seldp_comm_barrier(world), SELDP_ERR_ABORTED, "aborted");
    seldp_comm_destroy(world);
    assert_no_notes(&ns);
}

/* A watchdog's abort while rank 0's own thread is busy elsewhere: its next call fails and
 * tells the others, who are waiting for it in a barrier. */
static void test_abort_from_a_watchdog_thread_between_calls(void **state)
{
    (void)state;
    seldp_comm *world = mt_world(LONG_TIMEOUT_S);
    notes ns = {"", 0};
    watchdog wd = {world, 0.05};
    pthread_t thread;
    if (mt_rank == 0) {
        if (pthread_create(&thread, NULL, watchdog_main, &wd) == 0)
            pthread_join(thread, NULL);
        else
            note(&ns, "rank 0: the watchdog thread could not start");
    }
    double t0 = mt_now();
    seldp_status st = seldp_comm_barrier(world);
    expect_status(&ns, st, SELDP_ERR_ABORTED, "rank 0 aborted the world");
    if (mt_now() - t0 > 5.0)
        note(&ns, "rank %d: the barrier took %.3f s to fail", mt_rank, mt_now() - t0);
    seldp_comm_destroy(world);
    assert_no_notes(&ns);
}

/* A world's abort stays in that world: a new one works. */
static void test_a_new_world_after_an_abort(void **state)
{
    (void)state;
    seldp_comm *world = mt_world(LONG_TIMEOUT_S);
    notes ns = {"", 0};
    if (mt_rank == 0)
        seldp_comm_abort(world);
    mt_sync();
    seldp_comm *fresh = mt_world(LONG_TIMEOUT_S);
    int64_t one = 1, count = 0;
    expect_status(&ns, seldp_comm_allreduce(fresh, &one, &count, 1, SELDP_I64, SELDP_HOST_DEVICE),
                  SELDP_OK, NULL);
    seldp_comm_destroy(fresh);
    seldp_comm_destroy(world);
    assert_no_notes(&ns);
    assert_int_equal(count, mt_size);
}

/* Messages on their way to an aborted world never reach the next one. The last rank aborts
 * and leaves at once while the others start collectives it never joins, so their headers
 * are still travelling to it when it destroys its communicators; the next world, made at
 * once, must see only its own traffic (MPI gives a new communicator the context id of a
 * freed one, and delivers to it what was on its way to the old). Rounds, for the timing. */
static void test_no_stale_messages_after_an_abort(void **state)
{
    (void)state;
    notes ns = {"", 0};
    int aborter = mt_size - 1;
    for (int round = 0; round < 12; round++) {
        seldp_comm *world = mt_world(LONG_TIMEOUT_S), *group = NULL;
        expect_status(&ns, seldp_comm_split(world, 0, mt_rank, &group), SELDP_OK, NULL);
        if (mt_rank == aborter) {
            seldp_comm_abort(group);
        } else {
            double data[64] = {0}, out[64];
            (void)seldp_comm_allreduce(group, data, out, 64, SELDP_F64, SELDP_HOST_DEVICE);
            (void)seldp_comm_allreduce(world, data, out, 64, SELDP_F64, SELDP_HOST_DEVICE);
        }
        seldp_comm_destroy(group);
        seldp_comm_destroy(world);

        seldp_comm *fresh = mt_world(LONG_TIMEOUT_S), *pair = NULL;
        expect_status(&ns, seldp_comm_split(fresh, mt_rank / 2, mt_rank, &pair), SELDP_OK, NULL);
        int64_t mine = mt_rank + 1, sum = 0, word = mt_rank == 0 ? 1000 + round : -1;
        expect_status(&ns,
                      seldp_comm_allreduce(fresh, &mine, &sum, 1, SELDP_I64, SELDP_HOST_DEVICE),
                      SELDP_OK, NULL);
        if (sum != (int64_t)mt_size * (mt_size + 1) / 2)
            note(&ns, "rank %d, round %d: the fresh world's sum is %lld, expected %lld", mt_rank,
                 round, (long long)sum, (long long)mt_size * (mt_size + 1) / 2);
        expect_status(&ns, seldp_comm_broadcast(fresh, &word, 1, SELDP_I64, 0, SELDP_HOST_DEVICE),
                      SELDP_OK, NULL);
        if (word != 1000 + round)
            note(&ns, "rank %d, round %d: the fresh world's broadcast gave %lld", mt_rank, round,
                 (long long)word);
        if (pair)
            expect_status(&ns, seldp_comm_barrier(pair), SELDP_OK, NULL);
        seldp_comm_destroy(pair);
        seldp_comm_destroy(fresh);
    }
    assert_no_notes(&ns);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        MT_TEST(test_a_rank_that_never_arrives),
        MT_TEST(test_abort_reaches_ranks_waiting_in_a_collective),
        MT_TEST(test_abort_before_the_others_call),
        MT_TEST(test_abort_from_a_watchdog_thread_during_a_call),
        MT_TEST(test_abort_from_a_watchdog_thread_between_calls),
        MT_TEST(test_a_new_world_after_an_abort),
        MT_TEST(test_no_stale_messages_after_an_abort),
    };
    return mt_main(argc, argv, "mpi_failures", tests, sizeof tests / sizeof *tests);
}
