/* seldp_layout_create_from_groups: every layout any framework accepts (worlds 1..32, tp, pp,
 * cp in {1, 2, 4}, ep in {1, 2, 4, 8}, etp in {default, 1, 2}) rebuilt from its own groups
 * answers every query as the preset does; and each rule the constructor checks rejects a
 * grid that breaks it, in one line naming what was expected. */
#include <stdlib.h>

#include "layout_expect.h"

/* The preset's groups as seldp_layout_groups; the flat lists in `flat` (freed by the caller). */
static seldp_layout_groups groups_of(const seldp_layout *l, int **flat)
{
    seldp_layout_config c = seldp_layout_get_config(l);
    seldp_layout_groups g = SELDP_LAYOUT_GROUPS_INIT;
    g.framework = c.framework;
    g.order = c.order;
    g.world = c.world;
    g.tp = c.tp;
    g.pp = c.pp;
    g.cp = c.cp;
    g.ep = c.ep;
    g.etp = c.etp;
    g.experts = c.experts;
    for (int k = 0; k < SELDP_GROUP_KINDS; k++) {
        g.count[k] = seldp_layout_group_count(l, (seldp_group_kind)k);
        g.size[k] = seldp_layout_group(l, (seldp_group_kind)k, 0, NULL);
        flat[k] = calloc((size_t)(g.count[k] * g.size[k] + 1), sizeof **flat);
        assert_non_null(flat[k]);
        /* given in reverse, each group reversed: the constructor sorts */
        for (int i = 0; i < g.count[k]; i++) {
            const int *ranks = NULL;
            seldp_layout_group(l, (seldp_group_kind)k, i, &ranks);
            for (int j = 0; j < g.size[k]; j++)
                flat[k][(g.count[k] - 1 - i) * g.size[k] + j] = ranks[g.size[k] - 1 - j];
        }
        g.groups[k] = flat[k];
    }
    return g;
}

static void free_flat(int **flat)
{
    for (int k = 0; k < SELDP_GROUP_KINDS; k++)
        free(flat[k]);
}

static void expect_same(const seldp_layout *a, const seldp_layout *b, const char *what)
{
    seldp_layout_config x = seldp_layout_get_config(a), y = seldp_layout_get_config(b);
    if (x.framework != y.framework || x.world != y.world || x.tp != y.tp || x.pp != y.pp ||
        x.cp != y.cp || x.ep != y.ep || x.etp != y.etp || x.experts != y.experts ||
        (x.order == NULL) != (y.order == NULL) || (x.order && strcmp(x.order, y.order) != 0))
        fail_msg("%s: the configs differ", what);
    if (seldp_layout_dp(a) != seldp_layout_dp(b))
        fail_msg("%s: dp %d against %d", what, seldp_layout_dp(a), seldp_layout_dp(b));
    for (int k = 0; k < SELDP_GROUP_KINDS; k++) {
        seldp_group_kind kind = (seldp_group_kind)k;
        int n = seldp_layout_group_count(a, kind);
        if (n != seldp_layout_group_count(b, kind))
            fail_msg("%s: %d %s groups against %d", what, n, seldp_group_kind_name(kind),
                     seldp_layout_group_count(b, kind));
        for (int i = 0; i < n; i++) {
            const int *ra = NULL, *rb = NULL;
            int sa = seldp_layout_group(a, kind, i, &ra), sb = seldp_layout_group(b, kind, i, &rb);
            if (sa != sb || memcmp(ra, rb, (size_t)sa * sizeof *ra) != 0 ||
                seldp_layout_root(a, kind, i) != seldp_layout_root(b, kind, i))
                fail_msg("%s: %s group %d differs", what, seldp_group_kind_name(kind), i);
        }
        for (int r = -1; r <= x.world; r++) {
            int ca = 0, ka = 0, cb = 0, kb = 0;
            seldp_status sa = seldp_layout_split_args(a, kind, r, &ca, &ka);
            seldp_status sb = seldp_layout_split_args(b, kind, r, &cb, &kb);
            if (seldp_layout_group_of(a, kind, r) != seldp_layout_group_of(b, kind, r) ||
                seldp_layout_position(a, kind, r) != seldp_layout_position(b, kind, r) ||
                sa != sb || ca != cb || ka != kb)
                fail_msg("%s: rank %d's %s group differs", what, r, seldp_group_kind_name(kind));
        }
    }
    for (int r = 0; r < x.world; r++) {
        int fa = -1, fb = -1;
        int na = seldp_layout_local_experts(a, r, &fa), nb = seldp_layout_local_experts(b, r, &fb);
        if (na != nb || fa != fb || seldp_layout_stage(a, r) != seldp_layout_stage(b, r))
            fail_msg("%s: rank %d's experts or stage differ", what, r);
    }
}

