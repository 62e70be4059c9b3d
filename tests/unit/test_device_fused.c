/* The fused scale and cast that ends a reduction on a GPU (seldp__scale_convert_bits of
 * src/cuda/half/seldp_half_bits.cuh, run by the CUDA kernel and by the NCCL transport's host
 * path), compiled for the host and compared bit for bit with what the session's bucketed
 * path computes in two passes: seldp__scale_f32 (skipped when the scale is 1, as the
 * reduction's contract says) followed by seldp__convert into F32, BF16 and F16. Values:
 * random patterns over the whole F32 range, NaNs with payloads, infinities, signed zeros,
 * subnormals, and the F32 values whose scaled result lies on or next to a BF16 or F16
 * rounding midpoint; scales: 1/W for W not a power of two, exact powers of two, and scales
 * that overflow or go subnormal. NaNs are decided on their bits before any arithmetic: with
 * the product replaced by a model of a GPU's (which returns the canonical NaN 0x7fffffff for a
 * NaN operand), every NaN still comes back with its sign and payload, quiet, as the host's
 * seldp__scale_f32 and the host transport's sums give it. Needs no GPU. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

/* The product as a GPU computes it where NaNs are concerned: whatever the operand's payload,
 * the canonical NaN. Every test below runs the helper with it, so the comparisons with the
 * host's two passes (x86 arithmetic) are GPU against host; seldp__scale_f32_bits never
 * reaches it with a NaN, which the count proves. */
static unsigned long gpu_nan_products;
static float gpu_model_mul(float f, double scale)
{
    double p = (double)f * scale;
    if (p != p) {
        gpu_nan_products++;
        uint32_t canonical = 0x7fffffffu;
        float out;
        memcpy(&out, &canonical, sizeof out);
        return out;
    }
    return (float)p;
}
#define SELDP_HALF_BITS_MUL(f, scale) gpu_model_mul((f), (scale))

#include "simd/host_sum.h"
#include "kernels.h"
#include "ranks.h"
#include "seldp/seldp.h"
#include "seldp_half_bits.cuh"

