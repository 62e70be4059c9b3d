/* Gradient accumulation over micro-batches (microbatch.h, docs/harness.md, The training step). */
#define _POSIX_C_SOURCE 200809L

#include "microbatch.h"
#include "overlap.h"

#include <stdlib.h>
#include <string.h>

#include "grid.h"
#include "pipeline.h"
#include "run.h"
#include "rank.h"
#include "dispatch.h"

size_t hx_micro_size(size_t T, int M, int m)
{
    return T / (size_t)M + ((size_t)m < T % (size_t)M ? 1 : 0);
}

size_t hx_micro_offset(size_t T, int M, int m)
{
    size_t extra = T % (size_t)M, before = (size_t)m < extra ? (size_t)m : extra;
    return (size_t)m * (T / (size_t)M) + before;
}

seldp_status hx_micro_check(const hx_run *run)
{
    const hx_options *o = &run->opts;
    int M = o->micro_batches;
    seldp_status st = hx_pipe_check(run);
    if (st != SELDP_OK || M <= 1)
        return st;
    if (o->overlap && hx_pipe_stages(run) > 1)
        return hx_fail(SELDP_ERR_INVALID_ARGUMENT,
                       "--micro-batches %d with --overlap: needs one pipeline stage (the "
                       "overlapped reductions start in the last micro-batch's forward, after the "
                       "world's tokens per expert, which the stages of a pipeline agree on only "
                       "after the schedule)",
                       M);
    for (int r = 0; r < o->world; r++)
        if (hx_backend_device(run->backend, r).kind == SELDP_DEVICE_CUDA)
            return hx_fail(SELDP_ERR_UNSUPPORTED,
                           "--micro-batches %d: rank %d computes on %s, whose model cannot "
                           "accumulate micro-batches; run on the host (--backend host)",
                           M, r, hx_backend_device_name(run->backend, r));
    return SELDP_OK;
}

/* The factor of micro-batch m's router losses in the loss sum: the step's objective weights
 * them 1/M, its token losses N_m / N, and the model's loss sum counts the token losses once
 * (docs/model.md, Micro-batches). */
static double router_scale(const hx_rank *rk, uint64_t N, int M, uint64_t Nm)
{
    /* --inject aux-microbatch (NeMo Automodel #1408): the router losses of every micro-batch
     * counted whole, never divided by the number of micro-batches */
    if (rk->run->opts.inject == HX_FAULT_AUX_MICROBATCH)
        M = 1;
    return Nm > 0 ? (double)N / ((double)M * (double)Nm) : 1.0;
}

/* A rank's step of M micro-batches: the step's token view, each micro-batch's counts (over the
 * world, known to every rank before the schedule starts, so that no count is agreed between
 * stages while they run different micro-batches), and the passes in flight. */
typedef struct micro_step {
    hx_rank *rk;
    int M, W, in_flight;
    int32_t *tokens, *targets;
    size_t T;
    uint64_t N;
    uint64_t *counts;       /* [W] the step's */
    uint64_t *micro_counts; /* [M * W] micro-batch m's of every rank */
    uint64_t *micro_tokens; /* [M] N_m, the micro-batch's global tokens */
    hx_pass **passes; /* [M] made at the first transfer or the forward, freed after the backward */
    int *choices;     /* (L,T,K) the step's, micro-batch by micro-batch */
    int64_t *routed;  /* [L * E] this rank's slots per expert over the micro-batches */
    double loss;
} micro_step;

/* The rank's view of micro-batch m: its tokens, targets and counts, and the model's cache set. */
static seldp_status view_micro(micro_step *ms, int m)
{
    hx_rank *rk = ms->rk;
    size_t off = hx_micro_offset(ms->T, ms->M, m);
    rk->tokens = ms->tokens + off;
    rk->targets = ms->targets + off;
    rk->T = hx_micro_size(ms->T, ms->M, m);
    memcpy(rk->counts, ms->micro_counts + (size_t)m * (size_t)ms->W,
           (size_t)ms->W * sizeof *rk->counts);
    rk->global_tokens = ms->micro_tokens[m];
    rk->micro = m;
    seldp_status st = rk->ops->use_caches(rk->compute, m % ms->in_flight);
    if (st != SELDP_OK)
        return hx_fail_lib(st, "rank %d: micro-batch %d: its activation caches", rk->rank, m + 1);
    return SELDP_OK;
}

