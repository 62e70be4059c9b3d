/* A rank's reduction phase of the step (step_reduce.h): the overlapped reductions finished or
 * every replica set reduced in order (reduce.c's primitives), or the distributed optimizer's
 * reduce-scatters (zero.c); then --clip-grad, the GPU's host copies and the planted faults. */
#include <stdlib.h>

#include "step_reduce.h"

#include "clip.h"
#include "inject.h"
#include "overlap.h"
#include "rank.h"
#include "reduce.h"
#include "run.h"
#include "set_rank.h"
#include "sets.h"
#include "util.h"
#include "zero.h"

/* rk->grads: host copies of the device gradients, under the same ids. */
static seldp_status grads_to_host(hx_rank *rk)
{
    seldp_status st = SELDP_OK;
    seldp_tensor copy = {0};
    for (size_t i = 0; i < seldp_grads_count(rk->device_grads); i++) {
        seldp_param_id id;
        const seldp_tensor *t;
        seldp_grads_at(rk->device_grads, i, &id, &t);
        copy = *t;
        copy.device = SELDP_HOST_DEVICE;
        copy.data = NULL;
        HX_CHECK_LIB(seldp_tensor_alloc(&copy), "rank %d: host copy of a gradient", rk->rank);
        HX_CHECK_LIB(seldp_tensor_copy(&copy, t), "rank %d: copying a gradient from cuda:%d",
                     rk->rank, rk->device.ordinal);
        HX_CHECK_LIB(seldp_grads_put(rk->grads, id, &copy, SELDP_OWNED),
                     "rank %d: host copy of a gradient", rk->rank);
        copy.data = NULL;
    }
fail:
    seldp_tensor_free(&copy);
    return st;
}

/* Every gradient exported by its set's scale, then every set of the rank reduced in order. */
static seldp_status reduce_sets(hx_rank *rk, seldp_grads *grads)
{
    for (size_t i = 0; i < rk->n_params; i++) {
        seldp_status st = hx_export_grad(rk, i, grads);
        if (st != SELDP_OK)
            return st;
    }
    for (int i = 0; i < rk->n_sets; i++) {
        hx_rank_set *rs = &rk->sets[i];
        if (hx_inject_replaces_reduction(rk, rs)) {
            seldp_status st = hx_inject_reduce(rk, rs, grads);
            if (st != SELDP_OK)
                return st;
            continue;
        }
        seldp_status st = hx_reduce_session(
            rk, rs->session, rs->set->label, rs->set->sums ? HX_REDUCE_SUM : HX_REDUCE_MEAN,
            hx_set_weight_of(rk, rs->set), grads, &rs->global_weight);
        if (st != SELDP_OK)
            return st;
    }
    return SELDP_OK;
}

seldp_status hx_rank_reduce(hx_rank *rk)
{
    seldp_status st = SELDP_OK;
    hx_run *run = rk->run;
    double t0 = hx_now();
    if (run->opts.zero) {
        /* reduce-scatter into the ranks' ranges (zero.h); overlapped, hx_zero_start began
         * them and the backward marked the gradients ready */
        if (run->opts.overlap)
            HX_CHECK(hx_overlap_finish(rk));
        return hx_zero_reduce(rk, t0);
    }
    /* on a GPU the sessions reduce device tensors; the checks read their host copies */
    if (run->opts.overlap) {
        HX_CHECK(hx_overlap_finish(rk)); /* started in hx_rank_compute, into rk->grads */
    } else {
        HX_CHECK(hx_reset_grads(rk));
        seldp_grads *grads = rk->gpu ? rk->device_grads : rk->grads;
        HX_CHECK(reduce_sets(rk, grads));
    }
    seldp_grads *grads = rk->gpu ? rk->device_grads : rk->grads;
    if (run->opts.clip_grad > 0)
        HX_CHECK(hx_clip_norm(rk, grads));
    if (rk->gpu)
        HX_CHECK(grads_to_host(rk));
    HX_CHECK(hx_inject_after_reduce(rk));
fail:
    rk->t_reduce = hx_now() - t0;
    return st;
}
