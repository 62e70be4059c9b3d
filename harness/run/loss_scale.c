/* Loss scaling for F16 (loss_scale.h, docs/harness.md, Loss scaling). */
#define _POSIX_C_SOURCE 200809L

#include "loss_scale.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "sets.h"
#include "run.h"
#include "rank.h"
#include "checks.h"

seldp_status hx_loss_scale_check(const hx_run *run)
{
    const hx_options *o = &run->opts;
    for (int r = 0; o->loss_scale_given && r < o->world; r++)
        if (hx_backend_device(run->backend, r).kind == SELDP_DEVICE_CUDA)
            return hx_fail(SELDP_ERR_INVALID_ARGUMENT,
                           "--loss-scale %s: a rank on a GPU: the overflow is found in host "
                           "gradients",
                           o->loss_scale > 0 ? "X" : "dynamic");
    return SELDP_OK;
}

void hx_loss_scale_init(hx_run *run, const double *saved, int64_t good)
{
    const hx_options *o = &run->opts;
    double s = !o->loss_scale_given ? 1.0 : o->loss_scale > 0 ? o->loss_scale : o->loss_scale_init;
    if (o->loss_scale_given && saved)
        s = *saved; /* --resume: the scale the checkpoint's next step would have used */
    else
        good = 0;
    for (int r = 0; r < o->world; r++) {
        run->ranks[r].loss_scale = s;
        run->ranks[r].scale_good = good;
    }
    run->loss_scale = s;
}

double hx_loss_scale_factor(const hx_rank *rk)
{
    return rk->loss_scale > 0 ? rk->loss_scale : 1.0;
}

void hx_loss_scale_plant(hx_rank *rk, size_t i, seldp_grads *grads)
{
    const hx_options *o = &rk->run->opts;
    if (o->inject_overflow <= 0 || rk->rank != o->world - 1 || rk->step != o->inject_overflow - 1 ||
        rk->overflow_planted)
        return;
    const tm_param_info *p = tm_param_at(rk->model, i);
    const seldp_tensor *g = seldp_grads_get(grads, p->id);
    if (!g || p->expert < 0 || g->device.kind != SELDP_DEVICE_HOST)
        return;
    /* the first reached expert's first parameter in the model's order, whatever the order of
     * the exports (--overlap exports the last layer first) */
    int E = rk->run->layout->experts;
    for (size_t k = 0; k < i; k++) {
        const tm_param_info *q = tm_param_at(rk->model, k);
        if (!q->alias && !q->frozen && q->expert >= 0 && (q->role & TM_ROLES_TRAINABLE) &&
            rk->routed[q->layer * E + q->expert] > 0)
            return;
    }
    /* its first element: inf in the gradient's dtype */
    float inf = INFINITY;
    seldp_tensor one = *g;
    one.ndim = 1;
    one.shape[0] = 1;
    hx_tensor_from_f32(&inf, &one);
    rk->overflow_planted = true;
}

seldp_status hx_loss_scale_found_inf(hx_rank *rk)
{
    rk->found_inf = false;
    if (!rk->run->opts.loss_scale_given)
        return SELDP_OK;
    /* every group's gradients together: one flag for the dense and the expert optimizers
     * (found over [dense, expert] parameters, agreed over the world in one allreduce) */
    int64_t mine[2] = {0, 0};
    for (size_t i = 0; i < tm_param_count(rk->model); i++) {
        const tm_param_info *p = tm_param_at(rk->model, i);
        const seldp_tensor *t = p->alias ? NULL : seldp_grads_get(rk->grads, p->id);
        int c = p->expert >= 0;
        if (!t || mine[c])
            continue;
        size_t n = seldp_tensor_numel(t);
        float *f = hx_calloc(n, sizeof *f);
        if (!f)
            return hx_fail(SELDP_ERR_NOMEM, "rank %d: out of memory", rk->rank);
        hx_tensor_to_f32(t, f);
        for (size_t j = 0; j < n && !mine[c]; j++)
            mine[c] = !isfinite(f[j]);
        free(f);
    }
    return hx_loss_scale_agree(rk, mine);
}

seldp_status hx_loss_scale_agree(hx_rank *rk, const int64_t mine[2])
{
    int64_t all[2] = {0, 0};
    rk->found_inf = rk->found_inf_dense = rk->found_inf_expert = false;
    if (!rk->run->opts.loss_scale_given)
        return SELDP_OK;
    seldp_status st = seldp_comm_allreduce(rk->world, mine, all, 2, SELDP_I64, SELDP_HOST_DEVICE);
    if (st != SELDP_OK)
        return hx_fail_lib(st, "rank %d: allreduce of found_inf over the world", rk->rank);
    rk->found_inf = all[0] != 0 || all[1] != 0;
    rk->found_inf_dense = all[0] != 0;
    rk->found_inf_expert = all[1] != 0;
    return SELDP_OK;
}

bool hx_loss_scale_skips(const hx_rank *rk, const tm_param_info *p)
{
    /* --inject found-inf-local (Megatron-Bridge PR #5591): the dense and the expert
     * optimizers each decide from their own parameters' gradients */
    if (rk->run->opts.inject == HX_FAULT_FOUND_INF_LOCAL)
        return p->expert >= 0 ? rk->found_inf_expert : rk->found_inf_dense;
    return rk->found_inf;
}

void hx_loss_scale_update(hx_rank *rk)
{
    const hx_options *o = &rk->run->opts;
    if (!o->loss_scale_given || o->loss_scale > 0)
        return; /* none, or a fixed scale */
    if (rk->found_inf) {
        rk->loss_scale = fmax(rk->loss_scale * 0.5, 1.0);
        rk->scale_good = 0;
    } else if (++rk->scale_good >= o->loss_scale_window) {
        rk->loss_scale *= 2.0;
        rk->scale_good = 0;
    }
}

/* Whether a tensor holds a non-finite value. */
static bool non_finite(const seldp_tensor *t)
{
    size_t n = seldp_tensor_numel(t);
    float *f = hx_calloc(n, sizeof *f);
    bool found = false;
    if (!f)
        return false;
    hx_tensor_to_f32(t, f);
    for (size_t j = 0; j < n && !found; j++)
        found = !isfinite(f[j]);
    free(f);
    return found;
}

void hx_loss_scale_step(hx_run *run, int step)
{
    run->overflow = false;
    if (!run->opts.loss_scale_given)
        return;
    int first = hx_backend_multiprocess(run->backend) ? hx_backend_process_rank(run->backend) : 0;
    run->loss_scale = run->ranks[first].loss_scale;
    for (int r = 0; r < run->opts.world && !run->overflow; r++) {
        const hx_rank *rk = &run->ranks[r];
        for (size_t i = 0; rk->grads && i < seldp_grads_count(rk->grads) && !run->overflow; i++) {
            seldp_param_id id;
            const seldp_tensor *t;
            seldp_grads_at(rk->grads, i, &id, &t);
            run->overflow = non_finite(t);
        }
    }
    if (run->overflow && run->out) {
        fprintf(run->out,
                "loss scale: step %d overflowed (a non-finite reduced gradient): every rank must "
                "skip its update; scale %g%s\n",
                step + 1, run->loss_scale,
                run->opts.loss_scale > 0 ? " (fixed)" : ", halved for the next step");
        fflush(run->out);
    }
}
