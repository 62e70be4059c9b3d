/* What a transport failure in the middle of a reduction leaves in the caller's gradients
 * (include/seldp/session.h): with cfg.staged_commit, always the gradients as they were,
 * whatever collective of the reduction fails, the final confirmation included; without it,
 * the gradients as they were unless the status is SELDP_ERR_GRADS_UNDEFINED (a fused
 * reduction that failed while writing in place). Runs on both reduce paths (ctest
 * registers it again with SELDP_REDUCE_PATH=bucketed). */
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

#define NRANKS    3
#define TIMEOUT_S 0.3

/* --- a fault at every collective of one reduction ------------------------- */

typedef struct fault_run {
    seldp_host_world *world;
    bool staged;
    uint64_t before[NRANKS], after[NRANKS]; /* collectives entered around the reduction */
    seldp_status st[NRANKS];
    char msg[NRANKS][1024];
    bool intact[NRANKS]; /* as documented for st */
    char why[NRANKS][256];
} fault_run;

typedef struct fault_arg {
    fault_run *run;
    int rank;
} fault_arg;

/* Exact F32 and BF16 gradients of the standard layout's trainable parameters. */
static const size_t TRAINABLE[] = {0, 1, 3, 4};
#define N_TRAINABLE 4

static void *fault_rank(void *p)
{
    fault_arg *a = p;
    fault_run *run = a->run;
    int r = a->rank;
    seldp_comm *comm = NULL;
    seldp_session *s = NULL;
    seldp_session_config cfg = SELDP_SESSION_CONFIG_INIT;
    test_model m;
    test_grads g;
    grads_snapshot before;
    void *data[N_TRAINABLE];

    memset(&m, 0, sizeof m);
    memset(&g, 0, sizeof g);
    memset(&before, 0, sizeof before);
    run->intact[r] = false;
    cfg.bucket_bytes = 64; /* several allreduces on the bucketed path */
    cfg.staged_commit = run->staged;
    if (seldp_host_comm_init(run->world, r, SELDP_HOST_DEVICE, &comm) != SELDP_OK ||
        std_session(comm, &m, &cfg, &s) != SELDP_OK || tg_init(&g) != SELDP_OK) {
        snprintf(run->why[r], sizeof run->why[r], "setup failed: %s", seldp_last_error());
        goto out;
    }
    for (size_t j = 0; j < N_TRAINABLE; j++) {
        size_t k = TRAINABLE[j];
        if (std_put_grad(&g, r, k, STD[k].dtype, r == 1, &data[j]) != SELDP_OK)
            goto out;
        for (size_t i = 0; i < std_numel(k); i++)
            ct_set(STD[k].dtype, data[j], i, (double)((r + 1) * (int)(i % 7)));
    }
    gs_take(&before, g.grads);
    run->before[r] = seldp__host_fault_count(run->world, r);
    run->st[r] = seldp_session_sum(s, g.grads, true, SELDP_MISSING_ERROR, NULL);
    run->after[r] = seldp__host_fault_count(run->world, r);
    snprintf(run->msg[r], sizeof run->msg[r], "%s", run->st[r] ? seldp_last_error() : "");
    if (run->st[r] == SELDP_ERR_GRADS_UNDEFINED) {
        run->intact[r] = !run->staged;
        snprintf(run->why[r], sizeof run->why[r], "undefined gradients under staged_commit");
    } else if (run->st[r] != SELDP_OK) {
        run->intact[r] = gs_same(&before, g.grads, run->why[r], sizeof run->why[r]);
    } else {
        /* sum over the ranks of (q + 1) * (i % 7): exact in every dtype used */
        run->intact[r] = true;
        for (size_t j = 0; j < N_TRAINABLE && run->intact[r]; j++) {
            size_t k = TRAINABLE[j];
            const seldp_tensor *t = seldp_grads_get(g.grads, std_id(r, k));
            for (size_t i = 0; i < std_numel(k); i++) {
                double want = (double)(NRANKS * (NRANKS + 1) / 2 * (int)(i % 7));
                if (ct_get(t->dtype, t->data, i) != want) {
                    snprintf(run->why[r], sizeof run->why[r], "'%s'[%zu] = %g, expected %g",
                             STD[k].path, i, ct_get(t->dtype, t->data, i), want);
                    run->intact[r] = false;
                    break;
                }
            }
        }
    }
out:
    gs_free(&before);
    tg_free(&g);
    seldp_session_destroy(s);
    ct_free(&m);
    seldp_comm_destroy(comm);
    return NULL;
}

