/* Faults of the hybrid transport (seldp/hybrid.h) over processes x threads: a rank thread
 * that arrives late, one that stalls inside a collective, a leader that stalls inside, and
 * a watchdog's abort. Every rank of every process returns SELDP_ERR_TIMEOUT or
 * SELDP_ERR_ABORTED within a bound of the timeout, none hangs. Threads per process:
 * SELDP_HYBRID_THREADS (default 2). */
#define _POSIX_C_SOURCE 200809L

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "comm/hybrid/hybrid_fault.h"
#include "hybrid_test.h"

static int threads = 2;

typedef struct fault {
    int victim;            /* world rank */
    seldp__hy_stall where; /* 0: the victim aborts the world from its thread instead */
    double timeout_s, bound_s;
} fault;

static int fault_rank(tr_rank_ctx *ctx)
{
    const fault *f = ctx->arg;
    RANK_CHECK_OK(ctx, seldp_comm_barrier(ctx->world)); /* every rank is in */
    enum { N = 4096 };
    static _Thread_local float x[N], y[N];
    seldp_status st;
    double t0 = mt_now();
    if (ctx->rank == f->victim && f->where == 0) {
        struct timespec ts = {0, 300 * 1000 * 1000};
        nanosleep(&ts, NULL);
        seldp_comm_abort(ctx->world); /* as a watchdog would */
        st = seldp_comm_allreduce(ctx->world, x, y, N, SELDP_F32, SELDP_HOST_DEVICE);
        RANK_CHECK(ctx, st == SELDP_ERR_ABORTED, "after its abort: %s", seldp_status_name(st));
        return 0;
    }
    if (ctx->rank == f->victim)
        RANK_CHECK_OK(ctx, seldp__hy_fault_stall(ctx->world, f->where, 4 * f->timeout_s + 5));
    st = seldp_comm_allreduce(ctx->world, x, y, N, SELDP_F32, SELDP_HOST_DEVICE);
    double took = mt_now() - t0;
    RANK_CHECK(ctx, st == SELDP_ERR_TIMEOUT || st == SELDP_ERR_ABORTED,
               "allreduce returned %s (%s), expected a timeout or an abort", seldp_status_name(st),
               seldp_last_error());
    RANK_CHECK(ctx, strlen(seldp_last_error()) > 0, "no message");
    RANK_CHECK(ctx, ctx->rank == f->victim || took < f->bound_s,
               "returned after %.2f s, expected within %.2f s (%s)", took, f->bound_s,
               seldp_last_error());
    /* the world stays aborted */
    st = seldp_comm_barrier(ctx->world);
    RANK_CHECK(ctx, st == SELDP_ERR_TIMEOUT || st == SELDP_ERR_ABORTED, "barrier after: %s",
               seldp_status_name(st));
    return 0;
}

/* a thread of the last process that is not its leader (its last one), or its leader */
static int victim(bool leader)
{
    int last_first = (mt_size - 1) * threads;
    return leader ? last_first : last_first + threads - 1;
}

static void test_late_arrival(void **state)
{
    (void)state;
    fault f = {victim(false), SELDP__HY_STALL_ARRIVE, 1.0, 1.0 * 3 + 3};
    ht_run(threads, f.timeout_s, fault_rank, &f);
}

static void test_stall_inside(void **state)
{
    (void)state;
    fault f = {victim(false), SELDP__HY_STALL_STEP, 1.0, 1.0 * 3 + 3};
    ht_run(threads, f.timeout_s, fault_rank, &f);
}

static void test_leader_stalls_inside(void **state)
{
    (void)state;
    /* its process's other ranks wait for it 2 T + 2 s */
    fault f = {victim(true), SELDP__HY_STALL_STEP, 1.0, 1.0 * 4 + 4};
    ht_run(threads, f.timeout_s, fault_rank, &f);
}

static void test_leader_arrives_late(void **state)
{
    (void)state;
    fault f = {victim(true), SELDP__HY_STALL_ARRIVE, 1.0, 1.0 * 3 + 3};
    ht_run(threads, f.timeout_s, fault_rank, &f);
}

static void test_watchdog_abort(void **state)
{
    (void)state;
    /* a long timeout: the abort, not the timeout, ends the others' wait */
    fault f = {victim(false), 0, 60.0, 10.0};
    ht_run(threads, f.timeout_s, fault_rank, &f);
}

int main(int argc, char **argv)
{
    const char *env = getenv("SELDP_HYBRID_THREADS");
    if (env && atoi(env) > 0)
        threads = atoi(env);
    const struct CMUnitTest tests[] = {
        MT_TEST(test_late_arrival),         MT_TEST(test_stall_inside),
        MT_TEST(test_leader_stalls_inside), MT_TEST(test_leader_arrives_late),
        MT_TEST(test_watchdog_abort),
    };
    return ht_main(argc, argv, "hybrid_faults", tests, sizeof tests / sizeof *tests);
}
