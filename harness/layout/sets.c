/* The run's replica sets (sets.h): the two builders, the only code that knows whether a run
 * is sharded, and the pure queries every phase shares. */
#include "sets.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grid.h"
#include "run.h"
#include "rank.h"

static const char *const kind_names[HX_SET_KINDS] = {
    [HX_SET_SHARED] = "shared",
    [HX_SET_DATA] = "expert-data",
    [HX_SET_DENSE] = "dense",
    [HX_SET_SP] = "sequence-parallel",
    [HX_SET_EMB] = "embedding",
    [HX_SET_EXPERT] = "expert-data",
    [HX_SET_EXPERT_TP] = "expert-data x expert-TP",
};

const char *hx_set_kind_name(hx_set_kind kind)
{
    return (unsigned)kind < HX_SET_KINDS ? kind_names[kind] : "invalid";
}

/* The framework's own name of a kind of group (Megatron-Core's parallel_state, DeepSpeed's
 * groups.py, torchtitan's mesh dimensions), "shared"/"expert-data" for a layout file. */
static const char *framework_name(const hx_run *run, hx_set_kind kind)
{
    const seldp_layout *g = run->layout->grid;
    if (!g)
        return kind == HX_SET_SHARED ? "shared" : "expert-data";
    seldp_layout_config c = seldp_layout_get_config(g);
    bool cp = c.cp > 1;
    switch (c.framework) {
    case SELDP_FRAMEWORK_DEEPSPEED:
        switch (kind) {
        case HX_SET_SHARED:
        case HX_SET_DENSE:
            return "dp";
        case HX_SET_SP:
            return "tp-dp";
        case HX_SET_EMB:
            return "embedding";
        case HX_SET_DATA:
        case HX_SET_EXPERT:
            return "ep-dp";
        default:
            return "ep-dp-etp";
        }
    case SELDP_FRAMEWORK_TORCHTITAN:
        switch (kind) {
        case HX_SET_SHARED:
        case HX_SET_DENSE:
            return cp ? "dp_cp" : "dp";
        case HX_SET_SP:
            return cp ? "dp_cp_tp" : "dp_tp";
        case HX_SET_EMB:
            return "pp-embedding";
        case HX_SET_DATA:
        case HX_SET_EXPERT:
            return "efsdp";
        default:
            return "efsdp-etp";
        }
    case SELDP_FRAMEWORK_MEGATRON_0_9:
        if (kind == HX_SET_DATA || kind == HX_SET_EXPERT)
            return "dp-mod-ep";
        if (kind == HX_SET_EXPERT_TP)
            return "dp-mod-ep-tp";
        break;
    default:
        break;
    }
    switch (kind) { /* Megatron-Core */
    case HX_SET_SHARED:
    case HX_SET_DENSE:
        return cp ? "dp-cp" : "dp";
    case HX_SET_SP:
        return cp ? "tp-dp-cp" : "tp-dp";
    case HX_SET_EMB:
        return "embd";
    case HX_SET_DATA:
    case HX_SET_EXPERT:
        return "edp";
    default:
        return "edp-etp";
    }
}

/* ---- building ---------------------------------------------------------------------------- */

static hx_set *add_set(hx_sets *s, hx_set_kind kind, int round, const int *ranks, int size)
{
    hx_set *grown = realloc(s->sets, (size_t)(s->n + 1) * sizeof *grown);
    if (!grown)
        return NULL;
    s->sets = grown;
    hx_set *set = &s->sets[s->n];
    memset(set, 0, sizeof *set);
    set->ranks = hx_calloc((size_t)(size > 0 ? size : 1), sizeof *set->ranks);
    if (!set->ranks)
        return NULL;
    memcpy(set->ranks, ranks, (size_t)size * sizeof *ranks);
    set->index = s->n++;
    set->kind = kind;
    set->round = round;
    set->data = -1;
    set->size = size;
    set->root = ranks[0];
    return set;
}

