/* The NCCL transport on real GPUs: a world of min(#GPUs, 8) ranks, one pthread per GPU,
 * running the collective contract, splits and a session over device tensors; an abort and
 * a missing rank that must make every other rank return instead of hanging; two ranks on
 * one GPU refused; and a world joined from an externally distributed unique id (the MPI
 * bootstrap path). Exits 77 without a GPU; `--host` runs the transport-independent checks on
 * the host-staged transport to validate them. */
#define _POSIX_C_SOURCE 200809L /* clock_gettime, setenv */

#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>
#include <cuda_runtime_api.h>

#include "gpu_checks.h"
#include "seldp/nccl.h"

#define MAX_RANKS 8

static gpu_world_kind kind = GPU_WORLD_NCCL;
static int world_size = 1;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void test_collectives(void **state)
{
    (void)state;
    gpu_run_ranks_or_fail(kind, world_size, 1, 120.0, gpu_check_collectives, NULL);
}

static void test_session(void **state)
{
    (void)state;
    gpu_run_ranks_or_fail(kind, world_size, 1, 120.0, gpu_check_session, NULL);
}

/* What each rank saw, checked on the main thread. */
typedef struct outcome {
    seldp_status first[MAX_RANKS], second[MAX_RANKS];
    double seconds[MAX_RANKS];
    int missing_rank; /* the rank that aborts or stays away */
} outcome;

/* One device allreduce of a float, timed. */
static seldp_status one_allreduce(tr_rank_ctx *ctx, double *seconds)
{
    seldp_device dev = seldp_comm_device(ctx->world);
    float one = 1.0f;
    void *d = gpu_buf_alloc(dev, sizeof one);
    if (!d)
        return SELDP_ERR_NOMEM;
    seldp_status st = gpu_upload(dev, d, &one, sizeof one);
    double t0 = now_s();
    if (st == SELDP_OK)
        st = seldp_comm_allreduce(ctx->world, d, d, 1, SELDP_F32, dev);
    if (seconds)
        *seconds = now_s() - t0;
    gpu_buf_free(dev, d);
    return st;
}

static int abort_rank(tr_rank_ctx *ctx)
{
    outcome *o = ctx->arg;
    RANK_CHECK_OK(ctx, seldp_comm_barrier(ctx->world));
    if (ctx->rank == o->missing_rank)
        seldp_comm_abort(ctx->world);
    o->first[ctx->rank] = one_allreduce(ctx, &o->seconds[ctx->rank]);
    o->second[ctx->rank] = seldp_comm_barrier(ctx->world);
    return 0;
}

/* One rank aborts: every rank's pending and later collectives return SELDP_ERR_ABORTED
 * promptly, long before the 120 s timeout. */
static void test_abort_reaches_every_rank(void **state)
{
    (void)state;
    outcome o;
    memset(&o, 0, sizeof o);
    o.missing_rank = world_size - 1;
    gpu_run_ranks_or_fail(kind, world_size, 1, 120.0, abort_rank, &o);
    for (int r = 0; r < world_size; r++) {
        if (o.first[r] != SELDP_ERR_ABORTED || o.second[r] != SELDP_ERR_ABORTED)
            fail_msg("rank %d: allreduce after the abort returned %s then %s, expected "
                     "SELDP_ERR_ABORTED twice",
                     r, seldp_status_name(o.first[r]), seldp_status_name(o.second[r]));
        if (o.seconds[r] > 30.0)
            fail_msg("rank %d took %.1f s to notice the abort", r, o.seconds[r]);
    }
}

static int absent_rank(tr_rank_ctx *ctx)
{
    outcome *o = ctx->arg;
    RANK_CHECK_OK(ctx, seldp_comm_barrier(ctx->world));
    if (ctx->rank == o->missing_rank)
        return 0; /* never arrives: destroys its communicator and leaves */
    o->first[ctx->rank] = one_allreduce(ctx, &o->seconds[ctx->rank]);
    return 0;
}

/* A rank that never arrives: the others give up after the 3 s timeout with
 * SELDP_ERR_TIMEOUT (the first to give up) or SELDP_ERR_ABORTED (those that see its
 * abort first), none hangs. */
