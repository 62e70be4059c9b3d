/* F16/BF16 <-> F32 conversion and F32 scaling on bit patterns, callable from host and device
 * code.
 *
 * The same rules as seldp_f16_to_f32 and friends in src/dtype.c (round to nearest even,
 * NaN payloads kept with the quiet bit forced, overflow to Inf), written once for both
 * sides so that the CUDA kernels agree with the host bit for bit and a host-only test can
 * check the very code the kernels run. CUDA's __float2half_rn is not used: it returns a
 * canonical NaN instead of keeping the payload; for the same reason a NaN is never
 * multiplied (seldp__scale_f32_bits). */
#ifndef SELDP_HALF_BITS_CUH
#define SELDP_HALF_BITS_CUH

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#if defined(__CUDACC__)
#define SELDP_HD __host__ __device__ __forceinline__
#else
#define SELDP_HD static inline
#endif

SELDP_HD uint32_t seldp__bits_of_f32(float f)
{
#if defined(__CUDA_ARCH__)
    return __float_as_uint(f);
#else
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
#endif
}

SELDP_HD float seldp__f32_of_bits(uint32_t u)
{
#if defined(__CUDA_ARCH__)
    return __uint_as_float(u);
#else
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
#endif
}

/* Leading zero bits of a non-zero 32-bit value. */
SELDP_HD int seldp__clz32(uint32_t x)
{
#if defined(__CUDA_ARCH__)
    return __clz((int)x);
#else
    return __builtin_clz(x);
#endif
}

SELDP_HD uint32_t seldp__f16_to_f32_bits(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;

    if (exp == 0x1fu) /* Inf, or NaN with its payload at the top of the F32 mantissa */
        return sign | 0x7f800000u | (mant << 13);
    if (exp == 0) {
        if (mant == 0)
            return sign;
        /* Subnormal: shift the leading one up to bit 10; each shift lowers the exponent. */
        int shift = seldp__clz32(mant) - 21;
        mant = (mant << shift) & 0x3ffu;
        return sign | ((uint32_t)(113 - shift) << 23) | (mant << 13);
    }
    return sign | ((exp + 127 - 15) << 23) | (mant << 13);
}

SELDP_HD uint16_t seldp__f32_bits_to_f16(uint32_t x)
{
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t exp = (x >> 23) & 0xffu;
    uint32_t mant = x & 0x7fffffu;

    if (exp == 0xffu) {
        if (mant == 0)
            return (uint16_t)(sign | 0x7c00u);
        return (uint16_t)(sign | 0x7e00u | (uint16_t)(mant >> 13));
    }
    int e = (int)exp - 127 + 15;
    if (e >= 0x1f)
        return (uint16_t)(sign | 0x7c00u);
    if (e <= 0) {
        if (e < -10)
            return sign;
        uint32_t m = mant | 0x800000u;
        unsigned shift = (unsigned)(14 - e);
        uint32_t half = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1);
        uint32_t mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (half & 1u)))
            half++;
        return (uint16_t)(sign | (uint16_t)half);
    }
    uint32_t h = ((uint32_t)e << 10) | (mant >> 13);
    uint32_t rem = mant & 0x1fffu;
    /* A carry out of the mantissa bumps the exponent, up to Inf, as it should. */
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u)))
        h++;
    return (uint16_t)(sign | (uint16_t)h);
}

SELDP_HD uint32_t seldp__bf16_to_f32_bits(uint16_t b)
{
    return (uint32_t)b << 16;
}

SELDP_HD uint16_t seldp__f32_bits_to_bf16(uint32_t x)
{
    if ((x & 0x7f800000u) == 0x7f800000u && (x & 0x7fffffu) != 0)
        return (uint16_t)((x >> 16) | 0x0040u);
    uint32_t rounding = 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)((x + rounding) >> 16);
}

/* Whether F32 bits are a NaN: exponent all ones, mantissa not zero. */
SELDP_HD bool seldp__f32_bits_is_nan(uint32_t x)
{
    return (x & 0x7fffffffu) > 0x7f800000u;
}

/* The product of seldp__scale_f32_bits for a number (never a NaN): the kernels' arithmetic on
 * the GPU, the host's elsewhere. A test may define SELDP_HALF_BITS_MUL before including this
 * header to model another machine's arithmetic (a GPU's NaN rules) on the host. */
#ifndef SELDP_HALF_BITS_MUL
#define SELDP_HALF_BITS_MUL(f, scale) ((float)((double)(f) * (scale)))
#endif

/* F32 bits times `scale`, rounded once to F32: (float)((double)x * scale), except that a NaN
 * is decided on its bits before any arithmetic and comes back with its sign and payload and
 * the quiet bit set. Arithmetic would not agree: a GPU returns the one canonical NaN
 * 0x7fffffff for a NaN operand whatever its payload, while x86 keeps the payload, so the
 * host and the kernels give the same bits only because neither multiplies a NaN. `scale` is
 * finite and not zero (1/W, or a clipping coefficient), so no NaN is made by the product.
 * Shared by seldp__scale_f32 on the host, its CUDA kernel and the fused scale and cast. */
SELDP_HD uint32_t seldp__scale_f32_bits(uint32_t x, double scale)
{
    if (seldp__f32_bits_is_nan(x))
        return x | 0x00400000u;
    return seldp__bits_of_f32(SELDP_HALF_BITS_MUL(seldp__f32_of_bits(x), scale));
}

/* The dtypes seldp__scale_convert_bits writes. */
#define SELDP_SCALE_TO_F32  0
#define SELDP_SCALE_TO_BF16 1
#define SELDP_SCALE_TO_F16  2

/* An F32 result of a reduction (its bits) scaled and cast in one step, with exactly the
 * rounding of seldp__scale_f32 followed by seldp__convert: seldp__scale_f32_bits unless scale
 * is 1 (the reduction's contract: no multiplication then), then rounded to nearest even into
 * F32 (the bits themselves), BF16 or F16 (`to`, SELDP_SCALE_TO_*); a NaN keeps its sign and
 * the top of its payload, quiet. The fused kernel of src/cuda/ and the NCCL transport's host
 * path both run this. */
SELDP_HD uint32_t seldp__scale_convert_bits(uint32_t x, double scale, int to)
{
    if (scale != 1.0)
        x = seldp__scale_f32_bits(x, scale);
    if (to == SELDP_SCALE_TO_BF16)
        return seldp__f32_bits_to_bf16(x);
    if (to == SELDP_SCALE_TO_F16)
        return seldp__f32_bits_to_f16(x);
    return x;
}

#endif
