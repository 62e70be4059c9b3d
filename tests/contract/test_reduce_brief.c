/* The agreement's brief exchange (docs/library.md, Agreement): a reduction first all-gathers
 * a brief of each rank's record (its status, weight and first non-finite slot, and digests of
 * the rest), and the records themselves only when the briefs differ or report a failure.
 * Calls whose records agree (weights differing, inactive ranks, a parameter no rank has, a
 * weight overflow) make one agreement all-gather on every rank; a rank lacking a gradient
 * others have and a non-finite input make two, a rank that failed locally three (its message
 * is shared too), and every rank reaches the same outcome either way. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "contract.h"

static const size_t TRAINABLE[] = {0, 1, 3, 4};
#define N_TRAINABLE 4
#define FINAL_NORM  1 /* STD index of final_norm.weight */

typedef struct brief_arg {
    seldp_missing_policy policy;
    bool check_finite;
    bool has[MAX_RANKS];   /* which ranks give a final_norm.weight gradient */
    bool bad[MAX_RANKS];   /* which ranks give it with a wrong shape (a local failure) */
    bool nan[MAX_RANKS];   /* which ranks give it with a NaN */
    uint64_t w[MAX_RANKS]; /* weights */
    uint64_t gathers[MAX_RANKS];
    uint64_t total[MAX_RANKS];
    outcome o;
} brief_arg;

static brief_arg make(seldp_missing_policy policy)
{
    brief_arg a;
    memset(&a, 0, sizeof a);
    a.policy = policy;
    for (int r = 0; r < MAX_RANKS; r++) {
        a.has[r] = true;
        a.w[r] = (uint64_t)(3 * r + 1);
    }
    return a;
}

static int rank_reduce(tr_rank_ctx *ctx)
{
    brief_arg *a = ctx->arg;
    seldp_session_config cfg = SELDP_SESSION_CONFIG_INIT;
    test_model m;
    test_grads g;
    seldp_session *s = NULL;
    void *data = NULL;

    cfg.check_finite = a->check_finite;
    RANK_CHECK_OK(ctx, std_session(ctx->world, &m, &cfg, &s));
    RANK_CHECK_OK(ctx, tg_init(&g));
    for (size_t j = 0; j < N_TRAINABLE; j++) {
        const size_t k = TRAINABLE[j];
        if (k == FINAL_NORM && !a->has[ctx->rank])
            continue;
        if (k == FINAL_NORM && a->bad[ctx->rank]) {
            RANK_CHECK_OK(
                ctx, tg_put(&g, std_id(ctx->rank, k), STD[k].dtype, false, 5, 1, SHAPE(3), NULL));
            continue;
        }
        RANK_CHECK_OK(ctx, std_put_grad(&g, ctx->rank, k, STD[k].dtype, false, &data));
        if (k == FINAL_NORM && a->nan[ctx->rank])
            ct_set(STD[k].dtype, data, 2, NAN);
    }
    const seldp_comm_stats s0 = seldp_comm_get_stats(ctx->world);
    uint64_t total = 0;
    seldp_status st = seldp_session_reduce(s, g.grads, a->w[ctx->rank], a->policy, &total);
    const seldp_comm_stats s1 = seldp_comm_get_stats(ctx->world);
    a->gathers[ctx->rank] = s1.allgathers - s0.allgathers;
    a->total[ctx->rank] = total;
    outcome_record(&a->o, ctx->rank, st);
    a->o.unchanged[ctx->rank] = true;
    if (st == SELDP_OK) {
        const seldp_tensor *t = seldp_grads_get(g.grads, std_id(ctx->rank, FINAL_NORM));
        bool any = false;
        for (int r = 0; r < ctx->size; r++)
            any |= a->has[r] && a->w[r] > 0;
        RANK_CHECK(ctx, (t != NULL) == any, "final_norm.weight %s a result", t ? "has" : "lacks");
        if (t)
            RANK_CHECK(ctx, same_everywhere(ctx->world, t->data, 16), "replicas differ");
    }
    tg_free(&g);
    seldp_session_destroy(s);
    ct_free(&m);
    return 0;
}

