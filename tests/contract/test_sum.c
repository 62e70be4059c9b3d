/* Contract of seldp_session_sum and seldp_session_sum_fp32 (docs/library.md, Reduce and sum): no
 * division, local_active decides eligibility and not scale, global_weight counts active ranks, an
 * all-inactive window returns only the untouched gradients. */
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

/* Rank r's gradient of STD[k]: multiples of 1/8 in [-8, 8), exact in every dtype used here
 * and exactly summable in F32. */
static void exact_values(int rank, size_t k, float *x)
{
    tr_fill_f32_exact(x, std_numel(k), std_grad_seed(rank, k));
}

static int put_exact(tr_rank_ctx *ctx, test_grads *g, size_t k, seldp_dtype dtype, void **data)
{
    float x[64];
    RANK_CHECK_OK(ctx, std_put_grad(g, ctx->rank, k, dtype, ctx->rank % 2, data));
    exact_values(ctx->rank, k, x);
    for (size_t i = 0; i < std_numel(k); i++)
        ct_set(dtype, *data, i, x[i]);
    return 0;
}

/* sum_r over active ranks of their exact values of STD[k], computed in double. */
static void exact_sum(size_t k, int n, const bool *active, double *ref)
{
    float x[64];
    for (size_t i = 0; i < std_numel(k); i++)
        ref[i] = 0.0;
    for (int r = 0; r < n; r++) {
        if (!active[r])
            continue;
        exact_values(r, k, x);
        for (size_t i = 0; i < std_numel(k); i++)
            ref[i] += x[i];
    }
}

typedef struct sum_arg {
    bool fp32;
    bool active[MAX_RANKS];
} sum_arg;

static int rank_sum(tr_rank_ctx *ctx)
{
    const sum_arg *a = ctx->arg;
    test_model m;
    test_grads g;
    seldp_session *s = NULL;
    void *data[N_TRAINABLE];
    uint64_t total = 0, n_active = 0;
    double ref[64];
    char why[256];

    for (int r = 0; r < ctx->size; r++)
        n_active += a->active[r];
    RANK_CHECK_OK(ctx, std_session(ctx->world, &m, NULL, &s));
    RANK_CHECK_OK(ctx, tg_init(&g));
    for (size_t j = 0; j < N_TRAINABLE; j++)
        if (put_exact(ctx, &g, TRAINABLE[j], STD[TRAINABLE[j]].dtype, &data[j]))
            return 1;
    if (!a->active[ctx->rank]) /* eligibility: an inactive rank's values never count */
        for (size_t j = 0; j < N_TRAINABLE; j++)
            ct_set(STD[TRAINABLE[j]].dtype, data[j], 0, NAN);
    if (a->fp32)
        RANK_CHECK_OK(ctx, seldp_session_sum_fp32(s, g.grads, a->active[ctx->rank],
                                                  SELDP_MISSING_ERROR, &total));
    else
        RANK_CHECK_OK(
            ctx, seldp_session_sum(s, g.grads, a->active[ctx->rank], SELDP_MISSING_ERROR, &total));
    RANK_CHECK(ctx, total == n_active, "global weight %llu, expected %llu active ranks",
               (unsigned long long)total, (unsigned long long)n_active);
    for (size_t j = 0; j < N_TRAINABLE; j++) {
        size_t k = TRAINABLE[j];
        const seldp_tensor *t = seldp_grads_get(g.grads, std_id(ctx->rank, k));
        seldp_dtype want = a->fp32 ? SELDP_F32 : STD[k].dtype;
        RANK_CHECK(ctx, t && t->dtype == want, "'%s': no %s result", STD[k].path,
                   seldp_dtype_name(want));
        exact_sum(k, ctx->size, a->active, ref);
        if (want == SELDP_F32) { /* exact: no division, F32 sums of these values are exact */
            for (size_t i = 0; i < std_numel(k); i++)
                RANK_CHECK(ctx, ((const float *)t->data)[i] == (float)ref[i],
                           "'%s'[%zu] = %g, expected the sum %g", STD[k].path, i,
                           (double)((const float *)t->data)[i], ref[i]);
        } else {
            RANK_CHECK(ctx, close_to(want, t->data, ref, std_numel(k), 1e-6, why, sizeof why),
                       "'%s': %s", STD[k].path, why);
        }
        RANK_CHECK(ctx, same_everywhere(ctx->world, t->data, seldp_tensor_nbytes(t)),
                   "'%s' is not bit-identical on every rank", STD[k].path);
    }
    tg_free(&g);
    seldp_session_destroy(s);
    ct_free(&m);
    return 0;
}

