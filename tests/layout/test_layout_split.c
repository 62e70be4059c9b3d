/* The colour/key of seldp_layout_split_args build, through seldp_comm_split on the
 * host-staged transport, exactly the layout's groups: every rank of every kind lands in
 * a communicator of the group's size, at its position, with the group's world ranks. */
#include "layout_expect.h"
#include "ranks.h"

#define TIMEOUT_S 120.0

static int split_every_kind(tr_rank_ctx *ctx)
{
    const seldp_layout *l = ctx->arg;
    int me = ctx->rank;
    for (int k = 0; k < SELDP_GROUP_KINDS; k++) {
        int color = 0, key = 0;
        RANK_CHECK_OK(ctx, seldp_layout_split_args(l, (seldp_group_kind)k, me, &color, &key));
        seldp_comm *sub = NULL;
        RANK_CHECK_OK(ctx, seldp_comm_split(ctx->world, color, key, &sub));
        int g = seldp_layout_group_of(l, (seldp_group_kind)k, me);
        if (g < 0) {
            RANK_CHECK(ctx, color == SELDP_COMM_NO_GROUP && sub == NULL,
                       "%s: rank %d has no group but colour %d", seldp_group_kind_name(k), me,
                       color);
            continue;
        }
        const int *ranks = NULL;
        int size = seldp_layout_group(l, (seldp_group_kind)k, g, &ranks);
        RANK_CHECK(ctx, sub != NULL, "%s: rank %d got no communicator", seldp_group_kind_name(k),
                   me);
        RANK_CHECK(ctx, seldp_comm_size(sub) == size, "%s: size %d, expected %d",
                   seldp_group_kind_name(k), seldp_comm_size(sub), size);
        RANK_CHECK(ctx, ranks[seldp_comm_rank(sub)] == me, "%s: rank %d at group rank %d",
                   seldp_group_kind_name(k), me, seldp_comm_rank(sub));
        int all[64] = {0};
        seldp_status st = seldp_comm_allgather(sub, &me, all, sizeof me, SELDP_HOST_DEVICE);
        seldp_comm_destroy(sub);
        RANK_CHECK(ctx, st == SELDP_OK, "%s: allgather: %s", seldp_group_kind_name(k),
                   seldp_last_error());
        for (int i = 0; i < size; i++)
            RANK_CHECK(ctx, all[i] == ranks[i], "%s: group rank %d is world rank %d, expected %d",
                       seldp_group_kind_name(k), i, all[i], ranks[i]);
    }
    return 0;
}

static void split_layout(seldp_framework f, int world, int tp, int pp, int cp, int ep, int etp,
                         const char *order)
{
    seldp_layout *l = layout_build(f, world, tp, pp, cp, ep, etp, 8, order);
    tr_run_ranks(world, TIMEOUT_S, split_every_kind, l);
    seldp_layout_destroy(l);
}

static void megatron_16(void **state)
{
    (void)state;
    split_layout(SELDP_FRAMEWORK_MEGATRON, 16, 2, 2, 1, 2, 0, NULL);
}

static void megatron_0_9_cp(void **state)
{
    (void)state;
    split_layout(SELDP_FRAMEWORK_MEGATRON_0_9, 16, 2, 1, 2, 2, 0, NULL);
}

static void deepspeed_data_before(void **state)
{
    (void)state;
    split_layout(SELDP_FRAMEWORK_DEEPSPEED, 16, 2, 2, 1, 2, 2, "dp-ep");
}

static void torchtitan_etp1(void **state)
{
    (void)state;
    split_layout(SELDP_FRAMEWORK_TORCHTITAN, 16, 2, 2, 1, 4, 1, NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(megatron_16),
        cmocka_unit_test(megatron_0_9_cp),
        cmocka_unit_test(deepspeed_data_before),
        cmocka_unit_test(torchtitan_etp1),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
