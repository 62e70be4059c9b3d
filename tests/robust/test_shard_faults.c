/* Faults in the middle of the sharded calls (seldp/shard.h) on the host-staged transport:
 * at every collective of a reduce-scatter and of an all-gather (the agreement, the fused
 * pass or each bucket, the confirmation of cfg.staged_commit), one rank aborts, leaves
 * without a word (the others wait for a rank that never arrives) or stalls inside holding
 * the others' buffers, and at the first one arrives late; and a watchdog thread aborts the world at
 * a time that moves through the call. Every rank returns (never hangs), every rank fails when one
 * did, and every status tells the truth: the gradients are always unchanged (the container is only
 * read), the range and the parameters are unchanged unless the status is SELDP_ERR_GRADS_UNDEFINED
 * or SELDP_ERR_PARAMS_UNDEFINED, which cfg.staged_commit never returns. Once a call has returned,
 * no rank touches its memory: each rank frees the gradients the others read and fills the
 * parameters the others write with a sentinel the moment its call returns (asan sees a late read,
 * the sentinel a late write). Runs on both reduce paths; under ThreadSanitizer every timeout is
 * five times longer. */
#define _POSIX_C_SOURCE 200809L /* nanosleep */

#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "comm/host/host_fault.h"
#include "contract.h"

#define NRANKS   3
#define SENTINEL 0xA5
#define N_F32    120000 /* a.weight */
#define N_BF16   100000 /* b.weight */

#if defined(__SANITIZE_THREAD__)
#define SLOW 5.0
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define SLOW 5.0
#endif
#endif
#ifndef SLOW
#define SLOW 1.0
#endif
#define TIMEOUT_S (0.2 * SLOW)

typedef enum call_kind { CALL_SCATTER, CALL_GATHER } call_kind;

typedef struct rank_out {
    seldp_status st;
    char msg[1024];
    bool intact; /* what the status says about the rank's memory holds */
    char why[256];
    unsigned char *params; /* the storage others write into, SENTINEL after return */
    size_t params_bytes;
} rank_out;

typedef struct fault_run {
    seldp_host_world *world;
    call_kind call;
    bool staged;
    int faulty;      /* -1: a clean run */
    uint64_t offset; /* the fault's point, counted from the call's first collective */
    seldp__host_fault_action action;
    pthread_barrier_t barrier;
    uint64_t points; /* a clean run: the collectives the call made */
    char setup[256]; /* a rank's setup failure */
    rank_out out[NRANKS];
} fault_run;

typedef struct rank_arg {
    fault_run *run;
    int rank;
} rank_arg;

/* The model: an F32 and a BF16 parameter whose ranges cut through both, and a frozen one. */
static seldp_status build(test_model *m, int r)
{
    seldp_status st = ct_init(m, r);
    if (st == SELDP_OK)
        st = ct_add(m, "a.weight", 1, SELDP_F32, false, 11, 1, SHAPE(N_F32));
    if (st == SELDP_OK)
        st = ct_add(m, "b.weight", 2, SELDP_BF16, false, 12, 1, SHAPE(N_BF16));
    if (st == SELDP_OK)
        st = ct_add(m, "c.frozen", 3, SELDP_F32, true, 13, 1, SHAPE(8));
    return st;
}

/* Element i of the index space after a successful call: the sum of (q + 1) * (i % 5) over
 * the ranks (scatter, exact), or the range's value (gather). */
static float expected(call_kind call, size_t i)
{
    if (call == CALL_SCATTER)
        return (float)(NRANKS * (NRANKS + 1) / 2 * (int)(i % 5));
    return (float)(i % 97) - 48.0f;
}

