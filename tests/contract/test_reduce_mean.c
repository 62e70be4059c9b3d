/* Contract of seldp_session_reduce and seldp_session_reduce_fp32, the weighted mean
 * (docs/library.md, Reduce and sum): result = sum_r g_r / sum_r w_r, written in place, unselected
 * gradients untouched, inactive ranks contributing nothing, zero global weight, overflow, FP32
 * results, non-finite detection, and the collectives one call makes. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "contract.h"

/* The trainable entries of STD: embed, final_norm (F32), norm (BF16), router (F16). */
static const size_t TRAINABLE[] = {0, 1, 3, 4};
#define N_TRAINABLE 4

static const uint64_t WEIGHTS[MAX_RANKS] = {3, 1, 4, 1, 5, 9, 2, 6};

static uint64_t weight_sum(const uint64_t *w, int n)
{
    uint64_t s = 0;
    for (int r = 0; r < n; r++)
        s += w[r];
    return s;
}

/* Put this rank's gradients of the trainable entries in the parameter dtype (owned on odd
 * ranks, borrowed on even ones) and unselected ones beside them. */
static int put_std_grads(tr_rank_ctx *ctx, test_grads *g, void **data)
{
    RANK_CHECK_OK(ctx, tg_init(g));
    for (size_t j = 0; j < N_TRAINABLE; j++) {
        size_t k = TRAINABLE[j];
        RANK_CHECK_OK(ctx, std_put_grad(g, ctx->rank, k, STD[k].dtype, ctx->rank % 2, &data[j]));
    }
    /* unselected: the rank's own expert (dtype and shape depend on the rank), a parameter
     * selected by nobody, and an id the model does not even have */
    RANK_CHECK_OK(ctx, tg_put(g, 200 + (seldp_param_id)ctx->rank,
                              ((const seldp_dtype[]){SELDP_F32, SELDP_BF16, SELDP_U8,
                                                     SELDP_I32})[ctx->rank % 4],
                              false, 9, 2, SHAPE(ctx->rank + 1, 3), NULL));
    RANK_CHECK_OK(
        ctx, tg_put(g, 400 + (seldp_param_id)ctx->rank, SELDP_F32, true, 10, 1, SHAPE(4), NULL));
    RANK_CHECK_OK(ctx, tg_put(g, 12345, SELDP_F16, false, 11, 1, SHAPE(3), NULL));
    return 0;
}

/* Check the reduced trainable gradients against the FP64 mean over `include`d ranks. */
static int check_mean(tr_rank_ctx *ctx, test_grads *g, const bool *include, double w,
                      seldp_dtype force_dtype)
{
    double ref[64];
    char why[256];
    for (size_t j = 0; j < N_TRAINABLE; j++) {
        size_t k = TRAINABLE[j];
        const seldp_tensor *t = seldp_grads_get(g->grads, std_id(ctx->rank, k));
        seldp_dtype in = STD[k].dtype;
        RANK_CHECK(ctx, t != NULL, "'%s' has no reduced gradient", STD[k].path);
        std_reference(k, in, ctx->size, include, w, ref);
        RANK_CHECK(ctx, t->dtype == (force_dtype == SELDP_DTYPE_COUNT ? in : force_dtype),
                   "'%s' result dtype %s", STD[k].path, seldp_dtype_name(t->dtype));
        RANK_CHECK(ctx, close_to(t->dtype, t->data, ref, std_numel(k), 2e-6, why, sizeof why),
                   "'%s': %s", STD[k].path, why);
        RANK_CHECK(ctx, same_everywhere(ctx->world, t->data, seldp_tensor_nbytes(t)),
                   "'%s' is not bit-identical on every rank", STD[k].path);
    }
    return 0;
}

/* --- the weighted mean ----------------------------------------------------- */

