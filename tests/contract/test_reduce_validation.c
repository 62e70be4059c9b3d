/* Contract of the reductions' collective validation and agreement (docs/library.md: Reduce and sum,
 * Agreement): a gradient for a frozen parameter, of the wrong shape, dtype or device, a different
 * method, FP32 flag or policy on any one rank: every rank returns the same status and message,
 * nobody blocks, every container is unchanged, and the group stays in step. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "contract.h"

typedef enum method { REDUCE, REDUCE_FP32, SUM, SUM_FP32 } method;

typedef enum defect {
    FROZEN_GRAD,      /* a gradient for frozen.scale */
    WRONG_SHAPE,      /* final_norm.weight gradient of shape [5] */
    WRONG_DTYPE,      /* F32 gradient of the BF16 norm under reduce */
    WRONG_DTYPE_FP32, /* F16 gradient of the BF16 norm under reduce_fp32 */
    WRONG_DEVICE,     /* final_norm.weight gradient on cuda:0 */
    METHOD_DIFFERS,   /* sum among reduce */
    FP32_DIFFERS,     /* reduce_fp32 among reduce */
    SUM_FP32_DIFFERS, /* sum_fp32 among sum */
    POLICY_DIFFERS,   /* zero among error */
    INVALID_POLICY,   /* every rank passes policy 7 */
    NULL_GRADS,       /* no container */
    TWO_FAILURES,     /* frozen on the rank below, shape on the last: the lower wins */
    FIRST_PATH,       /* router shape and final_norm dtype wrong: final_norm is named */
    DISAGREE_FIRST    /* a different method and a local failure on one rank */
} defect;

typedef struct rcase {
    defect defect;
    int bad;
    outcome o;
} rcase;

static method base_method(defect d)
{
    if (d == WRONG_DTYPE_FP32)
        return REDUCE_FP32;
    if (d == SUM_FP32_DIFFERS)
        return SUM;
    return REDUCE;
}

static seldp_status call(method mth, seldp_session *s, seldp_grads *g, int policy, uint64_t *total)
{
    seldp_missing_policy p = (seldp_missing_policy)policy;
    switch (mth) {
    case REDUCE:
        return seldp_session_reduce(s, g, 2, p, total);
    case REDUCE_FP32:
        return seldp_session_reduce_fp32(s, g, 2, p, total);
    case SUM:
        return seldp_session_sum(s, g, true, p, total);
    case SUM_FP32:
        return seldp_session_sum_fp32(s, g, true, p, total);
    }
    return SELDP_ERR_INTERNAL;
}

/* The trainable gradients of the rank, with the defect applied where `bad`. */
static seldp_status put_grads(const rcase *c, int rank, bool bad, test_grads *g)
{
    static const size_t trainable[] = {0, 1, 3, 4};
    seldp_status st = tg_init(g);
    for (size_t j = 0; st == SELDP_OK && j < 4; j++) {
        size_t k = trainable[j];
        seldp_dtype dtype = STD[k].dtype;
        int64_t shape[2] = {STD[k].shape[0], STD[k].shape[1]};
        if (bad && (c->defect == WRONG_SHAPE || c->defect == TWO_FAILURES) && k == 1)
            shape[0] = 5;
        if (bad && c->defect == FIRST_PATH && k == 4)
            shape[1] = 3;
        if (bad && c->defect == FIRST_PATH && k == 1)
            dtype = SELDP_BF16;
        if (bad && c->defect == WRONG_DTYPE && k == 3)
            dtype = SELDP_F32;
        if (bad && c->defect == WRONG_DTYPE_FP32 && k == 3)
            dtype = SELDP_F16;
        if (bad && c->defect == WRONG_DEVICE && k == 1) {
            /* a descriptor naming another device, over host bytes that are never read */
            static float bytes[MAX_RANKS][4];
            seldp_tensor t = seldp_tensor_view(SELDP_F32, (seldp_device){SELDP_DEVICE_CUDA, 0},
                                               bytes[rank], 1, SHAPE(4));
            st = seldp_grads_put(g->grads, std_id(rank, k), &t, SELDP_BORROWED);
            continue;
        }
        st = tg_put(g, std_id(rank, k), dtype, rank % 2, std_grad_seed(rank, k), STD[k].ndim, shape,
                    NULL);
    }
    if (st == SELDP_OK && rank == c->bad - 1 && c->defect == TWO_FAILURES)
        st = tg_put(g, std_id(rank, 2), SELDP_F32, false, 1, 1, SHAPE(3), NULL);
    if (st == SELDP_OK && bad && (c->defect == FROZEN_GRAD || c->defect == DISAGREE_FIRST))
        st = tg_put(g, std_id(rank, 2), SELDP_F32, false, 1, 1, SHAPE(3), NULL);
    /* an unselected gradient beside them */
    if (st == SELDP_OK)
        st = tg_put(g, 12345, SELDP_F32, true, 2, 1, SHAPE(3), NULL);
    return st;
}