static void *fault_rank(void *p)
{
    rank_arg *a = p;
    fault_run *run = a->run;
    int r = a->rank;
    rank_out *o = &run->out[r];
    seldp_comm *comm = NULL;
    seldp_session *s = NULL;
    seldp_shard_map *map = NULL;
    seldp_session_config cfg = SELDP_SESSION_CONFIG_INIT;
    test_model m;
    test_grads g;
    grads_snapshot before;
    void *data[2];
    float *range = NULL, *kept = NULL;
    size_t begin = 0, count = 0;
    bool ready = false, called = false;

    memset(&m, 0, sizeof m);
    memset(&g, 0, sizeof g);
    memset(&before, 0, sizeof before);
    cfg.staged_commit = run->staged;
    cfg.bucket_bytes = (size_t)512 << 10; /* two buckets on the bucketed path */
    if (seldp_host_comm_init(run->world, r, SELDP_HOST_DEVICE, &comm) != SELDP_OK ||
        build(&m, r) != SELDP_OK ||
        seldp_session_initialize(comm, m.model, 0, (seldp_param_id[]){1, 2, 3}, 3, &cfg, &s) !=
            SELDP_OK ||
        seldp_shard_map_create(s, &map) != SELDP_OK ||
        seldp_shard_map_range(map, r, &begin, &count) != SELDP_OK || tg_init(&g) != SELDP_OK ||
        tg_put(&g, 1, SELDP_F32, r == 1, 21, 1, SHAPE(N_F32), &data[0]) != SELDP_OK ||
        tg_put(&g, 2, SELDP_BF16, false, 22, 1, SHAPE(N_BF16), &data[1]) != SELDP_OK ||
        !(range = malloc((count + 1) * sizeof *range)) ||
        !(kept = malloc((count + 1) * sizeof *kept))) {
        snprintf(run->setup, sizeof run->setup, "rank %d: setup failed: %s", r, seldp_last_error());
    } else {
        ready = true;
        for (size_t i = 0; i < N_F32; i++)
            ((float *)data[0])[i] = (float)((r + 1) * (int)(i % 5));
        for (size_t i = 0; i < N_BF16; i++)
            ct_set(SELDP_BF16, data[1], i, (double)((r + 1) * (int)((N_F32 + i) % 5)));
        for (size_t i = 0; i < count; i++)
            range[i] = run->call == CALL_GATHER ? expected(CALL_GATHER, begin + i) : -1.0f;
        memcpy(kept, range, count * sizeof *range);
        gs_take(&before, g.grads);
        ct_snapshot(&m);
    }
    /* between collectives: rank 0 sets the short timeout and arms the fault */
    pthread_barrier_wait(&run->barrier);
    if (r == 0 && !run->setup[0]) {
        seldp__host_fault_set_timeout(run->world, TIMEOUT_S);
        if (run->faulty >= 0) {
            uint64_t at = seldp__host_fault_count(run->world, run->faulty) + run->offset;
            if (run->action == SELDP__FAULT_STALL_INSIDE)
                seldp__host_fault_set_stall(run->world, run->faulty, at, 1.5 * TIMEOUT_S);
            else
                seldp__host_fault_set(run->world, run->faulty, at, run->action);
        }
    }
    pthread_barrier_wait(&run->barrier);
    if (!ready || run->setup[0])
        goto out;
    called = true;
    uint64_t first = seldp__host_fault_count(run->world, r);
    if (run->call == CALL_SCATTER)
        o->st = seldp_shard_reduce_scatter_sum(s, map, g.grads, true, SELDP_MISSING_ERROR, range,
                                               count, NULL, NULL);
    else
        o->st = seldp_shard_allgather_params(s, map, range, SELDP_F32, count);
    if (r == 0)
        run->points = seldp__host_fault_count(run->world, r) - first;
    snprintf(o->msg, sizeof o->msg, "%s", o->st ? seldp_last_error() : "");

    /* what the status says about the rank's memory */
    bool undefined = o->st == SELDP_ERR_GRADS_UNDEFINED || o->st == SELDP_ERR_PARAMS_UNDEFINED;
    o->intact = gs_same(&before, g.grads, o->why, sizeof o->why);
    if (o->intact && undefined && run->staged) {
        o->intact = false;
        snprintf(o->why, sizeof o->why, "%s under staged_commit", seldp_status_name(o->st));
    } else if (o->intact && o->st == SELDP_OK) {
        size_t bad = SIZE_MAX;
        if (run->call == CALL_SCATTER) {
            for (size_t i = 0; i < count && bad == SIZE_MAX; i++)
                if (range[i] != expected(CALL_SCATTER, begin + i))
                    bad = begin + i;
        } else {
            const float *x = ct_find(&m, "a.weight")->tensor.data;
            const void *h = ct_find(&m, "b.weight")->tensor.data;
            for (size_t i = 0; i < N_F32 + N_BF16 && bad == SIZE_MAX; i++) {
                double v = i < N_F32 ? x[i] : ct_get(SELDP_BF16, h, i - N_F32);
                if (v != expected(CALL_GATHER, i))
                    bad = i;
            }
        }
        if (bad != SIZE_MAX) {
            o->intact = false;
            snprintf(o->why, sizeof o->why, "a call that succeeded is wrong at element %zu", bad);
        }
    } else if (o->intact && !undefined) {
        if (memcmp(range, kept, count * sizeof *range) != 0) {
            o->intact = false;
            snprintf(o->why, sizeof o->why, "the range changed under %s", seldp_status_name(o->st));
        } else {
            o->intact = ct_unchanged(&m, o->why, sizeof o->why);
        }
    }
    /* the others read these gradients and write these parameters only inside the call */
    tg_free(&g);
    ct_param *pa = ct_find(&m, "a.weight"), *pb = ct_find(&m, "b.weight");
    memset(pa->tensor.data, SENTINEL, N_F32 * sizeof(float));
    memset(pb->tensor.data, SENTINEL, N_BF16 * sizeof(uint16_t));
out:
    gs_free(&before);
    tg_free(&g);
    free(range);
    free(kept);
    seldp_shard_map_destroy(map);
    seldp_session_destroy(s);
    seldp_comm_destroy(comm);
    /* kept until the main thread has looked at the sentinel */
    o->params = NULL;
    if (called) {
        ct_param *kept_a = ct_find(&m, "a.weight");
        o->params = kept_a->tensor.data;
        o->params_bytes = N_F32 * sizeof(float);
        kept_a->owns = false;
    }
    ct_free(&m);
    return NULL;
}

