/* The host transport's reduction kernels (src/simd/host_sum.h): every vector width this CPU
 * has against the scalar reference, bit for bit, over the dtypes, group sizes, lengths that
 * are not multiples of the vector width, unaligned pointers, in-place outputs, special
 * values (NaN payloads, Inf, subnormals, rounding ties, F16 overflow) and scales. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "simd/host_sum.h"
#include "seldp/dtype.h"

/* The dtypes the register kernel takes, each as input and as output. */
static const seldp_dtype dtypes[] = {SELDP_F32, SELDP_BF16, SELDP_F16};
#define N_DTYPES (sizeof dtypes / sizeof dtypes[0])

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint32_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}

static float f32_of(uint32_t bits)
{
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* A value that exercises the conversions: mostly ordinary numbers, and often a special one
 * (NaN with a payload, a signalling NaN, Inf, a subnormal, a tie of the F16 or BF16
 * rounding, a value at the F16 overflow edge, a zero of either sign). */
static float special_f32(void)
{
    switch (rnd() % 16) {
    case 0:
        return f32_of(0x7fc00000u | (rnd() & 0x3fffffu) | (rnd() & 0x80000000u)); /* qNaN */
    case 1:
        return f32_of(0x7f800001u | (rnd() & 0x3fffffu)); /* sNaN */
    case 2:
        return rnd() & 1 ? INFINITY : -INFINITY;
    case 3:
        return f32_of(rnd() & 0x807fffffu); /* F32 subnormal */
    case 4:
        /* F16 subnormal range and around it, some ties */
        return ldexpf((float)(rnd() % 4096) * 0.5f, -24 - (int)(rnd() % 4));
    case 5:
        /* a tie of the F16 rounding: bit 12 set, bits below clear */
        return f32_of(((rnd() % 30 + 113) << 23) | (rnd() & 0x7fe000u) | 0x1000u);
    case 6:
        /* a tie of the BF16 rounding */
        return f32_of(((rnd() % 60 + 100) << 23) | (rnd() & 0x807f0000u) | 0x8000u);
    case 7:
        return 65504.0f + (float)(rnd() % 64) * 0.5f - 16.0f; /* F16 overflow edge */
    case 8:
        return rnd() & 1 ? 0.0f : -0.0f;
    default:
        return ldexpf((float)((int)(rnd() % 2000000) - 1000000) / 1e6f, (int)(rnd() % 40) - 20);
    }
}

static unsigned bits_of(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return (unsigned)u;
}

/* Whether bits x of dtype are a NaN. */
static bool is_nan(seldp_dtype dtype, uint32_t x)
{
    if (dtype == SELDP_F32)
        return (x & 0x7f800000u) == 0x7f800000u && (x & 0x7fffffu);
    if (dtype == SELDP_BF16)
        return (x & 0x7f80u) == 0x7f80u && (x & 0x7fu);
    return (x & 0x7c00u) == 0x7c00u && (x & 0x3ffu);
}

static float load(const void *buf, seldp_dtype dtype, size_t i)
{
    if (dtype == SELDP_F32)
        return ((const float *)buf)[i];
    uint16_t h = ((const uint16_t *)buf)[i];
    return dtype == SELDP_BF16 ? seldp_bf16_to_f32(h) : seldp_f16_to_f32(h);
}

static void store(void *buf, seldp_dtype dtype, size_t i, float v)
{
    if (dtype == SELDP_F32)
        ((float *)buf)[i] = v;
    else if (dtype == SELDP_BF16)
        ((uint16_t *)buf)[i] = seldp_f32_to_bf16(v);
    else
        ((uint16_t *)buf)[i] = seldp_f32_to_f16(v);
}

/* One reduction of `size` ranks over n elements at element offset `shift`, with `outs`
 * outputs of which the first `in_place` are the inputs of the same rank (when their dtype
 * is the output's), run through the kernel of width simd and the scalar reference on two
 * copies of the same buffers; fails on the first element whose bits differ. */
static void check_case(seldp__simd_width simd, int size, const seldp_dtype *in_dtype, bool null0,
                       int outs, int in_place, seldp_dtype out_dtype, size_t n, size_t shift,
                       double scale, bool stream)
{
    size_t osize = seldp_dtype_size(out_dtype);
    size_t cap = ((n + shift + 64) * 4 + 63) / 64 * 64; /* aligned_alloc wants a multiple */
    unsigned char *a_in[HOST_SUM_MAX_RANKS], *b_in[HOST_SUM_MAX_RANKS];
    unsigned char *a_out[HOST_SUM_MAX_RANKS], *b_out[HOST_SUM_MAX_RANKS];
    const void *ia[HOST_SUM_MAX_RANKS], *ib[HOST_SUM_MAX_RANKS];
    void *oa[HOST_SUM_MAX_RANKS], *ob[HOST_SUM_MAX_RANKS];
    for (int r = 0; r < size; r++) {
        size_t isize = seldp_dtype_size(in_dtype[r]);
        a_in[r] = aligned_alloc(64, cap);
        b_in[r] = aligned_alloc(64, cap);
        assert_non_null(a_in[r]);
        assert_non_null(b_in[r]);
        for (size_t i = 0; i < n; i++)
            store(a_in[r] + shift * isize, in_dtype[r], i, special_f32());
        memcpy(b_in[r], a_in[r], cap);
        ia[r] = r == 0 && null0 ? NULL : a_in[r] + shift * isize;
        ib[r] = r == 0 && null0 ? NULL : b_in[r] + shift * isize;
    }
    for (int r = 0; r < outs; r++) {
        bool same = r < in_place && r < size && in_dtype[r] == out_dtype && ia[r];
        a_out[r] = same ? NULL : aligned_alloc(64, cap);
        b_out[r] = same ? NULL : aligned_alloc(64, cap);
        if (!same) {
            memset(a_out[r], 0xa5, cap);
            memset(b_out[r], 0xa5, cap);
        }
        /* each output at its own misalignment, in elements */
        size_t off = (shift + (size_t)r) % 17;
        oa[r] = same ? (void *)ia[r] : a_out[r] + off * osize;
        ob[r] = same ? (void *)ib[r] : b_out[r] + off * osize;
    }
    /* Where two NaNs meet (or Infs of both signs make one), which payload survives depends
     * on the operand order the compiler picks for a commutative add, in the scalar code and
     * in the intrinsics alike (x86 keeps the first operand's): any NaN is right there. */
    unsigned char *nans = calloc(n + 1, 1);
    assert_non_null(nans);
    for (int r = 0; r < size; r++)
        for (size_t i = 0; ia[r] && i < n; i++)
            nans[i] += isfinite(load(ia[r], in_dtype[r], i)) ? 0 : 1;
    seldp__sum_mode m = {scale != 1.0, scale, stream, simd};
    seldp__host_sum(size, ia, in_dtype, outs, oa, out_dtype, n, &m);
    seldp__host_sum_scalar(size, ib, in_dtype, outs, ob, out_dtype, n, &m);
    for (int r = 0; r < outs; r++) {
        for (size_t i = 0; i < n; i++) {
            if (memcmp((char *)oa[r] + i * osize, (char *)ob[r] + i * osize, osize) == 0)
                continue;
            uint32_t x = 0, y = 0;
            memcpy(&x, (char *)oa[r] + i * osize, osize);
            memcpy(&y, (char *)ob[r] + i * osize, osize);
            if (nans[i] > 1 && is_nan(out_dtype, x) && is_nan(out_dtype, y))
                continue;
            fail_msg("simd %d, %d ranks (rank 0 %s, in %s...), %s out %d of %d, n %zu, shift %zu, "
                     "scale %g: element %zu is 0x%x, scalar 0x%x",
                     128 << simd, size, null0 ? "zeros" : seldp_dtype_name(in_dtype[0]),
                     seldp_dtype_name(in_dtype[size - 1]), seldp_dtype_name(out_dtype), r, outs, n,
                     shift, scale, i, (unsigned)x, (unsigned)y);
        }
        /* nothing written past the end or before the start */
        if (a_out[r]) {
            size_t off = (shift + (size_t)r) % 17;
            assert_memory_equal(a_out[r], b_out[r], off * osize);
            assert_memory_equal(a_out[r] + (off + n) * osize, b_out[r] + (off + n) * osize,
                                cap - (off + n) * osize);
            assert_int_equal(a_out[r][(off + n) * osize], 0xa5);
        }
    }
    free(nans);
    for (int r = 0; r < size; r++) {
        free(a_in[r]);
        free(b_in[r]);
    }
    for (int r = 0; r < outs; r++) {
        free(a_out[r]);
        free(b_out[r]);
    }
}

static void test_every_width_matches_scalar(void **state)
{
    (void)state;
    static const size_t lengths[] = {0, 1, 3, 15, 16, 17, 31, 33, 47, 64, 100, 257, 1000};
    static const int sizes[] = {1, 2, 3, 4, 7, 8};
    static const double scales[] = {1.0, 0.5, 1.0 / 3.0, 0.125, 3.0, 1e-3};
    seldp__simd_width top = seldp__host_simd_of_cpu();
    for (int w = SIMD_128; w <= (int)top; w++) {
        for (size_t d = 0; d < N_DTYPES; d++) {
            for (size_t li = 0; li < sizeof lengths / sizeof lengths[0]; li++) {
                for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
                    int size = sizes[si];
                    seldp_dtype in_dtype[HOST_SUM_MAX_RANKS];
                    /* every rank the output dtype, or a mix of all three */
                    bool mixed = (li + si) % 2;
                    for (int r = 0; r < size; r++)
                        in_dtype[r] = mixed ? dtypes[rnd() % N_DTYPES] : dtypes[d];
                    double scale = scales[(li + si + d) % (sizeof scales / sizeof scales[0])];
                    size_t shift = (li * 3 + si) % 9;
                    bool null0 = size > 1 && (li + d) % 5 == 0;
                    check_case((seldp__simd_width)w, size, in_dtype, null0, size, (int)(li % 3),
                               dtypes[d], lengths[li], shift, scale, (li + d) % 2 == 0);
                    /* one output only, as the eager path does */
                    check_case((seldp__simd_width)w, size, in_dtype, false, 1, 0, dtypes[d],
                               lengths[li], shift + 1, scale, false);
                }
            }
        }
    }
}

