/* --overlap (overlap.h): the reductions of a rank's sessions started before its backward, its
 * gradients exported and marked ready layer by layer, the sessions finished after it. */
#define _POSIX_C_SOURCE 200809L

#include "overlap.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grid.h"
#include "inject.h"

/* One session's reduction of the step: the blocking step's label, method and weight. */
typedef struct overlap_session {
    seldp_session *s;
    char label[64];
    hx_reduce_kind kind;
    uint64_t weight;
    uint64_t *global_weight;
} overlap_session;

struct hx_overlap {
    bool *exported; /* [n_params] this step, by tm_param_at index */
    uint64_t params_before;
    overlap_session *sessions; /* in the blocking order */
    int n_sessions;
};

seldp_status hx_overlap_check_backend(const hx_options *o)
{
    if (!o->overlap)
        return SELDP_OK;
    if (hx_backend_uses_processes(o->backend))
        return hx_fail(SELDP_ERR_INVALID_ARGUMENT,
                       "--overlap: not with one rank per MPI process (--backend %s%s): the MPI "
                       "transport runs one collective of a world at a time, so a reduction in "
                       "flight would hold up the backward's dispatch",
                       hx_backend_name(o->backend),
                       hx_backend_under_mpirun() ? " under mpirun" : "");
    if (o->backend == HX_BACKEND_NCCL)
        return hx_fail(SELDP_ERR_INVALID_ARGUMENT,
                       "--overlap: not with --backend nccl: ranks on a GPU export their gradients "
                       "after the whole backward");
    return SELDP_OK;
}

seldp_status hx_overlap_check_devices(const hx_run *run)
{
    if (!run->opts.overlap)
        return SELDP_OK;
    for (int r = 0; r < run->opts.world; r++) {
        seldp_device d = hx_backend_device(run->backend, r);
        if (d.kind == SELDP_DEVICE_CUDA)
            return hx_fail(SELDP_ERR_INVALID_ARGUMENT,
                           "--overlap: ranks on the host only: rank %d computes on cuda:%d, whose "
                           "backward exports its gradients after the whole backward",
                           r, d.ordinal);
    }
    return SELDP_OK;
}

seldp_session_config hx_session_config(const hx_run *run)
{
    seldp_session_config cfg = SELDP_SESSION_CONFIG_INIT;
    if (run->opts.bucket_bytes > 0)
        cfg.bucket_bytes = run->opts.bucket_bytes;
    return cfg;
}

/* The rank's sessions in the order the blocking step reduces them. */
static void plan_sessions(hx_rank *rk, struct hx_overlap *ov)
{
    hx_run *run = rk->run;
    ov->n_sessions = 0;
    if (rk->grid) {
        hx_grid_rank *gr = rk->grid;
        uint64_t weight[HX_SET_COUNT];
        hx_grid_weights(rk, weight);
        for (int set = 0; set < HX_SET_COUNT; set++) {
            if (!gr->set[set])
                continue;
            overlap_session *o = &ov->sessions[ov->n_sessions++];
            o->s = gr->set[set];
            snprintf(o->label, sizeof o->label, "its %s group", hx_grid_set_name((hx_grid_set)set));
            o->kind = hx_grid_set_sums(run, (hx_grid_set)set) ? HX_REDUCE_SUM : HX_REDUCE_MEAN;
            o->weight = weight[set];
            o->global_weight = &gr->weight[set];
        }
        return;
    }
    overlap_session *o = &ov->sessions[ov->n_sessions++];
    o->s = rk->shared_session;
    hx_group_label(0, o->label, sizeof o->label);
    o->kind = HX_REDUCE_MEAN;
    o->weight = hx_inject_shared_weight(rk);
    o->global_weight = &rk->shared_weight;
    for (int d = 0; d < run->layout->n_data; d++) {
        if (!rk->data_sessions[d])
            continue;
        o = &ov->sessions[ov->n_sessions++];
        o->s = rk->data_sessions[d];
        hx_group_label(1 + d, o->label, sizeof o->label);
        o->kind = run->opts.flow == HX_FLOW_SUM ? HX_REDUCE_SUM : HX_REDUCE_MEAN;
        o->weight = hx_data_share(rk, d);
        o->global_weight = &rk->data_weights[d];
    }
}

static seldp_status start_session(hx_rank *rk, const overlap_session *o)
{
    bool fp32 = rk->run->opts.fp32_master;
    seldp_missing_policy policy = rk->run->opts.policy;
    seldp_status st;
    if (o->kind == HX_REDUCE_MEAN)
        st = fp32 ? seldp_session_reduce_fp32_start(o->s, rk->grads, o->weight, policy)
                  : seldp_session_reduce_start(o->s, rk->grads, o->weight, policy);
    else
        st = fp32 ? seldp_session_sum_fp32_start(o->s, rk->grads, o->weight > 0, policy)
                  : seldp_session_sum_start(o->s, rk->grads, o->weight > 0, policy);
    if (st != SELDP_OK)
        return hx_fail_lib(st, "rank %d: starting the overlapped %s%s over %s", rk->rank,
                           o->kind == HX_REDUCE_MEAN ? "reduce" : "sum", fp32 ? "_fp32" : "",
                           o->label);
    return SELDP_OK;
}