/* Micro-batch m's pass, made on first use. */
static seldp_status pass_of(micro_step *ms, int m, hx_pass **out)
{
    seldp_status st = SELDP_OK;
    if (!ms->passes[m]) {
        st = view_micro(ms, m);
        if (st == SELDP_OK)
            st = hx_pass_create(ms->rk, &ms->passes[m]);
    }
    *out = ms->passes[m];
    return st;
}

/* The step's token counts (every weight and scale of the reduction is the step's), the
 * micro-batch's tokens and targets left in view. */
static void step_counts(micro_step *ms)
{
    hx_rank *rk = ms->rk;
    rk->T = ms->T;
    memcpy(rk->counts, ms->counts, (size_t)ms->W * sizeof *ms->counts);
    rk->global_tokens = ms->N;
}

/* --overlap: in the last micro-batch's forward, after its layers (every forward of the stage's
 * only stage has run): the world's tokens per expert of the step, and the start of the
 * overlapped reductions with the step's weights; the head then marks its gradients ready. */
static seldp_status overlap_begin(micro_step *ms)
{
    hx_rank *rk = ms->rk;
    size_t LE = (size_t)rk->run->opts.model.layers * (size_t)rk->run->layout->experts;
    seldp_status st =
        seldp_comm_allreduce(rk->world, ms->routed, rk->routed, LE, SELDP_I64, SELDP_HOST_DEVICE);
    if (st != SELDP_OK)
        return hx_fail_lib(st, "rank %d: allreduce of tokens per expert", rk->rank);
    /* the head reads the micro-batch's targets only: its gradients go out with the step's
     * counts, which stay until the head is done */
    step_counts(ms);
    st = hx_overlap_begin(rk);
    rk->overlap_live = st == SELDP_OK;
    return st;
}

static seldp_status micro_forward(micro_step *ms, int m)
{
    seldp_status st = SELDP_OK;
    hx_rank *rk = ms->rk;
    const tm_config *cfg = &rk->run->opts.model;
    const size_t L = (size_t)cfg->layers, K = (size_t)cfg->top_k;
    const size_t LE = L * (size_t)rk->run->layout->experts;
    hx_pass *p = NULL;
    HX_CHECK(pass_of(ms, m, &p));
    HX_CHECK(view_micro(ms, m));
    st = tm_model_set_router_scale(rk->model, router_scale(rk, ms->N, ms->M, ms->micro_tokens[m]));
    if (st != SELDP_OK)
        HX_FAIL_LIB(st, "rank %d: micro-batch %d", rk->rank, m + 1);
    HX_CHECK(hx_pass_embed(rk, p));
    HX_CHECK(hx_pass_layers(rk, p));
    for (size_t le = 0; le < LE; le++)
        ms->routed[le] += p->local_routed[le];
    if (rk->run->opts.overlap && m == ms->M - 1)
        HX_CHECK(overlap_begin(ms));
    HX_CHECK(hx_pass_head(rk, p));
    if (rk->overlap_live) {
        rk->overlap_live = false; /* the backwards before the last add to the accumulators */
        HX_CHECK(view_micro(ms, m));
    }
    ms->loss += p->loss_sum;
    memcpy(ms->choices + L * K * hx_micro_offset(ms->T, ms->M, m), p->choices,
           L * p->T * K * sizeof *ms->choices);
fail:
    return st;
}

static seldp_status micro_backward(micro_step *ms, int m)
{
    seldp_status st = SELDP_OK;
    hx_rank *rk = ms->rk;
    hx_pass *p = ms->passes[m];
    if (!p)
        HX_FAIL(SELDP_ERR_INTERNAL, "rank %d: backward of micro-batch %d before its forward",
                rk->rank, m + 1);
    HX_CHECK(view_micro(ms, m));
    if (rk->run->opts.overlap && m == ms->M - 1) {
        /* the last micro-batch's backward leaves each layer's gradients final: marked ready
         * as it goes, exported with the step's scales */
        step_counts(ms);
        rk->overlap_live = true;
    }
    HX_CHECK(hx_pass_backward(rk, p));
    HX_CHECK(hx_pass_embed_backward(rk, p));
    rk->overlap_live = false;
fail:
    return st;
}

