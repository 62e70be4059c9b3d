/* Contract of the global gradient norm over sharded ranges (seldp_grad_norm_ranges,
 * seldp_clip_grad_norm_ranges in seldp/gradnorm.h): every rank counts its own range, so each
 * element of a sharded session counts once, and the norm equals the norm of the same
 * session's all-reduced gradients counted as replicas, on every world of 1 to 8 ranks; with
 * a replicated part of another session beside it, the squares add. Absent pieces count as
 * zero and are never scaled; clipping scales every present element by the coefficient;
 * lists that do not match fail on every rank. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "shard_fixture.h"

#define POISON 0x7fc0beef /* a NaN: counted or scaled, it shows */

typedef struct norm_arg {
    bool clip;
    outcome o;
    int mode; /* the failure scenarios below */
} norm_arg;

/* A sharded session s1 and its range, a replicated copy s2 of the same selection, and a
 * second replicated session s3 over "u.local" (the unselected parameter of the others),
 * whose shape differs between ranks: each rank of the world is its own group for it. */
typedef struct norm_setup {
    test_model m1, m2;
    seldp_session *s1, *s2, *s3;
    seldp_comm *self;
    seldp_shard_map *map;
    test_grads g1, g2;
    float *range;
    bool *present;
    size_t count, pieces;
} norm_setup;

static int setup(tr_rank_ctx *ctx, norm_setup *u)
{
    seldp_session_config cfg = sf_config();
    bool has[SF_N];
    for (size_t k = 0; k < SF_N; k++)
        has[k] = k != 6; /* h.expert: absent on every rank */
    memset(u, 0, sizeof *u);
    RANK_CHECK_OK(ctx, sf_session(ctx->world, &u->m1, SF_N, &cfg, &u->s1));
    RANK_CHECK_OK(ctx, sf_session(ctx->world, &u->m2, SF_N, &cfg, &u->s2));
    RANK_CHECK_OK(ctx, seldp_comm_split(ctx->world, ctx->rank, 0, &u->self));
    seldp_param_id local = SF_UNSELECTED_ID;
    RANK_CHECK_OK(ctx, seldp_session_initialize(u->self, u->m2.model, 0, &local, 1, NULL, &u->s3));
    RANK_CHECK_OK(ctx, seldp_shard_map_create(u->s1, &u->map));
    RANK_CHECK_OK(ctx, seldp_shard_map_range(u->map, ctx->rank, NULL, &u->count));
    u->pieces = seldp_shard_map_pieces(u->map, ctx->rank);
    u->range = malloc((u->count + 1) * sizeof *u->range);
    u->present = calloc(u->pieces + 1, sizeof *u->present);
    RANK_CHECK(ctx, u->range && u->present, "out of memory");
    for (size_t i = 0; i < u->count; i++)
        memcpy(&u->range[i], &(uint32_t){POISON}, sizeof(float));
    RANK_CHECK_OK(ctx, tg_init(&u->g1));
    RANK_CHECK_OK(ctx, tg_init(&u->g2));
    RANK_CHECK_OK(ctx, sf_put_grads(&u->g1, ctx->rank, 1, has, false));
    RANK_CHECK_OK(ctx, sf_put_grads(&u->g2, ctx->rank, 1, has, false));
    uint64_t w = 2 + (uint64_t)ctx->rank;
    RANK_CHECK_OK(ctx,
                  seldp_shard_reduce_scatter(u->s1, u->map, u->g1.grads, w, SELDP_MISSING_ERROR,
                                             u->range, u->count, u->present, NULL));
    RANK_CHECK_OK(ctx, seldp_session_reduce_fp32(u->s2, u->g2.grads, w, SELDP_MISSING_ERROR, NULL));
    return 0;
}

static void teardown(norm_setup *u)
{
    tg_free(&u->g1);
    tg_free(&u->g2);
    free(u->range);
    free(u->present);
    seldp_shard_map_destroy(u->map);
    seldp_session_destroy(u->s3);
    seldp_session_destroy(u->s2);
    seldp_session_destroy(u->s1);
    seldp_comm_destroy(u->self);
    ct_free(&u->m2);
    ct_free(&u->m1);
}

