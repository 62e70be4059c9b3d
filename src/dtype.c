/* Element types: sizes, names, classes, and exact F16/BF16 <-> F32 conversion.
 *
 * The conversions work on bit patterns only (no compiler half type), so they give
 * the same results on every host and match the CUDA kernels' round to nearest even.
 * An upcast is exact, a NaN's payload and signalling bit included; a downcast rounds to
 * nearest even, overflows to Inf and makes a NaN the quiet NaN of the same sign with the
 * top bits of its payload. The array conversions run on vectors where the CPU has them
 * (src/simd/half_simd.h: AVX2, else SSE2, for BF16; F16C for F16) with the same bits as the scalar
 * ones.
 */
#define _POSIX_C_SOURCE 200809L /* strcasecmp */

#include <string.h>
#include <strings.h>

#include "simd/half_simd.h"
#include "seldp/dtype.h"

static const struct {
    const char *name;
    size_t size;
} dtype_table[SELDP_DTYPE_COUNT] = {
    [SELDP_F32] = {"f32", 4},   [SELDP_F64] = {"f64", 8}, [SELDP_F16] = {"f16", 2},
    [SELDP_BF16] = {"bf16", 2}, [SELDP_I8] = {"i8", 1},   [SELDP_U8] = {"u8", 1},
    [SELDP_I16] = {"i16", 2},   [SELDP_U16] = {"u16", 2}, [SELDP_I32] = {"i32", 4},
    [SELDP_U32] = {"u32", 4},   [SELDP_I64] = {"i64", 8}, [SELDP_U64] = {"u64", 8},
    [SELDP_BOOL] = {"bool", 1},
};

bool seldp_dtype_valid(seldp_dtype dtype)
{
    /* Compare as unsigned so that a negative value cast into the enum is rejected too. */
    return (unsigned)dtype < (unsigned)SELDP_DTYPE_COUNT;
}

size_t seldp_dtype_size(seldp_dtype dtype)
{
    return seldp_dtype_valid(dtype) ? dtype_table[dtype].size : 0;
}

const char *seldp_dtype_name(seldp_dtype dtype)
{
    return seldp_dtype_valid(dtype) ? dtype_table[dtype].name : "invalid";
}

bool seldp_dtype_parse(const char *name, seldp_dtype *out)
{
    if (!name || !out)
        return false;
    for (int d = 0; d < SELDP_DTYPE_COUNT; d++) {
        if (strcasecmp(name, dtype_table[d].name) == 0) {
            *out = (seldp_dtype)d;
            return true;
        }
    }
    return false;
}

bool seldp_dtype_is_float(seldp_dtype dtype)
{
    return dtype == SELDP_F32 || dtype == SELDP_F64 || dtype == SELDP_F16 || dtype == SELDP_BF16;
}

bool seldp_dtype_is_int(seldp_dtype dtype)
{
    return seldp_dtype_valid(dtype) && !seldp_dtype_is_float(dtype);
}

bool seldp_dtype_is_half(seldp_dtype dtype)
{
    return dtype == SELDP_F16 || dtype == SELDP_BF16;
}

static uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float f32_from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

float seldp_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;

    if (exp == 0x1f) /* Inf, or NaN with its payload moved to the top of the F32 mantissa */
        return f32_from_bits(sign | 0x7f800000u | (mant << 13));
    if (exp == 0) {
        if (mant == 0)
            return f32_from_bits(sign);
        /* Subnormal: normalize; every F16 subnormal is an F32 normal. */
        int e = -1;
        do {
            e++;
            mant <<= 1;
        } while ((mant & 0x400u) == 0);
        mant &= 0x3ffu;
        return f32_from_bits(sign | ((uint32_t)(127 - 15 - e) << 23) | (mant << 13));
    }
    return f32_from_bits(sign | ((exp + 127 - 15) << 23) | (mant << 13));
}

uint16_t seldp_f32_to_f16(float value)
{
    uint32_t x = f32_bits(value);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t exp = (x >> 23) & 0xffu;
    uint32_t mant = x & 0x7fffffu;

    if (exp == 0xff) {
        if (mant == 0)
            return sign | 0x7c00u;
        /* Keep the payload's top bits and force the quiet bit, so a NaN never becomes Inf. */
        return sign | 0x7e00u | (uint16_t)(mant >> 13);
    }
    int e = (int)exp - 127 + 15;
    if (e >= 0x1f)
        return sign | 0x7c00u;
    if (e <= 0) {
        /* Subnormal result (or zero): shift the implicit-one mantissa right and round. */
        if (e < -10)
            return sign; /* below half the smallest subnormal: rounds to zero */
        uint32_t m = mant | 0x800000u;
        unsigned shift = (unsigned)(14 - e);
        uint32_t half = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1);
        uint32_t mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (half & 1u)))
            half++;
        return sign | (uint16_t)half;
    }
    uint32_t h = ((uint32_t)e << 10) | (mant >> 13);
    uint32_t rem = mant & 0x1fffu;
    /* A carry out of the mantissa correctly bumps the exponent, up to Inf. */
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u)))
        h++;
    return sign | (uint16_t)h;
}

