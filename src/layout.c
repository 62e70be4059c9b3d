/* Layouts of the parallel grid: the data (groups per kind, sorted), its queries and the
 * split arguments. How each framework builds the groups is in layout_frameworks.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "internal.h"
#include "layout_impl.h"
#include "seldp/comm.h"

static const char *const framework_names[SELDP_FRAMEWORKS] = {"megatron", "megatron-0.9",
                                                              "deepspeed", "torchtitan"};

static const char *const kind_names[SELDP_GROUP_KINDS] = {
    "tp", "pp", "cp", "dp", "ep", "expert_dp", "expert_tp", "embedding"};

const char *seldp_framework_name(seldp_framework framework)
{
    if (framework == SELDP_FRAMEWORK_NONE)
        return "none";
    return (unsigned)framework < SELDP_FRAMEWORKS ? framework_names[framework] : "invalid";
}

seldp_status seldp_framework_parse(const char *name, seldp_framework *out)
{
    for (int f = 0; name && f < SELDP_FRAMEWORKS; f++) {
        if (strcasecmp(name, framework_names[f]) == 0) {
            *out = (seldp_framework)f;
            return SELDP_OK;
        }
    }
    return seldp__fail(SELDP_ERR_INVALID_ARGUMENT,
                       "unknown framework '%s': expected megatron, megatron-0.9, deepspeed or "
                       "torchtitan",
                       name ? name : "(null)");
}

const char *seldp_group_kind_name(seldp_group_kind kind)
{
    return (unsigned)kind < SELDP_GROUP_KINDS ? kind_names[kind] : "invalid";
}

static void kind_free(layout_kind *k)
{
    free(k->ranks);
    free(k->group_of);
    free(k->pos_of);
    *k = (layout_kind){0};
}

void seldp_layout_destroy(seldp_layout *layout)
{
    if (!layout)
        return;
    for (int k = 0; k < SELDP_GROUP_KINDS; k++)
        kind_free(&layout->kinds[k]);
    free(layout->order);
    free(layout);
}

static int compare_int(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

/* Groups are ordered by their lowest rank: sort references to them, then copy. */
typedef struct group_ref {
    int first;
    int index;
} group_ref;

static int compare_group_ref(const void *a, const void *b)
{
    return compare_int(&((const group_ref *)a)->first, &((const group_ref *)b)->first);
}

seldp_status seldp__layout_set(seldp_layout *l, seldp_group_kind kind, int count, int size,
                               const int *ranks)
{
    seldp_status st = SELDP_OK;
    int world = l->cfg.world;
    layout_kind k = {0};
    int *sorted = malloc((size_t)count * (size_t)size * sizeof *sorted);
    group_ref *order = malloc((size_t)count * sizeof *order);
    k.ranks = malloc((size_t)count * (size_t)size * sizeof *k.ranks);
    k.group_of = malloc((size_t)world * sizeof *k.group_of);
    k.pos_of = malloc((size_t)world * sizeof *k.pos_of);
    if (!sorted || !order || !k.ranks || !k.group_of || !k.pos_of)
        SELDP_FAIL(SELDP_ERR_NOMEM, "out of memory building the %s groups of %s", kind_names[kind],
                   l->what);
    k.count = count;
    k.size = size;
    memcpy(sorted, ranks, (size_t)count * (size_t)size * sizeof *sorted);
    for (int g = 0; g < count; g++) {
        qsort(sorted + (size_t)g * (size_t)size, (size_t)size, sizeof *sorted, compare_int);
        order[g] = (group_ref){sorted[(size_t)g * (size_t)size], g};
    }
    qsort(order, (size_t)count, sizeof *order, compare_group_ref);
    for (int r = 0; r < world; r++)
        k.group_of[r] = k.pos_of[r] = -1;
    for (int g = 0; g < count; g++) {
        const int *src = sorted + (size_t)order[g].index * (size_t)size;
        memcpy(k.ranks + (size_t)g * (size_t)size, src, (size_t)size * sizeof *src);
        for (int i = 0; i < size; i++) {
            int r = src[i];
            if (r < 0 || r >= world || k.group_of[r] >= 0)
                SELDP_FAIL(SELDP_ERR_INTERNAL,
                           "%s: rank %d is %s in the %s groups (a bug in seldp's %s rule)", l->what,
                           r, r < 0 || r >= world ? "outside the world" : "twice", kind_names[kind],
                           seldp_framework_name(l->cfg.framework));
            k.group_of[r] = g;
            k.pos_of[r] = i;
        }
    }
    for (int r = 0; r < world && kind != SELDP_GROUP_EMBEDDING; r++)
        if (k.group_of[r] < 0)
            SELDP_FAIL(SELDP_ERR_INTERNAL,
                       "%s: rank %d is in no %s group (a bug in seldp's %s rule)", l->what, r,
                       kind_names[kind], seldp_framework_name(l->cfg.framework));
    kind_free(&l->kinds[kind]);
    l->kinds[kind] = k;
    free(sorted);
    free(order);
    return SELDP_OK;
fail:
    kind_free(&k);
    free(sorted);
    free(order);
    return st;
}