/* Run on n ranks: every rank made `gathers` agreement all-gathers. */
static void run(brief_arg *a, int n, uint64_t gathers)
{
    tr_run_ranks(n, TEST_TIMEOUT_S, rank_reduce, a);
    for (int r = 0; r < n; r++)
        if (a->gathers[r] != gathers)
            fail_msg("rank %d of %d made %llu agreement all-gathers, expected %llu", r, n,
                     (unsigned long long)a->gathers[r], (unsigned long long)gathers);
}

static void agreeing_records_take_one_exchange(void **state)
{
    (void)state;
    for (int n = 1; n <= 4; n++) {
        brief_arg a = make(SELDP_MISSING_ERROR);
        run(&a, n, 1);
        uint64_t want = 0;
        for (int r = 0; r < n; r++)
            want += a.w[r];
        for (int r = 0; r < n; r++) {
            assert_int_equal(a.o.st[r], SELDP_OK);
            assert_int_equal(a.total[r], want);
        }
    }
    /* an inactive rank with the same gradients, and a parameter no rank has */
    brief_arg a = make(SELDP_MISSING_ERROR);
    a.w[2] = 0;
    run(&a, 4, 1);
    a = make(SELDP_MISSING_ZERO);
    for (int r = 0; r < MAX_RANKS; r++)
        a.has[r] = false;
    run(&a, 4, 1);
    for (int r = 0; r < 4; r++)
        assert_int_equal(a.o.st[r], SELDP_OK);
}

static void overflow_is_decided_from_the_briefs(void **state)
{
    (void)state;
    brief_arg a = make(SELDP_MISSING_ERROR);
    a.w[1] = UINT64_MAX - 1;
    a.w[3] = 2;
    run(&a, 4, 1);
    expect_same_failure(&a.o, 4, SELDP_ERR_OVERFLOW, "group rank 2", "overflows 64 bits");
}

static void differing_records_are_exchanged(void **state)
{
    (void)state;
    for (int n = 2; n <= 4; n++) {
        /* a rank lacks a gradient: zero-filled under `zero`, named under `error` */
        brief_arg a = make(SELDP_MISSING_ZERO);
        a.has[n - 1] = false;
        run(&a, n, 2);
        for (int r = 0; r < n; r++)
            assert_int_equal(a.o.st[r], SELDP_OK);
        a = make(SELDP_MISSING_ERROR);
        a.has[0] = false;
        run(&a, n, 2);
        expect_same_failure(&a.o, n, SELDP_ERR_MISSING_GRADIENT, "'final_norm.weight'",
                            "no gradient on active group rank 0");
    }
}

static void failures_are_exchanged(void **state)
{
    (void)state;
    brief_arg a = make(SELDP_MISSING_ERROR);
    a.bad[1] = true;
    run(&a, 3, 3); /* the briefs, the records, and the failing rank's message to every rank */
    for (int r = 0; r < 3; r++)
        assert_int_equal(a.o.st[r], a.o.st[0]);
    assert_int_not_equal(a.o.st[0], SELDP_OK);
    assert_string_equal(a.o.msg[0], a.o.msg[2]);
    assert_non_null(strstr(a.o.msg[0], "group rank 1"));

    a = make(SELDP_MISSING_ERROR);
    a.check_finite = true;
    a.nan[2] = true;
    run(&a, 4, 2);
    expect_same_failure(&a.o, 4, SELDP_ERR_NONFINITE, "group rank 2", "'final_norm.weight'");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(agreeing_records_take_one_exchange),
        cmocka_unit_test(overflow_is_decided_from_the_briefs),
        cmocka_unit_test(differing_records_are_exchanged),
        cmocka_unit_test(failures_are_exchanged),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
