/* Gradient accumulation over micro-batches (docs/harness.md, The training step): how a rank's
 * step tokens are cut into M micro-batches, the rank's M forward-backward passes into one set of
 * accumulated gradients before the step's single reduction, and the FP64 reference of the
 * step's objective over every micro-batch.
 *
 * A rank's T step tokens are M contiguous micro-batches; micro-batch m has T / M tokens, one
 * more for m < T mod M (under --global-batch every rank's T is a multiple of M; otherwise the
 * first batch rank draws at least M tokens, so that no micro-batch is empty). Its (L,T,K)
 * router choices are kept micro-batch by micro-batch: micro-batch m's (L,T_m,K) block begins
 * at L * K * (the tokens of the micro-batches before m). */
#ifndef HX_MICROBATCH_H
#define HX_MICROBATCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "seldp/seldp.h"
#include "tinymoe.h"

#include "util.h"

typedef struct hx_run hx_run;
typedef struct hx_rank hx_rank;

/* Tokens of micro-batch m of a rank with T step tokens, and where they begin. */
size_t hx_micro_size(size_t T, int M, int m);
size_t hx_micro_offset(size_t T, int M, int m);

/* --micro-batches against the layout and the ranks' devices (a usage error, one line):
 * --overlap with pipeline stages and ranks on a GPU refused; --pipeline-schedule without
 * pipeline stages refused (hx_pipe_check). Against --global-batch: options_check.c. */
seldp_status hx_micro_check(const hx_run *run);

/* Rank rk's forward and backward of the step: with one micro-batch hx_rank_compute; with M,
 * the forwards and backwards of the micro-batches in the order of the run's pipeline schedule
 * (pipeline.h; every rank of a stage in the same order, so the collectives inside a stage
 * align; one stage: each micro-batch's forward and backward in turn), micro-batch m's
 * activations in the model's cache set m mod the micro-batches in flight, its gradients added
 * into the accumulators in micro-batch order, its router losses scaled to carry 1/M. Every
 * micro-batch's counts are computed before the schedule starts and the world's tokens per
 * expert are allreduced once after it. Afterwards rk->T, rk->counts and rk->global_tokens are
 * the step's, rk->loss_sum and rk->routed the sums over the micro-batches, rk->choices every
 * micro-batch's. */
seldp_status hx_micro_compute(hx_rank *rk);

/* The main thread: the FP64 reference of the step from every batch rank's (or data shard's)
 * tokens, micro-batch by micro-batch (tm_reference_compute_micro). */
seldp_status hx_micro_reference(hx_run *run, int step, tm_reference **out);
/* The same under another config (the diagnosis's hypotheses: other router-loss
 * coefficients), from the same micro-batches and weights. */
seldp_status hx_micro_reference_of(hx_run *run, int step, const tm_config *cfg, tm_reference **out);

/* manifest.json's `micro_batches` (M) and `micro_batch_sizes` (per rank, the tokens of each of
 * its micro-batches: where its `tokens` and `targets` are cut), each line ending in ",\n". */
void hx_micro_manifest(const hx_run *run, hx_buf *b);

#endif