static uint32_t bits_of(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float float_of(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static const double scales[] = {1.0, 1.0 / 2037.0, 1.0 / 3.0, 0.5,      0.25,      2.0,
                                3.0, 1e30,         1e-30,     0x1p-140, 1.0 / 7.0, 1.0 / 65536.0};

/* The two-pass reference over n values, into F32, BF16 and F16 at once. */
static void reference(const uint32_t *x, size_t n, double scale, uint32_t *f32, uint16_t *bf16,
                      uint16_t *f16)
{
    float *tmp = malloc(n * sizeof *tmp);
    assert_non_null(tmp);
    memcpy(tmp, x, n * sizeof *tmp);
    if (scale != 1.0)
        assert_int_equal(seldp__scale_f32(SELDP_HOST_DEVICE, tmp, n, scale), SELDP_OK);
    memcpy(f32, tmp, n * sizeof *f32);
    assert_int_equal(seldp__convert(SELDP_HOST_DEVICE, bf16, SELDP_BF16, tmp, SELDP_F32, n),
                     SELDP_OK);
    assert_int_equal(seldp__convert(SELDP_HOST_DEVICE, f16, SELDP_F16, tmp, SELDP_F32, n),
                     SELDP_OK);
    free(tmp);
}

/* Every value of x at every scale, against the reference; returns the values checked. */
static size_t check_values(const uint32_t *x, size_t n)
{
    uint32_t *f32 = malloc(n * sizeof *f32);
    uint16_t *bf16 = malloc(n * sizeof *bf16), *f16 = malloc(n * sizeof *f16);
    assert_non_null(f32);
    assert_non_null(bf16);
    assert_non_null(f16);
    for (size_t k = 0; k < sizeof scales / sizeof scales[0]; k++) {
        double s = scales[k];
        reference(x, n, s, f32, bf16, f16);
        for (size_t i = 0; i < n; i++) {
            uint32_t got = seldp__scale_convert_bits(x[i], s, SELDP_SCALE_TO_F32);
            uint32_t got_bf = seldp__scale_convert_bits(x[i], s, SELDP_SCALE_TO_BF16);
            uint32_t got_h = seldp__scale_convert_bits(x[i], s, SELDP_SCALE_TO_F16);
            if (got != f32[i])
                fail_msg("0x%08x * %a -> F32 0x%08x, two passes give 0x%08x", x[i], s, got, f32[i]);
            if (got_bf != bf16[i])
                fail_msg("0x%08x * %a -> BF16 0x%04x, two passes give 0x%04x", x[i], s, got_bf,
                         bf16[i]);
            if (got_h != f16[i])
                fail_msg("0x%08x * %a -> F16 0x%04x, two passes give 0x%04x", x[i], s, got_h,
                         f16[i]);
        }
    }
    free(f32);
    free(bf16);
    free(f16);
    return n;
}

static void test_random_patterns(void **state)
{
    (void)state;
    enum { N = 200000 };
    uint32_t *x = malloc(N * sizeof *x);
    assert_non_null(x);
    for (size_t i = 0; i < N; i++)
        x[i] = (uint32_t)tr_hash(7, i);
    assert_int_equal(check_values(x, N), N);
    free(x);
}

static void test_special_values(void **state)
{
    (void)state;
    const uint32_t x[] = {
        0x00000000u, 0x80000000u,                           /* signed zeros */
        0x7f800000u, 0xff800000u,                           /* infinities */
        0x7fc00000u, 0xffc00001u, 0x7fc12345u, 0x7f800001u, /* NaNs, quiet and signalling */
        0xff812345u, 0x00000001u, 0x807fffffu, 0x00400000u, /* subnormals */
        0x00800000u, 0x7f7fffffu, 0xff7fffffu, 0x3f800000u, /* normal extremes, 1 */
        0x477fe000u, 0x477ff000u, 0x477fefffu,              /* F16's largest, its overflow edge */
        0x387fc000u, 0x33800000u, 0x33000000u,              /* F16 subnormal range, ties */
    };
    size_t n = sizeof x / sizeof x[0];
    assert_int_equal(check_values(x, n), n);
}

/* F32 values whose result lands on, or one ulp beside, a rounding midpoint of BF16 and of
 * F16 for each scale: the midpoint divided by the scale, and its neighbours. */
static void test_rounding_midpoints(void **state)
{
    (void)state;
    enum { PER = 12, MIDS = 4000 };
    uint32_t *x = malloc((size_t)MIDS * PER * sizeof *x);
    assert_non_null(x);
    size_t n = 0;
    for (size_t m = 0; m < MIDS; m++) {
        uint64_t h = tr_hash(11, m);
        /* a BF16 midpoint: lower 16 bits 0x8000; an F16 one: 13 dropped bits 0x1000 */
        uint32_t bf_mid =
            ((uint32_t)h & 0x7fff0000u) | 0x8000u | ((uint32_t)(h >> 32) & 0x80000000u);
        float f16_val = (float)((int)(h >> 40 & 0x7ff) + 2048) * 0x1p-11f *
                        ldexpf(1.0f, (int)(h >> 52 & 31) - 15);
        uint32_t f16_mid = (bits_of(f16_val) & ~0x1fffu) | 0x1000u;
        for (int which = 0; which < 2; which++) {
            uint32_t mid = which ? f16_mid : bf_mid;
            double s = scales[m % (sizeof scales / sizeof scales[0])];
            uint32_t pre = bits_of((float)((double)float_of(mid) / s));
            for (int d = -2; d <= 3 && n < (size_t)MIDS * PER; d++)
                x[n++] = pre + (uint32_t)d;
        }
    }
    assert_int_equal(check_values(x, n), n);
    free(x);
}

/* NaNs of every kind (quiet and signalling, both signs, payloads at the top, the bottom and
 * spread over the mantissa): the helper, with the GPU's product, returns x | quiet bit into
 * F32 and the top of that into BF16 and F16, at every scale; so do the host's seldp__scale_f32
 * and the host transport's sums (one NaN contributor among zeros), whose product is x86's. */
static void test_nan_bits_decided_before_arithmetic(void **state)
{
    (void)state;
    enum { N = 4096 };
    uint32_t x[N];
    for (size_t i = 0; i < N; i++) {
        uint32_t payload = (uint32_t)tr_hash(23, i) & 0x3fffffu;
        if (i % 4 == 0)
            payload = 1u << (i / 4 % 22); /* a single payload bit */
        uint32_t nan = 0x7f800000u | payload | (i % 3 ? 0x400000u : 0u);
        if ((nan & 0x7fffffu) == 0)
            nan |= 1u; /* all-zero mantissa is Inf, not a NaN */
        x[i] = nan | (i % 2 ? 0x80000000u : 0u);
    }
    gpu_nan_products = 0;
    for (size_t k = 0; k < sizeof scales / sizeof scales[0]; k++) {
        double s = scales[k];
        float host[N];
        memcpy(host, x, sizeof host);
        if (s != 1.0)
            assert_int_equal(seldp__scale_f32(SELDP_HOST_DEVICE, host, N, s), SELDP_OK);
        for (size_t i = 0; i < N; i++) {
            assert_true(seldp__f32_bits_is_nan(x[i]));
            uint32_t want = s != 1.0 ? x[i] | 0x400000u : x[i];
            uint16_t want_bf = (uint16_t)((want >> 16) | 0x40u);
            uint16_t want_h =
                (uint16_t)(((want >> 16) & 0x8000u) | 0x7e00u | ((want >> 13) & 0x3ffu));
            uint32_t got = seldp__scale_convert_bits(x[i], s, SELDP_SCALE_TO_F32);
            if (got != want)
                fail_msg("NaN 0x%08x * %a -> F32 0x%08x, expected 0x%08x (sign and payload kept, "
                         "quiet)",
                         x[i], s, got, want);
            assert_int_equal(seldp__scale_convert_bits(x[i], s, SELDP_SCALE_TO_BF16), want_bf);
            assert_int_equal(seldp__scale_convert_bits(x[i], s, SELDP_SCALE_TO_F16), want_h);
            if (bits_of(host[i]) != want)
                fail_msg("seldp__scale_f32 on the host: NaN 0x%08x * %a -> 0x%08x, the helper "
                         "gives 0x%08x",
                         x[i], s, bits_of(host[i]), want);
        }
    }
    assert_int_equal(gpu_nan_products, 0);

    /* the host transport's fused sums: a NaN among zeros keeps its bits through the scale */
    static const seldp__simd_width widths[] = {SIMD_128, SIMD_256, SIMD_512};
    float zeros[N] = {0}, out[N];
    const void *in[3] = {zeros, x, NULL};
    const seldp_dtype in_dtype[3] = {SELDP_F32, SELDP_F32, SELDP_F32};
    void *outs[1] = {out};
    for (size_t w = 0; w < 3 && widths[w] <= seldp__host_simd_of_cpu(); w++) {
        seldp__sum_mode m = {true, 1.0 / 2037.0, false, widths[w]};
        seldp__host_sum(3, in, in_dtype, 1, outs, SELDP_F32, N, &m);
        for (size_t i = 0; i < N; i++)
            if (bits_of(out[i]) != (x[i] | 0x400000u))
                fail_msg("host sum (simd %d) of NaN 0x%08x scaled: 0x%08x, expected 0x%08x",
                         128 << widths[w], x[i], bits_of(out[i]), x[i] | 0x400000u);
        seldp__host_sum_scalar(3, in, in_dtype, 1, outs, SELDP_F32, N, &m);
        for (size_t i = 0; i < N; i++)
            assert_int_equal(bits_of(out[i]), x[i] | 0x400000u);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_nan_bits_decided_before_arithmetic),
        cmocka_unit_test(test_special_values),
        cmocka_unit_test(test_rounding_midpoints),
        cmocka_unit_test(test_random_patterns),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