/* --roots where the layout names no root: the first, the last, or the i-th of the kind's sets
 * spread over group ranks. */
static int roots_rule(hx_roots roots, const hx_set *set, int i)
{
    switch (roots) {
    case HX_ROOTS_LAST:
        return set->ranks[set->size - 1];
    case HX_ROOTS_SPREAD:
        return set->ranks[i % set->size];
    default:
        return set->ranks[0];
    }
}

/* The unsharded run: hx_layout's shared group and expert-data groups, roots as it holds them
 * (it applied --roots where the layout file named none). An expert-data group is split in the
 * round after the last one any of its ranks is in already: groups that share no rank (every
 * generated layout's) are built by one split of the world, not one each, and every rank still
 * meets its sets in the order of their index. */
static seldp_status build_unsharded(hx_run *run, hx_sets *s)
{
    const hx_layout *l = run->layout;
    int *last = hx_calloc((size_t)run->opts.world, sizeof *last); /* each rank's last round */
    if (!last)
        return SELDP_ERR_NOMEM;
    hx_set *set = add_set(s, HX_SET_SHARED, 0, l->shared.ranks, l->shared.size);
    if (!set)
        goto nomem;
    set->root = l->shared.root;
    set->weight = HX_WEIGHT_TOKENS;
    s->n_rounds = 1;
    for (int d = 0; d < l->n_data; d++) {
        int round = 1;
        for (int k = 0; k < l->data[d].size; k++)
            round = last[l->data[d].ranks[k]] + 1 > round ? last[l->data[d].ranks[k]] + 1 : round;
        set = add_set(s, HX_SET_DATA, round, l->data[d].ranks, l->data[d].size);
        if (!set)
            goto nomem;
        for (int k = 0; k < l->data[d].size; k++)
            last[l->data[d].ranks[k]] = round;
        s->n_rounds = round + 1 > s->n_rounds ? round + 1 : s->n_rounds;
        set->data = d;
        set->root = l->data[d].root;
        set->sums = run->opts.flow == HX_FLOW_SUM;
        set->weight = HX_WEIGHT_DATA_SHARE;
    }
    free(last);
    return SELDP_OK;
nomem:
    free(last);
    return SELDP_ERR_NOMEM;
}

/* The sets of one group kind of the library's layout, one per group, roots by the framework's
 * rule or by --roots. */
static seldp_status add_layout_kind(hx_run *run, hx_sets *s, hx_set_kind kind, seldp_group_kind gk,
                                    int round)
{
    const seldp_layout *g = run->layout->grid;
    int n = seldp_layout_group_count(g, gk);
    for (int i = 0; i < n; i++) {
        const int *ranks = NULL;
        int size = seldp_layout_group(g, gk, i, &ranks);
        hx_set *set = add_set(s, kind, round, ranks, size);
        if (!set)
            return SELDP_ERR_NOMEM;
        set->root = run->opts.roots_given ? roots_rule(run->opts.roots, set, i)
                                          : seldp_layout_root(g, gk, i);
    }
    return SELDP_OK;
}

/* The sets whose members the harness groups itself: every rank r with key(r) == k forms set
 * k, ascending (the order a split by world rank gives). */
typedef int (*group_key)(const hx_run *run, int r);

static int key_stage(const hx_run *run, int r)
{
    return seldp_layout_stage(run->layout->grid, r);
}

static int key_stage_ep(const hx_run *run, int r)
{
    const seldp_layout *g = run->layout->grid;
    int ep = seldp_layout_get_config(g).ep;
    return seldp_layout_stage(g, r) * ep + seldp_layout_position(g, SELDP_GROUP_EP, r);
}

static int key_ends_tp(const hx_run *run, int r)
{
    const seldp_layout *g = run->layout->grid;
    int stage = seldp_layout_stage(g, r), pp = seldp_layout_get_config(g).pp;
    if (stage != 0 && stage != pp - 1)
        return -1;
    return seldp_layout_position(g, SELDP_GROUP_TP, r);
}

