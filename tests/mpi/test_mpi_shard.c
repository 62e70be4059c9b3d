/* Sharded sessions over the MPI transport (seldp/shard.h), one process per rank: each
 * rank's reduce-scatter range equals, bit for bit, the same elements of the session's FP32
 * all-reduce (mean and sum); the distributed optimizer's round trip (reduce-scatter, update
 * the range of FP32 master weights, all-gather) leaves the parameters bit-identical on
 * every rank and to the all-reduce path's; the norm over ranges is the replicas' norm; the
 * communicator's reduce_scatter and allgather_counts with uneven blocks, also in rounds of
 * small messages (the _rounds variants set SELDP_MPI_MAX_MESSAGE); a disagreement and a
 * bad range fail on every rank. */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mpi_test.h"
#include "ranks.h"
#include "shard_fixture.h"

#define TIMEOUT_S 20.0

typedef struct shard_setup {
    seldp_comm *world;
    test_model m1, m2;
    seldp_session *s1, *s2;
    seldp_shard_map *map;
    size_t begin, count, pieces;
} shard_setup;

static void setup(shard_setup *u)
{
    memset(u, 0, sizeof *u);
    u->world = mt_world(TIMEOUT_S);
    assert_int_equal(sf_session(u->world, &u->m1, SF_N, NULL, &u->s1), SELDP_OK);
    assert_int_equal(sf_session(u->world, &u->m2, SF_N, NULL, &u->s2), SELDP_OK);
    assert_int_equal(seldp_session_reduce_path(u->s1), SELDP_REDUCE_PATH_BUCKETED);
    assert_int_equal(seldp_shard_map_create(u->s1, &u->map), SELDP_OK);
    assert_int_equal(seldp_shard_map_range(u->map, mt_rank, &u->begin, &u->count), SELDP_OK);
    u->pieces = seldp_shard_map_pieces(u->map, mt_rank);
}

static void teardown(shard_setup *u)
{
    seldp_shard_map_destroy(u->map);
    seldp_session_destroy(u->s2);
    seldp_session_destroy(u->s1);
    ct_free(&u->m2);
    ct_free(&u->m1);
    seldp_comm_destroy(u->world);
}

/* The range against the all-reduce's results, piece by piece. */
static void expect_range(const shard_setup *u, const float *range, const bool *present,
                         seldp_grads *reduced)
{
    for (size_t i = 0; i < u->pieces; i++) {
        seldp_shard_piece p;
        assert_int_equal(seldp_shard_map_piece(u->map, mt_rank, i, &p), SELDP_OK);
        const seldp_tensor *t = seldp_grads_get(reduced, p.id);
        if (!t) {
            assert_false(present[i]);
            continue;
        }
        assert_true(present[i]);
        size_t bytes = p.count * sizeof(float);
        size_t at =
            tr_first_diff(range + p.range_offset, (const float *)t->data + p.param_offset, bytes);
        if (at != bytes)
            fail_msg("rank %d: '%s' element %zu differs from the all-reduce's", mt_rank, p.path,
                     p.param_offset + at / 4);
    }
}

static void test_reduce_scatter_is_the_allreduce(void **state)
{
    (void)state;
    shard_setup u;
    setup(&u);
    float *range = malloc((u.count + 1) * sizeof *range);
    bool *present = calloc(u.pieces + 1, sizeof *present);
    assert_non_null(range);
    assert_non_null(present);
    for (int sum = 0; sum <= 1; sum++) {
        test_grads a, b;
        bool has[SF_N];
        for (size_t k = 0; k < SF_N; k++) /* c.norm only on rank 0: policy zero */
            has[k] = k != 2 || mt_rank == 0;
        assert_int_equal(tg_init(&a), SELDP_OK);
        assert_int_equal(tg_init(&b), SELDP_OK);
        assert_int_equal(sf_put_grads(&a, mt_rank, 1, has, false), SELDP_OK);
        assert_int_equal(sf_put_grads(&b, mt_rank, 1, has, false), SELDP_OK);
        uint64_t w = 2 + 3 * (uint64_t)mt_rank, wa = 0, wb = 0;
        seldp_status st =
            sum ? seldp_shard_reduce_scatter_sum(u.s1, u.map, b.grads, true, SELDP_MISSING_ZERO,
                                                 range, u.count, present, &wb)
                : seldp_shard_reduce_scatter(u.s1, u.map, b.grads, w, SELDP_MISSING_ZERO, range,
                                             u.count, present, &wb);
        if (st != SELDP_OK)
            fail_msg("rank %d: %s", mt_rank, seldp_last_error());
        st = sum ? seldp_session_sum_fp32(u.s2, a.grads, true, SELDP_MISSING_ZERO, &wa)
                 : seldp_session_reduce_fp32(u.s2, a.grads, w, SELDP_MISSING_ZERO, &wa);
        if (st != SELDP_OK)
            fail_msg("rank %d: %s", mt_rank, seldp_last_error());
        assert_true(wa == wb);
        expect_range(&u, range, present, a.grads);
        tg_free(&a);
        tg_free(&b);
    }
    free(range);
    free(present);
    teardown(&u);
}

