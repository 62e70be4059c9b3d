/* CUDA devices as the harness sees them. Built in every configuration: without CUDA there
 * is no GPU and the rest returns SELDP_ERR_UNSUPPORTED. What a rank does on its GPU is in
 * run.h (the hx_gpu_* functions on hx_rank). */
#ifndef HX_GPU_H
#define HX_GPU_H

#include "seldp/status.h"

/* Number of CUDA devices this process can use: 0 without CUDA, a driver or a GPU. */
int hx_gpu_count(void);

/* Make `ordinal` the calling thread's current CUDA device. */
seldp_status hx_gpu_select(int ordinal);

#endif
