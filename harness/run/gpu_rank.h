/* A rank that computes on a GPU: the device mirror of its host model (gpu_rank.c). */
#ifndef HX_GPU_RANK_H
#define HX_GPU_RANK_H

#include "seldp/seldp.h"
#include "tinymoe.h"

#include "gpu.h"

typedef struct hx_rank hx_rank;

/* A rank on a GPU (gpu_rank.c; without CUDA each returns SELDP_ERR_UNSUPPORTED). The host model
 * stays the rank's record: the checks, the gather, the dumps and the SGD update read and
 * write it, and these functions keep the device mirror in step with it. */
/* Mirror rk->model on rk->device (the calling thread's current device); the rank then
 * computes with the mirror (rk->ops, rk->compute). */
seldp_status hx_gpu_attach(hx_rank *rk);
void hx_gpu_detach(hx_rank *rk);
/* The device view the sessions initialize and reduce. */
seldp_model *hx_gpu_view(hx_rank *rk);
/* The device storage of the parameter at `path`. */
const seldp_tensor *hx_gpu_param(const hx_rank *rk, const char *path);
/* Device parameters into the host model, and back. */
seldp_status hx_gpu_download(hx_rank *rk);
seldp_status hx_gpu_upload(hx_rank *rk);
/* The FP32 gradient of p this step (numel floats) into host memory. */
seldp_status hx_gpu_local_grad(const hx_rank *rk, const tm_param_info *p, float *out);

#endif
