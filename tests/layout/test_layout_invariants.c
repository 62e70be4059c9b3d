/* Invariants of every layout any framework accepts, over worlds 1..32 and sizes tp, pp,
 * cp in {1, 2, 4}, ep in {1, 2, 4, 8}, etp in {default, 1, 2, 4} and each framework's
 * orders: group sizes; the dense reduce group is exactly the ranks of one stage and TP
 * position; an expert-data group is exactly the ranks of one stage, EP position and
 * expert-TP position (the replicas of one expert shard); embedding groups are the ends of
 * the pipeline groups; experts and roots follow the EP position and group rank 0. */
#include "layout_expect.h"

static int pos(const seldp_layout *l, seldp_group_kind k, int r)
{
    return seldp_layout_position(l, k, r);
}

/* True when the ranks that agree with r on every (kind, position-or-group) pair listed are
 * exactly r's group of `kind`. */
static bool group_is_class(const seldp_layout *l, seldp_group_kind kind, int r, int n_keys,
                           const int *keys)
{
    int world = seldp_layout_get_config(l).world;
    int g = seldp_layout_group_of(l, kind, r);
    for (int s = 0; s < world; s++) {
        bool same = true;
        for (int i = 0; i < n_keys; i++) {
            seldp_group_kind k = (seldp_group_kind)(keys[i] / 2);
            bool by_group = keys[i] % 2;
            int a = by_group ? seldp_layout_group_of(l, k, r) : pos(l, k, r);
            int b = by_group ? seldp_layout_group_of(l, k, s) : pos(l, k, s);
            same = same && a == b;
        }
        if (same != (seldp_layout_group_of(l, kind, s) == g))
            return false;
    }
    return true;
}

#define POS(k)   (2 * (k))
#define GROUP(k) (2 * (k) + 1)

static void check_layout(const seldp_layout *l)
{
    seldp_layout_config c = seldp_layout_get_config(l);
    char what[160];
    snprintf(what, sizeof what, "%s world %d tp %d pp %d cp %d ep %d etp %d order %s",
             seldp_framework_name(c.framework), c.world, c.tp, c.pp, c.cp, c.ep, c.etp,
             c.order ? c.order : "-");
    const int want_size[SELDP_GROUP_KINDS] = {c.tp,  c.pp,
                                              c.cp,  c.world / (c.tp * c.pp),
                                              c.ep,  c.world / (c.etp * c.ep * c.pp),
                                              c.etp, c.pp > 1 ? 2 : 1};
    for (int k = 0; k < SELDP_GROUP_KINDS; k++) {
        int n = seldp_layout_group_count(l, (seldp_group_kind)k);
        int members = 0;
        for (int g = 0; g < n; g++) {
            const int *ranks = NULL;
            int size = seldp_layout_group(l, (seldp_group_kind)k, g, &ranks);
            if (size != want_size[k])
                fail_msg("%s: %s group %d has %d ranks, expected %d", what,
                         seldp_group_kind_name(k), g, size, want_size[k]);
            if (seldp_layout_root(l, (seldp_group_kind)k, g) != ranks[0])
                fail_msg("%s: %s group %d: root is not group rank 0", what,
                         seldp_group_kind_name(k), g);
            for (int i = 0; i < size; i++) {
                if (seldp_layout_group_of(l, (seldp_group_kind)k, ranks[i]) != g ||
                    pos(l, (seldp_group_kind)k, ranks[i]) != i || (i && ranks[i] <= ranks[i - 1]))
                    fail_msg("%s: %s group %d: rank %d misplaced", what, seldp_group_kind_name(k),
                             g, ranks[i]);
            }
            members += size;
        }
        int want = k == SELDP_GROUP_EMBEDDING ? (c.pp > 1 ? 2 : 1) * c.world / c.pp : c.world;
        if (members != want)
            fail_msg("%s: the %s groups hold %d ranks, expected %d", what, seldp_group_kind_name(k),
                     members, want);
    }
    for (int r = 0; r < c.world; r++) {
        const int dense[] = {POS(SELDP_GROUP_PP), POS(SELDP_GROUP_TP)};
        const int expert[] = {POS(SELDP_GROUP_PP), POS(SELDP_GROUP_EP), POS(SELDP_GROUP_EXPERT_TP)};
        const int stage_tp[] = {POS(SELDP_GROUP_PP), GROUP(SELDP_GROUP_TP)};
        if (!group_is_class(l, SELDP_GROUP_DP, r, 2, dense))
            fail_msg("%s: rank %d: its dense group is not the ranks of its stage and TP position",
                     what, r);
        if (!group_is_class(l, SELDP_GROUP_EXPERT_DP, r, 3, expert))
            fail_msg("%s: rank %d: its expert-data group is not the ranks of its stage, EP "
                     "position and expert-TP position",
                     what, r);
        if (!group_is_class(l, SELDP_GROUP_TP, r, 2, stage_tp))
            fail_msg("%s: rank %d: its TP group", what, r);
        int stage = seldp_layout_stage(l, r);
        bool end = stage == 0 || stage == c.pp - 1;
        int e = seldp_layout_group_of(l, SELDP_GROUP_EMBEDDING, r);
        if (end != (e >= 0))
            fail_msg("%s: rank %d of stage %d: embedding group %d", what, r, stage, e);
        int first = -1;
        int count = seldp_layout_local_experts(l, r, &first);
        if (count != c.experts / c.ep || first != pos(l, SELDP_GROUP_EP, r) * count)
            fail_msg("%s: rank %d owns %d experts from %d", what, r, count, first);
        int color = -2, key = -2;
        assert_int_equal(seldp_layout_split_args(l, SELDP_GROUP_EP, r, &color, &key), SELDP_OK);
        if (color != seldp_layout_group_of(l, SELDP_GROUP_EP, r) ||
            key != pos(l, SELDP_GROUP_EP, r))
            fail_msg("%s: rank %d: split args %d/%d", what, r, color, key);
    }
}

