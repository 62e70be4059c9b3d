/* The layout module against the group lists the frameworks print in their own
 * documentation and docstrings, rank for rank:
 *   Megatron-LM megatron/core/parallel_state.py: initialize_model_parallel's docstring
 *     (16 GPUs, tp 2, pp 4), its context_parallel_size paragraph (8 GPUs, tp 4, cp 2) and
 *     generate_masked_orthogonal_rank_groups' docstring (tp-pp-dp 2-2-2; tp-dp-pp 2-3-4);
 *   DeepSpeed deepspeed/utils/groups.py: the E + D example of _create_expert_and_data_parallel,
 *     the E + M + D example of _get_expert_parallel_ranks and its data-before-expert comment;
 *   torchtitan parallel_dims.py: the meshes build_mesh lists (worked here by hand from the
 *     mesh order pp, dp_shard, [ep,] cp, tp, slowest first).
 * Groups the documents do not print (expert groups of Megatron's examples) are worked by
 * hand from the same rank formula and say so. */
#include "layout_expect.h"

static void megatron_docstring_tp2_pp4(void **state)
{
    (void)state;
    seldp_layout *l = layout_build(SELDP_FRAMEWORK_MEGATRON, 16, 2, 4, 1, 1, 0, 0, NULL);
    EXPECT_GROUPS(l, SELDP_GROUP_DP, 8, 2, 0, 2, 1, 3, 4, 6, 5, 7, 8, 10, 9, 11, 12, 14, 13, 15);
    EXPECT_GROUPS(l, SELDP_GROUP_TP, 8, 2, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    EXPECT_GROUPS(l, SELDP_GROUP_PP, 4, 4, 0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    /* default_embedding_ranks: the first and last stage of each pipeline group */
    EXPECT_GROUPS(l, SELDP_GROUP_EMBEDDING, 4, 2, 0, 12, 1, 13, 2, 14, 3, 15);
    /* no context parallelism: each rank alone */
    EXPECT_GROUPS(l, SELDP_GROUP_CP, 16, 1, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    assert_int_equal(seldp_layout_dp(l), 2);
    assert_int_equal(seldp_layout_stage(l, 13), 3);
    assert_int_equal(seldp_layout_stage(l, 6), 1);
    assert_int_equal(seldp_layout_group_of(l, SELDP_GROUP_EMBEDDING, 6), -1);
    seldp_layout_config c = seldp_layout_get_config(l);
    assert_string_equal(c.order, "tp-cp-ep-dp-pp");
    assert_int_equal(c.etp, 2); /* expert_tensor_parallel_size defaults to tp */
    seldp_layout_destroy(l);
}

static void megatron_docstring_context_parallel(void **state)
{
    (void)state;
    seldp_layout *l = layout_build(SELDP_FRAMEWORK_MEGATRON, 8, 4, 1, 2, 1, 0, 0, NULL);
    EXPECT_GROUPS(l, SELDP_GROUP_CP, 4, 2, 0, 4, 1, 5, 2, 6, 3, 7);
    EXPECT_GROUPS(l, SELDP_GROUP_TP, 2, 4, 0, 1, 2, 3, 4, 5, 6, 7);
    /* dp 1: the dense reduce group (dp-cp) is the context group */
    EXPECT_GROUPS(l, SELDP_GROUP_DP, 4, 2, 0, 4, 1, 5, 2, 6, 3, 7);
    seldp_layout_destroy(l);
}

static void megatron_docstring_masked_orders(void **state)
{
    (void)state;
    /* "if the gpu size is 8 and order is 'tp-pp-dp', size is '2-2-2', and the dp_group here
     * is [[0, 4], [1, 5], [2, 6], [3, 7]]" */
    seldp_layout *l = layout_build(SELDP_FRAMEWORK_MEGATRON, 8, 2, 2, 1, 1, 0, 0, "tp-pp-dp");
    EXPECT_GROUPS(l, SELDP_GROUP_DP, 4, 2, 0, 4, 1, 5, 2, 6, 3, 7);
    EXPECT_GROUPS(l, SELDP_GROUP_PP, 4, 2, 0, 2, 1, 3, 4, 6, 5, 7);
    seldp_layout_destroy(l);
    /* parallel_size [tp, dp, pp] = [2, 3, 4]: dp_group[0] = [0, 2, 4] ... [19, 21, 23] */
    l = layout_build(SELDP_FRAMEWORK_MEGATRON, 24, 2, 4, 1, 1, 0, 0, "tp-dp-pp");
    EXPECT_GROUPS(l, SELDP_GROUP_DP, 8, 3, 0, 2, 4, 1, 3, 5, 6, 8, 10, 7, 9, 11, 12, 14, 16, 13, 15,
                  17, 18, 20, 22, 19, 21, 23);
    seldp_layout_destroy(l);
}

static void megatron_expert_grid(void **state)
{
    (void)state;
    /* By hand from the expert grid tp-cp-ep-dp-pp over (etp 2, ep 2, edp 2, pp 2):
     * rank = etp_rank + 2 ep_rank + 4 edp_rank + 8 stage */
    seldp_layout *l = layout_build(SELDP_FRAMEWORK_MEGATRON, 16, 2, 2, 1, 2, 0, 8, NULL);
    EXPECT_GROUPS(l, SELDP_GROUP_EP, 8, 2, 0, 2, 1, 3, 4, 6, 5, 7, 8, 10, 9, 11, 12, 14, 13, 15);
    EXPECT_GROUPS(l, SELDP_GROUP_EXPERT_DP, 8, 2, 0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11,
                  15);
    EXPECT_GROUPS(l, SELDP_GROUP_EXPERT_TP, 8, 2, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14,
                  15);
    /* the dense grid (tp 2, dp 4, pp 2): dp-cp strided by tp inside a stage */
    EXPECT_GROUPS(l, SELDP_GROUP_DP, 4, 4, 0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15);
    EXPECT_GROUPS(l, SELDP_GROUP_PP, 8, 2, 0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15);
    /* EP position 1 (ranks 2, 3, 6, 7, ...) owns experts 4..7 in every shard */
    int first = -1;
    assert_int_equal(seldp_layout_local_experts(l, 3, &first), 4);
    assert_int_equal(first, 4);
    assert_int_equal(seldp_layout_local_experts(l, 12, &first), 4);
    assert_int_equal(first, 0);
    seldp_layout_destroy(l);
    /* etp 1 under tp 2: the expert grid (1, 4, 2, 2): EP spans the TP ranks */
    l = layout_build(SELDP_FRAMEWORK_MEGATRON, 16, 2, 2, 1, 4, 1, 8, NULL);
    EXPECT_GROUPS(l, SELDP_GROUP_EP, 4, 4, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    EXPECT_GROUPS(l, SELDP_GROUP_EXPERT_DP, 8, 2, 0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11,
                  15);
    EXPECT_GROUPS(l, SELDP_GROUP_EXPERT_TP, 16, 1, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14,
                  15);
    seldp_layout_destroy(l);
}

static void megatron_0_9_expert_from_data(void **state)
{
    (void)state;
    /* By hand from core_r0.9.0's RankGenerator(independent_ep=True): tp-cp-ep-dp-pp with dp 4
     * split into (ep 2, dp/ep 2): rank = tp_rank + 2 ep_rank + 4 dpm_rank + 8 stage */
    seldp_layout *l = layout_build(SELDP_FRAMEWORK_MEGATRON_0_9, 16, 2, 2, 1, 2, 0, 8, NULL);
    EXPECT_GROUPS(l, SELDP_GROUP_EP, 8, 2, 0, 2, 1, 3, 4, 6, 5, 7, 8, 10, 9, 11, 12, 14, 13, 15);
    EXPECT_GROUPS(l, SELDP_GROUP_EXPERT_DP, 8, 2, 0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11,
                  15);
    EXPECT_GROUPS(l, SELDP_GROUP_EXPERT_TP, 8, 2, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14,
                  15);
    EXPECT_GROUPS(l, SELDP_GROUP_DP, 4, 4, 0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15);
    seldp_layout_destroy(l);
    /* dp-ep: the data-modulo-expert rank varies fastest, EP strided */
    l = layout_build(SELDP_FRAMEWORK_MEGATRON_0_9, 8, 1, 1, 1, 2, 0, 4, "tp-cp-dp-ep-pp");
    EXPECT_GROUPS(l, SELDP_GROUP_EP, 4, 2, 0, 4, 1, 5, 2, 6, 3, 7);
    EXPECT_GROUPS(l, SELDP_GROUP_EXPERT_DP, 2, 4, 0, 1, 2, 3, 4, 5, 6, 7);
    seldp_layout_destroy(l);
    /* with context parallelism the expert gradients reduce over data-modulo-expert x cp */
    l = layout_build(SELDP_FRAMEWORK_MEGATRON_0_9, 8, 1, 1, 2, 2, 0, 4, NULL);
    /* rank = cp_rank + 2 ep_rank + 4 dpm_rank */
    EXPECT_GROUPS(l, SELDP_GROUP_EP, 4, 2, 0, 2, 1, 3, 4, 6, 5, 7);
    EXPECT_GROUPS(l, SELDP_GROUP_EXPERT_DP, 2, 4, 0, 1, 4, 5, 2, 3, 6, 7);
    EXPECT_GROUPS(l, SELDP_GROUP_DP, 1, 8, 0, 1, 2, 3, 4, 5, 6, 7);
    seldp_layout_destroy(l);
}

static void deepspeed_e_plus_d(void **state)
{
    (void)state;
    /* _create_expert_and_data_parallel: world_size = 16, expert_parallel_size = 2 */
    seldp_layout *l = layout_build(SELDP_FRAMEWORK_DEEPSPEED, 16, 1, 1, 1, 2, 0, 4, NULL);
    EXPECT_GROUPS(l, SELDP_GROUP_EXPERT_DP, 2, 8, 0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13,
                  15);
    EXPECT_GROUPS(l, SELDP_GROUP_EP, 8, 2, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    EXPECT_GROUPS(l, SELDP_GROUP_DP, 1, 16, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    seldp_layout_destroy(l);
    /* the same with use_data_before_expert_parallel_: ep_stride = 8 */
    l = layout_build(SELDP_FRAMEWORK_DEEPSPEED, 16, 1, 1, 1, 2, 0, 4, "dp-ep");
    EXPECT_GROUPS(l, SELDP_GROUP_EXPERT_DP, 2, 8, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14,
                  15);
    EXPECT_GROUPS(l, SELDP_GROUP_EP, 8, 2, 0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15);
    seldp_layout_destroy(l);
}

static void deepspeed_e_plus_m_plus_d(void **state)
{
    (void)state;
    /* _get_expert_parallel_ranks: world_size = 16, model_degree = 2, expert_degree = 4 */
    seldp_layout *l = layout_build(SELDP_FRAMEWORK_DEEPSPEED, 16, 2, 1, 1, 4, 2, 8, NULL);
    EXPECT_GROUPS(l, SELDP_GROUP_TP, 8, 2, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    EXPECT_GROUPS(l, SELDP_GROUP_DP, 2, 8, 0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
    EXPECT_GROUPS(l, SELDP_GROUP_EP, 4, 4, 0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15);
    EXPECT_GROUPS(l, SELDP_GROUP_EXPERT_DP, 8, 2, 0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7,
                  15);
    EXPECT_GROUPS(l, SELDP_GROUP_EXPERT_TP, 8, 2, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14,
                  15);
    seldp_layout_destroy(l);
}

static void deepspeed_tp_without_expert_tp(void **state)
{
    (void)state;
    /* enable_expert_tensor_parallelism off under mp_size 2: MoE._create_process_groups takes
     * _create_expert_and_data_parallel, whose EP groups are consecutive ranks across the TP
     * pairs (worked by hand from its loops) */
    seldp_layout *l = layout_build(SELDP_FRAMEWORK_DEEPSPEED, 8, 2, 1, 1, 2, 0, 4, NULL);
    EXPECT_GROUPS(l, SELDP_GROUP_EP, 4, 2, 0, 1, 2, 3, 4, 5, 6, 7);
    EXPECT_GROUPS(l, SELDP_GROUP_EXPERT_DP, 2, 4, 0, 2, 4, 6, 1, 3, 5, 7);
    EXPECT_GROUPS(l, SELDP_GROUP_EXPERT_TP, 8, 1, 0, 1, 2, 3, 4, 5, 6, 7);
    EXPECT_GROUPS(l, SELDP_GROUP_DP, 2, 4, 0, 2, 4, 6, 1, 3, 5, 7);
    seldp_layout_destroy(l);
    l = layout_build(SELDP_FRAMEWORK_DEEPSPEED, 8, 2, 1, 1, 2, 1, 4, "dp-ep");
    EXPECT_GROUPS(l, SELDP_GROUP_EP, 4, 2, 0, 4, 1, 5, 2, 6, 3, 7);
    EXPECT_GROUPS(l, SELDP_GROUP_EXPERT_DP, 2, 4, 0, 1, 2, 3, 4, 5, 6, 7);
    seldp_layout_destroy(l);
}

static void deepspeed_data_before_expert_32(void **state)
{
    (void)state;
    /* the comment in _get_expert_parallel_ranks' data-before-expert branch:
     *   [0, 4, 8, 12, 16, 20, 24, 28, 2, 6, 10, 14, 18, 22, 26, 30]
     *   [1, 5, 9, 13, 17, 21, 25, 29, 3, 7, 11, 15, 19, 23, 27, 31]
     * (world 32, tp 2, ep 8), cut into EP groups of 8 and zipped into expert-data groups */
    seldp_layout *l = layout_build(SELDP_FRAMEWORK_DEEPSPEED, 32, 2, 1, 1, 8, 2, 8, "dp-ep");
    EXPECT_GROUPS(l, SELDP_GROUP_EP, 4, 8, 0, 4, 8, 12, 16, 20, 24, 28, 1, 5, 9, 13, 17, 21, 25, 29,
                  2, 6, 10, 14, 18, 22, 26, 30, 3, 7, 11, 15, 19, 23, 27, 31);
    EXPECT_GROUPS(l, SELDP_GROUP_EXPERT_DP, 16, 2, 0, 2, 1, 3, 4, 6, 5, 7, 8, 10, 9, 11, 12, 14, 13,
                  15, 16, 18, 17, 19, 20, 22, 21, 23, 24, 26, 25, 27, 28, 30, 29, 31);
    seldp_layout_destroy(l);
}

static void torchtitan_meshes(void **state)
{
    (void)state;
    /* etp = tp: the EP mesh [dp_shard_in_ep 2, ep 2, tp 2]; rank = tp + 2 ep + 4 efsdp */
    seldp_layout *l = layout_build(SELDP_FRAMEWORK_TORCHTITAN, 8, 2, 1, 1, 2, 2, 4, NULL);
    EXPECT_GROUPS(l, SELDP_GROUP_TP, 4, 2, 0, 1, 2, 3, 4, 5, 6, 7);
    EXPECT_GROUPS(l, SELDP_GROUP_DP, 2, 4, 0, 2, 4, 6, 1, 3, 5, 7);
    EXPECT_GROUPS(l, SELDP_GROUP_EP, 4, 2, 0, 2, 1, 3, 4, 6, 5, 7);
    EXPECT_GROUPS(l, SELDP_GROUP_EXPERT_DP, 4, 2, 0, 4, 1, 5, 2, 6, 3, 7);
    EXPECT_GROUPS(l, SELDP_GROUP_EXPERT_TP, 4, 2, 0, 1, 2, 3, 4, 5, 6, 7);
    seldp_layout_destroy(l);
    /* etp = 1 (the default): EP borrows tp: the EP mesh [dp_shard_in_ep 4, ep 2] */
    l = layout_build(SELDP_FRAMEWORK_TORCHTITAN, 8, 2, 1, 1, 2, 0, 4, NULL);
    EXPECT_GROUPS(l, SELDP_GROUP_EP, 4, 2, 0, 1, 2, 3, 4, 5, 6, 7);
    EXPECT_GROUPS(l, SELDP_GROUP_EXPERT_DP, 2, 4, 0, 2, 4, 6, 1, 3, 5, 7);
    EXPECT_GROUPS(l, SELDP_GROUP_EXPERT_TP, 8, 1, 0, 1, 2, 3, 4, 5, 6, 7);
    seldp_layout_destroy(l);
    /* pp 2, cp 2, ep 2 (etp 1): dense mesh [pp, dp_shard 2, cp 2]: dp_cp is the whole stage;
     * EP mesh [pp, dp_shard_in_ep 2, ep 2] */
    l = layout_build(SELDP_FRAMEWORK_TORCHTITAN, 8, 1, 2, 2, 2, 0, 4, NULL);
    EXPECT_GROUPS(l, SELDP_GROUP_PP, 4, 2, 0, 4, 1, 5, 2, 6, 3, 7);
    EXPECT_GROUPS(l, SELDP_GROUP_CP, 4, 2, 0, 1, 2, 3, 4, 5, 6, 7);
    EXPECT_GROUPS(l, SELDP_GROUP_DP, 2, 4, 0, 1, 2, 3, 4, 5, 6, 7);
    EXPECT_GROUPS(l, SELDP_GROUP_EP, 4, 2, 0, 1, 2, 3, 4, 5, 6, 7);
    EXPECT_GROUPS(l, SELDP_GROUP_EXPERT_DP, 4, 2, 0, 2, 1, 3, 4, 6, 5, 7);
    EXPECT_GROUPS(l, SELDP_GROUP_EMBEDDING, 4, 2, 0, 4, 1, 5, 2, 6, 3, 7);
    seldp_layout_destroy(l);
}

/* At TP = PP = CP = 1 every framework's default is the harness's ep-dp: EP groups
 * consecutive, expert-data groups strided; and dp-ep (Megatron's order, DeepSpeed's
 * data-before-expert) its transpose. */
static void every_framework_agrees_at_tp1(void **state)
{
    (void)state;
    for (int f = 0; f < SELDP_FRAMEWORKS; f++) {
        seldp_layout *l = layout_build((seldp_framework)f, 8, 1, 1, 1, 4, 0, 8, NULL);
        EXPECT_GROUPS(l, SELDP_GROUP_EP, 2, 4, 0, 1, 2, 3, 4, 5, 6, 7);
        EXPECT_GROUPS(l, SELDP_GROUP_EXPERT_DP, 4, 2, 0, 4, 1, 5, 2, 6, 3, 7);
        EXPECT_GROUPS(l, SELDP_GROUP_DP, 1, 8, 0, 1, 2, 3, 4, 5, 6, 7);
        seldp_layout_destroy(l);
    }
    const seldp_framework transposed[] = {SELDP_FRAMEWORK_MEGATRON, SELDP_FRAMEWORK_MEGATRON_0_9,
                                          SELDP_FRAMEWORK_DEEPSPEED};
    for (size_t f = 0; f < 3; f++) {
        seldp_layout *l = layout_build(transposed[f], 8, 1, 1, 1, 4, 0, 8, "dp-ep");
        EXPECT_GROUPS(l, SELDP_GROUP_EP, 2, 4, 0, 2, 4, 6, 1, 3, 5, 7);
        EXPECT_GROUPS(l, SELDP_GROUP_EXPERT_DP, 4, 2, 0, 1, 2, 3, 4, 5, 6, 7);
        seldp_layout_destroy(l);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(megatron_docstring_tp2_pp4),
        cmocka_unit_test(megatron_docstring_context_parallel),
        cmocka_unit_test(megatron_docstring_masked_orders),
        cmocka_unit_test(megatron_expert_grid),
        cmocka_unit_test(megatron_0_9_expert_from_data),
        cmocka_unit_test(deepspeed_e_plus_d),
        cmocka_unit_test(deepspeed_e_plus_m_plus_d),
        cmocka_unit_test(deepspeed_tp_without_expert_tp),
        cmocka_unit_test(deepspeed_data_before_expert_32),
        cmocka_unit_test(torchtitan_meshes),
        cmocka_unit_test(every_framework_agrees_at_tp1),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
