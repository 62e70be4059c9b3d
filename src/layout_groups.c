/* Layouts from explicit groups (seldp_layout_create_from_groups): each kind checked to be a
 * partition of the world of the expected sizes, then the rules by which the kinds fit
 * together, the same the framework presets satisfy (tests/layout/test_layout_invariants.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "layout_impl.h"

#define REJECT(...) return seldp__fail(SELDP_ERR_INVALID_ARGUMENT, __VA_ARGS__)

static const char *const size_rule[SELDP_GROUP_KINDS] = {
    "tp",  "pp",
    "cp",  "world / (tp * pp)",
    "ep",  "world / (etp * ep * pp)",
    "etp", "2, the first and last stage (1 where pp is 1)"};

/* Kind k as given: count[k] groups of size[k] ranks, every rank of the world in exactly one
 * (the embedding's: at most one). `seen` holds world entries. */
static seldp_status check_kind(const seldp_layout *l, const seldp_layout_groups *g, int k,
                               int want_size, int want_count, int *seen)
{
    const char *name = seldp_group_kind_name((seldp_group_kind)k);
    int world = l->cfg.world;
    if (g->size[k] != want_size)
        REJECT("%s: the %s groups have %d ranks, expected %d (%s)", l->what, name, g->size[k],
               want_size, size_rule[k]);
    if (g->count[k] != want_count)
        REJECT("%s: %d %s groups given, expected %d of %d ranks", l->what, g->count[k], name,
               want_count, want_size);
    if (!g->groups[k])
        REJECT("%s: the %s groups are missing (NULL)", l->what, name);
    for (int r = 0; r < world; r++)
        seen[r] = -1;
    for (int i = 0; i < want_count; i++)
        for (int j = 0; j < want_size; j++) {
            int r = g->groups[k][i * want_size + j];
            if (r < 0 || r >= world)
                REJECT("%s: %s group %d: rank %d is outside the world (0..%d)", l->what, name, i, r,
                       world - 1);
            if (seen[r] >= 0)
                REJECT("%s: rank %d is listed twice in the %s groups (groups %d and %d); a rank "
                       "belongs to %s",
                       l->what, r, name, seen[r], i,
                       k == SELDP_GROUP_EMBEDDING ? "at most one" : "exactly one");
            seen[r] = i;
        }
    for (int r = 0; r < world && k != SELDP_GROUP_EMBEDDING; r++)
        if (seen[r] < 0)
            REJECT("%s: rank %d is in no %s group; the %s groups must cover the world (0..%d)",
                   l->what, r, name, name, world - 1);
    return SELDP_OK;
}

/* What two ranks are compared by: their position in a kind's group, or the group itself. */
typedef struct attr {
    seldp_group_kind kind;
    bool group;
    const char *name;
} attr;

static int attr_of(const seldp_layout *l, attr a, int r)
{
    return a.group ? seldp_layout_group_of(l, a.kind, r) : seldp_layout_position(l, a.kind, r);
}

/* Every group of `kind` holds ranks that agree on `a`; `rule` says why in the message. */
static seldp_status check_inside(const seldp_layout *l, seldp_group_kind kind, attr a,
                                 const char *rule)
{
    for (int r = 0; r < l->cfg.world; r++) {
        int g = seldp_layout_group_of(l, kind, r);
        if (g < 0)
            continue;
        int first = seldp_layout_root(l, kind, g);
        if (attr_of(l, a, r) != attr_of(l, a, first))
            REJECT("%s: %s group %d holds rank %d (%s %d) and rank %d (%s %d): %s", l->what,
                   seldp_group_kind_name(kind), g, first, a.name, attr_of(l, a, first), r, a.name,
                   attr_of(l, a, r), rule);
    }
    return SELDP_OK;
}

/* A data shard is a block of tp x cp ranks: the TP groups of a CP group's ranks, in CP order,
 * are the same from every rank of those TP groups. */
static seldp_status check_cp_blocks(const seldp_layout *l)
{
    for (int r = 0; r < l->cfg.world; r++) {
        const int *mine = NULL, *tp = NULL, *theirs = NULL;
        int n = seldp_layout_group(l, SELDP_GROUP_CP, seldp_layout_group_of(l, SELDP_GROUP_CP, r),
                                   &mine);
        seldp_layout_group(l, SELDP_GROUP_TP, seldp_layout_group_of(l, SELDP_GROUP_TP, r), &tp);
        int s = tp[0];
        seldp_layout_group(l, SELDP_GROUP_CP, seldp_layout_group_of(l, SELDP_GROUP_CP, s), &theirs);
        for (int i = 0; i < n; i++)
            if (seldp_layout_group_of(l, SELDP_GROUP_TP, mine[i]) !=
                seldp_layout_group_of(l, SELDP_GROUP_TP, theirs[i]))
                REJECT("%s: ranks %d and %d share a TP group but CP position %d of their CP "
                       "groups (ranks %d and %d) does not: the TP and CP groups must form blocks "
                       "of tp x cp ranks (the data shards)",
                       l->what, s, r, i, theirs[i], mine[i]);
    }
    return SELDP_OK;
}

