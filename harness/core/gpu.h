/* CUDA devices as the harness sees them. Built in every configuration: without CUDA there
 * is no GPU and the rest returns SELDP_ERR_UNSUPPORTED. What a rank does on its GPU is in
 * run/gpu_rank.h. */
#ifndef HX_GPU_H
#define HX_GPU_H

#include <stdbool.h>

#include "seldp/seldp.h"

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

#endif
