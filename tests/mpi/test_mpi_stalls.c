/* A rank of the MPI transport stalled at each phase of a collective (docs/library.md, Communicators
 * and transports), with a timeout shorter and one longer than the stall, and an abort from a
 * watchdog thread while the stalled rank is inside its call: every rank returns (OK with the right
 * result, or SELDP_ERR_TIMEOUT / SELDP_ERR_ABORTED naming the stalled rank or the abort), and the
 * outputs of a rank that returned an error hold the sentinel they were filled with, checked
 * after the stalled rank has resumed and finished its call: nothing writes into a caller's
 * memory after its call returned.
 *
 * By default each scenario stalls every phase once, the collective changing from case to
 * case; with SELDP_MPI_STALLS_ALL=1 (the test labelled slow) every collective meets every
 * phase. The checks are noted as they go and asserted at the end, so that no rank leaves a
 * test while the others are in a collective. */
#define _POSIX_C_SOURCE 200809L

#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm/mpi/mpi_fault.h"
#include "mpi_test.h"

#define SHORT_TIMEOUT_S 0.3
#define LONG_TIMEOUT_S  20.0
#define ELEMS           2048 /* per rank: 16 KiB of f64, beyond an eager message */
#define PIECE           256  /* alltoallv: elements to each rank */
#define MAX_RANKS       8
#define SENTINEL        0xA5

typedef enum call {
    CALL_BARRIER,
    CALL_BROADCAST,
    CALL_ALLREDUCE,
    CALL_ALLGATHER,
    CALL_ALLGATHERV,
    CALL_ALLTOALLV,
    CALL_SPLIT,
    CALL_COUNT
} call;

static const char *const call_names[] = {"barrier",    "broadcast", "allreduce", "allgather",
                                         "allgatherv", "alltoallv", "split"};

typedef enum scenario {
    STALL_PAST_TIMEOUT, /* the last rank stalls 1 s, the timeout is 0.3 s */
    STALL_WITHIN,       /* the last rank stalls 0.3 s, the timeout is 20 s */
    WATCHDOG_ABORT,     /* rank 0 stalls 0.6 s; its watchdog thread aborts after 0.15 s */
    SCENARIO_COUNT
} scenario;

static const char *const scenario_names[] = {"a stall past the timeout", "a stall within it",
                                             "a watchdog's abort"};

static const seldp__mpi_stall phases[] = {SELDP__MPI_STALL_ARRIVE, SELDP__MPI_STALL_HEADER,
                                          SELDP__MPI_STALL_BODY, SELDP__MPI_STALL_LEAVE};
static const char *const phase_names[] = {"", "arrive", "header", "body", "leave"};
#define PHASE_COUNT 4