/* One run; false when a rank's setup failed under the short timeouts of a loaded machine. */
static bool run_once(fault_run *run)
{
    seldp_comm_config cfg = SELDP_COMM_CONFIG_INIT;
    pthread_t threads[NRANKS];
    rank_arg args[NRANKS];

    memset(run->out, 0, sizeof run->out);
    run->setup[0] = '\0';
    cfg.timeout_s = 30.0 * SLOW;
    assert_int_equal(seldp_host_world_create(NRANKS, &cfg, &run->world), SELDP_OK);
    for (int r = 0; r < NRANKS; r++) /* count the collectives from the joins on */
        assert_int_equal(seldp__host_fault_set(run->world, r, UINT64_MAX, SELDP__FAULT_NONE),
                         SELDP_OK);
    assert_int_equal(pthread_barrier_init(&run->barrier, NULL, NRANKS), 0);
    for (int r = 0; r < NRANKS; r++) {
        args[r] = (rank_arg){run, r};
        assert_int_equal(pthread_create(&threads[r], NULL, fault_rank, &args[r]), 0);
    }
    for (int r = 0; r < NRANKS; r++)
        pthread_join(threads[r], NULL);
    pthread_barrier_destroy(&run->barrier);
    seldp_host_world_destroy(run->world);
    run->world = NULL;
    for (int r = 0; r < NRANKS; r++) {
        rank_out *o = &run->out[r];
        for (size_t i = 0; o->params && i < o->params_bytes; i++)
            if (o->params[i] != SENTINEL) {
                o->intact = false;
                snprintf(o->why, sizeof o->why,
                         "byte %zu of its parameters was written after its call returned", i);
                break;
            }
        free(o->params);
        o->params = NULL;
    }
    return run->setup[0] == '\0';
}