static void run_faulted(fault_run *run, bool staged, int faulty, uint64_t point,
                        seldp__host_fault_action action)
{
    seldp_comm_config cfg = SELDP_COMM_CONFIG_INIT;
    pthread_t threads[NRANKS];
    fault_arg args[NRANKS];

    memset(run, 0, sizeof *run);
    run->staged = staged;
    cfg.timeout_s = TIMEOUT_S;
    assert_int_equal(seldp_host_world_create(NRANKS, &cfg, &run->world), SELDP_OK);
    for (int r = 0; r < NRANKS; r++)
        assert_int_equal(seldp__host_fault_set(run->world, r, r == faulty ? point : UINT64_MAX,
                                               r == faulty ? action : SELDP__FAULT_NONE),
                         SELDP_OK);
    for (int r = 0; r < NRANKS; r++) {
        args[r] = (fault_arg){run, r};
        assert_int_equal(pthread_create(&threads[r], NULL, fault_rank, &args[r]), 0);
    }
    for (int r = 0; r < NRANKS; r++)
        pthread_join(threads[r], NULL);
    seldp_host_world_destroy(run->world);
    run->world = NULL;
}

/* Every collective a reduction makes (agreement, allreduces or the fused reduction, and
 * under staged_commit the confirmation), failed by aborting or by leaving early: every
 * rank fails and every rank's gradients are as they were. */
static void fault_at_every_reduction_point(void **state)
{
    (void)state;
    static const seldp__host_fault_action actions[] = {SELDP__FAULT_ABORT, SELDP__FAULT_RETURN};
    fault_run *run = calloc(1, sizeof *run);
    assert_non_null(run);
    for (int staged = 0; staged <= 1; staged++) {
        run_faulted(run, staged, -1, 0, SELDP__FAULT_NONE);
        for (int r = 0; r < NRANKS; r++)
            if (run->st[r] != SELDP_OK || !run->intact[r])
                fail_msg("clean run, staged %d: rank %d returned %s: %s %s", staged, r,
                         seldp_status_name(run->st[r]), run->msg[r], run->why[r]);
        uint64_t first = run->before[0], last = run->after[0];
        /* the confirmation is one more collective than without staged_commit */
        if (last - first < (staged ? 3u : 2u))
            fail_msg("staged %d: the reduction entered only %llu collectives", staged,
                     (unsigned long long)(last - first));
        for (uint64_t point = first; point < last; point++) {
            for (size_t a = 0; a < sizeof actions / sizeof actions[0]; a++) {
                int faulty = (int)(point % NRANKS);
                run_faulted(run, staged, faulty, point, actions[a]);
                for (int r = 0; r < NRANKS; r++) {
                    if (run->st[r] == SELDP_OK)
                        fail_msg("staged %d, fault %zu at point %llu of rank %d: rank %d "
                                 "succeeded",
                                 staged, a, (unsigned long long)(point - first), faulty, r);
                    if (run->st[r] == SELDP_ERR_GRADS_UNDEFINED || !run->intact[r])
                        fail_msg("staged %d, fault %zu at point %llu of rank %d: rank %d "
                                 "returned %s with its gradients changed: %s (%s)",
                                 staged, a, (unsigned long long)(point - first), faulty, r,
                                 seldp_status_name(run->st[r]), run->why[r], run->msg[r]);
                }
            }
        }
    }
    free(run);
}

/* --- an abort that lands while the reduction runs ------------------------- */

#define BIG_F32  ((int64_t)1 << 18)
#define BIG_BF16 ((int64_t)1 << 16)