static void sleep_s(double s)
{
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

/* What went wrong on this rank so far. */
typedef struct notes {
    char text[8192];
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

static void assert_no_notes(const notes *ns)
{
    if (ns->count)
        fail_msg("rank %d: %d check(s) failed:\n%s", mt_rank, ns->count, ns->text);
}

/* The buffers of one collective: inputs, outputs filled with the sentinel, and what the
 * outputs hold on success. */
typedef struct buffers {
    double send[ELEMS];
    double recv[ELEMS * MAX_RANKS];
    double want[ELEMS * MAX_RANKS];
    size_t out_bytes; /* of recv that the call may write */
    size_t lens[MAX_RANKS], want_lens[MAX_RANKS];
    void *blob;
    seldp_comm *group;
} buffers;

static double input(int rank, int i)
{
    return rank * 100000.0 + i;
}

static void prepare(buffers *b, call c)
{
    int n = mt_size;
    for (int i = 0; i < ELEMS; i++)
        b->send[i] = input(mt_rank, i);
    memset(b->recv, SENTINEL, sizeof b->recv);
    memset(b->lens, SENTINEL, sizeof b->lens);
    b->blob = NULL;
    b->group = NULL;
    b->out_bytes = 0;
    switch (c) {
    case CALL_BROADCAST:
        b->out_bytes = ELEMS * sizeof(double);
        for (int i = 0; i < ELEMS; i++)
            b->want[i] = input(0, i);
        if (mt_rank == 0) /* the root's buffer is its input */
            memcpy(b->recv, b->want, b->out_bytes);
        break;
    case CALL_ALLREDUCE:
        b->out_bytes = ELEMS * sizeof(double);
        for (int i = 0; i < ELEMS; i++) {
            b->want[i] = 0;
            for (int r = 0; r < n; r++)
                b->want[i] += input(r, i);
        }
        break;
    case CALL_ALLGATHER:
        b->out_bytes = (size_t)n * ELEMS * sizeof(double);
        for (int r = 0; r < n; r++)
            for (int i = 0; i < ELEMS; i++)
                b->want[r * ELEMS + i] = input(r, i);
        break;
    case CALL_ALLGATHERV:
        for (int r = 0; r < n; r++)
            b->want_lens[r] = (size_t)(r + 1) * 64 * sizeof(double);
        break;
    case CALL_ALLTOALLV:
        b->out_bytes = (size_t)n * PIECE * sizeof(double);
        for (int p = 0; p < n; p++)
            for (int i = 0; i < PIECE; i++)
                b->want[p * PIECE + i] = input(p, mt_rank * PIECE + i);
        break;
    default:
        break;
    }
}

static seldp_status run_call(seldp_comm *comm, call c, buffers *b)
{
    size_t counts[MAX_RANKS], displs[MAX_RANKS];
    for (int p = 0; p < mt_size; p++) {
        counts[p] = PIECE;
        displs[p] = (size_t)p * PIECE;
    }
    switch (c) {
    case CALL_BARRIER:
        return seldp_comm_barrier(comm);
    case CALL_BROADCAST:
        return seldp_comm_broadcast(comm, b->recv, ELEMS, SELDP_F64, 0, SELDP_HOST_DEVICE);
    case CALL_ALLREDUCE:
        return seldp_comm_allreduce(comm, b->send, b->recv, ELEMS, SELDP_F64, SELDP_HOST_DEVICE);
    case CALL_ALLGATHER:
        return seldp_comm_allgather(comm, b->send, b->recv, ELEMS * sizeof(double),
                                    SELDP_HOST_DEVICE);
    case CALL_ALLGATHERV:
        return seldp_comm_allgatherv(comm, b->send, (size_t)(mt_rank + 1) * 64 * sizeof(double),
                                     &b->blob, b->lens);
    case CALL_ALLTOALLV:
        return seldp_comm_alltoallv(comm, b->send, counts, displs, b->recv, counts, displs,
                                    SELDP_F64, SELDP_HOST_DEVICE);
    default:
        return seldp_comm_split(comm, 0, mt_rank, &b->group);
    }
}

/* Whether msg names `rank`: "rank 3", or 3 in a list "ranks 1, 2, 3". */
static bool names_rank(const char *msg, int rank)
{
    for (const char *p = msg; (p = strstr(p, "rank")) != NULL; p += 4) {
        const char *q = p + 4 + (p[4] == 's');
        if (*q++ != ' ')
            continue;
        for (;;) {
            char *end = NULL;
            long r = strtol(q, &end, 10);
            if (end == q)
                break;
            if (r == rank)
                return true;
            if (strncmp(end, ", ", 2) != 0)
                break;
            q = end + 2;
        }
    }
    return false;
}

static bool all_sentinel(const void *p, size_t bytes)
{
    const unsigned char *c = p;
    for (size_t i = 0; i < bytes; i++)
        if (c[i] != SENTINEL)
            return false;
    return true;
}

/* The outputs after the call returned `st` (and every rank finished its call). */
static void check_outputs(notes *ns, const char *what, call c, seldp_status st, buffers *b)
{
    bool is_root = c == CALL_BROADCAST && mt_rank == 0;
    if (st != SELDP_OK) {
        if (is_root) {
            if (memcmp(b->recv, b->want, b->out_bytes) != 0)
                note(ns, "rank %d: %s: the root's buffer changed", mt_rank, what);
        } else if (!all_sentinel(b->recv, sizeof b->recv)) {
            note(ns, "rank %d: %s returned %s, yet its output was written after the return",
                 mt_rank, what, seldp_status_name(st));
        }
        if (c == CALL_ALLGATHERV && (b->blob || !all_sentinel(b->lens, sizeof b->lens)))
            note(ns, "rank %d: %s returned %s, yet it set the blob or the lengths", mt_rank, what,
                 seldp_status_name(st));
        if (c == CALL_SPLIT && b->group)
            note(ns, "rank %d: %s returned %s with a group", mt_rank, what, seldp_status_name(st));
        return;
    }
    if (memcmp(b->recv, b->want, b->out_bytes) != 0)
        note(ns, "rank %d: %s succeeded with a wrong result", mt_rank, what);
    if (!all_sentinel((const char *)b->recv + b->out_bytes, sizeof b->recv - b->out_bytes))
        note(ns, "rank %d: %s wrote past its output", mt_rank, what);
    if (c == CALL_ALLGATHERV) {
        size_t at = 0;
        for (int r = 0; r < mt_size; r++) {
            bool right = b->lens[r] == b->want_lens[r];
            for (size_t i = 0; right && i < b->lens[r] / sizeof(double); i++) {
                double v;
                memcpy(&v, (char *)b->blob + at + i * sizeof v, sizeof v);
                right = v == input(r, (int)i);
            }
            if (!right)
                note(ns, "rank %d: %s succeeded with a wrong blob from rank %d", mt_rank, what, r);
            at += b->lens[r];
        }
    }
    if (c == CALL_SPLIT && (!b->group || seldp_comm_size(b->group) != mt_size))
        note(ns, "rank %d: %s succeeded without the whole group", mt_rank, what);
}

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

/* Whether the collective cannot complete on any rank before the stalled rank goes on. */
static bool blocks_everyone(call c, seldp__mpi_stall phase)
{
    (void)c;
    return phase == SELDP__MPI_STALL_ARRIVE;
}

/* One case: a new world, the stall armed on one rank, the collective on every rank, then
 * (after every rank returned) the checks. */
static void run_case(notes *ns, scenario sc, seldp__mpi_stall phase, call c)
{
    double timeout = sc == STALL_PAST_TIMEOUT ? SHORT_TIMEOUT_S : LONG_TIMEOUT_S;
    double stall = sc == STALL_PAST_TIMEOUT ? 1.0 : sc == STALL_WITHIN ? 0.3 : 0.6;
    int staller = sc == WATCHDOG_ABORT ? 0 : mt_size - 1;
    char what[160], staller_name[32];
    snprintf(what, sizeof what, "%s with %s at %s", call_names[c], scenario_names[sc],
             phase_names[phase]);
    snprintf(staller_name, sizeof staller_name, "rank %d", staller);
    static buffers b;
    prepare(&b, c);
    seldp_comm *world = mt_world(timeout);
    if (mt_rank == staller && seldp__mpi_fault_stall(world, phase, stall) != SELDP_OK)
        note(ns, "rank %d: %s: arming the stall: %s", mt_rank, what, seldp_last_error());
    watchdog wd = {world, 0.15};
    pthread_t thread;
    bool started = false;
    if (sc == WATCHDOG_ABORT && mt_rank == 0)
        started = pthread_create(&thread, NULL, watchdog_main, &wd) == 0;
    mt_sync();

    double t0 = mt_now();
    seldp_status st = run_call(world, c, &b);
    double took = mt_now() - t0;
    char message[512];
    snprintf(message, sizeof message, "%s", st == SELDP_OK ? "" : seldp_last_error());
    if (started)
        pthread_join(thread, NULL);
    else if (sc == WATCHDOG_ABORT && mt_rank == 0)
        note(ns, "rank 0: %s: the watchdog thread could not start", what);
    /* Every rank has returned, the stalled one included, and MPI has made progress in
     * this barrier: whatever the abandoned operations still had to move has moved. */
    mt_sync();

    check_outputs(ns, what, c, st, &b);
    if (st != SELDP_OK && st != SELDP_ERR_TIMEOUT && st != SELDP_ERR_ABORTED)
        note(ns, "rank %d: %s returned %s: %s", mt_rank, what, seldp_status_name(st), message);
    if (took > timeout + stall + 10.0)
        note(ns, "rank %d: %s took %.2f s", mt_rank, what, took);
    bool stalled_rank = mt_rank == staller;
    switch (sc) {
    case STALL_PAST_TIMEOUT:
        if (!stalled_rank && blocks_everyone(c, phase) &&
            (st != SELDP_ERR_TIMEOUT || !names_rank(message, staller)))
            note(ns, "rank %d: %s returned %s (%s), expected a timeout naming %s", mt_rank, what,
                 seldp_status_name(st), message, staller_name);
        if (!stalled_rank && st != SELDP_OK && !names_rank(message, staller) &&
            !strstr(message, "aborted"))
            note(ns, "rank %d: %s: the message names neither %s nor the abort: %s", mt_rank, what,
                 staller_name, message);
        if (stalled_rank && blocks_everyone(c, phase) && st != SELDP_ERR_TIMEOUT)
            note(ns, "rank %d: the late rank's %s returned %s (%s), expected the timeout", mt_rank,
                 what, seldp_status_name(st), message);
        break;
    case STALL_WITHIN:
        if (st != SELDP_OK)
            note(ns, "rank %d: %s returned %s: %s", mt_rank, what, seldp_status_name(st), message);
        break;
    default:
        if (st != SELDP_OK && !strstr(message, "rank 0 aborted the world"))
            note(ns, "rank %d: %s returned %s (%s), expected the abort of rank 0", mt_rank, what,
                 seldp_status_name(st), message);
        if (blocks_everyone(c, phase) && st != SELDP_ERR_ABORTED)
            note(ns, "rank %d: %s returned %s, expected SELDP_ERR_ABORTED", mt_rank, what,
                 seldp_status_name(st));
        if (stalled_rank && phase != SELDP__MPI_STALL_LEAVE && c != CALL_BARRIER &&
            c != CALL_SPLIT && st != SELDP_ERR_ABORTED)
            note(ns, "rank 0: %s returned %s, expected SELDP_ERR_ABORTED", what,
                 seldp_status_name(st));
        break;
    }
    free(b.blob);
    seldp_comm_destroy(b.group);
    seldp_comm_destroy(world);
    mt_sync();
}

static bool every_case(void)
{
    const char *all = getenv("SELDP_MPI_STALLS_ALL");
    return all && *all && strcmp(all, "0") != 0;
}

static void run_scenario(scenario sc)
{
    notes ns = {"", 0};
    for (int p = 0; p < PHASE_COUNT; p++) {
        if (every_case()) {
            for (int c = 0; c < CALL_COUNT; c++)
                run_case(&ns, sc, phases[p], (call)c);
        } else {
            /* one collective per phase, a different one in each scenario */
            run_case(&ns, sc, phases[p], (call)((1 + p + 2 * (int)sc) % CALL_COUNT));
        }
    }
    assert_no_notes(&ns);
}

static void test_stall_past_the_timeout(void **state)
{
    (void)state;
    run_scenario(STALL_PAST_TIMEOUT);
}

static void test_stall_within_the_timeout(void **state)
{
    (void)state;
    run_scenario(STALL_WITHIN);
}

static void test_watchdog_abort_at_every_phase(void **state)
{
    (void)state;
    run_scenario(WATCHDOG_ABORT);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        MT_TEST(test_stall_past_the_timeout),
        MT_TEST(test_stall_within_the_timeout),
        MT_TEST(test_watchdog_abort_at_every_phase),
    };
    return mt_main(argc, argv, "mpi_stalls", tests, sizeof tests / sizeof *tests);
}
