/* Checkpoints of a sharded run (docs/harness.md, Checkpoints) in checkpoint.h's format: whole
 * logical tensors, one writer per logical tensor. The shards of a tensor split over TP (ETP) are
 * gathered over the writer's TP (expert-TP) group, whose members hold the other parts; a rank
 * resuming reads its part of each logical tensor, so a checkpoint of any layout resumes under any
 * other (TP shards re-split, stages re-cut, experts re-owned). */
#define _POSIX_C_SOURCE 200809L

#include <stdlib.h>
#include <string.h>

#include "sets.h"
#include "grid.h"
#include "grid_ckpt.h"
#include "optimizer.h"
#include "rank.h"

seldp_tensor hx_grid_logical_view(const seldp_tensor *shard, hx_shard s, seldp_dtype dtype)
{
    seldp_tensor t = *shard;
    t.dtype = dtype;
    if (s.parts > 1)
        t.shape[t.ndim == 1 ? 0 : s.dim] *= s.parts;
    return t;
}

/* Gather `bytes` of this rank's part over the group that splits p, into the logical tensor
 * `out` (every member calls it; out is written on every member). */
static seldp_status gather_logical(hx_rank *rk, const tm_param_info *p, const void *mine,
                                   seldp_dtype dtype, void *out)
{
    hx_shard s = hx_grid_shard(rk->run, rk->rank, p->path);
    seldp_tensor part = p->tensor;
    part.dtype = dtype;
    size_t bytes = seldp_tensor_nbytes(&part);
    if (s.parts == 1) {
        memcpy(out, mine, bytes);
        return SELDP_OK;
    }
    seldp_comm *group = (p->role & TM_ROLES_EXPERT_GROUP) ? rk->grid->etp : rk->grid->tp;
    char *all = hx_calloc((size_t)s.parts * bytes + 1, 1);
    if (!all)
        return hx_fail(SELDP_ERR_NOMEM, "rank %d: out of memory", rk->rank);
    seldp_status st = seldp_comm_allgather(group, mine, all, bytes, SELDP_HOST_DEVICE);
    if (st != SELDP_OK) {
        free(all);
        return hx_fail_lib(st, "rank %d: gathering %s for the checkpoint", rk->rank, p->path);
    }
    seldp_tensor lt = hx_grid_logical_view(&p->tensor, s, dtype);
    for (int k = 0; k < s.parts; k++)
        hx_shard_copy(out, &lt, all + (size_t)k * bytes, (hx_shard){s.dim, s.parts, k, s.rows},
                      true);
    free(all);
    return SELDP_OK;
}

seldp_status hx_grid_ckpt_add(hx_rank *rk, hx_st_writer *w, hx_grid_ckpt_keep *keep)
{
    seldp_status st = SELDP_OK;
    char name[300];
    size_t n = tm_param_count(rk->model);
    keep->buffers = hx_calloc(4 * n + 1, sizeof *keep->buffers);
    if (!keep->buffers)
        return hx_fail(SELDP_ERR_NOMEM, "rank %d: out of memory", rk->rank);
    for (size_t i = 0; i < n; i++) {
        const tm_param_info *p = tm_param_at(rk->model, i);
        if (p->alias)
            continue;
        bool writes = hx_set_writes(rk->run, rk->rank, p);
        hx_shard s = hx_grid_shard(rk->run, rk->rank, p->path);
        if (s.parts == 1 && !writes)
            continue; /* nothing to gather: another rank writes it whole */
        /* the parameter, its FP32 master, AdamW's moments (optimizer.h) */
        const void *sources[4] = {p->tensor.data, NULL, NULL, NULL};
        const char *prefixes[4] = {"", NULL, NULL, NULL};
        int k = 1;
        if (rk->master && rk->master[i]) {
            sources[k] = rk->master[i];
            prefixes[k++] = CKPT_MASTER_PREFIX;
        }
        float *exp_avg = NULL, *exp_avg_sq = NULL;
        if (hx_opt_moments(rk, i, &exp_avg, &exp_avg_sq)) {
            sources[k] = exp_avg;
            prefixes[k++] = CKPT_EXP_AVG_PREFIX;
            sources[k] = exp_avg_sq;
            prefixes[k++] = CKPT_EXP_AVG_SQ_PREFIX;
        }
        for (int m = 0; m < k; m++) {
            seldp_dtype dtype = m ? SELDP_F32 : p->tensor.dtype;
            seldp_tensor lt = hx_grid_logical_view(&p->tensor, s, dtype);
            const void *mine = sources[m];
            const void *logical = mine;
            if (s.parts > 1) { /* every member of the split gathers; the writer keeps it */
                void *whole = hx_calloc(seldp_tensor_nbytes(&lt) + 1, 1);
                if (!whole)
                    HX_FAIL(SELDP_ERR_NOMEM, "rank %d: out of memory", rk->rank);
                keep->buffers[keep->n++] = whole;
                HX_CHECK(gather_logical(rk, p, mine, dtype, whole));
                logical = whole;
            }
            if (!writes)
                continue;
            snprintf(name, sizeof name, "%s%s", prefixes[m], hx_grid_logical_path(p->path));
            HX_CHECK(hx_st_add(w, name, dtype, lt.ndim, lt.shape, logical));
            keep->written++;
        }
    }
fail:
    return st;
}

void hx_grid_ckpt_keep_free(hx_grid_ckpt_keep *keep)
{
    for (size_t i = 0; i < keep->n; i++)
        free(keep->buffers[i]);
    free(keep->buffers);
    *keep = (hx_grid_ckpt_keep){0};
}
