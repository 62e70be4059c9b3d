/* Contract of the missing-gradient policies (docs/library.md, Missing gradients): under `error` an
 * active rank that lacks a gradient some active rank has is named; under `zero` it contributes zero
 * and receives the result; under both, a parameter no active rank has a gradient for stays absent
 * everywhere. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "contract.h"

static const size_t TRAINABLE[] = {0, 1, 3, 4};
#define N_TRAINABLE 4
#define FINAL_NORM  1 /* STD index of final_norm.weight */

typedef struct miss_arg {
    seldp_missing_policy policy;
    bool sum;              /* seldp_session_sum instead of reduce */
    bool has[MAX_RANKS];   /* which ranks have a final_norm.weight gradient */
    uint64_t w[MAX_RANKS]; /* weights (sum: active when non-zero) */
    outcome o;
} miss_arg;

/* Every trainable gradient, final_norm.weight only where a->has[rank]. */
static int put_grads(tr_rank_ctx *ctx, const miss_arg *a, test_grads *g)
{
    RANK_CHECK_OK(ctx, tg_init(g));
    for (size_t j = 0; j < N_TRAINABLE; j++) {
        size_t k = TRAINABLE[j];
        if (k == FINAL_NORM && !a->has[ctx->rank])
            continue;
        RANK_CHECK_OK(ctx, std_put_grad(g, ctx->rank, k, STD[k].dtype, ctx->rank % 2, NULL));
    }
    RANK_CHECK_OK(ctx, tg_put(g, 4242, SELDP_F32, false, 3, 1, SHAPE(2), NULL));
    return 0;
}

static seldp_status call(const miss_arg *a, seldp_session *s, seldp_grads *g, int rank,
                         uint64_t *total)
{
    if (a->sum)
        return seldp_session_sum(s, g, a->w[rank] > 0, a->policy, total);
    return seldp_session_reduce(s, g, a->w[rank], a->policy, total);
}

/* A call that must succeed: final_norm.weight is the sum over active ranks that have it,
 * divided by the global weight (mean), present on every rank exactly when some active
 * rank had it. */
static int rank_succeeds(tr_rank_ctx *ctx)
{
    const miss_arg *a = ctx->arg;
    test_model m;
    test_grads g;
    grads_snapshot before;
    seldp_session *s = NULL;
    bool contributes[MAX_RANKS], any = false;
    uint64_t total = 0, w = 0;
    double ref[4];
    char why[256];
    const seldp_tensor *t;

    for (int r = 0; r < ctx->size; r++) {
        contributes[r] = a->has[r] && a->w[r] > 0;
        any |= contributes[r];
        w += a->sum ? (a->w[r] > 0) : a->w[r];
    }
    RANK_CHECK_OK(ctx, std_session(ctx->world, &m, NULL, &s));
    if (put_grads(ctx, a, &g))
        return 1;
    gs_take(&before, g.grads);
    RANK_CHECK_OK(ctx, call(a, s, g.grads, ctx->rank, &total));
    RANK_CHECK(ctx, total == w, "global weight %llu, expected %llu", (unsigned long long)total,
               (unsigned long long)w);
    t = seldp_grads_get(g.grads, std_id(ctx->rank, FINAL_NORM));
    if (!any) {
        RANK_CHECK(ctx, t == NULL, "final_norm.weight has a gradient no active rank gave");
    } else {
        RANK_CHECK(ctx, t != NULL, "final_norm.weight has no gradient");
        std_reference(FINAL_NORM, SELDP_F32, ctx->size, contributes, a->sum ? 1.0 : (double)w, ref);
        RANK_CHECK(ctx,
                   t->dtype == SELDP_F32 &&
                       close_to(SELDP_F32, t->data, ref, 4, 2e-6, why, sizeof why),
                   "final_norm.weight: %s", why);
        if (!a->has[ctx->rank])
            RANK_CHECK(ctx,
                       seldp_grads_ownership(g.grads, std_id(ctx->rank, FINAL_NORM)) == SELDP_OWNED,
                       "the result for a rank without a gradient is not an owned entry");
    }
    /* every replica holds the same set of gradients with the same bytes */
    RANK_CHECK(ctx,
               same_everywhere(ctx->world, &(size_t){seldp_grads_count(g.grads)}, sizeof(size_t)),
               "replicas hold different numbers of gradients");
    if (t)
        RANK_CHECK(ctx, same_everywhere(ctx->world, t->data, 16), "replicas differ");
    RANK_CHECK(ctx, gs_entry_same(&before, g.grads, 4242), "the unselected gradient changed");
    /* a borrowed gradient removed because no active rank had one keeps its bytes */
    for (size_t i = 0; i < before.n; i++)
        if (before.id[i] == std_id(ctx->rank, FINAL_NORM) && !any &&
            before.own[i] == SELDP_BORROWED)
            RANK_CHECK(ctx, memcmp(before.bytes[i], before.t[i].data, 16) == 0,
                       "removed borrowed bytes were written");
    gs_free(&before);
    tg_free(&g);
    seldp_session_destroy(s);
    ct_free(&m);
    return 0;
}

