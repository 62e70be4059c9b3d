/* A rank of a sharded run (grid.h): its groups, its model of shards and the TP group's
 * communication it computes with, the sessions of its replica sets, and the reductions of a
 * step. */
#define _POSIX_C_SOURCE 200809L

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grid.h"
#include "overlap.h"

/* Split the world by the layout's colour and key of `kind` (NULL where the rank has none). */
static seldp_status split_kind(hx_rank *rk, seldp_group_kind kind, seldp_comm **out)
{
    int color, key;
    seldp_status st = seldp_layout_split_args(rk->run->layout->grid, kind, rk->rank, &color, &key);
    if (st == SELDP_OK)
        st = seldp_comm_split(rk->world, color, key, out);
    if (st != SELDP_OK)
        return hx_fail_lib(st, "rank %d: building its %s group", rk->rank,
                           seldp_group_kind_name(kind));
    return SELDP_OK;
}

static seldp_status split_by(hx_rank *rk, int color, const char *what, seldp_comm **out)
{
    seldp_status st = seldp_comm_split(rk->world, color, rk->rank, out);
    if (st != SELDP_OK)
        return hx_fail_lib(st, "rank %d: building its %s group", rk->rank, what);
    return SELDP_OK;
}

/* The TP group's communication for tiny-moe (tm_tp). */
static seldp_status tp_gather(void *user, const void *mine, size_t bytes, void *all)
{
    hx_rank *rk = user;
    int P = seldp_comm_size(rk->grid->tp);
    size_t *lens = hx_calloc((size_t)P, sizeof *lens);
    void *got = NULL;
    if (!lens)
        return hx_fail(SELDP_ERR_NOMEM, "rank %d: out of memory", rk->rank);
    double t0 = hx_now();
    seldp_status st = seldp_comm_allgatherv(rk->grid->tp, mine, bytes, &got, lens);
    rk->t_dispatch += hx_now() - t0;
    if (st == SELDP_OK) {
        size_t total = 0;
        for (int r = 0; r < P; r++)
            total += lens[r];
        memcpy(all, got, total);
    }
    free(got);
    free(lens);
    return st;
}

static seldp_status tp_sum(void *user, void *buf, size_t count, seldp_dtype dtype)
{
    hx_rank *rk = user;
    double t0 = hx_now();
    seldp_status st = seldp_comm_allreduce(rk->grid->tp, buf, buf, count, dtype, SELDP_HOST_DEVICE);
    rk->t_dispatch += hx_now() - t0;
    return st;
}

