/* The sharded and pipelined tiny-moe (docs/model.md, Sharded and pipelined grid) in the harness:
 * tensor (tp), expert-tensor (etp) and pipeline (pp) parallelism; context parallelism (cp) needs
 * none of this (its ranks are extra data shards of the unsharded path).
 *
 * A rank of a sharded run holds its shards (rk->model, tm_model_create_part with the shard
 * sizes V/tp, F/etp, Fs/tp and its stage's layers) under the logical paths, and computes with
 * them: tiny-moe's tensor parallelism (tm_tp) communicates over the rank's TP group; an
 * expert's rows reach every ETP shard of its owner by an allgather over the expert-TP group,
 * whose partial outputs are summed (dispatch.c); activations and gradients go between
 * adjacent stages by broadcasts on a communicator of each pair (pipeline.h). Each shard is
 * reduced in the session of the group the framework reduces it over:
 *   dense   the dense reduce group (data x context of one stage and TP rank): the
 *           vocabulary-parallel embedding (pp = 1), the shared expert's column-parallel w1
 *           and row-parallel w2; at tp = 1 also the norms and routers;
 *   sp      every rank of the stage (dp x cp x tp), tp > 1: the sequence-parallel norms,
 *           routers and final norm (a TP rank's gradient covers its own tokens, so the
 *           reduction also sums over TP, as Megatron's finalize_model_grads does);
 *   emb     pp > 1: the tied embedding's two copies (stage 0's embed.weight, the last stage's
 *           lm_head.weight) over the first and last stages of one TP rank: the embedding
 *           group and data parallelism in one `sum`;
 *   expert  the expert-data group: each owned expert's ETP shard;
 *   expert-tp  etp > 1 with quantized experts: the adapters every ETP shard holds whole
 *           (w1's lora_a, w2's lora_b) over the expert-data groups of all ETP ranks of the
 *           owners, whose partial gradients are summed over expert-TP as well.
 * Checkpoints hold whole logical tensors gathered from the shards (grid_ckpt.h). */
#ifndef HX_GRID_H
#define HX_GRID_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "seldp/seldp.h"
#include "tinymoe.h"

#include "util.h"

typedef struct hx_run hx_run;
typedef struct hx_rank hx_rank;

/* How a rank's tensor is a shard of the logical one: a contiguous range along `dim`, part
 * `index` of `parts` equal parts (parts == 1: the whole tensor), of the logical tensor seen as
 * `rows` rows (0: as its shape says; an NF4 base, packed in one dimension, is split by columns
 * of its [out, in/2] or [out, in/64] view). */
typedef struct hx_shard {
    int dim;
    int parts;
    int index;
    int rows;
} hx_shard;

/* The kind of replica set a parameter of a sharded run is reduced in (sets.h). */
typedef enum hx_grid_kind {
    HX_GRID_DENSE = 0,
    HX_GRID_SP = 1,
    HX_GRID_EMB = 2,
    HX_GRID_EXPERT = 3,
    HX_GRID_EXPERT_TP = 4 /* a quantized expert's replicated adapters under etp > 1 */
} hx_grid_kind;

typedef struct hx_grid_rank {
    int stage, tp_rank, etp_rank;
    tm_part part;
    seldp_comm *tp, *pp, *etp;
    seldp_comm *prev, *next; /* pp > 1: the links to the previous and next stage (pipeline.h) */
    seldp_comm *stage_comm;  /* every rank of the stage (load-balancing counts) */
    seldp_model *emb_view;   /* pp > 1, first and last stage: the tied copy as embed.weight */
} hx_grid_rank;

/* True when the run shards the model: tp, pp or etp > 1. */
bool hx_grid_sharded(const hx_run *run);

/* What a sharded run needs of the options: sizes that divide (pp the layers, tp the vocabulary
 * and the shared expert's d_ff, etp the experts' d_ff), and the features it does not support
 * yet refused. A failure is a usage error, one line. Without sharding only the checks that
 * context parallelism needs. */
seldp_status hx_grid_check_options(hx_run *run);

/* The shards of rank r: the config of their sizes, the part of the model, and how the tensor
 * at `path` (a path the rank holds) is cut from the logical one. */
tm_config hx_grid_shard_config(const hx_run *run);
tm_part hx_grid_part(const hx_run *run, int r);
hx_shard hx_grid_shard(const hx_run *run, int r, const char *path);

/* The stage-0 rank of rank r's pipeline group, whose tokens r shares; r itself in an unsharded
 * run (every rank draws its own). */
int hx_grid_batch_rank(const hx_run *run, int r);

/* The kind of set a sharded run reduces `p` in. */
hx_grid_kind hx_grid_kind_of(const hx_run *run, const tm_param_info *p);

/* The logical path of a rank's occurrence: lm_head.weight, the last stage's copy of the tied
 * embedding, is embed.weight. */
const char *hx_grid_logical_path(const char *path);

/* Rank side (grid_rank.c): its compute groups (TP, PP, ETP, stage) and its model of shards. */
seldp_status hx_grid_setup(hx_rank *rk);
void hx_grid_cleanup(hx_rank *rk);

/* Main side (grid_check.c): the logical weights assembled from every replica set's root (its
 * shards, or its whole tensors) into `into`, a model of the logical config holding every
 * expert. */
seldp_status hx_grid_assemble(const hx_run *run, tm_model *into);
/* With pipeline parallelism a batch's layers are routed on the ranks of their stages: its
 * (L,T,K) choices gathered from its pipeline group into *out (malloc'd; NULL for an unsharded
 * run), batch rank b's beginning at hx_grid_choices_offset(run, b). */
seldp_status hx_grid_merge_choices(const hx_run *run, int **out);
size_t hx_grid_choices_offset(const hx_run *run, int b);
/* The ranks of rank r's data shard (docs/model.md, Routing extensions: the TP x CP ranks of its
 * data-parallel index at its stage), context chunks in CP order and each chunk's TP ranks in TP
 * order: the order in which their tokens form the shard. ranks holds the world; returns the count
 * (1 without a grid). */
int hx_data_shard_of(const hx_run *run, int r, int *ranks);

/* The reference's token lists when a data shard spans several ranks (tp x cp > 1): one per
 * shard, its ranks' tokens, targets and (L,T,K) routing choices (`merged`: those of
 * hx_grid_merge_choices, or NULL for the ranks' own) concatenated in the shard's order;
 * n = 0 otherwise (the batch ranks' own lists serve). Free with hx_shard_batch_free. */
typedef struct hx_shard_batch {
    int n;
    int32_t **tokens, **targets;
    int **choices;
    size_t *counts;
} hx_shard_batch;
seldp_status hx_grid_shard_batch(const hx_run *run, const int *merged, hx_shard_batch *out);
void hx_shard_batch_free(hx_shard_batch *b);

/* report.md's layout table of a sharded run: per rank its stage, TP and ETP ranks, dense
 * group, EP group, expert-data group and experts, "(root)" where it initializes the group. */
void hx_grid_layout_md(const hx_run *run, hx_buf *b);
/* Copy a shard into its range of the logical tensor `lt` (to_logical), or the range out. */
void hx_shard_copy(void *logical, const seldp_tensor *lt, void *shard, hx_shard s, bool to_logical);
/* out (numel of the shard) = the slice of `full` (the logical tensor of shape `shape`). */
void hx_shard_slice(const double *full, const seldp_tensor *logical, hx_shard s, double *out);

#endif
