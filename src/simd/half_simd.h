/* F16 and BF16 <-> F32 conversions on x86 vectors, the bits of src/dtype.c's scalar ones.
 *
 * The contract (seldp/dtype.h): an upcast is exact, a NaN's payload and its signalling bit
 * included; a downcast rounds to nearest even, overflows to Inf, and turns a NaN into the
 * quiet NaN of the same sign with the top bits of its payload. F16C's VCVTPS2PH does the
 * downcast exactly so, given round to nearest even in its immediate; its VCVTPH2PS quiets
 * a signalling NaN, which the upcasts below undo. Like the rest of seldp's float code this
 * assumes the default MXCSR (no flush-to-zero, no denormals-are-zero). The
 * F16C and AVX-512 helpers carry their target, so that a file compiled for the baseline
 * calls them from functions of the same target after checking the CPU at run time
 * (seldp__cpu_has_f16c). Everything here is static inline: each user gets its own copy. */
#ifndef SELDP_HALF_SIMD_H
#define SELDP_HALF_SIMD_H

#include <stdbool.h>

#if defined(__x86_64__) && defined(__GNUC__)
#define SELDP_HALF_SIMD 1
#include <cpuid.h>
#include <immintrin.h>
#include <stdatomic.h>

#define SELDP_TARGET_F16C   __attribute__((target("avx2,f16c")))
#define SELDP_TARGET_AVX512 __attribute__((target("avx512f")))

/* Whether the CPU has AVX2 and F16C, which the 256-bit conversions need. F16C is read from
 * CPUID (clang's __builtin_cpu_supports does not know it) once per file: CPUID is slow,
 * and in a virtual machine it traps, while the array conversions ask at every call. */
static inline bool seldp__cpu_has_f16c(void)
{
    static atomic_int known = -1;
    int has = atomic_load_explicit(&known, memory_order_relaxed);
    if (has < 0) {
        unsigned eax, ebx, ecx, edx;
        has = __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C) &&
              __builtin_cpu_supports("avx2");
        atomic_store_explicit(&known, has, memory_order_relaxed);
    }
    return has;
}

/* BF16 -> F32 on four lanes of the low half of h (SSE2): the BF16 bits are the top half. */
static inline __m128 seldp__bf16x4_lo_to_f32(__m128i h)
{
    return _mm_castsi128_ps(_mm_unpacklo_epi16(_mm_setzero_si128(), h));
}

static inline __m128 seldp__bf16x4_hi_to_f32(__m128i h)
{
    return _mm_castsi128_ps(_mm_unpackhi_epi16(_mm_setzero_si128(), h));
}

/* F32 -> BF16 on four lanes (SSE2), as seldp_f32_to_bf16: round to nearest even, a NaN
 * stays a quiet NaN. The result is sign-extended to 32 bits so that _mm_packs_epi32 keeps
 * it exactly. */
static inline __m128i seldp__f32x4_to_bf16(__m128 x)
{
    __m128i b = _mm_castps_si128(x);
    __m128i lsb = _mm_and_si128(_mm_srli_epi32(b, 16), _mm_set1_epi32(1));
    __m128i rounded =
        _mm_srli_epi32(_mm_add_epi32(_mm_add_epi32(b, _mm_set1_epi32(0x7fff)), lsb), 16);
    __m128i nan =
        _mm_cmpgt_epi32(_mm_and_si128(b, _mm_set1_epi32(0x7fffffff)), _mm_set1_epi32(0x7f800000));
    __m128i quiet = _mm_or_si128(_mm_srli_epi32(b, 16), _mm_set1_epi32(0x40));
    __m128i r = _mm_or_si128(_mm_and_si128(nan, quiet), _mm_andnot_si128(nan, rounded));
    return _mm_srai_epi32(_mm_slli_epi32(r, 16), 16);
}

/* seldp__f32x4_to_bf16 on eight lanes (AVX2), the result zero-extended to 32 bits (for
 * _mm256_packus_epi32). */
SELDP_TARGET_F16C static inline __m256i seldp__f32x8_to_bf16(__m256 x)
{
    __m256i b = _mm256_castps_si256(x);
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(1));
    __m256i rounded = _mm256_srli_epi32(
        _mm256_add_epi32(_mm256_add_epi32(b, _mm256_set1_epi32(0x7fff)), lsb), 16);
    __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(b, _mm256_set1_epi32(0x7fffffff)),
                                     _mm256_set1_epi32(0x7f800000));
    __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(0x40));
    return _mm256_blendv_epi8(rounded, quiet, nan);
}

/* BF16 -> F32 on eight lanes (AVX2). */
SELDP_TARGET_F16C static inline __m256 seldp__bf16x8_to_f32(__m128i h)
{
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* F16 -> F32 on eight lanes, exactly: VCVTPH2PS, then the quiet bit (F32 bit 22) cleared
 * again in the lanes that held a signalling NaN (exponent all ones, quiet bit clear; an Inf
 * lane has bit 22 clear already). */
SELDP_TARGET_F16C static inline __m256 seldp__f16x8_to_f32(__m128i h)
{
    __m256 f = _mm256_cvtph_ps(h);
    __m128i sig = _mm_cmpeq_epi16(_mm_and_si128(h, _mm_set1_epi16(0x7e00)), _mm_set1_epi16(0x7c00));
    if (_mm_movemask_epi8(sig)) {
        __m256i bit = _mm256_and_si256(_mm256_cvtepi16_epi32(sig), _mm256_set1_epi32(0x400000));
        f = _mm256_andnot_ps(_mm256_castsi256_ps(bit), f);
    }
    return f;
}

/* F32 -> F16 on eight lanes, as seldp_f32_to_f16. */
SELDP_TARGET_F16C static inline __m128i seldp__f32x8_to_f16(__m256 x)
{
    return _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT);
}

/* The same on sixteen lanes with AVX-512F. */
SELDP_TARGET_AVX512 static inline __m512 seldp__f16x16_to_f32(__m256i h)
{
    __m512 f = _mm512_cvtph_ps(h);
    __m256i sig = _mm256_cmpeq_epi16(_mm256_and_si256(h, _mm256_set1_epi16(0x7e00)),
                                     _mm256_set1_epi16(0x7c00));
    if (_mm256_movemask_epi8(sig)) {
        __m512i bit = _mm512_and_si512(_mm512_cvtepi16_epi32(sig), _mm512_set1_epi32(0x400000));
        f = _mm512_castsi512_ps(_mm512_andnot_si512(bit, _mm512_castps_si512(f)));
    }
    return f;
}

SELDP_TARGET_AVX512 static inline __m256i seldp__f32x16_to_f16(__m512 x)
{
    return _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT);
}
#else
#define SELDP_HALF_SIMD 0
#endif

#endif
