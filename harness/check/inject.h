/* Planted framework bugs (--inject, docs/harness.md, Planted bugs and Sweeps): the reduction
 * mistakes real frameworks shipped, planted where a framework makes them (the scale of the exported
 * gradients, the weights of the reductions, a second reduction), and the diagnosis that names them
 * from the gradients and the FP64 reference. */
#ifndef HX_INJECT_H
#define HX_INJECT_H

#include <stdbool.h>

#include <stddef.h>
#include <stdint.h>

#include "seldp/seldp.h"
#include "tinymoe.h"

#include "options.h"
#include "sets.h"
#include "util.h"

typedef struct hx_run hx_run;
typedef struct hx_rank hx_rank;

/* The smallest replica set on which --inject half-accum's roundings exceed an FP32
 * accumulation's bound (docs/harness.md, Planted bugs). */
#define HX_HALF_ACCUM_MIN_RANKS 3

/* True for the faults that are framework bugs (the rows of bugs.c). */
bool hx_inject_is_framework_bug(hx_fault fault);

/* Whether --inject can show on the run's layout: a fault whose effect is nil there (ep-scale
 * at EP size 1, rank-mean with equal token counts, ...) is refused, SELDP_ERR_INVALID_ARGUMENT
 * with one line naming what it needs, never run to a pass. */
seldp_status hx_inject_check(const hx_run *run);

/* One line: what the planted bug does, for the run's header. */
const char *hx_inject_describe(hx_fault fault);

/* Where the bugs are planted: the factor rank rk applies, on top of its set's own scale, to
 * the gradients it exports for set s, and the weight it reduces s with in place of `weight`
 * (1 and `weight` without a planted bug). */
double hx_inject_scale(const hx_rank *rk, const hx_set *s);
uint64_t hx_inject_weight(const hx_rank *rk, const hx_set *s, uint64_t weight);

/* After the reductions (rk->grads on the host): --inject tied-twice reduces the tied
 * embedding's gradient a second time, summed over the shared group as an embedding group
 * does. Collective over the shared group; a no-op for the other faults. */
seldp_status hx_inject_after_reduce(hx_rank *rk);

/* The grid's context-parallel, tensor-parallel and data-parallel sizes (1 without a grid). */
int hx_inject_cp(const hx_run *run);
int hx_inject_tp(const hx_run *run);
int hx_inject_dp(const hx_run *run);

/* After the rank's model exists: --inject aux-cp / aux-dp give the router losses' gradient
 * the scale the framework gave it (tm_set_router_loss_grad_scale). */
seldp_status hx_inject_rank_model(hx_rank *rk);

/* inject_reduce.c. After the export of occurrence p into grads, before its capture:
 * --inject shared-expert-tp sums the shared expert's exported gradient over the TP group, a
 * second time (collective over the TP group, in the export's order). */
seldp_status hx_inject_exported(hx_rank *rk, const tm_param_info *p, seldp_grads *grads);

/* Whether a planted bug replaces set rs's reduction (--inject half-accum: every set;
 * router-tp: the sequence-parallel set), and that reduction: half-accum accumulates in the
 * gradients' half dtype member after member; router-tp sums only the members of the rank's
 * own TP rank (the data-parallel group), divided by the set's whole weight as before.
 * Collective over the set. */
bool hx_inject_replaces_reduction(const hx_rank *rk, const hx_rank_set *rs);
seldp_status hx_inject_reduce(hx_rank *rk, hx_rank_set *rs, seldp_grads *grads);

/* inject_zero.c. --zero 1, after the reduce-scatter of set rs into `range` (this rank's range
 * of `map`, group rank `group_rank`), the exported gradients still in rk->grads: --inject
 * tied-zero replaces the embedding set's range by what Megatron's order gives, every stage's
 * data-parallel reduce-scatter before the embedding group's sum (Megatron-LM #844).
 * Collective over the set; a no-op for every other set and fault. */
seldp_status hx_inject_zero_emb(hx_rank *rk, const hx_rank_set *rs, seldp_shard_map *map,
                                int group_rank, float *range);

/* --inject norm-per-group: the global norm as the framework took it, each rank's norm of the
 * gradients it holds averaged over the world (collective over the world); and clipping by it,
 * *skip set when it is not finite. */
seldp_status hx_inject_norm(hx_rank *rk, seldp_grads *grads, double *norm);
seldp_status hx_inject_clip(hx_rank *rk, seldp_grads *grads, bool *skip);

#endif
