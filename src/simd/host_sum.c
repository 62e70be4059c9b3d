/* The SIMD kernels of the host transport's reductions (see host_sum.h): SSE2, AVX2 and
 * AVX-512 blocks of 16 elements, chosen at run time, and the scalar reference they match.
 *
 * F32, BF16 and F16 inputs and outputs all take the same register path. The half
 * conversions are those of src/simd/half_simd.h: BF16 by integer shifts and rounding, F16 by
 * F16C (VCVTPH2PS/VCVTPS2PH, 256 and 512 bits). The 128-bit kernel, for CPUs without AVX2
 * and F16C, converts F16 a block at a time through the array conversions of src/dtype.c
 * (F16C where the CPU has it after all, else the scalar functions). */
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif
/* AVX2 and AVX-512 kernels compiled beside the baseline ones and chosen at run time. */
#if defined(__x86_64__) && defined(__GNUC__)
#define HOST_AVX2 1
#include <immintrin.h>
#else
#define HOST_AVX2 0
#endif

#include "simd/host_sum.h"
#include "env.h"
#include "simd/half_simd.h"
#include "seldp_half_bits.cuh"

static seldp__simd_width simd_of_cpu(void)
{
    int force = seldp__env_choice(SELDP__ENV_HOST_SIMD); /* 128, 256 */
    seldp__simd_width cap = force == 0 ? SIMD_128 : force == 1 ? SIMD_256 : SIMD_512;
    seldp__simd_width have = SIMD_128;
#if HOST_AVX2
    if (__builtin_cpu_supports("avx512f"))
        have = SIMD_512;
    else if (seldp__cpu_has_f16c())
        have = SIMD_256;
#endif
    return have < cap ? have : cap;
}

seldp__simd_width seldp__host_simd_of_cpu(void)
{
    /* threads may ask at once: each computes the same answer */
    static atomic_int width = -1;
    int w = atomic_load_explicit(&width, memory_order_relaxed);
    if (w < 0) {
        w = (int)simd_of_cpu();
        atomic_store_explicit(&width, w, memory_order_relaxed);
    }
    return (seldp__simd_width)w;
}

/* As seldp__scale_f32: a NaN decided on its bits (seldp__scale_f32_bits). */
static float sum_scale(float x, const seldp__sum_mode *m)
{
    return m->scaled ? seldp__f32_of_bits(seldp__scale_f32_bits(seldp__bits_of_f32(x), m->scale))
                     : x;
}

/* Element i of one rank's input (NULL counts as +0), exactly in F32. */
static float input_at(const void *in, seldp_dtype dtype, size_t i)
{
    if (!in)
        return 0.0f;
    if (dtype == SELDP_F32)
        return ((const float *)in)[i];
    uint16_t h = ((const uint16_t *)in)[i];
    return dtype == SELDP_BF16 ? seldp_bf16_to_f32(h) : seldp_f16_to_f32(h);
}

/* Element i summed over the ranks in rank order, then scaled. */
static float sum_at(int size, const void *const *in, const seldp_dtype *in_dtype, size_t i,
                    const seldp__sum_mode *m)
{
    float acc = input_at(in[0], in_dtype[0], i);
    for (int r = 1; r < size; r++)
        acc += input_at(in[r], in_dtype[r], i);
    return sum_scale(acc, m);
}

static void output_at(void *out, seldp_dtype dtype, size_t i, float v)
{
    if (dtype == SELDP_F32)
        ((float *)out)[i] = v;
    else if (dtype == SELDP_BF16)
        ((uint16_t *)out)[i] = seldp_f32_to_bf16(v);
    else
        ((uint16_t *)out)[i] = seldp_f32_to_f16(v);
}

