/* Rank functions shared by the GPU world tests: the communicator contract (every
 * collective with buffers on the rank's device and on the host, splits, replicas
 * bit-identical) and a session that initializes and reduces device tensors. They run on any
 * world of gpu_run_ranks, so `--host` runs them on the host-staged transport with host
 * memory to validate the checks themselves. */
#ifndef SELDP_GPU_CHECKS_H
#define SELDP_GPU_CHECKS_H

#include "gpu_ranks.h"

/* Broadcast from every root, allreduce of F32/F64/I64/U64 (in and out of place), allgather,
 * allgatherv, alltoallv with gaps, barrier; each with mem = the rank's device and the host.
 * Then splits (by parity with reversed keys, nested, with a rank outside every group) and an
 * allreduce of inexact floats whose results must be bit-identical on every rank. */
int gpu_check_collectives(tr_rank_ctx *ctx);

/* A session over device parameters (F32, F16, BF16, plus unselected ones that differ by
 * rank): initialize from the last rank, then reduce (mean, weights r + 3 so that 1/W is not 1 on
 * one GPU either, policy error) and sum_fp32 (policy zero, one rank without a gradient) of device
 * gradients, checked against the host arithmetic, identical on every rank, unselected gradients
 * untouched. */
int gpu_check_session(tr_rank_ctx *ctx);

#endif