float seldp_bf16_to_f32(uint16_t bits)
{
    return f32_from_bits((uint32_t)bits << 16);
}

uint16_t seldp_f32_to_bf16(float value)
{
    uint32_t x = f32_bits(value);
    if ((x & 0x7f800000u) == 0x7f800000u && (x & 0x7fffffu) != 0)
        return (uint16_t)((x >> 16) | 0x0040u); /* quiet NaN, payload top bits kept */
    uint32_t rounding = 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)((x + rounding) >> 16);
}

#if SELDP_HALF_SIMD
/* The vector part of each array conversion: the elements done, a multiple of 8 (the rest
 * goes through the scalar functions). */
static size_t bf16_to_f32_sse2(const uint16_t *src, float *dst, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m128i h = _mm_loadu_si128((const __m128i *)(src + i));
        _mm_storeu_ps(dst + i, seldp__bf16x4_lo_to_f32(h));
        _mm_storeu_ps(dst + i + 4, seldp__bf16x4_hi_to_f32(h));
    }
    return i;
}

static size_t f32_to_bf16_sse2(const float *src, uint16_t *dst, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m128i lo = seldp__f32x4_to_bf16(_mm_loadu_ps(src + i));
        __m128i hi = seldp__f32x4_to_bf16(_mm_loadu_ps(src + i + 4));
        _mm_storeu_si128((__m128i *)(dst + i), _mm_packs_epi32(lo, hi));
    }
    return i;
}

SELDP_TARGET_F16C static size_t bf16_to_f32_avx2(const uint16_t *src, float *dst, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i,
                         seldp__bf16x8_to_f32(_mm_loadu_si128((const __m128i *)(src + i))));
    return i;
}

SELDP_TARGET_F16C static size_t f32_to_bf16_avx2(const float *src, uint16_t *dst, size_t n)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256i lo = seldp__f32x8_to_bf16(_mm256_loadu_ps(src + i));
        __m256i hi = seldp__f32x8_to_bf16(_mm256_loadu_ps(src + i + 8));
        /* packus works within 128-bit lanes: put the four quarters back in order */
        _mm256_storeu_si256((__m256i *)(dst + i),
                            _mm256_permute4x64_epi64(_mm256_packus_epi32(lo, hi), 0xd8));
    }
    return i;
}

SELDP_TARGET_F16C static size_t f16_to_f32_f16c(const uint16_t *src, float *dst, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, seldp__f16x8_to_f32(_mm_loadu_si128((const __m128i *)(src + i))));
    return i;
}

SELDP_TARGET_F16C static size_t f32_to_f16_f16c(const float *src, uint16_t *dst, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(dst + i), seldp__f32x8_to_f16(_mm256_loadu_ps(src + i)));
    return i;
}
#endif

void seldp_half_to_f32(seldp_dtype half, const uint16_t *src, float *dst, size_t n)
{
    size_t i = 0;
    if (half == SELDP_BF16) {
#if SELDP_HALF_SIMD
        i = seldp__cpu_has_f16c() ? bf16_to_f32_avx2(src, dst, n) : bf16_to_f32_sse2(src, dst, n);
#endif
        for (; i < n; i++)
            dst[i] = seldp_bf16_to_f32(src[i]);
    } else {
#if SELDP_HALF_SIMD
        if (seldp__cpu_has_f16c())
            i = f16_to_f32_f16c(src, dst, n);
#endif
        for (; i < n; i++)
            dst[i] = seldp_f16_to_f32(src[i]);
    }
}

void seldp_f32_to_half(seldp_dtype half, const float *src, uint16_t *dst, size_t n)
{
    size_t i = 0;
    if (half == SELDP_BF16) {
#if SELDP_HALF_SIMD
        i = seldp__cpu_has_f16c() ? f32_to_bf16_avx2(src, dst, n) : f32_to_bf16_sse2(src, dst, n);
#endif
        for (; i < n; i++)
            dst[i] = seldp_f32_to_bf16(src[i]);
    } else {
#if SELDP_HALF_SIMD
        if (seldp__cpu_has_f16c())
            i = f32_to_f16_f16c(src, dst, n);
#endif
        for (; i < n; i++)
            dst[i] = seldp_f32_to_f16(src[i]);
    }
}