#if defined(__SSE2__)
static __m128 sum_scale4(__m128 x, const seldp__sum_mode *m)
{
    if (!m->scaled)
        return x;
    __m128d s = _mm_set1_pd(m->scale);
    __m128d lo = _mm_mul_pd(_mm_cvtps_pd(x), s);
    __m128d hi = _mm_mul_pd(_mm_cvtps_pd(_mm_movehl_ps(x, x)), s);
    return _mm_movelh_ps(_mm_cvtpd_ps(lo), _mm_cvtpd_ps(hi));
}

/* Elements i..i+15 of one rank's input as four F32 vectors: a BF16's bits are the top
 * half of its F32's, so widening is exact; an F16 goes through seldp_half_to_f32; NULL
 * gives +0. */
static void load16(const void *in, seldp_dtype dtype, size_t i, __m128 v[4])
{
    if (!in) {
        v[0] = v[1] = v[2] = v[3] = _mm_setzero_ps();
    } else if (dtype == SELDP_F32) {
        const float *f = (const float *)in + i;
        for (int k = 0; k < 4; k++)
            v[k] = _mm_loadu_ps(f + 4 * k);
    } else if (dtype == SELDP_BF16) {
        const uint16_t *h = (const uint16_t *)in + i;
        __m128i lo = _mm_loadu_si128((const __m128i *)h);
        __m128i hi = _mm_loadu_si128((const __m128i *)(h + 8));
        v[0] = seldp__bf16x4_lo_to_f32(lo);
        v[1] = seldp__bf16x4_hi_to_f32(lo);
        v[2] = seldp__bf16x4_lo_to_f32(hi);
        v[3] = seldp__bf16x4_hi_to_f32(hi);
    } else {
        float f[16];
        seldp_half_to_f32(SELDP_F16, (const uint16_t *)in + i, f, 16);
        for (int k = 0; k < 4; k++)
            v[k] = _mm_loadu_ps(f + 4 * k);
    }
}

/* A block of 16 results as the bytes of the output dtype, converted once for every output:
 * F32 in the four vectors, BF16 or F16 in the first two. */
static void encode16(seldp_dtype dtype, const __m128 v[4], __m128i e[4])
{
    if (dtype == SELDP_F32) {
        for (int k = 0; k < 4; k++)
            e[k] = _mm_castps_si128(v[k]);
    } else if (dtype == SELDP_BF16) {
        e[0] = _mm_packs_epi32(seldp__f32x4_to_bf16(v[0]), seldp__f32x4_to_bf16(v[1]));
        e[1] = _mm_packs_epi32(seldp__f32x4_to_bf16(v[2]), seldp__f32x4_to_bf16(v[3]));
    } else {
        float f[16];
        uint16_t h[16];
        for (int k = 0; k < 4; k++)
            _mm_storeu_ps(f + 4 * k, v[k]);
        seldp_f32_to_half(SELDP_F16, f, h, 16);
        e[0] = _mm_loadu_si128((const __m128i *)h);
        e[1] = _mm_loadu_si128((const __m128i *)(h + 8));
    }
}

static void store16(void *out, seldp_dtype dtype, size_t i, const __m128i e[4], bool stream)
{
    __m128i *to = (__m128i *)((char *)out + i * seldp_dtype_size(dtype));
    for (int k = 0; k < (dtype == SELDP_F32 ? 4 : 2); k++) {
        if (stream)
            _mm_stream_si128(to + k, e[k]);
        else
            _mm_storeu_si128(to + k, e[k]);
    }
}
/* Streaming sums (payloads past the caches) prefetch every input this far ahead of the
 * loads: the inputs are P streams of their own, and the reduce-scatter, which reads P bytes
 * for each it writes, took 6 % less time with it at 128 MiB on 2 and 4 ranks here (paired
 * runs of seldp-bench -r 3); no result changes. */
#define SUM_PREFETCH_AHEAD 1024

