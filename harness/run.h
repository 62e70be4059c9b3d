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
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "seldp/seldp.h"
#include "compute.h"
#include "tinymoe.h"

#include "backend.h"
#include "bounds.h"
#include "layout.h"
#include "options.h"
#include "sets.h"
#include "timing.h"

/* What the run checks (docs/harness.md). */
typedef enum hx_check_id {
    HX_CHECK_DIFFER_BEFORE_INIT, /* replicas differ before initialize (or the next is void) */
    HX_CHECK_INIT_REPLICAS,      /* after initialize every replica equals its root's values */
    HX_CHECK_INIT_UNTOUCHED,     /* initialize changes no parameter outside its selection */
    HX_CHECK_LOSS,               /* the ranks' mean loss equals the reference's */
    HX_CHECK_ROUTING,            /* tokens per expert equal the reference's */
    HX_CHECK_REDUCTION,          /* each reduced gradient vs the FP64 sum of its inputs */
    HX_CHECK_RANK_GRADS,         /* the ranks' FP32 gradients (before export) vs the reference */
    HX_CHECK_GRAD_ERROR,         /* reduced gradient vs the FP64 reference */
    HX_CHECK_GRAD_REPLICAS,      /* reduced gradients bit-identical over each group */
    HX_CHECK_PARAM_REPLICAS,     /* parameters bit-identical over each group, every step */
    HX_CHECK_REDUCE_UNTOUCHED,   /* a reduce leaves gradients outside its selection alone */
    HX_CHECK_ABSENT,             /* experts that no token reached have no gradient anywhere */
    HX_CHECK_GRAD_NORM,          /* --clip-grad: the global gradient norm vs the reference's */
    HX_CHECK_LOADED_REPLICAS,    /* --resume: every replica loaded its root's bytes */
    HX_CHECK_UPDATE, /* the post-step check: each update vs its FP64 step (optimizer.h) */
    HX_CHECK_COUNT
} hx_check_id;

typedef struct hx_check_result {
    int64_t tested;
    int64_t failed;
    bool metric;       /* worst/limit are meaningful (an error measure, not a bit comparison) */
    double worst;      /* largest error-to-bound ratio (a check passes at 1 or less) */
    double limit;      /* 1 */
    double bound;      /* the relative bound where the worst ratio was measured */
    double resolution; /* the largest (weakest) resolution over the tested tensors: the
                          smallest relative scale error the check would catch */
    char first_failure[400];
} hx_check_result;

/* Name of a check as the tables print it. */
const char *hx_check_name(hx_check_id id);

/* Tensor classes of tiny-moe, for per-class error tables. */
typedef enum hx_tensor_class {
    HX_CLASS_EMBED,
    HX_CLASS_NORM,
    HX_CLASS_ROUTER,
    HX_CLASS_FINAL_NORM,
    HX_CLASS_EXPERT_W1,
    HX_CLASS_EXPERT_W2,
    HX_CLASS_LORA_A,
    HX_CLASS_LORA_B,
    HX_CLASS_SHARED_EXPERT,
    HX_CLASS_COUNT
} hx_tensor_class;

const char *hx_class_name(hx_tensor_class c);

/* The class of a trainable parameter path. */
hx_tensor_class hx_class_of(const char *path);

/* Worst errors over a set of tensors: the relative error, the error-to-bound ratio of the
 * reduced gradients and of the ranks' own (tolerance model), and the resolutions. */
typedef struct hx_error_stat {
    int64_t tensors;
    double worst; /* relative error ||g - ref|| / ||ref|| (information) */
    char worst_path[128];
    int worst_rank;
    int worst_step;
    double ratio;            /* error / bound of the reduced gradients */
    double resolution;       /* their check's largest resolution */
    double model_ratio;      /* error / bound of the ranks' gradients before export */
    double model_resolution; /* its check's largest resolution */
} hx_error_stat;

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

/* What a step's checks saw of one class of tensors, for the diagnosis (diagnose.c): the sums
 * of <g,ref>, <ref,ref>, <g,g>, <g-ref,g-ref> over every rank's reduced gradients, and which
 * checks failed on a tensor of the class. */
