/* --dump DIR (docs/formats.md, Dumps): for one step, rank{r}.safetensors with the parameters (the
 * rank's shards under their logical paths) as that step's forward used them (`param/{path}`),
 * the reduced gradients (`grad/{path}`, a tied parameter under its smallest path), `tokens`
 * and `targets` (I32), and __metadata__ `config`, `layout` and `shards` as JSON strings and
 * `stage`; manifest.json with the world, the layout, the token counts, the batch ranks and
 * data shards, and the global weights the reductions returned. With one rank per MPI process each
 * process writes its own rank file and rank 0 the manifest (from its mirrors of the others). */
#include <stdlib.h>
#include <string.h>

#include "grid.h"
#include "microbatch.h"
#include "optimizer.h"
#include "dump.h"
#include "rank.h"
#include "report.h"
#include "run.h"
#include "safetensors.h"

/* The `shards` of rank r (docs/formats.md, Dumps): path -> {"shape": logical shape, "dim": d,
 * "offset": o} for every tensor the rank holds a part of, under the path it registers. */
static void shards_json(const hx_run *run, const hx_rank *rk, hx_buf *b)
{
    bool first = true;
    hx_buf_puts(b, "{");
    for (size_t i = 0; i < tm_param_count(rk->model); i++) {
        const tm_param_info *p = tm_param_at(rk->model, i);
        hx_shard s = hx_grid_shard(run, rk->rank, p->path);
        if (p->alias || s.parts == 1)
            continue;
        /* the shard's shape, or its [rows, n / rows] view (an NF4 base split by columns) */
        int64_t shape[2] = {p->tensor.shape[0], p->tensor.ndim == 2 ? p->tensor.shape[1] : 0};
        int ndim = p->tensor.ndim;
        if (s.rows) {
            ndim = 2;
            shape[0] = s.rows;
            shape[1] = (int64_t)seldp_tensor_numel(&p->tensor) / s.rows;
        }
        hx_buf_printf(b, "%s\"%s\": {\"shape\": [", first ? "" : ", ", p->path);
        for (int d = 0; d < ndim; d++)
            hx_buf_printf(b, "%s%lld", d ? ", " : "",
                          (long long)shape[d] * (d == s.dim ? s.parts : 1));
        hx_buf_printf(b, "], \"dim\": %d, \"offset\": %lld}", s.dim,
                      (long long)shape[s.dim] * s.index);
        first = false;
    }
    hx_buf_puts(b, "}");
}

static seldp_status dump_rank(const hx_run *run, const hx_rank *rk, int step, const char *config,
                              const char *layout, const char *dir)
{
    seldp_status st = SELDP_OK;
    hx_st_writer *w = NULL;
    char name[1024], path[4096], number[32];
    HX_CHECK(hx_st_writer_create(&w));
    HX_CHECK(hx_st_add_metadata(w, "config", config));
    HX_CHECK(hx_st_add_metadata(w, "layout", layout));
    snprintf(number, sizeof number, "%d", rk->rank);
    HX_CHECK(hx_st_add_metadata(w, "rank", number));
    snprintf(number, sizeof number, "%d", step + 1);
    HX_CHECK(hx_st_add_metadata(w, "step", number));
    HX_CHECK(hx_st_add_metadata(w, "expert_reduce", hx_flow_name(run->opts.flow)));
    snprintf(number, sizeof number, "%d",
             run->layout->grid ? seldp_layout_stage(run->layout->grid, rk->rank) : 0);
    HX_CHECK(hx_st_add_metadata(w, "stage", number));
    hx_buf shards = {0};
    shards_json(run, rk, &shards);
    st = hx_buf_ok(&shards) ? hx_st_add_metadata(w, "shards", shards.data) : SELDP_ERR_NOMEM;
    hx_buf_free(&shards);
    if (st != SELDP_OK)
        HX_FAIL(st, "rank %d: the shards of the dump", rk->rank);
    for (size_t i = 0; i < tm_param_count(rk->model); i++) {
        const tm_param_info *p = tm_param_at(rk->model, i);
        snprintf(name, sizeof name, "param/%s", p->path);
        /* as the step's forward used them: before the update (optimizer.h) */
        HX_CHECK(hx_st_add(w, name, p->tensor.dtype, p->tensor.ndim, p->tensor.shape,
                           hx_opt_param_before(run, rk, i)));
    }
    HX_CHECK(hx_opt_dump(run, rk, w)); /* param_next/, opt/, the optimizer metadata */
    const seldp_model *view = tm_model_view(rk->model);
    for (size_t i = 0; i < seldp_grads_count(rk->grads); i++) {
        seldp_param_id id;
        const seldp_tensor *g;
        seldp_grads_at(rk->grads, i, &id, &g);
        const seldp_param *p = seldp_model_find_id(view, id);
        if (!p)
            HX_FAIL(SELDP_ERR_INTERNAL, "rank %d: a gradient of an unknown id", rk->rank);
        snprintf(name, sizeof name, "grad/%s", p->path);
        HX_CHECK(hx_st_add(w, name, g->dtype, g->ndim, g->shape, g->data));
    }
    int64_t t = (int64_t)rk->T;
    HX_CHECK(hx_st_add(w, "tokens", SELDP_I32, 1, &t, rk->tokens));
    HX_CHECK(hx_st_add(w, "targets", SELDP_I32, 1, &t, rk->targets));
    snprintf(path, sizeof path, "%s/rank%d.safetensors", dir, rk->rank);
    HX_CHECK(hx_st_write(w, path));
fail:
    hx_st_writer_destroy(w);
    return st;
}