/* Prefetch `lines` cache lines of every input, SUM_PREFETCH_AHEAD past element i. */
static inline void prefetch_inputs(int size, const void *const *in, const seldp_dtype *in_dtype,
                                   size_t i, int lines)
{
    for (int r = 0; r < size; r++) {
        const char *x =
            (const char *)in[r] + i * seldp_dtype_size(in_dtype[r]) + SUM_PREFETCH_AHEAD;
        for (int k = 0; k < lines; k++)
            _mm_prefetch(x + 64 * k, _MM_HINT_T0);
    }
}

/* Blocks of 16 elements from i while i + 16 <= n: 16 elements of every input in registers,
 * then the same 16 of every output, so that memory is read and written once. Returns the
 * first element left. */
static size_t sum_blocks_sse2(int size, const void *const *in, const seldp_dtype *in_dtype,
                              int outs, void *const *out, seldp_dtype out_dtype, size_t i, size_t n,
                              const seldp__sum_mode *m, uint64_t stream)
{
    for (; i + 16 <= n; i += 16) {
        __m128 acc[4], x[4];
        if (m->stream)
            prefetch_inputs(size, in, in_dtype, i, 1);
        load16(in[0], in_dtype[0], i, acc);
        for (int r = 1; r < size; r++) {
            load16(in[r], in_dtype[r], i, x);
            for (int k = 0; k < 4; k++)
                acc[k] = _mm_add_ps(acc[k], x[k]);
        }
        for (int k = 0; k < 4; k++)
            acc[k] = sum_scale4(acc[k], m);
        __m128i e[4];
        encode16(out_dtype, acc, e);
        for (int r = 0; r < outs; r++)
            store16(out[r], out_dtype, i, e, stream >> r & 1);
    }
    return i;
}
#endif

#if HOST_AVX2
/* The same blocks with 256-bit vectors, for CPUs with AVX2 and F16C (half the
 * instructions: the scaling through doubles and the BF16 rounding make the 128-bit kernel
 * compute-bound). */
#define AVX2 SELDP_TARGET_F16C

AVX2 static void load16_avx2(const void *in, seldp_dtype dtype, size_t i, __m256 v[2])
{
    if (!in) {
        v[0] = v[1] = _mm256_setzero_ps();
    } else if (dtype == SELDP_F32) {
        const float *f = (const float *)in + i;
        v[0] = _mm256_loadu_ps(f);
        v[1] = _mm256_loadu_ps(f + 8);
    } else if (dtype == SELDP_F16) {
        const uint16_t *h = (const uint16_t *)in + i;
        v[0] = seldp__f16x8_to_f32(_mm_loadu_si128((const __m128i *)h));
        v[1] = seldp__f16x8_to_f32(_mm_loadu_si128((const __m128i *)(h + 8)));
    } else {
        const uint16_t *h = (const uint16_t *)in + i;
        v[0] = seldp__bf16x8_to_f32(_mm_loadu_si128((const __m128i *)h));
        v[1] = seldp__bf16x8_to_f32(_mm_loadu_si128((const __m128i *)(h + 8)));
    }
}

AVX2 static __m256 sum_scale8(__m256 x, const seldp__sum_mode *m)
{
    if (!m->scaled)
        return x;
    __m256d s = _mm256_set1_pd(m->scale);
    __m128 lo = _mm256_cvtpd_ps(_mm256_mul_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(x)), s));
    __m128 hi = _mm256_cvtpd_ps(_mm256_mul_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(x, 1)), s));
    return _mm256_insertf128_ps(_mm256_castps128_ps256(lo), hi, 1);
}

/* encode16 with 256-bit vectors: F32 in both, BF16 or F16 in the first. */
AVX2 static void encode16_avx2(seldp_dtype dtype, const __m256 v[2], __m256i e[2])
{
    if (dtype == SELDP_F32) {
        e[0] = _mm256_castps_si256(v[0]);
        e[1] = _mm256_castps_si256(v[1]);
    } else if (dtype == SELDP_F16) {
        e[0] = _mm256_set_m128i(seldp__f32x8_to_f16(v[1]), seldp__f32x8_to_f16(v[0]));
    } else {
        /* packus works within 128-bit lanes: put the four quarters back in order */
        e[0] = _mm256_permute4x64_epi64(
            _mm256_packus_epi32(seldp__f32x8_to_bf16(v[0]), seldp__f32x8_to_bf16(v[1])), 0xd8);
    }
}

