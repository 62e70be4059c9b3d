/* Contract of the all-gather of a sharded session (seldp/shard.h), and of the round trip of a
 * distributed optimizer: reduce-scatter the gradients, update the rank's range of FP32
 * master weights, all-gather the ranges into the parameters. After every step the
 * parameters are bit-identical on every rank and to the all-reduce path's (every rank
 * updating the whole FP32 master copy from seldp_session_reduce_fp32's results), on every
 * world of 1 to 8 ranks; frozen parameters, buffers and unselected parameters are untouched.
 * Ranges in the parameter dtype convert as documented. Registered on both host reduce paths,
 * with cfg.staged_commit and with small buckets. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "shard_fixture.h"

#define STEPS 3
#define LR    0.125f

/* The layout's trainable parameters, in path order (the map's order). */
static const size_t TRAINABLE[] = {0, 1, 2, 4, 5, 6};
#define N_TRAINABLE 6

static size_t index_of(const char *path)
{
    for (size_t k = 0; k < SF_N; k++)
        if (strcmp(SF[k].path, path) == 0)
            return k;
    return SF_N;
}

/* The replicated optimizer of the all-reduce path: the whole master copy, updated from the
 * all-reduce's FP32 results, rounded into the parameters. */
static int replicated_step(tr_rank_ctx *ctx, test_model *m, float **master, seldp_grads *g)
{
    for (size_t j = 0; j < N_TRAINABLE; j++) {
        size_t k = TRAINABLE[j], n = sf_numel(k);
        ct_param *p = ct_find(m, SF[k].path);
        const seldp_tensor *t = seldp_grads_get(g, sf_id(ctx->rank, k));
        RANK_CHECK(ctx, p && t && t->dtype == SELDP_F32, "'%s' has no F32 result", SF[k].path);
        for (size_t i = 0; i < n; i++) {
            master[j][i] -= LR * ((const float *)t->data)[i];
            ct_set(SF[k].dtype, p->tensor.data, i, master[j][i]);
        }
    }
    return 0;
}

