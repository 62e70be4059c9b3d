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

seldp_status seldp__cuda_convert(int ordinal, void *dst, seldp_dtype dst_dtype, const void *src,
                                 seldp_dtype src_dtype, size_t n);
/* seldp__convert_batch on device `ordinal` (dtype pairs already checked): one launch. */
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
