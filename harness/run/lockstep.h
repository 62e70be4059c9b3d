/* Lockstep runs of a sweep (docs/harness.md, Sweeps): the first run of an objective runs free
 * and records, at every step, the logical weights it started from, its loss and its logical
 * reduced gradients with their bounds (the tolerance model's); every other run of the sweep
 * then starts each step from those same weights, so what it computes differs from the first
 * run's only by the rounding of another layout's reduction, and that difference is checked
 * against the two runs' bounds:
 *   loss      |l - l0| <= B_l + B_l0
 *   gradients ||g - g0|| <= B_g + B_g0 per logical tensor (both against the same reference),
 *             except at a step where either run followed a near tie of the router (the two
 *             precisions route such a token either way; each run is checked against its own
 *             reference there)
 *   update    SGD: ||w' - w0'|| <= lr (B_g + B_g0) + ulp(w0') per tensor: the weights each
 *             run's step produced from the same start. AdamW: the optimizer state is recorded
 *             and loaded with the weights (moments, step counts), and each element's
 *             difference w' - w0' must be the one the two gradients explain, the FP64 AdamW
 *             step of the same state from g minus from g0 (each times its run's clipping
 *             coefficient), within the two FP32 updates' bounds (the post-step check's) and
 *             the updates' sensitivity to one rounding of the gradient.
 * Under --loss-scale the follower takes each step's scale from the record; a step both runs
 * skipped (an overflow) compares no gradients and needs the weights unchanged; a step one run
 * skipped alone disagrees. Under --zero 1 the record's state is made whole from the ranges'
 * owners first (hx_zero_consolidate), and each rank compares the range it updates.
 * A free-running curve parts from the first run's with no bug at all (a top-K flip at one step
 * moves every later loss); sweeps report those as information only. */
#ifndef HX_LOCKSTEP_H
#define HX_LOCKSTEP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "seldp/status.h"

struct hx_run;
struct hx_rank;

/* One logical tensor of a step. */
typedef struct hx_lock_tensor {
    char path[128];
    size_t n;
    float *w;      /* the weights the step started from (FP32 masters where the run keeps them) */
    float *g;      /* the logical reduced gradient (of the loss: unscaled under --loss-scale);
                      NULL where the run reduced none */
    double bound;  /* the reduced gradient's bound (tolerance model) */
    float *m, *v;  /* AdamW: the moments the step started from (with w), else NULL */
    int64_t steps; /* AdamW: the tensor's update count before the step */
} hx_lock_tensor;

typedef struct hx_lock_step {
    int n;
    hx_lock_tensor *t;
    double loss, loss_bound;
    bool tie;          /* the step followed a near tie of the router */
    bool skipped;      /* --loss-scale: the step overflowed, every rank skipped its update */
    double loss_scale; /* the S the step's gradients carried (1 without --loss-scale) */
    double clip_coef;  /* --clip-grad: the coefficient its update scaled the gradients by */
    bool recorded;
} hx_lock_step;

/* What a lockstep comparison found, per step. */
typedef struct hx_lock_result {
    double loss;   /* |l - l0| / bound */
    double grads;  /* worst ||g - g0|| / bound over the tensors; NAN at a near tie */
    double update; /* worst ||w' - w0'|| / bound over the tensors and ranks */
    char worst[128];
} hx_lock_result;

typedef enum hx_lock_mode { HX_LOCK_RECORD, HX_LOCK_FOLLOW } hx_lock_mode;

typedef struct hx_lockstep {
    hx_lock_mode mode;
    int steps;
    double lr;
    hx_lock_step *record;   /* [steps + 1]: the first run's (the last: its final weights) */
    hx_lock_step *own;      /* [steps] FOLLOW: this run's gradients and bounds */
    hx_lock_result *result; /* [steps] FOLLOW */
} hx_lockstep;

/* A lockstep of `steps` steps in RECORD mode; hx_lockstep_follow switches a recorded one to
 * FOLLOW for the next run (its results cleared). */
seldp_status hx_lockstep_create(int steps, double lr, hx_lockstep **out);
void hx_lockstep_follow(hx_lockstep *l);
void hx_lockstep_destroy(hx_lockstep *l);

/* Main thread, after the checks of `step` (run->global holds the weights the step started
 * from): RECORD stores them, the loss and the logical reduced gradients with their bounds;
 * FOLLOW stores this run's and compares its loss and gradients with the record's. */
seldp_status hx_lockstep_step(struct hx_run *run, int step);

/* Main thread, after the last step: the final weights (RECORD), or the last update's
 * comparison (FOLLOW). */
seldp_status hx_lockstep_finish(struct hx_run *run);

/* Rank side, at the start of `step` under FOLLOW: compare the rank's parameters (what the
 * previous step's update produced) with the record's, then load the record's weights of
 * `step` into them (and into its FP32 masters). */
seldp_status hx_lockstep_load(struct hx_rank *rk, int step);

#endif