static int rank_round_trip(tr_rank_ctx *ctx)
{
    seldp_session_config cfg = sf_config();
    test_model m1, m2;
    seldp_session *s1 = NULL, *s2 = NULL;
    seldp_shard_map *map = NULL;
    float *master_full[N_TRAINABLE];
    size_t begin, count;
    char why[256];

    RANK_CHECK_OK(ctx, sf_session(ctx->world, &m1, SF_N, &cfg, &s1)); /* sharded */
    RANK_CHECK_OK(ctx, sf_session(ctx->world, &m2, SF_N, &cfg, &s2)); /* replicated */
    RANK_CHECK_OK(ctx, seldp_shard_map_create(s1, &map));
    RANK_CHECK_OK(ctx, seldp_shard_map_range(map, ctx->rank, &begin, &count));
    size_t n_pieces = seldp_shard_map_pieces(map, ctx->rank);
    float *grad = malloc((count + 1) * sizeof *grad),
          *master = malloc((count + 1) * sizeof *master);
    bool *present = calloc(n_pieces + 1, sizeof *present);
    RANK_CHECK(ctx, grad && master && present, "out of memory");
    /* the FP32 master copies: the parameters as initialize left them, exactly upcast */
    for (size_t j = 0; j < N_TRAINABLE; j++) {
        size_t k = TRAINABLE[j], n = sf_numel(k);
        ct_param *p = ct_find(&m2, SF[k].path);
        master_full[j] = malloc((n + 1) * sizeof(float));
        RANK_CHECK(ctx, p && master_full[j], "out of memory");
        for (size_t i = 0; i < n; i++)
            master_full[j][i] = (float)ct_get(SF[k].dtype, p->tensor.data, i);
    }
    for (size_t i = 0; i < n_pieces; i++) {
        seldp_shard_piece p;
        RANK_CHECK_OK(ctx, seldp_shard_map_piece(map, ctx->rank, i, &p));
        ct_param *q = ct_find(&m1, p.path);
        for (size_t e = 0; e < p.count; e++)
            master[p.range_offset + e] = (float)ct_get(p.dtype, q->tensor.data, p.param_offset + e);
    }
    ct_snapshot(&m1);

    for (uint64_t step = 1; step <= STEPS; step++) {
        test_grads g1, g2;
        uint64_t w = 10 + (uint64_t)ctx->rank * 3, w1 = 0, w2 = 0;
        RANK_CHECK_OK(ctx, tg_init(&g1));
        RANK_CHECK_OK(ctx, tg_init(&g2));
        RANK_CHECK_OK(ctx, sf_put_grads(&g1, ctx->rank, step, NULL, false));
        RANK_CHECK_OK(ctx, sf_put_grads(&g2, ctx->rank, step, NULL, false));

        RANK_CHECK_OK(ctx, seldp_shard_reduce_scatter(s1, map, g1.grads, w, SELDP_MISSING_ERROR,
                                                      grad, count, present, &w1));
        for (size_t i = 0; i < n_pieces; i++) {
            seldp_shard_piece p;
            RANK_CHECK_OK(ctx, seldp_shard_map_piece(map, ctx->rank, i, &p));
            RANK_CHECK(ctx, present[i], "'%s' is absent", p.path);
            for (size_t e = 0; e < p.count; e++)
                master[p.range_offset + e] -= LR * grad[p.range_offset + e];
        }
        RANK_CHECK_OK(ctx, seldp_shard_allgather_params(s1, map, master, SELDP_F32, count));

        RANK_CHECK_OK(ctx, seldp_session_reduce_fp32(s2, g2.grads, w, SELDP_MISSING_ERROR, &w2));
        if (replicated_step(ctx, &m2, master_full, g2.grads))
            return 1;
        RANK_CHECK(ctx, w1 == w2, "global weights %llu and %llu", (unsigned long long)w1,
                   (unsigned long long)w2);

        for (size_t j = 0; j < N_TRAINABLE; j++) {
            size_t k = TRAINABLE[j];
            ct_param *a = ct_find(&m1, SF[k].path), *b = ct_find(&m2, SF[k].path);
            size_t bytes = seldp_tensor_nbytes(&a->tensor);
            size_t at = tr_first_diff(a->tensor.data, b->tensor.data, bytes);
            RANK_CHECK(ctx, at == bytes,
                       "step %llu: '%s' differs from the all-reduce path at byte %zu of %zu",
                       (unsigned long long)step, SF[k].path, at, bytes);
            RANK_CHECK(ctx, same_everywhere(ctx->world, a->tensor.data, bytes),
                       "step %llu: '%s' differs between ranks", (unsigned long long)step,
                       SF[k].path);
        }
        tg_free(&g1);
        tg_free(&g2);
    }
    /* the tied alias is the same storage; the rest is untouched */
    RANK_CHECK(ctx, ct_find(&m1, "z.head")->tensor.data == ct_find(&m1, "b.weight")->tensor.data,
               "the tied alias lost its storage");
    for (size_t i = 0; i < m1.n; i++) {
        ct_param *p = &m1.p[i];
        size_t k = index_of(p->path);
        if (k < SF_N && SF[k].trainable)
            continue;
        if (strcmp(p->path, "z.head") == 0)
            continue;
        size_t bytes = seldp_tensor_nbytes(&p->tensor);
        RANK_CHECK(ctx, memcmp(p->snapshot, p->tensor.data, bytes) == 0,
                   "'%s' (frozen, a buffer or unselected) was written", p->path);
    }
    (void)why;
    for (size_t j = 0; j < N_TRAINABLE; j++)
        free(master_full[j]);
    free(grad);
    free(master);
    free(present);
    seldp_shard_map_destroy(map);
    seldp_session_destroy(s2);
    seldp_session_destroy(s1);
    ct_free(&m2);
    ct_free(&m1);
    return 0;
}

static void test_round_trip(void **state)
{
    (void)state;
    for (int n = 1; n <= MAX_RANKS; n++)
        tr_run_ranks(n, TEST_TIMEOUT_S, rank_round_trip, NULL);
}

/* Ranges in BF16 (the parameter dtype of b.weight) over a selection of BF16 and F32
 * parameters: every parameter receives its elements converted exactly. */