static const char *call_name(call_kind call)
{
    return call == CALL_SCATTER ? "reduce-scatter" : "all-gather";
}

/* Every rank fails, or (a stall inside the last, single-phase exchange, after which the
 * stalled rank has nothing left to do with the others) every rank succeeds. */
static void check_faulted(const fault_run *run)
{
    int ok = 0;
    for (int r = 0; r < NRANKS; r++)
        ok += run->out[r].st == SELDP_OK;
    for (int r = 0; r < NRANKS; r++) {
        const rank_out *o = &run->out[r];
        if (ok && (ok < NRANKS || run->action != SELDP__FAULT_STALL_INSIDE))
            fail_msg("%s, staged %d, action %d at point %llu of rank %d: rank %d returned %s, "
                     "%d of %d ranks succeeded",
                     call_name(run->call), run->staged, (int)run->action,
                     (unsigned long long)run->offset, run->faulty, r, seldp_status_name(o->st), ok,
                     NRANKS);
        if (!o->intact)
            fail_msg("%s, staged %d, action %d at point %llu of rank %d: rank %d returned %s: "
                     "%s (%s)",
                     call_name(run->call), run->staged, (int)run->action,
                     (unsigned long long)run->offset, run->faulty, r, seldp_status_name(o->st),
                     o->why, o->msg);
    }
}

/* Every action at every collective point of both calls, with and without staged_commit. */
static void test_fault_at_every_point(void **state)
{
    (void)state;
    static const seldp__host_fault_action actions[] = {
        SELDP__FAULT_ABORT, SELDP__FAULT_RETURN, SELDP__FAULT_STALL, SELDP__FAULT_STALL_INSIDE};
    fault_run *run = calloc(1, sizeof *run);
    assert_non_null(run);
    for (int call = CALL_SCATTER; call <= CALL_GATHER; call++) {
        for (int staged = 0; staged <= 1; staged++) {
            run->call = (call_kind)call;
            run->staged = staged;
            run->faulty = -1;
            int tries = 0;
            while (!run_once(run) && ++tries < 5)
                ;
            if (run->setup[0])
                fail_msg("%s", run->setup);
            for (int r = 0; r < NRANKS; r++)
                if (run->out[r].st != SELDP_OK || !run->out[r].intact)
                    fail_msg("clean %s, staged %d: rank %d returned %s: %s %s",
                             call_name(run->call), staged, r, seldp_status_name(run->out[r].st),
                             run->out[r].msg, run->out[r].why);
            uint64_t points = run->points;
            if (points < (staged ? 3u : 2u))
                fail_msg("the %s made only %llu collectives", call_name(run->call),
                         (unsigned long long)points);
            for (uint64_t at = 0; at < points; at++) {
                for (size_t k = 0; k < sizeof actions / sizeof actions[0]; k++) {
                    /* a late arrival looks to the others like a rank that left (RETURN) but
                     * for its own late entry: once, at the first collective */
                    if (actions[k] == SELDP__FAULT_STALL && at > 0)
                        continue;
                    run->faulty = (int)((at + k) % NRANKS);
                    run->offset = at;
                    run->action = actions[k];
                    tries = 0;
                    while (!run_once(run) && ++tries < 5)
                        ;
                    if (run->setup[0])
                        fail_msg("%s", run->setup);
                    check_faulted(run);
                }
            }
            printf("    %s, staged_commit %d: %llu collectives, each faulted 3 ways, the first 4\n",
                   call_name(run->call), staged, (unsigned long long)points);
        }
    }
    free(run);
}

