/* The planted bugs that change how a reduction or the norm is computed (inject.h): the shared
 * expert's second reduction over TP, the reduction accumulated in the half dtype, the global
 * norm taken from rank-local norms. Each replaces or adds to what the framework's code did at
 * that place, on every rank alike; nothing here edits a result after the fact. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bugs.h"
#include "set_rank.h"
#include "grid.h"
#include "inject.h"
#include "util.h"
#include "run.h"
#include "rank.h"
#include "reduce.h"

static void to_f32(const seldp_tensor *t, float *out)
{
    size_t n = seldp_tensor_numel(t);
    if (t->dtype == SELDP_F32)
        memcpy(out, t->data, n * sizeof(float));
    else
        seldp_half_to_f32(t->dtype, t->data, out, n);
}

static void from_f32(const float *in, const seldp_tensor *t)
{
    size_t n = seldp_tensor_numel(t);
    if (t->dtype == SELDP_F32)
        memcpy(t->data, in, n * sizeof(float));
    else
        seldp_f32_to_half(t->dtype, in, t->data, n);
}

/* The occurrence (not a tied alias) of parameter id on rank rk, or NULL. */
static const tm_param_info *param_of(const hx_rank *rk, seldp_param_id id)
{
    for (size_t i = 0; i < rk->n_params; i++) {
        const tm_param_info *p = tm_param_at(rk->model, i);
        if (!p->alias && p->id == id)
            return p;
    }
    return NULL;
}

seldp_status hx_inject_exported(hx_rank *rk, const tm_param_info *p, seldp_grads *grads)
{
    if (rk->run->opts.inject != HX_FAULT_SHARED_EXPERT_TP || !rk->grid || !rk->grid->tp ||
        !strstr(p->path, ".shared_expert."))
        return SELDP_OK;
    /* Pai-Megatron-Patch #397: the shared expert's weights marked as needing the TP
     * all-reduce of the sequence-parallel parameters, so their gradients, already complete on
     * each TP rank, are summed over the TP group once more before the data-parallel reduction */
    const seldp_tensor *g = seldp_grads_get(grads, p->id);
    size_t n = seldp_tensor_numel(&p->tensor);
    float *v = hx_calloc(n + 1, sizeof *v);
    if (!v)
        return hx_fail(SELDP_ERR_NOMEM, "rank %d: out of memory", rk->rank);
    if (g)
        to_f32(g, v);
    seldp_status st = seldp_comm_allreduce(rk->grid->tp, v, v, n, SELDP_F32, SELDP_HOST_DEVICE);
    if (st == SELDP_OK && g)
        from_f32(v, g);
    free(v);
    if (st != SELDP_OK)
        return hx_fail_lib(st, "rank %d: --inject shared-expert-tp: the TP all-reduce of %s",
                           rk->rank, p->path);
    return SELDP_OK;
}

/* The TP rank of world rank r (its position in its TP group), 0 without a grid. */
static int tp_rank_of(const hx_run *run, int r)
{
    const seldp_layout *g = run->layout->grid;
    if (!g)
        return 0;
    const int *ranks = NULL;
    int n =
        seldp_layout_group(g, SELDP_GROUP_TP, seldp_layout_group_of(g, SELDP_GROUP_TP, r), &ranks);
    for (int i = 0; i < n; i++)
        if (ranks[i] == r)
            return i;
    return 0;
}

typedef enum manual_kind {
    MANUAL_HALF,   /* every member, each partial sum rounded to the half dtype */
    MANUAL_SAME_TP /* only the members of this rank's TP rank, in FP64, rounded once */
} manual_kind;

/* One selected gradient of a set reduced by hand: every member's input gathered (a flag for
 * whether it takes part, then its values), then summed as the bug sums it; a mean divides by
 * the set's total weight (the weight the right reduction divides by) and rounds once more. */
static seldp_status manual_one(hx_rank *rk, hx_rank_set *rs, seldp_grads *grads,
                               const tm_param_info *p, bool active, uint64_t total,
                               manual_kind kind)
{
    seldp_status st = SELDP_OK;
    const hx_run *run = rk->run;
    seldp_dtype dt = run->grad_dtype;
    int P = seldp_comm_size(rs->comm), me = tp_rank_of(run, rk->rank);
    size_t n = seldp_tensor_numel(&p->tensor);
    const seldp_tensor *g = seldp_grads_get(grads, p->id);
    float *mine = hx_calloc(n + 1, sizeof *mine);
    float *all = hx_calloc((size_t)P * (n + 1), sizeof *all);
    double *acc = hx_calloc(n + 1, sizeof *acc);
    if (!mine || !all || !acc)
        HX_FAIL(SELDP_ERR_NOMEM, "rank %d: out of memory", rk->rank);
    mine[0] = g && active ? 1.0f : 0.0f;
    if (g)
        to_f32(g, mine + 1);
    HX_CHECK_LIB(
        seldp_comm_allgather(rs->comm, mine, all, (n + 1) * sizeof *mine, SELDP_HOST_DEVICE),
        "rank %d: --inject %s: gathering %s over %s", rk->rank, hx_fault_name(run->opts.inject),
        p->path, rs->set->label);
    int members = 0, present = 0;
    for (int k = 0; k < P; k++) {
        const float *x = all + (size_t)k * (n + 1);
        if (x[0] == 0.0f)
            continue;
        present++;
        if (kind == MANUAL_SAME_TP && tp_rank_of(run, rs->set->ranks[k]) != me)
            continue;
        for (size_t i = 0; i < n; i++)
            acc[i] = members == 0          ? (double)x[i + 1]
                     : kind == MANUAL_HALF ? hx_round_to(dt, acc[i] + (double)x[i + 1])
                                           : acc[i] + (double)x[i + 1];
        members++;
    }
    if (present == 0)
        goto fail; /* no member holds it: it stays absent */
    if (!g) {
        HX_CHECK(hx_zero_grad(rk, p, grads));
        g = seldp_grads_get(grads, p->id);
    }
    for (size_t i = 0; i < n; i++)
        mine[i] = (float)hx_round_to(dt, rs->set->sums ? acc[i] : acc[i] / (double)total);
    from_f32(mine, g);
fail:
    free(mine);
    free(all);
    free(acc);
    return st;
}