/* Every F16 (or BF16) bit pattern through a group of one rank at scale 1: the kernel's
 * conversion in and out alone, against seldp_f16_to_f32 / seldp_f32_to_f16. */
static void test_every_half_pattern(void **state)
{
    (void)state;
    enum { N = 65536 };
    uint16_t *in = malloc(N * sizeof *in);
    uint16_t *h = malloc(N * sizeof *h), *h_ref = malloc(N * sizeof *h_ref);
    float *f = malloc(N * sizeof *f), *f_ref = malloc(N * sizeof *f_ref);
    assert_true(in && h && h_ref && f && f_ref);
    for (uint32_t i = 0; i < N; i++)
        in[i] = (uint16_t)i;
    seldp__simd_width top = seldp__host_simd_of_cpu();
    static const seldp_dtype halves[] = {SELDP_BF16, SELDP_F16};
    for (int w = SIMD_128; w <= (int)top; w++) {
        for (int k = 0; k < (int)(sizeof halves / sizeof halves[0]); k++) {
            seldp__sum_mode m = {false, 1.0, false, (seldp__simd_width)w};
            const void *src[1] = {in};
            seldp_dtype dt[1] = {halves[k]};
            void *to_f[1] = {f}, *to_f_ref[1] = {f_ref}, *to_h[1] = {h}, *to_h_ref[1] = {h_ref};
            seldp__host_sum(1, src, dt, 1, to_f, SELDP_F32, N, &m);
            seldp__host_sum_scalar(1, src, dt, 1, to_f_ref, SELDP_F32, N, &m);
            seldp__host_sum(1, src, dt, 1, to_h, halves[k], N, &m);
            seldp__host_sum_scalar(1, src, dt, 1, to_h_ref, halves[k], N, &m);
            for (uint32_t i = 0; i < N; i++) {
                float want =
                    halves[k] == SELDP_F16 ? seldp_f16_to_f32(in[i]) : seldp_bf16_to_f32(in[i]);
                if (memcmp(&f[i], &want, 4) || memcmp(&f_ref[i], &want, 4) || h[i] != h_ref[i])
                    fail_msg(
                        "simd %d, %s pattern 0x%04x: to F32 %08x (scalar %08x, expected %08x), "
                        "round trip 0x%04x (scalar 0x%04x)",
                        128 << w, seldp_dtype_name(halves[k]), (unsigned)i, bits_of(f[i]),
                        bits_of(f_ref[i]), bits_of(want), h[i], h_ref[i]);
            }
        }
    }
    free(in);
    free(h);
    free(h_ref);
    free(f);
    free(f_ref);
}

