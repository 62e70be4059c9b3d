/* CUDA devices as the harness sees them. Built in every configuration: without CUDA there
 * is no GPU and the rest returns SELDP_ERR_UNSUPPORTED. What a rank does on its GPU is in
 * run.h (the hx_gpu_* functions on hx_rank). */
#ifndef HX_GPU_H
#define HX_GPU_H

#include <stdbool.h>

#include "seldp/seldp.h"
#include "tinymoe.h"

typedef struct hx_rank hx_rank;

/* Number of CUDA devices this process can use: 0 without CUDA, a driver or a GPU. */
int hx_gpu_count(void);

/* Make `ordinal` the calling thread's current CUDA device. */
seldp_status hx_gpu_select(int ordinal);

/* A GPU's identity across processes: its PCI bus id ("0000:3b:00.0"), or "" when unknown. */
typedef struct hx_gpu_id {
    char text[32];
} hx_gpu_id;

/* The identity of `ordinal` as this process numbers its devices (launchers that give each
 * process its own CUDA_VISIBLE_DEVICES make every process call its GPU cuda:0). */
hx_gpu_id hx_gpu_identity(int ordinal);

/* The GPU a process uses when it is the `local_rank`-th process of its node and sees
 * `visible` GPUs: local_rank % visible (-1 without a GPU). With one GPU per process (each
 * sees only its own) that is cuda:0; with every GPU visible to every process, the
 * local_rank-th one. */
int hx_gpu_for_local_rank(int local_rank, int visible);

/* True when the `n` identities name pairwise different GPUs (an unknown identity is never
 * known to differ). */
bool hx_gpu_ids_distinct(const hx_gpu_id *ids, int n);

/* A rank on a GPU (gpu.c; without CUDA each returns SELDP_ERR_UNSUPPORTED). The host model
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
