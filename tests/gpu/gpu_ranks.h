/* Helpers of the GPU tests: skipping without a GPU, rank threads over a world whose ranks
 * compute on CUDA devices (host-staged or NCCL), and buffers on a rank's device.
 *
 * Rank functions follow tests/common/ranks.h: they never call cmocka, they return 0 or
 * record why they failed with RANK_CHECK, and the main thread asserts after joining. */
#ifndef SELDP_GPU_RANKS_H
#define SELDP_GPU_RANKS_H

#include <stdbool.h>
#include <stddef.h>

#include "ranks.h"
#include "seldp/seldp.h"

/* How the ranks of gpu_run_ranks are connected and where they compute. */
typedef enum gpu_world_kind {
    GPU_WORLD_HOST_ON_HOST = 0, /* host-staged transport, host memory: checks the checks */
    GPU_WORLD_HOST_STAGED = 1,  /* host-staged transport, rank r on cuda:(r % gpus) */
    GPU_WORLD_NCCL = 2          /* NCCL, rank r on cuda:r (needs one GPU per rank) */
} gpu_world_kind;

/* Number of CUDA devices; exits the program with 77 (skipped) when there is none. */
int gpu_require(void);

/* True when argv holds "--host": run the rank checks on the host-staged transport with
 * host memory, to validate the test on a machine without a GPU. */
bool gpu_host_mode(int argc, char **argv);

/* Run fn on n rank threads of a world of `kind` (`gpus` devices used by host-staged
 * worlds), each with ctx->world joined on its device (harness/runner.h: a failing rank
 * aborts the world); destroy everything; return the number of failed ranks with the
 * earliest failure copied into why. */
int gpu_run_ranks(gpu_world_kind kind, int n, int gpus, double timeout_s, tr_rank_fn fn, void *arg,
                  char *why, size_t why_size);

/* As gpu_run_ranks, failing the current cmocka test on any rank failure. */
void gpu_run_ranks_or_fail(gpu_world_kind kind, int n, int gpus, double timeout_s, tr_rank_fn fn,
                           void *arg);

/* A buffer of `bytes` on `device` (zeroed), freed with gpu_buf_free. NULL on failure. */
void *gpu_buf_alloc(seldp_device device, size_t bytes);
void gpu_buf_free(seldp_device device, void *ptr);

/* Copy host bytes to/from a buffer on `device`. */
seldp_status gpu_upload(seldp_device device, void *dst, const void *src, size_t bytes);
seldp_status gpu_download(seldp_device device, void *dst, const void *src, size_t bytes);

#endif
