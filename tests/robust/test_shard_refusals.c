/* The sharded calls refused (seldp/shard.h): calls that do not agree between ranks (an
 * all-reduce on one rank and a reduce-scatter on another, mean against sum, a reduce-scatter
 * against an all-gather, ranges of another dtype, another policy, two sessions in another
 * order) and bad arguments on one rank (a range of the wrong size, the map of another
 * session, no map, no gradients, an invalid policy, a gradient for a frozen parameter or of
 * the wrong shape). Every rank returns the same status and message, and nothing changes:
 * the gradients, the range, the parameters. Runs on both reduce paths. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "shard_fixture.h"

#define NRANKS 3

typedef enum mismatch {
    ALLREDUCE_VS_SCATTER, /* rank 1 calls seldp_session_reduce_fp32 */
    MEAN_VS_SUM,          /* rank 1 calls the sum */
    SCATTER_VS_GATHER,    /* rank 1 all-gathers */
    GATHER_DTYPES,        /* every rank all-gathers, rank 1 BF16 ranges of a selection */
    POLICY,               /* rank 1 passes the zero policy */
    SESSION_ORDER,        /* rank 1 reduce-scatters the other session first */
    WRONG_RANGE_SIZE,     /* rank 1's range is one element short */
    WRONG_GATHER_SIZE,    /* the same in an all-gather */
    OTHER_MAP,            /* rank 1 passes the other session's map */
    NO_MAP,               /* rank 1 passes NULL */
    NO_GRADS,             /* rank 1 passes no container */
    BAD_POLICY,           /* every rank passes policy 7 */
    FROZEN_GRADIENT,      /* rank 1 has a gradient of d.frozen */
    WRONG_SHAPE,          /* rank 1's gradient of e.weight has 256 elements */
} mismatch;

typedef struct refusal_arg {
    mismatch what;
    outcome o;
} refusal_arg;

