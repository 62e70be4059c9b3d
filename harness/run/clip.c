/* --clip-grad: the global gradient norm across the rank's sessions (clip.h). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "clip.h"
#include "inject.h"
#include "loss_scale.h"
#include "util.h"
#include "run.h"
#include "rank.h"
#include "checks.h"

/* The rank's replica sets as the parts of a norm call: each holds replicas of its shards, so
 * every shard counts once. parts has room for rk->n_sets. */
static size_t rank_parts(const hx_rank *rk, seldp_grads *grads, seldp_norm_part *parts)
{
    for (int i = 0; i < rk->n_sets; i++)
        parts[i] = (seldp_norm_part){rk->sets[i].session, grads, SELDP_NORM_REPLICATED};
    return (size_t)rk->n_sets;
}

seldp_status hx_clip_norm(hx_rank *rk, seldp_grads *grads)
{
    seldp_status st = SELDP_OK;
    seldp_grad_norm_result res;
    if (rk->run->opts.inject == HX_FAULT_NORM_PER_GROUP)
        return hx_inject_norm(rk, grads, &rk->grad_norm);
    seldp_norm_part *parts = hx_calloc((size_t)rk->n_sets + 1, sizeof *parts);
    if (!parts)
        return hx_fail(SELDP_ERR_NOMEM, "rank %d: out of memory", rk->rank);
    size_t n = rank_parts(rk, grads, parts);
    HX_CHECK_LIB(seldp_grad_norm(rk->world, parts, n, &res),
                 "rank %d: the global gradient norm over %zu sessions", rk->rank, n);
    rk->grad_norm = res.norm / hx_loss_scale_factor(rk); /* of the loss, not S times it */
fail:
    free(parts);
    return st;
}

/* The L2 norm of the reference's gradient of every trainable parameter, a tied one once. */
static double reference_norm(const hx_run *run, const tm_reference *ref)
{
    double sum = 0.0;
    for (size_t i = 0; i < tm_param_count(run->global); i++) {
        const tm_param_info *p = tm_param_at(run->global, i);
        size_t n = 0;
        if (p->alias || p->frozen || !(p->role & TM_ROLES_TRAINABLE))
            continue;
        const double *g = tm_reference_grad(ref, p->path, &n);
        for (size_t j = 0; g && j < n; j++)
            sum += g[j] * g[j];
    }
    return sqrt(sum);
}

void hx_clip_check(hx_run *run, int step, const tm_reference *ref)
{
    if (run->overflow)
        return; /* a loss-scale overflow: the norm is not finite, and the step is skipped */
    int64_t failed_before = hx_run_failures(run);
    double want = reference_norm(run, ref);
    /* with ranks in several processes this process holds only its own ranks' norms */
    int first = hx_backend_local_first(run->backend);
    int last = first + hx_backend_local_count(run->backend) - 1;
    double got = run->ranks[first].grad_norm;
    /* | ||g|| - ||ref|| | <= ||g - ref||: the tensors' bounds in quadrature (each set's once),
     * the library's sum of squares in FP64 */
    double bound = sqrt(run->steps[step].norm_bound2) + 1e-12 * want;
    double ratio = fabs(got - want) / bound;
    hx_check_metric(run, HX_CHECK_GRAD_NORM, !(ratio <= 1.0), isnan(ratio) ? INFINITY : ratio,
                    bound / fmax(want, 1e-300), bound / fmax(want, 1e-300),
                    "step %d: the global gradient norm %.9g differs from the FP64 reference's "
                    "%.9g by %.3e, bound %.3e (every replica set and shard counted once)",
                    step + 1, got, want, fabs(got - want), bound);
    for (int r = first + 1; r <= last; r++) {
        double other = run->ranks[r].grad_norm;
        hx_check_record(run, HX_CHECK_GRAD_NORM, memcmp(&other, &got, sizeof got) != 0, 0,
                        "step %d: rank %d's global gradient norm %.17g differs from rank %d's "
                        "%.17g",
                        step + 1, r, other, first, got);
    }
    run->steps[step].failures += hx_run_failures(run) - failed_before;
}

/* The host copies the update reads, refreshed from the clipped device gradients. */
static seldp_status refresh_host_copies(hx_rank *rk)
{
    seldp_status st = SELDP_OK;
    for (size_t i = 0; i < seldp_grads_count(rk->grads); i++) {
        seldp_param_id id;
        const seldp_tensor *host;
        seldp_grads_at(rk->grads, i, &id, &host);
        const seldp_tensor *device = seldp_grads_get(rk->device_grads, id);
        if (!device)
            continue;
        seldp_tensor dst = *host;
        HX_CHECK_LIB(seldp_tensor_copy(&dst, device),
                     "rank %d: copying a clipped gradient from cuda:%d", rk->rank,
                     rk->device.ordinal);
    }
fail:
    return st;
}

seldp_status hx_clip_apply(hx_rank *rk, bool *skip)
{
    seldp_status st = SELDP_OK;
    seldp_grad_norm_result res;
    seldp_grads *grads = rk->gpu ? rk->device_grads : rk->grads;
    if (rk->run->opts.inject == HX_FAULT_NORM_PER_GROUP)
        return hx_inject_clip(rk, grads, skip);
    seldp_norm_part *parts = hx_calloc((size_t)rk->n_sets + 1, sizeof *parts);
    if (!parts)
        return hx_fail(SELDP_ERR_NOMEM, "rank %d: out of memory", rk->rank);
    size_t n = rank_parts(rk, grads, parts);
    /* under --loss-scale the gradients are S times the loss's: clip at S times the norm */
    double max_norm = rk->run->opts.clip_grad * hx_loss_scale_factor(rk);
    HX_CHECK_LIB(seldp_clip_grad_norm(rk->world, parts, n, max_norm, &res),
                 "rank %d: --clip-grad %g", rk->rank, rk->run->opts.clip_grad);
    *skip = res.found_inf;
    if (rk->gpu && res.clipped)
        HX_CHECK(refresh_host_copies(rk));
fail:
    free(parts);
    return st;
}
