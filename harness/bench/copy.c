/* seldp-bench: the copies that measure the memory-bandwidth bound B (docs/benchmarks.md, The
 * bound).
 *
 * glibc's memcpy writes with ordinary stores below its non-temporal threshold, so the CPU
 * reads every destination line before it writes it (read-for-ownership) and moves three
 * bytes for every two counted: it understates what memory can do. The streaming copy is the
 * best copy seldp has, the one its host transport moves large payloads with
 * (seldp__stream_copy, src/simd/host_copy.h): non-temporal stores (SSE2, AVX2 or AVX-512,
 * the widest the CPU has), which go to memory without that read, four pages at a time with
 * the source prefetched, and an sfence so that the stores are globally visible when it
 * returns. Both are timed; B is the better of the two, so that a collective's fraction of B
 * is what its rendezvous, its slicing and its other work leave of a plain copy. */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "env.h"
#include "simd/host_copy.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define BENCH_X86 1
#endif

/* The widest copy the CPU runs, unless SELDP_BENCH_COPY (sse2, avx2) asks for a narrower
 * one (the tests check each). */
static bench_copy_kind detect(void)
{
#ifdef BENCH_X86
    int ask = seldp__env_choice(SELDP__ENV_BENCH_COPY); /* sse2, avx2 */
    seldp__simd_width have = seldp__host_simd_of_cpu();
    bench_copy_kind widest = have == SIMD_512   ? BENCH_COPY_AVX512
                             : have == SIMD_256 ? BENCH_COPY_AVX2
                                                : BENCH_COPY_SSE2;
    if (ask == 0)
        return BENCH_COPY_SSE2;
    if (ask == 1)
        return widest >= BENCH_COPY_AVX2 ? BENCH_COPY_AVX2 : BENCH_COPY_NONE;
    return widest;
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
    case BENCH_COPY_AVX512:
        return "AVX-512 _mm512_stream_si512, four pages at a time";
    case BENCH_COPY_AVX2:
        return "AVX2 _mm256_stream_si256, four pages at a time";
    case BENCH_COPY_SSE2:
        return "SSE2 _mm_stream_si128, four pages at a time";
    default:
        return "none (memcpy)";
    }
}

void bench_stream_copy(void *dst, const void *src, size_t bytes)
{
    switch (bench_stream_kind()) {
    case BENCH_COPY_AVX512:
        seldp__stream_copy(dst, src, bytes, SIMD_512);
        break;
    case BENCH_COPY_AVX2:
        seldp__stream_copy(dst, src, bytes, SIMD_256);
        break;
    case BENCH_COPY_SSE2:
        seldp__stream_copy(dst, src, bytes, SIMD_128);
        break;
    default:
        memcpy(dst, src, bytes);
        return;
    }
    seldp__stream_fence();
}
