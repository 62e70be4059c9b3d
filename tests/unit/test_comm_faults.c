/* host-staged faults: a rank that never arrives (timeout), abort in the middle of a
 * collective, abort through a split communicator, a rank that never joins, and fresh
 * worlds working afterwards in the same process. */
#define _POSIX_C_SOURCE 200809L /* clock_gettime, nanosleep */

#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "ranks.h"
#include "seldp/seldp.h"

#define SHORT_TIMEOUT_S 0.5
#define LONG_TIMEOUT_S  30.0

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void sleep_s(double s)
{
    struct timespec ts = {(time_t)s, (long)((s - floor(s)) * 1e9)};
    nanosleep(&ts, NULL);
}

/* Wait until *counter reaches `value` (for at most 20 s). */
static bool wait_for(atomic_int *counter, int value)
{
    double until = now_s() + 20.0;
    while (atomic_load(counter) < value) {
        if (now_s() > until)
            return false;
        sleep_s(0.001);
    }
    return true;
}

typedef struct fault_state {
    atomic_int entered;  /* ranks about to enter the collective under test */
    atomic_int returned; /* ranks that came back from it */
} fault_state;

static fault_state *new_state(void)
{
    fault_state *fs = calloc(1, sizeof *fs);
    assert_non_null(fs);
    atomic_init(&fs->entered, 0);
    atomic_init(&fs->returned, 0);
    return fs;
}

#define RANK_CHECK_MSG(ctx, needle)                                                                \
    RANK_CHECK(ctx, strstr(seldp_last_error(), needle) != NULL, "message '%s' lacks '%s'",         \
               seldp_last_error(), needle)

/* ---- a rank that never arrives --------------------------------------------------------- */

static int straggler_rank(tr_rank_ctx *ctx)
{
    fault_state *fs = ctx->arg;
    int last = ctx->size - 1;
    float buf[64] = {0};
    if (ctx->rank != last) {
        double t0 = now_s();
        seldp_status st =
            seldp_comm_broadcast(ctx->world, buf, 64, SELDP_F32, 0, SELDP_HOST_DEVICE);
        double waited = now_s() - t0;
        atomic_fetch_add(&fs->returned, 1);
        RANK_CHECK(ctx, st == SELDP_ERR_TIMEOUT, "broadcast returned %s: %s", seldp_status_name(st),
                   seldp_last_error());
        RANK_CHECK_MSG(ctx, "broadcast");
        char who[32];
        snprintf(who, sizeof who, "rank %d", last);
        RANK_CHECK_MSG(ctx, who);
        RANK_CHECK(ctx, waited > 0.8 * SHORT_TIMEOUT_S && waited < SHORT_TIMEOUT_S + 5.0,
                   "returned after %.3f s with a %.1f s timeout", waited, SHORT_TIMEOUT_S);
    } else {
        /* Arrive only once the others have given up. */
        RANK_CHECK(ctx, wait_for(&fs->returned, ctx->size - 1), "the others never returned");
        double t0 = now_s();
        seldp_status st =
            seldp_comm_broadcast(ctx->world, buf, 64, SELDP_F32, 0, SELDP_HOST_DEVICE);
        RANK_CHECK(ctx, st == SELDP_ERR_TIMEOUT, "late broadcast returned %s",
                   seldp_status_name(st));
        RANK_CHECK(ctx, now_s() - t0 < 0.4 * SHORT_TIMEOUT_S, "late rank waited %.3f s",
                   now_s() - t0);
        RANK_CHECK_MSG(ctx, "timed out");
    }
    /* The world stays broken: every later collective fails at once, on every rank. */
    double t0 = now_s();
    seldp_status st = seldp_comm_barrier(ctx->world);
    RANK_CHECK(ctx, st == SELDP_ERR_TIMEOUT, "barrier after the timeout returned %s",
               seldp_status_name(st));
    seldp_comm *sub = NULL;
    st = seldp_comm_split(ctx->world, 0, 0, &sub);
    RANK_CHECK(ctx, st == SELDP_ERR_TIMEOUT && sub == NULL, "split after the timeout returned %s",
               seldp_status_name(st));
    RANK_CHECK(ctx, now_s() - t0 < 0.4 * SHORT_TIMEOUT_S, "failing fast took %.3f s", now_s() - t0);
    return 0;
}

