/* One harness run: the rank threads and the step of docs/harness.md, the checks, the records that
 * reports are made of.
 *
 * hx_run_create validates the options and the layout (an error there is a usage error);
 * hx_run_execute starts one thread per rank and drives them through phases:
 *
 *   ranks:  join world, split groups, build model, initialize sessions  | gate
 *   main:   check the replicas after initialize                        | gate
 *   per step:
 *   ranks:  draw tokens, forward (dispatch by alltoallv), backward, reduce | gate
 *   main:   FP64 reference, checks, progress line, dump (last step)        | gate
 *   ranks:  SGD update
 *
 * Under mpirun each process runs one rank through the same phases on its main thread; in
 * place of the gate, rank 0 gathers mirrors of the other ranks (gather.c) and plays the
 * main thread's part, and after each step every process learns whether all could go on.
 * A rank computes on the host or on a GPU (its model's tm_compute_ops); the host model stays
 * its record.
 *
 * Checks never stop a run: every step runs and every failure is counted. A rank that fails
 * (a library error) aborts the world so every rank returns instead of hanging; the run
 * then reports that rank's error. */
#ifndef HX_RUN_H
#define HX_RUN_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "seldp/seldp.h"
#include "tinymoe.h"

#include "backend.h"
#include "bounds.h"
#include "checks.h"
#include "diag_fit.h"
#include "layout.h"
#include "options.h"
#include "replica_sets.h"
#include "timing.h"

typedef struct hx_step_record {
    size_t tokens;
    double loss;     /* the ranks' loss sums over the global token count */
    double ref_loss; /* the FP64 reference */
    double worst;    /* worst relative gradient error of the step */
    char worst_path[128];
    int worst_rank;
    double ratio; /* worst error-to-bound ratio of its gradient checks (1 or less passes) */
    char ratio_path[128];
    int ratio_rank;
    const char *ratio_check; /* which check it was measured by */
    double norm_bound2;      /* the square of the bound of the global gradient norm's error */
    double loss_bound;       /* the loss check's bound */
    int64_t failures;        /* failed checks in this step */
    int absent;              /* (layer, expert) pairs no token reached */
    size_t ties_followed;    /* tokens x layers whose near tie the reference took as routed */
    size_t dropped;          /* assignments the capacity dropped (the reference's count) */
    bool diverged;           /* left unchecked: the run had left its dtypes' range (diverge.h) */
    double t_step;           /* wall time of the step, checks included */
    double t_compute;        /* slowest rank: forward + backward, dispatch included */
    double t_dispatch;
    double t_reduce; /* slowest rank */
    double t_reference;
    double t_check;
    hx_step_split split; /* the step's wall time by phase (timing.h) */
} hx_step_record;

typedef struct hx_rank hx_rank;

typedef struct hx_run {
    hx_options opts;
    hx_layout *layout;
    hx_backend *backend;
    seldp_dtype grad_dtype;     /* dtype of the reduced gradients */
    double tolerance;           /* the fixed relative limit of grad_dtype (1e-5 F32, 2e-3 F16, 1e-2
                                   BF16) for what no tolerance model covers: free-running curves */
    hx_tolerance tol;           /* the checks' tolerance model (bounds.h) */
    struct hx_capture *capture; /* [sets.n] the reductions' inputs this step (capture.h) */
    struct hx_lockstep *lockstep; /* a sweep's lockstep (lockstep.h), borrowed; NULL: free run */
    FILE *out;                    /* progress and tables (NULL when quiet) */

    hx_rank *ranks;   /* [world] */
    tm_model *global; /* every expert: the weights the reference reads */

    hx_sets sets; /* the replica sets (sets.h) */

    hx_check_result checks[HX_CHECK_COUNT];
    hx_error_stat classes[HX_CLASS_COUNT];
    hx_error_stat *set_errors; /* [sets.n]: the gradient error of each replica set */
    hx_step_record *steps;     /* [opts.steps] */
    int steps_done;
    int64_t *expert_tokens; /* [L * E] tokens routed to each expert over the whole run */
    uint64_t *set_weights;  /* [sets.n] last step's global weight of each set (the manifest) */
    double t_begin;
    double t_setup;
    double t_init;
    double t_total;

    /* a run that could not finish: the first failing rank's message */
    seldp_status status;
    char error[1024];

    /* the first step (1-based; 0: none) whose loss or reference gradient left the range of
     * the dtypes the model computes in, and why (diverge.h) */
    int diverged_step;
    char diverged_why[256];

    /* the likely cause of the first failed gradient check (diagnose.c); "" when none */
    char diagnosis[1024];
    hx_diag_fit diag[HX_DIAG_CLASSES]; /* this step's, for it */

    bool absent_planted; /* --inject absent found an expert no token reached to plant it on */

    /* one rank per process: the failed checks rank 0 counted (every rank learns them) */
    int64_t root_failures;

    /* checkpoints (checkpoint.h) */
    struct hx_ckpt *resume; /* --resume: the checkpoint the ranks load */
    int first_step;         /* 0-based: the first step this run trains (the checkpoint's step) */
    int ckpt_generation;    /* --save: the generation of the next save's shard names */

    /* --loss-scale: the scale of the step the main thread checks, and whether it overflowed */
    double loss_scale;
    bool overflow;

    /* the ranks whose tokens form the global batch once (every rank, or the stage-0 ranks of
     * a pipelined run), ascending */
    int n_batch;
    int *batch_ranks;

    /* phase gate shared by the rank threads and the main thread */
    pthread_mutex_t gate_lock;
    pthread_cond_t gate_cond;
    int gate_arrived;
    unsigned gate_generation;
    bool gate_broken;
} hx_run;

/* True in the process that prints, checks and writes the reports: the only one in-process,
 * rank 0's with one rank per MPI process. */
bool hx_run_is_root(const hx_run *run);

/* True when the run completed and no check failed. */
bool hx_run_passed(const hx_run *run);

/* Total failed checks. */
int64_t hx_run_failures(const hx_run *run);

/* Record one outcome of check `id`: `failed` with a printf-style description of the first
 * failure. `value` updates `worst` for metric checks. */
HX_PRINTF(5, 6)
void hx_check_record(hx_run *run, hx_check_id id, bool failed, double value, const char *fmt, ...);

/* Record one outcome of metric check `id`: its error-to-bound ratio (1 or less passes), the
 * relative bound and the resolution of the tensor it was measured on. */
HX_PRINTF(7, 8)
void hx_check_metric(hx_run *run, hx_check_id id, bool failed, double ratio, double bound,
                     double resolution, const char *fmt, ...);

/* The step's micro-batches (--micro-batches, at least 1). */
int hx_micro_count(const hx_run *run);

#endif
