/* Planted framework bugs (--inject ep-scale|rank-mean|world-div|tied-twice|local-aux) and their
 * diagnosis from the gradients and the FP64 reference. */
#include "inject.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "grid.h"
#include "util.h"

bool hx_inject_is_framework_bug(hx_fault fault)
{
    return fault == HX_FAULT_EP_SCALE || fault == HX_FAULT_RANK_MEAN ||
           fault == HX_FAULT_WORLD_DIV || fault == HX_FAULT_TIED_TWICE ||
           fault == HX_FAULT_LOCAL_AUX;
}

const char *hx_inject_describe(hx_fault fault)
{
    switch (fault) {
    case HX_FAULT_EP_SCALE:
        return "expert gradients scaled by the EP size (DeepSpeed #6545)";
    case HX_FAULT_RANK_MEAN:
        return "each rank's token mean averaged over the ranks instead of the global token mean "
               "(torchtitan #1842)";
    case HX_FAULT_WORLD_DIV:
        return "expert gradients divided by the world size instead of the expert-data size";
    case HX_FAULT_TIED_TWICE:
        return "the tied embedding's gradient reduced a second time, as a sum over the "
               "embedding group";
    case HX_FAULT_LOCAL_AUX:
        return "the global-scope load-balancing loss normalized by each data shard's own tokens "
               "(f_e from the shard's counts over its token count; the counts never combined)";
    default:
        return "";
    }
}

/* The largest EP group of the layout. */
static int largest_ep(const hx_run *run)
{
    int n = 1;
    for (int g = 0; g < run->layout->n_ep; g++)
        n = run->layout->ep[g].size > n ? run->layout->ep[g].size : n;
    return n;
}

/* The data shards of the run (each batch rank's shard once). */
static int data_shards(const hx_run *run)
{
    int *ranks = hx_calloc((size_t)run->opts.world, sizeof *ranks);
    bool *seen = hx_calloc((size_t)run->opts.world, sizeof *seen);
    int n = 0;
    for (int b = 0; ranks && seen && b < run->n_batch; b++) {
        int r = run->batch_ranks[b];
        if (seen[r])
            continue;
        int k = hx_data_shard_of(run, r, ranks);
        for (int i = 0; i < k; i++)
            seen[ranks[i]] = true;
        n++;
    }
    free(ranks);
    free(seen);
    return n;
}

seldp_status hx_inject_check(const hx_run *run)
{
    const hx_options *o = &run->opts;
    const char *name = hx_fault_name(o->inject);
    switch (o->inject) {
    case HX_FAULT_EP_SCALE:
    case HX_FAULT_WORLD_DIV:
        if (largest_ep(run) < 2)
            return hx_fail(SELDP_ERR_INVALID_ARGUMENT,
                           "--inject %s: needs expert parallelism (an EP group of 2 ranks or "
                           "more, e.g. --ep 2): with EP size 1 the factor it plants is 1",
                           name);
        return SELDP_OK;
    case HX_FAULT_RANK_MEAN:
        if (data_shards(run) < 2)
            return hx_fail(SELDP_ERR_INVALID_ARGUMENT,
                           "--inject rank-mean: needs 2 data shards or more: with one, the mean "
                           "of the per-rank means is the global mean");
        if (o->global_batch > 0 && o->global_batch % run->n_batch == 0)
            return hx_fail(SELDP_ERR_INVALID_ARGUMENT,
                           "--inject rank-mean: needs ranks holding different token counts: "
                           "--global-batch %d splits evenly over %d ranks (give a batch that "
                           "does not divide, e.g. %d)",
                           o->global_batch, run->n_batch, o->global_batch + 1);
        if (o->global_batch <= 0 && hx_options_spread(o) == 0)
            return hx_fail(SELDP_ERR_INVALID_ARGUMENT,
                           "--inject rank-mean: needs ranks holding different token counts: "
                           "--token-spread 0 gives every rank --tokens %d",
                           o->tokens);
        return SELDP_OK;
    case HX_FAULT_TIED_TWICE: {
        const hx_set *s = run->sets.n ? &run->sets.sets[0] : NULL;
        for (int i = 0; i < run->sets.n && s; i++)
            if (run->sets.sets[i].kind == HX_SET_EMB)
                s = &run->sets.sets[i];
        if (!s || s->size < 2)
            return hx_fail(SELDP_ERR_INVALID_ARGUMENT,
                           "--inject tied-twice: needs the tied embedding replicated on 2 ranks "
                           "or more (the second reduction sums over them): this layout's "
                           "embedding group has one");
        return SELDP_OK;
    }
    case HX_FAULT_LOCAL_AUX:
        if (data_shards(run) < 2)
            return hx_fail(SELDP_ERR_INVALID_ARGUMENT,
                           "--inject local-aux: needs 2 data shards or more: with one, the local "
                           "statistics are the global ones");
        return SELDP_OK;
    case HX_FAULT_REPLICA:
        if (o->world < 2)
            return hx_fail(SELDP_ERR_INVALID_ARGUMENT,
                           "--inject replica: needs 2 ranks or more (a replica to differ from "
                           "its root)");
        return SELDP_OK;
    default:
        return SELDP_OK;
    }
}