/* One action of the stage's schedule (pipeline.h). */
static seldp_status micro_action(micro_step *ms, const hx_pipe_action *a)
{
    seldp_status st = SELDP_OK;
    hx_rank *rk = ms->rk;
    hx_pass *pa = NULL;
    /* a transfer's other passes exist: the plan runs each forward before its sends */
    switch (a->op) {
    case HX_PIPE_FORWARD:
        return micro_forward(ms, a->m);
    case HX_PIPE_BACKWARD:
        return micro_backward(ms, a->m);
    case HX_PIPE_RECV_ACT:
        HX_CHECK(pass_of(ms, a->m, &pa));
        return hx_pipe_recv_act(rk, pa);
    case HX_PIPE_RECV_ACT_SEND_GRAD:
        HX_CHECK(pass_of(ms, a->m, &pa));
        return hx_pipe_recv_act_send_grad(rk, pa, ms->passes[a->g]);
    case HX_PIPE_SEND_ACT:
        return hx_pipe_send_act(rk, ms->passes[a->m]);
    case HX_PIPE_RECV_GRAD:
        return hx_pipe_recv_grad(rk, ms->passes[a->m]);
    case HX_PIPE_SEND_GRAD:
        return hx_pipe_send_grad(rk, ms->passes[a->m]);
    case HX_PIPE_SEND_ACT_RECV_GRAD:
        return hx_pipe_send_act_recv_grad(rk, ms->passes[a->m], ms->passes[a->g]);
    }
fail:
    return st;
}

/* After the micro-batches: the step's token counts back in place (every weight and scale of
 * the reduction is the step's: the global token count over every micro-batch). */
static void step_totals(micro_step *ms)
{
    hx_rank *rk = ms->rk;
    rk->tokens = ms->tokens;
    rk->targets = ms->targets;
    rk->T = ms->T;
    memcpy(rk->counts, ms->counts, (size_t)ms->W * sizeof *ms->counts);
    rk->global_tokens = ms->N;
    rk->micro = 0;
}