static void sum_over_active_ranks(void **state)
{
    (void)state;
    for (int fp32 = 0; fp32 <= 1; fp32++) {
        for (int n = 1; n <= 4; n++) {
            sum_arg a = {fp32, {true, n == 1, true, false}};
            tr_run_ranks(n, TEST_TIMEOUT_S, rank_sum, &a);
            sum_arg all = {fp32, {true, true, true, true}};
            tr_run_ranks(n, TEST_TIMEOUT_S, rank_sum, &all);
        }
    }
}

/* Identical gradients on n ranks sum to n times the gradient: nothing divides by n. */
static int rank_no_division(tr_rank_ctx *ctx)
{
    test_model m;
    seldp_grads *g = NULL;
    seldp_session *s = NULL;
    seldp_param_id id = 3;
    float grad[3] = {0.5f, -1.25f, 3.0f};
    seldp_tensor t = seldp_tensor_view(SELDP_F32, SELDP_HOST_DEVICE, grad, 1, SHAPE(3));
    uint64_t total = 0;
    float n = (float)ctx->size;

    RANK_CHECK_OK(ctx, ct_init(&m, ctx->rank));
    RANK_CHECK_OK(ctx, ct_add(&m, "w", id, SELDP_F32, false, 1, 1, SHAPE(3)));
    RANK_CHECK_OK(ctx, seldp_session_initialize(ctx->world, m.model, 0, &id, 1, NULL, &s));
    RANK_CHECK_OK(ctx, seldp_grads_create(&g));
    RANK_CHECK_OK(ctx, seldp_grads_put(g, id, &t, SELDP_BORROWED));
    RANK_CHECK_OK(ctx, seldp_session_sum(s, g, true, SELDP_MISSING_ERROR, &total));
    RANK_CHECK(ctx, grad[0] == 0.5f * n && grad[1] == -1.25f * n && grad[2] == 3.0f * n,
               "got {%g, %g, %g} on %d ranks", grad[0], grad[1], grad[2], ctx->size);
    RANK_CHECK(ctx, total == (uint64_t)ctx->size, "global weight %llu", (unsigned long long)total);
    seldp_grads_destroy(g);
    seldp_session_destroy(s);
    ct_free(&m);
    return 0;
}

static void sum_does_not_divide(void **state)
{
    (void)state;
    for (int n = 1; n <= 4; n++)
        tr_run_ranks(n, TEST_TIMEOUT_S, rank_no_division, NULL);
}