seldp_status seldp__layout_masked(seldp_layout *l, seldp_group_kind kind, int n, const int *sizes,
                                  const bool *mask)
{
    /* global_rank = sum idx[d] * stride[d], stride the prefix product of sizes; a group
     * varies the masked dimensions and fixes the others (Megatron-LM
     * megatron/core/parallel_state.py, generate_masked_orthogonal_rank_groups) */
    enum { MAX_DIMS = 8 };
    int stride[MAX_DIMS], world = 1, group_size = 1;
    for (int d = 0; d < n && d < MAX_DIMS; d++) {
        stride[d] = world;
        world *= sizes[d];
        group_size *= mask[d] ? sizes[d] : 1;
    }
    if (n > MAX_DIMS || world != l->cfg.world)
        return seldp__fail(SELDP_ERR_INTERNAL,
                           "%s: a %d-dimensional grid of %d ranks for the %s "
                           "groups (a bug in seldp)",
                           l->what, n, world, kind_names[kind]);
    int count = world / group_size;
    int *ranks = malloc((size_t)world * sizeof *ranks);
    if (!ranks)
        return seldp__fail(SELDP_ERR_NOMEM, "out of memory building the %s groups of %s",
                           kind_names[kind], l->what);
    for (int g = 0; g < count; g++) {
        for (int i = 0; i < group_size; i++) {
            int rank = 0, gi = g, ii = i;
            for (int d = 0; d < n; d++) {
                int *index = mask[d] ? &ii : &gi;
                rank += (*index % sizes[d]) * stride[d];
                *index /= sizes[d];
            }
            ranks[g * group_size + i] = rank;
        }
    }
    seldp_status st = seldp__layout_set(l, kind, count, group_size, ranks);
    free(ranks);
    return st;
}

seldp_status seldp__layout_singletons(seldp_layout *l, seldp_group_kind kind)
{
    int sizes[1] = {l->cfg.world};
    bool mask[1] = {false};
    return seldp__layout_masked(l, kind, 1, sizes, mask);
}

seldp_status seldp__layout_embedding(seldp_layout *l)
{
    /* Megatron-LM parallel_state.py default_embedding_ranks: [pp_ranks[0], pp_ranks[-1]],
     * or [pp_ranks[0]] for a single stage; DeepSpeed's tied layers span the same ranks */
    const layout_kind *pp = &l->kinds[SELDP_GROUP_PP];
    int size = pp->size > 1 ? 2 : 1;
    int *ranks = malloc((size_t)pp->count * (size_t)size * sizeof *ranks);
    if (!ranks)
        return seldp__fail(SELDP_ERR_NOMEM, "out of memory building the embedding groups of %s",
                           l->what);
    for (int g = 0; g < pp->count; g++) {
        const int *stages = pp->ranks + (size_t)g * (size_t)pp->size;
        ranks[g * size] = stages[0];
        if (size == 2)
            ranks[g * size + 1] = stages[pp->size - 1];
    }
    seldp_status st = seldp__layout_set(l, SELDP_GROUP_EMBEDDING, pp->count, size, ranks);
    free(ranks);
    return st;
}

seldp_status seldp_layout_create(const seldp_layout_config *cfg, seldp_layout **out)
{
    seldp_status st = SELDP_OK;
    seldp_layout *l = NULL;
    if (!cfg || !out)
        return seldp__fail(SELDP_ERR_INVALID_ARGUMENT, "seldp_layout_create: cfg and out must "
                                                       "not be NULL");
    seldp_layout_config given = SELDP_LAYOUT_CONFIG_INIT;
    seldp_status read = seldp__config_read(&given, sizeof given, cfg, "seldp_layout_create",
                                           "seldp_layout_config", "SELDP_LAYOUT_CONFIG_INIT");
    if (read != SELDP_OK)
        return read;
    cfg = &given;
    if ((unsigned)cfg->framework >= SELDP_FRAMEWORKS)
        return seldp__fail(SELDP_ERR_INVALID_ARGUMENT,
                           "seldp_layout_create: framework %d is not one of megatron, "
                           "megatron-0.9, deepspeed, torchtitan",
                           (int)cfg->framework);
    char what[192], etp[32] = "";
    if (cfg->etp > 0)
        snprintf(etp, sizeof etp, ", etp %d", cfg->etp);
    snprintf(what, sizeof what, "%s (world %d, tp %d, pp %d, cp %d, ep %d%s%s%s)",
             seldp_framework_name(cfg->framework), cfg->world, cfg->tp, cfg->pp, cfg->cp, cfg->ep,
             etp, cfg->order ? ", order " : "", cfg->order ? cfg->order : "");
    const struct {
        const char *name;
        int value, min;
    } sizes[] = {{"world", cfg->world, 1},    {"tp", cfg->tp, 1}, {"pp", cfg->pp, 1},
                 {"cp", cfg->cp, 1},          {"ep", cfg->ep, 1}, {"etp", cfg->etp, 0},
                 {"experts", cfg->experts, 0}};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        if (sizes[i].value < sizes[i].min || sizes[i].value > (1 << 20))
            return seldp__fail(SELDP_ERR_INVALID_ARGUMENT,
                               "layout %s: %s %d: expected an integer in %d..%d", what,
                               sizes[i].name, sizes[i].value, sizes[i].min, 1 << 20);
    l = calloc(1, sizeof *l);
    if (!l)
        return seldp__fail(SELDP_ERR_NOMEM, "out of memory creating a layout");
    l->cfg = *cfg;
    l->cfg.order = NULL;
    if (cfg->order) {
        l->order = malloc(strlen(cfg->order) + 1);
        if (!l->order)
            SELDP_FAIL(SELDP_ERR_NOMEM, "out of memory creating a layout");
        strcpy(l->order, cfg->order);
        l->cfg.order = l->order;
    }
    snprintf(l->what, sizeof l->what, "%s", what);
    SELDP_CHECK(seldp__layout_build(l));
    *out = l;
    return SELDP_OK;
fail:
    seldp_layout_destroy(l);
    return st;
}