static int rank_bf16_ranges(tr_rank_ctx *ctx)
{
    seldp_session_config cfg = sf_config();
    static const size_t pick[] = {0, 1, 4, 6}; /* a.bias, b.weight, e.weight, h.expert */
    seldp_param_id ids[4];
    test_model m;
    seldp_session *s = NULL;
    seldp_shard_map *map = NULL;
    size_t begin, count;

    RANK_CHECK_OK(ctx, sf_model(&m, ctx->rank, 5000));
    for (int i = 0; i < 4; i++)
        ids[i] = sf_id(ctx->rank, pick[(i + ctx->rank) % 4]);
    RANK_CHECK_OK(ctx, seldp_session_initialize(ctx->world, m.model, 0, ids, 4, &cfg, &s));
    RANK_CHECK_OK(ctx, seldp_shard_map_create(s, &map));
    RANK_CHECK_OK(ctx, seldp_shard_map_range(map, ctx->rank, &begin, &count));
    uint16_t *range = malloc((count + 1) * sizeof *range);
    RANK_CHECK(ctx, range, "out of memory");
    for (size_t i = 0; i < count; i++) /* a value per index of the whole map */
        range[i] = seldp_f32_to_bf16((float)(begin + i) * 0.0625f - 40.0f);
    RANK_CHECK_OK(ctx, seldp_shard_allgather_params(s, map, range, SELDP_BF16, count));
    size_t at = 0;
    for (size_t j = 0; j < 4; j++) {
        size_t k = pick[j];
        ct_param *p = ct_find(&m, SF[k].path);
        for (size_t i = 0; i < sf_numel(k); i++) {
            float want = seldp_bf16_to_f32(seldp_f32_to_bf16((float)(at + i) * 0.0625f - 40.0f));
            float got = (float)ct_get(SF[k].dtype, p->tensor.data, i);
            RANK_CHECK(ctx, memcmp(&want, &got, sizeof got) == 0,
                       "'%s' element %zu: %.9g, expected %.9g", SF[k].path, i, (double)got,
                       (double)want);
        }
        RANK_CHECK(ctx,
                   same_everywhere(ctx->world, p->tensor.data, seldp_tensor_nbytes(&p->tensor)),
                   "'%s' differs between ranks", SF[k].path);
        at += sf_numel(k);
    }
    free(range);
    seldp_shard_map_destroy(map);
    seldp_session_destroy(s);
    ct_free(&m);
    return 0;
}

static void test_bf16_ranges(void **state)
{
    (void)state;
    for (int n = 1; n <= MAX_RANKS; n++)
        tr_run_ranks(n, TEST_TIMEOUT_S, rank_bf16_ranges, NULL);
}

/* A BF16 range cannot go into the F16 c.norm: every rank refuses, nothing is written. */
static int rank_half_mismatch(tr_rank_ctx *ctx)
{
    test_model m;
    seldp_session *s = NULL;
    seldp_shard_map *map = NULL;
    size_t count;
    char why[256];

    RANK_CHECK_OK(ctx, sf_session(ctx->world, &m, SF_N, NULL, &s));
    RANK_CHECK_OK(ctx, seldp_shard_map_create(s, &map));
    RANK_CHECK_OK(ctx, seldp_shard_map_range(map, ctx->rank, NULL, &count));
    uint16_t *range = calloc(count + 1, sizeof *range);
    RANK_CHECK(ctx, range, "out of memory");
    ct_snapshot(&m);
    seldp_status st = seldp_shard_allgather_params(s, map, range, SELDP_BF16, count);
    RANK_CHECK(ctx,
               st == SELDP_ERR_DTYPE && strstr(seldp_last_error(), "'c.norm' is f16") &&
                   strstr(seldp_last_error(), "seldp_shard_allgather_params"),
               "returned %s: %s", seldp_status_name(st), seldp_last_error());
    RANK_CHECK(ctx, ct_unchanged(&m, why, sizeof why), "the model changed: %s", why);
    st = seldp_shard_allgather_params(s, map, range, SELDP_I32, count);
    RANK_CHECK(ctx, st == SELDP_ERR_DTYPE, "an i32 range returned %s", seldp_status_name(st));
    free(range);
    seldp_shard_map_destroy(map);
    seldp_session_destroy(s);
    ct_free(&m);
    return 0;
}

static void test_half_mismatch(void **state)
{
    (void)state;
    for (int n = 1; n <= 3; n++)
        tr_run_ranks(n, TEST_TIMEOUT_S, rank_half_mismatch, NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_bf16_ranges),
        cmocka_unit_test(test_half_mismatch),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