static void every_accepted_combination(void **state)
{
    (void)state;
    static const int small[] = {1, 2, 4};
    static const int eps[] = {1, 2, 4, 8};
    static const int etps[] = {0, 1, 2, 4};
    static const char *const orders[SELDP_FRAMEWORKS][4] = {
        {NULL, "tp-cp-dp-ep-pp", "tp-pp-cp-ep-dp", "ep-tp-dp-cp-pp"},
        {NULL, "tp-cp-dp-ep-pp", "tp-dp-ep-cp-pp", NULL},
        {NULL, "dp-ep", NULL, NULL},
        {NULL, NULL, NULL, NULL}};
    int accepted[SELDP_FRAMEWORKS] = {0};
    for (int f = 0; f < SELDP_FRAMEWORKS; f++)
        for (int o = 0; o < 4; o++) {
            if (o > 0 && !orders[f][o])
                continue;
            for (int world = 1; world <= 32; world++)
                for (int a = 0; a < 3; a++)
                    for (int b = 0; b < 3; b++)
                        for (int d = 0; d < 3; d++)
                            for (int e = 0; e < 4; e++)
                                for (int t = 0; t < 4; t++) {
                                    seldp_layout_config cfg = {sizeof(seldp_layout_config),
                                                               (seldp_framework)f,
                                                               world,
                                                               small[a],
                                                               small[b],
                                                               small[d],
                                                               eps[e],
                                                               etps[t],
                                                               16,
                                                               orders[f][o]};
                                    seldp_layout *l = NULL;
                                    if (seldp_layout_create(&cfg, &l) != SELDP_OK)
                                        continue;
                                    accepted[f]++;
                                    check_layout(l);
                                    seldp_layout_destroy(l);
                                }
        }
    /* enough combinations of each framework got through to mean something */
    for (int f = 0; f < SELDP_FRAMEWORKS; f++)
        if (accepted[f] < 100)
            fail_msg("%s accepted only %d combinations", seldp_framework_name((seldp_framework)f),
                     accepted[f]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(every_accepted_combination),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