static int rank_uneven_weights(tr_rank_ctx *ctx)
{
    test_model m;
    test_grads g;
    grads_snapshot before;
    seldp_session *s = NULL;
    void *data[N_TRAINABLE];
    bool all[MAX_RANKS] = {true, true, true, true, true, true, true, true};
    uint64_t w = 0, expected = weight_sum(WEIGHTS, ctx->size);
    char why[256];

    RANK_CHECK_OK(ctx, std_session(ctx->world, &m, NULL, &s));
    if (put_std_grads(ctx, &g, data))
        return 1;
    gs_take(&before, g.grads);
    ct_snapshot(&m);
    RANK_CHECK_OK(ctx,
                  seldp_session_reduce(s, g.grads, WEIGHTS[ctx->rank], SELDP_MISSING_ERROR, &w));
    /* a reduction touches gradients only: no parameter update, no broadcast */
    RANK_CHECK(ctx, ct_unchanged(&m, why, sizeof why), "reduce wrote a parameter: %s", why);
    RANK_CHECK(ctx, w == expected, "global weight %llu, expected %llu", (unsigned long long)w,
               (unsigned long long)expected);
    if (check_mean(ctx, &g, all, (double)expected, SELDP_DTYPE_COUNT))
        return 1;
    /* in place: same storage, same ownership */
    for (size_t j = 0; j < N_TRAINABLE; j++) {
        seldp_param_id id = std_id(ctx->rank, TRAINABLE[j]);
        RANK_CHECK(ctx, seldp_grads_get(g.grads, id)->data == data[j],
                   "'%s' was not reduced in place", STD[TRAINABLE[j]].path);
        RANK_CHECK(ctx,
                   seldp_grads_ownership(g.grads, id) ==
                       (ctx->rank % 2 ? SELDP_OWNED : SELDP_BORROWED),
                   "'%s' changed ownership", STD[TRAINABLE[j]].path);
    }
    /* unselected: same handle, dtype, values and ownership */
    RANK_CHECK(ctx, seldp_grads_count(g.grads) == N_TRAINABLE + 3, "%zu gradients",
               seldp_grads_count(g.grads));
    RANK_CHECK(ctx, gs_entry_same(&before, g.grads, 200 + (seldp_param_id)ctx->rank),
               "unselected expert gradient changed");
    RANK_CHECK(ctx, gs_entry_same(&before, g.grads, 400 + (seldp_param_id)ctx->rank),
               "unselected owned gradient changed");
    RANK_CHECK(ctx, gs_entry_same(&before, g.grads, 12345), "gradient of an unknown id changed");
    gs_free(&before);
    tg_free(&g);
    seldp_session_destroy(s);
    ct_free(&m);
    return 0;
}

static void mean_with_uneven_weights(void **state)
{
    (void)state;
    for (int n = 1; n <= 4; n++)
        tr_run_ranks(n, TEST_TIMEOUT_S, rank_uneven_weights, NULL);
}

/* A case small enough to compute by hand: gradients {1, 10}, {2, 20}, {3, 30} with weights
 * 1, 2, 5 give {6, 60} / 8 = {0.75, 7.5}. */
static int rank_hand_computed(tr_rank_ctx *ctx)
{
    static const uint64_t w[3] = {1, 2, 5};
    test_model m;
    seldp_grads *g = NULL;
    seldp_session *s = NULL;
    seldp_param_id id = 7 + (seldp_param_id)ctx->rank;
    float grad[2] = {(float)(ctx->rank + 1), 10.0f * (float)(ctx->rank + 1)};
    seldp_tensor t = seldp_tensor_view(SELDP_F32, SELDP_HOST_DEVICE, grad, 1, SHAPE(2));
    uint64_t total = 0;

    RANK_CHECK_OK(ctx, ct_init(&m, ctx->rank));
    RANK_CHECK_OK(ctx, ct_add(&m, "p", id, SELDP_F32, false, 1, 1, SHAPE(2)));
    RANK_CHECK_OK(ctx, seldp_session_initialize(ctx->world, m.model, 0, &id, 1, NULL, &s));
    RANK_CHECK_OK(ctx, seldp_grads_create(&g));
    RANK_CHECK_OK(ctx, seldp_grads_put(g, id, &t, SELDP_BORROWED));
    RANK_CHECK_OK(ctx, seldp_session_reduce(s, g, w[ctx->rank], SELDP_MISSING_ERROR, &total));
    RANK_CHECK(ctx, total == 8, "global weight %llu", (unsigned long long)total);
    RANK_CHECK(ctx, grad[0] == 0.75f && grad[1] == 7.5f, "got {%g, %g}, expected {0.75, 7.5}",
               grad[0], grad[1]);
    seldp_grads_destroy(g);
    seldp_session_destroy(s);
    ct_free(&m);
    return 0;
}