seldp_status hx_micro_compute(hx_rank *rk)
{
    hx_run *run = rk->run;
    const int M = hx_micro_count(run);
    if (M == 1)
        return hx_rank_compute(rk);
    seldp_status st = SELDP_OK;
    const tm_config *cfg = &run->opts.model;
    const int W = run->opts.world;
    const size_t L = (size_t)cfg->layers, K = (size_t)cfg->top_k;
    const size_t LE = L * (size_t)run->layout->experts;
    const int P = hx_pipe_stages(run), stage = rk->grid ? rk->grid->stage : 0;
    rk->overlap_live = false;
    const hx_pipe_schedule schedule = hx_pipe_schedule_of(&run->opts);
    micro_step ms = {0};
    ms.rk = rk;
    ms.M = M;
    ms.W = W;
    ms.in_flight = hx_pipe_in_flight(schedule, P, M);
    ms.tokens = rk->tokens;
    ms.targets = rk->targets;
    ms.T = rk->T;
    ms.N = rk->global_tokens;
    hx_pipe_action *plan = hx_calloc(HX_PIPE_ACTIONS_MAX(M), sizeof *plan);
    ms.counts = hx_calloc((size_t)W, sizeof *ms.counts);
    ms.micro_counts = hx_calloc((size_t)M * (size_t)W, sizeof *ms.micro_counts);
    ms.micro_tokens = hx_calloc((size_t)M, sizeof *ms.micro_tokens);
    ms.passes = hx_calloc((size_t)M, sizeof *ms.passes);
    ms.choices = hx_calloc(L * ms.T * K + 1, sizeof *ms.choices);
    ms.routed = hx_calloc(LE + 1, sizeof *ms.routed);
    if (!plan || !ms.counts || !ms.micro_counts || !ms.micro_tokens || !ms.passes || !ms.choices ||
        !ms.routed) {
        st = hx_fail(SELDP_ERR_NOMEM, "rank %d: out of memory", rk->rank);
        goto out;
    }
    if (!rk->ops->use_caches) {
        st = hx_fail(SELDP_ERR_UNSUPPORTED,
                     "rank %d: --micro-batches %d: its model keeps one micro-batch's caches",
                     rk->rank, M);
        goto out;
    }
    memcpy(ms.counts, rk->counts, (size_t)W * sizeof *ms.counts);
    for (int m = 0; m < M; m++) {
        uint64_t *c = ms.micro_counts + (size_t)m * (size_t)W;
        for (int r = 0; r < W; r++)
            c[r] = hx_micro_size(ms.counts[r], M, m);
        for (int b = 0; b < run->n_batch; b++)
            ms.micro_tokens[m] += c[run->batch_ranks[b]];
    }
    rk->micro_last_tokens = ms.micro_tokens[M - 1];
    size_t n = hx_pipe_plan(schedule, stage, P, M, plan);
    for (size_t i = 0; i < n && st == SELDP_OK; i++) {
        st = micro_action(&ms, &plan[i]);
        /* a micro-batch whose backward ran and whose gradients left the stage is done */
        const hx_pipe_action *a = &plan[i];
        int done = a->op == HX_PIPE_SEND_GRAD                ? a->m
                   : a->op == HX_PIPE_RECV_ACT_SEND_GRAD     ? a->g
                   : a->op == HX_PIPE_BACKWARD && stage == 0 ? a->m
                                                             : -1;
        if (done >= 0) {
            hx_pass_free(rk, ms.passes[done]);
            ms.passes[done] = NULL;
        }
    }
    if (st != SELDP_OK)
        goto out;
    /* tokens per expert over the world, once for the step: every stage has made every
     * forward, and the counts of the micro-batches add up to the step's */
    st = seldp_comm_allreduce(rk->world, ms.routed, rk->routed, LE, SELDP_I64, SELDP_HOST_DEVICE);
    if (st != SELDP_OK) {
        st = hx_fail_lib(st, "rank %d: allreduce of tokens per expert", rk->rank);
        goto out;
    }
    rk->loss_sum = ms.loss;
    free(rk->choices);
    rk->choices = ms.choices;
    ms.choices = NULL;
out:
    if (ms.counts) {
        step_totals(&ms);
        if (rk->ops->use_caches)
            (void)rk->ops->use_caches(rk->compute, 0);
        (void)tm_model_set_router_scale(rk->model, 1.0);
    }
    for (int m = 0; ms.passes && m < M; m++)
        hx_pass_free(rk, ms.passes[m]);
    free(plan);
    free(ms.counts);
    free(ms.micro_counts);
    free(ms.micro_tokens);
    free(ms.passes);
    free(ms.choices);
    free(ms.routed);
    return st;
}

/* ---- the reference ----------------------------------------------------------------------- */

typedef struct view_save {
    int32_t *tokens, *targets;
    int *choices;
    size_t T;
} view_save;

/* Every rank's (or mirror's) tokens, targets and choices as those of micro-batch m. */
static void view_set(hx_run *run, int M, int m, view_save *save)
{
    const size_t LK = (size_t)run->opts.model.layers * (size_t)run->opts.model.top_k;
    for (int r = 0; r < run->opts.world; r++) {
        hx_rank *rk = &run->ranks[r];
        save[r] = (view_save){rk->tokens, rk->targets, rk->choices, rk->T};
        size_t off = hx_micro_offset(rk->T, M, m);
        rk->tokens += off;
        rk->targets += off;
        if (rk->choices)
            rk->choices += LK * off;
        rk->T = hx_micro_size(rk->T, M, m);
    }
}

static void view_restore(hx_run *run, const view_save *save)
{
    for (int r = 0; r < run->opts.world; r++) {
        hx_rank *rk = &run->ranks[r];
        rk->tokens = save[r].tokens;
        rk->targets = save[r].targets;
        rk->choices = save[r].choices;
        rk->T = save[r].T;
    }
}