seldp_status hx_grid_setup(hx_rank *rk)
{
    seldp_status st = SELDP_OK;
    hx_run *run = rk->run;
    const seldp_layout *g = run->layout->grid;
    seldp_layout_config c = seldp_layout_get_config(g);
    int *owned = hx_calloc((size_t)run->layout->experts, sizeof *owned);
    hx_grid_rank *gr = hx_calloc(1, sizeof *gr);
    if (!owned || !gr) {
        free(owned);
        free(gr);
        return hx_fail(SELDP_ERR_NOMEM, "rank %d: out of memory", rk->rank);
    }
    rk->grid = gr;
    int n_owned = hx_layout_owned(run->layout, rk->rank, owned);
    gr->stage = seldp_layout_stage(g, rk->rank);
    gr->tp_rank = seldp_layout_position(g, SELDP_GROUP_TP, rk->rank);
    gr->etp_rank = seldp_layout_position(g, SELDP_GROUP_EXPERT_TP, rk->rank);
    gr->part = hx_grid_part(run, rk->rank);

    /* every rank splits in this order */
    HX_CHECK(split_kind(rk, SELDP_GROUP_TP, &gr->tp));
    HX_CHECK(split_kind(rk, SELDP_GROUP_PP, &gr->pp));
    HX_CHECK(split_kind(rk, SELDP_GROUP_EXPERT_TP, &gr->etp));
    HX_CHECK(split_kind(rk, SELDP_GROUP_DP, &gr->comm[HX_SET_DENSE]));
    HX_CHECK(split_kind(rk, SELDP_GROUP_EXPERT_DP, &gr->comm[HX_SET_EXPERT]));
    HX_CHECK(split_by(rk, gr->stage, "stage", &gr->stage_comm));
    HX_CHECK(split_by(rk, c.tp > 1 ? gr->stage : SELDP_COMM_NO_GROUP, "sequence-parallel",
                      &gr->comm[HX_SET_SP]));
    int ep_pos = seldp_layout_position(g, SELDP_GROUP_EP, rk->rank);
    bool replicated_adapters = c.etp > 1 && run->opts.model.quant != TM_QUANT_NONE;
    HX_CHECK(split_by(rk, replicated_adapters ? gr->stage * c.ep + ep_pos : SELDP_COMM_NO_GROUP,
                      "expert-data x expert-TP", &gr->comm[HX_SET_EXPERT_TP]));
    bool ends = gr->part.embed || gr->part.head;
    HX_CHECK(split_by(rk, c.pp > 1 && ends ? gr->tp_rank : SELDP_COMM_NO_GROUP, "embedding",
                      &gr->comm[HX_SET_EMB]));

    tm_config shard_cfg = hx_grid_shard_config(run);
    HX_CHECK_LIB(tm_model_create_part(&shard_cfg, &gr->part, rk->rank, owned, n_owned, NULL, NULL,
                                      &rk->model),
                 "rank %d: creating its shards", rk->rank);
    tm_tp tp = {c.tp, gr->tp_rank, rk, tp_gather, tp_sum};
    HX_CHECK_LIB(tm_model_set_tp(rk->model, &tp), "rank %d: its tensor parallelism", rk->rank);
    if (gr->comm[HX_SET_EMB]) {
        /* replicas are matched by path: both copies of the tied embedding as embed.weight */
        const tm_param_info *p =
            tm_param_find(rk->model, gr->part.embed ? "embed.weight" : "lm_head.weight");
        HX_CHECK_LIB(seldp_model_create(rk->rank, &gr->emb_view), "rank %d: embedding view",
                     rk->rank);
        HX_CHECK_LIB(
            seldp_model_add(gr->emb_view, "embed.weight", p->id, &p->tensor, false, (void *)p),
            "rank %d: registering the tied embedding", rk->rank);
    }
fail:
    free(owned);
    return st;
}

/* The group rank of world rank `root` in the communicator of `set`. */
static int root_position(const hx_rank *rk, hx_grid_set set, int root)
{
    const seldp_layout *g = rk->run->layout->grid;
    if (set == HX_SET_DENSE)
        return seldp_layout_position(g, SELDP_GROUP_DP, root);
    if (set == HX_SET_EXPERT)
        return seldp_layout_position(g, SELDP_GROUP_EXPERT_DP, root);
    /* split by world rank: the members below the root come first */
    int below = 0;
    for (int q = 0; q < root; q++) {
        bool member = seldp_layout_stage(g, q) == seldp_layout_stage(g, rk->rank);
        if (set == HX_SET_EXPERT_TP)
            member = member && seldp_layout_position(g, SELDP_GROUP_EP, q) ==
                                   seldp_layout_position(g, SELDP_GROUP_EP, rk->rank);
        if (set == HX_SET_EMB) {
            int stage = seldp_layout_stage(g, q);
            member = (stage == 0 || stage == seldp_layout_get_config(g).pp - 1) &&
                     seldp_layout_position(g, SELDP_GROUP_TP, q) == rk->grid->tp_rank;
        }
        below += member;
    }
    return below;
}

static seldp_status checksums(const hx_rank *rk, const seldp_param_id *ids, size_t n_ids,
                              uint64_t *sums)
{
    for (size_t i = 0; i < tm_param_count(rk->model); i++) {
        const tm_param_info *p = tm_param_at(rk->model, i);
        bool selected = false;
        for (size_t k = 0; k < n_ids && !selected; k++)
            selected = ids[k] == p->id;
        sums[i] = 0;
        seldp_status st = selected ? SELDP_OK : hx_tensor_checksum(rk, &p->tensor, &sums[i]);
        if (st != SELDP_OK)
            return st;
    }
    return SELDP_OK;
}

