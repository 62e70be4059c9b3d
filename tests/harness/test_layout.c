/* Layouts: the group lists of ep-dp (DeepSpeed, Megatron-Core with TP = 1) and dp-ep, roots,
 * layout files and their errors, the JSON form, and splitting a host world into the groups. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "harness_test.h"
#include "layout.h"
#include "ranks.h"

/* Compare a group with a literal list of ranks. */
static void expect_group(const hx_group *g, int n, const int *ranks)
{
    assert_int_equal(g->size, n);
    for (int i = 0; i < n; i++)
        if (g->ranks[i] != ranks[i])
            fail_msg("group rank %d is %d, expected %d", i, g->ranks[i], ranks[i]);
}

#define EXPECT_GROUP(g, ...)                                                                       \
    expect_group((g), (int)(sizeof((int[]){__VA_ARGS__}) / sizeof(int)), (int[]){__VA_ARGS__})

static void test_ep_dp_world8_ep4(void **state)
{
    (void)state;
    hx_layout *l = NULL;
    assert_int_equal(hx_layout_generate(8, 4, 8, HX_ORDER_EP_DP, HX_ROOTS_FIRST, &l), SELDP_OK);
    /* DeepSpeed's _create_expert_and_data_parallel and Megatron-Core's initialize_model_parallel
     * (TP = PP = 1): expert-parallel groups of consecutive ranks, expert-data groups strided */
    assert_int_equal(l->n_ep, 2);
    EXPECT_GROUP(&l->ep[0], 0, 1, 2, 3);
    EXPECT_GROUP(&l->ep[1], 4, 5, 6, 7);
    assert_int_equal(l->n_data, 4);
    EXPECT_GROUP(&l->data[0], 0, 4);
    EXPECT_GROUP(&l->data[1], 1, 5);
    EXPECT_GROUP(&l->data[2], 2, 6);
    EXPECT_GROUP(&l->data[3], 3, 7);
    EXPECT_GROUP(&l->shared, 0, 1, 2, 3, 4, 5, 6, 7);
    /* E / ep = 2 local experts: rank at position j holds experts 2j, 2j + 1 */
    int owned[8];
    assert_int_equal(hx_layout_owned(l, 5, owned), 2);
    assert_int_equal(owned[0], 2);
    assert_int_equal(owned[1], 3);
    assert_int_equal(l->data_of[2], 1);
    assert_int_equal(l->data_of[3], 1);
    assert_int_equal(l->data_of[7], 3);
    assert_int_equal(l->ep_of[5], 1);
    assert_int_equal(l->shared.root, 0);
    for (int d = 0; d < 4; d++)
        assert_int_equal(l->data[d].root, d);
    int in[8];
    assert_int_equal(hx_layout_owners_in(l, 6, 1, in), 1);
    assert_int_equal(in[0], 7);
    hx_layout_destroy(l);
}

static void test_dp_ep_world8_ep4(void **state)
{
    (void)state;
    hx_layout *l = NULL;
    assert_int_equal(hx_layout_generate(8, 4, 8, HX_ORDER_DP_EP, HX_ROOTS_FIRST, &l), SELDP_OK);
    EXPECT_GROUP(&l->ep[0], 0, 2, 4, 6);
    EXPECT_GROUP(&l->ep[1], 1, 3, 5, 7);
    EXPECT_GROUP(&l->data[0], 0, 1);
    EXPECT_GROUP(&l->data[1], 2, 3);
    EXPECT_GROUP(&l->data[2], 4, 5);
    EXPECT_GROUP(&l->data[3], 6, 7);
    int owned[8];
    assert_int_equal(hx_layout_owned(l, 5, owned), 2);
    assert_int_equal(owned[0], 4);
    assert_int_equal(owned[1], 5);
    hx_layout_destroy(l);
}

static void test_edges_and_roots(void **state)
{
    (void)state;
    hx_layout *l = NULL;
    /* ep 1: every rank its own EP group and holds every expert; one data group of all */
    assert_int_equal(hx_layout_generate(4, 1, 8, HX_ORDER_EP_DP, HX_ROOTS_LAST, &l), SELDP_OK);
    assert_int_equal(l->n_ep, 4);
    EXPECT_GROUP(&l->ep[2], 2);
    assert_int_equal(l->n_data, 1);
    EXPECT_GROUP(&l->data[0], 0, 1, 2, 3);
    assert_int_equal(l->data[0].root, 3);
    assert_int_equal(l->shared.root, 3);
    hx_layout_destroy(l);
    /* ep = world: one EP group, every expert on a single rank */
    assert_int_equal(hx_layout_generate(4, 4, 4, HX_ORDER_EP_DP, HX_ROOTS_SPREAD, &l), SELDP_OK);
    assert_int_equal(l->n_ep, 1);
    assert_int_equal(l->n_data, 4);
    EXPECT_GROUP(&l->data[3], 3);
    hx_layout_destroy(l);
    /* spread roots land on different ranks */
    assert_int_equal(hx_layout_generate(8, 2, 4, HX_ORDER_EP_DP, HX_ROOTS_SPREAD, &l), SELDP_OK);
    EXPECT_GROUP(&l->data[1], 1, 3, 5, 7);
    assert_int_equal(l->data[0].root, 0);
    assert_int_equal(l->data[1].root, 3);
    hx_layout_destroy(l);
}