AVX2 static void store16_avx2(void *out, seldp_dtype dtype, size_t i, const __m256i e[2],
                              bool stream)
{
    __m256i *to = (__m256i *)((char *)out + i * seldp_dtype_size(dtype));
    for (int k = 0; k < (dtype == SELDP_F32 ? 2 : 1); k++) {
        if (stream)
            _mm256_stream_si256(to + k, e[k]);
        else
            _mm256_storeu_si256(to + k, e[k]);
    }
}

AVX2 static size_t sum_blocks_avx2(int size, const void *const *in, const seldp_dtype *in_dtype,
                                   int outs, void *const *out, seldp_dtype out_dtype, size_t i,
                                   size_t n, const seldp__sum_mode *m, uint64_t stream)
{
    for (; i + 16 <= n; i += 16) {
        __m256 acc[2], x[2];
        if (m->stream)
            prefetch_inputs(size, in, in_dtype, i, 1);
        load16_avx2(in[0], in_dtype[0], i, acc);
        for (int r = 1; r < size; r++) {
            load16_avx2(in[r], in_dtype[r], i, x);
            acc[0] = _mm256_add_ps(acc[0], x[0]);
            acc[1] = _mm256_add_ps(acc[1], x[1]);
        }
        acc[0] = sum_scale8(acc[0], m);
        acc[1] = sum_scale8(acc[1], m);
        __m256i e[2];
        encode16_avx2(out_dtype, acc, e);
        for (int r = 0; r < outs; r++)
            store16_avx2(out[r], out_dtype, i, e, stream >> r & 1);
    }
    return i;
}
#endif
#if HOST_AVX2
/* The same blocks with 512-bit vectors for CPUs with AVX-512F: a block of 16 is one vector. */
#define AVX512 __attribute__((target("avx512f")))

AVX512 static __m512 load16_avx512(const void *in, seldp_dtype dtype, size_t i)
{
    if (!in)
        return _mm512_setzero_ps();
    if (dtype == SELDP_F32)
        return _mm512_loadu_ps((const float *)in + i);
    __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)in + i));
    if (dtype == SELDP_F16)
        return seldp__f16x16_to_f32(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

AVX512 static __m512 sum_scale16(__m512 x, const seldp__sum_mode *m)
{
    if (!m->scaled)
        return x;
    __m512d s = _mm512_set1_pd(m->scale);
    __m256 lo = _mm512_cvtpd_ps(_mm512_mul_pd(_mm512_cvtps_pd(_mm512_castps512_ps256(x)), s));
    __m256 hi = _mm512_cvtpd_ps(_mm512_mul_pd(
        _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1))), s));
    return _mm512_castpd_ps(
        _mm512_insertf64x4(_mm512_castpd256_pd512(_mm256_castps_pd(lo)), _mm256_castps_pd(hi), 1));
}

/* A block of 16 results in the output dtype: 64 bytes of F32, or 32 of BF16 (the rounding
 * of seldp__f32x4_to_bf16 on sixteen lanes) or F16 in the low half. */
AVX512 static __m512i encode16_avx512(seldp_dtype dtype, __m512 v)
{
    if (dtype == SELDP_F32)
        return _mm512_castps_si512(v);
    if (dtype == SELDP_F16)
        return _mm512_castsi256_si512(seldp__f32x16_to_f16(v));
    __m512i b = _mm512_castps_si512(v);
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(1));
    __m512i rounded = _mm512_srli_epi32(
        _mm512_add_epi32(_mm512_add_epi32(b, _mm512_set1_epi32(0x7fff)), lsb), 16);
    __mmask16 nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(b, _mm512_set1_epi32(0x7fffffff)),
                                            _mm512_set1_epi32(0x7f800000));
    __m512i quiet = _mm512_or_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(0x40));
    __m256i h = _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(nan, rounded, quiet));
    return _mm512_castsi256_si512(h);
}

