/* What the update adds to a dump (optimizer.h, docs/formats.md, Dumps). */
#define _POSIX_C_SOURCE 200809L

#include <stdio.h>

#include "optimizer.h"
#include "safetensors.h"
#include "zero.h"
#include "run.h"
#include "rank.h"

/* rk's record of the dumped step's update of occurrence i, or NULL (no gradient). */
static const hx_opt_param *record(const hx_run *run, const hx_rank *rk, size_t i)
{
    (void)run;
    if (!rk->opt || i >= rk->opt->n || !rk->opt->p[i].has_grad)
        return NULL;
    return &rk->opt->p[i];
}

/* The stored bytes before the update, where the rank kept them. */
static const void *before(const hx_rank *rk, size_t i)
{
    const hx_opt_param *q = rk->opt && i < rk->opt->n ? &rk->opt->p[i] : NULL;
    return q && q->snap ? q->stored0 : tm_param_at(rk->model, i)->tensor.data;
}

const void *hx_opt_param_before(const hx_run *run, const hx_rank *rk, size_t i)
{
    (void)run;
    const tm_param_info *p = tm_param_at(rk->model, i);
    /* the tied alias shares embed.weight's storage and record */
    for (size_t k = 0; p->alias && k < rk->n_params; k++) {
        const tm_param_info *q = tm_param_at(rk->model, k);
        if (!q->alias && q->id == p->id)
            return before(rk, k);
    }
    return before(rk, i);
}

static void metadata(const hx_run *run, const hx_rank *rk, hx_buf *b)
{
    const hx_options *o = &run->opts;
    hx_buf_printf(b, "{\"name\": \"%s\", \"lr\": ", hx_optimizer_name(o->optimizer));
    hx_buf_json_number(b, o->lr);
    if (o->optimizer == HX_OPT_ADAMW) {
        hx_buf_puts(b, ", \"beta1\": ");
        hx_buf_json_number(b, o->adam_beta1);
        hx_buf_puts(b, ", \"beta2\": ");
        hx_buf_json_number(b, o->adam_beta2);
        hx_buf_puts(b, ", \"eps\": ");
        hx_buf_json_number(b, o->adam_eps);
        hx_buf_puts(b, ", \"weight_decay\": ");
        hx_buf_json_number(b, o->weight_decay);
    }
    if (o->loss_scale_given) {
        hx_buf_puts(b, ", \"loss_scale\": ");
        hx_buf_json_number(b, rk->opt ? rk->opt->loss_scale : 1.0); /* grad/ is S times */
    }
    hx_buf_printf(b, ", \"skipped\": %s, \"steps\": {",
                  rk->opt && rk->opt->skipped ? "true" : "false");
    bool first = true;
    for (size_t i = 0; i < rk->n_params; i++) {
        const hx_opt_param *q = record(run, rk, i);
        if (!q)
            continue;
        hx_buf_printf(b, "%s\"%s\": %lld", first ? "" : ", ", tm_param_at(rk->model, i)->path,
                      (long long)q->steps0);
        first = false;
    }
    hx_buf_puts(b, "}}");
}

seldp_status hx_opt_dump(const hx_run *run, const hx_rank *rk, hx_st_writer *w)
{
    seldp_status st = SELDP_OK;
    char name[1024];
    hx_buf meta = {0};
    metadata(run, rk, &meta);
    st = hx_buf_ok(&meta) ? hx_st_add_metadata(w, "optimizer", meta.data) : SELDP_ERR_NOMEM;
    hx_buf_free(&meta);
    if (st != SELDP_OK)
        return hx_fail(st, "rank %d: the optimizer metadata of the dump", rk->rank);
    if (run->opts.zero) {
        hx_buf map = {0};
        hx_zero_dump_json(rk, &map);
        st = hx_buf_ok(&map) ? hx_st_add_metadata(w, "shard_map", map.data) : SELDP_ERR_NOMEM;
        hx_buf_free(&map);
        if (st != SELDP_OK)
            return hx_fail(st, "rank %d: the shard map of the dump", rk->rank);
    }
    for (size_t i = 0; i < rk->n_params; i++) {
        const tm_param_info *p = tm_param_at(rk->model, i);
        snprintf(name, sizeof name, "param_next/%s", p->path);
        HX_CHECK(
            hx_st_add(w, name, p->tensor.dtype, p->tensor.ndim, p->tensor.shape, p->tensor.data));
        const hx_opt_param *q = record(run, rk, i);
        if (!q)
            continue;
        const struct {
            const char *key;
            const float *data;
        } state[] = {{"exp_avg", q->m0},
                     {"exp_avg_sq", q->v0},
                     {"master", (rk->master && rk->master[i]) || q->master ? q->w0 : NULL}};
        for (size_t k = 0; k < sizeof state / sizeof state[0]; k++) {
            if (!state[k].data)
                continue;
            snprintf(name, sizeof name, "opt/%s/%s", p->path, state[k].key);
            HX_CHECK(hx_st_add(w, name, SELDP_F32, p->tensor.ndim, p->tensor.shape, state[k].data));
        }
    }
fail:
    return st;
}