/* Set rs's reduction of grads by hand (manual_one for every gradient it selects). */
static seldp_status manual_reduce(hx_rank *rk, hx_rank_set *rs, seldp_grads *grads,
                                  manual_kind kind)
{
    seldp_status st = SELDP_OK;
    uint64_t w = hx_set_weight_of(rk, rs->set);
    int64_t mine = (int64_t)w, total = 0;
    HX_CHECK_LIB(seldp_comm_allreduce(rs->comm, &mine, &total, 1, SELDP_I64, SELDP_HOST_DEVICE),
                 "rank %d: --inject %s: the weights over %s", rk->rank,
                 hx_fault_name(rk->run->opts.inject), rs->set->label);
    rs->global_weight = (uint64_t)total;
    size_t n_sel = 0;
    const seldp_param_id *sel = seldp_session_selected(rs->session, &n_sel);
    for (size_t j = 0; j < n_sel; j++) {
        const tm_param_info *p = param_of(rk, sel[j]);
        if (!p || p->frozen || !(p->role & TM_ROLES_TRAINABLE))
            continue;
        HX_CHECK(manual_one(rk, rs, grads, p, w > 0, (uint64_t)total, kind));
    }
fail:
    return st;
}

bool hx_inject_replaces_reduction(const hx_rank *rk, const hx_rank_set *rs)
{
    hx_fault f = rk->run->opts.inject;
    return f == HX_FAULT_HALF_ACCUM || (f == HX_FAULT_ROUTER_TP && rs->set->kind == HX_SET_SP);
}

seldp_status hx_inject_reduce(hx_rank *rk, hx_rank_set *rs, seldp_grads *grads)
{
    /* DeepEP #176, Megatron-LM #502: the gradients reduced in their own half dtype, each
     * partial sum of the ring rounded to bf16 / f16, instead of accumulated in FP32.
     * Megatron-LM #599 (PR #619), torchtitan #2387: under sequence parallelism each TP rank's
     * router and norm gradients cover its own part of the sequence; without the
     * sequence-parallel mark they are reduced over the data-parallel group only, the sum over
     * the TP group never taken */
    return manual_reduce(
        rk, rs, grads, rk->run->opts.inject == HX_FAULT_HALF_ACCUM ? MANUAL_HALF : MANUAL_SAME_TP);
}

seldp_status hx_inject_norm(hx_rank *rk, seldp_grads *grads, double *norm)
{
    /* DeepSpeed #8475: clip_grad_norm_ takes each rank's norm of the gradients it holds and
     * averages the norms over the data-parallel group, which is right only while every rank
     * holds the same parameters; with experts spread over EP each rank's norm covers its own
     * experts, and sqrt(a) and sqrt(b) averaged are not sqrt(a + b) */
    double sum = 0.0;
    float *v = NULL;
    for (size_t i = 0; i < seldp_grads_count(grads); i++) {
        seldp_param_id id;
        const seldp_tensor *t;
        seldp_grads_at(grads, i, &id, &t);
        size_t n = seldp_tensor_numel(t);
        float *w = realloc(v, (n + 1) * sizeof *w);
        if (!w) {
            free(v);
            return hx_fail(SELDP_ERR_NOMEM, "rank %d: out of memory", rk->rank);
        }
        v = w;
        to_f32(t, v);
        for (size_t j = 0; j < n; j++)
            sum += (double)v[j] * (double)v[j];
    }
    free(v);
    double local = sqrt(sum) / (double)rk->run->opts.world, mean = 0.0;
    seldp_status st =
        seldp_comm_allreduce(rk->world, &local, &mean, 1, SELDP_F64, SELDP_HOST_DEVICE);
    if (st != SELDP_OK)
        return hx_fail_lib(st, "rank %d: --inject norm-per-group: the mean of the rank norms",
                           rk->rank);
    *norm = mean;
    return SELDP_OK;
}

seldp_status hx_inject_clip(hx_rank *rk, seldp_grads *grads, bool *skip)
{
    double norm = 0.0;
    seldp_status st = hx_inject_norm(rk, grads, &norm);
    if (st != SELDP_OK)
        return st;
    *skip = !isfinite(norm);
    double coef = rk->run->opts.clip_grad / (norm + 1e-6);
    if (*skip || !(coef < 1.0))
        return SELDP_OK;
    float *v = NULL;
    for (size_t i = 0; i < seldp_grads_count(grads); i++) {
        seldp_param_id id;
        const seldp_tensor *t;
        seldp_grads_at(grads, i, &id, &t);
        size_t n = seldp_tensor_numel(t);
        float *w = realloc(v, (n + 1) * sizeof *w);
        if (!w) {
            free(v);
            return hx_fail(SELDP_ERR_NOMEM, "rank %d: out of memory", rk->rank);
        }
        v = w;
        to_f32(t, v);
        for (size_t j = 0; j < n; j++)
            v[j] = (float)((double)v[j] * coef);
        from_f32(v, t);
    }
    free(v);
    return SELDP_OK;
}
