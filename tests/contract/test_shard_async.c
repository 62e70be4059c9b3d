/* Contract of the overlapped reduce-scatter (seldp_shard_reduce_scatter_start,
 * seldp_session_mark_ready, seldp_session_finish): the range and the presence flags finish
 * writes are bit-identical to the blocking seldp_shard_reduce_scatter's of the same
 * gradients, with marks in any order, on every world of 1 to 8 ranks, in the mean and the
 * sum, under the missing-gradient policies; nothing is written before finish; a blocking
 * call on one rank against a start on the others, or a range of the wrong size, fails on
 * every rank. Registered on both host reduce paths and with small buckets (many buckets per
 * range, reduced last to first as they are marked). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "shard_fixture.h"

#define POISON 0x7fc0f00d

typedef struct async_arg {
    bool sum;
    seldp_missing_policy policy;
    bool missing; /* odd ranks lack c.norm, no rank has h.expert */
    outcome o;
    int mode; /* the failure scenarios */
} async_arg;

static int put(tr_rank_ctx *ctx, const async_arg *a, test_grads *g)
{
    bool has[SF_N];
    for (size_t k = 0; k < SF_N; k++)
        has[k] = !a->missing || !((k == 2 && ctx->rank % 2) || k == 6);
    RANK_CHECK_OK(ctx, tg_init(g));
    RANK_CHECK_OK(ctx, sf_put_grads(g, ctx->rank, 3, has, false));
    return 0;
}

static uint64_t weight(int rank)
{
    return 1 + 2 * (uint64_t)rank;
}

static int rank_overlapped(tr_rank_ctx *ctx)
{
    const async_arg *a = ctx->arg;
    seldp_session_config cfg = sf_config();
    test_model m;
    test_grads g1, g2;
    seldp_session *s = NULL;
    seldp_shard_map *map = NULL;
    size_t count, pieces;
    uint64_t w1 = 0, w2 = 0;

    RANK_CHECK_OK(ctx, sf_session(ctx->world, &m, SF_N, &cfg, &s));
    RANK_CHECK_OK(ctx, seldp_shard_map_create(s, &map));
    RANK_CHECK_OK(ctx, seldp_shard_map_range(map, ctx->rank, NULL, &count));
    pieces = seldp_shard_map_pieces(map, ctx->rank);
    float *r1 = malloc((count + 1) * 4), *r2 = malloc((count + 1) * 4);
    bool *p1 = calloc(pieces + 1, 1), *p2 = calloc(pieces + 1, 1);
    RANK_CHECK(ctx, r1 && r2 && p1 && p2, "out of memory");
    for (size_t i = 0; i < count; i++) {
        memcpy(&r1[i], &(uint32_t){POISON}, 4);
        memcpy(&r2[i], &(uint32_t){POISON}, 4);
    }
    if (put(ctx, a, &g1) || put(ctx, a, &g2))
        return 1;
    seldp_status st = a->sum ? seldp_shard_reduce_scatter_sum(s, map, g1.grads, true, a->policy, r1,
                                                              count, p1, &w1)
                             : seldp_shard_reduce_scatter(s, map, g1.grads, weight(ctx->rank),
                                                          a->policy, r1, count, p1, &w1);
    RANK_CHECK(ctx, st == SELDP_OK, "the blocking reduce-scatter: %s", seldp_last_error());

    st = a->sum ? seldp_shard_reduce_scatter_sum_start(s, map, g2.grads, true, a->policy, r2, count,
                                                       p2)
                : seldp_shard_reduce_scatter_start(s, map, g2.grads, weight(ctx->rank), a->policy,
                                                   r2, count, p2);
    RANK_CHECK(ctx, st == SELDP_OK, "start: %s", seldp_last_error());
    RANK_CHECK(ctx, seldp_session_in_flight(s), "nothing is in flight after the start");
    /* backward: the last parameters first, one of them left for finish to mark */
    for (size_t i = SF_N; i-- > 0;) {
        if (!SF[i].trainable || i == 4)
            continue;
        RANK_CHECK_OK(ctx, seldp_session_mark_ready(s, sf_id(ctx->rank, i)));
    }
    for (size_t i = 0; i < count; i++)
        RANK_CHECK(ctx, memcmp(&r2[i], &(uint32_t){POISON}, 4) == 0,
                   "range element %zu written before finish", i);
    RANK_CHECK_OK(ctx, seldp_session_finish(s, &w2));
    RANK_CHECK(ctx, w1 == w2, "global weights %llu (blocking) and %llu (overlapped)",
               (unsigned long long)w1, (unsigned long long)w2);
    RANK_CHECK(ctx, memcmp(p1, p2, pieces) == 0, "the presence flags differ");
    size_t at = tr_first_diff(r1, r2, count * 4);
    RANK_CHECK(ctx, at == count * 4, "range element %zu: %.9g overlapped, %.9g blocking", at / 4,
               (double)r2[at / 4], (double)r1[at / 4]);
    if (a->missing) {
        bool any_absent = false;
        for (size_t i = 0; i < pieces; i++)
            any_absent |= !p2[i];
        seldp_shard_piece last;
        if (pieces) {
            RANK_CHECK_OK(ctx, seldp_shard_map_piece(map, ctx->rank, pieces - 1, &last));
            RANK_CHECK(ctx, strcmp(last.path, "h.expert") != 0 || any_absent,
                       "h.expert (no gradient anywhere) is reported present");
        }
    }
    free(r1);
    free(r2);
    free(p1);
    free(p2);
    tg_free(&g1);
    tg_free(&g2);
    seldp_shard_map_destroy(map);
    seldp_session_destroy(s);
    ct_free(&m);
    return 0;
}