/* A call that must fail: record the outcome for the main thread. */
static int rank_fails(tr_rank_ctx *ctx)
{
    miss_arg *a = ctx->arg;
    test_model m;
    test_grads g;
    grads_snapshot before;
    seldp_session *s = NULL;
    uint64_t total = 0;
    seldp_status st;

    RANK_CHECK_OK(ctx, std_session(ctx->world, &m, NULL, &s));
    if (put_grads(ctx, a, &g))
        return 1;
    gs_take(&before, g.grads);
    st = call(a, s, g.grads, ctx->rank, &total);
    outcome_record(&a->o, ctx->rank, st);
    a->o.unchanged[ctx->rank] = gs_same(&before, g.grads, a->o.why[ctx->rank], sizeof a->o.why[0]);
    gs_free(&before);
    tg_free(&g);
    seldp_session_destroy(s);
    ct_free(&m);
    return 0;
}

static miss_arg make(seldp_missing_policy policy, bool sum)
{
    miss_arg a;
    memset(&a, 0, sizeof a);
    a.policy = policy;
    a.sum = sum;
    for (int r = 0; r < MAX_RANKS; r++) {
        a.has[r] = true;
        a.w[r] = (uint64_t)r + 1;
    }
    return a;
}

static void policy_error_names_the_rank_that_lacks(void **state)
{
    (void)state;
    for (int sum = 0; sum <= 1; sum++) {
        for (int n = 2; n <= 4; n++) {
            miss_arg a = make(SELDP_MISSING_ERROR, sum);
            char who[64];
            a.has[n - 1] = false;
            tr_run_ranks(n, TEST_TIMEOUT_S, rank_fails, &a);
            snprintf(who, sizeof who, "no gradient on active group rank %d", n - 1);
            expect_same_failure(&a.o, n, SELDP_ERR_MISSING_GRADIENT, "'final_norm.weight'", who);
        }
    }
    {
        miss_arg a = make(SELDP_MISSING_ERROR, false);
        a.has[1] = a.has[3] = false;
        tr_run_ranks(4, TEST_TIMEOUT_S, rank_fails, &a);
        expect_same_failure(&a.o, 4, SELDP_ERR_MISSING_GRADIENT, "group ranks 1,3",
                            "has one on active group ranks 0,2");
    }
}

static void policy_error_ignores_inactive_ranks(void **state)
{
    (void)state;
    for (int sum = 0; sum <= 1; sum++) {
        for (int n = 2; n <= 4; n++) {
            miss_arg a = make(SELDP_MISSING_ERROR, sum);
            a.has[n - 1] = false;
            a.w[n - 1] = 0;
            tr_run_ranks(n, TEST_TIMEOUT_S, rank_succeeds, &a);
        }
    }
}

static void policy_zero_contributes_zero(void **state)
{
    (void)state;
    for (int sum = 0; sum <= 1; sum++) {
        for (int n = 2; n <= 4; n++) {
            for (int lacking = 0; lacking < n; lacking++) {
                miss_arg a = make(SELDP_MISSING_ZERO, sum);
                a.has[lacking] = false;
                tr_run_ranks(n, TEST_TIMEOUT_S, rank_succeeds, &a);
            }
        }
    }
}

static void globally_absent_gradient_stays_absent(void **state)
{
    (void)state;
    for (int policy = SELDP_MISSING_ERROR; policy <= SELDP_MISSING_ZERO; policy++) {
        for (int sum = 0; sum <= 1; sum++) {
            for (int n = 1; n <= 4; n++) {
                miss_arg a = make((seldp_missing_policy)policy, sum);
                for (int r = 0; r < n; r++)
                    a.has[r] = false;
                tr_run_ranks(n, TEST_TIMEOUT_S, rank_succeeds, &a);
            }
        }
    }
}

/* Only an inactive rank has the gradient: no active rank does, so it is absent everywhere,
 * removed from the inactive rank's container too; no error under either policy. */
static void gradient_only_on_inactive_ranks_is_absent(void **state)
{
    (void)state;
    for (int policy = SELDP_MISSING_ERROR; policy <= SELDP_MISSING_ZERO; policy++) {
        for (int sum = 0; sum <= 1; sum++) {
            for (int n = 2; n <= 4; n++) {
                miss_arg a = make((seldp_missing_policy)policy, sum);
                for (int r = 0; r < n; r++)
                    a.has[r] = r == 1;
                a.w[1] = 0;
                tr_run_ranks(n, TEST_TIMEOUT_S, rank_succeeds, &a);
            }
        }
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(policy_error_names_the_rank_that_lacks),
        cmocka_unit_test(policy_error_ignores_inactive_ranks),
        cmocka_unit_test(policy_zero_contributes_zero),
        cmocka_unit_test(globally_absent_gradient_stays_absent),
        cmocka_unit_test(gradient_only_on_inactive_ranks_is_absent),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