static void test_missing_rank_times_out(void **state)
{
    (void)state;
    if (world_size < 2) {
        print_message("skipped: one GPU, so no rank can be missing (needs two)\n");
        skip();
    }
    outcome o;
    memset(&o, 0, sizeof o);
    o.missing_rank = 0;
    gpu_run_ranks_or_fail(kind, world_size, 1, 3.0, absent_rank, &o);
    int timeouts = 0;
    for (int r = 1; r < world_size; r++) {
        if (o.first[r] != SELDP_ERR_TIMEOUT && o.first[r] != SELDP_ERR_ABORTED)
            fail_msg("rank %d returned %s, expected SELDP_ERR_TIMEOUT or SELDP_ERR_ABORTED", r,
                     seldp_status_name(o.first[r]));
        timeouts += o.first[r] == SELDP_ERR_TIMEOUT;
        if (o.seconds[r] > 3.0 + 20.0)
            fail_msg("rank %d waited %.1f s with a 3 s timeout", r, o.seconds[r]);
    }
    assert_true(timeouts >= 1);
}

/* ---- worlds joined by hand ----------------------------------------------------------------- */

typedef struct join_thread {
    pthread_t thread;
    int rank, nranks, ordinal;
    const unsigned char *id; /* external id, or NULL to join `world` */
    seldp_nccl_world *world;
    seldp_status st;
    double seconds;
    tr_rank_ctx ctx;
    int result;
} join_thread;

static void *join_main(void *p)
{
    join_thread *t = p;
    seldp_comm_config cfg = SELDP_COMM_CONFIG_INIT;
    cfg.timeout_s = 30.0;
    double t0 = now_s();
    if (cudaSetDevice(t->ordinal) != cudaSuccess) {
        t->st = SELDP_ERR_TRANSPORT;
        return NULL;
    }
    if (t->id)
        t->st = seldp_nccl_comm_init_with_id(t->id, t->nranks, t->rank, &cfg, &t->ctx.world);
    else
        t->st = seldp_nccl_comm_init(t->world, t->rank, &t->ctx.world);
    t->seconds = now_s() - t0;
    if (t->st == SELDP_OK) {
        t->ctx.rank = t->rank;
        t->ctx.size = seldp_comm_size(t->ctx.world);
        if (t->id)
            t->result = gpu_check_collectives(&t->ctx);
        seldp_comm_destroy(t->ctx.world);
    } else {
        snprintf(t->ctx.why, sizeof t->ctx.why, "%s", seldp_last_error());
    }
    return NULL;
}

/* NCCL cannot put two ranks of one communicator on one GPU: both ranks fail (none hangs),
 * and the message points at the cause. */
static void test_two_ranks_on_one_gpu_refused(void **state)
{
    (void)state;
    seldp_comm_config cfg = SELDP_COMM_CONFIG_INIT;
    seldp_nccl_world *world = NULL;
    join_thread t[2];
    memset(t, 0, sizeof t);
    cfg.timeout_s = 30.0;
    assert_int_equal(seldp_nccl_world_create(2, &cfg, &world), SELDP_OK);
    for (int r = 0; r < 2; r++) {
        t[r].rank = r;
        t[r].nranks = 2;
        t[r].ordinal = 0;
        t[r].world = world;
        assert_int_equal(pthread_create(&t[r].thread, NULL, join_main, &t[r]), 0);
    }
    for (int r = 0; r < 2; r++)
        pthread_join(t[r].thread, NULL);
    seldp_nccl_world_destroy(world);
    for (int r = 0; r < 2; r++) {
        if (t[r].st == SELDP_OK)
            fail_msg("rank %d joined a world whose two ranks share cuda:0", r);
        if (t[r].seconds > 30.0 + 15.0)
            fail_msg("rank %d took %.1f s to fail", r, t[r].seconds);
        print_message("rank %d: %s: %s\n", r, seldp_status_name(t[r].st), t[r].ctx.why);
    }
}

/* The multi-process bootstrap path: one id drawn once, handed to every rank, which joins
 * with seldp_nccl_comm_init_with_id and runs the collective contract. */
static void test_join_with_external_id(void **state)
{
    (void)state;
    unsigned char id[SELDP_NCCL_UNIQUE_ID_BYTES];
    join_thread t[MAX_RANKS];
    memset(t, 0, sizeof t);
    assert_int_equal(seldp_nccl_get_unique_id(id), SELDP_OK);
    for (int r = 0; r < world_size; r++) {
        t[r].rank = r;
        t[r].nranks = world_size;
        t[r].ordinal = r;
        t[r].id = id;
        assert_int_equal(pthread_create(&t[r].thread, NULL, join_main, &t[r]), 0);
    }
    for (int r = 0; r < world_size; r++)
        pthread_join(t[r].thread, NULL);
    for (int r = 0; r < world_size; r++) {
        if (t[r].st != SELDP_OK)
            fail_msg("rank %d: comm_init_with_id returned %s: %s", r, seldp_status_name(t[r].st),
                     t[r].ctx.why);
        if (t[r].result != 0)
            fail_msg("rank %d: %s", r, t[r].ctx.why);
    }
}