static void expect_generate_error(int world, int ep, int experts, const char *why)
{
    hx_layout *l = NULL;
    assert_int_equal(hx_layout_generate(world, ep, experts, HX_ORDER_EP_DP, HX_ROOTS_FIRST, &l),
                     SELDP_ERR_INVALID_ARGUMENT);
    assert_null(l);
    if (!strstr(hx_last_error(), why))
        fail_msg("message '%s' lacks '%s'", hx_last_error(), why);
}

static void test_generate_errors(void **state)
{
    (void)state;
    expect_generate_error(8, 3, 6, "--ep 3: must be >= 1 and divide --world 8");
    expect_generate_error(8, 0, 8, "--ep 0");
    expect_generate_error(8, 4, 6, "--experts 6: must be a positive multiple of --ep 4");
}

static void test_file_hot_expert(void **state)
{
    (void)state;
    hx_layout *l = NULL;
    if (hx_layout_load(hx_test_layout("hot-expert.json"), 0, 0, HX_ROOTS_FIRST, &l) != SELDP_OK)
        fail_msg("%s", hx_last_error());
    assert_int_equal(l->world, 4);
    assert_int_equal(l->experts, 4);
    assert_int_equal(l->shared.root, 1);
    EXPECT_GROUP(&l->owners[0], 0, 1, 2, 3);
    assert_int_equal(hx_layout_owners_in(l, 0, 0, NULL), 2);
    assert_int_equal(hx_layout_owners_in(l, 0, 1, NULL), 2);
    /* experts 2 and 3 share owners but not roots: separate groups; 4 groups in all */
    assert_int_equal(l->n_data, 4);
    assert_int_equal(l->owners[1].root, 2);
    assert_int_equal(l->owners[2].root, 1);
    assert_int_equal(l->owners[3].root, 3);
    assert_int_not_equal(l->data_of[2], l->data_of[3]);
    hx_layout_destroy(l);
    /* the required world and expert count are enforced */
    assert_int_equal(hx_layout_load(hx_test_layout("hot-expert.json"), 8, 0, HX_ROOTS_FIRST, &l),
                     SELDP_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(hx_last_error(), "a world of 4 ranks but --world is 8"));
    assert_int_equal(hx_layout_load(hx_test_layout("hot-expert.json"), 0, 8, HX_ROOTS_FIRST, &l),
                     SELDP_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(hx_last_error(), "lists 4 experts but the model has 8"));
    /* uneven EP groups */
    if (hx_layout_load(hx_test_layout("uneven.json"), 0, 0, HX_ROOTS_FIRST, &l) != SELDP_OK)
        fail_msg("%s", hx_last_error());
    assert_int_equal(l->world, 5);
    EXPECT_GROUP(&l->ep[1], 3, 4);
    assert_int_equal(hx_layout_owners_in(l, 1, 0, NULL), 3);
    hx_layout_destroy(l);
}

static void expect_file_error(const char *text, const char *why)
{
    hx_layout *l = NULL;
    seldp_status st = hx_layout_parse(text, strlen(text), "bad.json", 0, 0, HX_ROOTS_FIRST, &l);
    if (st == SELDP_OK) {
        hx_layout_destroy(l);
        fail_msg("accepted: %s", text);
    }
    if (!strstr(hx_last_error(), why) || strncmp(hx_last_error(), "bad.json", 8) != 0)
        fail_msg("%s\nmessage '%s' lacks '%s'", text, hx_last_error(), why);
}