typedef enum hx_diag_class {
    HX_DIAG_EXPERT,
    HX_DIAG_EMBED,
    HX_DIAG_ROUTER,
    HX_DIAG_SHARED,
    HX_DIAG_SHARED_EXPERT,
    HX_DIAG_CLASSES
} hx_diag_class;

typedef struct hx_diag_fit {
    double gr, rr, gg, dd;
    int64_t tensors;
    bool reduction_failed; /* a result is not the mean or sum of its inputs */
    bool model_failed;     /* the ranks' own FP32 gradients are off the reference */
    bool result_failed;    /* a reduced gradient is off the reference */
    double ratio;          /* the largest result-to-input ratio where the reduction failed */
    double mdd, mrr;       /* the ranks' FP32 gradients: ||g - ref||^2 and ||ref||^2 */
} hx_diag_fit;

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

/* Validate the options (model config, layout) and prepare a run. A failure here is a usage
 * error: SELDP_ERR_INVALID_ARGUMENT or _PARSE or _UNSUPPORTED, hx_last_error one line. */
seldp_status hx_run_create(const hx_options *opts, hx_run **out);

/* Run every step. Progress and tables go to `out` (NULL: nothing). Returns SELDP_OK when the
 * run completed, whatever the checks found (see hx_run_passed); otherwise the status of the
 * failure, with run->error naming the rank. */
seldp_status hx_run_execute(hx_run *run, FILE *out);

/* True in the process that prints, checks and writes the reports: the only one in-process,
 * rank 0's with one rank per MPI process. */
bool hx_run_is_root(const hx_run *run);

/* True when the run completed and no check failed. */
bool hx_run_passed(const hx_run *run);

/* Total failed checks. */
int64_t hx_run_failures(const hx_run *run);

void hx_run_destroy(hx_run *run);

/* ---- used by checks.c, report.c and dump.c ----------------------------------------------- */

struct tmc_model;

/* What the main thread may read of a rank between phases. */
struct hx_rank {
    int rank;
    hx_run *run;
    pthread_t thread;
    bool started;
    seldp_device device;       /* where the rank computes */
    const tm_compute_ops *ops; /* how (models/compute.h): tm_cpu_compute, or tmc_compute */
    void *compute;             /* the model ops compute with: `model`, or `gpu` on a GPU */
    struct tmc_model *gpu;     /* on a GPU: the device mirror of `model` (gpu.c) */
    seldp_grads *device_grads; /* on a GPU: the gradients the sessions reduce */
    seldp_comm *world;
    hx_rank_comms comms; /* its EP group */
    tm_model *model;
    hx_rank_set *sets; /* its replica sets in reduction order (sets.h) */
    int n_sets;

    /* parameter bytes before initialize, by tm_param_at index */
    void **pre_init;
    size_t n_params;
    float **master; /* FP32 master weights by tm_param_at index (--fp32-master) */

    /* this step */
    int32_t *tokens;
    int *choices; /* (L,T,K) the experts this step's router chose, before dropping (the
                     reference follows them at near ties) */
    int32_t *targets;
    size_t T;
    uint64_t *counts; /* [world] every rank's token count */
    uint64_t global_tokens;
    double loss_sum;
    int64_t *routed;    /* [L * E] tokens routed to each expert over the world (allreduced) */
    seldp_grads *grads; /* reduced gradients on the host (on a GPU: copies of device_grads) */
    double t_compute;
    double t_dispatch;
    double t_reduce;
    double grad_norm;           /* --clip-grad: seldp_grad_norm of the reduced gradients */
    uint64_t token_state;       /* --global-batch: the global token stream after this step */
    uint64_t saved_token_state; /* its value at the last save (read by the main thread) */

