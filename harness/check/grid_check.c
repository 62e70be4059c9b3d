/* The sharded run's rules (grid.h): which shard a rank holds, which session reduces it and
 * from which root; and the main thread's side: the options a sharded run refuses, the
 * logical weights assembled from the shards for the reference, the replica checks. */
#include <stdlib.h>
#include <string.h>

#include "sets.h"
#include "grid.h"
#include "router.h"
#include "run.h"
#include "rank.h"

static seldp_layout_config grid_config(const hx_run *run)
{
    return seldp_layout_get_config(run->layout->grid);
}

bool hx_grid_sharded(const hx_run *run)
{
    if (!run->layout || !run->layout->grid)
        return false;
    seldp_layout_config c = grid_config(run);
    return c.tp > 1 || c.pp > 1 || c.etp > 1;
}

seldp_status hx_grid_check_options(hx_run *run)
{
    const hx_options *o = &run->opts;
    const tm_config *m = &o->model;
    if (!run->layout->grid)
        return SELDP_OK;
    seldp_layout_config c = grid_config(run);
    if (!hx_grid_sharded(run))
        return SELDP_OK;
    if (m->layers % c.pp != 0)
        return hx_fail(SELDP_ERR_INVALID_ARGUMENT,
                       "--pp %d: must divide the layers (--layers %d): stage s holds layers "
                       "[s*L/pp, (s+1)*L/pp)",
                       c.pp, m->layers);
    if (m->vocab % c.tp != 0)
        return hx_fail(SELDP_ERR_INVALID_ARGUMENT,
                       "--tp %d: must divide the vocabulary (--vocab %d): the embedding is split "
                       "by rows over tensor parallelism",
                       c.tp, m->vocab);
    if (m->d_ff_shared % c.tp != 0)
        return hx_fail(SELDP_ERR_INVALID_ARGUMENT,
                       "--tp %d: must divide the shared expert's d_ff (--shared-expert-ff %d): "
                       "its w1 is split by rows, its w2 by columns",
                       c.tp, m->d_ff_shared);
    if (m->d_ff % c.etp != 0)
        return hx_fail(SELDP_ERR_INVALID_ARGUMENT,
                       "--etp %d: must divide the experts' d_ff (--d-ff %d): w1 is split by rows, "
                       "w2 by columns over expert-tensor parallelism",
                       c.etp, m->d_ff);
    /* a quantized base splits on whole blocks: NF4's 64 consecutive values of w2's rows, AWQ's
     * words of 8 group zeros of 32 values along w2's rows */
    int block = m->quant == TM_QUANT_NF4 ? TM_NF4_BLOCK : TM_AWQ_GROUP * 8;
    if (m->quant != TM_QUANT_NONE && c.etp > 1 && (m->d_ff / c.etp) % block != 0)
        return hx_fail(SELDP_ERR_INVALID_ARGUMENT,
                       "--quant %s with --etp %d: each expert-TP shard of w2 needs whole %s along "
                       "its rows: d_ff / etp (%d / %d) must be a multiple of %d",
                       tm_quant_name(m->quant), c.etp,
                       m->quant == TM_QUANT_NF4 ? "NF4 blocks" : "AWQ zero words", m->d_ff, c.etp,
                       block);
    const char *refused = NULL;
    for (int r = 0; !refused && r < o->world; r++)
        if (hx_backend_device(run->backend, r).kind != SELDP_DEVICE_HOST)
            refused = "ranks on GPUs (use --backend host)";
    if (refused)
        return hx_fail(SELDP_ERR_INVALID_ARGUMENT,
                       "--tp %d --pp %d --etp %d: %s is not supported with the sharded tiny-moe "
                       "yet",
                       c.tp, c.pp, c.etp, refused);
    return SELDP_OK;
}

tm_config hx_grid_shard_config(const hx_run *run)
{
    seldp_layout_config c = grid_config(run);
    tm_config cfg = run->opts.model;
    cfg.vocab /= c.tp;
    cfg.d_ff /= c.etp;
    cfg.d_ff_shared /= c.tp;
    return cfg;
}

tm_part hx_grid_part(const hx_run *run, int r)
{
    seldp_layout_config c = grid_config(run);
    int stage = seldp_layout_stage(run->layout->grid, r);
    int per = run->opts.model.layers / c.pp;
    tm_part part = {stage * per, (stage + 1) * per, stage == 0, stage == c.pp - 1};
    return part;
}