static void every_framework_round_trip(void **state)
{
    (void)state;
    static const int small[] = {1, 2, 4};
    static const int eps[] = {1, 2, 4, 8};
    static const int etps[] = {0, 1, 2};
    static const char *const orders[SELDP_FRAMEWORKS][3] = {
        {NULL, "tp-cp-dp-ep-pp", "tp-pp-cp-ep-dp"},
        {NULL, "tp-dp-ep-cp-pp", NULL},
        {NULL, "dp-ep", NULL},
        {NULL, NULL, NULL}};
    int rebuilt[SELDP_FRAMEWORKS] = {0};
    for (int f = 0; f < SELDP_FRAMEWORKS; f++)
        for (int o = 0; o < 3; o++) {
            if (o > 0 && !orders[f][o])
                continue;
            for (int world = 1; world <= 32; world++)
                for (int a = 0; a < 3; a++)
                    for (int b = 0; b < 3; b++)
                        for (int d = 0; d < 3; d++)
                            for (int e = 0; e < 4; e++)
                                for (int t = 0; t < 3; t++) {
                                    seldp_layout_config cfg = SELDP_LAYOUT_CONFIG_INIT;
                                    cfg.framework = (seldp_framework)f;
                                    cfg.world = world;
                                    cfg.tp = small[a];
                                    cfg.pp = small[b];
                                    cfg.cp = small[d];
                                    cfg.ep = eps[e];
                                    cfg.etp = etps[t];
                                    cfg.experts = 16;
                                    cfg.order = orders[f][o];
                                    seldp_layout *preset = NULL, *copy = NULL;
                                    if (seldp_layout_create(&cfg, &preset) != SELDP_OK)
                                        continue;
                                    int *flat[SELDP_GROUP_KINDS];
                                    seldp_layout_groups g = groups_of(preset, flat);
                                    char what[160];
                                    snprintf(what, sizeof what,
                                             "%s world %d tp %d pp %d cp %d ep %d etp %d order %s",
                                             seldp_framework_name(g.framework), world, g.tp, g.pp,
                                             g.cp, g.ep, g.etp, g.order ? g.order : "-");
                                    if (seldp_layout_create_from_groups(&g, &copy) != SELDP_OK)
                                        fail_msg("%s: rebuilding from its groups: %s", what,
                                                 seldp_last_error());
                                    expect_same(preset, copy, what);
                                    seldp_layout_destroy(copy);
                                    /* without the embedding: derived from the pipeline */
                                    g.groups[SELDP_GROUP_EMBEDDING] = NULL;
                                    if (seldp_layout_create_from_groups(&g, &copy) != SELDP_OK)
                                        fail_msg("%s: without embedding: %s", what,
                                                 seldp_last_error());
                                    expect_same(preset, copy, what);
                                    seldp_layout_destroy(copy);
                                    free_flat(flat);
                                    seldp_layout_destroy(preset);
                                    rebuilt[f]++;
                                }
        }
    for (int f = 0; f < SELDP_FRAMEWORKS; f++)
        if (rebuilt[f] < 100)
            fail_msg("%s: only %d layouts rebuilt", seldp_framework_name((seldp_framework)f),
                     rebuilt[f]);
}

