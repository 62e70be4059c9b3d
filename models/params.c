/* tiny-moe's accessors: a model's config, rank, experts and parameter occurrences, the
 * copy between models, and the setters a sharded harness uses to hand a stage's gradients
 * (computed on a working model of full shapes) to the model that holds its shards. */
#include <stdio.h>
#include <string.h>

#include "tm_internal.h"

/* ---- accessors ----------------------------------------------------------------------- */

const tm_config *tm_model_config(const tm_model *m)
{
    return &m->cfg;
}

int tm_model_rank(const tm_model *m)
{
    return m->rank;
}

bool tm_model_owns(const tm_model *m, int e)
{
    return e >= 0 && e < m->cfg.experts && m->owns[e];
}

seldp_model *tm_model_view(tm_model *m)
{
    return m->view;
}

size_t tm_param_count(const tm_model *m)
{
    return m->n_params;
}

const tm_param_info *tm_param_at(const tm_model *m, size_t i)
{
    return i < m->n_params ? &m->params[i] : NULL;
}

const tm_param_info *tm_param_find(const tm_model *m, const char *path)
{
    const seldp_param *p = path ? seldp_model_find_path(m->view, path) : NULL;
    return p ? (const tm_param_info *)p->tag : NULL;
}

static int param_index(const tm_model *m, const char *path)
{
    const tm_param_info *p = tm_param_find(m, path);
    return p ? (int)(p - m->params) : -1;
}

const float *tm_param_grad(const tm_model *m, const char *path)
{
    int i = param_index(m, path);
    return i >= 0 ? m->grad[i] : NULL;
}

bool tm_expert_seen(const tm_model *m, int l, int e)
{
    if (l < 0 || l >= m->cfg.layers || e < 0 || e >= m->cfg.experts)
        return false;
    return m->seen[(size_t)l * (size_t)m->cfg.experts + (size_t)e];
}

static bool same_config(const tm_config *a, const tm_config *b)
{
    return a->vocab == b->vocab && a->d_model == b->d_model && a->d_ff == b->d_ff &&
           a->experts == b->experts && a->top_k == b->top_k && a->layers == b->layers &&
           a->eps == b->eps && a->dtype == b->dtype && a->quant == b->quant &&
           a->lora_rank == b->lora_rank && a->lora_alpha == b->lora_alpha &&
           a->d_ff_shared == b->d_ff_shared;
}

seldp_status tm_model_copy_params(tm_model *dst, const tm_model *src, unsigned roles, int expert)
{
    if (!dst || !src || !same_config(&dst->cfg, &src->cfg))
        return tm__fail(SELDP_ERR_INVALID_ARGUMENT,
                        "tm_model_copy_params: models of different configs (rank %d -> %d)",
                        src ? src->rank : -1, dst ? dst->rank : -1);
    for (size_t i = 0; i < src->n_params; i++) {
        const tm_param_info *p = &src->params[i];
        if (p->alias || !(p->role & roles) || (expert >= 0 && p->expert != expert))
            continue;
        const tm_param_info *q = tm_param_find(dst, p->path);
        if (!q)
            continue;
        if (!seldp_tensor_same_layout(&p->tensor, &q->tensor))
            return tm__fail(SELDP_ERR_SCHEMA,
                            "tm_model_copy_params: %s differs in dtype or shape between rank "
                            "%d and rank %d",
                            p->path, src->rank, dst->rank);
        memcpy(q->tensor.data, p->tensor.data, seldp_tensor_nbytes(&p->tensor));
    }
    return SELDP_OK;
}

tm_part tm_model_part(const tm_model *m)
{
    return m->part;
}

seldp_status tm_model_set_grad(tm_model *m, const char *path, const float *grad)
{
    int i = param_index(m, path);
    if (i < 0 || !m->grad[i])
        return tm__fail(SELDP_ERR_NOT_FOUND,
                        "rank %d: tm_model_set_grad: %s is not a trainable parameter of this "
                        "rank",
                        m->rank, path ? path : "(null)");
    memcpy(m->grad[i], grad, seldp_tensor_numel(&m->params[i].tensor) * sizeof *grad);
    return SELDP_OK;
}

void tm_model_set_seen(tm_model *m, int l, int e, bool seen)
{
    if (l < 0 || l >= m->cfg.layers || e < 0 || e >= m->cfg.experts)
        return;
    m->seen[(size_t)l * (size_t)m->cfg.experts + (size_t)e] = seen;
}