static void test_rank_never_arrives(void **state)
{
    (void)state;
    const int sizes[] = {2, 4, 8};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        fault_state *fs = new_state();
        double t0 = now_s();
        tr_run_ranks(sizes[i], SHORT_TIMEOUT_S, straggler_rank, fs);
        double took = now_s() - t0;
        if (took > SHORT_TIMEOUT_S + 5.0)
            fail_msg("%d ranks: the timeout case took %.2f s", sizes[i], took);
        free(fs);
    }
}

/* In a split group the message gives both numberings; the whole world learns of it. */
static int subgroup_straggler_rank(tr_rank_ctx *ctx)
{
    fault_state *fs = ctx->arg;
    seldp_comm *pair = NULL;
    RANK_CHECK_OK(ctx, seldp_comm_split(ctx->world, ctx->rank / 2, 0, &pair));
    seldp_status st;
    if (ctx->rank == 2) {
        double x = 1;
        st = seldp_comm_allreduce(pair, &x, &x, 1, SELDP_F64, SELDP_HOST_DEVICE);
        atomic_fetch_add(&fs->returned, 1);
        RANK_CHECK(ctx, st == SELDP_ERR_TIMEOUT, "allreduce returned %s", seldp_status_name(st));
        RANK_CHECK_MSG(ctx, "rank 0: allreduce timed out");
        RANK_CHECK_MSG(ctx, "rank 1 (world rank 3) had not arrived");
    } else {
        RANK_CHECK(ctx, wait_for(&fs->returned, 1), "rank 2 never returned");
        st = seldp_comm_barrier(ctx->rank == 3 ? pair : ctx->world);
        RANK_CHECK(ctx, st == SELDP_ERR_TIMEOUT, "barrier returned %s", seldp_status_name(st));
        RANK_CHECK_MSG(ctx, "rank 2 timed out after 0.5 s in allreduce waiting for rank 3");
    }
    seldp_comm_destroy(pair);
    return 0;
}

static void test_rank_never_arrives_in_split_group(void **state)
{
    (void)state;
    fault_state *fs = new_state();
    tr_run_ranks(4, SHORT_TIMEOUT_S, subgroup_straggler_rank, fs);
    free(fs);
}

/* ---- abort in the middle of a collective ------------------------------------------------ */

static int abort_rank(tr_rank_ctx *ctx)
{
    fault_state *fs = ctx->arg;
    int aborter = ctx->size - 1;
    enum { N = 1 << 16 };
    seldp_comm *pair = NULL;
    RANK_CHECK_OK(ctx, seldp_comm_split(ctx->world, ctx->rank / 2, 0, &pair));
    if (ctx->rank == aborter) {
        RANK_CHECK(ctx, wait_for(&fs->entered, ctx->size - 1), "the others never entered");
        sleep_s(0.05); /* let them block in the allreduce */
        seldp_comm_abort(ctx->world);
        seldp_comm_abort(ctx->world); /* idempotent */
    } else {
        float *x = calloc(N, sizeof *x);
        RANK_CHECK(ctx, x != NULL, "out of memory");
        atomic_fetch_add(&fs->entered, 1);
        double t0 = now_s();
        seldp_status st = seldp_comm_allreduce(ctx->world, x, x, N, SELDP_F32, SELDP_HOST_DEVICE);
        double waited = now_s() - t0;
        free(x);
        RANK_CHECK(ctx, st == SELDP_ERR_ABORTED, "allreduce returned %s: %s", seldp_status_name(st),
                   seldp_last_error());
        char expect[96];
        snprintf(expect, sizeof expect, "rank %d: allreduce aborted: rank %d aborted the world",
                 ctx->rank, aborter);
        RANK_CHECK_MSG(ctx, expect);
        RANK_CHECK(ctx, waited < 10.0, "abort took %.2f s to arrive", waited);
    }
    /* Every communicator of the world, split ones included, stays aborted. */
    seldp_status st = seldp_comm_barrier(ctx->world);
    RANK_CHECK(ctx, st == SELDP_ERR_ABORTED, "world barrier returned %s", seldp_status_name(st));
    int v = 1;
    st = seldp_comm_broadcast(pair, &v, 1, SELDP_I32, 0, SELDP_HOST_DEVICE);
    RANK_CHECK(ctx, st == SELDP_ERR_ABORTED, "pair broadcast returned %s", seldp_status_name(st));
    RANK_CHECK_MSG(ctx, "aborted the world");
    seldp_comm_destroy(pair);
    return 0;
}

