/* Contract of half-precision reductions (docs/library.md, Reduce and sum): F16 and BF16 gradients
 * are communicated and summed in FP32 and cast back with round-to-nearest-even, unless an FP32
 * variant was called; checked against FP64 computations. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "contract.h"

#define ROWS  32
#define COLS  33
#define NUMEL (ROWS * COLS)

static const uint64_t WEIGHTS[MAX_RANKS] = {7, 1, 3, 12};

typedef enum method { REDUCE, REDUCE_FP32, SUM, SUM_FP32 } method;

static uint64_t grad_seed(int rank, seldp_dtype dtype)
{
    return 9000u + 10u * (uint64_t)rank + (uint64_t)dtype;
}

/* One BF16 and one F16 parameter, both selected. */
static int half_session(tr_rank_ctx *ctx, test_model *m, seldp_session **s)
{
    seldp_param_id ids[2] = {10 + (seldp_param_id)ctx->rank, 20};
    RANK_CHECK_OK(ctx, ct_init(m, ctx->rank));
    RANK_CHECK_OK(ctx, ct_add(m, "h.bf16", ids[0], SELDP_BF16, false, 1, 2, SHAPE(ROWS, COLS)));
    RANK_CHECK_OK(ctx, ct_add(m, "h.f16", ids[1], SELDP_F16, false, 2, 2, SHAPE(ROWS, COLS)));
    RANK_CHECK_OK(ctx, seldp_session_initialize(ctx->world, m->model, 0, ids, 2, NULL, s));
    return 0;
}

static seldp_status run(method mth, seldp_session *s, seldp_grads *g, uint64_t w, uint64_t *total)
{
    switch (mth) {
    case REDUCE:
        return seldp_session_reduce(s, g, w, SELDP_MISSING_ERROR, total);
    case REDUCE_FP32:
        return seldp_session_reduce_fp32(s, g, w, SELDP_MISSING_ERROR, total);
    case SUM:
        return seldp_session_sum(s, g, w > 0, SELDP_MISSING_ERROR, total);
    case SUM_FP32:
        return seldp_session_sum_fp32(s, g, w > 0, SELDP_MISSING_ERROR, total);
    }
    return SELDP_ERR_INTERNAL;
}

/* ||got - ref|| / ||ref|| over the tensor. */
static double relative_error(seldp_dtype dtype, const void *got, const double *ref, size_t n)
{
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = ct_get(dtype, got, i) - ref[i];
        num += d * d;
        den += ref[i] * ref[i];
    }
    return sqrt(num) / sqrt(den);
}

