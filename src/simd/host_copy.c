/* The streaming copy of the host transport and of the host kernels (see host_copy.h). */
#include <stdint.h>
#include <string.h>

#include "simd/host_copy.h"

#if defined(__x86_64__) && defined(__GNUC__)
#define COPY_X86 1
#include <immintrin.h>
#else
#define COPY_X86 0
#endif

#if COPY_X86
/* The page-interleaved body: PAGES pages in turn, LINE bytes of each at a time. */
#define PAGE  ((size_t)4096)
#define PAGES 4
/* How far ahead of the loads the source is prefetched, in bytes of one page's stream. */
#define PREFETCH_AHEAD 256

/* One 64-byte line: loads may be unaligned, d is 64-byte aligned. */
static inline void line_sse2(char *d, const char *s)
{
    __m128i a = _mm_loadu_si128((const __m128i *)(const void *)s);
    __m128i b = _mm_loadu_si128((const __m128i *)(const void *)(s + 16));
    __m128i c = _mm_loadu_si128((const __m128i *)(const void *)(s + 32));
    __m128i e = _mm_loadu_si128((const __m128i *)(const void *)(s + 48));
    _mm_stream_si128((__m128i *)(void *)d, a);
    _mm_stream_si128((__m128i *)(void *)(d + 16), b);
    _mm_stream_si128((__m128i *)(void *)(d + 32), c);
    _mm_stream_si128((__m128i *)(void *)(d + 48), e);
}

__attribute__((target("avx2"))) static inline void line_avx2(char *d, const char *s)
{
    __m256i a = _mm256_loadu_si256((const __m256i *)(const void *)s);
    __m256i b = _mm256_loadu_si256((const __m256i *)(const void *)(s + 32));
    _mm256_stream_si256((__m256i *)(void *)d, a);
    _mm256_stream_si256((__m256i *)(void *)(d + 32), b);
}

__attribute__((target("avx512f"))) static inline void line_avx512(char *d, const char *s)
{
    _mm512_stream_si512((void *)d, _mm512_loadu_si512((const void *)s));
}

/* The body of one width: n a multiple of 64, d 64-byte aligned. Two lines of each page at
 * a time, so that every prefetch covers the lines loaded. */
#define DEFINE_BODY(name, line, attr)                                                              \
    attr static void name(char *d, const char *s, size_t n)                                        \
    {                                                                                              \
        size_t i = 0;                                                                              \
        for (; i + PAGES * PAGE <= n; i += PAGES * PAGE)                                           \
            for (size_t o = 0; o < PAGE; o += 128)                                                 \
                for (size_t k = 0; k < PAGES; k++) {                                               \
                    const char *x = s + i + k * PAGE + o;                                          \
                    char *y = d + i + k * PAGE + o;                                                \
                    _mm_prefetch(x + PREFETCH_AHEAD, _MM_HINT_T0);                                 \
                    _mm_prefetch(x + PREFETCH_AHEAD + 64, _MM_HINT_T0);                            \
                    line(y, x);                                                                    \
                    line(y + 64, x + 64);                                                          \
                }                                                                                  \
        for (; i < n; i += 64)                                                                     \
            line(d + i, s + i);                                                                    \
    }

DEFINE_BODY(body_sse2, line_sse2, )
DEFINE_BODY(body_avx2, line_avx2, __attribute__((target("avx2"))))
DEFINE_BODY(body_avx512, line_avx512, __attribute__((target("avx512f"))))
#endif

void seldp__stream_copy(void *dst, const void *src, size_t bytes, seldp__simd_width simd)
{
#if COPY_X86
    if (bytes >= 256) {
        char *d = dst;
        const char *s = src;
        size_t head = (64 - ((uintptr_t)d & 63)) & 63;
        memcpy(d, s, head);
        size_t body = (bytes - head) & ~(size_t)63;
        if (simd == SIMD_512)
            body_avx512(d + head, s + head, body);
        else if (simd == SIMD_256)
            body_avx2(d + head, s + head, body);
        else
            body_sse2(d + head, s + head, body);
        memcpy(d + head + body, s + head + body, bytes - head - body);
        return;
    }
#endif
    (void)simd;
    memcpy(dst, src, bytes);
}

void seldp__stream_fence(void)
{
#if COPY_X86
    _mm_sfence();
#endif
}