/* The batch ranks of each data shard (docs/model.md, Routing extensions): the ranks of one
 * data-parallel index at stage 0, context chunks in order and each chunk's TP ranks in order. */
static void data_shards(const hx_run *run, hx_buf *b)
{
    bool *done = hx_calloc((size_t)run->opts.world, sizeof *done);
    int *ranks = hx_calloc((size_t)run->opts.world, sizeof *ranks);
    bool first = true;
    hx_buf_puts(b, "[");
    for (int i = 0; done && ranks && i < run->n_batch; i++) {
        int r = run->batch_ranks[i];
        if (done[r])
            continue;
        int n = hx_data_shard_of(run, r, ranks);
        hx_buf_printf(b, "%s[", first ? "" : ", ");
        first = false;
        for (int k = 0; k < n; k++) {
            hx_buf_printf(b, "%s%d", k ? ", " : "", ranks[k]);
            done[ranks[k]] = true;
        }
        hx_buf_puts(b, "]");
    }
    hx_buf_puts(b, "]");
    free(done);
    free(ranks);
}

/* A sharded run's global weights: what each rank's reductions returned, per set (sets.h):
 * dense and sequence-parallel `reduce` (tokens), embedding and expert-data x expert-TP `sum`
 * (active ranks), expert-data as the expert flow says. */
static void sharded_weights(const hx_run *run, hx_buf *b)
{
    static const char *const keys[HX_SET_KINDS] = {[HX_SET_DENSE] = "dense",
                                                   [HX_SET_SP] = "sequence_parallel",
                                                   [HX_SET_EMB] = "embedding",
                                                   [HX_SET_EXPERT] = "expert_data",
                                                   [HX_SET_EXPERT_TP] = "expert_data_expert_tp"};
    hx_buf_puts(b, ",\n  \"global_weights\": [");
    for (int r = 0; r < run->opts.world; r++) {
        const hx_rank *rk = &run->ranks[r];
        hx_buf_printf(b, "%s\n    {\"rank\": %d", r ? "," : "", r);
        for (int i = 0; i < rk->n_sets; i++)
            if (keys[rk->sets[i].set->kind])
                hx_buf_printf(b, ", \"%s\": %llu", keys[rk->sets[i].set->kind],
                              (unsigned long long)rk->sets[i].global_weight);
        hx_buf_puts(b, "}");
    }
    hx_buf_puts(b, "\n  ]\n}\n");
}