int hx_grid_batch_rank(const hx_run *run, int r)
{
    if (!hx_grid_sharded(run))
        return r; /* every rank draws its own tokens */
    const seldp_layout *g = run->layout->grid;
    const int *ranks = NULL;
    seldp_layout_group(g, SELDP_GROUP_PP, seldp_layout_group_of(g, SELDP_GROUP_PP, r), &ranks);
    return ranks ? ranks[0] : r;
}

static bool ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

hx_shard hx_grid_shard(const hx_run *run, int r, const char *path)
{
    hx_shard s = {0, 1, 0, 0};
    if (!run->layout->grid)
        return s;
    seldp_layout_config c = grid_config(run);
    int tp_rank = seldp_layout_position(run->layout->grid, SELDP_GROUP_TP, r);
    int etp_rank = seldp_layout_position(run->layout->grid, SELDP_GROUP_EXPERT_TP, r);
    bool expert = strstr(path, ".experts.") != NULL;
    bool nf4 = run->opts.model.quant == TM_QUANT_NF4;
    if (c.tp > 1 && (strcmp(path, "embed.weight") == 0 || strcmp(path, "lm_head.weight") == 0 ||
                     (strstr(path, ".shared_expert.") && ends_with(path, ".w1.weight"))))
        s = (hx_shard){0, c.tp, tp_rank, 0};
    else if (c.tp > 1 && strstr(path, ".shared_expert.") && ends_with(path, ".w2.weight"))
        s = (hx_shard){1, c.tp, tp_rank, 0};
    else if (c.etp > 1 && expert && strstr(path, ".w1.") && !ends_with(path, ".lora_a.weight"))
        s = (hx_shard){0, c.etp, etp_rank, 0}; /* rows: the weight, its base, lora_b */
    else if (c.etp > 1 && expert && strstr(path, ".w2.") && !ends_with(path, ".lora_b.weight"))
        /* columns: the weight, its base (NF4's packed as [D, F/2] and [D, F/64]), lora_a */
        s = (hx_shard){1, c.etp, etp_rank,
                       nf4 && !ends_with(path, ".lora_a.weight") ? run->opts.model.d_model : 0};
    return s;
}

const char *hx_grid_logical_path(const char *path)
{
    return strcmp(path, "lm_head.weight") == 0 ? "embed.weight" : path;
}

hx_grid_kind hx_grid_kind_of(const hx_run *run, const tm_param_info *p)
{
    seldp_layout_config c = grid_config(run);
    if ((p->role & TM_ROLE_ADAPTER) && c.etp > 1 &&
        (ends_with(p->path, ".w1.lora_a.weight") || ends_with(p->path, ".w2.lora_b.weight")))
        return HX_GRID_EXPERT_TP;
    if (p->role & TM_ROLES_EXPERT_GROUP)
        return HX_GRID_EXPERT;
    if (strcmp(p->path, "embed.weight") == 0 || strcmp(p->path, "lm_head.weight") == 0)
        return c.pp > 1 ? HX_GRID_EMB : HX_GRID_DENSE;
    if (strstr(p->path, ".shared_expert."))
        return HX_GRID_DENSE;
    return c.tp > 1 ? HX_GRID_SP : HX_GRID_DENSE;
}

/* ---- logical tensors from shards ------------------------------------------------------- */

/* Copy a shard's bytes into its range of the logical tensor (or the reverse with
 * to_logical false). Tensors of 1 or 2 dimensions, the same dtype. */
void hx_shard_copy(void *logical, const seldp_tensor *lt, void *shard, hx_shard s, bool to_logical)
{
    size_t es = seldp_dtype_size(lt->dtype);
    /* a 1-D tensor is rows of one element (an NF4 base split by rows is a byte range) */
    size_t rows = s.rows ? (size_t)s.rows : (size_t)lt->shape[0];
    size_t cols = seldp_tensor_numel(lt) / rows;
    if (s.parts == 1 || s.dim == 0) {
        size_t n = rows / (size_t)s.parts * cols * es;
        char *at = (char *)logical + (size_t)s.index * n;
        if (to_logical)
            memcpy(at, shard, n);
        else
            memcpy(shard, at, n);
        return;
    }
    size_t w = cols / (size_t)s.parts * es;
    for (size_t i = 0; i < rows; i++) {
        char *at = (char *)logical + i * cols * es + (size_t)s.index * w;
        if (to_logical)
            memcpy(at, (char *)shard + i * w, w);
        else
            memcpy((char *)shard + i * w, at, w);
    }
}

