/* Every combination a framework rejects is rejected with the framework's reason, naming
 * the sizes, and leaves the output untouched. */
#include "layout_expect.h"

typedef struct reject_case {
    seldp_framework framework;
    int world, tp, pp, cp, ep, etp, experts;
    const char *order;
    const char *reason; /* a part of the message */
} reject_case;

static const reject_case cases[] = {
    /* Megatron-Core initialize_model_parallel / RankGenerator / arguments */
    {SELDP_FRAMEWORK_MEGATRON, 10, 4, 1, 1, 1, 0, 0, NULL, "world_size (10) is not divisible by 4"},
    {SELDP_FRAMEWORK_MEGATRON, 8, 1, 1, 1, 3, 0, 0, NULL,
     "world_size (8) is not divisible by expert_tensor_model_pipeline_parallel size (3)"},
    {SELDP_FRAMEWORK_MEGATRON, 8, 1, 1, 1, 2, 0, 0, "tp-dp-pp",
     "The size of (ep) is (2), but you haven't specified the order (tp-dp-pp)."},
    {SELDP_FRAMEWORK_MEGATRON, 8, 2, 1, 1, 1, 0, 0, "dp-pp",
     "The size of (tp) is (2), but you haven't specified the order (dp-pp)."},
    {SELDP_FRAMEWORK_MEGATRON, 16, 1, 2, 1, 2, 0, 0, "tp-pp-ep-dp",
     "When not using pp-last rank ordering, the data parallel size of the attention and moe "
     "layers must be the same"},
    {SELDP_FRAMEWORK_MEGATRON, 8, 1, 1, 1, 2, 0, 0, "tp-xp-dp",
     "'xp' is not one of Megatron's tokens"},
    {SELDP_FRAMEWORK_MEGATRON, 8, 1, 1, 1, 2, 0, 0, "tp-dp-tp", "'tp' appears twice"},
    {SELDP_FRAMEWORK_MEGATRON, 8, 1, 1, 1, 4, 0, 6, NULL,
     "Number of experts should be a multiple of expert model parallel_size. (experts 6, ep 4)"},
    /* Megatron-Core 0.9 */
    {SELDP_FRAMEWORK_MEGATRON_0_9, 8, 2, 1, 1, 3, 0, 0, NULL,
     "data_parallel_size (4) is not divisible by expert_model_parallel_size (3)"},
    {SELDP_FRAMEWORK_MEGATRON_0_9, 8, 1, 1, 1, 2, 0, 0, "tp-ep-cp-dp-pp",
     "The ep and dp must be adjacent in order (tp-ep-cp-dp-pp)."},
    {SELDP_FRAMEWORK_MEGATRON_0_9, 8, 2, 1, 1, 2, 1, 0, NULL,
     "Megatron-Core 0.9 has no expert_tensor_parallel_size"},
    {SELDP_FRAMEWORK_MEGATRON_0_9, 12, 5, 1, 1, 1, 0, 0, NULL,
     "world_size (12) is not divisible by 5"},
    /* DeepSpeed */
    {SELDP_FRAMEWORK_DEEPSPEED, 8, 1, 1, 2, 1, 0, 0, NULL, "have no context parallelism"},
    {SELDP_FRAMEWORK_DEEPSPEED, 8, 2, 1, 1, 2, 1, 0, "dp-ep", NULL}, /* accepted: a control */
    {SELDP_FRAMEWORK_DEEPSPEED, 12, 2, 2, 1, 4, 1, 0, NULL, "6 is not divisible by 4"},
    {SELDP_FRAMEWORK_DEEPSPEED, 16, 2, 1, 1, 2, 4, 0, NULL,
     "(enable_expert_tensor_parallelism: etp = tp = 2) or not at all (etp 1)"},
    {SELDP_FRAMEWORK_DEEPSPEED, 8, 2, 1, 1, 3, 2, 0, NULL, "4 is not divisible by 3"},
    {SELDP_FRAMEWORK_DEEPSPEED, 12, 1, 1, 1, 8, 0, 0, NULL, "12 is not divisible by 8"},
    {SELDP_FRAMEWORK_DEEPSPEED, 12, 5, 1, 1, 1, 0, 0, NULL, "12 is not divisible by 5"},
    {SELDP_FRAMEWORK_DEEPSPEED, 8, 1, 1, 1, 2, 0, 0, "tp-dp", "DeepSpeed's orders are ep-dp"},
    {SELDP_FRAMEWORK_DEEPSPEED, 8, 1, 1, 1, 4, 0, 6, NULL,
     "num_experts must be divisible by ep_size"},
    /* torchtitan ParallelDims._validate */
    {SELDP_FRAMEWORK_TORCHTITAN, 8, 3, 1, 1, 1, 0, 0, NULL,
     "Invalid parallel dims: dp_replicate(1) * dp_shard(2) * cp(1) * tp(3) * pp(1) != "
     "WORLD_SIZE(8)"},
    {SELDP_FRAMEWORK_TORCHTITAN, 16, 4, 1, 1, 2, 2, 0, NULL,
     "Currently we only support ETP=TP or ETP=1"},
    {SELDP_FRAMEWORK_TORCHTITAN, 8, 1, 1, 1, 3, 0, 0, NULL,
     "ep % 1 == 0 and (dp_shard * 1) % ep == 0 fail with dp_shard 8"},
    {SELDP_FRAMEWORK_TORCHTITAN, 8, 2, 1, 1, 2, 2, 0, NULL, NULL}, /* accepted: a control */
    {SELDP_FRAMEWORK_TORCHTITAN, 8, 1, 1, 4, 2, 0, 0, NULL,
     "ep must borrow all of cp and part of dp_shard: ep % 4 == 0"},
    {SELDP_FRAMEWORK_TORCHTITAN, 8, 2, 1, 2, 2, 1, 0, NULL,
     "ep must borrow all of cp and tp and part of dp_shard: ep % 4 == 0"},
    {SELDP_FRAMEWORK_TORCHTITAN, 8, 1, 1, 1, 2, 0, 0, "ep-dp", "torchtitan has no order"},
    /* every framework */
    {SELDP_FRAMEWORK_MEGATRON, 8, 0, 1, 1, 1, 0, 0, NULL, "tp 0: expected an integer in 1.."},
    {SELDP_FRAMEWORK_DEEPSPEED, 0, 1, 1, 1, 1, 0, 0, NULL, "world 0: expected an integer in 1.."},
    {SELDP_FRAMEWORK_TORCHTITAN, 8, 1, 1, 1, 1, -1, 0, NULL, "etp -1: expected an integer in 0.."},
};

