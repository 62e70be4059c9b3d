/* The split rounds of an unsharded run's replica sets (harness/layout/sets.c, build_unsharded):
 * an expert-data group is split in the round after the last one any of its ranks is in, so
 * groups that share no rank take one split of the world together, and every rank still meets
 * its sets in the order of their index (the order its sessions are initialized and reduced
 * in). A world of 2,048 ranks with 64 expert-data groups once made 65 splits of the world. */
#define _POSIX_C_SOURCE 200809L

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "harness_test.h"
#include "options.h"
#include "replica_sets.h"
#include "run.h"
#include "run_create.h"

static hx_run *create(hx_options *o)
{
    o->out_dir = "";
    o->steps = 1;
    hx_run *run = NULL;
    seldp_status st = hx_run_create(o, &run);
    if (st != SELDP_OK)
        fail_msg("hx_run_create: %s", hx_last_error());
    return run;
}

/* Every rank is in at most one set a round (hx_sets_build refuses two), meets its sets in
 * increasing index, and each data set sits one round after the latest earlier set of any of
 * its ranks. */
static void expect_rule(const hx_run *run)
{
    const hx_sets *s = &run->sets;
    const int W = run->opts.world;
    int *last = calloc((size_t)W, sizeof *last);
    assert_non_null(last);
    for (int i = 0; i < s->n; i++) {
        const hx_set *set = &s->sets[i];
        if (set->kind == HX_SET_SHARED) {
            assert_int_equal(set->round, 0);
            continue;
        }
        int want = 1;
        for (int k = 0; k < set->size; k++)
            want = last[set->ranks[k]] + 1 > want ? last[set->ranks[k]] + 1 : want;
        if (set->round != want)
            fail_msg("set %d (%s) is in round %d, expected %d", i, set->label, set->round, want);
        for (int k = 0; k < set->size; k++) {
            last[set->ranks[k]] = set->round;
            assert_int_equal(s->member[set->round * W + set->ranks[k]], i);
        }
    }
    for (int r = 0; r < W; r++) {
        int prev = -1;
        for (int k = 0; k < s->n_rounds; k++) {
            int i = s->member[k * W + r];
            if (i < 0)
                continue;
            if (i <= prev)
                fail_msg("rank %d meets set %d after set %d", r, i, prev);
            prev = i;
        }
    }
    free(last);
}

/* A generated layout: the expert-data groups are disjoint, one round holds them all. */
static void test_disjoint_groups_share_a_round(void **state)
{
    (void)state;
    static const int shapes[][3] = {{16, 4, 8}, {8, 2, 4}, {12, 3, 6}, {2, 1, 4}};
    for (size_t c = 0; c < sizeof shapes / sizeof *shapes; c++) {
        hx_options o;
        hx_options_default(&o);
        o.world = shapes[c][0];
        o.ep = shapes[c][1];
        o.model.experts = shapes[c][2];
        hx_run *run = create(&o);
        assert_int_equal(run->layout->n_data, o.ep);
        assert_int_equal(run->sets.n_rounds, 2);
        for (int i = 1; i < run->sets.n; i++)
            assert_int_equal(run->sets.sets[i].round, 1);
        expect_rule(run);
        hx_run_destroy(run);
    }
}

/* A layout file whose expert-data groups overlap (uneven.json: rank 0 holds experts 0 and 1,
 * replicated over different ranks): groups that share a rank take later rounds, in index
 * order for every rank, and groups that share none still take one together. */
static void test_overlapping_groups_keep_index_order(void **state)
{
    (void)state;
    hx_options o;
    hx_options_default(&o);
    o.layout_file = hx_test_layout("uneven.json");
    hx_run *run = create(&o);
    const hx_sets *s = &run->sets;
    expect_rule(run);
    assert_true(s->n_rounds < 1 + run->layout->n_data);
    hx_run_destroy(run);
}

/* Runs on both: every check passes (the sessions meet in the rounds' order). */
static void test_runs_pass(void **state)
{
    (void)state;
    char args[512];
    snprintf(args, sizeof args, "--layout-file %s", hx_test_layout("uneven.json"));
    hx_test_run_passes(args);
    hx_test_run_passes("--world 12 --ep 3 --experts 6");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_disjoint_groups_share_a_round),
        cmocka_unit_test(test_overlapping_groups_keep_index_order),
        cmocka_unit_test(test_runs_pass),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