static int rank_against_fp64(tr_rank_ctx *ctx)
{
    const method mth = *(const method *)ctx->arg;
    static const seldp_dtype dtypes[2] = {SELDP_BF16, SELDP_F16};
    seldp_param_id ids[2] = {10 + (seldp_param_id)ctx->rank, 20};
    bool normalize = mth == REDUCE || mth == REDUCE_FP32;
    bool fp32 = mth == REDUCE_FP32 || mth == SUM_FP32;
    test_model m;
    test_grads g;
    seldp_session *s = NULL;
    uint64_t total = 0, w = 0;
    double *ref = malloc(NUMEL * sizeof *ref);
    void *tmp = malloc(NUMEL * sizeof(float));
    char why[256];

    RANK_CHECK(ctx, ref && tmp, "out of memory");
    if (half_session(ctx, &m, &s))
        return 1;
    RANK_CHECK_OK(ctx, tg_init(&g));
    for (int d = 0; d < 2; d++)
        RANK_CHECK_OK(ctx, tg_put(&g, ids[d], dtypes[d], d == 1, grad_seed(ctx->rank, dtypes[d]), 2,
                                  SHAPE(ROWS, COLS), NULL));
    RANK_CHECK_OK(ctx, run(mth, s, g.grads, WEIGHTS[ctx->rank], &total));
    for (int r = 0; r < ctx->size; r++)
        w += normalize ? WEIGHTS[r] : 1;
    RANK_CHECK(ctx, total == w, "global weight %llu, expected %llu", (unsigned long long)total,
               (unsigned long long)w);
    for (int d = 0; d < 2; d++) {
        const seldp_tensor *t = seldp_grads_get(g.grads, ids[d]);
        double err, bound = dtypes[d] == SELDP_BF16 ? 1e-2 : 2e-3;
        /* FP64 reference of the same half inputs */
        for (size_t i = 0; i < NUMEL; i++)
            ref[i] = 0.0;
        for (int r = 0; r < ctx->size; r++) {
            ct_fill(dtypes[d], tmp, NUMEL, grad_seed(r, dtypes[d]));
            for (size_t i = 0; i < NUMEL; i++)
                ref[i] += ct_get(dtypes[d], tmp, i);
        }
        for (size_t i = 0; i < NUMEL; i++)
            ref[i] /= normalize ? (double)total : 1.0;
        RANK_CHECK(ctx, t && t->dtype == (fp32 ? SELDP_F32 : dtypes[d]), "%s result dtype",
                   seldp_dtype_name(dtypes[d]));
        /* each element within half an ulp of FP64 (FP32 variants: FP32 accuracy) */
        RANK_CHECK(ctx, close_to(t->dtype, t->data, ref, NUMEL, 1e-6, why, sizeof why), "%s: %s",
                   seldp_dtype_name(dtypes[d]), why);
        err = relative_error(t->dtype, t->data, ref, NUMEL);
        RANK_CHECK(ctx, err <= (fp32 ? 1e-6 : bound), "%s: relative error %.3g",
                   seldp_dtype_name(dtypes[d]), err);
        RANK_CHECK(ctx, same_everywhere(ctx->world, t->data, seldp_tensor_nbytes(t)),
                   "%s result differs between replicas", seldp_dtype_name(dtypes[d]));
    }
    free(ref);
    free(tmp);
    tg_free(&g);
    seldp_session_destroy(s);
    ct_free(&m);
    return 0;
}

static void halves_match_fp64(void **state)
{
    (void)state;
    static const method methods[] = {REDUCE, REDUCE_FP32, SUM, SUM_FP32};
    for (size_t i = 0; i < 4; i++)
        for (int n = 1; n <= 4; n++)
            tr_run_ranks(n, TEST_TIMEOUT_S, rank_against_fp64, (void *)&methods[i]);
}

/* Two ranks sum 1 + x where x puts the F32 sum 0.5, 1.5, 0.75 and 0.25 ulps of the half
 * above 1: round-to-nearest-even gives 1, 1 + 2 ulp, 1 + 1 ulp, 1. Truncation would give
 * 1, 1 + 1 ulp, 1, 1. */
static int rank_round_to_nearest_even(tr_rank_ctx *ctx)
{
    const seldp_dtype dtype = *(const seldp_dtype *)ctx->arg;
    int mant = dtype == SELDP_BF16 ? 7 : 10;
    double ulp = ldexp(1.0, -mant);
    double x[4] = {0.5 * ulp, 1.5 * ulp, 0.75 * ulp, 0.25 * ulp};
    double want[4] = {1.0, 1.0 + 2 * ulp, 1.0 + ulp, 1.0};
    test_model m;
    seldp_grads *g = NULL;
    seldp_session *s = NULL;
    seldp_param_id id = 5;
    uint16_t grad[4];
    seldp_tensor t = seldp_tensor_view(dtype, SELDP_HOST_DEVICE, grad, 1, SHAPE(4));

    for (int i = 0; i < 4; i++)
        ct_set(dtype, grad, (size_t)i, ctx->rank == 0 ? 1.0 : x[i]);
    for (int i = 0; i < 4; i++)
        RANK_CHECK(ctx, ct_get(dtype, grad, (size_t)i) == (ctx->rank == 0 ? 1.0 : x[i]),
                   "test input %d not exact in %s", i, seldp_dtype_name(dtype));
    RANK_CHECK_OK(ctx, ct_init(&m, ctx->rank));
    RANK_CHECK_OK(ctx, ct_add(&m, "p", id, dtype, false, 1, 1, SHAPE(4)));
    RANK_CHECK_OK(ctx, seldp_session_initialize(ctx->world, m.model, 0, &id, 1, NULL, &s));
    RANK_CHECK_OK(ctx, seldp_grads_create(&g));
    RANK_CHECK_OK(ctx, seldp_grads_put(g, id, &t, SELDP_BORROWED));
    RANK_CHECK_OK(ctx, seldp_session_sum(s, g, true, SELDP_MISSING_ERROR, NULL));
    for (int i = 0; i < 4; i++)
        RANK_CHECK(ctx, ct_get(dtype, grad, (size_t)i) == want[i],
                   "%s: 1 + %g rounded to %.10g, expected %.10g", seldp_dtype_name(dtype), x[i],
                   ct_get(dtype, grad, (size_t)i), want[i]);
    seldp_grads_destroy(g);
    seldp_session_destroy(s);
    ct_free(&m);
    return 0;
}