void hx_shard_slice(const double *full, const seldp_tensor *logical, hx_shard s, double *out)
{
    seldp_tensor t = *logical;
    t.dtype = SELDP_F64;
    hx_shard_copy((void *)full, &t, out, s, false);
}

seldp_status hx_grid_assemble(const hx_run *run, tm_model *into)
{
    for (int r = 0; r < run->opts.world; r++) {
        const hx_rank *rk = &run->ranks[r];
        for (size_t i = 0; i < rk->n_params; i++) {
            const tm_param_info *p = tm_param_at(rk->model, i);
            const hx_set *set = hx_set_of(run, r, p);
            if (p->alias || !set || set->root != r)
                continue;
            const tm_param_info *q = tm_param_find(into, hx_grid_logical_path(p->path));
            if (!q || q->tensor.dtype != p->tensor.dtype)
                return hx_fail(SELDP_ERR_INTERNAL,
                               "rank %d: %s has no logical tensor of its dtype to go into", r,
                               p->path);
            hx_shard_copy(q->tensor.data, &q->tensor, p->tensor.data,
                          hx_grid_shard(run, r, p->path), true);
        }
    }
    return SELDP_OK;
}

/* ---- the reference's inputs ------------------------------------------------------------ */

/* Where batch rank b's (L,T,K) choices begin in hx_grid_merge_choices' array. */
size_t hx_grid_choices_offset(const hx_run *run, int b)
{
    const tm_config *m = &run->opts.model;
    size_t at = 0;
    for (int i = 0; i < b; i++)
        at += (size_t)m->layers * run->ranks[run->batch_ranks[i]].T * (size_t)m->top_k;
    return at;
}

/* With pipeline parallelism a batch's layers are routed on the ranks of their stages: its
 * (L,T,K) choices come together from its pipeline group (*out NULL without pipelining). */
seldp_status hx_grid_merge_choices(const hx_run *run, int **out)
{
    *out = NULL;
    if (!hx_grid_sharded(run))
        return SELDP_OK;
    const tm_config *m = &run->opts.model;
    int *all = hx_calloc(hx_grid_choices_offset(run, run->n_batch) + 1, sizeof *all);
    if (!all)
        return hx_fail(SELDP_ERR_NOMEM, "out of memory");
    for (int r = 0; r < run->opts.world; r++) {
        const hx_rank *rk = &run->ranks[r];
        int b = 0;
        while (run->batch_ranks[b] != rk->batch_rank)
            b++;
        size_t slots = rk->T * (size_t)m->top_k;
        tm_part part = hx_grid_part(run, r);
        for (int l = part.first_layer; l < part.end_layer && rk->choices; l++)
            memcpy(all + hx_grid_choices_offset(run, b) + (size_t)l * slots,
                   rk->choices + (size_t)l * slots, slots * sizeof *all);
    }
    *out = all;
    return SELDP_OK;
}

void hx_grid_layout_md(const hx_run *run, hx_buf *b)
{
    const hx_layout *l = run->layout;
    const seldp_layout *g = l->grid;
    int *owned = hx_calloc((size_t)l->experts, sizeof *owned);
    hx_buf_puts(b,
                "## Layout\n\n| rank | stage | TP rank | CP rank | ETP rank | dense group | EP "
                "group | expert-data group | experts |\n|---|---|---|---|---|---|---|---|---|\n");
    for (int r = 0; owned && r < l->world; r++) {
        hx_buf_printf(b, "| %d | %d | %d | %d | %d | ", r, seldp_layout_stage(g, r),
                      seldp_layout_position(g, SELDP_GROUP_TP, r),
                      seldp_layout_position(g, SELDP_GROUP_CP, r),
                      seldp_layout_position(g, SELDP_GROUP_EXPERT_TP, r));
        static const seldp_group_kind kinds[3] = {SELDP_GROUP_DP, SELDP_GROUP_EP,
                                                  SELDP_GROUP_EXPERT_DP};
        static const hx_set_kind sets[3] = {HX_SET_DENSE, HX_SET_KINDS, HX_SET_EXPERT};
        for (int k = 0; k < 3; k++) {
            const int *ranks = NULL;
            int n = seldp_layout_group(g, kinds[k], seldp_layout_group_of(g, kinds[k], r), &ranks);
            hx_buf_puts(b, "[");
            for (int i = 0; i < n; i++)
                hx_buf_printf(b, "%s%d", i ? "," : "", ranks[i]);
            const hx_set *set = sets[k] != HX_SET_KINDS ? hx_set_member(run, r, sets[k]) : NULL;
            bool root = set && set->root == r;
            hx_buf_printf(b, "]%s | ", root ? " (root)" : "");
        }
        int n = hx_layout_owned(l, r, owned);
        for (int i = 0; i < n; i++)
            hx_buf_printf(b, "%s%d", i ? ", " : "", owned[i]);
        hx_buf_puts(b, n ? " |\n" : "- |\n");
    }
    free(owned);
}

