/* The records of a sweep (sweep.c fills them) and its reports: sweep.json, sweep.md and the
 * gnuplot plot of the loss curves and the largest deviation per step. */
#ifndef HX_SWEEP_REPORT_H
#define HX_SWEEP_REPORT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "options.h"

#define HX_SWEEP_MAX_ARGS 48 /* option words one run of a sweep adds */

/* One run of the sweep: the options it adds to the command line's. */
typedef struct hx_sweep_entry {
    char label[128];
    char *args[HX_SWEEP_MAX_ARGS]; /* owned: "--world", "8", ... */
    int n_args;
    int line, column; /* of its object in the sweep file; 0 for a preset */
    hx_options opts;  /* the command line's options with the entry's on top */
    char order[64];   /* the order as the run builds its groups: ep-dp, dp-ep, a Megatron order */
    char objective[128]; /* the router losses and capacity that define its objective */
    int baseline;        /* the run it is compared with: the first with the same objective */
} hx_sweep_entry;

/* The final logical weights of a run: every trainable tensor, as F32. */
typedef struct hx_sweep_weights {
    size_t n;
    char **paths;
    float **values;
    size_t *numel;
} hx_sweep_weights;

typedef struct hx_sweep_result {
    bool completed;
    bool checks_passed;
    int64_t failures;
    int steps;
    /* the verdict: in lockstep with the run compared with (lockstep.h), each step from its
     * weights; ratios to the bounds of the tolerance model, NAN where not compared */
    bool lockstep;      /* compared so (same dtype and master weights as that run) */
    double *lock_ratio; /* [steps] the worst of the loss, gradient and update ratios */
    double lock_loss, lock_grads, lock_update; /* the worst over the steps */
    int lock_worst_step;                       /* 0-based */
    char lock_worst[128];
    int ties; /* steps whose gradients were compared with the reference only: a near tie */
    /* information: the same layout running free, its curve against the first run's */
    double *loss;     /* [steps] */
    double *loss_dev; /* [steps] relative to the first run's */
    double max_loss_dev;
    double weight_dev;
    char worst_tensor[128];
    double tolerance; /* the dtype's relative limit the free-running curves are shown against */
    bool agrees;      /* the lockstep comparisons all within their bounds */
    double seconds;
    double objective_dev; /* a run of another objective than run 1's: its largest relative loss
                           * difference from run 1 (reported, not a deviation); else 0 */
    char diagnosis[1024];
    char error[1024];
} hx_sweep_result;

typedef struct hx_sweep {
    const char *name; /* the file or preset */
    const char *out_dir;
    hx_sweep_entry *entries;
    int n;
    hx_sweep_result *results;
    hx_sweep_weights *baselines; /* [n]: the final weights of each baseline run */
    struct hx_lockstep **locks;  /* [n]: what each baseline run recorded (lockstep.h) */
} hx_sweep;

/* Run entry i of the sweep (sweep_run.c): the first run of its objective free, recording the
 * lockstep; any other in lockstep with it, then free; progress on `out` (NULL: none). */
void hx_sweep_run(hx_sweep *s, int i, FILE *out);
void hx_sweep_weights_free(hx_sweep_weights *w);

/* True when the run completed, passed its own checks and agrees with the first run. */
bool hx_sweep_run_ok(const hx_sweep_result *r);

/* The largest relative loss deviation of any free-running run from the first at step k
 * (0-based), and the largest lockstep ratio to its bound there. */
double hx_sweep_step_deviation(const hx_sweep *s, int k);
double hx_sweep_step_ratio(const hx_sweep *s, int k);

/* Write sweep.dat, sweep.gp, sweep.png (when gnuplot is installed), sweep.json and sweep.md
 * into s->out_dir. `pass`: the sweep's result. SELDP_ERR_IO naming the file on failure. */
seldp_status hx_sweep_write(const hx_sweep *s, bool pass);

/* The largest ||w - w0|| / ||w0|| over the tensors of w, and in `worst` its path; INFINITY
 * (and the path) when a tensor of w is absent from w0 or has another size. */
double hx_sweep_weights_deviation(const hx_sweep_weights *w0, const hx_sweep_weights *w,
                                  char *worst, size_t size);

#endif
