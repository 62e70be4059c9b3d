/* --zero 1: the distributed optimizer (docs/harness.md, The distributed optimizer): every replica
 * set (the dense groups and every expert-data group) reduce-scatters its gradients with the
 * library's sharded calls (seldp/shard.h), each rank updates its range of the master weights and
 * optimizer state, and the set all-gathers the updated ranges into every member's parameters.
 *
 * Each range is, bit for bit, the same elements of the FP32 all-reduce (reduce_fp32 / sum_fp32),
 * so the checks see the whole reduced gradient of every member: the main thread assembles it
 * from the members' ranges (hx_zero_assemble) into rk->grads, in F32, and checks it as an FP32
 * reduction's result. */
#ifndef HX_ZERO_H
#define HX_ZERO_H

#include <stdbool.h>

#include <stddef.h>
#include <stdint.h>

#include "seldp/seldp.h"
#include "tinymoe.h"

#include "util.h"

typedef struct hx_run hx_run;
typedef struct hx_rank hx_rank;

/* One replica set's sharded state on a rank (aligned with rk->sets). */
typedef struct hx_zero_set {
    seldp_shard_map *map;
    int group_rank;
    size_t begin, count; /* its range of the map's index space */
    size_t n_pieces;
    float *range;  /* [count] the reduce-scattered gradient (FP32) */
    bool *present; /* [n_pieces] */
    float *out;    /* [count] the updated range the all-gather sends */
} hx_zero_set;

typedef struct hx_zero {
    hx_zero_set *sets; /* [rk->n_sets] */
    int n;
} hx_zero;

/* --zero against the run (a usage error, one line): ranks as threads of one process, on the
 * host. The planted faults it refuses: options_check.c. */
seldp_status hx_zero_check(const hx_run *run);

/* --overlap: rank rk's maps and ranges, and the start of every set's overlapped reduce-scatter
 * into them (seldp_shard_reduce_scatter_start, _sum_start; the blocking step's weights); the
 * backward marks the gradients ready (overlap.c), hx_rank_reduce finishes them
 * (hx_overlap_finish) and hx_zero_reduce goes on from there. */
seldp_status hx_zero_start(hx_rank *rk);

/* Rank rk's reductions under --zero 1: every gradient exported as in the blocking flow (and
 * captured), every set reduce-scattered into its range; rk->grads left empty for the main
 * thread's assembly; --clip-grad's norm over the ranges. Under --overlap the caller has
 * finished the reduce-scatters first. t0: the phase's start (hx_now), for rk->t_reduce. */
seldp_status hx_zero_reduce(hx_rank *rk, double t0);

/* The main thread: every member's whole reduced gradient of every set from the members' ranges
 * (absent pieces absent), into a fresh rk->grads. After the update (--clip-grad scales the
 * ranges) it gives the gradients as the update used them, for the dump. */
seldp_status hx_zero_assemble(hx_run *run);

/* The elements [*lo, *hi) of occurrence i in rank rk's ranges (a parameter is one piece of a
 * rank's range at most): the elements its update owns; the whole parameter without --zero. */
void hx_zero_owned(const hx_rank *rk, size_t i, size_t *lo, size_t *hi);

/* Rank rk's update under --zero 1 (in place of hx_opt_update): --clip-grad over the ranges, the
 * optimizer on every present piece of its ranges, the all-gather of every set's range. */
seldp_status hx_zero_update(hx_rank *rk);

/* The main thread, before a checkpoint's writers write: every member's masters, moments and step
 * counts made whole from the owners of each range, so that a set's writer holds the logical
 * state (which a resume under any --zero and layout reads). With `records`: the same for what
 * the step's update began from (optimizer.h's records), before the dump. */
seldp_status hx_zero_consolidate(hx_run *run, bool records);

/* The dump's `shard_map` metadata of rank rk: per set its label, group rank, range and pieces. */
void hx_zero_dump_json(const hx_rank *rk, hx_buf *b);

void hx_zero_destroy(hx_zero *z);

#endif
