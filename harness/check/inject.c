/* Planted framework bugs (--inject, the rows of bugs.c): where each applies on the run's layout
 * (refused where it cannot show), and the places a framework made it: the export scale, the
 * weights of the reductions, the groups, a second reduction, the router losses' gradient scale.
 * The half-precision reduction, the norm and the second TP reduction are in inject_reduce.c. */
#include "sets.h"
#include "inject.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bugs.h"
#include "grid.h"
#include "router.h"
#include "util.h"
#include "run.h"
#include "rank.h"

bool hx_inject_is_framework_bug(hx_fault fault)
{
    return hx_bug_is_framework(fault);
}

const char *hx_inject_describe(hx_fault fault)
{
    const hx_bug *bug = hx_bug_of(fault);
    return bug ? bug->mistake : "";
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

/* The grid's sizes (1 for a layout file, which has no grid). */
static seldp_layout_config grid_sizes(const hx_run *run)
{
    seldp_layout_config c = SELDP_LAYOUT_CONFIG_INIT;
    if (run->layout->grid)
        c = seldp_layout_get_config(run->layout->grid);
    c.world = run->opts.world;
    if (c.tp < 1)
        c.tp = 1;
    if (c.pp < 1)
        c.pp = 1;
    if (c.cp < 1)
        c.cp = 1;
    return c;
}

int hx_inject_cp(const hx_run *run)
{
    return grid_sizes(run).cp;
}

int hx_inject_tp(const hx_run *run)
{
    return grid_sizes(run).tp;
}

int hx_inject_dp(const hx_run *run)
{
    seldp_layout_config c = grid_sizes(run);
    int d = c.tp * c.pp * c.cp;
    return d > 0 ? run->opts.world / d : 1;
}

/* The largest and the smallest replica set of a kind (0 when the run has none). */
static int set_size(const hx_run *run, bool (*kind)(const hx_set *), bool largest)
{
    int n = 0;
    for (int i = 0; i < run->sets.n; i++) {
        const hx_set *s = &run->sets.sets[i];
        if (!kind(s))
            continue;
        if (n == 0 || (largest ? s->size > n : s->size < n))
            n = s->size;
    }
    return n;
}

static bool any_set(const hx_set *s)
{
    (void)s;
    return true;
}

static bool expert_kind(const hx_set *s)
{
    return s->kind == HX_SET_DATA || s->kind == HX_SET_EXPERT;
}

static bool dense_kind(const hx_set *s)
{
    return s->kind == HX_SET_SHARED || s->kind == HX_SET_DENSE;
}

static bool host_ranks(const hx_run *run)
{
    for (int r = 0; r < run->opts.world; r++)
        if (hx_backend_device(run->backend, r).kind != SELDP_DEVICE_HOST)
            return false;
    return true;
}

/* The refusals of the second set: what each needs of the layout and the options. */
static seldp_status check_second(const hx_run *run)
{
    const hx_options *o = &run->opts;
    const tm_config *m = &o->model;
    const char *name = hx_fault_name(o->inject);
    switch (o->inject) {
    case HX_FAULT_ROUTER_TP:
        if (hx_inject_tp(run) < 2)
            return hx_fail(SELDP_ERR_INVALID_ARGUMENT,
                           "--inject router-tp: needs tensor parallelism (--tp 2 or more): "
                           "without sequence parallelism every rank's router and norm "
                           "gradients cover all of its tokens");
        if (o->overlap || !host_ranks(run))
            return hx_fail(SELDP_ERR_INVALID_ARGUMENT,
                           "--inject router-tp: needs host ranks and the blocking reductions "
                           "(--backend host, without --overlap)");
        return SELDP_OK;
    case HX_FAULT_AUX_MICROBATCH:
        if (hx_micro_count(run) < 2)
            return hx_fail(SELDP_ERR_INVALID_ARGUMENT,
                           "--inject aux-microbatch: needs --micro-batches 2 or more: with one "
                           "micro-batch the missing division is by 1");
        if (!(m->aux_loss_coeff > 0.0) && !(m->z_loss_coeff > 0.0))
            return hx_fail(SELDP_ERR_INVALID_ARGUMENT,
                           "--inject aux-microbatch: needs a router loss (--aux-loss-coeff or "
                           "--z-loss-coeff > 0): it scales their gradient");
        return SELDP_OK;
    case HX_FAULT_FOUND_INF_LOCAL:
        if (!o->loss_scale_given || o->inject_overflow <= 0)
            return hx_fail(SELDP_ERR_INVALID_ARGUMENT,
                           "--inject found-inf-local: needs --loss-scale and --inject-overflow "
                           "STEP (an overflow for the optimizers to disagree on)");
        return SELDP_OK;
    case HX_FAULT_LAST_MICROBATCH:
        if (hx_micro_count(run) < 2)
            return hx_fail(SELDP_ERR_INVALID_ARGUMENT,
                           "--inject last-microbatch: needs --micro-batches 2 or more: with one "
                           "micro-batch the last one's tokens are the step's");
        return SELDP_OK;
    case HX_FAULT_AUX_CP:
        if (hx_inject_cp(run) < 2)
            return hx_fail(SELDP_ERR_INVALID_ARGUMENT,
                           "--inject aux-cp: needs context parallelism (--cp 2 or more): at cp "
                           "1 the missing factor is 1");
        if (!(m->aux_loss_coeff > 0.0) && !(m->z_loss_coeff > 0.0))
            return hx_fail(SELDP_ERR_INVALID_ARGUMENT,
                           "--inject aux-cp: needs a router loss (--aux-loss-coeff or "
                           "--z-loss-coeff > 0): it scales their gradient");
        return SELDP_OK;
    case HX_FAULT_AUX_DP:
        if (hx_inject_dp(run) < 2)
            return hx_fail(SELDP_ERR_INVALID_ARGUMENT,
                           "--inject aux-dp: needs data parallelism (dp 2 or more; this layout "
                           "has dp 1): at dp 1 the missing factor is 1");
        if (!(m->aux_loss_coeff > 0.0) || m->aux_loss_scope != TM_AUX_GLOBAL)
            return hx_fail(SELDP_ERR_INVALID_ARGUMENT,
                           "--inject aux-dp: needs --aux-loss-coeff > 0 with --aux-loss-scope "
                           "global (the bug is in the global-scope loss's scale)");
        return SELDP_OK;
    case HX_FAULT_NORM_PER_GROUP:
        if (!(o->clip_grad > 0))
            return hx_fail(SELDP_ERR_INVALID_ARGUMENT,
                           "--inject norm-per-group: needs --clip-grad X: the bug is in the "
                           "global gradient norm that clipping computes");
        if (largest_ep(run) < 2)
            return hx_fail(SELDP_ERR_INVALID_ARGUMENT,
                           "--inject norm-per-group: needs expert parallelism (an EP group of "
                           "2 ranks or more): with every expert on every rank the rank-local "
                           "norms are the global one");
        if (!host_ranks(run))
            return hx_fail(SELDP_ERR_INVALID_ARGUMENT,
                           "--inject norm-per-group: needs host ranks (--backend host): the "
                           "rank-local norm is taken from host gradients");
        return SELDP_OK;
    case HX_FAULT_EDP1_SKIP:
        if (set_size(run, expert_kind, true) != 1)
            return hx_fail(SELDP_ERR_INVALID_ARGUMENT,
                           "--inject edp1-skip: needs expert-data groups of one rank (ep = "
                           "world, e.g. --world 4 --ep 4): this layout's largest has %d, whose "
                           "reduction divides as it should",
                           set_size(run, expert_kind, true));
        if (set_size(run, dense_kind, false) < 2)
            return hx_fail(SELDP_ERR_INVALID_ARGUMENT,
                           "--inject edp1-skip: needs a dense data-parallel group of 2 ranks or "
                           "more: with one the skipped division is by 1");
        return SELDP_OK;
    case HX_FAULT_SHARED_EXPERT_TP:
        if (hx_inject_tp(run) < 2)
            return hx_fail(SELDP_ERR_INVALID_ARGUMENT,
                           "--inject shared-expert-tp: needs tensor parallelism (--tp 2 or "
                           "more): the second reduction is over the TP group");
        if (m->d_ff_shared <= 0)
            return hx_fail(SELDP_ERR_INVALID_ARGUMENT,
                           "--inject shared-expert-tp: needs a shared expert "
                           "(--shared-expert-ff N)");
        if (o->overlap)
            return hx_fail(SELDP_ERR_INVALID_ARGUMENT,
                           "--inject shared-expert-tp: needs the blocking reductions (without "
                           "--overlap)");
        return SELDP_OK;
    case HX_FAULT_HALF_ACCUM:
        if (o->fp32_master || o->model.dtype == SELDP_F32)
            return hx_fail(SELDP_ERR_INVALID_ARGUMENT,
                           "--inject half-accum: needs half-precision gradients (--dtype bf16 or "
                           "f16, without --fp32-master): an FP32 reduction has no half dtype to "
                           "accumulate in");
        if (set_size(run, any_set, true) < HX_HALF_ACCUM_MIN_RANKS)
            return hx_fail(SELDP_ERR_INVALID_ARGUMENT,
                           "--inject half-accum: needs a replica set of %d ranks or more (e.g. "
                           "--world 4 --ep 2): this layout's largest has %d, and a sum of two "
                           "half values rounded once is what an FP32 accumulation's rounding "
                           "of the result already allows (one ulp of the half result)",
                           HX_HALF_ACCUM_MIN_RANKS, set_size(run, any_set, true));
        if (o->overlap || !host_ranks(run))
            return hx_fail(SELDP_ERR_INVALID_ARGUMENT,
                           "--inject half-accum: needs host ranks and the blocking reductions "
                           "(--backend host, without --overlap)");
        return SELDP_OK;
    default:
        (void)name;
        return SELDP_OK;
    }
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
    case HX_FAULT_TIED_ZERO: {
        const hx_set *s = NULL;
        for (int i = 0; i < run->sets.n; i++)
            if (run->sets.sets[i].kind == HX_SET_EMB)
                s = &run->sets.sets[i];
        if (!o->zero)
            return hx_fail(SELDP_ERR_INVALID_ARGUMENT,
                           "--inject tied-zero: needs --zero 1 (the distributed optimizer): the "
                           "all-reduce path sums the tied embedding over its whole set at once");
        if (!s)
            return hx_fail(SELDP_ERR_INVALID_ARGUMENT,
                           "--inject tied-zero: needs a pipeline (--pp 2 or more): with one "
                           "stage the embedding and the output layer are one tensor of one "
                           "rank, with no cross-stage sum");
        if (s->size < 4)
            return hx_fail(SELDP_ERR_INVALID_ARGUMENT,
                           "--inject tied-zero: needs 2 data-parallel ranks or more per stage "
                           "(a stage's reduce-scatter over one rank leaves its whole gradient): "
                           "this layout's embedding set %s has one per stage",
                           s->label);
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
        return check_second(run);
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
    case HX_FAULT_EDP1_SKIP: {
        /* PyTorch PR #167178: with an expert-data group of one rank the reduction is skipped,
         * and with it the division by the data-parallel size the gradients were scaled up
         * for: the experts keep dp times their share (dp the dense group's size) */
        const hx_set *d = hx_set_member(run, rk->rank, HX_SET_SHARED);
        if (!d)
            d = hx_set_member(run, rk->rank, HX_SET_DENSE);
        return expert_set(s) && s->size == 1 && d ? (double)d->size : 1.0;
    }
    case HX_FAULT_LAST_MICROBATCH:
        /* Megatron-LM #2417: the loss normalized by the token count of the step's last
         * micro-batch instead of the step's: every export scale carries N / N_last */
        return rk->micro_last_tokens > 0 ? (double)rk->global_tokens / (double)rk->micro_last_tokens
                                         : 1.0;
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

seldp_status hx_inject_rank_model(hx_rank *rk)
{
    const hx_run *run = rk->run;
    double aux = 1.0, z = 1.0;
    if (run->opts.inject == HX_FAULT_AUX_CP) {
        /* Megatron-LM #1652: the language-model loss is scaled for CP and the router losses
         * are not, so their gradient is 1/cp of its share (both the load-balancing and the
         * z-loss) */
        aux = z = 1.0 / (double)hx_inject_cp(run);
    } else if (run->opts.inject == HX_FAULT_AUX_DP) {
        /* Megatron-LM #3672: the global-scope load-balancing loss takes the global counts
         * but each rank's own probabilities, and its gradient misses the x dp that would
         * make up for the mean over the data-parallel group */
        aux = 1.0 / (double)hx_inject_dp(run);
    } else {
        return SELDP_OK;
    }
    seldp_status st = tm_set_router_loss_grad_scale(rk->model, aux, z);
    if (st != SELDP_OK)
        return hx_fail_lib(st, "rank %d: --inject %s", rk->rank, hx_fault_name(run->opts.inject));
    return SELDP_OK;
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
