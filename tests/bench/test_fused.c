/* The host transport's fast paths, bit for bit: the fused session reduction (F32, BF16 and
 * F16 tensors of every length around the vector width, at unaligned addresses, with NaN,
 * infinities, subnormals, signed zeros and rounding ties, summed and scaled by 1/W for a W
 * that is not a power of two) against a scalar reference computed here; large allreduces,
 * broadcasts and allgathers (the non-temporal stores) at unaligned addresses; and a group
 * larger than the register kernel takes (the chunked path). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "ranks.h"
#include "seldp/seldp.h"

#define TIMEOUT_S 120.0
#define MAX_RANKS 80

/* ---- values ------------------------------------------------------------------------ */

/* Rank r's element i of tensor t as F32 bits: mostly ordinary values, and now and then a
 * special one, chosen so that sums meet NaN, Inf - Inf, overflow, subnormals and ties. */
static float value_of(int t, int r, size_t i)
{
    uint64_t h = tr_hash((uint64_t)t * 131 + (uint64_t)r, i);
    uint32_t bits;
    switch (h % 23) {
    case 0:
        bits = 0x7fc00000u | (uint32_t)(h >> 40 & 0x3fffff); /* quiet NaN with payload */
        break;
    case 1:
        bits = 0x7f800001u | (uint32_t)(h >> 41 & 0x3fffff); /* signalling NaN */
        break;
    case 2:
        bits = r % 2 ? 0xff800000u : 0x7f800000u; /* -Inf and +Inf */
        break;
    case 3:
        bits = (uint32_t)(h >> 32 & 0x007fffff); /* subnormal */
        break;
    case 4:
        bits = 0x80000000u; /* -0 */
        break;
    case 5:
        bits = 0x7f7fffffu; /* FLT_MAX: sums overflow */
        break;
    case 6:
        /* a BF16 tie when alone: low half exactly 0x8000 */
        bits = (uint32_t)(h >> 32 & 0x3fff0000u) | 0x3f808000u;
        break;
    default: {
        float f = (float)((double)(int64_t)(h >> 11) / 9007199254740992.0 * 64.0 - 32.0);
        memcpy(&bits, &f, sizeof bits);
    }
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* The value as stored in `dtype` (what the rank's gradient holds). */
static void store_as(seldp_dtype dtype, void *base, size_t i, float v)
{
    if (dtype == SELDP_F32)
        ((float *)base)[i] = v;
    else if (dtype == SELDP_BF16)
        ((uint16_t *)base)[i] = seldp_f32_to_bf16(v);
    else
        ((uint16_t *)base)[i] = seldp_f32_to_f16(v);
}

static float load_from(seldp_dtype dtype, const void *base, size_t i)
{
    if (dtype == SELDP_F32)
        return ((const float *)base)[i];
    if (dtype == SELDP_BF16)
        return seldp_bf16_to_f32(((const uint16_t *)base)[i]);
    return seldp_f16_to_f32(((const uint16_t *)base)[i]);
}

/* ---- the fused reduction ------------------------------------------------------------- */

static const size_t LENGTHS[] = {1, 7, 15, 16, 17, 31, 32, 33, 63, 100, 1000, 4099};
#define N_LENGTHS (sizeof LENGTHS / sizeof LENGTHS[0])
static const seldp_dtype DTYPES[] = {SELDP_F32, SELDP_BF16, SELDP_F16};
#define N_TENSORS (N_LENGTHS * 3)
#define SLACK     16 /* elements before each tensor, so that starts fall anywhere */

typedef struct fused_arg {
    bool sum; /* seldp_session_sum instead of seldp_session_reduce */
    size_t bucket_bytes;
} fused_arg;

static seldp_dtype dtype_of(int t)
{
    return DTYPES[t % 3];
}

static size_t length_of(int t)
{
    return LENGTHS[t / 3];
}

static uint64_t weight_of(int rank)
{
    static const uint64_t weights[] = {3, 5, 7, 11, 13, 17, 19, 23};
    return weights[rank % 8];
}

/* What every rank must hold for element i of tensor t after the call, as the dtype's bits;
 * *nan says the result is a NaN (any payload: the order of NaN operands is not specified). */
static uint32_t expected_bits(int t, size_t i, int size, bool sum, bool *nan)
{
    seldp_dtype dtype = dtype_of(t);
    float acc = 0;
    uint64_t total = 0;
    for (int r = 0; r < size; r++) {
        /* what the rank actually contributed: its value rounded to the tensor's dtype */
        unsigned char held[4];
        store_as(dtype, held, 0, value_of(t, r, i));
        float x = load_from(dtype, held, 0);
        acc = r == 0 ? x : acc + x;
        total += weight_of(r);
    }
    if (!sum)
        acc = (float)((double)acc * (1.0 / (double)total));
    *nan = isnan(acc);
    uint32_t bits = 0;
    if (dtype == SELDP_F32)
        memcpy(&bits, &acc, sizeof acc);
    else
        bits = dtype == SELDP_BF16 ? seldp_f32_to_bf16(acc) : seldp_f32_to_f16(acc);
    return bits;
}

static int rank_fused(tr_rank_ctx *ctx)
{
    const fused_arg *a = ctx->arg;
    seldp_model *model = NULL;
    seldp_grads *grads = NULL;
    seldp_session *s = NULL;
    seldp_session_config cfg = SELDP_SESSION_CONFIG_INIT;
    void *params[N_TENSORS], *blocks[N_TENSORS], *data[N_TENSORS];
    seldp_param_id ids[N_TENSORS];
    uint64_t global = 0;

    cfg.bucket_bytes = a->bucket_bytes;
    RANK_CHECK_OK(ctx, seldp_model_create(ctx->rank, &model));
    RANK_CHECK_OK(ctx, seldp_grads_create(&grads));
    for (int t = 0; t < (int)N_TENSORS; t++) {
        seldp_dtype dtype = dtype_of(t);
        size_t n = length_of(t), esize = seldp_dtype_size(dtype);
        int64_t shape[1] = {(int64_t)n};
        char path[32];
        /* the gradient starts (t + rank) elements into its block: unaligned, and differently
         * on every rank */
        size_t skip = (size_t)(t + ctx->rank) % SLACK;
        params[t] = calloc(n, esize);
        blocks[t] = calloc(n + SLACK, esize);
        RANK_CHECK(ctx, params[t] && blocks[t], "out of memory");
        data[t] = (char *)blocks[t] + skip * esize;
        for (size_t i = 0; i < n; i++)
            store_as(dtype, data[t], i, value_of(t, ctx->rank, i));
        seldp_tensor p = seldp_tensor_view(dtype, SELDP_HOST_DEVICE, params[t], 1, shape);
        seldp_tensor g = seldp_tensor_view(dtype, SELDP_HOST_DEVICE, data[t], 1, shape);
        snprintf(path, sizeof path, "t%03d", t);
        ids[t] = (seldp_param_id)(1000 + t);
        RANK_CHECK_OK(ctx, seldp_model_add(model, path, ids[t], &p, false, NULL));
        RANK_CHECK_OK(ctx, seldp_grads_put(grads, ids[t], &g, SELDP_BORROWED));
    }
    RANK_CHECK_OK(ctx, seldp_session_initialize(ctx->world, model, 0, ids, N_TENSORS, &cfg, &s));
    if (a->sum)
        RANK_CHECK_OK(ctx, seldp_session_sum(s, grads, true, SELDP_MISSING_ERROR, &global));
    else
        RANK_CHECK_OK(ctx, seldp_session_reduce(s, grads, weight_of(ctx->rank), SELDP_MISSING_ERROR,
                                                &global));
    for (int t = 0; t < (int)N_TENSORS; t++) {
        const seldp_tensor *g = seldp_grads_get(grads, ids[t]);
        RANK_CHECK(ctx, g && g->data == data[t], "t%03d: not reduced in place", t);
        size_t esize = seldp_dtype_size(dtype_of(t));
        for (size_t i = 0; i < length_of(t); i++) {
            bool nan = false;
            uint32_t want = expected_bits(t, i, ctx->size, a->sum, &nan), got = 0;
            memcpy(&got, (const char *)data[t] + i * esize, esize);
            float as_float = load_from(dtype_of(t), data[t], i);
            RANK_CHECK(ctx, nan ? isnan(as_float) : got == want,
                       "t%03d (%s, %zu elements) element %zu: 0x%x, expected 0x%x%s", t,
                       seldp_dtype_name(dtype_of(t)), length_of(t), i, got, want,
                       nan ? " (a NaN)" : "");
        }
    }
    seldp_session_destroy(s);
    seldp_grads_destroy(grads);
    seldp_model_destroy(model);
    for (int t = 0; t < (int)N_TENSORS; t++) {
        free(params[t]);
        free(blocks[t]);
    }
    return 0;
}

static void fused_reduction_matches_the_scalar_reference(void **state)
{
    (void)state;
    static const fused_arg args[] = {
        {false, (size_t)25 << 20}, {true, (size_t)25 << 20}, {false, 256}, {false, 68}};
    for (size_t k = 0; k < sizeof args / sizeof args[0]; k++)
        for (int n = 1; n <= 4; n++)
            tr_run_ranks(n, TIMEOUT_S, rank_fused, (void *)&args[k]);
}

static void fused_reduction_in_a_group_beyond_the_register_kernel(void **state)
{
    (void)state;
    static const fused_arg arg = {false, (size_t)25 << 20};
    tr_run_ranks(66, TIMEOUT_S, rank_fused, (void *)&arg);
}

/* ---- large collectives: the non-temporal stores ------------------------------------ */

#define BIG ((size_t)3 << 20) /* floats per rank: 12 MiB, beyond the streaming threshold */

static int rank_big(tr_rank_ctx *ctx)
{
    int offset = 1 + ctx->rank; /* floats: unaligned, and differently on every rank */
    float *send = malloc((BIG + 8) * sizeof(float)), *recv = malloc((BIG + 8) * sizeof(float));
    float *gather = malloc(((size_t)ctx->size * (BIG / 4) + 8) * sizeof(float));
    RANK_CHECK(ctx, send && recv && gather, "out of memory");
    float *s = send + offset, *r = recv + offset, *g = gather + offset;

    /* out of place, then in place */
    tr_fill_f32_exact(s, BIG, (uint64_t)ctx->rank);
    RANK_CHECK_OK(ctx, seldp_comm_allreduce(ctx->world, s, r, BIG, SELDP_F32, SELDP_HOST_DEVICE));
    RANK_CHECK_OK(ctx, seldp_comm_allreduce(ctx->world, s, s, BIG, SELDP_F32, SELDP_HOST_DEVICE));
    float *expect = malloc(BIG * sizeof(float)), *tmp = malloc(BIG * sizeof(float));
    RANK_CHECK(ctx, expect && tmp, "out of memory");
    tr_fill_f32_exact(expect, BIG, 0);
    for (int q = 1; q < ctx->size; q++) {
        tr_fill_f32_exact(tmp, BIG, (uint64_t)q);
        for (size_t i = 0; i < BIG; i++)
            expect[i] += tmp[i];
    }
    size_t at = tr_first_diff(r, expect, BIG * sizeof(float));
    RANK_CHECK(ctx, at == BIG * sizeof(float), "allreduce differs at byte %zu", at);
    at = tr_first_diff(s, expect, BIG * sizeof(float));
    RANK_CHECK(ctx, at == BIG * sizeof(float), "in-place allreduce differs at byte %zu", at);

    /* broadcast from the last rank */
    int root = ctx->size - 1;
    tr_fill_f32(r, BIG, ctx->rank == root ? 77 : (uint64_t)ctx->rank + 1000);
    RANK_CHECK_OK(ctx,
                  seldp_comm_broadcast(ctx->world, r, BIG, SELDP_F32, root, SELDP_HOST_DEVICE));
    tr_fill_f32(expect, BIG, 77);
    at = tr_first_diff(r, expect, BIG * sizeof(float));
    RANK_CHECK(ctx, at == BIG * sizeof(float), "broadcast differs at byte %zu", at);

    /* allgather of a quarter each */
    tr_fill_f32(s, BIG / 4, (uint64_t)ctx->rank + 500);
    RANK_CHECK_OK(
        ctx, seldp_comm_allgather(ctx->world, s, g, BIG / 4 * sizeof(float), SELDP_HOST_DEVICE));
    for (int q = 0; q < ctx->size; q++) {
        tr_fill_f32(tmp, BIG / 4, (uint64_t)q + 500);
        at = tr_first_diff(g + (size_t)q * (BIG / 4), tmp, BIG / 4 * sizeof(float));
        RANK_CHECK(ctx, at == BIG / 4 * sizeof(float), "allgather block %d differs at byte %zu", q,
                   at);
    }
    free(expect);
    free(tmp);
    free(send);
    free(recv);
    free(gather);
    return 0;
}

static void large_collectives_at_unaligned_addresses(void **state)
{
    (void)state;
    for (int n = 1; n <= 3; n++)
        tr_run_ranks(n, TIMEOUT_S, rank_big, NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(fused_reduction_matches_the_scalar_reference),
        cmocka_unit_test(fused_reduction_in_a_group_beyond_the_register_kernel),
        cmocka_unit_test(large_collectives_at_unaligned_addresses),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