static void mean_equals_hand_computed_value(void **state)
{
    (void)state;
    tr_run_ranks(3, TEST_TIMEOUT_S, rank_hand_computed, NULL);
}

/* --- inactive ranks and zero weight --------------------------------------- */

static int rank_inactive(tr_rank_ctx *ctx)
{
    static const uint64_t w[MAX_RANKS] = {2, 0, 3, 0};
    test_model m;
    test_grads g;
    seldp_session *s = NULL;
    void *data[N_TRAINABLE];
    bool active[MAX_RANKS] = {true, false, true, false};
    uint64_t total = 0;

    RANK_CHECK_OK(ctx, std_session(ctx->world, &m, NULL, &s));
    if (put_std_grads(ctx, &g, data))
        return 1;
    if (w[ctx->rank] == 0) /* an inactive rank's gradients must not leak into the result */
        for (size_t j = 0; j < N_TRAINABLE; j++)
            for (size_t i = 0; i < std_numel(TRAINABLE[j]); i++)
                ct_set(STD[TRAINABLE[j]].dtype, data[j], i, NAN);
    RANK_CHECK_OK(ctx, seldp_session_reduce(s, g.grads, w[ctx->rank], SELDP_MISSING_ERROR, &total));
    RANK_CHECK(ctx, total == weight_sum(w, ctx->size), "global weight %llu",
               (unsigned long long)total);
    if (check_mean(ctx, &g, active, (double)total, SELDP_DTYPE_COUNT))
        return 1;
    tg_free(&g);
    seldp_session_destroy(s);
    ct_free(&m);
    return 0;
}

static void inactive_ranks_contribute_nothing(void **state)
{
    (void)state;
    for (int n = 1; n <= 4; n++)
        tr_run_ranks(n, TEST_TIMEOUT_S, rank_inactive, NULL);
}

static int rank_zero_weight(tr_rank_ctx *ctx)
{
    test_model m;
    test_grads g;
    grads_snapshot before;
    seldp_session *s = NULL;
    void *data[N_TRAINABLE];
    uint64_t total = 77;
    seldp_comm_stats s0, s1;

    RANK_CHECK_OK(ctx, std_session(ctx->world, &m, NULL, &s));
    if (put_std_grads(ctx, &g, data))
        return 1;
    gs_take(&before, g.grads);
    s0 = seldp_comm_get_stats(ctx->world);
    RANK_CHECK_OK(ctx, seldp_session_reduce(s, g.grads, 0, SELDP_MISSING_ERROR, &total));
    s1 = seldp_comm_get_stats(ctx->world);
    RANK_CHECK(ctx, total == 0, "global weight %llu", (unsigned long long)total);
    RANK_CHECK(ctx, stats_moves(s1) == stats_moves(s0), "a zero global weight still allreduced");
    for (size_t j = 0; j < N_TRAINABLE; j++)
        RANK_CHECK(ctx, seldp_grads_get(g.grads, std_id(ctx->rank, TRAINABLE[j])) == NULL,
                   "'%s' still has a gradient", STD[TRAINABLE[j]].path);
    RANK_CHECK(ctx, seldp_grads_count(g.grads) == 3,
               "%zu gradients left, expected the 3 unselected", seldp_grads_count(g.grads));
    RANK_CHECK(ctx, gs_entry_same(&before, g.grads, 12345), "unselected gradient changed");
    /* borrowed bytes are left alone (the owned ones were freed: ASan would object) */
    for (size_t i = 0; i < before.n; i++)
        if (before.own[i] == SELDP_BORROWED)
            RANK_CHECK(
                ctx,
                memcmp(before.bytes[i], before.t[i].data, seldp_tensor_nbytes(&before.t[i])) == 0,
                "borrowed bytes of id %llu were written", (unsigned long long)before.id[i]);
    gs_free(&before);
    tg_free(&g);
    seldp_session_destroy(s);
    ct_free(&m);
    return 0;
}

static void zero_global_weight_returns_no_selected_gradient(void **state)
{
    (void)state;
    for (int n = 1; n <= 4; n++)
        tr_run_ranks(n, TEST_TIMEOUT_S, rank_zero_weight, NULL);
}

/* --- FP32 results ---------------------------------------------------------- */