static int rank_reduce_validation(tr_rank_ctx *ctx)
{
    rcase *c = ctx->arg;
    bool bad = ctx->rank == c->bad;
    test_model m;
    test_grads g;
    grads_snapshot before;
    seldp_session *s = NULL;
    method mth = base_method(c->defect);
    int policy = SELDP_MISSING_ERROR;
    uint64_t total = 0;
    seldp_status st;
    seldp_comm_stats s0, s1;
    char why[256];

    RANK_CHECK_OK(ctx, std_session(ctx->world, &m, NULL, &s));
    RANK_CHECK_OK(ctx, put_grads(c, ctx->rank, bad, &g));
    if (bad && (c->defect == METHOD_DIFFERS || c->defect == DISAGREE_FIRST))
        mth = SUM;
    if (bad && c->defect == FP32_DIFFERS)
        mth = REDUCE_FP32;
    if (bad && c->defect == SUM_FP32_DIFFERS)
        mth = SUM_FP32;
    if (bad && c->defect == POLICY_DIFFERS)
        policy = SELDP_MISSING_ZERO;
    if (c->defect == INVALID_POLICY)
        policy = 7;
    gs_take(&before, g.grads);
    s0 = seldp_comm_get_stats(ctx->world);
    st = call(mth, s, bad && c->defect == NULL_GRADS ? NULL : g.grads, policy, &total);
    s1 = seldp_comm_get_stats(ctx->world);
    outcome_record(&c->o, ctx->rank, st);
    c->o.unchanged[ctx->rank] = gs_same(&before, g.grads, c->o.why[ctx->rank], sizeof c->o.why[0]);
    RANK_CHECK(ctx, stats_moves(s1) == stats_moves(s0), "gradients moved before validation passed");
    gs_free(&before);
    tg_free(&g);

    /* still in step: a correct reduction right after succeeds on every rank */
    {
        rcase fine;
        bool all[MAX_RANKS] = {true, true, true, true};
        double ref[8];
        memset(&fine, 0, sizeof fine);
        fine.bad = -1;
        RANK_CHECK_OK(ctx, put_grads(&fine, ctx->rank, false, &g));
        RANK_CHECK_OK(ctx, seldp_session_reduce(s, g.grads, 2, SELDP_MISSING_ERROR, &total));
        std_reference(1, SELDP_F32, ctx->size, all, 2.0 * ctx->size, ref);
        RANK_CHECK(ctx,
                   close_to(SELDP_F32, seldp_grads_get(g.grads, std_id(ctx->rank, 1))->data, ref, 4,
                            2e-6, why, sizeof why),
                   "reduction after the failure: %s", why);
        tg_free(&g);
    }
    seldp_session_destroy(s);
    ct_free(&m);
    return 0;
}

