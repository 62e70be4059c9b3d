/* Element-wise operations on host or device memory used by sessions and transports:
 * dtype conversion, scaling and finiteness checks. Host versions live in kernels.c;
 * device pointers are dispatched to the CUDA versions in src/cuda/. */
#ifndef SELDP_KERNELS_H
#define SELDP_KERNELS_H

#include <stddef.h>

#include "seldp/tensor.h"

/* dst[i] = convert(src[i]) for n elements, both on `device`. Supported: identical
 * dtypes (a copy), F32 <-> F16/BF16 (round to nearest even), F16/BF16 -> F32. */
seldp_status seldp__convert(seldp_device device, void *dst, seldp_dtype dst_dtype, const void *src,
                            seldp_dtype src_dtype, size_t n);

/* One segment of a batched conversion: n elements from src (src_dtype) into dst
 * (dst_dtype) as seldp__convert does, or n zeros of dst_dtype into dst when src is NULL. */
typedef struct seldp__convert_seg {
    void *dst;
    const void *src;
    seldp_dtype dst_dtype, src_dtype;
    size_t n;
} seldp__convert_seg;

/* The batch size callers building batches on their stack use: 16 KiB of descriptors, and
 * 10,000 tensors are 20 launches. */
#define SELDP_CONVERT_BATCH_MAX 512

/* Every segment, as seldp__convert would one by one, on `device`; the dtype pairs are all
 * checked before anything is written. On a CUDA device the whole batch is one kernel launch
 * and one wait (instead of a launch and a wait per tensor). No segment's dst may overlap
 * another segment's dst or src, nor its own src unless the two are the same pointer with
 * the same dtype (a no-op). Any n_segs works (the CUDA path describes the segments to the
 * kernel in one host-to-device copy; past 64 segments it allocates that description). */
seldp_status seldp__convert_batch(seldp_device device, const seldp__convert_seg *segs,
                                  size_t n_segs);

/* Segments gathered into batches of SELDP_CONVERT_BATCH_MAX: seldp__convert_queue_add
 * converts the batch when it is full, seldp__convert_queue_flush what is left. Start from
 * {.device = d} (n = 0); .stream = true: host copies (same dtype) always take non-temporal
 * stores, for destinations nobody reads soon (a copy kept in case of failure). */
typedef struct seldp__convert_queue {
    seldp_device device;
    bool stream;
    size_t n;
    seldp__convert_seg segs[SELDP_CONVERT_BATCH_MAX];
} seldp__convert_queue;

seldp_status seldp__convert_queue_add(seldp__convert_queue *q, seldp__convert_seg seg);
seldp_status seldp__convert_queue_flush(seldp__convert_queue *q);

/* x[i] = (float)((double)x[i] * factor) for n F32 elements on `device`, a NaN decided on its
 * bits first (sign and payload kept, quiet bit set: seldp__scale_f32_bits), so that the host
 * and a GPU give the same bits. `factor` is finite and not zero. */
seldp_status seldp__scale_f32(seldp_device device, float *x, size_t n, double factor);

/* Index of the first NaN or Inf among n elements of a float dtype on `device`, or n when
 * every element is finite. */
seldp_status seldp__find_nonfinite(seldp_device device, const void *x, seldp_dtype dtype, size_t n,
                                   size_t *first);

#endif