static int rank_refusal(tr_rank_ctx *ctx)
{
    refusal_arg *a = ctx->arg;
    bool odd = ctx->rank == 1;
    test_model m, m2;
    test_grads g;
    grads_snapshot before;
    seldp_session *s = NULL, *t = NULL;
    seldp_shard_map *map = NULL, *tmap = NULL;
    size_t count, tcount;
    seldp_status st = SELDP_OK;
    char why[256];

    RANK_CHECK_OK(ctx, sf_session(ctx->world, &m, SF_N, NULL, &s));
    /* a second session over a copy of the layout, without the buffer: another schema */
    RANK_CHECK_OK(ctx, sf_session(ctx->world, &m2, SF_N - 1, NULL, &t));
    RANK_CHECK_OK(ctx, seldp_shard_map_create(s, &map));
    RANK_CHECK_OK(ctx, seldp_shard_map_create(t, &tmap));
    RANK_CHECK_OK(ctx, seldp_shard_map_range(map, ctx->rank, NULL, &count));
    RANK_CHECK_OK(ctx, seldp_shard_map_range(tmap, ctx->rank, NULL, &tcount));
    float *range = malloc((count + 1) * sizeof *range);
    RANK_CHECK(ctx, range, "out of memory");
    for (size_t i = 0; i < count; i++)
        range[i] = (float)i;
    RANK_CHECK_OK(ctx, tg_init(&g));
    RANK_CHECK_OK(ctx, sf_put_grads(&g, ctx->rank, 1, NULL, false));
    if (odd && a->what == FROZEN_GRADIENT)
        RANK_CHECK_OK(ctx,
                      tg_put(&g, sf_id(ctx->rank, 3), SELDP_F32, false, 1, 1, SHAPE(64), NULL));
    if (odd && a->what == WRONG_SHAPE) {
        seldp_grads_remove(g.grads, sf_id(ctx->rank, 4));
        RANK_CHECK_OK(ctx,
                      tg_put(&g, sf_id(ctx->rank, 4), SELDP_F32, false, 1, 1, SHAPE(256), NULL));
    }
    gs_take(&before, g.grads);
    ct_snapshot(&m);
    uint64_t w = 4;
    seldp_missing_policy policy = SELDP_MISSING_ERROR;
    switch (a->what) {
    case ALLREDUCE_VS_SCATTER:
        st = odd ? seldp_session_reduce_fp32(s, g.grads, w, policy, NULL)
                 : seldp_shard_reduce_scatter(s, map, g.grads, w, policy, range, count, NULL, NULL);
        break;
    case MEAN_VS_SUM:
        st = odd ? seldp_shard_reduce_scatter_sum(s, map, g.grads, true, policy, range, count, NULL,
                                                  NULL)
                 : seldp_shard_reduce_scatter(s, map, g.grads, w, policy, range, count, NULL, NULL);
        break;
    case SCATTER_VS_GATHER:
        st = odd ? seldp_shard_allgather_params(s, map, range, SELDP_F32, count)
                 : seldp_shard_reduce_scatter(s, map, g.grads, w, policy, range, count, NULL, NULL);
        break;
    case GATHER_DTYPES:
        st = seldp_shard_allgather_params(s, map, range, odd ? SELDP_F16 : SELDP_F32, count);
        break;
    case POLICY:
        st = seldp_shard_reduce_scatter(s, map, g.grads, w, odd ? SELDP_MISSING_ZERO : policy,
                                        range, count, NULL, NULL);
        break;
    case SESSION_ORDER: {
        /* everyone calls both sessions, rank 1 in the other order: its first call meets the
         * others' first call on another session */
        float *trange = malloc((tcount + 1) * sizeof *trange);
        RANK_CHECK(ctx, trange, "out of memory");
        if (odd)
            st =
                seldp_shard_reduce_scatter(t, tmap, g.grads, w, policy, trange, tcount, NULL, NULL);
        else
            st = seldp_shard_reduce_scatter(s, map, g.grads, w, policy, range, count, NULL, NULL);
        free(trange);
        break;
    }
    case WRONG_RANGE_SIZE:
        st = seldp_shard_reduce_scatter(s, map, g.grads, w, policy, range, count - odd, NULL, NULL);
        break;
    case WRONG_GATHER_SIZE:
        st = seldp_shard_allgather_params(s, map, range, SELDP_F32, count + odd);
        break;
    case OTHER_MAP:
        st = seldp_shard_reduce_scatter(s, odd ? tmap : map, g.grads, w, policy, range,
                                        odd ? tcount : count, NULL, NULL);
        break;
    case NO_MAP:
        st = seldp_shard_reduce_scatter(s, odd ? NULL : map, g.grads, w, policy, range, count, NULL,
                                        NULL);
        break;
    case NO_GRADS:
        st = seldp_shard_reduce_scatter(s, map, odd ? NULL : g.grads, w, policy, range, count, NULL,
                                        NULL);
        break;
    case BAD_POLICY:
        st = seldp_shard_reduce_scatter(s, map, g.grads, w, (seldp_missing_policy)7, range, count,
                                        NULL, NULL);
        break;
    case FROZEN_GRADIENT:
    case WRONG_SHAPE:
        st = seldp_shard_reduce_scatter(s, map, g.grads, w, policy, range, count, NULL, NULL);
        break;
    }
    outcome_record(&a->o, ctx->rank, st);
    bool same = gs_same(&before, g.grads, a->o.why[ctx->rank], sizeof a->o.why[0]) &&
                ct_unchanged(&m, a->o.why[ctx->rank], sizeof a->o.why[0]);
    for (size_t i = 0; same && i < count; i++)
        if (range[i] != (float)i) {
            snprintf(a->o.why[ctx->rank], sizeof a->o.why[0], "range element %zu was written", i);
            same = false;
        }
    a->o.unchanged[ctx->rank] = same;
    /* a session whose ranks fell out of step stays so; one refused by its arguments does not */
    if (a->what == WRONG_RANGE_SIZE || a->what == OTHER_MAP || a->what == NO_MAP) {
        st = seldp_shard_reduce_scatter(s, map, g.grads, w, policy, range, count, NULL, NULL);
        RANK_CHECK(ctx, st == SELDP_OK, "the next reduce-scatter returned %s: %s",
                   seldp_status_name(st), seldp_last_error());
    }
    (void)why;
    free(range);
    gs_free(&before);
    tg_free(&g);
    seldp_shard_map_destroy(tmap);
    seldp_shard_map_destroy(map);
    seldp_session_destroy(t);
    seldp_session_destroy(s);
    ct_free(&m2);
    ct_free(&m);
    return 0;
}