/* --- a watchdog's abort while the call runs ------------------------------------ */

typedef struct abort_trial {
    call_kind call;
    bool staged;
    long delay_us;
    seldp_status st[NRANKS];
    bool intact[NRANKS];
    char why[NRANKS][256];
} abort_trial;

static int rank_abort(tr_rank_ctx *ctx)
{
    abort_trial *t = ctx->arg;
    int r = ctx->rank;
    seldp_comm *group = NULL;
    seldp_session *s = NULL;
    seldp_shard_map *map = NULL;
    seldp_session_config cfg = SELDP_SESSION_CONFIG_INIT;
    test_model m;
    test_grads g;
    grads_snapshot before;
    void *data[2];
    size_t begin, count;

    memset(&m, 0, sizeof m);
    RANK_CHECK_OK(ctx,
                  seldp_comm_split(ctx->world, r < NRANKS ? 0 : SELDP_COMM_NO_GROUP, r, &group));
    if (r == NRANKS) { /* the watchdog, outside the group */
        RANK_CHECK_OK(ctx, seldp_comm_barrier(ctx->world));
        struct timespec ts = {0, t->delay_us * 1000};
        nanosleep(&ts, NULL);
        seldp_comm_abort(ctx->world);
        return 0;
    }
    cfg.staged_commit = t->staged;
    RANK_CHECK_OK(ctx, build(&m, r));
    RANK_CHECK_OK(
        ctx, seldp_session_initialize(group, m.model, 0, (seldp_param_id[]){1, 2, 3}, 3, &cfg, &s));
    RANK_CHECK_OK(ctx, seldp_shard_map_create(s, &map));
    RANK_CHECK_OK(ctx, seldp_shard_map_range(map, r, &begin, &count));
    float *range = malloc((count + 1) * sizeof *range), *kept = malloc((count + 1) * sizeof *kept);
    RANK_CHECK(ctx, range && kept, "out of memory");
    RANK_CHECK_OK(ctx, tg_init(&g));
    RANK_CHECK_OK(ctx, tg_put(&g, 1, SELDP_F32, false, 3, 1, SHAPE(N_F32), &data[0]));
    RANK_CHECK_OK(ctx, tg_put(&g, 2, SELDP_BF16, true, 4, 1, SHAPE(N_BF16), &data[1]));
    for (size_t i = 0; i < N_F32; i++)
        ((float *)data[0])[i] = (float)((r + 1) * (int)(i % 5));
    for (size_t i = 0; i < N_BF16; i++)
        ct_set(SELDP_BF16, data[1], i, (double)((r + 1) * (int)((N_F32 + i) % 5)));
    for (size_t i = 0; i < count; i++)
        range[i] = t->call == CALL_GATHER ? expected(CALL_GATHER, begin + i) : -1.0f;
    /* a first call allocates what the session keeps, so that the timed one starts at once */
    if (t->call == CALL_SCATTER)
        RANK_CHECK_OK(ctx,
                      seldp_shard_reduce_scatter_sum(s, map, g.grads, true, SELDP_MISSING_ERROR,
                                                     kept, count, NULL, NULL));
    else
        RANK_CHECK_OK(ctx, seldp_shard_allgather_params(s, map, range, SELDP_F32, count));
    for (size_t i = 0; i < count; i++)
        range[i] = t->call == CALL_GATHER ? expected(CALL_GATHER, begin + i) + 1.0f : -1.0f;
    memcpy(kept, range, count * sizeof *range);
    gs_take(&before, g.grads);
    ct_snapshot(&m);
    RANK_CHECK_OK(ctx, seldp_comm_barrier(ctx->world));
    if (t->call == CALL_SCATTER)
        t->st[r] = seldp_shard_reduce_scatter_sum(s, map, g.grads, true, SELDP_MISSING_ERROR, range,
                                                  count, NULL, NULL);
    else
        t->st[r] = seldp_shard_allgather_params(s, map, range, SELDP_F32, count);
    bool undefined =
        t->st[r] == SELDP_ERR_GRADS_UNDEFINED || t->st[r] == SELDP_ERR_PARAMS_UNDEFINED;
    t->intact[r] = gs_same(&before, g.grads, t->why[r], sizeof t->why[r]);
    if (t->intact[r] && undefined && t->staged) {
        t->intact[r] = false;
        snprintf(t->why[r], sizeof t->why[r], "undefined under staged_commit");
    } else if (t->intact[r] && t->st[r] == SELDP_OK) {
        const float *x = ct_find(&m, "a.weight")->tensor.data;
        for (size_t i = 0; i < count && t->intact[r]; i++)
            t->intact[r] =
                t->call == CALL_SCATTER
                    ? range[i] == expected(CALL_SCATTER, begin + i)
                    : x[(i * 7) % N_F32] == expected(CALL_GATHER, (i * 7) % N_F32) + 1.0f;
        if (!t->intact[r])
            snprintf(t->why[r], sizeof t->why[r], "a call that succeeded is wrong");
    } else if (t->intact[r] && !undefined) {
        t->intact[r] = memcmp(range, kept, count * sizeof *range) == 0 &&
                       ct_unchanged(&m, t->why[r], sizeof t->why[r]);
        if (!t->intact[r] && !t->why[r][0])
            snprintf(t->why[r], sizeof t->why[r], "the range changed");
    }
    free(range);
    free(kept);
    gs_free(&before);
    tg_free(&g);
    seldp_shard_map_destroy(map);
    seldp_session_destroy(s);
    seldp_comm_destroy(group);
    ct_free(&m);
    return 0;
}