    struct hx_grid_rank *grid;  /* a sharded run's part of the grid (grid.h); NULL otherwise */
    struct hx_overlap *overlap; /* --overlap: this step's overlapped reductions (overlap.h) */
    bool overlap_live;      /* --overlap: the backward marks gradients ready (with micro-batches the
                               last micro-batch's only) */
    double lock_update;     /* lockstep: its last update's ratio to the bound (lockstep.c) */
    seldp_comm *shard_comm; /* its data shard's ranks when the shard spans several (TP x CP)
                               and capacity or the local load-balancing loss needs them */
    int batch_rank;         /* whose tokens this rank draws: itself, or its pipeline's
                               stage-0 rank */
    int micro;              /* the micro-batch hx_rank_compute runs (microbatch.h) */
    uint64_t micro_last_tokens;        /* the global tokens of the step's last micro-batch */
    struct hx_opt *opt;                /* its optimizer state and last update (optimizer.h) */
    struct hx_zero *zero;              /* --zero 1: its shard maps and ranges (zero.h) */
    int step;                          /* the step it runs (0-based) */
    double loss_scale;                 /* --loss-scale: this step's S (loss_scale.h); 1 without */
    int64_t scale_good;                /* steps since the last overflow or growth */
    bool found_inf;                    /* the world's found_inf of this step */
    bool found_inf_dense;              /* --inject found-inf-local: the dense optimizer's own */
    bool found_inf_expert;             /* --inject found-inf-local: the expert optimizer's own */
    int skip_changed[2], skip_seen[2]; /* a skipped step: [dense, expert] params that moved */
    bool overflow_planted;             /* --inject-overflow planted its inf this step */

    /* rank-local checks, merged by the main thread */
    hx_check_result init_untouched;
    hx_check_result reduce_untouched;
    hx_check_result update_check; /* the post-step check of its update (optimizer_check.c) */

    seldp_status status;
    char error[1024];
};

/* Forward and backward of rank rk's tokens this step, experts served by their owners over
 * alltoallv (dispatch.c); afterwards rk->routed holds the world's tokens per expert. */
seldp_status hx_rank_compute(hx_rank *rk);

/* Rank rk's share of its EP group's tokens in expert-data group d this step: the weight it
 * reduces with in the mean flow; 0 when it serves no row (dispatch.c). */
uint64_t hx_data_share(const hx_rank *rk, int d);

/* A rank on a GPU (gpu.c; without CUDA each returns SELDP_ERR_UNSUPPORTED). The host model
 * stays the rank's record: the checks, the gather, the dumps and the SGD update read and
 * write it, and these functions keep the device mirror in step with it. */
/* Mirror rk->model on rk->device (the calling thread's current device); the rank then
 * computes with the mirror (rk->ops, rk->compute). */
seldp_status hx_gpu_attach(hx_rank *rk);
void hx_gpu_detach(hx_rank *rk);
/* The device view the sessions initialize and reduce. */
seldp_model *hx_gpu_view(hx_rank *rk);
/* The device storage of the parameter at `path`. */
const seldp_tensor *hx_gpu_param(const hx_rank *rk, const char *path);
/* Device parameters into the host model, and back. */
seldp_status hx_gpu_download(hx_rank *rk);
seldp_status hx_gpu_upload(hx_rank *rk);
/* The FP32 gradient of p this step (numel floats) into host memory. */
seldp_status hx_gpu_local_grad(const hx_rank *rk, const tm_param_info *p, float *out);

/* Helpers shared by the rank phases (run.c, reduce.c, grid_*.c). */
void hx_tensor_to_f32(const seldp_tensor *t, float *out);
void hx_tensor_from_f32(const float *in, seldp_tensor *t);
HX_PRINTF(3, 4)
void hx_record_local(hx_check_result *c, bool failed, const char *fmt, ...);
/* Checksum of a tensor's bytes on the host or a GPU (read through a host copy). */
seldp_status hx_tensor_checksum(const hx_rank *rk, const seldp_tensor *t, uint64_t *sum);
/* The storage of parameter p where the rank computes (the device mirror's on a GPU). */
const seldp_tensor *hx_param_storage(const hx_rank *rk, const tm_param_info *p);

typedef enum hx_reduce_kind { HX_REDUCE_MEAN, HX_REDUCE_SUM } hx_reduce_kind;
/* One reduction of `grads` by session s (`label` names its group in messages), with the
 * check that gradients outside its selection come back as they were and that no parameter
 * moved (reduce.c). */
seldp_status hx_reduce_session(hx_rank *rk, seldp_session *s, const char *label,
                               hx_reduce_kind kind, uint64_t weight, seldp_grads *grads,
                               uint64_t *global_weight);
/* The finish of session s's overlapped reduction (started by overlap.c), with the checks of
 * hx_reduce_session; `params_before` is the parameters' checksum when it started. */