/* Many random F32 bit patterns rounded to each half through the kernel, against the scalar
 * conversion: every exponent, NaN payloads, ties. */
static void test_random_f32_to_half(void **state)
{
    (void)state;
    enum { N = 1 << 18 };
    uint32_t *bits = malloc(N * sizeof *bits);
    uint16_t *h = malloc(N * sizeof *h);
    assert_true(bits && h);
    for (size_t i = 0; i < N; i++) {
        bits[i] = rnd() ^ (rnd() << 16);
        if (i % 4 == 1) /* a tie or a near-tie of either half */
            bits[i] = (bits[i] & ~0x1fffu) | (i % 8 == 1 ? 0x1000u : 0x0fffu);
        if (i % 4 == 2)
            bits[i] = (bits[i] & ~0xffffu) | 0x8000u;
    }
    seldp__simd_width top = seldp__host_simd_of_cpu();
    static const seldp_dtype halves[] = {SELDP_BF16, SELDP_F16};
    for (int w = SIMD_128; w <= (int)top; w++) {
        for (int k = 0; k < (int)(sizeof halves / sizeof halves[0]); k++) {
            seldp__sum_mode m = {false, 1.0, false, (seldp__simd_width)w};
            const void *src[1] = {bits};
            seldp_dtype dt[1] = {SELDP_F32};
            void *to[1] = {h};
            seldp__host_sum(1, src, dt, 1, to, halves[k], N, &m);
            for (size_t i = 0; i < N; i++) {
                float v = f32_of(bits[i]);
                uint16_t want = halves[k] == SELDP_F16 ? seldp_f32_to_f16(v) : seldp_f32_to_bf16(v);
                if (h[i] != want)
                    fail_msg("simd %d: F32 0x%08x to %s is 0x%04x, scalar 0x%04x", 128 << w,
                             (unsigned)bits[i], seldp_dtype_name(halves[k]), h[i], want);
            }
        }
    }
    free(bits);
    free(h);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_width_matches_scalar),
        cmocka_unit_test(test_every_half_pattern),
        cmocka_unit_test(test_random_f32_to_half),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