/* The message after the name of the call the rank made ("seldp_shard_reduce_scatter: "):
 * ranks that made different calls each name their own, and say the same after it. */
static const char *after_call(const char *msg)
{
    const char *colon = strstr(msg, ": ");
    return colon ? colon + 2 : msg;
}

static void refused(mismatch what, seldp_status expected, const char *needle1, const char *needle2)
{
    refusal_arg a;
    memset(&a, 0, sizeof a);
    a.what = what;
    tr_run_ranks(NRANKS, TEST_TIMEOUT_S, rank_refusal, &a);
    for (int r = 0; r < NRANKS; r++)
        if (strcmp(after_call(a.o.msg[r]), after_call(a.o.msg[0])) != 0)
            fail_msg("case %d: rank %d's message differs from rank 0's:\n  %s\n  %s", (int)what, r,
                     a.o.msg[r], a.o.msg[0]);
        else if (r > 0) /* for expect_same_failure, which compares whole messages */
            snprintf(a.o.msg[r], sizeof a.o.msg[r], "%s", a.o.msg[0]);
    expect_same_failure(&a.o, NRANKS, expected, needle1, needle2);
}

static void test_disagreements(void **state)
{
    (void)state;
    refused(ALLREDUCE_VS_SCATTER, SELDP_ERR_DISAGREE, "seldp_session_reduce_fp32",
            "seldp_shard_reduce_scatter");
    refused(MEAN_VS_SUM, SELDP_ERR_DISAGREE, "seldp_shard_reduce_scatter_sum",
            "group rank 1 (world rank 1)");
    refused(SCATTER_VS_GATHER, SELDP_ERR_DISAGREE, "seldp_shard_allgather_params",
            "seldp_shard_reduce_scatter");
    refused(GATHER_DTYPES, SELDP_ERR_DISAGREE, "with f32 ranges", "with f16 ranges");
    refused(POLICY, SELDP_ERR_DISAGREE, "policy error", "policy zero");
    refused(SESSION_ORDER, SELDP_ERR_DISAGREE, "ranks reduce different sessions", NULL);
}

static void test_bad_arguments(void **state)
{
    (void)state;
    refused(WRONG_RANGE_SIZE, SELDP_ERR_INVALID_ARGUMENT, "group rank 1 (world rank 1)",
            "the range has");
    refused(WRONG_GATHER_SIZE, SELDP_ERR_INVALID_ARGUMENT, "seldp_shard_allgather_params",
            "the range has");
    refused(OTHER_MAP, SELDP_ERR_INVALID_ARGUMENT, "the shard map is another session's", NULL);
    refused(NO_MAP, SELDP_ERR_INVALID_ARGUMENT, "map must not be NULL", NULL);
    refused(NO_GRADS, SELDP_ERR_INVALID_ARGUMENT, "grads must not be NULL", NULL);
    refused(BAD_POLICY, SELDP_ERR_INVALID_ARGUMENT, "policy 7 is invalid", NULL);
    refused(FROZEN_GRADIENT, SELDP_ERR_FROZEN, "'d.frozen' is frozen", NULL);
    refused(WRONG_SHAPE, SELDP_ERR_SHAPE, "'e.weight'", "[256]");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_disagreements),
        cmocka_unit_test(test_bad_arguments),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