int hx_data_shard_of(const hx_run *run, int r, int *ranks)
{
    const seldp_layout *g = run->layout->grid;
    if (!g) {
        ranks[0] = r;
        return 1;
    }
    const int *cp = NULL, *tp = NULL;
    int n = 0;
    int n_cp =
        seldp_layout_group(g, SELDP_GROUP_CP, seldp_layout_group_of(g, SELDP_GROUP_CP, r), &cp);
    for (int c = 0; c < n_cp; c++) {
        int n_tp = seldp_layout_group(g, SELDP_GROUP_TP,
                                      seldp_layout_group_of(g, SELDP_GROUP_TP, cp[c]), &tp);
        for (int t = 0; t < n_tp; t++)
            ranks[n++] = tp[t];
    }
    return n;
}

void hx_shard_batch_free(hx_shard_batch *b)
{
    for (int i = 0; i < b->n; i++) {
        free(b->tokens[i]);
        free(b->targets[i]);
        free(b->choices[i]);
    }
    free(b->tokens);
    free(b->targets);
    free(b->choices);
    free(b->counts);
    *b = (hx_shard_batch){0};
}

seldp_status hx_grid_shard_batch(const hx_run *run, const int *merged, hx_shard_batch *out)
{
    seldp_status st = SELDP_OK;
    const tm_config *m = &run->opts.model;
    const size_t L = (size_t)m->layers, K = (size_t)m->top_k;
    int W = run->opts.world;
    *out = (hx_shard_batch){0};
    if (!run->layout->grid)
        return SELDP_OK;
    seldp_layout_config c = seldp_layout_get_config(run->layout->grid);
    if (c.tp * c.cp == 1)
        return SELDP_OK;
    int *ranks = hx_calloc((size_t)W, sizeof *ranks);
    bool *done = hx_calloc((size_t)W, sizeof *done);
    out->tokens = hx_calloc((size_t)W, sizeof *out->tokens);
    out->targets = hx_calloc((size_t)W, sizeof *out->targets);
    out->choices = hx_calloc((size_t)W, sizeof *out->choices);
    out->counts = hx_calloc((size_t)W, sizeof *out->counts);
    if (!ranks || !done || !out->tokens || !out->targets || !out->choices || !out->counts)
        HX_FAIL(SELDP_ERR_NOMEM, "out of memory");
    for (int b = 0; b < run->n_batch; b++) {
        if (done[run->batch_ranks[b]])
            continue;
        int n = hx_data_shard_of(run, run->batch_ranks[b], ranks), s = out->n++;
        size_t S = 0;
        for (int k = 0; k < n; k++)
            S += run->ranks[ranks[k]].T;
        out->counts[s] = S;
        out->tokens[s] = hx_calloc(S + 1, sizeof **out->tokens);
        out->targets[s] = hx_calloc(S + 1, sizeof **out->targets);
        out->choices[s] = hx_calloc(L * S * K + 1, sizeof **out->choices);
        if (!out->tokens[s] || !out->targets[s] || !out->choices[s])
            HX_FAIL(SELDP_ERR_NOMEM, "out of memory");
        size_t at = 0;
        for (int k = 0; k < n; k++) {
            const hx_rank *rk = &run->ranks[ranks[k]];
            int q = 0; /* its place among the batch ranks, for the merged choices */
            while (run->batch_ranks[q] != ranks[k])
                q++;
            const int *ch = merged ? merged + hx_grid_choices_offset(run, q) : rk->choices;
            memcpy(out->tokens[s] + at, rk->tokens, rk->T * sizeof *rk->tokens);
            memcpy(out->targets[s] + at, rk->targets, rk->T * sizeof *rk->targets);
            for (size_t l = 0; ch && l < L; l++)
                memcpy(out->choices[s] + (l * S + at) * K, ch + l * rk->T * K,
                       rk->T * K * sizeof *ch);
            at += rk->T;
            done[ranks[k]] = true;
        }
    }
fail:
    free(ranks);
    free(done);
    if (st != SELDP_OK)
        hx_shard_batch_free(out);
    return st;
}
