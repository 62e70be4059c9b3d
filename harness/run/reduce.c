/* The reductions of one step: every rank exports each gradient with the scale of the replica
 * set that reduces it (sets.h) and reduces its sets in order, checking that each reduction
 * leaves the gradients outside its selection and every parameter alone; planted defects for
 * --inject. */
#define _POSIX_C_SOURCE 200809L

#include <stdlib.h>
#include <string.h>

#include "rank_tensors.h"
#include "sets.h"
#include "set_rank.h"
#include "capture.h"
#include "grid.h"
#include "inject.h"
#include "checks.h"
#include "gpu_rank.h"
#include "rank.h"
#include "reduce.h"
#include "run.h"
#include "loss_scale.h"

/* ---- gradients and reductions ------------------------------------------------------------ */

/* Under the error policy every active owner must hold a gradient of every expert that some
 * owner has one of: an owner whose rows all went elsewhere supplies zeros (the zero policy
 * lets the library do it). An expert no token reached stays absent on every rank. */
bool hx_zero_owed(const hx_rank *rk, const tm_param_info *p)
{
    int E = rk->run->layout->experts;
    if (!(p->role & (TM_ROLE_EXPERT | TM_ROLE_ADAPTER)) || p->frozen ||
        rk->routed[p->layer * E + p->expert] == 0)
        return false;
    const hx_set *s = hx_set_of(rk->run, rk->rank, p);
    return s && hx_set_weight_of(rk, s) != 0;
}

seldp_status hx_zero_grad(hx_rank *rk, const tm_param_info *p, seldp_grads *grads)
{
    if (seldp_grads_get(grads, p->id))
        return SELDP_OK;
    seldp_tensor z = p->tensor;
    z.dtype = rk->run->grad_dtype;
    z.device = rk->device;
    z.data = NULL;
    seldp_status st = seldp_tensor_alloc(&z);
    if (st != SELDP_OK)
        return hx_fail_lib(st, "rank %d: zero gradient of %s", rk->rank, p->path);
    st = seldp_grads_put(grads, p->id, &z, SELDP_OWNED);
    if (st != SELDP_OK) {
        seldp_tensor_free(&z);
        return hx_fail_lib(st, "rank %d: zero gradient of %s", rk->rank, p->path);
    }
    return SELDP_OK;
}

/* Capture what rank rk passes to set s for p (capture.h): the exported input and the FP32
 * gradient it came from; nothing when the rank takes no part in the reduction. */
static seldp_status capture_input(hx_rank *rk, const hx_set *s, const tm_param_info *p,
                                  const seldp_tensor *input, bool owed)
{
    seldp_status st = SELDP_OK;
    if (hx_set_weight_of(rk, s) == 0)
        return SELDP_OK;
    seldp_tensor host = *input;
    float *local = NULL;
    host.data = NULL;
    if (input->device.kind != SELDP_DEVICE_HOST) {
        host.device = SELDP_HOST_DEVICE;
        HX_CHECK_LIB(seldp_tensor_alloc(&host), "rank %d: a host copy of a gradient", rk->rank);
        HX_CHECK_LIB(seldp_tensor_copy(&host, input), "rank %d: copying the gradient of %s",
                     rk->rank, p->path);
    }
    if (!owed && rk->gpu) {
        local = hx_calloc(seldp_tensor_numel(input) + 1, sizeof *local);
        if (!local)
            HX_FAIL(SELDP_ERR_NOMEM, "rank %d: out of memory", rk->rank);
        HX_CHECK(hx_gpu_local_grad(rk, p, local));
    }
    HX_CHECK(hx_capture_add(rk->run, s, hx_grid_logical_path(p->path), host.data ? &host : input,
                            owed    ? NULL
                            : local ? local
                                    : tm_param_grad(rk->model, p->path)));
fail:
    if (host.data)
        seldp_tensor_free(&host);
    free(local);
    return st;
}