/* The size of rank rk's expert-parallel group. */
static int ep_size(const hx_rank *rk)
{
    const hx_layout *l = rk->run->layout;
    return l->ep[l->ep_of[rk->rank]].size;
}

static bool expert_set(const hx_set *s)
{
    return s->kind == HX_SET_DATA || s->kind == HX_SET_EXPERT || s->kind == HX_SET_EXPERT_TP;
}

static bool dense_set(const hx_set *s)
{
    return s->kind == HX_SET_SHARED || s->kind == HX_SET_DENSE || s->kind == HX_SET_SP;
}

double hx_inject_scale(const hx_rank *rk, const hx_set *s)
{
    const hx_run *run = rk->run;
    switch (run->opts.inject) {
    case HX_FAULT_EP_SCALE:
        /* DeepSpeed #6545: the expert-data mean already has the right denominator, and the
         * expert grads are multiplied by the EP size on top of it */
        return expert_set(s) ? (double)ep_size(rk) : 1.0;
    case HX_FAULT_WORLD_DIV:
        /* a mean over the expert-data group divides by world / ep; dividing by the world
         * size instead makes the expert grads ep times too small */
        return expert_set(s) ? 1.0 / (double)ep_size(rk) : 1.0;
    case HX_FAULT_RANK_MEAN:
        /* torchtitan #1842: each rank's loss sum over its own tokens, then the mean over the
         * ranks with equal weights. The dense sets' weights become 1 (hx_inject_weight); in
         * the sum flow the experts' loss_sum / global tokens becomes loss_sum / (T_rank *
         * ranks) */
        if (rk->T == 0)
            return 1.0;
        if (dense_set(s))
            return 1.0 / (double)rk->T;
        if (expert_set(s) && s->sums)
            return (double)rk->global_tokens / ((double)rk->T * (double)run->opts.world);
        return 1.0;
    default:
        return 1.0;
    }
}

uint64_t hx_inject_weight(const hx_rank *rk, const hx_set *s, uint64_t weight)
{
    if (rk->run->opts.inject == HX_FAULT_RANK_MEAN && dense_set(s))
        return rk->T > 0 ? 1 : 0;
    return weight;
}

static void tensor_to_f32(const seldp_tensor *t, float *out)
{
    size_t n = seldp_tensor_numel(t);
    if (t->dtype == SELDP_F32)
        memcpy(out, t->data, n * sizeof(float));
    else
        seldp_half_to_f32(t->dtype, t->data, out, n);
}

static void tensor_from_f32(const float *in, const seldp_tensor *t)
{
    size_t n = seldp_tensor_numel(t);
    if (t->dtype == SELDP_F32)
        memcpy(t->data, in, n * sizeof(float));
    else
        seldp_f32_to_half(t->dtype, in, t->data, n);
}

seldp_status hx_inject_after_reduce(hx_rank *rk)
{
    if (rk->run->opts.inject != HX_FAULT_TIED_TWICE)
        return SELDP_OK;
    const seldp_tensor *g = NULL;
    const hx_rank_set *rs = NULL;
    for (size_t i = 0; i < rk->n_params && !g; i++) {
        const tm_param_info *p = tm_param_at(rk->model, i);
        if (!p->alias && strcmp(hx_grid_logical_path(p->path), "embed.weight") == 0) {
            g = seldp_grads_get(rk->grads, p->id);
            rs = hx_rank_set_of(rk, p);
        }
    }
    if (!g && !rs)
        return SELDP_OK; /* a middle pipeline stage holds no copy */
    if (!g || !rs)
        return hx_fail(SELDP_ERR_INTERNAL,
                       "rank %d: --inject tied-twice: no gradient of "
                       "embed.weight",
                       rk->rank);
    size_t n = seldp_tensor_numel(g);
    float *v = hx_calloc(n, sizeof *v);
    if (!v)
        return hx_fail(SELDP_ERR_NOMEM, "rank %d: out of memory", rk->rank);
    tensor_to_f32(g, v);
    /* the embedding group's allreduce of the tied copies, run over the already reduced
     * gradient: every rank adds the same mean once per member */
    seldp_status st = seldp_comm_allreduce(rs->comm, v, v, n, SELDP_F32, SELDP_HOST_DEVICE);
    if (st == SELDP_OK)
        tensor_from_f32(v, g);
    free(v);
    if (st != SELDP_OK)
        return hx_fail_lib(st,
                           "rank %d: --inject tied-twice: the second reduction of "
                           "embed.weight",
                           rk->rank);
    return SELDP_OK;
}