static seldp_status add_keyed(hx_run *run, hx_sets *s, hx_set_kind kind, int round, group_key key,
                              int n_keys)
{
    int W = run->opts.world;
    int *ranks = hx_calloc((size_t)W, sizeof *ranks);
    if (!ranks)
        return SELDP_ERR_NOMEM;
    for (int k = 0; k < n_keys; k++) {
        int size = 0;
        for (int r = 0; r < W; r++)
            if (key(run, r) == k)
                ranks[size++] = r;
        if (size == 0)
            continue;
        hx_set *set = add_set(s, kind, round, ranks, size);
        if (!set) {
            free(ranks);
            return SELDP_ERR_NOMEM;
        }
        set->root = roots_rule(run->opts.roots_given ? run->opts.roots : HX_ROOTS_FIRST, set, k);
    }
    free(ranks);
    return SELDP_OK;
}

/* The sharded run (grid.h): every set kind its grid needs, in reduction order. */
static seldp_status build_sharded(hx_run *run, hx_sets *s)
{
    seldp_status st = SELDP_OK;
    seldp_layout_config c = seldp_layout_get_config(run->layout->grid);
    bool sum_flow = run->opts.flow == HX_FLOW_SUM;
    int round = 0, first;
    /* the dense group: the embedding (pp = 1), the shared expert, at tp = 1 the norms and
     * routers (grid.h); reduced even when it holds none of them (its weight is the step's) */
    first = s->n;
    HX_CHECK(add_layout_kind(run, s, HX_SET_DENSE, SELDP_GROUP_DP, round++));
    for (int i = first; i < s->n; i++)
        s->sets[i].weight = HX_WEIGHT_TP_TOKENS;
    if (c.tp > 1) {
        first = s->n;
        HX_CHECK(add_keyed(run, s, HX_SET_SP, round++, key_stage, c.pp));
        for (int i = first; i < s->n; i++)
            s->sets[i].weight = HX_WEIGHT_TOKENS;
    }
    if (c.pp > 1) {
        first = s->n;
        HX_CHECK(add_keyed(run, s, HX_SET_EMB, round++, key_ends_tp, c.tp));
        for (int i = first; i < s->n; i++) {
            s->sets[i].sums = true;
            s->sets[i].weight = HX_WEIGHT_ACTIVE;
        }
    }
    first = s->n;
    HX_CHECK(add_layout_kind(run, s, HX_SET_EXPERT, SELDP_GROUP_EXPERT_DP, round++));
    for (int i = first; i < s->n; i++) {
        s->sets[i].sums = sum_flow;
        s->sets[i].weight = HX_WEIGHT_EXPERT_ROWS;
    }
    if (c.etp > 1 && run->opts.model.quant != TM_QUANT_NONE) {
        first = s->n;
        HX_CHECK(add_keyed(run, s, HX_SET_EXPERT_TP, round++, key_stage_ep, c.pp * c.ep));
        for (int i = first; i < s->n; i++) {
            s->sets[i].sums = true;
            s->sets[i].weight = HX_WEIGHT_EXPERT_ROWS;
        }
    }
    s->n_rounds = round;
fail:
    return st;
}

static void group_text(const hx_set *set, char *buf, size_t size)
{
    hx_group g = {set->size, set->ranks, set->root};
    hx_group_str(&g, buf, size);
}

seldp_status hx_sets_build(hx_run *run)
{
    seldp_status st = SELDP_OK;
    hx_sets *s = &run->sets;
    int W = run->opts.world;
    HX_CHECK(hx_grid_sharded(run) ? build_sharded(run, s) : build_unsharded(run, s));
    s->member = hx_calloc((size_t)s->n_rounds * (size_t)W, sizeof *s->member);
    if (!s->member)
        HX_FAIL(SELDP_ERR_NOMEM, "out of memory");
    for (int i = 0; i < s->n_rounds * W; i++)
        s->member[i] = -1;
    for (int i = 0; i < s->n; i++) {
        hx_set *set = &s->sets[i];
        char ranks[40];
        snprintf(set->name, sizeof set->name, "%s", framework_name(run, set->kind));
        group_text(set, ranks, sizeof ranks);
        snprintf(set->label, sizeof set->label, "%s %s", set->name, ranks);
        for (int k = 0; k < set->size; k++) {
            int *slot = &s->member[set->round * W + set->ranks[k]];
            if (*slot >= 0)
                HX_FAIL(SELDP_ERR_INTERNAL, "rank %d is in two %s groups", set->ranks[k],
                        hx_set_kind_name(set->kind));
            *slot = i;
        }
    }
fail:
    return st;
}