/* The embedding groups given must be the ends of the pipeline groups. */
static seldp_status check_embedding(seldp_layout *l, const seldp_layout_groups *g)
{
    seldp_status st = SELDP_OK;
    layout_kind given = {0};
    if (g->groups[SELDP_GROUP_EMBEDDING]) {
        SELDP_CHECK(seldp__layout_set(l, SELDP_GROUP_EMBEDDING, g->count[SELDP_GROUP_EMBEDDING],
                                      g->size[SELDP_GROUP_EMBEDDING],
                                      g->groups[SELDP_GROUP_EMBEDDING]));
        given = l->kinds[SELDP_GROUP_EMBEDDING];
        l->kinds[SELDP_GROUP_EMBEDDING] = (layout_kind){0};
    }
    SELDP_CHECK(seldp__layout_embedding(l));
    const layout_kind *want = &l->kinds[SELDP_GROUP_EMBEDDING];
    for (int i = 0; given.ranks && i < want->count * want->size; i++)
        if (given.ranks[i] != want->ranks[i]) {
            int grp = i / want->size;
            SELDP_FAIL(SELDP_ERR_INVALID_ARGUMENT,
                       "%s: embedding group %d holds rank %d where the first and last stage of "
                       "pipeline group %d hold rank %d: the embedding groups are the ends of "
                       "the pipeline groups",
                       l->what, grp, given.ranks[i],
                       seldp_layout_group_of(l, SELDP_GROUP_PP, want->ranks[grp * want->size]),
                       want->ranks[i]);
        }
fail:
    free(given.ranks);
    free(given.group_of);
    free(given.pos_of);
    return st;
}

static seldp_status check_fit(seldp_layout *l, const seldp_layout_groups *g)
{
    seldp_status st = SELDP_OK;
    const attr stage = {SELDP_GROUP_PP, false, "stage"};
    const attr tp_pos = {SELDP_GROUP_TP, false, "TP position"};
    const attr cp_pos = {SELDP_GROUP_CP, false, "CP position"};
    const attr ep_pos = {SELDP_GROUP_EP, false, "EP position"};
    const attr etp_pos = {SELDP_GROUP_EXPERT_TP, false, "expert-TP position"};
    const attr dense = {SELDP_GROUP_DP, true, "dp group"};
    const char *in_stage = "a group of this kind lies inside one stage";
    SELDP_CHECK(check_inside(l, SELDP_GROUP_TP, stage, in_stage));
    SELDP_CHECK(check_inside(l, SELDP_GROUP_DP, stage,
                             "a dp group is the ranks of one stage and TP position"));
    SELDP_CHECK(check_inside(l, SELDP_GROUP_DP, tp_pos,
                             "a dp group is the ranks of one stage and TP position"));
    SELDP_CHECK(check_inside(l, SELDP_GROUP_CP, dense,
                             "a CP group lies inside one dp (data x context) "
                             "group"));
    SELDP_CHECK(check_cp_blocks(l));
    const char *pipe = "activations go stage to stage between ranks of the same TP and CP "
                       "positions";
    SELDP_CHECK(check_inside(l, SELDP_GROUP_PP, tp_pos, pipe));
    SELDP_CHECK(check_inside(l, SELDP_GROUP_PP, cp_pos, pipe));
    SELDP_CHECK(check_inside(l, SELDP_GROUP_EP, stage, in_stage));
    SELDP_CHECK(check_inside(l, SELDP_GROUP_EP, etp_pos,
                             "an EP group exchanges tokens between the ranks of one expert-TP "
                             "position"));
    SELDP_CHECK(check_inside(l, SELDP_GROUP_EXPERT_TP, stage, in_stage));
    SELDP_CHECK(check_inside(l, SELDP_GROUP_EXPERT_TP, ep_pos,
                             "an expert-TP group holds the shards of the experts of one EP "
                             "position"));
    const char *edp = "an expert-data group is the ranks of one stage, EP position and expert-TP "
                      "position (the replicas of one expert shard)";
    SELDP_CHECK(check_inside(l, SELDP_GROUP_EXPERT_DP, stage, edp));
    SELDP_CHECK(check_inside(l, SELDP_GROUP_EXPERT_DP, ep_pos, edp));
    SELDP_CHECK(check_inside(l, SELDP_GROUP_EXPERT_DP, etp_pos, edp));
    SELDP_CHECK(check_embedding(l, g));
fail:
    return st;
}