static void test_abort_mid_collective(void **state)
{
    (void)state;
    const int sizes[] = {2, 3, 4, 8};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        fault_state *fs = new_state();
        double t0 = now_s();
        tr_run_ranks(sizes[i], LONG_TIMEOUT_S, abort_rank, fs);
        if (now_s() - t0 > 10.0)
            fail_msg("%d ranks: abort took %.2f s", sizes[i], now_s() - t0);
        free(fs);
    }
}

/* Ranks 2 and 3 wait in a world barrier; rank 0 aborts through its pair communicator. */
static int subgroup_abort_rank(tr_rank_ctx *ctx)
{
    fault_state *fs = ctx->arg;
    seldp_comm *pair = NULL;
    RANK_CHECK_OK(ctx, seldp_comm_split(ctx->world, ctx->rank / 2, ctx->rank, &pair));
    seldp_status st;
    if (ctx->rank >= 2) {
        atomic_fetch_add(&fs->entered, 1);
        st = seldp_comm_barrier(ctx->world);
    } else if (ctx->rank == 1) {
        st = seldp_comm_barrier(pair);
    } else {
        RANK_CHECK(ctx, wait_for(&fs->entered, 2), "ranks 2 and 3 never entered");
        sleep_s(0.05);
        seldp_comm_abort(pair);
        st = seldp_comm_barrier(pair);
    }
    RANK_CHECK(ctx, st == SELDP_ERR_ABORTED, "returned %s", seldp_status_name(st));
    RANK_CHECK_MSG(ctx, "rank 0 aborted the world");
    seldp_comm_destroy(pair);
    return 0;
}

static void test_abort_through_split_comm(void **state)
{
    (void)state;
    fault_state *fs = new_state();
    tr_run_ranks(4, LONG_TIMEOUT_S, subgroup_abort_rank, fs);
    free(fs);
}

/* ---- a rank that never joins ------------------------------------------------------------ */

typedef struct joiner {
    pthread_t thread;
    seldp_host_world *world;
    int rank;
    seldp_status status;
    char message[512];
    seldp_comm *comm;
} joiner;

static void *join_main(void *p)
{
    joiner *j = p;
    j->status = seldp_host_comm_init(j->world, j->rank, SELDP_HOST_DEVICE, &j->comm);
    snprintf(j->message, sizeof j->message, "%s", seldp_last_error());
    return NULL;
}

static void test_rank_never_joins(void **state)
{
    (void)state;
    seldp_comm_config cfg = SELDP_COMM_CONFIG_INIT;
    cfg.timeout_s = SHORT_TIMEOUT_S;
    seldp_host_world *w = NULL;
    assert_int_equal(seldp_host_world_create(3, &cfg, &w), SELDP_OK);
    joiner j[2];
    double t0 = now_s();
    for (int r = 0; r < 2; r++) {
        memset(&j[r], 0, sizeof j[r]);
        j[r].world = w;
        j[r].rank = r;
        assert_int_equal(pthread_create(&j[r].thread, NULL, join_main, &j[r]), 0);
    }
    for (int r = 0; r < 2; r++)
        pthread_join(j[r].thread, NULL);
    double took = now_s() - t0;
    for (int r = 0; r < 2; r++) {
        assert_int_equal(j[r].status, SELDP_ERR_TIMEOUT);
        assert_null(j[r].comm);
        if (!strstr(j[r].message, "init") || !strstr(j[r].message, "rank 2"))
            fail_msg("rank %d: message '%s' should name init and rank 2", r, j[r].message);
    }
    assert_true(took > 0.8 * SHORT_TIMEOUT_S && took < SHORT_TIMEOUT_S + 5.0);
    /* The late rank finds the world aborted. */
    seldp_comm *late = NULL;
    assert_int_equal(seldp_host_comm_init(w, 2, SELDP_HOST_DEVICE, &late), SELDP_ERR_TIMEOUT);
    assert_null(late);
    seldp_host_world_destroy(w);
}