seldp_status hx_export_grad(hx_rank *rk, size_t i, seldp_grads *grads)
{
    const tm_param_info *p = tm_param_at(rk->model, i);
    if (p->alias || p->frozen || !(p->role & TM_ROLES_TRAINABLE))
        return SELDP_OK;
    const hx_set *s = hx_set_of(rk->run, rk->rank, p);
    if (!s)
        return SELDP_OK;
    seldp_status st = rk->ops->export_grad(rk->compute, i, hx_set_export_scale(rk, s),
                                           rk->run->opts.fp32_master, grads);
    if (st != SELDP_OK)
        return hx_fail_lib(st, "rank %d: exporting the gradient of %s", rk->rank, p->path);
    HX_CHECK(hx_inject_exported(rk, p, grads)); /* a planted second reduction (inject.h) */
    hx_loss_scale_plant(rk, i, grads);          /* --inject-overflow (loss_scale.h) */
    const seldp_tensor *input = seldp_grads_get(grads, p->id);
    bool owed = false;
    if (!input && rk->run->opts.policy == SELDP_MISSING_ERROR && hx_zero_owed(rk, p)) {
        HX_CHECK(hx_zero_grad(rk, p, grads));
        input = seldp_grads_get(grads, p->id);
        owed = true;
    }
    if (input)
        HX_CHECK(capture_input(rk, s, p, input, owed));
fail:
    return st;
}

typedef struct kept_entry {
    seldp_param_id id;
    const void *data;
    seldp_dtype dtype;
    uint64_t sum;
} kept_entry;

static bool id_selected(const seldp_param_id *ids, size_t n, seldp_param_id id)
{
    for (size_t i = 0; i < n; i++)
        if (ids[i] == id)
            return true;
    return false;
}

/* One checksum over every parameter's bytes where the rank computes. */
seldp_status hx_params_checksum(const hx_rank *rk, uint64_t *sum)
{
    *sum = 0;
    for (size_t i = 0; i < rk->n_params; i++) {
        uint64_t one = 0;
        seldp_status st =
            hx_tensor_checksum(rk, hx_param_storage(rk, tm_param_at(rk->model, i)), &one);
        if (st != SELDP_OK)
            return st;
        *sum ^= one + i;
    }
    return SELDP_OK;
}

/* One reduction of `grads` by one session, blocking or (params_before given) the finish of an
 * overlapped one, with the check that gradients outside its selection come back as they
 * were: same tensor, same dtype, same bytes; and that no parameter moved since
 * `params_before` (the parameters' checksum when the overlapped reduction started) or the
 * blocking call began. */
static seldp_status reduce_checked(hx_rank *rk, seldp_session *s, const char *label,
                                   hx_reduce_kind kind, uint64_t weight, seldp_grads *grads,
                                   uint64_t *global_weight, const uint64_t *params_before)
{
    seldp_status st = SELDP_OK;
    hx_run *run = rk->run;
    bool fp32 = run->opts.fp32_master;
    seldp_missing_policy policy = run->opts.policy;
    size_t n_sel = 0;
    const seldp_param_id *sel = seldp_session_selected(s, &n_sel);
    size_t n = seldp_grads_count(grads), kept = 0;
    kept_entry *before = hx_calloc(n ? n : 1, sizeof *before);
    if (!before)
        return SELDP_ERR_NOMEM;
    for (size_t i = 0; i < n; i++) {
        seldp_param_id id;
        const seldp_tensor *t;
        seldp_grads_at(grads, i, &id, &t);
        if (id_selected(sel, n_sel, id))
            continue;
        before[kept] = (kept_entry){id, t->data, t->dtype, 0};
        HX_CHECK(hx_tensor_checksum(rk, t, &before[kept].sum));
        kept++;
    }
    /* a reduction never writes parameters, selected or not */
    uint64_t params_start = 0, params_after = 0;
    if (params_before)
        params_start = *params_before;
    else
        HX_CHECK(hx_params_checksum(rk, &params_start));
    const char *method = kind == HX_REDUCE_MEAN ? "reduce" : "sum";
    if (params_before)
        st = seldp_session_finish(s, global_weight);
    else if (kind == HX_REDUCE_MEAN)
        st = fp32 ? seldp_session_reduce_fp32(s, grads, weight, policy, global_weight)
                  : seldp_session_reduce(s, grads, weight, policy, global_weight);
    else
        st = fp32 ? seldp_session_sum_fp32(s, grads, weight > 0, policy, global_weight)
                  : seldp_session_sum(s, grads, weight > 0, policy, global_weight);
    if (st != SELDP_OK)
        HX_FAIL_LIB(st, "rank %d: %s%s%s over %s", rk->rank, params_before ? "finish of " : "",
                    method, fp32 ? "_fp32" : "", label);
    HX_CHECK(hx_params_checksum(rk, &params_after));
    hx_record_local(&rk->reduce_untouched, params_after != params_start,
                    "rank %d: the reduction over %s changed a parameter", rk->rank, label);
    for (size_t i = 0; i < kept; i++) {
        const seldp_tensor *t = seldp_grads_get(grads, before[i].id);
        const seldp_param *p = seldp_model_find_id(tm_model_view(rk->model), before[i].id);
        uint64_t sum = 0;
        if (t)
            HX_CHECK(hx_tensor_checksum(rk, t, &sum));
        bool same =
            t && t->data == before[i].data && t->dtype == before[i].dtype && sum == before[i].sum;
        hx_record_local(&rk->reduce_untouched, !same,
                        "rank %d: the reduction over %s changed the gradient of %s, which it does "
                        "not select",
                        rk->rank, label, p ? p->path : "?");
    }
fail:
    free(before);
    return st;
}

