/* host kernels (src/kernels.h): dtype conversion, F32 scaling, finiteness checks. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kernels.h"
#include "ranks.h"
#include "seldp/seldp.h"

#define N 1000

static void test_convert(void **state)
{
    (void)state;
    seldp_device host = SELDP_HOST_DEVICE;
    float src[N], back[N];
    uint16_t half[N];
    tr_fill_f32(src, N, 1);
    src[0] = 1e30f; /* overflows F16 only */
    src[1] = NAN;
    src[2] = ldexpf(1.0f, -25);
    const seldp_dtype halves[] = {SELDP_F16, SELDP_BF16};
    for (int h = 0; h < 2; h++) {
        assert_int_equal(seldp__convert(host, half, halves[h], src, SELDP_F32, N), SELDP_OK);
        for (int i = 0; i < N; i++) {
            uint16_t want =
                halves[h] == SELDP_F16 ? seldp_f32_to_f16(src[i]) : seldp_f32_to_bf16(src[i]);
            if (half[i] != want)
                fail_msg("%s element %d: 0x%04x, expected 0x%04x", seldp_dtype_name(halves[h]), i,
                         half[i], want);
        }
        assert_int_equal(seldp__convert(host, back, SELDP_F32, half, halves[h], N), SELDP_OK);
        for (int i = 0; i < N; i++) {
            float want =
                halves[h] == SELDP_F16 ? seldp_f16_to_f32(half[i]) : seldp_bf16_to_f32(half[i]);
            assert_memory_equal(&back[i], &want, sizeof want);
        }
    }
    /* Identical dtypes copy the bytes, whatever they are. */
    uint64_t a[N], b[N];
    tr_fill_bytes(a, sizeof a, 2);
    assert_int_equal(seldp__convert(host, b, SELDP_U64, a, SELDP_U64, N), SELDP_OK);
    assert_memory_equal(a, b, sizeof a);
    /* Everything else is refused, and n == 0 writes nothing. */
    assert_int_equal(seldp__convert(host, b, SELDP_F64, a, SELDP_F32, N), SELDP_ERR_DTYPE);
    assert_int_equal(seldp__convert(host, b, SELDP_F16, a, SELDP_BF16, N), SELDP_ERR_DTYPE);
    assert_int_equal(seldp__convert(host, b, SELDP_I32, a, SELDP_F32, N), SELDP_ERR_DTYPE);
    assert_int_equal(seldp__convert(host, b, (seldp_dtype)50, a, SELDP_F32, N), SELDP_ERR_DTYPE);
    assert_int_equal(seldp__convert(host, NULL, SELDP_F32, NULL, SELDP_F16, 0), SELDP_OK);
}

static void test_scale(void **state)
{
    (void)state;
    float x[N], orig[N];
    tr_fill_f32(x, N, 3);
    memcpy(orig, x, sizeof x);
    const double factor = 1.0 / 3.0;
    assert_int_equal(seldp__scale_f32(SELDP_HOST_DEVICE, x, N, factor), SELDP_OK);
    for (int i = 0; i < N; i++) {
        float want = (float)((double)orig[i] * factor); /* one rounding, from double */
        assert_memory_equal(&x[i], &want, sizeof want);
    }
    assert_int_equal(seldp__scale_f32(SELDP_HOST_DEVICE, NULL, 0, 2.0), SELDP_OK);
}

static void test_find_nonfinite(void **state)
{
    (void)state;
    seldp_device host = SELDP_HOST_DEVICE;
    float f[N];
    double d[N];
    uint16_t h[N], bf[N];
    for (int i = 0; i < N; i++) {
        f[i] = (float)i;
        d[i] = -(double)i;
        h[i] = seldp_f32_to_f16((float)(i % 100));
        bf[i] = seldp_f32_to_bf16((float)i);
    }
    size_t first = 0;
    assert_int_equal(seldp__find_nonfinite(host, f, SELDP_F32, N, &first), SELDP_OK);
    assert_int_equal(first, N);
    assert_int_equal(seldp__find_nonfinite(host, h, SELDP_F16, N, &first), SELDP_OK);
    assert_int_equal(first, N);
    f[700] = INFINITY;
    f[900] = NAN;
    d[5] = -INFINITY;
    h[321] = 0x7e00;
    h[400] = 0xfc00;
    bf[999] = 0x7f81;
    assert_int_equal(seldp__find_nonfinite(host, f, SELDP_F32, N, &first), SELDP_OK);
    assert_int_equal(first, 700);
    assert_int_equal(seldp__find_nonfinite(host, f, SELDP_F32, 700, &first), SELDP_OK);
    assert_int_equal(first, 700); /* n: all finite */
    assert_int_equal(seldp__find_nonfinite(host, d, SELDP_F64, N, &first), SELDP_OK);
    assert_int_equal(first, 5);
    assert_int_equal(seldp__find_nonfinite(host, h, SELDP_F16, N, &first), SELDP_OK);
    assert_int_equal(first, 321);
    assert_int_equal(seldp__find_nonfinite(host, bf, SELDP_BF16, N, &first), SELDP_OK);
    assert_int_equal(first, 999);
    /* The largest finite values are finite. */
    uint16_t edge[2] = {0x7bff, 0xfbff}, bedge[2] = {0x7f7f, 0xff7f};
    assert_int_equal(seldp__find_nonfinite(host, edge, SELDP_F16, 2, &first), SELDP_OK);
    assert_int_equal(first, 2);
    assert_int_equal(seldp__find_nonfinite(host, bedge, SELDP_BF16, 2, &first), SELDP_OK);
    assert_int_equal(first, 2);
    assert_int_equal(seldp__find_nonfinite(host, f, SELDP_I32, N, &first), SELDP_ERR_DTYPE);
}