static void test_world_arguments(void **state)
{
    (void)state;
    seldp_host_world *w = NULL;
    seldp_comm_config cfg = SELDP_COMM_CONFIG_INIT;
    assert_true(cfg.timeout_s == 300.0);
    assert_int_equal(seldp_host_world_create(0, NULL, &w), SELDP_ERR_INVALID_ARGUMENT);
    assert_int_equal(seldp_host_world_create(-3, NULL, &w), SELDP_ERR_INVALID_ARGUMENT);
    cfg.timeout_s = 0;
    assert_int_equal(seldp_host_world_create(2, &cfg, &w), SELDP_ERR_INVALID_ARGUMENT);
    cfg.timeout_s = NAN;
    assert_int_equal(seldp_host_world_create(2, &cfg, &w), SELDP_ERR_INVALID_ARGUMENT);
    assert_int_equal(seldp_host_world_create(2, NULL, NULL), SELDP_ERR_INVALID_ARGUMENT);
    assert_null(w);

    /* A world of one joins without waiting; joining twice or out of range fails. */
    assert_int_equal(seldp_host_world_create(1, NULL, &w), SELDP_OK);
    seldp_comm *c = NULL, *again = NULL;
    assert_int_equal(seldp_host_comm_init(w, 1, SELDP_HOST_DEVICE, &again),
                     SELDP_ERR_INVALID_ARGUMENT);
    assert_int_equal(seldp_host_comm_init(w, -1, SELDP_HOST_DEVICE, &again),
                     SELDP_ERR_INVALID_ARGUMENT);
    assert_int_equal(seldp_host_comm_init(w, 0, SELDP_HOST_DEVICE, &c), SELDP_OK);
    assert_int_equal(seldp_host_comm_init(w, 0, SELDP_HOST_DEVICE, &again), SELDP_ERR_DUPLICATE);
    assert_null(again);
    assert_int_equal(seldp_comm_size(c), 1);
    double x = 2.5;
    assert_int_equal(seldp_comm_allreduce(c, &x, &x, 1, SELDP_F64, SELDP_HOST_DEVICE), SELDP_OK);
    assert_true(x == 2.5);
    seldp_comm_destroy(c);
    seldp_host_world_destroy(w);
    seldp_host_world_destroy(NULL);
}

/* ---- fresh worlds afterwards -------------------------------------------------------------- */

static int healthy_rank(tr_rank_ctx *ctx)
{
    for (int i = 0; i < 50; i++) {
        int64_t v = ctx->rank + i;
        RANK_CHECK_OK(ctx,
                      seldp_comm_allreduce(ctx->world, &v, &v, 1, SELDP_I64, SELDP_HOST_DEVICE));
        RANK_CHECK(ctx, v == ctx->size * (ctx->size - 1) / 2 + ctx->size * i, "sum %lld",
                   (long long)v);
    }
    return 0;
}

static int doomed_rank(tr_rank_ctx *ctx)
{
    if (ctx->rank == 0)
        seldp_comm_abort(ctx->world);
    seldp_status st = SELDP_OK;
    for (int i = 0; i < 50 && st == SELDP_OK; i++)
        st = seldp_comm_barrier(ctx->world);
    RANK_CHECK(ctx, st == SELDP_ERR_ABORTED, "barrier returned %s", seldp_status_name(st));
    return 0;
}

typedef struct world_run {
    pthread_t thread;
    tr_rank_fn fn;
    int failed;
    char why[1200];
} world_run;

static void *world_main(void *p)
{
    world_run *run = p;
    run->failed = tr_run_ranks_status(4, LONG_TIMEOUT_S, run->fn, NULL, run->why, sizeof run->why);
    return NULL;
}

static void test_new_worlds_afterwards(void **state)
{
    (void)state;
    tr_run_ranks(4, LONG_TIMEOUT_S, healthy_rank, NULL);
    /* Two worlds at once: aborting one leaves the other alone. */
    world_run runs[2] = {{.fn = doomed_rank}, {.fn = healthy_rank}};
    for (int i = 0; i < 2; i++)
        assert_int_equal(pthread_create(&runs[i].thread, NULL, world_main, &runs[i]), 0);
    for (int i = 0; i < 2; i++)
        pthread_join(runs[i].thread, NULL);
    for (int i = 0; i < 2; i++)
        if (runs[i].failed)
            fail_msg("world %d: %s", i, runs[i].why);
    tr_run_ranks(8, LONG_TIMEOUT_S, healthy_rank, NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rank_never_arrives),
        cmocka_unit_test(test_rank_never_arrives_in_split_group),
        cmocka_unit_test(test_abort_mid_collective),
        cmocka_unit_test(test_abort_through_split_comm),
        cmocka_unit_test(test_rank_never_joins),
        cmocka_unit_test(test_world_arguments),
        cmocka_unit_test(test_new_worlds_afterwards),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