seldp_status hx_finish_session(hx_rank *rk, seldp_session *s, const char *label,
                               hx_reduce_kind kind, seldp_grads *grads, uint64_t params_before,
                               uint64_t *global_weight);
/* One checksum over every parameter's bytes where rank rk computes. */
seldp_status hx_params_checksum(const hx_rank *rk, uint64_t *sum);
/* Under the error policy: whether rank rk owes its set a zero gradient of p (an expert
 * parameter that rows reached elsewhere but not here), and putting it into grads when absent. */
bool hx_zero_owed(const hx_rank *rk, const tm_param_info *p);
seldp_status hx_zero_grad(hx_rank *rk, const tm_param_info *p, seldp_grads *grads);
/* Export the gradient of occurrence i (tm_param_at) into grads with the scale of its set, and
 * under the error policy the zeros it owes; nothing for a parameter no set reduces. */
seldp_status hx_export_grad(hx_rank *rk, size_t i, seldp_grads *grads);
/* Empty gradient containers of the step (rk->grads, and rk->device_grads on a GPU). */
seldp_status hx_reset_grads(hx_rank *rk);
/* Rank rk's setup before the first gate (rank_setup.c): its groups, model and sessions. */
seldp_status hx_rank_setup(hx_rank *rk);
/* Rank rk's tokens and targets of `step` (rank_setup.c). */
seldp_status hx_draw_tokens(hx_rank *rk, int step);

/* The step's reductions of rank rk into rk->grads; --inject's defects after them. */
seldp_status hx_rank_reduce(hx_rank *rk);
seldp_status hx_plant_fault(hx_rank *rk);

/* Console output (console.c). */
void hx_print_header(const hx_run *run, FILE *out);
void hx_print_init(const hx_run *run);
void hx_print_progress(const hx_run *run, int step, double t_step);

/* Main-thread checks (checks.c). */
void hx_check_init(hx_run *run);
seldp_status hx_check_step(hx_run *run, int step, const tm_reference *ref);

/* Record one outcome in `c` (the shared body of every recording function). */
void hx_check_vnote(hx_check_result *c, bool failed, double value, const char *fmt, va_list ap);

/* Record one outcome of check `id`: `failed` with a printf-style description of the first
 * failure. `value` updates `worst` for metric checks. */
HX_PRINTF(5, 6)
void hx_check_record(hx_run *run, hx_check_id id, bool failed, double value, const char *fmt, ...);

/* Ranks in several processes (gather.c), each collective over the world, called by every
 * rank `rk` this process runs, from its thread: rank 0 receives the parameters (before and
 * after initialize) of the ranks of the other processes, then after each step their
 * tokens, parameters, reduced gradients and rank-local results, into mirrors in
 * run->ranks. */
seldp_status hx_gather_init(hx_run *run, hx_rank *rk);
seldp_status hx_gather_step(hx_run *run, hx_rank *rk);
/* The same for the inputs each process passed to its reductions (capture.h), merged on
 * rank 0. */
seldp_status hx_gather_capture(hx_run *run, hx_rank *rk);
/* The post-step check's result of every rank (rk->update_check) on rank 0. */
seldp_status hx_gather_update(hx_run *run, hx_rank *rk);

/* Collective over the world: every process says how its part of a phase went (`mine`,
 * with hx_last_error when it failed); rank 0 also its failed checks (`failures`), which
 * every process stores in run->root_failures. Returns SELDP_OK when every process
 * succeeded, else the status of the lowest failing rank with its message. */
seldp_status hx_gather_verdict(hx_run *run, hx_rank *rk, seldp_status mine, int64_t failures);

/* Reports (report.c) and the dump (dump.c). */
void hx_report_print_checks(const hx_run *run, FILE *out);
seldp_status hx_report_write(const hx_run *run, const char *dir);
/* Append the run's row of the summary table to `path` (with the table's header when the
 * file is new or empty). `name` labels the row. */
seldp_status hx_report_append_summary(const hx_run *run, const char *name, const char *path);
/* The dump of `step`: the rank files of the ranks in this process; manifest.json from the
 * root process. */
seldp_status hx_dump_write(const hx_run *run, int step, const char *dir);

/* The config JSON (docs/formats.md, Config JSON; tm_config_json) appended to buf. */
void hx_config_json(const tm_config *cfg, hx_buf *buf);

#endif
