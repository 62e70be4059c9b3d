/* Gradient accumulation over micro-batches (microbatch.h, docs/harness.md, The training step). */
#define _POSIX_C_SOURCE 200809L

#include "microbatch.h"

#include <stdlib.h>
#include <string.h>

#include "grid.h"

int hx_micro_count(const hx_run *run)
{
    return run->opts.micro_batches > 1 ? run->opts.micro_batches : 1;
}

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
    if (M <= 1)
        return SELDP_OK;
    if (o->global_batch > 0 && o->global_batch % M != 0)
        return hx_fail(SELDP_ERR_INVALID_ARGUMENT,
                       "--micro-batches %d: must divide --global-batch %d (every micro-batch "
                       "takes N/M tokens of the step's stream)",
                       M, o->global_batch);
    if (o->overlap)
        return hx_fail(SELDP_ERR_INVALID_ARGUMENT,
                       "--micro-batches %d and --overlap exclude each other: the overlapped "
                       "reductions start in the backward, before the last micro-batch's",
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

/* After the micro-batches: the step's token counts back in place (every weight and scale of
 * the reduction is the step's: the global token count over every micro-batch). */
static void step_totals(hx_rank *rk, int32_t *tokens, int32_t *targets, size_t T,
                        const uint64_t *counts, uint64_t N)
{
    rk->tokens = tokens;
    rk->targets = targets;
    rk->T = T;
    memcpy(rk->counts, counts, (size_t)rk->run->opts.world * sizeof *counts);
    rk->global_tokens = N;
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
    int32_t *tokens = rk->tokens, *targets = rk->targets;
    const size_t T = rk->T;
    const uint64_t N = rk->global_tokens;
    uint64_t *counts = hx_calloc((size_t)W, sizeof *counts);
    int *choices = hx_calloc(L * T * K + 1, sizeof *choices);
    int64_t *routed = hx_calloc(LE + 1, sizeof *routed);
    double loss = 0.0;
    if (!counts || !choices || !routed) {
        st = hx_fail(SELDP_ERR_NOMEM, "rank %d: out of memory", rk->rank);
        goto out;
    }
    memcpy(counts, rk->counts, (size_t)W * sizeof *counts);
    for (int m = 0; m < M; m++) {
        size_t off = hx_micro_offset(T, M, m), n = hx_micro_size(T, M, m);
        rk->tokens = tokens + off;
        rk->targets = targets + off;
        rk->T = n;
        uint64_t Nm = 0;
        for (int r = 0; r < W; r++)
            rk->counts[r] = hx_micro_size(counts[r], M, m);
        for (int b = 0; b < run->n_batch; b++)
            Nm += rk->counts[run->batch_ranks[b]];
        rk->global_tokens = Nm;
        rk->micro = m;
        st = tm_model_set_router_scale(rk->model, router_scale(rk, N, M, Nm));
        rk->micro_last_tokens = Nm; /* the last micro-batch's, once the loop ends */
        if (st != SELDP_OK) {
            st = hx_fail_lib(st, "rank %d: micro-batch %d", rk->rank, m + 1);
            goto out;
        }
        st = hx_rank_compute(rk);
        if (st != SELDP_OK)
            goto out;
        loss += rk->loss_sum;
        for (size_t le = 0; le < LE; le++)
            routed[le] += rk->routed[le];
        if (rk->choices)
            memcpy(choices + L * K * off, rk->choices, L * n * K * sizeof *choices);
    }
    memcpy(rk->routed, routed, LE * sizeof *routed);
    rk->loss_sum = loss;
    free(rk->choices);
    rk->choices = choices;
    choices = NULL;
out:
    if (counts) {
        step_totals(rk, tokens, targets, T, counts, N);
        (void)tm_model_set_router_scale(rk->model, 1.0);
    }
    free(counts);
    free(choices);
    free(routed);
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