static void run_worlds(async_arg *a)
{
    for (int n = 1; n <= MAX_RANKS; n++)
        tr_run_ranks(n, TEST_TIMEOUT_S, rank_overlapped, a);
}

static void test_mean(void **state)
{
    (void)state;
    async_arg a = {.policy = SELDP_MISSING_ERROR};
    run_worlds(&a);
}

static void test_sum(void **state)
{
    (void)state;
    async_arg a = {.sum = true, .policy = SELDP_MISSING_ERROR};
    run_worlds(&a);
}

static void test_missing_zero(void **state)
{
    (void)state;
    async_arg a = {.policy = SELDP_MISSING_ZERO, .missing = true};
    run_worlds(&a);
}

/* Failures: every rank returns the same status, the range unchanged. */
enum { BLOCKING_AGAINST_START, WRONG_RANGE_SIZE };

static int rank_refused(tr_rank_ctx *ctx)
{
    async_arg *a = ctx->arg;
    test_model m;
    test_grads g;
    seldp_session *s = NULL;
    seldp_shard_map *map = NULL;
    size_t count;
    seldp_status st;

    RANK_CHECK_OK(ctx, sf_session(ctx->world, &m, SF_N, NULL, &s));
    RANK_CHECK_OK(ctx, seldp_shard_map_create(s, &map));
    RANK_CHECK_OK(ctx, seldp_shard_map_range(map, ctx->rank, NULL, &count));
    float *range = calloc(count + 2, sizeof *range);
    RANK_CHECK(ctx, range, "out of memory");
    if (put(ctx, a, &g))
        return 1;
    bool odd = ctx->rank == 1;
    if (a->mode == BLOCKING_AGAINST_START && odd) {
        st = seldp_shard_reduce_scatter(s, map, g.grads, 1, SELDP_MISSING_ERROR, range, count, NULL,
                                        NULL);
    } else {
        size_t n = count + (a->mode == WRONG_RANGE_SIZE && odd);
        st = seldp_shard_reduce_scatter_start(s, map, g.grads, 1, SELDP_MISSING_ERROR, range, n,
                                              NULL);
        RANK_CHECK(ctx, st == SELDP_OK, "start: %s", seldp_last_error());
        st = seldp_session_finish(s, NULL);
    }
    outcome_record(&a->o, ctx->rank, st);
    a->o.unchanged[ctx->rank] = true;
    for (size_t i = 0; i < count; i++)
        if (range[i] != 0.0f)
            a->o.unchanged[ctx->rank] = false;
    free(range);
    tg_free(&g);
    seldp_shard_map_destroy(map);
    seldp_session_destroy(s);
    ct_free(&m);
    return 0;
}

static void test_refusals(void **state)
{
    (void)state;
    for (int mode = BLOCKING_AGAINST_START; mode <= WRONG_RANGE_SIZE; mode++) {
        async_arg a;
        memset(&a, 0, sizeof a);
        a.mode = mode;
        tr_run_ranks(3, TEST_TIMEOUT_S, rank_refused, &a);
        seldp_status expected =
            mode == BLOCKING_AGAINST_START ? SELDP_ERR_DISAGREE : SELDP_ERR_INVALID_ARGUMENT;
        const char *needle =
            mode == BLOCKING_AGAINST_START ? "seldp_shard_reduce_scatter_start" : "the range has";
        for (int r = 0; r < 3; r++) {
            if (a.o.st[r] != expected || !strstr(a.o.msg[r], needle))
                fail_msg("case %d: rank %d returned %s: %s", mode, r, seldp_status_name(a.o.st[r]),
                         a.o.msg[r]);
            if (!a.o.unchanged[r])
                fail_msg("case %d: rank %d's range was written", mode, r);
        }
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mean),
        cmocka_unit_test(test_sum),
        cmocka_unit_test(test_missing_zero),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