seldp_layout_config seldp_layout_get_config(const seldp_layout *layout)
{
    return layout->cfg;
}

int seldp_layout_dp(const seldp_layout *layout)
{
    return layout->dp;
}

static const layout_kind *kind_of(const seldp_layout *l, seldp_group_kind kind)
{
    return l && (unsigned)kind < SELDP_GROUP_KINDS ? &l->kinds[kind] : NULL;
}

int seldp_layout_group_count(const seldp_layout *layout, seldp_group_kind kind)
{
    const layout_kind *k = kind_of(layout, kind);
    return k ? k->count : 0;
}

int seldp_layout_group(const seldp_layout *layout, seldp_group_kind kind, int index,
                       const int **ranks)
{
    const layout_kind *k = kind_of(layout, kind);
    if (!k || index < 0 || index >= k->count) {
        if (ranks)
            *ranks = NULL;
        return 0;
    }
    if (ranks)
        *ranks = k->ranks + (size_t)index * (size_t)k->size;
    return k->size;
}

int seldp_layout_group_of(const seldp_layout *layout, seldp_group_kind kind, int rank)
{
    const layout_kind *k = kind_of(layout, kind);
    return k && rank >= 0 && rank < layout->cfg.world ? k->group_of[rank] : -1;
}

int seldp_layout_position(const seldp_layout *layout, seldp_group_kind kind, int rank)
{
    const layout_kind *k = kind_of(layout, kind);
    return k && rank >= 0 && rank < layout->cfg.world ? k->pos_of[rank] : -1;
}

int seldp_layout_root(const seldp_layout *layout, seldp_group_kind kind, int index)
{
    const int *ranks = NULL;
    return seldp_layout_group(layout, kind, index, &ranks) > 0 ? ranks[0] : -1;
}

seldp_status seldp_layout_split_args(const seldp_layout *layout, seldp_group_kind kind, int rank,
                                     int *color, int *key)
{
    if (!layout || !color || !key)
        return seldp__fail(SELDP_ERR_INVALID_ARGUMENT,
                           "seldp_layout_split_args: layout, color and key must not be NULL");
    if ((unsigned)kind >= SELDP_GROUP_KINDS)
        return seldp__fail(SELDP_ERR_INVALID_ARGUMENT,
                           "seldp_layout_split_args: rank %d: group kind %d is not one of the %d "
                           "kinds",
                           rank, (int)kind, SELDP_GROUP_KINDS);
    if (rank < 0 || rank >= layout->cfg.world)
        return seldp__fail(SELDP_ERR_INVALID_ARGUMENT,
                           "seldp_layout_split_args: rank %d is outside the world of %s "
                           "(0..%d)",
                           rank, layout->what, layout->cfg.world - 1);
    int g = layout->kinds[kind].group_of[rank];
    *color = g >= 0 ? g : SELDP_COMM_NO_GROUP;
    *key = g >= 0 ? layout->kinds[kind].pos_of[rank] : 0;
    return SELDP_OK;
}

int seldp_layout_local_experts(const seldp_layout *layout, int rank, int *first)
{
    int per = layout->cfg.experts / layout->cfg.ep;
    int pos = seldp_layout_position(layout, SELDP_GROUP_EP, rank);
    if (first)
        *first = pos >= 0 ? pos * per : 0;
    return pos >= 0 ? per : 0;
}

int seldp_layout_stage(const seldp_layout *layout, int rank)
{
    return seldp_layout_position(layout, SELDP_GROUP_PP, rank);
}