static void halves_round_to_nearest_even(void **state)
{
    (void)state;
    static const seldp_dtype dtypes[2] = {SELDP_BF16, SELDP_F16};
    for (int d = 0; d < 2; d++)
        tr_run_ranks(2, TEST_TIMEOUT_S, rank_round_to_nearest_even, (void *)&dtypes[d]);
}

/* 4 ranks sum big + 1 + 1 + 1 where big is 2048 (F16) or 256 (BF16), whose ulp is 2. In
 * FP32 the sum is big + 3, a tie rounded to the even big + 4. Accumulating in the half
 * type would lose every 1 (big + 1 is a tie rounded back to big). */
static int rank_summed_in_fp32(tr_rank_ctx *ctx)
{
    const seldp_dtype dtype = *(const seldp_dtype *)ctx->arg;
    double big = dtype == SELDP_F16 ? 2048.0 : 256.0;
    test_model m;
    seldp_grads *g = NULL;
    seldp_session *s = NULL;
    seldp_param_id id = 5;
    uint16_t grad[1];
    seldp_tensor t = seldp_tensor_view(dtype, SELDP_HOST_DEVICE, grad, 1, SHAPE(1));

    ct_set(dtype, grad, 0, ctx->rank == 0 ? big : 1.0);
    RANK_CHECK_OK(ctx, ct_init(&m, ctx->rank));
    RANK_CHECK_OK(ctx, ct_add(&m, "p", id, dtype, false, 1, 1, SHAPE(1)));
    RANK_CHECK_OK(ctx, seldp_session_initialize(ctx->world, m.model, 0, &id, 1, NULL, &s));
    RANK_CHECK_OK(ctx, seldp_grads_create(&g));
    RANK_CHECK_OK(ctx, seldp_grads_put(g, id, &t, SELDP_BORROWED));
    RANK_CHECK_OK(ctx, seldp_session_sum(s, g, true, SELDP_MISSING_ERROR, NULL));
    RANK_CHECK(ctx, ct_get(dtype, grad, 0) == big + 4.0, "%s: got %g, expected %g",
               seldp_dtype_name(dtype), ct_get(dtype, grad, 0), big + 4.0);
    seldp_grads_destroy(g);
    seldp_session_destroy(s);
    ct_free(&m);
    return 0;
}

static void halves_are_summed_in_fp32(void **state)
{
    (void)state;
    static const seldp_dtype dtypes[2] = {SELDP_BF16, SELDP_F16};
    for (int d = 0; d < 2; d++)
        tr_run_ranks(4, TEST_TIMEOUT_S, rank_summed_in_fp32, (void *)&dtypes[d]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(halves_match_fp64),
        cmocka_unit_test(halves_round_to_nearest_even),
        cmocka_unit_test(halves_are_summed_in_fp32),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