/* Micro-batch m's data shards: the batch ranks' lists, or the shards' concatenations (TP x CP)
 * with the pipeline's merged choices. */
static seldp_status micro_inputs(hx_run *run, int **merged, hx_shard_batch *shards,
                                 const int32_t **tokens, const int32_t **targets,
                                 const int **choices, size_t *counts, tm_micro_batch *mb)
{
    seldp_status st = SELDP_OK;
    HX_CHECK(hx_grid_merge_choices(run, merged));
    int B = run->n_batch;
    for (int b = 0; b < B; b++) {
        hx_rank *rk = &run->ranks[run->batch_ranks[b]];
        tokens[b] = rk->tokens;
        targets[b] = rk->targets;
        choices[b] = *merged ? *merged + hx_grid_choices_offset(run, b) : rk->choices;
        counts[b] = rk->T;
    }
    /* data shards over several ranks: the reference's capacity and local statistics per shard */
    HX_CHECK(hx_grid_shard_batch(run, *merged, shards));
    for (int s = 0; s < shards->n; s++) {
        tokens[s] = shards->tokens[s];
        targets[s] = shards->targets[s];
        choices[s] = shards->choices[s];
        counts[s] = shards->counts[s];
    }
    *mb = (tm_micro_batch){tokens, targets, counts, shards->n ? shards->n : B, choices};
fail:
    return st;
}

seldp_status hx_micro_reference(hx_run *run, int step, tm_reference **out)
{
    return hx_micro_reference_of(run, step, &run->opts.model, out);
}

seldp_status hx_micro_reference_of(hx_run *run, int step, const tm_config *cfg, tm_reference **out)
{
    seldp_status st = SELDP_OK;
    const int M = hx_micro_count(run), W = run->opts.world;
    const size_t MW = (size_t)M * (size_t)W;
    view_save *save = hx_calloc((size_t)W, sizeof *save);
    int **merged = hx_calloc((size_t)M, sizeof *merged);
    hx_shard_batch *shards = hx_calloc((size_t)M, sizeof *shards);
    const int32_t **tokens = hx_calloc(MW, sizeof *tokens);
    const int32_t **targets = hx_calloc(MW, sizeof *targets);
    const int **choices = hx_calloc(MW, sizeof *choices);
    size_t *counts = hx_calloc(MW, sizeof *counts);
    tm_micro_batch *mb = hx_calloc((size_t)M, sizeof *mb);
    if (!save || !merged || !shards || !tokens || !targets || !choices || !counts || !mb)
        HX_FAIL(SELDP_ERR_NOMEM, "out of memory");
    for (int m = 0; m < M; m++) {
        size_t at = (size_t)m * (size_t)W;
        if (M > 1)
            view_set(run, M, m, save);
        st = micro_inputs(run, &merged[m], &shards[m], tokens + at, targets + at, choices + at,
                          counts + at, &mb[m]);
        if (M > 1)
            view_restore(run, save);
        if (st != SELDP_OK)
            goto fail;
    }
    HX_CHECK_LIB(tm_reference_compute_micro(cfg, tm_model_view(run->global), mb, M, out),
                 "the FP64 reference of step %d", step + 1);
fail:
    for (int m = 0; m < M; m++) {
        if (merged)
            free(merged[m]);
        if (shards)
            hx_shard_batch_free(&shards[m]);
    }
    free(save);
    free(merged);
    free(shards);
    free(tokens);
    free(targets);
    free(choices);
    free(counts);
    free(mb);
    return st;
}

void hx_micro_manifest(const hx_run *run, hx_buf *b)
{
    const int M = hx_micro_count(run);
    hx_buf_printf(b, "  \"micro_batches\": %d,\n  \"micro_batch_sizes\": [", M);
    for (int r = 0; r < run->opts.world; r++) {
        hx_buf_puts(b, r ? ", [" : "[");
        for (int m = 0; m < M; m++)
            hx_buf_printf(b, "%s%zu", m ? ", " : "", hx_micro_size(run->ranks[r].T, M, m));
        hx_buf_puts(b, "]");
    }
    hx_buf_puts(b, "],\n");
}