static void run_defect(defect d, seldp_status expected, const char *needle, bool name_bad)
{
    for (int n = 1; n <= 4; n++) {
        rcase c;
        char who[32];
        bool needs_two = d == METHOD_DIFFERS || d == FP32_DIFFERS || d == SUM_FP32_DIFFERS ||
                         d == POLICY_DIFFERS || d == DISAGREE_FIRST;
        if (needs_two && n == 1)
            continue;
        memset(&c, 0, sizeof c);
        c.defect = d;
        c.bad = n - 1;
        tr_run_ranks(n, TEST_TIMEOUT_S, rank_reduce_validation, &c);
        snprintf(who, sizeof who, "group rank %d", c.bad);
        expect_same_failure(&c.o, n, expected, needle, name_bad ? who : NULL);
    }
}

static void gradient_of_frozen_parameter(void **state)
{
    (void)state;
    run_defect(FROZEN_GRAD, SELDP_ERR_FROZEN, "'frozen.scale'", true);
}

static void gradient_of_wrong_shape(void **state)
{
    (void)state;
    run_defect(WRONG_SHAPE, SELDP_ERR_SHAPE, "shape [5]", true);
}

static void gradient_of_wrong_dtype(void **state)
{
    (void)state;
    run_defect(WRONG_DTYPE, SELDP_ERR_DTYPE, "'layers.0.norm.weight'", true);
    run_defect(WRONG_DTYPE_FP32, SELDP_ERR_DTYPE, "'layers.0.norm.weight'", true);
}

static void gradient_on_another_device(void **state)
{
    (void)state;
    run_defect(WRONG_DEVICE, SELDP_ERR_DEVICE, "'final_norm.weight'", true);
}

static void method_disagreement(void **state)
{
    (void)state;
    run_defect(METHOD_DIFFERS, SELDP_ERR_DISAGREE, "seldp_session_sum", true);
    run_defect(FP32_DIFFERS, SELDP_ERR_DISAGREE, "seldp_session_reduce_fp32", true);
    run_defect(SUM_FP32_DIFFERS, SELDP_ERR_DISAGREE, "seldp_session_sum_fp32", true);
}

static void policy_disagreement(void **state)
{
    (void)state;
    run_defect(POLICY_DIFFERS, SELDP_ERR_DISAGREE, "policy zero", true);
    run_defect(INVALID_POLICY, SELDP_ERR_INVALID_ARGUMENT, "policy 7", false);
}

static void missing_container(void **state)
{
    (void)state;
    run_defect(NULL_GRADS, SELDP_ERR_INVALID_ARGUMENT, "grads", true);
}

static void lowest_failing_rank_wins(void **state)
{
    (void)state;
    for (int n = 2; n <= 4; n++) {
        rcase c;
        char who[32];
        memset(&c, 0, sizeof c);
        c.defect = TWO_FAILURES;
        c.bad = n - 1;
        tr_run_ranks(n, TEST_TIMEOUT_S, rank_reduce_validation, &c);
        snprintf(who, sizeof who, "group rank %d", n - 2);
        expect_same_failure(&c.o, n, SELDP_ERR_FROZEN, "'frozen.scale'", who);
    }
}

static void first_offending_path_is_named(void **state)
{
    (void)state;
    run_defect(FIRST_PATH, SELDP_ERR_DTYPE, "'final_norm.weight'", true);
}

static void disagreement_outranks_local_failures(void **state)
{
    (void)state;
    run_defect(DISAGREE_FIRST, SELDP_ERR_DISAGREE, "called seldp_session_sum", true);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(gradient_of_frozen_parameter),
        cmocka_unit_test(gradient_of_wrong_shape),
        cmocka_unit_test(gradient_of_wrong_dtype),
        cmocka_unit_test(gradient_on_another_device),
        cmocka_unit_test(method_disagreement),
        cmocka_unit_test(policy_disagreement),
        cmocka_unit_test(missing_container),
        cmocka_unit_test(lowest_failing_rank_wins),
        cmocka_unit_test(first_offending_path_is_named),
        cmocka_unit_test(disagreement_outranks_local_failures),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
