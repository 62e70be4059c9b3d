/* CUDA implementations of src/kernels.h (built only with SELDP_HAVE_CUDA). Pointers are
 * device pointers on the current device; every call is synchronous. */
#ifndef SELDP_CUDA_KERNELS_H
#define SELDP_CUDA_KERNELS_H

#include <stddef.h>

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
seldp_status seldp__cuda_find_nonfinite(int ordinal, const void *x, seldp_dtype dtype, size_t n,
                                        size_t *first);

#ifdef __cplusplus
}
#endif
#endif