static int rank_fp32(tr_rank_ctx *ctx)
{
    test_model m;
    test_grads g;
    seldp_session *s = NULL;
    void *data[N_TRAINABLE];
    bool all[MAX_RANKS] = {true, true, true, true};
    double ref[64];
    char why[256];
    uint64_t total = 0;
    const seldp_tensor *t;

    RANK_CHECK_OK(ctx, std_session(ctx->world, &m, NULL, &s));
    RANK_CHECK_OK(ctx, tg_init(&g));
    /* embed and final_norm: F32 params, F32 inputs; norm: its BF16 dtype; router: F32 for
     * an F16 parameter, which only the FP32 variants accept */
    RANK_CHECK_OK(ctx, std_put_grad(&g, ctx->rank, 0, SELDP_F32, false, &data[0]));
    RANK_CHECK_OK(ctx, std_put_grad(&g, ctx->rank, 1, SELDP_F32, true, &data[1]));
    RANK_CHECK_OK(ctx, std_put_grad(&g, ctx->rank, 3, SELDP_BF16, ctx->rank % 2, &data[2]));
    RANK_CHECK_OK(ctx, std_put_grad(&g, ctx->rank, 4, SELDP_F32, false, &data[3]));
    RANK_CHECK_OK(ctx, seldp_session_reduce_fp32(s, g.grads, WEIGHTS[ctx->rank],
                                                 SELDP_MISSING_ERROR, &total));
    RANK_CHECK(ctx, total == weight_sum(WEIGHTS, ctx->size), "global weight %llu",
               (unsigned long long)total);
    for (size_t j = 0; j < N_TRAINABLE; j++) {
        size_t k = TRAINABLE[j];
        seldp_dtype in = k == 3 ? SELDP_BF16 : SELDP_F32;
        t = seldp_grads_get(g.grads, std_id(ctx->rank, k));
        RANK_CHECK(ctx, t && t->dtype == SELDP_F32, "'%s' is not an F32 result", STD[k].path);
        std_reference(k, in, ctx->size, all, (double)total, ref);
        /* an FP32 tolerance: a result rounded to a half would not meet it */
        RANK_CHECK(ctx, close_to(SELDP_F32, t->data, ref, std_numel(k), 2e-6, why, sizeof why),
                   "'%s': %s", STD[k].path, why);
        RANK_CHECK(ctx, same_everywhere(ctx->world, t->data, seldp_tensor_nbytes(t)),
                   "'%s' is not bit-identical on every rank", STD[k].path);
        if (in == SELDP_F32)
            RANK_CHECK(ctx, t->data == data[j], "'%s' F32 input not reduced in place", STD[k].path);
        else
            RANK_CHECK(ctx,
                       t->data != data[j] &&
                           seldp_grads_ownership(g.grads, std_id(ctx->rank, k)) == SELDP_OWNED,
                       "'%s' half input not replaced by an owned F32 entry", STD[k].path);
    }
    tg_free(&g);
    seldp_session_destroy(s);
    ct_free(&m);
    return 0;
}

static void reduce_fp32_keeps_fp32_results(void **state)
{
    (void)state;
    for (int n = 1; n <= 4; n++)
        tr_run_ranks(n, TEST_TIMEOUT_S, rank_fp32, NULL);
}

/* --- collectives ----------------------------------------------------------- */

typedef struct stats_arg {
    size_t bucket_bytes;
    uint64_t allreduces; /* expected per call */
} stats_arg;