static void test_round_trip_and_norm(void **state)
{
    (void)state;
    shard_setup u;
    setup(&u);
    float *grad = malloc((u.count + 1) * sizeof *grad), *master = malloc((u.count + 1) * 4);
    bool *present = calloc(u.pieces + 1, sizeof *present);
    assert_true(grad && master && present);
    for (size_t i = 0; i < u.pieces; i++) {
        seldp_shard_piece p;
        assert_int_equal(seldp_shard_map_piece(u.map, mt_rank, i, &p), SELDP_OK);
        ct_param *q = ct_find(&u.m1, p.path);
        for (size_t e = 0; e < p.count; e++)
            master[p.range_offset + e] = (float)ct_get(p.dtype, q->tensor.data, p.param_offset + e);
    }
    test_grads g1, g2;
    assert_int_equal(tg_init(&g1), SELDP_OK);
    assert_int_equal(tg_init(&g2), SELDP_OK);
    assert_int_equal(sf_put_grads(&g1, mt_rank, 2, NULL, false), SELDP_OK);
    assert_int_equal(sf_put_grads(&g2, mt_rank, 2, NULL, false), SELDP_OK);
    uint64_t w = 5 + (uint64_t)mt_rank;
    assert_int_equal(seldp_shard_reduce_scatter(u.s1, u.map, g1.grads, w, SELDP_MISSING_ERROR, grad,
                                                u.count, present, NULL),
                     SELDP_OK);
    assert_int_equal(seldp_session_reduce_fp32(u.s2, g2.grads, w, SELDP_MISSING_ERROR, NULL),
                     SELDP_OK);
    /* the norm over the ranges is the replicas' */
    seldp_norm_range range = {u.s1, u.map, grad, u.count, present};
    seldp_norm_part part = {u.s2, g2.grads, SELDP_NORM_REPLICATED};
    seldp_grad_norm_result sharded, replicated;
    assert_int_equal(seldp_grad_norm_ranges(u.world, NULL, 0, &range, 1, &sharded), SELDP_OK);
    assert_int_equal(seldp_grad_norm(u.world, &part, 1, &replicated), SELDP_OK);
    if (!(fabs(sharded.norm - replicated.norm) <= 1e-12 * replicated.norm && sharded.norm > 0))
        fail_msg("norms %.17g (ranges) and %.17g (replicas)", sharded.norm, replicated.norm);
    /* the step, both ways */
    for (size_t i = 0; i < u.count; i++)
        master[i] -= 0.25f * grad[i];
    assert_int_equal(seldp_shard_allgather_params(u.s1, u.map, master, SELDP_F32, u.count),
                     SELDP_OK);
    for (size_t k = 0; k < SF_N; k++) {
        if (!SF[k].trainable)
            continue;
        ct_param *p = ct_find(&u.m2, SF[k].path);
        const float *gr = seldp_grads_get(g2.grads, sf_id(mt_rank, k))->data;
        for (size_t i = 0; i < sf_numel(k); i++) {
            float m = (float)ct_get(SF[k].dtype, p->tensor.data, i);
            m -= 0.25f * gr[i];
            ct_set(SF[k].dtype, p->tensor.data, i, m);
        }
        ct_param *a = ct_find(&u.m1, SF[k].path);
        size_t bytes = seldp_tensor_nbytes(&a->tensor);
        if (tr_first_diff(a->tensor.data, p->tensor.data, bytes) != bytes)
            fail_msg("rank %d: '%s' differs from the all-reduce path", mt_rank, SF[k].path);
        assert_true(mt_same_everywhere(u.world, a->tensor.data, bytes));
    }
    tg_free(&g1);
    tg_free(&g2);
    free(grad);
    free(master);
    free(present);
    teardown(&u);
}