seldp_status hx_grid_init_sessions(hx_rank *rk)
{
    seldp_status st = SELDP_OK;
    hx_run *run = rk->run;
    hx_grid_rank *gr = rk->grid;
    seldp_session_config cfg = hx_session_config(run);
    size_t n = tm_param_count(rk->model);
    seldp_param_id *ids = hx_calloc(n ? n : 1, sizeof *ids);
    uint64_t *before = hx_calloc(n ? n : 1, sizeof *before);
    uint64_t *after = hx_calloc(n ? n : 1, sizeof *after);
    if (!ids || !before || !after)
        HX_FAIL(SELDP_ERR_NOMEM, "rank %d: out of memory", rk->rank);
    for (int set = 0; set < HX_SET_COUNT; set++) {
        if (!gr->comm[set])
            continue;
        size_t n_ids = 0;
        for (size_t i = 0; i < n; i++) {
            const tm_param_info *p = tm_param_at(rk->model, i);
            if (!p->alias && hx_grid_set_of(run, rk->rank, p) == (hx_grid_set)set)
                ids[n_ids++] = p->id;
        }
        int root = root_position(rk, (hx_grid_set)set, hx_grid_root(run, rk->rank, set));
        seldp_model *view = set == HX_SET_EMB ? gr->emb_view : tm_model_view(rk->model);
        HX_CHECK(checksums(rk, ids, n_ids, before));
        if (run->opts.model.quant != TM_QUANT_NONE)
            st = seldp_session_initialize_with_buffers(gr->comm[set], view, root, ids, n_ids, &cfg,
                                                       &gr->set[set]);
        else
            st = seldp_session_initialize(gr->comm[set], view, root, ids, n_ids, &cfg,
                                          &gr->set[set]);
        if (st != SELDP_OK)
            HX_FAIL_LIB(st, "rank %d: initialize of its %s group", rk->rank,
                        hx_grid_set_name((hx_grid_set)set));
        HX_CHECK(checksums(rk, ids, n_ids, after));
        for (size_t i = 0; i < n; i++)
            hx_record_local(&rk->init_untouched, before[i] != after[i],
                            "rank %d: initialize of its %s group changed %s, which it does not "
                            "select",
                            rk->rank, hx_grid_set_name((hx_grid_set)set),
                            tm_param_at(rk->model, i)->path);
    }
fail:
    free(ids);
    free(before);
    free(after);
    return st;
}

/* A session that reduces with `sum` over gradients of the loss sum: the embedding group
 * (both copies' gradients), the replicated adapters of ETP-split experts in the mean flow
 * (partial gradients of every ETP shard). Normalized here by the global token count, as the
 * sum flow's experts are at export. */
bool hx_grid_prescaled(const hx_run *run, hx_grid_set set)
{
    return set == HX_SET_EMB || (set == HX_SET_EXPERT_TP && run->opts.flow != HX_FLOW_SUM);
}

seldp_status hx_grid_prescale(hx_rank *rk, const tm_param_info *p)
{
    seldp_status st = SELDP_OK;
    const float *g = tm_param_grad(rk->model, p->path);
    size_t n = seldp_tensor_numel(&p->tensor);
    float *scaled = hx_calloc(n ? n : 1, sizeof *scaled);
    if (!g || !scaled)
        HX_FAIL(SELDP_ERR_NOMEM, "rank %d: scaling the gradient of %s", rk->rank, p->path);
    for (size_t k = 0; k < n; k++)
        scaled[k] = (float)((double)g[k] / (double)rk->global_tokens);
    HX_CHECK_LIB(tm_model_set_grad(rk->model, p->path, scaled), "rank %d: gradient of %s", rk->rank,
                 p->path);
fail:
    free(scaled);
    return st;
}

static seldp_status scale_for_sum(hx_rank *rk, hx_grid_set set)
{
    for (size_t i = 0; i < tm_param_count(rk->model); i++) {
        const tm_param_info *p = tm_param_at(rk->model, i);
        if (p->alias || p->frozen || hx_grid_set_of(rk->run, rk->rank, p) != set)
            continue;
        seldp_status st = hx_grid_prescale(rk, p);
        if (st != SELDP_OK)
            return st;
    }
    return SELDP_OK;
}

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
static uint64_t expert_weight(const hx_rank *rk)
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

/* Under the error policy an owner whose shard saw no row of an expert that rows reached
 * elsewhere supplies zeros. */
bool hx_grid_zero_owed(const hx_rank *rk, const tm_param_info *p)
{
    int E = rk->run->layout->experts;
    return (p->role & (TM_ROLE_EXPERT | TM_ROLE_ADAPTER)) && !p->frozen && expert_weight(rk) > 0 &&
           rk->routed[p->layer * E + p->expert] != 0;
}