seldp_status hx_overlap_begin(hx_rank *rk)
{
    seldp_status st = SELDP_OK;
    struct hx_overlap *ov = rk->overlap;
    if (!ov) {
        ov = rk->overlap = hx_calloc(1, sizeof *ov);
        if (ov) {
            ov->exported = hx_calloc(rk->n_params ? rk->n_params : 1, sizeof *ov->exported);
            ov->sessions =
                hx_calloc(1 + HX_SET_COUNT + (size_t)rk->run->layout->n_data, sizeof *ov->sessions);
        }
        if (!ov || !ov->exported || !ov->sessions)
            return hx_fail(SELDP_ERR_NOMEM, "rank %d: out of memory", rk->rank);
    }
    memset(ov->exported, 0, rk->n_params * sizeof *ov->exported);
    HX_CHECK(hx_reset_grads(rk));
    HX_CHECK(hx_params_checksum(rk, &ov->params_before));
    plan_sessions(rk, ov);
    for (int i = 0; i < ov->n_sessions; i++)
        HX_CHECK(start_session(rk, &ov->sessions[i]));
fail:
    return st;
}

/* The session that reduces p, or NULL. */
static seldp_session *session_of(const hx_rank *rk, const tm_param_info *p)
{
    const hx_run *run = rk->run;
    if (rk->grid)
        return rk->grid->set[hx_grid_set_of(run, rk->rank, p)];
    for (int g = 0; g <= run->layout->n_data; g++)
        if (hx_param_in_group(run, p, g))
            return g == 0 ? rk->shared_session : rk->data_sessions[g - 1];
    return NULL;
}

/* The scale the blocking step exports p's gradient with (reduce.c, grid_rank.c). */
static double export_scale(const hx_rank *rk, const tm_param_info *p)
{
    const hx_run *run = rk->run;
    bool sum_flow = run->opts.flow == HX_FLOW_SUM;
    if (p->role & TM_ROLE_SHARED)
        return rk->grid ? 1.0 : hx_inject_shared_scale(rk);
    double scale = sum_flow ? 1.0 / (double)rk->global_tokens : 1.0;
    if (!rk->grid)
        scale *= hx_inject_expert_factor(rk);
    return scale;
}

/* Export the gradient of occurrence i, as the blocking step would, and mark it ready. */
static seldp_status ready_param(hx_rank *rk, size_t i)
{
    seldp_status st = SELDP_OK;
    hx_run *run = rk->run;
    const tm_param_info *p = tm_param_at(rk->model, i);
    rk->overlap->exported[i] = true;
    if (p->alias || p->frozen || !(p->role & TM_ROLES_TRAINABLE))
        return SELDP_OK;
    if (rk->grid && hx_grid_prescaled(run, hx_grid_set_of(run, rk->rank, p)) &&
        rk->grid->set[hx_grid_set_of(run, rk->rank, p)])
        HX_CHECK(hx_grid_prescale(rk, p));
    HX_CHECK_LIB(
        tm_export_grad(rk->model, i, export_scale(rk, p), run->opts.fp32_master, rk->grads),
        "rank %d: exporting the gradient of %s", rk->rank, p->path);
    if (run->opts.policy == SELDP_MISSING_ERROR && hx_zero_owed(rk, p))
        HX_CHECK(hx_zero_grad(rk, p, rk->grads));
    seldp_session *s = session_of(rk, p);
    if (s)
        HX_CHECK_LIB(seldp_session_mark_ready(s, p->id),
                     "rank %d: marking the gradient of %s ready", rk->rank, p->path);
fail:
    return st;
}

seldp_status hx_overlap_ready(hx_rank *rk, int point)
{
    for (size_t i = 0; i < rk->n_params; i++) {
        const tm_param_info *p = tm_param_at(rk->model, i);
        if (rk->overlap->exported[i])
            continue;
        bool due = point == HX_READY_REST || (point >= 0 && p->layer == point) ||
                   (point == HX_READY_HEAD && p->layer < 0 && strcmp(p->path, "embed.weight") != 0);
        if (!due)
            continue;
        seldp_status st = ready_param(rk, i);
        if (st != SELDP_OK)
            return st;
    }
    return SELDP_OK;
}

seldp_status hx_overlap_finish(hx_rank *rk)
{
    seldp_status st = SELDP_OK;
    struct hx_overlap *ov = rk->overlap;
    for (int i = 0; i < ov->n_sessions; i++) {
        const overlap_session *o = &ov->sessions[i];
        HX_CHECK(hx_finish_session(rk, o->s, o->label, o->kind, rk->grads, ov->params_before,
                                   o->global_weight));
    }
    if (rk->grid)
        rk->shared_weight = rk->grid->weight[HX_SET_DENSE];
fail:
    return st;
}

void hx_overlap_cleanup(hx_rank *rk)
{
    if (!rk->overlap)
        return;
    free(rk->overlap->exported);
    free(rk->overlap->sessions);
    free(rk->overlap);
    rk->overlap = NULL;
}
