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
 *   update    ||w' - w0'|| <= lr (B_g + B_g0) + ulp(w0') per tensor: the weights each run's
 *             step produced from the same start.
 * A free-running curve parts from the first run's with no bug at all (a top-K flip at one step
 * moves every later loss); sweeps report those as information only. */
#ifndef HX_LOCKSTEP_H
#define HX_LOCKSTEP_H

#include <stdbool.h>
#include <stddef.h>

#include "seldp/status.h"

struct hx_run;
struct hx_rank;

/* One logical tensor of a step. */
typedef struct hx_lock_tensor {
    char path[128];
    size_t n;
    float *w;     /* the weights the step started from (FP32 masters where the run keeps them) */
    float *g;     /* the logical reduced gradient; NULL where the run reduced none */
    double bound; /* the reduced gradient's bound (tolerance model) */
} hx_lock_tensor;

typedef struct hx_lock_step {
    int n;
    hx_lock_tensor *t;
    double loss, loss_bound;
    bool tie; /* the step followed a near tie of the router */
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