static seldp_status zero_expert_grads(hx_rank *rk, seldp_grads *grads)
{
    for (size_t i = 0; i < tm_param_count(rk->model); i++) {
        const tm_param_info *p = tm_param_at(rk->model, i);
        if (!hx_grid_zero_owed(rk, p))
            continue;
        seldp_status st = hx_zero_grad(rk, p, grads);
        if (st != SELDP_OK)
            return st;
    }
    return SELDP_OK;
}

void hx_grid_weights(const hx_rank *rk, uint64_t weight[HX_SET_COUNT])
{
    /* dense: the TP group's tokens (its TP ranks' tokens together); sp: the rank's own */
    const seldp_layout *g = rk->run->layout->grid;
    const int *tp = NULL;
    int n_tp = seldp_layout_group(g, SELDP_GROUP_TP,
                                  seldp_layout_group_of(g, SELDP_GROUP_TP, rk->rank), &tp);
    uint64_t w_dense = 0, w_expert = expert_weight(rk);
    for (int i = 0; i < n_tp; i++)
        w_dense += rk->counts[tp[i]];
    weight[HX_SET_DENSE] = w_dense;
    weight[HX_SET_SP] = rk->T;
    weight[HX_SET_EMB] = 1;
    weight[HX_SET_EXPERT] = w_expert;
    weight[HX_SET_EXPERT_TP] = w_expert;
}

bool hx_grid_set_sums(const hx_run *run, hx_grid_set set)
{
    return set == HX_SET_EMB || set == HX_SET_EXPERT_TP ||
           (set == HX_SET_EXPERT && run->opts.flow == HX_FLOW_SUM);
}

seldp_status hx_grid_reduce(hx_rank *rk, seldp_grads *grads)
{
    seldp_status st = SELDP_OK;
    hx_run *run = rk->run;
    hx_grid_rank *gr = rk->grid;
    bool fp32 = run->opts.fp32_master;
    bool sum_flow = run->opts.flow == HX_FLOW_SUM;
    for (int set = 0; set < HX_SET_COUNT; set++)
        if (gr->set[set] && hx_grid_prescaled(run, (hx_grid_set)set))
            HX_CHECK(scale_for_sum(rk, (hx_grid_set)set));
    HX_CHECK_LIB(tm_export_grads(rk->model, TM_ROLE_SHARED, 1.0, fp32, grads),
                 "rank %d: exporting the shared gradients", rk->rank);
    double scale = sum_flow ? 1.0 / (double)rk->global_tokens : 1.0;
    HX_CHECK_LIB(tm_export_grads(rk->model, TM_ROLE_EXPERT | TM_ROLE_ADAPTER, scale, fp32, grads),
                 "rank %d: exporting the expert gradients", rk->rank);
    if (run->opts.policy == SELDP_MISSING_ERROR)
        HX_CHECK(zero_expert_grads(rk, grads));

    uint64_t weight[HX_SET_COUNT];
    hx_grid_weights(rk, weight);
    for (int set = 0; set < HX_SET_COUNT; set++) {
        if (!gr->set[set])
            continue;
        bool sum = hx_grid_set_sums(run, (hx_grid_set)set);
        char label[64];
        snprintf(label, sizeof label, "its %s group", hx_grid_set_name((hx_grid_set)set));
        HX_CHECK(hx_reduce_session(rk, gr->set[set], label, sum ? HX_REDUCE_SUM : HX_REDUCE_MEAN,
                                   weight[set], grads, &gr->weight[set]));
    }
    rk->shared_weight = gr->weight[HX_SET_DENSE];
fail:
    return st;
}

void hx_grid_cleanup(hx_rank *rk)
{
    hx_grid_rank *gr = rk->grid;
    if (!gr)
        return;
    for (int set = 0; set < HX_SET_COUNT; set++) {
        seldp_session_destroy(gr->set[set]);
        gr->set[set] = NULL;
        seldp_comm_destroy(gr->comm[set]);
        gr->comm[set] = NULL;
    }
    seldp_comm_destroy(gr->tp);
    seldp_comm_destroy(gr->pp);
    seldp_comm_destroy(gr->etp);
    seldp_comm_destroy(gr->stage_comm);
    gr->tp = gr->pp = gr->etp = gr->stage_comm = NULL;
    seldp_model_destroy(gr->emb_view);
    gr->emb_view = NULL;
}
