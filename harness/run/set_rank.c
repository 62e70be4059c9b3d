/* A rank's replica sets (sets.h): the communicators split round by round, the sessions
 * initialized from their roots, the weight and the export scale of each set's reduction. */
#define _POSIX_C_SOURCE 200809L

#include <stdlib.h>
#include <string.h>

#include "rank_tensors.h"
#include "set_rank.h"
#include "grid.h"
#include "inject.h"
#include "checks.h"
#include "shares.h"
#include "gpu_rank.h"
#include "rank.h"
#include "run.h"
#include "sets.h"
#include "loss_scale.h"

seldp_status hx_rank_sets_list(hx_rank *rk)
{
    const hx_run *run = rk->run;
    const hx_sets *s = &run->sets;
    free(rk->sets);
    rk->sets = hx_calloc((size_t)(s->n_rounds ? s->n_rounds : 1), sizeof *rk->sets);
    if (!rk->sets)
        return hx_fail(SELDP_ERR_NOMEM, "rank %d: out of memory", rk->rank);
    rk->n_sets = 0;
    for (int k = 0; k < s->n_rounds; k++) {
        int i = s->member[k * run->opts.world + rk->rank];
        if (i >= 0)
            rk->sets[rk->n_sets++] = (hx_rank_set){&s->sets[i], NULL, NULL, 0};
    }
    return SELDP_OK;
}

seldp_status hx_rank_sets_split(hx_rank *rk)
{
    const hx_run *run = rk->run;
    const hx_sets *s = &run->sets;
    seldp_status st = hx_rank_sets_list(rk);
    for (int k = 0, at = 0; st == SELDP_OK && k < s->n_rounds; k++) {
        int i = s->member[k * run->opts.world + rk->rank];
        const hx_set *set = i >= 0 ? &s->sets[i] : NULL;
        seldp_comm *comm = NULL;
        st = seldp_comm_split(rk->world, set ? set->index : SELDP_COMM_NO_GROUP,
                              set ? hx_set_position(set, rk->rank) : 0, &comm);
        if (st != SELDP_OK)
            return hx_fail_lib(st, "rank %d: building its %s group", rk->rank,
                               set ? set->label : "(none)");
        if (set)
            rk->sets[at++].comm = comm;
    }
    return st;
}

void hx_rank_sets_cleanup(hx_rank *rk)
{
    for (int i = 0; rk->sets && i < rk->n_sets; i++) {
        seldp_session_destroy(rk->sets[i].session);
        seldp_comm_destroy(rk->sets[i].comm);
    }
    free(rk->sets);
    rk->sets = NULL;
    rk->n_sets = 0;
}

/* The view a set's session initializes and reduces: the rank's model (its device mirror's on
 * a GPU), or for the embedding group the tied copy under the path embed.weight. */
static seldp_model *set_view(hx_rank *rk, const hx_set *s)
{
    if (s->kind == HX_SET_EMB)
        return rk->grid->emb_view;
    return rk->gpu ? hx_gpu_view(rk) : tm_model_view(rk->model);
}

/* True when s selects p: covers it, or p is a tied alias of an occurrence it covers. */
static bool selects(const hx_rank *rk, const hx_set *s, const tm_param_info *p)
{
    if (!p->alias)
        return hx_set_covers(rk->run, s, rk->rank, p);
    for (size_t i = 0; i < tm_param_count(rk->model); i++) {
        const tm_param_info *q = tm_param_at(rk->model, i);
        if (!q->alias && q->id == p->id)
            return hx_set_covers(rk->run, s, rk->rank, q);
    }
    return false;
}

/* Checksums of the parameters outside set s's selection, by tm_param_at index (0 inside). */
static seldp_status outside_checksums(const hx_rank *rk, const hx_set *s, uint64_t *sums)
{
    for (size_t i = 0; i < tm_param_count(rk->model); i++) {
        const tm_param_info *p = tm_param_at(rk->model, i);
        sums[i] = 0;
        if (selects(rk, s, p))
            continue;
        seldp_status st = hx_tensor_checksum(rk, hx_param_storage(rk, p), &sums[i]);
        if (st != SELDP_OK)
            return st;
    }
    return SELDP_OK;
}

