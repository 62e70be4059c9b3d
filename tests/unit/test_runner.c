/* The rank runner (harness/runner.h): the first failure in time wins and keeps its message,
 * a failure aborts the world so that the others return at once, the barrier holds with more
 * threads than cores, and every started thread is joined. */
#define _GNU_SOURCE /* clock_gettime, nanosleep, sched_yield */

#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "runner.h"
#include "seldp/seldp.h"

#define WORLD_TIMEOUT_S 60.0

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Rank 2 fails at once; the others fail only after they saw it (their barrier returns
 * false), with another message: rank 2 and its message must be the report's. */
static int fail_first_then_echo(hx_runner_rank *r)
{
    if (r->rank == 2)
        return hx_runner_fail(r, "the cause: rank %d", r->rank);
    if (hx_runner_barrier(r))
        return 0; /* the barrier passed although rank 2 failed: the report says so */
    return hx_runner_fail(r, "an echo: rank %d", r->rank);
}

static void test_first_failure_wins(void **state)
{
    (void)state;
    for (int round = 0; round < 20; round++) {
        hx_runner_report rep;
        int failed = hx_runner_run(6, fail_first_then_echo, NULL, &rep);
        assert_int_equal(failed, 6);
        assert_int_equal(rep.failed, 6);
        assert_int_equal(rep.first, 2);
        assert_string_equal(rep.why, "the cause: rank 2");
    }
}

/* A rank that returns non-zero without a message is reported as such. */
static int return_three(hx_runner_rank *r)
{
    return r->rank == 1 ? 3 : 0;
}

static void test_failure_without_message(void **state)
{
    (void)state;
    hx_runner_report rep;
    assert_int_equal(hx_runner_run(3, return_three, NULL, &rep), 1);
    assert_int_equal(rep.first, 1);
    assert_string_equal(rep.why, "rank function returned 3");
}

typedef struct world_run {
    seldp_host_world *host;
    atomic_int joined;
    atomic_int aborted; /* ranks whose barrier returned SELDP_ERR_ABORTED */
} world_run;

/* Rank 0 fails once every rank has joined; the others wait in a collective that only the
 * abort can end before the world's timeout. */
static int abort_the_world(hx_runner_rank *r)
{
    world_run *w = r->arg;
    seldp_comm *comm = NULL;
    if (seldp_host_comm_init(w->host, r->rank, SELDP_HOST_DEVICE, &comm) != SELDP_OK)
        return hx_runner_fail(r, "join: %s", seldp_last_error());
    r->comm = comm;
    int result = 0;
    atomic_fetch_add(&w->joined, 1);
    if (r->rank == 0) {
        while (atomic_load(&w->joined) < r->size)
            sched_yield();
        result = hx_runner_fail(r, "rank 0 gives up");
    } else {
        seldp_status st = seldp_comm_barrier(comm);
        if (st == SELDP_ERR_ABORTED)
            atomic_fetch_add(&w->aborted, 1);
        result = hx_runner_fail(r, "barrier returned %s", seldp_status_name(st));
    }
    r->comm = NULL;
    seldp_comm_destroy(comm);
    return result;
}

static void test_failure_aborts_the_world(void **state)
{
    (void)state;
    enum { N = 4 };
    seldp_comm_config cfg = SELDP_COMM_CONFIG_INIT;
    cfg.timeout_s = WORLD_TIMEOUT_S;
    world_run w = {NULL, 0, 0};
    assert_int_equal(seldp_host_world_create(N, &cfg, &w.host), SELDP_OK);
    hx_runner_report rep;
    double t0 = now_s();
    int failed = hx_runner_run(N, abort_the_world, &w, &rep);
    double elapsed = now_s() - t0;
    seldp_host_world_destroy(w.host);
    assert_int_equal(failed, N);
    assert_int_equal(rep.first, 0);
    assert_string_equal(rep.why, "rank 0 gives up");
    assert_int_equal(atomic_load(&w.aborted), N - 1);
    assert_true(elapsed < WORLD_TIMEOUT_S / 4);
}

typedef struct count_run {
    atomic_int arrivals;
    atomic_int wrong; /* ranks that saw a count the barrier should have ruled out */
    int rounds;
} count_run;

/* Every round each rank adds one, waits, and must see every rank's addition of the round
 * and none of the next (the second barrier holds the next round back). */
static int count_rounds(hx_runner_rank *r)
{
    count_run *c = r->arg;
    for (int round = 0; round < c->rounds; round++) {
        atomic_fetch_add(&c->arrivals, 1);
        if (!hx_runner_barrier(r))
            return hx_runner_fail(r, "barrier failed in round %d", round);
        if (atomic_load(&c->arrivals) != (round + 1) * r->size)
            atomic_fetch_add(&c->wrong, 1);
        if (!hx_runner_barrier(r))
            return hx_runner_fail(r, "barrier failed in round %d", round);
    }
    return 0;
}

static void test_barrier_more_threads_than_cores(void **state)
{
    (void)state;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int n = (int)(cores > 0 ? 4 * cores : 16);
    if (n > 128)
        n = 128;
    count_run c = {0, 0, 50};
    hx_runner_report rep;
    assert_int_equal(hx_runner_run(n, count_rounds, &c, &rep), 0);
    assert_int_equal(rep.failed, 0);
    assert_int_equal(rep.first, -1);
    assert_string_equal(rep.why, "");
    assert_int_equal(atomic_load(&c.arrivals), n * c.rounds);
    assert_int_equal(atomic_load(&c.wrong), 0);
}

/* Odd ranks fail; every rank, failed or not, finishes before hx_runner_run returns. */
static int finish_or_fail(hx_runner_rank *r)
{
    atomic_int *finished = r->arg;
    struct timespec ts = {0, 1000000L * (r->rank % 5)};
    nanosleep(&ts, NULL);
    atomic_fetch_add(finished, 1);
    return r->rank % 2 ? hx_runner_fail(r, "rank %d fails", r->rank) : 0;
}

static void test_join_always(void **state)
{
    (void)state;
    atomic_int finished = 0;
    hx_runner_report rep;
    assert_int_equal(hx_runner_run(9, finish_or_fail, &finished, &rep), 4);
    assert_int_equal(atomic_load(&finished), 9);
    assert_int_equal(rep.first % 2, 1);
    char expect[64];
    snprintf(expect, sizeof expect, "rank %d fails", rep.first);
    assert_string_equal(rep.why, expect);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_first_failure_wins),
        cmocka_unit_test(test_failure_without_message),
        cmocka_unit_test(test_failure_aborts_the_world),
        cmocka_unit_test(test_barrier_more_threads_than_cores),
        cmocka_unit_test(test_join_always),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