static void framework_reasons(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const reject_case *c = &cases[i];
        seldp_layout_config cfg = {sizeof(seldp_layout_config),
                                   c->framework,
                                   c->world,
                                   c->tp,
                                   c->pp,
                                   c->cp,
                                   c->ep,
                                   c->etp,
                                   c->experts,
                                   c->order};
        seldp_layout *sentinel = (seldp_layout *)&cfg, *l = sentinel;
        seldp_status st = seldp_layout_create(&cfg, &l);
        if (!c->reason) {
            if (st != SELDP_OK)
                fail_msg("case %zu: rejected: %s", i, seldp_last_error());
            seldp_layout_destroy(l);
            continue;
        }
        if (st != SELDP_ERR_INVALID_ARGUMENT)
            fail_msg("case %zu (%s, world %d, tp %d, pp %d, cp %d, ep %d, etp %d): %s, expected "
                     "SELDP_ERR_INVALID_ARGUMENT with \"%s\"",
                     i, seldp_framework_name(c->framework), c->world, c->tp, c->pp, c->cp, c->ep,
                     c->etp, seldp_status_name(st), c->reason);
        const char *msg = seldp_last_error();
        if (!strstr(msg, c->reason))
            fail_msg("case %zu: message \"%s\" lacks \"%s\"", i, msg, c->reason);
        /* the message names the framework and the world */
        if (!strstr(msg, seldp_framework_name(c->framework)) || !strstr(msg, "world"))
            fail_msg("case %zu: message \"%s\" does not name the framework and sizes", i, msg);
        assert_ptr_equal(l, sentinel);
    }
}

static void names_round_trip(void **state)
{
    (void)state;
    for (int f = 0; f < SELDP_FRAMEWORKS; f++) {
        seldp_framework got = SELDP_FRAMEWORK_MEGATRON;
        assert_int_equal(seldp_framework_parse(seldp_framework_name((seldp_framework)f), &got),
                         SELDP_OK);
        assert_int_equal(got, f);
    }
    seldp_framework got = SELDP_FRAMEWORK_DEEPSPEED;
    assert_int_equal(seldp_framework_parse("fairseq", &got), SELDP_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(seldp_last_error(), "megatron, megatron-0.9, deepspeed or torchtitan"));
    assert_int_equal(got, SELDP_FRAMEWORK_DEEPSPEED);
    assert_string_equal(seldp_group_kind_name(SELDP_GROUP_EXPERT_DP), "expert_dp");
    assert_string_equal(seldp_group_kind_name((seldp_group_kind)99), "invalid");
}

static void split_args_bad_input(void **state)
{
    (void)state;
    seldp_layout *l = layout_build(SELDP_FRAMEWORK_MEGATRON, 4, 2, 1, 1, 1, 0, 0, NULL);
    int color = 7, key = 7;
    assert_int_equal(seldp_layout_split_args(l, SELDP_GROUP_TP, 4, &color, &key),
                     SELDP_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(seldp_last_error(), "rank 4 is outside the world"));
    assert_int_equal(seldp_layout_split_args(l, (seldp_group_kind)8, 0, &color, &key),
                     SELDP_ERR_INVALID_ARGUMENT);
    assert_int_equal(color, 7);
    assert_int_equal(key, 7);
    assert_int_equal(seldp_layout_group(l, SELDP_GROUP_TP, 2, NULL), 0);
    assert_int_equal(seldp_layout_root(l, SELDP_GROUP_TP, -1), -1);
    assert_int_equal(seldp_layout_root(l, SELDP_GROUP_TP, 1), 2);
    seldp_layout_destroy(l);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(framework_reasons),
        cmocka_unit_test(names_round_trip),
        cmocka_unit_test(split_args_bad_input),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