AVX512 static void store16_avx512(void *out, seldp_dtype dtype, size_t i, __m512i e, bool stream)
{
    if (dtype == SELDP_F32) {
        float *f = (float *)out + i;
        if (stream)
            _mm512_stream_si512((__m512i *)f, e);
        else
            _mm512_storeu_si512(f, e);
        return;
    }
    __m256i *to = (__m256i *)((uint16_t *)out + i);
    if (stream)
        _mm256_stream_si256(to, _mm512_castsi512_si256(e));
    else
        _mm256_storeu_si256(to, _mm512_castsi512_si256(e));
}

AVX512 static size_t sum_blocks_avx512(int size, const void *const *in, const seldp_dtype *in_dtype,
                                       int outs, void *const *out, seldp_dtype out_dtype, size_t i,
                                       size_t n, const seldp__sum_mode *m, uint64_t stream)
{
    /* two blocks at a time: a whole cache line of every BF16 stream per iteration */
    for (; i + 32 <= n; i += 32) {
        if (m->stream)
            prefetch_inputs(size, in, in_dtype, i, 2);
        __m512 a = load16_avx512(in[0], in_dtype[0], i);
        __m512 b = load16_avx512(in[0], in_dtype[0], i + 16);
        for (int r = 1; r < size; r++) {
            a = _mm512_add_ps(a, load16_avx512(in[r], in_dtype[r], i));
            b = _mm512_add_ps(b, load16_avx512(in[r], in_dtype[r], i + 16));
        }
        __m512i ea = encode16_avx512(out_dtype, sum_scale16(a, m));
        __m512i eb = encode16_avx512(out_dtype, sum_scale16(b, m));
        for (int r = 0; r < outs; r++) {
            store16_avx512(out[r], out_dtype, i, ea, stream >> r & 1);
            store16_avx512(out[r], out_dtype, i + 16, eb, stream >> r & 1);
        }
    }
    for (; i + 16 <= n; i += 16) {
        __m512 acc = load16_avx512(in[0], in_dtype[0], i);
        for (int r = 1; r < size; r++)
            acc = _mm512_add_ps(acc, load16_avx512(in[r], in_dtype[r], i));
        __m512i e = encode16_avx512(out_dtype, sum_scale16(acc, m));
        for (int r = 0; r < outs; r++)
            store16_avx512(out[r], out_dtype, i, e, stream >> r & 1);
    }
    return i;
}
#endif

#if defined(__SSE2__)
static size_t sum_blocks(seldp__simd_width simd, int size, const void *const *in,
                         const seldp_dtype *in_dtype, int outs, void *const *out,
                         seldp_dtype out_dtype, size_t i, size_t n, const seldp__sum_mode *m,
                         uint64_t stream)
{
#if HOST_AVX2
    if (simd == SIMD_512)
        i = sum_blocks_avx512(size, in, in_dtype, outs, out, out_dtype, i, n, m, stream);
    else if (simd == SIMD_256)
        i = sum_blocks_avx2(size, in, in_dtype, outs, out, out_dtype, i, n, m, stream);
#endif
    (void)simd;
    return sum_blocks_sse2(size, in, in_dtype, outs, out, out_dtype, i, n, m, stream);
}

/* Elements [i, i + n), n < 16, through zero-padded copies of the inputs and one of the
 * output, so that the ends of a range go through the same kernel as its middle. */
