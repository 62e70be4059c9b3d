/* A rank's setup (its groups, its model, the sessions initialized from their roots, with the
 * check that initialize writes only its selection; the values of a layout-independent or a
 * resumed run) and its tokens of each step. */
#define _POSIX_C_SOURCE 200809L

#include <stdlib.h>
#include <string.h>

#include "sets.h"
#include "set_rank.h"
#include "checkpoint.h"
#include "gpu_rank.h"
#include "grid.h"
#include "inject.h"
#include "optimizer.h"
#include "checks.h"
#include "rank.h"
#include "rank_setup.h"
#include "run.h"

/* ---- rank setup: groups, model, sessions ------------------------------------------------- */

/* ---- layout-independent runs and resumed runs ------------------------------------------- */

/* --global-batch: the logical model's values depend only on the seed. The root of each replica
 * set takes them (its slice of each logical tensor) before initialize broadcasts them (the
 * other replicas keep their rank-dependent values, so the broadcast is still tested): after
 * initialize every layout holds the same logical model. */
static seldp_status logical_values(hx_rank *rk)
{
    seldp_status st = SELDP_OK;
    const hx_run *run = rk->run;
    tm_model *logical = NULL;
    tm_config cfg = run->opts.model;
    uint64_t key = cfg.seed ^ tm_hash_path("harness.logical-model");
    cfg.seed = tm_splitmix64(&key);
    bool *roots = hx_calloc((size_t)cfg.experts, sizeof *roots);
    int *rooted = hx_calloc((size_t)cfg.experts, sizeof *rooted);
    int n = 0;
    if (!roots || !rooted)
        HX_FAIL(SELDP_ERR_NOMEM, "rank %d: out of memory", rk->rank);
    for (size_t i = 0; i < tm_param_count(rk->model); i++) {
        const tm_param_info *p = tm_param_at(rk->model, i);
        const hx_set *s = hx_set_of(run, rk->rank, p);
        if (s && s->root == rk->rank && p->expert >= 0)
            roots[p->expert] = true;
    }
    for (int e = 0; e < cfg.experts; e++)
        if (roots[e])
            rooted[n++] = e;
    HX_CHECK_LIB(tm_model_create(&cfg, 0, rooted, n, NULL, NULL, &logical),
                 "rank %d: creating the logical model's values", rk->rank);
    for (size_t i = 0; i < tm_param_count(rk->model); i++) {
        const tm_param_info *p = tm_param_at(rk->model, i);
        const hx_set *s = hx_set_of(run, rk->rank, p);
        if (!s || s->root != rk->rank)
            continue;
        const tm_param_info *q = tm_param_find(logical, hx_grid_logical_path(p->path));
        if (!q)
            HX_FAIL(SELDP_ERR_INTERNAL, "rank %d: no logical value of %s", rk->rank, p->path);
        hx_shard_copy(q->tensor.data, &q->tensor, p->tensor.data,
                      hx_grid_shard(run, rk->rank, p->path), false);
    }
fail:
    tm_model_destroy(logical);
    free(roots);
    free(rooted);
    return st;
}

/* The values a rank starts from: a checkpoint's (each rank reads the slices it holds), the
 * logical model's (--global-batch), or its own rank-dependent ones (docs/harness.md). */
static seldp_status rank_initial_values(hx_rank *rk)
{
    const hx_options *o = &rk->run->opts;
    if (o->global_batch > 0) {
        uint64_t key = o->model.seed ^ tm_hash_path("harness.global-tokens");
        rk->token_state =
            rk->run->resume ? hx_ckpt_token_state(rk->run->resume) : tm_splitmix64(&key);
    }
    if (rk->run->resume)
        return hx_ckpt_load_rank(rk->run->resume, rk, false);
    if (o->global_batch <= 0)
        return SELDP_OK;
    return logical_values(rk);
}

/* The data shard's communicator (docs/model.md, Routing extensions): its TP x CP ranks in token
 * order, where capacity or the local-scope load-balancing loss is counted over the shard. */
