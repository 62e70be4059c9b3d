/* One rank of a run: what its thread owns and what the main thread may read of it between
 * phases (the phases: run.h). */
#ifndef HX_RANK_H
#define HX_RANK_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "seldp/seldp.h"
#include "compute.h"
#include "tinymoe.h"

#include "checks.h"
#include "layout.h"
#include "replica_sets.h"

typedef struct hx_run hx_run;
typedef struct hx_rank hx_rank;

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

#endif
