/* CUDA implementations of src/kernels.h (built only with SELDP_HAVE_CUDA). Pointers are
 * device pointers on the current device; every call is synchronous. */
#ifndef SELDP_CUDA_KERNELS_H
#define SELDP_CUDA_KERNELS_H

#include <stddef.h>

#include <cuda_runtime_api.h>

#include "kernels.h"
#include "seldp/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The descriptions of seldp__cuda_convert_batch's launches (and the result word of
 * seldp__cuda_find_nonfinite) (cuda_scratch.c): page-locked host memory they are written
 * into and device memory of `ordinal` they are copied to,
 * kept in a pool across calls and grown only when a call needs more, so that a call of
 * the same or a smaller size allocates nothing. A pool per device ordinal, shared by the
 * threads of the process: a thread takes one for a call and gives it back when its stream
 * has passed the launch, so that threads converting on the same GPU at once each hold
 * their own (the pool grows to the most held at once, then stops growing). */
typedef struct seldp__cuda_scratch seldp__cuda_scratch;

/* A scratch of at least `bytes` on each side for device `ordinal` (reused when the pool
 * has one, grown when it is smaller); *host and *dev receive its two buffers. On failure
 * nothing is held. */
seldp_status seldp__cuda_scratch_take(int ordinal, size_t bytes, seldp__cuda_scratch **out,
                                      void **host, void **dev);
/* Back into the pool; its buffers are kept. */
void seldp__cuda_scratch_give(seldp__cuda_scratch *scratch);
/* Free every scratch in the pools (none may be held); returns how many. Called at process
 * exit (registered at the first allocation) and by tests. */
size_t seldp__cuda_scratch_release(void);

seldp_status seldp__cuda_convert(int ordinal, void *dst, seldp_dtype dst_dtype, const void *src,
                                 seldp_dtype src_dtype, size_t n);
/* seldp__convert_batch on device `ordinal` (dtype pairs already checked): one launch, its
 * descriptions in a scratch of the pool (nothing allocated once the pool's fit). */
seldp_status seldp__cuda_convert_batch(int ordinal, const seldp__convert_seg *segs, size_t n_segs);
seldp_status seldp__cuda_scale_f32(int ordinal, float *x, size_t n, double factor);

/* Bytes of segment descriptions seldp__cuda_convert_async needs for n_segs segments, on the
 * host and on the device alike. */
size_t seldp__cuda_batch_desc_bytes(size_t n_segs);

/* The segments as seldp__convert_batch converts them, except that every F32 source is first
 * multiplied by `scale` with seldp__scale_f32's rounding unless scale is 1 (the fused scale
 * and cast after a reduction: seldp__scale_convert_bits); a half source needs scale 1. One
 * launch on `stream` (of the current device, which must be the segments'), not waited for.
 * Nothing is allocated: the descriptions are written into host_desc (page-locked, at least
 * seldp__cuda_batch_desc_bytes(n_segs) bytes; the caller does not reuse it before the
 * stream has passed this call) and copied to dev_desc (device memory of the same size). */
seldp_status seldp__cuda_convert_async(cudaStream_t stream, const seldp__convert_seg *segs,
                                       size_t n_segs, double scale, void *host_desc,
                                       void *dev_desc);
seldp_status seldp__cuda_find_nonfinite(int ordinal, const void *x, seldp_dtype dtype, size_t n,
                                        size_t *first);

#ifdef __cplusplus
}
#endif
#endif