static void sum_partial(seldp__simd_width simd, int size, const void *const *in,
                        const seldp_dtype *in_dtype, int outs, void *const *out,
                        seldp_dtype out_dtype, size_t i, size_t n, const seldp__sum_mode *m)
{
    _Alignas(64) unsigned char pad[HOST_SUM_MAX_RANKS][16 * sizeof(float)],
        result[16 * sizeof(float)];
    const void *from[HOST_SUM_MAX_RANKS];
    void *to[1] = {result};
    size_t esize = seldp_dtype_size(out_dtype);
    for (int r = 0; r < size; r++) {
        from[r] = in[r] ? pad[r] : NULL;
        if (in[r]) {
            size_t isize = seldp_dtype_size(in_dtype[r]);
            memset(pad[r], 0, sizeof pad[r]);
            memcpy(pad[r], (const char *)in[r] + i * isize, n * isize);
        }
    }
    sum_blocks(simd, size, from, in_dtype, 1, to, out_dtype, 0, 16, m, 0);
    for (int r = 0; r < outs; r++)
        memcpy((char *)out[r] + i * esize, result, n * esize);
}
#endif

/* out[r][i] = convert(scale(sum over r of in[r][i])) for i < n, inputs F32, BF16 or F16
 * (NULL: zeros), outputs the same, size <= HOST_SUM_MAX_RANKS. The sums, the scaling and the
 * rounding are the scalar ones, bit for bit; only the vector width depends on the CPU. */
void seldp__host_sum(int size, const void *const *in, const seldp_dtype *in_dtype, int outs,
                     void *const *out, seldp_dtype out_dtype, size_t n, const seldp__sum_mode *m)
{
    size_t i = 0;
#if defined(__SSE2__)
    size_t esize = seldp_dtype_size(out_dtype);
    seldp__simd_width simd = m->simd;
    /* a stream store writes a whole vector: 16 bytes, 32, or a 16-element block */
    size_t align = simd == SIMD_128 ? 16 : simd == SIMD_256 ? 32 : 16 * esize;
    /* Up to the first output's boundary, then whole blocks, streamed if every output is
     * on a boundary there, then the rest. */
    size_t head = ((align - ((uintptr_t)out[0] & (align - 1))) & (align - 1)) / esize;
    if ((uintptr_t)out[0] % esize || head > n)
        head = n < 16 ? n : 0;
    if (head) {
        sum_partial(simd, size, in, in_dtype, outs, out, out_dtype, 0, head, m);
        i = head;
    }
    /* Stream the outputs that are not also read here: an in-place output's lines are in
     * the cache already (just read), and a streaming store would evict them first. */
    uint64_t stream = 0;
    for (int r = 0; r < outs && m->stream; r++)
        if (((uintptr_t)((char *)out[r] + i * esize) & (align - 1)) == 0 &&
            (r >= size || out[r] != (void *)in[r] || in_dtype[r] != out_dtype))
            stream |= (uint64_t)1 << r;
    i = sum_blocks(simd, size, in, in_dtype, outs, out, out_dtype, i, n, m, stream);
    while (i < n) {
        size_t left = n - i < 16 ? n - i : 15;
        sum_partial(simd, size, in, in_dtype, outs, out, out_dtype, i, left, m);
        i += left;
    }
#endif
    for (; i < n; i++) {
        float v = sum_at(size, in, in_dtype, i, m);
        for (int r = 0; r < outs; r++)
            output_at(out[r], out_dtype, i, v);
    }
}

void seldp__host_sum_scalar(int size, const void *const *in, const seldp_dtype *in_dtype, int outs,
                            void *const *out, seldp_dtype out_dtype, size_t n,
                            const seldp__sum_mode *m)
{
    for (size_t i = 0; i < n; i++) {
        float v = sum_at(size, in, in_dtype, i, m);
        for (int r = 0; r < outs; r++)
            output_at(out[r], out_dtype, i, v);
    }
}

bool seldp__host_sum_dtype(seldp_dtype dtype)
{
    return dtype == SELDP_F32 || dtype == SELDP_BF16 || dtype == SELDP_F16;
}