/* Megatron, world 16, tp 2, pp 2, ep 2 (etp 2): the groups of the README's example. */
static seldp_layout *example(int **flat, seldp_layout_groups *g)
{
    seldp_layout *l = layout_build(SELDP_FRAMEWORK_MEGATRON, 16, 2, 2, 1, 2, 0, 8, NULL);
    *g = groups_of(l, flat);
    g->framework = SELDP_FRAMEWORK_NONE;
    g->order = NULL;
    return l;
}

/* Build from g; expect a rejection whose message holds `why`. */
static void expect_reject(const seldp_layout_groups *g, const char *why)
{
    seldp_layout *out = (seldp_layout *)(void *)&out; /* must stay untouched */
    seldp_layout *before = out;
    assert_int_equal(seldp_layout_create_from_groups(g, &out), SELDP_ERR_INVALID_ARGUMENT);
    assert_ptr_equal(out, before);
    const char *msg = seldp_last_error();
    if (!strstr(msg, why))
        fail_msg("message '%s' lacks '%s'", msg, why);
    if (strchr(msg, '\n'))
        fail_msg("message '%s' is more than one line", msg);
}

/* Swap two ranks inside the flat list of `kind`. */
static void swap_in(int *flat, int n, int a, int b)
{
    for (int i = 0; i < n; i++)
        flat[i] = flat[i] == a ? b : flat[i] == b ? a : flat[i];
}

