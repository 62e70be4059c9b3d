/* The streaming copy of the host transport and of the host kernels (src/simd/host_copy.c,
 * used by src/comm/host/ and src/kernels.c): large payloads that will not stay in the cache
 * are written with non-temporal stores, which skip the read-for-ownership of every
 * destination line (a third of the traffic of a cached copy). */
#ifndef SELDP_HOST_COPY_H
#define SELDP_HOST_COPY_H

#include <stddef.h>

#include "simd/host_sum.h"

/* Copy `bytes` from src to dst (not overlapping) with non-temporal stores of width `simd`
 * (at most seldp__host_simd_of_cpu()), the bytes before the first 64-byte boundary of dst
 * and after the last whole line with memcpy. The body goes four pages at a time, a line of
 * each page in turn, with the source prefetched ahead: four streams in flight keep more
 * of the memory system busy than one, as glibc's memcpy does for its largest copies. Call
 * seldp__stream_fence before another thread reads dst. Below 256 bytes: memcpy. */
void seldp__stream_copy(void *dst, const void *src, size_t bytes, seldp__simd_width simd);

/* Order the non-temporal stores of this thread before its later stores (sfence). */
void seldp__stream_fence(void);

#endif