static void manifest(const hx_run *run, int step, const char *config, const char *layout, hx_buf *b)
{
    const hx_layout *l = run->layout;
    int W = run->opts.world;
    uint64_t total = 0;
    hx_buf_printf(b, "{\n  \"world\": %d,\n  \"step\": %d,\n  \"files\": [", W, step + 1);
    for (int r = 0; r < W; r++)
        hx_buf_printf(b, "%s\"rank%d.safetensors\"", r ? ", " : "", r);
    hx_buf_printf(b, "],\n  \"config\": %s,\n  \"layout\": %s,\n", config, layout);
    hx_buf_printf(b,
                  "  \"expert_reduce\": \"%s\",\n  \"fp32_master\": %s,\n  \"policy\": \"%s\",\n",
                  hx_flow_name(run->opts.flow), run->opts.fp32_master ? "true" : "false",
                  hx_policy_name(run->opts.policy));
    hx_buf_puts(b, "  \"token_counts\": [");
    for (int r = 0; r < W; r++) {
        hx_buf_printf(b, "%s%zu", r ? ", " : "", run->ranks[r].T);
        total += run->ranks[r].T;
    }
    total = 0;
    hx_buf_puts(b, "],\n");
    hx_micro_manifest(run, b); /* micro_batches, micro_batch_sizes (microbatch.h) */
    hx_buf_puts(b, "  \"batch_ranks\": [");
    for (int i = 0; i < run->n_batch; i++) {
        hx_buf_printf(b, "%s%d", i ? ", " : "", run->batch_ranks[i]);
        total += run->ranks[run->batch_ranks[i]].T;
    }
    hx_buf_puts(b, "],\n  \"data_shards\": ");
    data_shards(run, b);
    hx_buf_printf(b, ",\n  \"global_tokens\": %llu,\n  \"loss\": ", (unsigned long long)total);
    hx_buf_json_number(b, run->steps[step].loss);
    hx_buf_puts(b, ",\n  \"reference_loss\": ");
    hx_buf_json_number(b, run->steps[step].ref_loss);
    if (hx_grid_sharded(run)) {
        sharded_weights(run, b);
        return;
    }
    hx_buf_printf(b,
                  ",\n  \"global_weights\": {\n    \"shared\": {\"ranks\": \"all\", \"root\": %d, "
                  "\"method\": \"reduce\", \"global_weight\": %llu},\n"
                  "    \"expert_data_groups\": [",
                  l->shared.root, (unsigned long long)run->set_weights[0]);
    for (int d = 0; d < l->n_data; d++) {
        const hx_group *g = &l->data[d];
        hx_buf_printf(b, "%s\n      {\"group\": \"d%d\", \"ranks\": [", d ? "," : "", d);
        for (int i = 0; i < g->size; i++)
            hx_buf_printf(b, "%s%d", i ? ", " : "", g->ranks[i]);
        hx_buf_printf(b, "], \"root\": %d, \"experts\": [", g->root);
        bool first = true;
        for (int e = 0; e < l->experts; e++) {
            if (l->data_of[e] != d)
                continue;
            hx_buf_printf(b, "%s%d", first ? "" : ", ", e);
            first = false;
        }
        hx_buf_printf(b, "], \"method\": \"%s\", \"global_weight\": %llu}",
                      run->opts.flow == HX_FLOW_SUM ? "sum" : "reduce",
                      (unsigned long long)run->set_weights[1 + d]);
    }
    hx_buf_puts(b, "\n    ]\n  }\n}\n");
}

/* The config JSON (docs/formats.md, Config JSON) with the grid's sizes (tp, pp, cp, ep, etp)
 * appended. */
static void grid_config_json(const hx_run *run, hx_buf *b)
{
    hx_buf model = {0};
    hx_config_json(&run->opts.model, &model);
    if (!hx_buf_ok(&model) || model.len < 2) {
        b->failed = true;
        hx_buf_free(&model);
        return;
    }
    seldp_layout_config c = SELDP_LAYOUT_CONFIG_INIT;
    if (run->layout->grid)
        c = seldp_layout_get_config(run->layout->grid);
    int ep = run->layout->n_ep ? run->layout->world / run->layout->n_ep : 1;
    hx_buf_append(b, model.data, model.len - 1); /* without the closing brace */
    hx_buf_printf(b, ", \"tp\": %d, \"pp\": %d, \"cp\": %d, \"ep\": %d, \"etp\": %d}", c.tp, c.pp,
                  c.cp, ep, c.etp);
    hx_buf_free(&model);
}

seldp_status hx_dump_write(const hx_run *run, int step, const char *dir)
{
    seldp_status st = SELDP_OK;
    hx_buf config = {0}, layout = {0}, text = {0};
    char path[4096];
    HX_CHECK(hx_mkdir_p(dir));
    grid_config_json(run, &config);
    hx_layout_json(run->layout, &layout);
    if (!hx_buf_ok(&config) || !hx_buf_ok(&layout))
        HX_FAIL(SELDP_ERR_NOMEM, "out of memory writing the dump");
    for (int r = 0; r < run->opts.world; r++)
        if (hx_backend_is_local(run->backend, r))
            HX_CHECK(dump_rank(run, &run->ranks[r], step, config.data, layout.data, dir));
    if (hx_run_is_root(run)) {
        manifest(run, step, config.data, layout.data, &text);
        if (!hx_buf_ok(&text))
            HX_FAIL(SELDP_ERR_NOMEM, "out of memory writing the manifest");
        snprintf(path, sizeof path, "%s/manifest.json", dir);
        HX_CHECK(hx_write_file(path, text.data, text.len));
    }
fail:
    hx_buf_free(&config);
    hx_buf_free(&layout);
    hx_buf_free(&text);
    return st;
}