/* A fourth rank, outside the session's group, aborts the world a little later each time:
 * before, during or after the call. */
static void test_watchdog_abort(void **state)
{
    (void)state;
    for (int call = CALL_SCATTER; call <= CALL_GATHER; call++) {
        for (int staged = 0; staged <= 1; staged++) {
            int seen[3] = {0}; /* ok, failed, undefined */
            for (long delay = 0; delay <= 1600; delay += 400) {
                abort_trial t;
                char why[1200];
                memset(&t, 0, sizeof t);
                t.call = (call_kind)call;
                t.staged = staged;
                t.delay_us = delay;
                if (tr_run_ranks_status(NRANKS + 1, 30.0 * SLOW, rank_abort, &t, why, sizeof why))
                    fail_msg("%s, staged %d, abort after %ld us: %s", call_name(t.call), staged,
                             delay, why);
                for (int r = 0; r < NRANKS; r++) {
                    if (!t.intact[r])
                        fail_msg("%s, staged %d, abort after %ld us: rank %d returned %s: %s",
                                 call_name(t.call), staged, delay, r, seldp_status_name(t.st[r]),
                                 t.why[r]);
                    if (t.st[r] != SELDP_OK && t.st[r] != SELDP_ERR_ABORTED &&
                        t.st[r] != SELDP_ERR_TIMEOUT && t.st[r] != SELDP_ERR_GRADS_UNDEFINED &&
                        t.st[r] != SELDP_ERR_PARAMS_UNDEFINED)
                        fail_msg("%s: rank %d returned %s", call_name(t.call), r,
                                 seldp_status_name(t.st[r]));
                    seen[t.st[r] == SELDP_OK                                            ? 0
                         : t.st[r] == SELDP_ERR_ABORTED || t.st[r] == SELDP_ERR_TIMEOUT ? 1
                                                                                        : 2]++;
                }
            }
            printf("    %s, staged_commit %d: %d ok, %d unchanged, %d undefined\n",
                   call_name((call_kind)call), staged, seen[0], seen[1], seen[2]);
        }
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fault_at_every_point),
        cmocka_unit_test(test_watchdog_abort),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