seldp_status seldp_layout_create_from_groups(const seldp_layout_groups *groups, seldp_layout **out)
{
    seldp_status st = SELDP_OK;
    seldp_layout *l = NULL;
    int *seen = NULL;
    if (!groups || !out)
        REJECT("seldp_layout_create_from_groups: groups and out must not be NULL");
    seldp_layout_groups g = SELDP_LAYOUT_GROUPS_INIT;
    SELDP_CHECK(seldp__config_read(&g, sizeof g, groups, "seldp_layout_create_from_groups",
                                   "seldp_layout_groups", "SELDP_LAYOUT_GROUPS_INIT"));
    if (g.framework < SELDP_FRAMEWORK_NONE || g.framework >= SELDP_FRAMEWORKS)
        REJECT("seldp_layout_create_from_groups: framework %d is not one of none, megatron, "
               "megatron-0.9, deepspeed, torchtitan",
               (int)g.framework);
    char what[192];
    snprintf(what, sizeof what, "layout from groups (world %d, tp %d, pp %d, cp %d, ep %d, etp %d)",
             g.world, g.tp, g.pp, g.cp, g.ep, g.etp);
    const struct {
        const char *name;
        int value, min;
    } sizes[] = {{"world", g.world, 1},    {"tp", g.tp, 1}, {"pp", g.pp, 1},
                 {"cp", g.cp, 1},          {"ep", g.ep, 1}, {"etp", g.etp, 1},
                 {"experts", g.experts, 0}};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        if (sizes[i].value < sizes[i].min || sizes[i].value > (1 << 20))
            REJECT("%s: %s %d: expected an integer in %d..%d", what, sizes[i].name, sizes[i].value,
                   sizes[i].min, 1 << 20);
    if (g.world % (g.tp * g.pp * g.cp) != 0)
        REJECT("%s: tp * pp * cp (%d) must divide the world", what, g.tp * g.pp * g.cp);
    if (g.world % (g.etp * g.ep * g.pp) != 0)
        REJECT("%s: etp * ep * pp (%d) must divide the world", what, g.etp * g.ep * g.pp);
    if (g.experts % g.ep != 0)
        REJECT("%s: experts %d: expected a multiple of ep", what, g.experts);
    l = calloc(1, sizeof *l);
    seen = malloc((size_t)g.world * sizeof *seen);
    if (!l || !seen)
        SELDP_FAIL(SELDP_ERR_NOMEM, "out of memory creating a layout from groups");
    l->cfg = (seldp_layout_config)SELDP_LAYOUT_CONFIG_INIT;
    l->cfg.framework = g.framework;
    l->cfg.world = g.world;
    l->cfg.tp = g.tp;
    l->cfg.pp = g.pp;
    l->cfg.cp = g.cp;
    l->cfg.ep = g.ep;
    l->cfg.etp = g.etp;
    l->cfg.experts = g.experts;
    l->dp = g.world / (g.tp * g.pp * g.cp);
    snprintf(l->what, sizeof l->what, "%s", what);
    if (g.order) {
        l->order = malloc(strlen(g.order) + 1);
        if (!l->order)
            SELDP_FAIL(SELDP_ERR_NOMEM, "out of memory creating a layout from groups");
        strcpy(l->order, g.order);
        l->cfg.order = l->order;
    }
    const int want_size[SELDP_GROUP_KINDS] = {g.tp,  g.pp,
                                              g.cp,  g.world / (g.tp * g.pp),
                                              g.ep,  g.world / (g.etp * g.ep * g.pp),
                                              g.etp, g.pp > 1 ? 2 : 1};
    for (int k = 0; k < SELDP_GROUP_KINDS; k++) {
        int count = k == SELDP_GROUP_EMBEDDING ? g.world / g.pp : g.world / want_size[k];
        if (k == SELDP_GROUP_EMBEDDING && !g.groups[k])
            continue; /* derived from the pipeline groups */
        SELDP_CHECK(check_kind(l, &g, k, want_size[k], count, seen));
        if (k != SELDP_GROUP_EMBEDDING)
            SELDP_CHECK(
                seldp__layout_set(l, (seldp_group_kind)k, count, want_size[k], g.groups[k]));
    }
    SELDP_CHECK(check_fit(l, &g));
    free(seen);
    *out = l;
    return SELDP_OK;
fail:
    free(seen);
    seldp_layout_destroy(l);
    return st;
}