static void rejects_each_rule(void **state)
{
    (void)state;
    int *flat[SELDP_GROUP_KINDS];
    seldp_layout_groups g;
    seldp_layout *l = example(flat, &g);
    seldp_layout *ok = NULL;
    assert_int_equal(seldp_layout_create_from_groups(&g, &ok), SELDP_OK);
    assert_int_equal(seldp_layout_get_config(ok).framework, SELDP_FRAMEWORK_NONE);
    assert_string_equal(seldp_framework_name(SELDP_FRAMEWORK_NONE), "none");
    seldp_layout_destroy(ok);

    seldp_layout_groups bad = g;
    bad.struct_size = 4;
    expect_reject(&bad, "struct_size");
    bad = g;
    bad.framework = (seldp_framework)7;
    expect_reject(&bad, "framework 7");
    bad = g;
    bad.tp = 0;
    expect_reject(&bad, "tp 0: expected an integer in 1..");
    bad = g;
    bad.tp = 3;
    expect_reject(&bad, "tp * pp * cp (6) must divide the world");
    bad = g;
    bad.etp = 8;
    expect_reject(&bad, "etp * ep * pp (32) must divide the world");
    bad = g;
    bad.experts = 7;
    expect_reject(&bad, "experts 7: expected a multiple of ep");
    bad = g;
    bad.size[SELDP_GROUP_TP] = 4;
    expect_reject(&bad, "the tp groups have 4 ranks, expected 2 (tp)");
    bad = g;
    bad.count[SELDP_GROUP_EP] = 7;
    expect_reject(&bad, "7 ep groups given, expected 8 of 2 ranks");
    bad = g;
    bad.groups[SELDP_GROUP_CP] = NULL;
    expect_reject(&bad, "the cp groups are missing");

    int copy[64];
    int n_tp = g.count[SELDP_GROUP_TP] * g.size[SELDP_GROUP_TP];
    memcpy(copy, flat[SELDP_GROUP_TP], (size_t)n_tp * sizeof *copy);
    bad = g;
    bad.groups[SELDP_GROUP_TP] = copy;
    copy[3] = 16;
    expect_reject(&bad, "rank 16 is outside the world (0..15)");
    memcpy(copy, flat[SELDP_GROUP_TP], (size_t)n_tp * sizeof *copy);
    copy[1] = copy[0];
    expect_reject(&bad, "is listed twice in the tp groups");
    expect_reject(&bad, "belongs to exactly one");

    /* tp groups [0,8] ... : pairs across stages */
    int across[16];
    for (int i = 0; i < 8; i++) {
        across[2 * i] = i;
        across[2 * i + 1] = i + 8;
    }
    bad = g;
    bad.groups[SELDP_GROUP_TP] = across;
    expect_reject(&bad, "tp group 0 holds rank 0 (stage 0) and rank 8 (stage 1)");

    /* swapping ranks 1 and 2 in the dp groups only: [0,1,4,6] mixes TP positions */
    int dp[16];
    memcpy(dp, flat[SELDP_GROUP_DP], sizeof dp);
    swap_in(dp, 16, 1, 2);
    bad = g;
    bad.groups[SELDP_GROUP_DP] = dp;
    expect_reject(&bad, "a dp group is the ranks of one stage and TP position");

    /* pipelines pairing TP position 0 with TP position 1 */
    int pp[16];
    for (int i = 0; i < 8; i++) {
        pp[2 * i] = i;
        pp[2 * i + 1] = 8 + (i ^ 1);
    }
    bad = g;
    bad.groups[SELDP_GROUP_PP] = pp;
    bad.groups[SELDP_GROUP_EMBEDDING] = NULL;
    expect_reject(&bad, "activations go stage to stage between ranks of the same TP and CP");

    /* ep groups mixing the stages */
    int ep[16];
    memcpy(ep, flat[SELDP_GROUP_EP], sizeof ep);
    swap_in(ep, 16, 2, 8);
    bad = g;
    bad.groups[SELDP_GROUP_EP] = ep;
    expect_reject(&bad, "ep group");
    expect_reject(&bad, "a group of this kind lies inside one stage");

    /* expert-TP groups [0,3] [1,2]: across EP positions ([0,2] is an EP group) */
    int etp[16];
    memcpy(etp, flat[SELDP_GROUP_EXPERT_TP], sizeof etp);
    swap_in(etp, 16, 1, 3);
    bad = g;
    bad.groups[SELDP_GROUP_EXPERT_TP] = etp;
    expect_reject(&bad, "expert-TP position");

    /* expert-data groups [0,5] [1,4]: mixing expert-TP positions */
    int edp[16];
    memcpy(edp, flat[SELDP_GROUP_EXPERT_DP], sizeof edp);
    swap_in(edp, 16, 4, 5);
    bad = g;
    bad.groups[SELDP_GROUP_EXPERT_DP] = edp;
    expect_reject(&bad,
                  "an expert-data group is the ranks of one stage, EP position and expert-TP");

    /* an embedding group that is not the ends of its pipeline */
    int emb[16];
    memcpy(emb, flat[SELDP_GROUP_EMBEDDING], sizeof emb);
    swap_in(emb, 16, 8, 9);
    bad = g;
    bad.groups[SELDP_GROUP_EMBEDDING] = emb;
    expect_reject(&bad, "the embedding groups are the ends of the pipeline groups");
    free_flat(flat);
    seldp_layout_destroy(l);

    /* cp: Megatron world 8, tp 2, cp 2: cp groups crossing the TP blocks */
    l = layout_build(SELDP_FRAMEWORK_MEGATRON, 8, 2, 1, 2, 1, 0, 0, NULL);
    g = groups_of(l, flat);
    /* cp groups [0,2] [1,3] [4,6] [5,7]; [0,4] [2,6] [1,3] [5,7] stay inside the dp groups
     * [0,2,4,6] [1,3,5,7] but pair TP groups [0,1] and [4,5] against [0,1] and [2,3] */
    int cp[8] = {0, 4, 2, 6, 1, 3, 5, 7};
    bad = g;
    bad.groups[SELDP_GROUP_CP] = cp;
    expect_reject(&bad, "the TP and CP groups must form blocks of tp x cp ranks");
    /* a cp group across the dp groups [0,2,4,6] [1,3,5,7]: [0,1] */
    memcpy(cp, flat[SELDP_GROUP_CP], sizeof cp);
    swap_in(cp, 8, 1, 2);
    bad.groups[SELDP_GROUP_CP] = cp;
    expect_reject(&bad, "a CP group lies inside one dp (data x context) group");
    free_flat(flat);
    seldp_layout_destroy(l);
    expect_reject(NULL, "groups and out must not be NULL");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(every_framework_round_trip),
        cmocka_unit_test(rejects_each_rule),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