static int rank_norm(tr_rank_ctx *ctx)
{
    const norm_arg *a = ctx->arg;
    norm_setup u;
    seldp_grad_norm_result sharded, replicated, both, local;
    if (setup(ctx, &u))
        return 1;
    seldp_norm_range range = {u.s1, u.map, u.range, u.count, u.present};
    seldp_norm_part rep = {u.s2, u.g2.grads, SELDP_NORM_REPLICATED};
    seldp_norm_part mine = {u.s3, u.g2.grads, SELDP_NORM_REPLICATED};
    seldp_norm_part parts[2] = {rep, mine};

    RANK_CHECK_OK(ctx, seldp_grad_norm_ranges(ctx->world, NULL, 0, &range, 1, &sharded));
    RANK_CHECK_OK(ctx, seldp_grad_norm(ctx->world, &rep, 1, &replicated));
    RANK_CHECK(ctx, !sharded.found_inf && sharded.norm > 0.1,
               "the sharded norm is %g (absent pieces counted?)", sharded.norm);
    RANK_CHECK(ctx, fabs(sharded.norm - replicated.norm) <= 1e-12 * replicated.norm,
               "the norm over ranges is %.17g, over the replicas %.17g", sharded.norm,
               replicated.norm);
    RANK_CHECK(ctx, same_everywhere(ctx->world, &sharded.norm, sizeof sharded.norm),
               "the norm differs between ranks");
    /* a replicated part of another session beside the range: the squares add */
    RANK_CHECK_OK(ctx, seldp_grad_norm(ctx->world, &parts[1], 1, &local));
    RANK_CHECK_OK(ctx, seldp_grad_norm_ranges(ctx->world, &parts[1], 1, &range, 1, &both));
    double want = sqrt(sharded.norm * sharded.norm + local.norm * local.norm);
    RANK_CHECK(ctx, fabs(both.norm - want) <= 1e-12 * want, "range and part: %.17g, expected %.17g",
               both.norm, want);

    if (a->clip) {
        float *before = malloc((u.count + 1) * sizeof *before);
        RANK_CHECK(ctx, before, "out of memory");
        memcpy(before, u.range, u.count * sizeof *before);
        double max_norm = 0.5 * sharded.norm;
        seldp_grad_norm_result r;
        RANK_CHECK_OK(ctx,
                      seldp_clip_grad_norm_ranges(ctx->world, NULL, 0, &range, 1, max_norm, &r));
        double coef = max_norm / (sharded.norm + 1e-6);
        RANK_CHECK(ctx, r.clipped && r.clip_coef == coef, "clipped %d by %g, expected %g",
                   (int)r.clipped, r.clip_coef, coef);
        for (size_t i = 0; i < u.pieces; i++) {
            seldp_shard_piece p;
            RANK_CHECK_OK(ctx, seldp_shard_map_piece(u.map, ctx->rank, i, &p));
            for (size_t e = 0; e < p.count; e++) {
                size_t at = p.range_offset + e;
                float expect = u.present[i] ? (float)((double)before[at] * coef) : before[at];
                RANK_CHECK(ctx, memcmp(&expect, &u.range[at], sizeof expect) == 0,
                           "'%s' element %zu: %.9g after clipping, expected %.9g (%s)", p.path,
                           p.param_offset + e, (double)u.range[at], (double)expect,
                           u.present[i] ? "present" : "absent");
            }
        }
        free(before);
    }
    teardown(&u);
    return 0;
}

static void test_norm(void **state)
{
    (void)state;
    norm_arg a = {.clip = false};
    for (int n = 1; n <= MAX_RANKS; n++)
        tr_run_ranks(n, TEST_TIMEOUT_S, rank_norm, &a);
}

static void test_clip(void **state)
{
    (void)state;
    norm_arg a = {.clip = true};
    for (int n = 1; n <= MAX_RANKS; n++)
        tr_run_ranks(n, TEST_TIMEOUT_S, rank_norm, &a);
}

/* Lists that do not match, and bad ranges: the same error on every rank. */
enum { RANGE_ON_RANK0_ONLY, PART_AND_RANGE, WRONG_COUNT, TWICE };

static int rank_refused(tr_rank_ctx *ctx)
{
    norm_arg *a = ctx->arg;
    norm_setup u;
    seldp_grad_norm_result r;
    seldp_status st = SELDP_OK;
    if (setup(ctx, &u))
        return 1;
    seldp_norm_range range = {u.s1, u.map, u.range, u.count, u.present};
    seldp_norm_range ranges[2] = {range, range};
    seldp_norm_part part = {u.s1, u.g1.grads, SELDP_NORM_SHARDED};
    float *before = malloc((u.count + 1) * sizeof *before);
    RANK_CHECK(ctx, before, "out of memory");
    memcpy(before, u.range, u.count * sizeof *before);
    switch (a->mode) {
    case RANGE_ON_RANK0_ONLY:
        st = seldp_clip_grad_norm_ranges(ctx->world, NULL, 0, &range, ctx->rank == 0, 1e-3, &r);
        break;
    case PART_AND_RANGE: /* as a range on rank 0, as a (sharded) part elsewhere */
        st = ctx->rank == 0 ? seldp_clip_grad_norm_ranges(ctx->world, NULL, 0, &range, 1, 1e-3, &r)
                            : seldp_clip_grad_norm(ctx->world, &part, 1, 1e-3, &r);
        break;
    case WRONG_COUNT:
        range.count += ctx->rank == 1;
        st = seldp_clip_grad_norm_ranges(ctx->world, NULL, 0, &range, 1, 1e-3, &r);
        break;
    case TWICE:
        st = seldp_clip_grad_norm_ranges(ctx->world, NULL, 0, ranges, 2, 1e-3, &r);
        break;
    }
    outcome_record(&a->o, ctx->rank, st);
    a->o.unchanged[ctx->rank] = memcmp(before, u.range, u.count * sizeof *before) == 0;
    free(before);
    teardown(&u);
    return 0;
}

static void refused(int mode, int n, seldp_status expected, const char *needle)
{
    norm_arg a;
    memset(&a, 0, sizeof a);
    a.mode = mode;
    tr_run_ranks(n, TEST_TIMEOUT_S, rank_refused, &a);
    expect_same_failure(&a.o, n, expected, needle, NULL);
}

static void test_refusals(void **state)
{
    (void)state;
    refused(RANGE_ON_RANK0_ONLY, 3, SELDP_ERR_DISAGREE, "lists of sessions disagree");
    refused(PART_AND_RANGE, 3, SELDP_ERR_DISAGREE, "sharded ranges");
    refused(WRONG_COUNT, 3, SELDP_ERR_INVALID_ARGUMENT, "range 0: the range has");
    refused(TWICE, 2, SELDP_ERR_INVALID_ARGUMENT, "would count twice");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_norm),
        cmocka_unit_test(test_clip),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