static void test_comm_collectives(void **state)
{
    (void)state;
    seldp_comm *world = mt_world(TIMEOUT_S);
    size_t counts[8], total = 0, at = 0;
    for (int r = 0; r < mt_size; r++) {
        counts[r] = r == 1 ? 0 : 3000 + 17 * (size_t)r; /* uneven, one empty */
        if (r == mt_rank)
            at = total;
        total += counts[r];
    }
    float *send = malloc(total * sizeof *send), *sum = malloc(total * sizeof *sum);
    float *all = malloc(total * sizeof *all);
    assert_true(send && sum && all);
    tr_fill_f32(send, total, 7 + (uint64_t)mt_rank);
    assert_int_equal(seldp_comm_allreduce(world, send, sum, total, SELDP_F32, SELDP_HOST_DEVICE),
                     SELDP_OK);
    /* in place: the block lands on its own place in the input */
    assert_int_equal(
        seldp_comm_reduce_scatter(world, send, send + at, counts, SELDP_F32, SELDP_HOST_DEVICE),
        SELDP_OK);
    assert_int_equal(tr_first_diff(send + at, sum + at, counts[mt_rank] * 4), counts[mt_rank] * 4);
    assert_int_equal(
        seldp_comm_allgather_counts(world, send + at, all, counts, SELDP_F32, SELDP_HOST_DEVICE),
        SELDP_OK);
    assert_int_equal(tr_first_diff(all, sum, total * 4), total * 4);
    /* other counts on rank 1: every rank disagrees */
    counts[0] += mt_rank == 1;
    seldp_status st =
        seldp_comm_reduce_scatter(world, send, sum, counts, SELDP_F32, SELDP_HOST_DEVICE);
    mt_expect_everywhere(world, st, SELDP_ERR_DISAGREE, "same per-rank counts");
    free(send);
    free(sum);
    free(all);
    seldp_comm_destroy(world);
}

static void test_refusals(void **state)
{
    (void)state;
    shard_setup u;
    setup(&u);
    float *range = calloc(u.count + 1, sizeof *range);
    test_grads g;
    assert_int_equal(tg_init(&g), SELDP_OK);
    assert_int_equal(sf_put_grads(&g, mt_rank, 1, NULL, false), SELDP_OK);
    /* an all-reduce on rank 0, a reduce-scatter elsewhere */
    seldp_status st = mt_rank == 0
                          ? seldp_session_reduce_fp32(u.s1, g.grads, 1, SELDP_MISSING_ERROR, NULL)
                          : seldp_shard_reduce_scatter(u.s1, u.map, g.grads, 1, SELDP_MISSING_ERROR,
                                                       range, u.count, NULL, NULL);
    mt_expect_everywhere(u.world, st, SELDP_ERR_DISAGREE, "seldp_shard_reduce_scatter");
    /* a range of the wrong size on rank 1 (the second session: the first is out of step) */
    seldp_shard_map *map2 = NULL;
    assert_int_equal(seldp_shard_map_create(u.s2, &map2), SELDP_OK);
    st = seldp_shard_reduce_scatter(u.s2, map2, g.grads, 1, SELDP_MISSING_ERROR, range,
                                    u.count + (mt_rank == 1), NULL, NULL);
    mt_expect_everywhere(u.world, st, SELDP_ERR_INVALID_ARGUMENT, "the range has");
    seldp_shard_map_destroy(map2);
    tg_free(&g);
    free(range);
    teardown(&u);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        MT_TEST(test_reduce_scatter_is_the_allreduce),
        MT_TEST(test_round_trip_and_norm),
        MT_TEST(test_comm_collectives),
        MT_TEST(test_refusals),
    };
    return mt_main(argc, argv, "mpi_shard", tests, sizeof tests / sizeof tests[0]);
}