static void test_argument_checks(void **state)
{
    (void)state;
    seldp_nccl_world *world = NULL;
    seldp_comm *comm = NULL;
    unsigned char id[SELDP_NCCL_UNIQUE_ID_BYTES] = {0};
    assert_int_equal(seldp_nccl_world_create(0, NULL, &world), SELDP_ERR_INVALID_ARGUMENT);
    assert_null(world);
    assert_int_equal(seldp_nccl_world_create(2, NULL, &world), SELDP_OK);
    assert_int_equal(seldp_nccl_comm_init(world, 2, &comm), SELDP_ERR_INVALID_ARGUMENT);
    assert_int_equal(seldp_nccl_comm_init(world, -1, &comm), SELDP_ERR_INVALID_ARGUMENT);
    assert_null(comm);
    seldp_nccl_world_destroy(world);
    assert_int_equal(seldp_nccl_comm_init_with_id(id, 2, 2, NULL, &comm),
                     SELDP_ERR_INVALID_ARGUMENT);
    assert_int_equal(seldp_nccl_comm_init_with_id(NULL, 2, 0, NULL, &comm),
                     SELDP_ERR_INVALID_ARGUMENT);
    assert_int_equal(seldp_nccl_get_unique_id(NULL), SELDP_ERR_INVALID_ARGUMENT);
    assert_true(seldp_nccl_device_count() >= 1);
}

/* Under SELDP_DEBUG_COLLECTIVES every rank's call is fingerprinted before data moves:
 * rank 0 broadcasting while the others allreduce the same bytes is SELDP_ERR_DISAGREE on
 * every rank, naming both calls, instead of a hang or a silent mix-up. */
static int mismatched_rank(tr_rank_ctx *ctx)
{
    seldp_device dev = seldp_comm_device(ctx->world);
    void *d = gpu_buf_alloc(dev, 4 * sizeof(float));
    RANK_CHECK(ctx, d != NULL, "rank %d: no device buffer", ctx->rank);
    seldp_status st = ctx->rank == 0 ? seldp_comm_broadcast(ctx->world, d, 4, SELDP_F32, 0, dev)
                                     : seldp_comm_allreduce(ctx->world, d, d, 4, SELDP_F32, dev);
    char message[1024];
    snprintf(message, sizeof message, "%s", seldp_last_error());
    gpu_buf_free(dev, d);
    RANK_CHECK(ctx, st == SELDP_ERR_DISAGREE, "rank %d: mismatched calls returned %s: %s",
               ctx->rank, seldp_status_name(st), message);
    RANK_CHECK(ctx, strstr(message, "broadcast") && strstr(message, "allreduce"),
               "rank %d: the message does not name both calls: %s", ctx->rank, message);
    return 0;
}

static void test_debug_mode_catches_a_mismatch(void **state)
{
    (void)state;
    if (world_size < 2) {
        print_message("one rank: no mismatch to plant (NCCL needs a GPU per rank)\n");
        skip();
    }
    assert_int_equal(setenv("SELDP_DEBUG_COLLECTIVES", "1", 1), 0);
    gpu_run_ranks_or_fail(kind, world_size, 1, 120.0, mismatched_rank, NULL);
    assert_int_equal(unsetenv("SELDP_DEBUG_COLLECTIVES"), 0);
}

int main(int argc, char **argv)
{
    bool host = gpu_host_mode(argc, argv);
    if (host) {
        kind = GPU_WORLD_HOST_ON_HOST;
        world_size = 4;
    } else {
        int gpus = gpu_require();
        world_size = gpus < MAX_RANKS ? gpus : MAX_RANKS;
    }
    printf("world of %d ranks (%s)\n", world_size, host ? "host-staged, host memory" : "NCCL");
    const struct CMUnitTest transport_independent[] = {
        cmocka_unit_test(test_collectives),
        cmocka_unit_test(test_session),
        cmocka_unit_test(test_abort_reaches_every_rank),
        cmocka_unit_test(test_missing_rank_times_out),
        cmocka_unit_test(test_debug_mode_catches_a_mismatch),
    };
    const struct CMUnitTest nccl_only[] = {
        cmocka_unit_test(test_argument_checks),
        cmocka_unit_test(test_two_ranks_on_one_gpu_refused),
        cmocka_unit_test(test_join_with_external_id),
    };
    int failed = cmocka_run_group_tests(transport_independent, NULL, NULL);
    if (!host)
        failed += cmocka_run_group_tests(nccl_only, NULL, NULL);
    return failed ? 1 : 0;
}