/* Initialize one set's session from its root; check that nothing outside it moved. */
static seldp_status init_set(hx_rank *rk, hx_rank_set *rs)
{
    seldp_status st = SELDP_OK;
    hx_run *run = rk->run;
    const hx_set *s = rs->set;
    size_t n = tm_param_count(rk->model), n_ids = 0;
    seldp_param_id *ids = hx_calloc(n ? n : 1, sizeof *ids);
    uint64_t *before = hx_calloc(n ? n : 1, sizeof *before);
    uint64_t *after = hx_calloc(n ? n : 1, sizeof *after);
    if (!ids || !before || !after)
        HX_FAIL(SELDP_ERR_NOMEM, "rank %d: out of memory", rk->rank);
    for (size_t i = 0; i < n; i++) {
        const tm_param_info *p = tm_param_at(rk->model, i);
        if (hx_set_covers(run, s, rk->rank, p))
            ids[n_ids++] = p->id;
    }
    HX_CHECK(outside_checksums(rk, s, before));
    seldp_session_config cfg = hx_session_config(run);
    int root = hx_set_position(s, s->root);
    /* quantized bases (U8/I32 words) and the codebook need the buffer-aware entry point */
    if (run->opts.model.quant != TM_QUANT_NONE)
        st = seldp_session_initialize_with_buffers(rs->comm, set_view(rk, s), root, ids, n_ids,
                                                   &cfg, &rs->session);
    else
        st = seldp_session_initialize(rs->comm, set_view(rk, s), root, ids, n_ids, &cfg,
                                      &rs->session);
    if (st != SELDP_OK)
        HX_FAIL_LIB(st, "rank %d: initialize%s of %s", rk->rank,
                    run->opts.model.quant != TM_QUANT_NONE ? "_with_buffers" : "", s->label);
    HX_CHECK(outside_checksums(rk, s, after));
    for (size_t i = 0; i < n; i++)
        if (!selects(rk, s, tm_param_at(rk->model, i)))
            hx_record_local(&rk->init_untouched, before[i] != after[i],
                            "rank %d: initialize of %s changed %s, which it does not select",
                            rk->rank, s->label, tm_param_at(rk->model, i)->path);
fail:
    free(ids);
    free(before);
    free(after);
    return st;
}

seldp_status hx_rank_sets_init(hx_rank *rk)
{
    for (int i = 0; i < rk->n_sets; i++) {
        seldp_status st = init_set(rk, &rk->sets[i]);
        if (st != SELDP_OK)
            return st;
    }
    return SELDP_OK;
}

/* ---- weights and scales ------------------------------------------------------------------ */

/* Tokens of the EP group of world rank r this step. */
static uint64_t ep_tokens_of(const hx_rank *rk, int r)
{
    const hx_group *ep = &rk->run->layout->ep[rk->run->layout->ep_of[r]];
    uint64_t n = 0;
    for (int i = 0; i < ep->size; i++)
        n += rk->counts[ep->ranks[i]];
    return n;
}

/* The rows an owner's expert shards serve: those of the EP groups of its expert-TP peers. */
static uint64_t expert_rows(const hx_rank *rk)
{
    const seldp_layout *g = rk->run->layout->grid;
    const int *peers = NULL;
    int n = seldp_layout_group(g, SELDP_GROUP_EXPERT_TP,
                               seldp_layout_group_of(g, SELDP_GROUP_EXPERT_TP, rk->rank), &peers);
    uint64_t w = 0;
    for (int i = 0; i < n; i++)
        w += ep_tokens_of(rk, peers[i]);
    return w;
}

/* The tokens of rank rk's TP group: what its shards' gradients cover together. */
static uint64_t tp_tokens(const hx_rank *rk)
{
    const seldp_layout *g = rk->run->layout->grid;
    const int *tp = NULL;
    int n = seldp_layout_group(g, SELDP_GROUP_TP,
                               seldp_layout_group_of(g, SELDP_GROUP_TP, rk->rank), &tp);
    uint64_t w = 0;
    for (int i = 0; i < n; i++)
        w += rk->counts[tp[i]];
    return w;
}

uint64_t hx_set_weight_of(const hx_rank *rk, const hx_set *s)
{
    uint64_t w = 1;
    switch (s->weight) {
    case HX_WEIGHT_TOKENS:
        w = rk->T;
        break;
    case HX_WEIGHT_TP_TOKENS:
        w = tp_tokens(rk);
        break;
    case HX_WEIGHT_DATA_SHARE:
        w = hx_data_share(rk, s->data);
        break;
    case HX_WEIGHT_EXPERT_ROWS:
        w = expert_rows(rk);
        break;
    case HX_WEIGHT_ACTIVE:
        w = 1;
        break;
    }
    return hx_inject_weight(rk, s, w);
}

double hx_set_export_scale(const hx_rank *rk, const hx_set *s)
{
    double scale = s->sums ? 1.0 / (double)rk->global_tokens : 1.0;
    /* --loss-scale: the gradients of S times the loss (loss_scale.h) */
    return scale * hx_inject_scale(rk, s) * hx_loss_scale_factor(rk);
}

seldp_session_config hx_session_config(const hx_run *run)
{
    seldp_session_config cfg = SELDP_SESSION_CONFIG_INIT;
    if (run->opts.bucket_bytes > 0)
        cfg.bucket_bytes = run->opts.bucket_bytes;
    /* staged, not the default in place: each finish checks that the other sets' gradients
     * came back as they were while their reductions are still in flight, which an in-place
     * reduction (writing its results as its buckets complete) would change */
    cfg.overlap_in_place = false;
    return cfg;
}