static void test_file_errors(void **state)
{
    (void)state;
    expect_file_error("{\"ep_groups\": [[0, 1]],\n \"experts\": [{\"owners\": [0], \"root\": 1}]}",
                      "bad.json:2:38: experts[0].root: root 1 is not in its group: the owners are "
                      "[0]");
    expect_file_error("{\"ep_groups\": [[0, 1], [1, 2]], \"experts\": [{\"owners\": [0, 1]}]}",
                      "rank 1 is already in ep_groups[0]");
    expect_file_error("{\"world\": 4, \"ep_groups\": [[0, 1], [2]], \"experts\": [{\"owners\": "
                      "[0, 2]}]}",
                      "rank 3 is in no expert-parallel group");
    expect_file_error("{\"ep_groups\": [[0, 1], [2, 3]], \"experts\": [{\"owners\": [0, 2]}, "
                      "{\"owners\": [1]}]}",
                      "expert 1 (owners [1]) has no owner in expert-parallel group 1 [2,3]");
    expect_file_error("{\"ep_groups\": [[0, 1]], \"experts\": [{\"owners\": [0, 5]}]}",
                      "bad.json:1:52: experts[0].owners: rank 5 is outside the world (0..1)");
    expect_file_error("{\"ep_groups\": [[0, 1]], \"experts\": [{\"owners\": [1, 1]}]}",
                      "rank 1 is listed twice");
    expect_file_error("{\"ep_groups\": [[0, 1]], \"experts\": [{\"owners\": []}]}",
                      "experts[0].owners: is empty");
    expect_file_error("{\"ep_groups\": [[0, 1]], \"experts\": [{}]}", "missing \"owners\"");
    expect_file_error("{\"ep_groups\": [[0, 1]], \"experts\": [{\"owners\": [0, 1], \"rot\": 0}]}",
                      "unknown member \"rot\" (allowed: owners, root)");
    expect_file_error("{\"ep_groups\": [[0, 1]], \"experts\": [{\"owners\": [0, 1]}], "
                      "\"shared_root\": 2}",
                      "shared_root: rank 2 is outside the world");
    expect_file_error("{\"ep_groups\": [[0, 1]], \"expert\": []}", "unknown member \"expert\"");
    expect_file_error("{\"ep_groups\": [[0, 1]]}", "missing \"experts\"");
    expect_file_error("{\"ep_groups\": [[0, 1.5]], \"experts\": [{\"owners\": [0]}]}",
                      "expected a rank (an integer)");
    expect_file_error("{\"ep_groups\": [[0, 1]],\n  \"experts\": [{\"owners\": [0, 1]},]}",
                      "bad.json:2:34: trailing comma");
    expect_file_error("[]", "expected an object");
}

static void test_json_round_trip(void **state)
{
    (void)state;
    hx_layout *a = NULL, *b = NULL;
    assert_int_equal(hx_layout_load(hx_test_layout("uneven.json"), 0, 0, HX_ROOTS_LAST, &a), 0);
    hx_buf text = {0};
    hx_layout_json(a, &text);
    if (hx_layout_parse(text.data, text.len, "round trip", 0, 0, HX_ROOTS_FIRST, &b) != SELDP_OK)
        fail_msg("%s\n%s", hx_last_error(), text.data);
    assert_int_equal(a->world, b->world);
    assert_int_equal(a->n_ep, b->n_ep);
    assert_int_equal(a->n_data, b->n_data);
    assert_int_equal(a->shared.root, b->shared.root);
    for (int g = 0; g < a->n_ep; g++)
        expect_group(&b->ep[g], a->ep[g].size, a->ep[g].ranks);
    for (int e = 0; e < a->experts; e++) {
        expect_group(&b->owners[e], a->owners[e].size, a->owners[e].ranks);
        assert_int_equal(a->owners[e].root, b->owners[e].root);
    }
    hx_buf_free(&text);
    hx_layout_destroy(a);
    hx_layout_destroy(b);
}

/* Every rank splits the world of the ep-dp layout and checks its EP communicator (the replica
 * sets' communicators are test_sets.c's). */
static int split_rank(tr_rank_ctx *ctx)
{
    const hx_layout *l = ctx->arg;
    hx_rank_comms c = {0};
    RANK_CHECK_OK(ctx, hx_layout_split(l, ctx->world, &c));
    int r = ctx->rank;
    int ok = seldp_comm_size(c.ep) == 4 && seldp_comm_rank(c.ep) == r % 4;
    hx_rank_comms_destroy(&c);
    RANK_CHECK(ctx, ok, "rank %d: communicators do not match the layout", r);
    return 0;
}

static void test_split(void **state)
{
    (void)state;
    hx_layout *l = NULL;
    assert_int_equal(hx_layout_generate(8, 4, 8, HX_ORDER_EP_DP, HX_ROOTS_FIRST, &l), SELDP_OK);
    tr_run_ranks(8, 30.0, split_rank, l);
    hx_layout_destroy(l);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ep_dp_world8_ep4), cmocka_unit_test(test_dp_ep_world8_ep4),
        cmocka_unit_test(test_edges_and_roots),  cmocka_unit_test(test_generate_errors),
        cmocka_unit_test(test_file_hot_expert),  cmocka_unit_test(test_file_errors),
        cmocka_unit_test(test_json_round_trip),  cmocka_unit_test(test_split),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