static void test_cuda_pointers_without_cuda(void **state)
{
    (void)state;
    if (seldp_has_feature("cuda"))
        skip();
    seldp_device gpu = {SELDP_DEVICE_CUDA, 0};
    float x[4] = {0};
    assert_int_equal(seldp__scale_f32(gpu, x, 4, 2.0), SELDP_ERR_UNSUPPORTED);
    assert_int_equal(seldp__convert(gpu, x, SELDP_F32, x, SELDP_F32, 4), SELDP_ERR_UNSUPPORTED);
}

static uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* seldp__convert and seldp__convert_batch (the bucketed and MPI paths' conversions) give
 * the element conversions' bits for every half pattern and for F32 patterns with NaN
 * payloads, ties and F16 overflow, at lengths and offsets off the vector width. */
static void test_convert_matches_elements(void **state)
{
    (void)state;
    enum { M = 65536 + 13 };
    seldp_device host = SELDP_HOST_DEVICE;
    uint16_t *h = malloc(M * sizeof *h), *h2 = malloc(M * sizeof *h2);
    float *f = malloc(M * sizeof *f), *g = malloc(M * sizeof *g);
    assert_true(h && h2 && f && g);
    for (uint32_t i = 0; i < M; i++) {
        h[i] = (uint16_t)i;
        uint32_t b = (i * 2654435761u) ^ (i << 7);
        if (i % 3 == 0)
            b = (b & ~0x1fffu) | 0x1000u; /* an F16 tie */
        if (i % 7 == 0)
            b = (b & 0x807fffffu) | 0x7f800000u; /* Inf or NaN with a payload */
        memcpy(&f[i], &b, sizeof b);
    }
    const seldp_dtype halves[] = {SELDP_F16, SELDP_BF16};
    for (int t = 0; t < 2; t++) {
        seldp_dtype d = halves[t];
        size_t off = 3, n = M - off;
        seldp__convert_seg segs[2] = {
            {g + off, h + off, SELDP_F32, d, n},
            {h2 + 1, f + 1, d, SELDP_F32, n - 5},
        };
        assert_int_equal(seldp__convert_batch(host, segs, 2), SELDP_OK);
        for (size_t i = 0; i < n; i++) {
            float want =
                d == SELDP_F16 ? seldp_f16_to_f32(h[off + i]) : seldp_bf16_to_f32(h[off + i]);
            if (f32_bits(g[off + i]) != f32_bits(want))
                fail_msg("%s 0x%04x -> 0x%08x, element 0x%08x", seldp_dtype_name(d), h[off + i],
                         f32_bits(g[off + i]), f32_bits(want));
        }
        for (size_t i = 1; i < n - 4; i++) {
            uint16_t want = d == SELDP_F16 ? seldp_f32_to_f16(f[i]) : seldp_f32_to_bf16(f[i]);
            if (h2[i] != want)
                fail_msg("F32 0x%08x -> %s 0x%04x, element 0x%04x", f32_bits(f[i]),
                         seldp_dtype_name(d), h2[i], want);
        }
        assert_int_equal(seldp__convert(host, h2, d, f, SELDP_F32, 21), SELDP_OK);
        for (size_t i = 0; i < 21; i++)
            assert_int_equal(h2[i],
                             d == SELDP_F16 ? seldp_f32_to_f16(f[i]) : seldp_f32_to_bf16(f[i]));
    }
    free(h);
    free(h2);
    free(f);
    free(g);
}

/* A queue of more segments than one batch converts every one of them: a full batch as it
 * fills, the rest at the flush, and nothing before. */
static void test_convert_queue(void **state)
{
    (void)state;
    enum { SEGS = 2 * SELDP_CONVERT_BATCH_MAX + 7, W = 3 };
    float *src = malloc(SEGS * W * sizeof *src), *dst = calloc(SEGS * W, sizeof *dst);
    assert_non_null(src);
    assert_non_null(dst);
    tr_fill_f32(src, SEGS * W, 11);
    seldp__convert_queue q = {.device = SELDP_HOST_DEVICE};
    for (size_t i = 0; i < SEGS; i++) {
        assert_int_equal(seldp__convert_queue_add(&q, (seldp__convert_seg){.dst = dst + i * W,
                                                                           .src = src + i * W,
                                                                           .dst_dtype = SELDP_F32,
                                                                           .src_dtype = SELDP_F32,
                                                                           .n = W}),
                         SELDP_OK);
        /* converted by whole batches: what is still queued is untouched */
        assert_int_equal(q.n, (i + 1) % SELDP_CONVERT_BATCH_MAX);
        if (q.n != 0)
            assert_true(dst[i * W] == 0.0f);
    }
    assert_memory_equal(dst, src, 2 * SELDP_CONVERT_BATCH_MAX * W * sizeof *src);
    assert_int_equal(seldp__convert_queue_flush(&q), SELDP_OK);
    assert_int_equal(q.n, 0);
    assert_memory_equal(dst, src, SEGS * W * sizeof *src);
    assert_int_equal(seldp__convert_queue_flush(&q), SELDP_OK); /* empty: nothing to do */
    free(src);
    free(dst);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_convert),        cmocka_unit_test(test_convert_matches_elements),
        cmocka_unit_test(test_convert_queue),  cmocka_unit_test(test_scale),
        cmocka_unit_test(test_find_nonfinite), cmocka_unit_test(test_cuda_pointers_without_cuda),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
