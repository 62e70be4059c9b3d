/* --overlap (overlap.h): the reductions of a rank's sessions started before its backward, its
 * gradients exported and marked ready layer by layer, the sessions finished after it. */
#define _POSIX_C_SOURCE 200809L

#include "set_rank.h"
#include "overlap.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sets.h"
#include "zero.h"
#include "run.h"
#include "rank.h"
#include "reduce.h"

struct hx_overlap {
    bool *exported; /* [n_params] this step, by tm_param_at index */
    uint64_t params_before;
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

/* Start set rs's reduction with the blocking step's method and weight. */
static seldp_status start_set(hx_rank *rk, hx_rank_set *rs)
{
    bool fp32 = rk->run->opts.fp32_master;
    seldp_missing_policy policy = rk->run->opts.policy;
    uint64_t weight = hx_set_weight_of(rk, rs->set);
    seldp_status st;
    if (!rs->set->sums)
        st = fp32 ? seldp_session_reduce_fp32_start(rs->session, rk->grads, weight, policy)
                  : seldp_session_reduce_start(rs->session, rk->grads, weight, policy);
    else
        st = fp32 ? seldp_session_sum_fp32_start(rs->session, rk->grads, weight > 0, policy)
                  : seldp_session_sum_start(rs->session, rk->grads, weight > 0, policy);
    if (st != SELDP_OK)
        return hx_fail_lib(st, "rank %d: starting the overlapped %s%s over %s", rk->rank,
                           rs->set->sums ? "sum" : "reduce", fp32 ? "_fp32" : "", rs->set->label);
    return SELDP_OK;
}

seldp_status hx_overlap_begin(hx_rank *rk)
{
    seldp_status st = SELDP_OK;
    struct hx_overlap *ov = rk->overlap;
    if (!ov) {
        ov = rk->overlap = hx_calloc(1, sizeof *ov);
        if (ov)
            ov->exported = hx_calloc(rk->n_params ? rk->n_params : 1, sizeof *ov->exported);
        if (!ov || !ov->exported)
            return hx_fail(SELDP_ERR_NOMEM, "rank %d: out of memory", rk->rank);
    }
    memset(ov->exported, 0, rk->n_params * sizeof *ov->exported);
    HX_CHECK(hx_reset_grads(rk));
    HX_CHECK(hx_params_checksum(rk, &ov->params_before));
    if (rk->run->opts.zero) /* --zero 1: reduce-scatters into the ranks' ranges */
        HX_CHECK(hx_zero_start(rk));
    for (int i = 0; i < rk->n_sets && !rk->run->opts.zero; i++)
        HX_CHECK(start_set(rk, &rk->sets[i]));
fail:
    return st;
}

/* Export the gradient of occurrence i, as the blocking step would, and mark it ready. */
static seldp_status ready_param(hx_rank *rk, size_t i)
{
    const tm_param_info *p = tm_param_at(rk->model, i);
    rk->overlap->exported[i] = true;
    hx_rank_set *rs = p->alias ? NULL : hx_rank_set_of(rk, p);
    if (!rs || p->frozen || !(p->role & TM_ROLES_TRAINABLE))
        return SELDP_OK;
    seldp_status st = hx_export_grad(rk, i, rk->grads);
    if (st != SELDP_OK)
        return st;
    st = seldp_session_mark_ready(rs->session, p->id);
    if (st != SELDP_OK)
        return hx_fail_lib(st, "rank %d: marking the gradient of %s ready", rk->rank, p->path);
    return SELDP_OK;
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
    for (int i = 0; i < rk->n_sets; i++) {
        hx_rank_set *rs = &rk->sets[i];
        HX_CHECK(hx_finish_session(rk, rs->session, rs->set->label,
                                   rs->set->sums ? HX_REDUCE_SUM : HX_REDUCE_MEAN, rk->grads,
                                   ov->params_before, &rs->global_weight));
    }
fail:
    return st;
}

void hx_overlap_cleanup(hx_rank *rk)
{
    if (!rk->overlap)
        return;
    free(rk->overlap->exported);
    free(rk->overlap);
    rk->overlap = NULL;
}