void hx_sets_free(hx_sets *s)
{
    for (int i = 0; i < s->n; i++)
        free(s->sets[i].ranks);
    free(s->sets);
    free(s->member);
    *s = (hx_sets){0};
}

/* ---- queries ----------------------------------------------------------------------------- */

int hx_set_position(const hx_set *s, int r)
{
    for (int i = 0; i < s->size; i++)
        if (s->ranks[i] == r)
            return i;
    return -1;
}

/* The kind of set a sharded run reduces p in (grid.h's rules). */
static hx_set_kind sharded_kind(const hx_run *run, const tm_param_info *p)
{
    switch (hx_grid_kind_of(run, p)) {
    case HX_GRID_SP:
        return HX_SET_SP;
    case HX_GRID_EMB:
        return HX_SET_EMB;
    case HX_GRID_EXPERT:
        return HX_SET_EXPERT;
    case HX_GRID_EXPERT_TP:
        return HX_SET_EXPERT_TP;
    default:
        return HX_SET_DENSE;
    }
}

bool hx_set_covers(const hx_run *run, const hx_set *s, int r, const tm_param_info *p)
{
    if (p->alias || run->sets.member[s->round * run->opts.world + r] != s->index)
        return false;
    switch (s->kind) {
    case HX_SET_SHARED:
        return (p->role & TM_ROLES_SHARED_GROUP) != 0;
    case HX_SET_DATA:
        return (p->role & TM_ROLES_EXPERT_GROUP) != 0 && p->expert >= 0 &&
               run->layout->data_of[p->expert] == s->data;
    default:
        return hx_grid_sharded(run) && sharded_kind(run, p) == s->kind;
    }
}

const hx_set *hx_set_of(const hx_run *run, int r, const tm_param_info *p)
{
    const hx_sets *s = &run->sets;
    for (int k = 0; k < s->n_rounds; k++) {
        int i = s->member[k * run->opts.world + r];
        if (i >= 0 && hx_set_covers(run, &s->sets[i], r, p))
            return &s->sets[i];
    }
    return NULL;
}

const hx_set *hx_set_member(const hx_run *run, int r, hx_set_kind kind)
{
    const hx_sets *s = &run->sets;
    for (int k = 0; k < s->n_rounds; k++) {
        int i = s->member[k * run->opts.world + r];
        if (i >= 0 && s->sets[i].kind == kind)
            return &s->sets[i];
    }
    return NULL;
}

bool hx_set_writes(const hx_run *run, int r, const tm_param_info *p)
{
    if (p->alias)
        return false;
    /* the tied embedding's two copies (pp > 1) are one set: its root writes it, from the first
     * or the last stage, under the logical path */
    const hx_set *s = hx_set_of(run, r, p);
    return s && s->root == r && hx_grid_shard(run, r, p->path).index == 0;
}

const hx_rank_set *hx_rank_membership(const hx_rank *rk, const hx_set *s)
{
    for (int i = 0; i < rk->n_sets; i++)
        if (rk->sets[i].set == s)
            return &rk->sets[i];
    return NULL;
}

hx_rank_set *hx_rank_set_of(hx_rank *rk, const tm_param_info *p)
{
    for (int i = 0; i < rk->n_sets; i++)
        if (hx_set_covers(rk->run, rk->sets[i].set, rk->rank, p))
            return &rk->sets[i];
    return NULL;
}
