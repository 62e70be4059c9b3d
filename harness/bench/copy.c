/* seldp-bench: the copies that measure the memory-bandwidth bound B of SPEC §6.
 *
 * glibc's memcpy writes with ordinary stores below its non-temporal threshold, so the CPU
 * reads every destination line before it writes it (read-for-ownership) and moves three
 * bytes for every two counted: it understates what memory can do. The streaming copy writes
 * with non-temporal stores (SSE2 _mm_stream_si128, or AVX2 _mm256_stream_si256 when the CPU
 * has it), which go to memory without that read, and ends with _mm_sfence so that the
 * stores are globally visible when it returns. Both are timed; B is the better of the two. */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#include <immintrin.h>
#define BENCH_X86 1
#endif

#ifdef BENCH_X86
/* Copy [src, src + bytes) to dst, whose address is a multiple of `align` (16 or 32) and
 * bytes a multiple of 64: loads may be unaligned, stores are streamed. */
static void stream_sse2(char *dst, const char *src, size_t bytes)
{
    for (size_t i = 0; i < bytes; i += 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)(const void *)(src + i));
        __m128i b = _mm_loadu_si128((const __m128i *)(const void *)(src + i + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(const void *)(src + i + 32));
        __m128i d = _mm_loadu_si128((const __m128i *)(const void *)(src + i + 48));
        _mm_stream_si128((__m128i *)(void *)(dst + i), a);
        _mm_stream_si128((__m128i *)(void *)(dst + i + 16), b);
        _mm_stream_si128((__m128i *)(void *)(dst + i + 32), c);
        _mm_stream_si128((__m128i *)(void *)(dst + i + 48), d);
    }
}

__attribute__((target("avx2"))) static void stream_avx2(char *dst, const char *src, size_t bytes)
{
    for (size_t i = 0; i < bytes; i += 64) {
        __m256i a = _mm256_loadu_si256((const __m256i *)(const void *)(src + i));
        __m256i b = _mm256_loadu_si256((const __m256i *)(const void *)(src + i + 32));
        _mm256_stream_si256((__m256i *)(void *)(dst + i), a);
        _mm256_stream_si256((__m256i *)(void *)(dst + i + 32), b);
    }
}
#endif

/* The widest copy the CPU runs, unless SELDP_BENCH_COPY (sse2 or avx2) asks for a
 * narrower one (the tests check each). */
static bench_copy_kind detect(void)
{
#ifdef BENCH_X86
    const char *ask = getenv("SELDP_BENCH_COPY");
    __builtin_cpu_init();
    bool avx2 = __builtin_cpu_supports("avx2");
    if (ask && strcmp(ask, "sse2") == 0)
        return BENCH_COPY_SSE2;
    if (ask && strcmp(ask, "avx2") == 0 && !avx2)
        return BENCH_COPY_NONE;
    return avx2 ? BENCH_COPY_AVX2 : BENCH_COPY_SSE2;
#else
    return BENCH_COPY_NONE;
#endif
}

bench_copy_kind bench_stream_kind(void)
{
    /* rank threads may ask at once: each computes the same answer */
    static atomic_int kind = -1;
    int k = atomic_load_explicit(&kind, memory_order_relaxed);
    if (k == -1) {
        k = (int)detect();
        atomic_store_explicit(&kind, k, memory_order_relaxed);
    }
    return (bench_copy_kind)k;
}

const char *bench_stream_name(void)
{
    switch (bench_stream_kind()) {
    case BENCH_COPY_AVX2:
        return "AVX2 _mm256_stream_si256";
    case BENCH_COPY_SSE2:
        return "SSE2 _mm_stream_si128";
    default:
        return "none (memcpy)";
    }
}

void bench_stream_copy(void *dst, const void *src, size_t bytes)
{
#ifdef BENCH_X86
    bench_copy_kind kind = bench_stream_kind();
    if (kind == BENCH_COPY_NONE || bytes < 256) {
        memcpy(dst, src, bytes);
        return;
    }
    char *d = dst;
    const char *s = src;
    /* the head up to a 64-byte boundary of dst and the tail past the last whole 64 bytes
     * with memcpy: streamed stores must be aligned */
    size_t head = (64 - ((uintptr_t)d & 63)) & 63;
    memcpy(d, s, head);
    size_t body = (bytes - head) & ~(size_t)63;
    if (kind == BENCH_COPY_AVX2)
        stream_avx2(d + head, s + head, body);
    else
        stream_sse2(d + head, s + head, body);
    memcpy(d + head + body, s + head + body, bytes - head - body);
    _mm_sfence();
#else
    memcpy(dst, src, bytes);
#endif
}