static int rank_stats(tr_rank_ctx *ctx)
{
    const stats_arg *a = ctx->arg;
    seldp_session_config cfg = SELDP_SESSION_CONFIG_INIT;
    test_model m;
    test_grads g;
    seldp_session *s = NULL;
    void *data[N_TRAINABLE];
    bool all[MAX_RANKS] = {true, true, true, true};
    seldp_comm_stats s0, s1;
    uint64_t total;

    cfg.bucket_bytes = a->bucket_bytes;
    RANK_CHECK_OK(ctx, std_session(ctx->world, &m, &cfg, &s));
    bool fused = seldp_session_reduce_path(s) == SELDP_REDUCE_PATH_FUSED;
    for (int call = 0; call < 3; call++) {
        if (put_std_grads(ctx, &g, data))
            return 1;
        s0 = seldp_comm_get_stats(ctx->world);
        RANK_CHECK_OK(
            ctx, seldp_session_reduce(s, g.grads, WEIGHTS[ctx->rank], SELDP_MISSING_ERROR, &total));
        s1 = seldp_comm_get_stats(ctx->world);
        RANK_CHECK(ctx, s1.allgathers - s0.allgathers == 1, "%llu agreement collectives",
                   (unsigned long long)(s1.allgathers - s0.allgathers));
        /* the fused path stands for the same buckets in one counted reduction */
        uint64_t allreduces = fused ? 0 : a->allreduces, reductions = fused ? 1 : 0;
        RANK_CHECK(ctx,
                   s1.allreduces - s0.allreduces == allreduces &&
                       s1.reductions - s0.reductions == reductions,
                   "bucket %zu: %llu allreduces and %llu fused reductions, expected %llu and %llu",
                   a->bucket_bytes, (unsigned long long)(s1.allreduces - s0.allreduces),
                   (unsigned long long)(s1.reductions - s0.reductions),
                   (unsigned long long)allreduces, (unsigned long long)reductions);
        RANK_CHECK(ctx, s1.broadcasts == s0.broadcasts && s1.barriers == s0.barriers,
                   "reduce made broadcasts or barriers");
        /* the tied embedding is reduced once: not doubled */
        if (check_mean(ctx, &g, all, (double)total, SELDP_DTYPE_COUNT))
            return 1;
        tg_free(&g);
    }
    seldp_session_destroy(s);
    ct_free(&m);
    return 0;
}

static void one_agreement_then_bucketed_allreduces(void **state)
{
    (void)state;
    /* 48 elements reduced (embed 32 once though tied, final_norm 4, norm 4, router 8):
     * 192 bytes of F32 */
    static const stats_arg cases[] = {{(size_t)25 << 20, 1}, {192, 1}, {64, 3}, {100, 2}, {4, 48}};
    for (int n = 1; n <= 4; n++)
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
            tr_run_ranks(n, TEST_TIMEOUT_S, rank_stats, (void *)&cases[i]);
}

/* --- collective failures --------------------------------------------------- */

typedef struct fail_arg {
    /* 0: weight overflow; 1: non-finite checked; 2: non-finite half checked; 3: rank 0 has a
     * non-finite value at a later path than the last rank; 4: every rank from 1 on has one
     * at the same path */
    int mode;
    outcome o;
} fail_arg;

static int rank_failure(tr_rank_ctx *ctx)
{
    fail_arg *a = ctx->arg;
    seldp_session_config cfg = SELDP_SESSION_CONFIG_INIT;
    test_model m;
    test_grads g;
    grads_snapshot before;
    seldp_session *s = NULL;
    void *data[N_TRAINABLE];
    uint64_t weight = WEIGHTS[ctx->rank], total = 0;
    seldp_comm_stats s0, s1;
    seldp_status st;

    cfg.check_finite = a->mode != 0;
    RANK_CHECK_OK(ctx, std_session(ctx->world, &m, &cfg, &s));
    if (put_std_grads(ctx, &g, data))
        return 1;
    if (a->mode == 0)
        weight = UINT64_MAX / 2 + 1;
    if (a->mode == 1 && ctx->rank == ctx->size - 1)
        ((float *)data[1])[2] = INFINITY; /* final_norm.weight */
    if (a->mode == 2 && ctx->rank == ctx->size - 1)
        ct_set(SELDP_BF16, data[2], 1, NAN); /* layers.0.norm.weight */
    if (a->mode == 3 && ctx->rank == 0)
        ct_set(SELDP_F16, data[3], 5, INFINITY); /* layers.0.router.weight */
    if (a->mode == 3 && ctx->rank == ctx->size - 1)
        ((float *)data[1])[3] = NAN; /* final_norm.weight, earlier in path order */
    if (a->mode == 4 && ctx->rank >= 1)
        ((float *)data[0])[ctx->rank] = -INFINITY; /* embed.weight */
    gs_take(&before, g.grads);
    s0 = seldp_comm_get_stats(ctx->world);
    st = seldp_session_reduce(s, g.grads, weight, SELDP_MISSING_ERROR, &total);
    s1 = seldp_comm_get_stats(ctx->world);
    outcome_record(&a->o, ctx->rank, st);
    a->o.unchanged[ctx->rank] = gs_same(&before, g.grads, a->o.why[ctx->rank], sizeof a->o.why[0]);
    RANK_CHECK(ctx, stats_moves(s1) == stats_moves(s0), "data moved before the failure was known");
    RANK_CHECK(ctx, total == 0, "global weight written on failure");
    gs_free(&before);
    tg_free(&g);
    seldp_session_destroy(s);
    ct_free(&m);
    return 0;
}