/* No active rank: only the unselected gradients come back, untouched. */
static int rank_all_inactive(tr_rank_ctx *ctx)
{
    const sum_arg *a = ctx->arg;
    test_model m;
    test_grads g;
    grads_snapshot before;
    seldp_session *s = NULL;
    void *data;
    uint64_t total = 99;
    seldp_comm_stats s0, s1;

    RANK_CHECK_OK(ctx, std_session(ctx->world, &m, NULL, &s));
    RANK_CHECK_OK(ctx, tg_init(&g));
    for (size_t j = 0; j < N_TRAINABLE; j++)
        if (put_exact(ctx, &g, TRAINABLE[j], STD[TRAINABLE[j]].dtype, &data))
            return 1;
    RANK_CHECK_OK(ctx, tg_put(&g, 777, SELDP_BF16, false, 4, 1, SHAPE(6), NULL));
    RANK_CHECK_OK(ctx, tg_put(&g, 778, SELDP_I32, true, 5, 1, SHAPE(2), NULL));
    gs_take(&before, g.grads);
    s0 = seldp_comm_get_stats(ctx->world);
    if (a->fp32)
        RANK_CHECK_OK(ctx, seldp_session_sum_fp32(s, g.grads, false, SELDP_MISSING_ERROR, &total));
    else
        RANK_CHECK_OK(ctx, seldp_session_sum(s, g.grads, false, SELDP_MISSING_ERROR, &total));
    s1 = seldp_comm_get_stats(ctx->world);
    RANK_CHECK(ctx, total == 0, "global weight %llu", (unsigned long long)total);
    RANK_CHECK(ctx, seldp_grads_count(g.grads) == 2, "%zu gradients left, expected 2",
               seldp_grads_count(g.grads));
    RANK_CHECK(ctx, gs_entry_same(&before, g.grads, 777) && gs_entry_same(&before, g.grads, 778),
               "an unselected gradient changed");
    RANK_CHECK(ctx, stats_moves(s1) == stats_moves(s0), "an all-inactive window allreduced");
    gs_free(&before);
    tg_free(&g);
    seldp_session_destroy(s);
    ct_free(&m);
    return 0;
}

static void all_inactive_returns_only_untouched_gradients(void **state)
{
    (void)state;
    for (int fp32 = 0; fp32 <= 1; fp32++) {
        sum_arg a = {fp32, {false}};
        for (int n = 1; n <= 4; n++)
            tr_run_ranks(n, TEST_TIMEOUT_S, rank_all_inactive, &a);
    }
}

/* sum makes the same collectives as reduce: one agreement, ceil(bytes / bucket) allreduces. */
static int rank_sum_stats(tr_rank_ctx *ctx)
{
    seldp_session_config cfg = SELDP_SESSION_CONFIG_INIT;
    test_model m;
    test_grads g;
    seldp_session *s = NULL;
    void *data;
    seldp_comm_stats s0, s1;

    cfg.bucket_bytes = 64; /* 192 bytes of F32 in the standard layout: 3 buckets */
    RANK_CHECK_OK(ctx, std_session(ctx->world, &m, &cfg, &s));
    RANK_CHECK_OK(ctx, tg_init(&g));
    for (size_t j = 0; j < N_TRAINABLE; j++)
        if (put_exact(ctx, &g, TRAINABLE[j], STD[TRAINABLE[j]].dtype, &data))
            return 1;
    s0 = seldp_comm_get_stats(ctx->world);
    RANK_CHECK_OK(ctx, seldp_session_sum(s, g.grads, true, SELDP_MISSING_ZERO, NULL));
    s1 = seldp_comm_get_stats(ctx->world);
    /* the fused path moves the three buckets in one counted reduction */
    bool fused = seldp_session_reduce_path(s) == SELDP_REDUCE_PATH_FUSED;
    uint64_t allreduces = fused ? 0 : 3, reductions = fused ? 1 : 0;
    RANK_CHECK(ctx,
               s1.allgathers - s0.allgathers == 1 && s1.allreduces - s0.allreduces == allreduces &&
                   s1.reductions - s0.reductions == reductions,
               "%llu all-gathers, %llu allreduces and %llu fused reductions, expected 1, %llu "
               "and %llu",
               (unsigned long long)(s1.allgathers - s0.allgathers),
               (unsigned long long)(s1.allreduces - s0.allreduces),
               (unsigned long long)(s1.reductions - s0.reductions), (unsigned long long)allreduces,
               (unsigned long long)reductions);
    tg_free(&g);
    seldp_session_destroy(s);
    ct_free(&m);
    return 0;
}

static void sum_is_bucketed(void **state)
{
    (void)state;
    for (int n = 1; n <= 4; n++)
        tr_run_ranks(n, TEST_TIMEOUT_S, rank_sum_stats, NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(sum_over_active_ranks),
        cmocka_unit_test(sum_does_not_divide),
        cmocka_unit_test(all_inactive_returns_only_untouched_gradients),
        cmocka_unit_test(sum_is_bucketed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
