/* The reduction kernels of the host-staged transport (src/simd/host_sum.c).
 *
 * out[r][i] = convert(scale(in[0][i] + in[1][i] + ... + in[P-1][i])) for every output r:
 * every input upcast exactly to F32 and summed in rank order, multiplied by `scale` as
 * (float)((double)sum * scale) unless `scaled` is false, and written in the output dtype
 * with round to nearest even, so that the results equal the session's bucketed path (F32
 * allreduces, seldp__scale_f32, seldp__convert) bit for bit. The vector kernels keep 16
 * elements of every input in registers and write them to every output, so memory is read
 * and written once; they give the scalar reference's bits on every CPU. */
#ifndef SELDP_HOST_SUM_H
#define SELDP_HOST_SUM_H

#include <stdbool.h>
#include <stddef.h>

#include "seldp/dtype.h"

/* Groups up to this size gather the ranks' pointers on the stack for the register
 * kernel; larger ones take the chunked path of host_collectives.c. */
#define HOST_SUM_MAX_RANKS 64

/* The vector width of the kernels. */
typedef enum seldp__simd_width { SIMD_128, SIMD_256, SIMD_512 } seldp__simd_width;

/* The vector width the kernels use: the CPU's widest, or narrower when the environment
 * variable SELDP_HOST_SIMD says 128 or 256 (to test and compare the kernels); asked once a
 * process. */
seldp__simd_width seldp__host_simd_of_cpu(void);

/* How an owner turns sums into results. */
typedef struct seldp__sum_mode {
    bool scaled; /* multiply by scale, as seldp__scale_f32 does */
    double scale;
    bool stream;            /* non-temporal stores where an output allows them */
    seldp__simd_width simd; /* at most seldp__host_simd_of_cpu() */
} seldp__sum_mode;

/* Whether the register kernel takes these dtypes (F32, BF16, F16). */
bool seldp__host_sum_dtype(seldp_dtype dtype);

/* The reduction above for i < n with the vector kernels of width m->simd: `size` inputs
 * (NULL: zeros) of dtypes the register kernel takes, `outs` outputs of out_dtype, size
 * and outs at most HOST_SUM_MAX_RANKS. An output may be an input of the same dtype. */
void seldp__host_sum(int size, const void *const *in, const seldp_dtype *in_dtype, int outs,
                     void *const *out, seldp_dtype out_dtype, size_t n, const seldp__sum_mode *m);

/* The same reduction one element at a time in plain C: the reference of the vector kernels. */
void seldp__host_sum_scalar(int size, const void *const *in, const seldp_dtype *in_dtype, int outs,
                            void *const *out, seldp_dtype out_dtype, size_t n,
                            const seldp__sum_mode *m);

#endif