static seldp_status split_data_shard(hx_rank *rk)
{
    hx_run *run = rk->run;
    const tm_config *m = &run->opts.model;
    if (!run->layout->grid)
        return SELDP_OK;
    seldp_layout_config c = seldp_layout_get_config(run->layout->grid);
    bool local = m->aux_loss_coeff > 0 && m->aux_loss_scope == TM_AUX_LOCAL;
    if (c.tp * c.cp == 1 || !(m->capacity_factor > 0 || local))
        return SELDP_OK;
    int *ranks = hx_calloc((size_t)run->opts.world, sizeof *ranks);
    if (!ranks)
        return hx_fail(SELDP_ERR_NOMEM, "rank %d: out of memory", rk->rank);
    int n = hx_data_shard_of(run, rk->rank, ranks), lowest = ranks[0], pos = 0;
    for (int i = 0; i < n; i++) {
        lowest = ranks[i] < lowest ? ranks[i] : lowest;
        if (ranks[i] == rk->rank)
            pos = i;
    }
    free(ranks);
    seldp_status st = seldp_comm_split(rk->world, lowest, pos, &rk->shard_comm);
    if (st != SELDP_OK)
        return hx_fail_lib(st, "rank %d: building its data shard's group", rk->rank);
    return SELDP_OK;
}

seldp_status hx_rank_setup(hx_rank *rk)
{
    seldp_status st = SELDP_OK;
    hx_run *run = rk->run;
    const hx_layout *l = run->layout;
    int *owned = hx_calloc((size_t)l->experts, sizeof *owned);
    if (!owned)
        return SELDP_ERR_NOMEM;
    int n_owned = hx_layout_owned(l, rk->rank, owned);
    rk->device = hx_backend_device(run->backend, rk->rank);
    /* a rank thread works on its GPU from here on: NCCL joins on the current device */
    if (rk->device.kind == SELDP_DEVICE_CUDA)
        HX_CHECK(hx_gpu_select(rk->device.ordinal));
    HX_CHECK(hx_backend_join(run->backend, rk->rank, &rk->world));
    HX_CHECK(hx_layout_split(l, rk->world, &rk->comms));
    HX_CHECK(split_data_shard(rk));
    if (hx_grid_sharded(run))
        HX_CHECK(hx_grid_setup(rk)); /* its shards, the working model, the grid's groups */
    else
        HX_CHECK_LIB(
            tm_model_create(&run->opts.model, rk->rank, owned, n_owned, NULL, NULL, &rk->model),
            "rank %d: creating its model", rk->rank);
    HX_CHECK(hx_rank_sets_split(rk));
    HX_CHECK(rank_initial_values(rk));
    HX_CHECK(hx_inject_rank_model(rk)); /* a planted router-loss gradient scale */

    rk->n_params = tm_param_count(rk->model);
    rk->pre_init = hx_calloc(rk->n_params, sizeof *rk->pre_init);
    rk->counts = hx_calloc((size_t)run->opts.world, sizeof *rk->counts);
    rk->routed = hx_calloc((size_t)(run->opts.model.layers * l->experts), sizeof *rk->routed);
    if (!rk->pre_init || !rk->counts || !rk->routed)
        HX_FAIL(SELDP_ERR_NOMEM, "rank %d: out of memory", rk->rank);
    for (size_t i = 0; i < rk->n_params; i++) {
        const seldp_tensor *t = &tm_param_at(rk->model, i)->tensor;
        size_t bytes = seldp_tensor_nbytes(t);
        rk->pre_init[i] = hx_calloc(bytes ? bytes : 1, 1);
        if (!rk->pre_init[i])
            HX_FAIL(SELDP_ERR_NOMEM, "rank %d: out of memory", rk->rank);
        memcpy(rk->pre_init[i], t->data, bytes);
    }
    rk->ops = &tm_cpu_compute;
    rk->compute = rk->model;
    if (rk->device.kind == SELDP_DEVICE_CUDA)
        HX_CHECK(hx_gpu_attach(rk)); /* the rank computes with the mirror from here on */

    /* every rank initializes its sets in the run's order */
    HX_CHECK(hx_rank_sets_init(rk));
    if (rk->gpu)
        HX_CHECK(hx_gpu_download(rk));

    if (run->opts.inject == HX_FAULT_REPLICA && rk->rank == run->opts.world - 1) {
        const tm_param_info *p = tm_param_find(rk->model, "embed.weight");
        if (p)
            ((unsigned char *)p->tensor.data)[0] ^= 1;
        if (p && rk->gpu)
            HX_CHECK(hx_gpu_upload(rk));
    }

    /* FP32 masters: --fp32-master, or AdamW's of half parameters (optimizer.h) */
    if (run->opts.fp32_master || run->opts.optimizer == HX_OPT_ADAMW) {
        rk->master = hx_calloc(rk->n_params, sizeof *rk->master);
        if (!rk->master)
            HX_FAIL(SELDP_ERR_NOMEM, "rank %d: out of memory", rk->rank);
        for (size_t i = 0; i < rk->n_params; i++) {
            const tm_param_info *p = tm_param_at(rk->model, i);
            if (p->alias || p->frozen || !(p->role & TM_ROLES_TRAINABLE) ||
                !hx_opt_keeps_master(&run->opts, p->tensor.dtype))
                continue;
            rk->master[i] = hx_calloc(seldp_tensor_numel(&p->tensor), sizeof(float));
            if (!rk->master[i])
                HX_FAIL(SELDP_ERR_NOMEM, "rank %d: out of memory", rk->rank);
            hx_tensor_to_f32(&p->tensor, rk->master[i]);
        }
        if (run->resume)
            HX_CHECK(hx_ckpt_load_rank(run->resume, rk, true));
    }
    if (run->resume)
        HX_CHECK(hx_ckpt_load_moments(run->resume, rk));
fail:
    free(owned);
    return st;
}