static void weight_sum_overflow(void **state)
{
    (void)state;
    for (int n = 2; n <= 4; n++) {
        fail_arg a;
        memset(&a, 0, sizeof a);
        tr_run_ranks(n, TEST_TIMEOUT_S, rank_failure, &a);
        expect_same_failure(&a.o, n, SELDP_ERR_OVERFLOW, "overflows 64 bits", "group rank 1");
    }
}

static void nonfinite_gradient_detected_when_asked(void **state)
{
    (void)state;
    for (int n = 1; n <= 4; n++) {
        fail_arg a;
        char needle[32];
        snprintf(needle, sizeof needle, "group rank %d", n - 1);
        memset(&a, 0, sizeof a);
        a.mode = 1;
        tr_run_ranks(n, TEST_TIMEOUT_S, rank_failure, &a);
        expect_same_failure(&a.o, n, SELDP_ERR_NONFINITE, "'final_norm.weight'", needle);
        memset(&a, 0, sizeof a);
        a.mode = 2;
        tr_run_ranks(n, TEST_TIMEOUT_S, rank_failure, &a);
        expect_same_failure(&a.o, n, SELDP_ERR_NONFINITE, "'layers.0.norm.weight'", needle);
    }
}

/* The error names the first non-finite gradient in path order, then the lowest rank: not
 * the lowest rank's first, nor the first rank to notice. */
static void nonfinite_named_in_path_then_rank_order(void **state)
{
    (void)state;
    for (int n = 2; n <= 4; n++) {
        fail_arg a;
        char needle[64];
        memset(&a, 0, sizeof a);
        a.mode = 3;
        tr_run_ranks(n, TEST_TIMEOUT_S, rank_failure, &a);
        snprintf(needle, sizeof needle, "group rank %d (world rank %d) is not finite at element 3",
                 n - 1, n - 1);
        expect_same_failure(&a.o, n, SELDP_ERR_NONFINITE, "'final_norm.weight'", needle);
        memset(&a, 0, sizeof a);
        a.mode = 4;
        tr_run_ranks(n, TEST_TIMEOUT_S, rank_failure, &a);
        expect_same_failure(&a.o, n, SELDP_ERR_NONFINITE, "'embed.weight'",
                            "group rank 1 (world rank 1) is not finite at element 1 of 32");
    }
}

/* Unchecked, a non-finite value is reduced like any other: every replica gets it. */
static int rank_nonfinite_unchecked(tr_rank_ctx *ctx)
{
    test_model m;
    test_grads g;
    seldp_session *s = NULL;
    void *data[N_TRAINABLE];

    RANK_CHECK_OK(ctx, std_session(ctx->world, &m, NULL, &s));
    if (put_std_grads(ctx, &g, data))
        return 1;
    if (ctx->rank == 0)
        ((float *)data[1])[2] = INFINITY;
    RANK_CHECK_OK(ctx, seldp_session_reduce(s, g.grads, 1, SELDP_MISSING_ERROR, NULL));
    RANK_CHECK(ctx, isinf(((float *)data[1])[2]), "the infinity did not reach every replica");
    tg_free(&g);
    seldp_session_destroy(s);
    ct_free(&m);
    return 0;
}

static void nonfinite_gradient_reduced_when_not_asked(void **state)
{
    (void)state;
    for (int n = 1; n <= 3; n++)
        tr_run_ranks(n, TEST_TIMEOUT_S, rank_nonfinite_unchecked, NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(mean_with_uneven_weights),
        cmocka_unit_test(mean_equals_hand_computed_value),
        cmocka_unit_test(inactive_ranks_contribute_nothing),
        cmocka_unit_test(zero_global_weight_returns_no_selected_gradient),
        cmocka_unit_test(reduce_fp32_keeps_fp32_results),
        cmocka_unit_test(one_agreement_then_bucketed_allreduces),
        cmocka_unit_test(weight_sum_overflow),
        cmocka_unit_test(nonfinite_gradient_detected_when_asked),
        cmocka_unit_test(nonfinite_named_in_path_then_rank_order),
        cmocka_unit_test(nonfinite_gradient_reduced_when_not_asked),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