seldp_status hx_reduce_session(hx_rank *rk, seldp_session *s, const char *label,
                               hx_reduce_kind kind, uint64_t weight, seldp_grads *grads,
                               uint64_t *global_weight)
{
    return reduce_checked(rk, s, label, kind, weight, grads, global_weight, NULL);
}

seldp_status hx_finish_session(hx_rank *rk, seldp_session *s, const char *label,
                               hx_reduce_kind kind, seldp_grads *grads, uint64_t params_before,
                               uint64_t *global_weight)
{
    return reduce_checked(rk, s, label, kind, 0, grads, global_weight, &params_before);
}

seldp_status hx_reset_grads(hx_rank *rk)
{
    seldp_grads_destroy(rk->grads);
    seldp_grads_destroy(rk->device_grads);
    rk->grads = rk->device_grads = NULL;
    seldp_status st = seldp_grads_create(&rk->grads);
    if (st == SELDP_OK && rk->gpu)
        st = seldp_grads_create(&rk->device_grads);
    if (st != SELDP_OK)
        return hx_fail_lib(st, "rank %d: gradient container", rk->rank);
    return SELDP_OK;
}

/* --inject grad / absent: a defect after the reductions that the checks must report. */
seldp_status hx_plant_fault(hx_rank *rk)
{
    hx_run *run = rk->run;
    if (rk->rank != run->opts.world - 1)
        return SELDP_OK;
    if (run->opts.inject == HX_FAULT_GRAD && seldp_grads_count(rk->grads) > 0) {
        seldp_param_id id;
        const seldp_tensor *g;
        seldp_grads_at(rk->grads, 0, &id, &g);
        size_t n = seldp_tensor_numel(g);
        float *v = hx_calloc(n, sizeof *v);
        if (!v)
            return SELDP_ERR_NOMEM;
        hx_tensor_to_f32(g, v);
        for (size_t i = 0; i < n; i++)
            v[i] *= 2.0f;
        seldp_tensor t = *g;
        hx_tensor_from_f32(v, &t);
        free(v);
    }
    if (run->opts.inject == HX_FAULT_ABSENT) {
        int E = run->layout->experts;
        for (size_t i = 0; i < rk->n_params; i++) {
            const tm_param_info *p = tm_param_at(rk->model, i);
            if (!(p->role & (TM_ROLE_EXPERT | TM_ROLE_ADAPTER)) || p->frozen ||
                rk->routed[p->layer * E + p->expert] != 0 || seldp_grads_get(rk->grads, p->id))
                continue;
            seldp_tensor z = p->tensor;
            z.dtype = run->grad_dtype;
            z.data = NULL;
            seldp_status st = seldp_tensor_alloc(&z);
            if (st == SELDP_OK)
                st = seldp_grads_put(rk->grads, p->id, &z, SELDP_OWNED);
            if (st != SELDP_OK)
                return hx_fail_lib(st, "rank %d: --inject absent", rk->rank);
            run->absent_planted = true;
            break;
        }
    }
    return SELDP_OK;
}
