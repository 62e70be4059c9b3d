/* tiny-moe's gradient export (tinymoe.h, tm_export_grad and tm_export_grads): each
 * occurrence's FP32 accumulator, scaled, into a seldp gradient container in the parameter's
 * dtype or in F32; nothing is left behind when one fails. */
#include <stdio.h>
#include <stdlib.h>

#include "tm_internal.h"

/* ---- gradient export ----------------------------------------------------------------- */

/* One occurrence's entry: scale * accumulator in the parameter dtype (or F32). false in
 * *put when it gives none (frozen, the tied alias, an expert that saw no row). */
static seldp_status export_one(const tm_model *m, size_t i, double scale, bool fp32,
                               seldp_grads *out, bool *put)
{
    seldp_status st = SELDP_OK;
    const tm_param_info *p = &m->params[i];
    *put = false;
    if (!m->grad[i] || p->alias)
        return SELDP_OK;
    if (p->expert >= 0 && !tm_expert_seen(m, p->layer, p->expert))
        return SELDP_OK;
    seldp_tensor t = p->tensor;
    t.dtype = fp32 ? SELDP_F32 : p->tensor.dtype;
    t.data = NULL;
    t.device = SELDP_HOST_DEVICE;
    TM_CHECK_LIB(seldp_tensor_alloc(&t), "rank %d: the gradient of %s", m->rank, p->path);
    const size_t n = seldp_tensor_numel(&p->tensor);
    for (size_t k = 0; k < n; k++)
        tm__store_value(t.data, t.dtype, k, (float)(scale * (double)m->grad[i][k]));
    st = seldp_grads_put(out, p->id, &t, SELDP_OWNED);
    if (st != SELDP_OK) {
        char why[512];
        snprintf(why, sizeof why, "%s", seldp_last_error());
        seldp_tensor_free(&t);
        TM_FAIL(st, "rank %d: exporting the gradient of %s (id %llu): %s", m->rank, p->path,
                (unsigned long long)p->id, why);
    }
    *put = true;
fail:
    return st;
}

seldp_status tm_export_grad(const tm_model *m, size_t index, double scale, bool fp32,
                            seldp_grads *out)
{
    bool put = false;
    if (!m || !out)
        return tm__fail(SELDP_ERR_INVALID_ARGUMENT, "tm_export_grad: NULL argument");
    if (index >= m->n_params)
        return tm__fail(SELDP_ERR_INVALID_ARGUMENT,
                        "tm_export_grad: occurrence %zu of %zu is out of range", index,
                        m->n_params);
    return export_one(m, index, scale, fp32, out, &put);
}

seldp_status tm_export_grads(const tm_model *m, unsigned roles, double scale, bool fp32,
                             seldp_grads *out)
{
    seldp_status st = SELDP_OK;
    seldp_param_id *put = NULL;
    size_t n_put = 0;
    if (!m || !out)
        return tm__fail(SELDP_ERR_INVALID_ARGUMENT, "tm_export_grads: NULL argument");
    put = malloc(m->n_params * sizeof *put);
    if (!put)
        return tm__fail(SELDP_ERR_NOMEM, "rank %d: out of memory exporting gradients", m->rank);
    for (size_t i = 0; i < m->n_params; i++) {
        bool added = false;
        if (!(m->params[i].role & roles))
            continue;
        if ((st = export_one(m, i, scale, fp32, out, &added)) != SELDP_OK)
            goto fail;
        if (added)
            put[n_put++] = m->params[i].id;
    }
    free(put);
    return SELDP_OK;
fail:
    for (size_t k = 0; k < n_put; k++)
        seldp_grads_remove(out, put[k]);
    free(put);
    return st;
}
