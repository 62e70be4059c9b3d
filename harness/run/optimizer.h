/* The update of the step (docs/harness.md, Optimizers): SGD or AdamW on every trainable
 * parameter that has a reduced gradient, and the post-step check of every rank's update
 * against the FP64 step of the same gradient from the same state.
 *
 * Each rank keeps, per parameter (tm_param_at index), its optimizer state: FP32 master weights
 * for a half parameter under AdamW (or --fp32-master's), AdamW's exp_avg and exp_avg_sq, and the
 * number of updates the parameter received (AdamW's per-parameter step, as torch keeps it: an
 * expert no token reached is not updated). Every update also records what it started from: the
 * FP32 weights, the gradient it used (after clipping), the moments and the step count, which the
 * post-step check and the dumps read. */
#ifndef HX_OPTIMIZER_H
#define HX_OPTIMIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "seldp/seldp.h"
#include "tinymoe.h"

#include "options.h"
#include "util.h"

typedef struct hx_run hx_run;
typedef struct hx_rank hx_rank;

typedef struct hx_opt_param {
    float *master;  /* its own FP32 master (AdamW, half parameter, no --fp32-master) */
    float *exp_avg; /* AdamW's moments (numel), NULL under SGD */
    float *exp_avg_sq;
    int64_t steps; /* updates received */
    /* the last step: whether the parameter had a reduced gradient, and what the update began
     * from (numel each) */
    bool has_grad;
    bool updated;
    float *w0, *g, *m0, *v0;
    void *stored0; /* the stored parameter's bytes before the update */
    bool snap;     /* stored0 holds this step's (every parameter under --zero 1) */
    int64_t steps0;
} hx_opt_param;

typedef struct hx_opt {
    hx_opt_param *p; /* [n_params] */
    size_t n;
    bool skipped;      /* the last step's update was skipped (a non-finite gradient norm, or
                          loss scaling's found_inf) */
    double loss_scale; /* the S the last step's gradients carried (1 without --loss-scale) */
} hx_opt;

/* The optimizer against the transport (a usage error, one line): AdamW's --save needs every
 * rank in one process. AdamW's hyperparameters and lr * weight decay: options_check.c. */
seldp_status hx_opt_check(const hx_run *run);

/* Rank rk's update after the step's checks: --clip-grad's clipping, then SGD or AdamW on every
 * trainable parameter with a reduced gradient (on the host model; a GPU rank's mirror is
 * uploaded after). */
seldp_status hx_opt_update(hx_rank *rk);

/* Whether a trainable parameter of `dtype` has FP32 master weights (rk->master): --fp32-master,
 * or AdamW on a half parameter. */
bool hx_opt_keeps_master(const hx_options *o, seldp_dtype dtype);

/* AdamW's moments of occurrence i (allocated, zero, when new); false for a parameter without
 * them (SGD, frozen, the tied alias). */
bool hx_opt_moments(hx_rank *rk, size_t i, float **exp_avg, float **exp_avg_sq);

/* A resumed parameter's step count. */
void hx_opt_set_steps(hx_rank *rk, size_t i, int64_t steps);

/* index.json's training fields of the optimizer (checkpoint.c): `, "optimizer": name`, under
 * `"optimizer_steps": {logical path: count}` (the parameters' update counts), with --loss-scale
 * `"loss_scale"` and
 * `"loss_scale_good"` (the next step's). */
void hx_opt_ckpt_json(const hx_run *run, hx_buf *b);

/* rk->opt, created at the first update. */
seldp_status hx_opt_ensure(hx_rank *rk);

/* Elements [off, off + cnt) of occurrence i updated from the gradient values g (cnt floats):
 * the whole parameter or, under --zero 1, a piece of the rank's range (zero.c). Records the
 * state before the update. With `out` the updated FP32 values go there (the range the
 * all-gather sends) and the stored parameter is not written; else it is the update rounded to
 * its dtype. Nothing changes when skip. */
seldp_status hx_opt_update_elements(hx_rank *rk, size_t i, size_t off, size_t cnt, const float *g,
                                    bool skip, float *out);

/* Keep the stored bytes of occurrence i before the step's update (for the dump's param/): every
 * parameter under --zero 1, whose all-gather writes those the rank does not update itself. */
seldp_status hx_opt_snapshot(hx_rank *rk, size_t i);

/* The FP32 weights a rank holds for occurrence i after its last update (its master, or the
 * stored parameter upcast) into out (numel floats). */
void hx_opt_weights(const hx_rank *rk, size_t i, float *out);

/* The main thread, after the ranks' update of `step`: every rank's updated weights and state
 * against the FP64 update of its recorded start and gradient (optimizer_check.c); the ranks are
 * threads of this process. */
void hx_opt_check_step(hx_run *run, int step);

/* The same with one rank per process, collective over the world: each process checks its own
 * rank's updates, rank 0 gathers and merges the results (hx_gather_update). */
seldp_status hx_opt_check_process(hx_run *run, hx_rank *rk, int step);

/* The FP64 update of one element (the post-step check's): its step t (1-based), gradient g
 * (of the loss, unscaled, after clipping), weight w0 and AdamW moments m0, v0 before the step;
 * *w the updated weight and *bound the bound of the FP32 update's error (docs/tolerances.md,
 * The update). */
void hx_opt_expected(const hx_options *o, int64_t t, double g, double w0, double m0, double v0,
                     double *w, double *bound);

/* The dump (docs/formats.md, Dumps; optimizer_dump.c): the bytes of occurrence i as the step's
 * forward used them (before the update, in a post-step dump), and what the update adds to rank
 * rk's file (the dump is written after the update): `param_next/{path}`, `opt/{path}/exp_avg`,
 * `opt/{path}/exp_avg_sq` and `opt/{path}/master` before the step, and the `optimizer` metadata
 * (name, hyperparameters, whether the step was skipped, each parameter's step count before the
 * step). */
const void *hx_opt_param_before(const hx_run *run, const hx_rank *rk, size_t i);
struct hx_st_writer;
seldp_status hx_opt_dump(const hx_run *run, const hx_rank *rk, struct hx_st_writer *w);

void hx_opt_destroy(hx_opt *opt);

#endif
