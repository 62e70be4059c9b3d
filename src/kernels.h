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

/* x[i] = (float)((double)x[i] * factor) for n F32 elements on `device`. */
seldp_status seldp__scale_f32(seldp_device device, float *x, size_t n, double factor);

/* Index of the first NaN or Inf among n elements of a float dtype on `device`, or n when
 * every element is finite. */
seldp_status seldp__find_nonfinite(seldp_device device, const void *x, seldp_dtype dtype, size_t n,
                                   size_t *first);

#endif