/* ---- tokens ------------------------------------------------------------------------------ */

/* Rank r's tokens of step s: a count around --tokens (different on every rank), ids drawn
 * uniformly, each target the next id (a task SGD can learn, so the loss falls). */
static seldp_status draw_global_tokens(hx_rank *rk);

seldp_status hx_draw_tokens(hx_rank *rk, int step)
{
    if (rk->run->opts.global_batch > 0)
        return draw_global_tokens(rk);
    const hx_options *o = &rk->run->opts;
    uint64_t state = o->model.seed ^ tm_hash_path("harness.tokens");
    state += 0x9e3779b97f4a7c15ull * (uint64_t)(rk->batch_rank + 1);
    state ^= tm_splitmix64(&state) + (uint64_t)step * 0xbf58476d1ce4e5b9ull;
    int spread = hx_options_spread(o);
    long count = o->tokens;
    if (spread > 0)
        count += (long)(tm_splitmix64(&state) % (uint64_t)(2 * spread + 1)) - spread;
    if (count < 0)
        count = 0;
    /* the global objective needs at least one token in every micro-batch */
    long least = o->micro_batches > 1 ? o->micro_batches : 1;
    if (count < least && rk->batch_rank == 0)
        count = least;
    free(rk->tokens);
    free(rk->targets);
    rk->T = (size_t)count;
    rk->tokens = hx_calloc(rk->T, sizeof *rk->tokens);
    rk->targets = hx_calloc(rk->T, sizeof *rk->targets);
    if (!rk->tokens || !rk->targets)
        return hx_fail(SELDP_ERR_NOMEM, "rank %d: out of memory", rk->rank);
    int V = o->model.vocab;
    for (size_t t = 0; t < rk->T; t++) {
        rk->tokens[t] = (int32_t)(tm_splitmix64(&state) % (uint64_t)V);
        rk->targets[t] = (rk->tokens[t] + 1) % V;
    }
    return SELDP_OK;
}

/* --global-batch N: the step's N tokens come from one stream that every rank walks whole; the
 * b-th of the W batch ranks keeps its slice, N / W tokens and one more on the first N mod W,
 * in rank order (a later pipeline stage takes its stage-0 rank's slice). */
static seldp_status draw_global_tokens(hx_rank *rk)
{
    const hx_options *o = &rk->run->opts;
    const hx_run *run = rk->run;
    size_t b = 0;
    while (b < (size_t)run->n_batch && run->batch_ranks[b] != rk->batch_rank)
        b++;
    /* with micro-batches the stream is M micro-batches of N/M tokens, each split so (the
     * rank's tokens micro-batch after micro-batch, microbatch.h) */
    size_t M = o->micro_batches > 1 ? (size_t)o->micro_batches : 1;
    size_t N = (size_t)o->global_batch, Nm = N / M, W = (size_t)run->n_batch, r = b;
    size_t base = Nm / W, extra = Nm % W;
    size_t begin = r * base + (r < extra ? r : extra);
    size_t mine = base + (r < extra ? 1 : 0);
    free(rk->tokens);
    free(rk->targets);
    rk->T = mine * M;
    rk->tokens = hx_calloc(rk->T ? rk->T : 1, sizeof *rk->tokens);
    rk->targets = hx_calloc(rk->T ? rk->T : 1, sizeof *rk->targets);
    if (!rk->tokens || !rk->targets)
        return hx_fail(SELDP_ERR_NOMEM, "rank %d: out of memory", rk->rank);
    int V = o->model.vocab;
    for (size_t t = 0; t < N; t++) {
        int32_t id = (int32_t)(tm_splitmix64(&rk->token_state) % (uint64_t)V);
        size_t m = t / Nm, u = t % Nm;
        if (u >= begin && u < begin + mine) {
            rk->tokens[m * mine + u - begin] = id;
            rk->targets[m * mine + u - begin] = (id + 1) % V;
        }
    }
    return SELDP_OK;
}