typedef struct abort_trial {
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
    seldp_session_config cfg = SELDP_SESSION_CONFIG_INIT;
    test_model m;
    test_grads g;
    grads_snapshot before;
    void *data[2];

    memset(&m, 0, sizeof m);
    RANK_CHECK_OK(ctx,
                  seldp_comm_split(ctx->world, r < NRANKS ? 0 : SELDP_COMM_NO_GROUP, r, &group));
    if (r == NRANKS) { /* the watchdog: aborts the world while the others reduce */
        RANK_CHECK_OK(ctx, seldp_comm_barrier(ctx->world));
        struct timespec ts = {0, t->delay_us * 1000};
        nanosleep(&ts, NULL);
        seldp_comm_abort(ctx->world);
        return 0;
    }
    cfg.staged_commit = t->staged;
    RANK_CHECK_OK(ctx, ct_init(&m, r));
    RANK_CHECK_OK(ctx, ct_add(&m, "big.bf16", 1, SELDP_BF16, false, 1, 1, SHAPE(BIG_BF16)));
    RANK_CHECK_OK(ctx, ct_add(&m, "big.f32", 2, SELDP_F32, false, 2, 1, SHAPE(BIG_F32)));
    RANK_CHECK_OK(
        ctx, seldp_session_initialize(group, m.model, 0, (seldp_param_id[]){1, 2}, 2, &cfg, &s));
    RANK_CHECK_OK(ctx, tg_init(&g));
    RANK_CHECK_OK(ctx, tg_put(&g, 1, SELDP_BF16, false, 3, 1, SHAPE(BIG_BF16), &data[0]));
    RANK_CHECK_OK(ctx, tg_put(&g, 2, SELDP_F32, true, 4, 1, SHAPE(BIG_F32), &data[1]));
    /* a first reduction allocates what the session keeps (its staging buffer), so that the
     * timed one below starts at once */
    RANK_CHECK_OK(ctx, seldp_session_sum(s, g.grads, true, SELDP_MISSING_ZERO, NULL));
    for (int64_t i = 0; i < BIG_BF16; i++)
        ct_set(SELDP_BF16, data[0], (size_t)i, (double)(r + 1));
    for (int64_t i = 0; i < BIG_F32; i++)
        ((float *)data[1])[i] = (float)((r + 1) * (i % 5));
    gs_take(&before, g.grads);
    RANK_CHECK_OK(ctx, seldp_comm_barrier(ctx->world));
    t->st[r] = seldp_session_sum(s, g.grads, true, SELDP_MISSING_ERROR, NULL);
    if (getenv("SELDP_TEST_VERBOSE") && t->st[r])
        printf("      %ld us, rank %d: %s\n", t->delay_us, r, seldp_last_error());
    if (t->st[r] == SELDP_ERR_GRADS_UNDEFINED) {
        t->intact[r] = !t->staged;
        snprintf(t->why[r], sizeof t->why[r], "undefined gradients under staged_commit");
    } else if (t->st[r] != SELDP_OK) {
        t->intact[r] = gs_same(&before, g.grads, t->why[r], sizeof t->why[r]);
    } else {
        const float *x = seldp_grads_get(g.grads, 2)->data;
        const void *h = seldp_grads_get(g.grads, 1)->data;
        t->intact[r] = ct_get(SELDP_BF16, h, (size_t)BIG_BF16 - 1) == 6.0;
        for (int64_t i = 0; i < BIG_F32 && t->intact[r]; i += 4099)
            t->intact[r] = x[i] == (float)(6 * (i % 5));
        if (!t->intact[r])
            snprintf(t->why[r], sizeof t->why[r], "a reduction that succeeded is wrong");
    }
    gs_free(&before);
    tg_free(&g);
    seldp_session_destroy(s);
    seldp_comm_destroy(group);
    ct_free(&m);
    return 0;
}

/* A fourth rank, outside the session's group, aborts the world a little later each time:
 * before, during or after the reduction. Every rank's status must tell the truth about its
 * gradients: exact results, the gradients as they were, or (without staged_commit only)
 * SELDP_ERR_GRADS_UNDEFINED. */
static void abort_while_reducing(void **state)
{
    (void)state;
    int seen[2][4] = {{0}}; /* staged x (ok, unchanged, undefined, other) */
    for (int staged = 0; staged <= 1; staged++) {
        for (long delay = 0; delay <= 2000; delay += 200) {
            abort_trial t;
            char why[1200];
            memset(&t, 0, sizeof t);
            t.staged = staged;
            t.delay_us = delay;
            /* a rank's setup failure (the abort cannot land before the barrier) fails */
            if (tr_run_ranks_status(NRANKS + 1, 30.0, rank_abort, &t, why, sizeof why))
                fail_msg("staged %d, abort after %ld us: %s", staged, delay, why);
            for (int r = 0; r < NRANKS; r++) {
                if (!t.intact[r])
                    fail_msg("staged %d, abort after %ld us: rank %d returned %s: %s", staged,
                             delay, r, seldp_status_name(t.st[r]), t.why[r]);
                seen[staged][t.st[r] == SELDP_OK                                            ? 0
                             : t.st[r] == SELDP_ERR_GRADS_UNDEFINED                         ? 2
                             : t.st[r] == SELDP_ERR_ABORTED || t.st[r] == SELDP_ERR_TIMEOUT ? 1
                                                                                            : 3]++;
            }
        }
        printf("    staged_commit %d: %d ok, %d unchanged, %d undefined, %d other\n", staged,
               seen[staged][0], seen[staged][1], seen[staged][2], seen[staged][3]);
        assert_int_equal(seen[staged][3], 0);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(fault_at_every_reduction_point),
        cmocka_unit_test(abort_while_reducing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
