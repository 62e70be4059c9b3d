/* host-staged split: MPI_Comm_split semantics (colors, keys, ties, no group), uneven
 * groups working at the same time, nested splits, and the parent staying usable. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "ranks.h"
#include "seldp/seldp.h"

#define TIMEOUT_S 60.0
#define MAX_RANKS 16

/* The expected group of `rank` under (color, key) arrays, as MPI_Comm_split defines it:
 * members of the same color sorted by key, ties in parent order. Returns the size and
 * writes the member list (parent ranks) and this rank's position. */
static int expected_group(int n, const int *color, const int *key, int rank, int *members,
                          int *position)
{
    int size = 0;
    for (int r = 0; r < n; r++)
        if (color[r] == color[rank])
            members[size++] = r;
    for (int i = 1; i < size; i++) /* stable insertion sort by key */
        for (int j = i; j > 0 && key[members[j - 1]] > key[members[j]]; j--) {
            int t = members[j];
            members[j] = members[j - 1];
            members[j - 1] = t;
        }
    for (int i = 0; i < size; i++)
        if (members[i] == rank)
            *position = i;
    return size;
}

typedef struct split_case {
    int color[MAX_RANKS];
    int key[MAX_RANKS];
} split_case;

/* Split by the case's color/key, check rank, size and world ranks, then run collectives
 * inside the new group (all groups at the same time) and check their results. */
static int split_case_rank(tr_rank_ctx *ctx)
{
    const split_case *sc = ctx->arg;
    int me = ctx->rank, n = ctx->size;
    seldp_comm *sub = NULL;
    RANK_CHECK_OK(ctx, seldp_comm_split(ctx->world, sc->color[me], sc->key[me], &sub));
    if (sc->color[me] == SELDP_COMM_NO_GROUP) {
        RANK_CHECK(ctx, sub == NULL, "no-group rank got a communicator");
        RANK_CHECK_OK(ctx, seldp_comm_barrier(ctx->world));
        return 0;
    }
    RANK_CHECK(ctx, sub != NULL, "split gave no communicator");
    int members[MAX_RANKS], pos = -1;
    int size = expected_group(n, sc->color, sc->key, me, members, &pos);
    RANK_CHECK(ctx, seldp_comm_size(sub) == size, "group size %d, expected %d",
               seldp_comm_size(sub), size);
    RANK_CHECK(ctx, seldp_comm_rank(sub) == pos, "group rank %d, expected %d", seldp_comm_rank(sub),
               pos);
    RANK_CHECK(ctx, seldp_comm_world_rank(sub) == me, "world rank %d", seldp_comm_world_rank(sub));

    /* Each member contributes its world rank: the group's member list comes back. */
    int32_t all[MAX_RANKS], mine = me;
    RANK_CHECK_OK(ctx, seldp_comm_allgather(sub, &mine, all, sizeof mine, SELDP_HOST_DEVICE));
    for (int i = 0; i < size; i++)
        RANK_CHECK(ctx, all[i] == members[i], "member %d is world rank %d, expected %d", i, all[i],
                   members[i]);
    int64_t sum = me + 1;
    RANK_CHECK_OK(ctx, seldp_comm_allreduce(sub, &sum, &sum, 1, SELDP_I64, SELDP_HOST_DEVICE));
    int64_t want = 0;
    for (int i = 0; i < size; i++)
        want += members[i] + 1;
    RANK_CHECK(ctx, sum == want, "group sum %lld, expected %lld", (long long)sum, (long long)want);
    int32_t v = pos == size - 1 ? 1000 + sc->color[me] : -1;
    RANK_CHECK_OK(ctx, seldp_comm_broadcast(sub, &v, 1, SELDP_I32, size - 1, SELDP_HOST_DEVICE));
    RANK_CHECK(ctx, v == 1000 + sc->color[me], "broadcast in group %d gave %d", sc->color[me], v);
    seldp_comm_destroy(sub);
    /* The parent is unaffected. */
    RANK_CHECK_OK(ctx, seldp_comm_barrier(ctx->world));
    return 0;
}

static void run_case(int n, const int *color, const int *key)
{
    split_case sc;
    memcpy(sc.color, color, (size_t)n * sizeof *color);
    memcpy(sc.key, key, (size_t)n * sizeof *key);
    tr_run_ranks(n, TIMEOUT_S, split_case_rank, &sc);
}

static void test_uneven_groups(void **state)
{
    (void)state;
    /* 8 ranks: a group of 3, a group of 4 ordered by descending key, one rank in no group. */
    const int color[8] = {0, 0, 0, 1, 1, 1, 1, SELDP_COMM_NO_GROUP};
    const int key[8] = {0, 0, 0, 40, 30, 20, 10, 0};
    run_case(8, color, key);
    /* Interleaved colors with large and negative keys. */
    const int color2[8] = {5, 9, 5, 9, 5, 9, 5, 2};
    const int key2[8] = {-3, 100, 7, -100, 7, 0, -3, 0};
    run_case(8, color2, key2);
}

static void test_key_ties_keep_parent_order(void **state)
{
    (void)state;
    const int color[6] = {1, 1, 1, 1, 1, 1};
    const int key[6] = {2, 1, 2, 1, 2, 1}; /* 1,3,5 then 0,2,4 */
    run_case(6, color, key);
    const int same[4] = {0, 0, 0, 0};
    run_case(4, same, same); /* a copy of the parent */
}

static void test_singletons_and_no_group(void **state)
{
    (void)state;
    const int own[5] = {0, 1, 2, 3, 4}, zero[5] = {0};
    run_case(5, own, zero);
    const int none[3] = {SELDP_COMM_NO_GROUP, SELDP_COMM_NO_GROUP, SELDP_COMM_NO_GROUP};
    run_case(3, none, zero);
    const int one[1] = {0};
    run_case(1, one, zero);
}

/* Rank-dependent cases for every world size: colors r % 3 with keys reversing order. */
static void test_all_sizes(void **state)
{
    (void)state;
    const int sizes[] = {1, 2, 3, 4, 8};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        int n = sizes[i], color[MAX_RANKS], key[MAX_RANKS];
        for (int r = 0; r < n; r++) {
            color[r] = r % 3 == 2 && n > 2 ? SELDP_COMM_NO_GROUP : r % 3;
            key[r] = -r;
        }
        run_case(n, color, key);
    }
}

/* Expert-parallel / expert-data-parallel layout by nested splits: 8 ranks, first in
 * halves (EP groups 0-3, 4-7), then each half strided into pairs {0,2},{1,3}; the data
 * groups across halves come from a second split of the world. */
static int nested_rank(tr_rank_ctx *ctx)
{
    int me = ctx->rank;
    seldp_comm *half = NULL, *pair = NULL, *data = NULL, *solo = NULL;
    RANK_CHECK_OK(ctx, seldp_comm_split(ctx->world, me / 4, me, &half));
    RANK_CHECK(ctx, seldp_comm_size(half) == 4 && seldp_comm_rank(half) == me % 4, "half");
    RANK_CHECK_OK(ctx, seldp_comm_split(half, seldp_comm_rank(half) % 2, 0, &pair));
    RANK_CHECK(ctx, seldp_comm_size(pair) == 2, "pair size %d", seldp_comm_size(pair));
    RANK_CHECK(ctx, seldp_comm_rank(pair) == (me % 4) / 2, "pair rank %d", seldp_comm_rank(pair));
    RANK_CHECK(ctx, seldp_comm_world_rank(pair) == me, "world rank in a nested group");
    RANK_CHECK_OK(ctx, seldp_comm_split(ctx->world, me % 4, me, &data));
    RANK_CHECK(ctx, seldp_comm_size(data) == 2 && seldp_comm_rank(data) == me / 4, "data group");
    /* A third level: every pair splits into singletons. */
    RANK_CHECK_OK(ctx, seldp_comm_split(pair, seldp_comm_rank(pair), 0, &solo));
    RANK_CHECK(ctx, seldp_comm_size(solo) == 1 && seldp_comm_rank(solo) == 0, "solo");

    /* Collectives on every level, interleaved; groups of one level run concurrently. */
    for (int round = 0; round < 20; round++) {
        int64_t v[4] = {me, 1, round, -me};
        RANK_CHECK_OK(ctx, seldp_comm_allreduce(pair, v, v, 4, SELDP_I64, SELDP_HOST_DEVICE));
        int base = (me / 4) * 4 + me % 2; /* pair members: base and base + 2 */
        RANK_CHECK(ctx, v[0] == 2 * base + 2 && v[1] == 2 && v[2] == 2 * round,
                   "round %d: pair sum %lld", round, (long long)v[0]);
        double d = me;
        RANK_CHECK_OK(ctx, seldp_comm_allreduce(data, &d, &d, 1, SELDP_F64, SELDP_HOST_DEVICE));
        RANK_CHECK(ctx, d == 2 * (me % 4) + 4, "round %d: data sum %g", round, d);
        RANK_CHECK_OK(ctx, seldp_comm_barrier(solo));
        int32_t h = seldp_comm_rank(half) == round % 4 ? me : -1;
        RANK_CHECK_OK(ctx,
                      seldp_comm_broadcast(half, &h, 1, SELDP_I32, round % 4, SELDP_HOST_DEVICE));
        RANK_CHECK(ctx, h == (me / 4) * 4 + round % 4, "round %d: half broadcast %d", round, h);
        RANK_CHECK_OK(ctx, seldp_comm_barrier(ctx->world));
    }
    /* Destroy children before parents, in any order between siblings. */
    seldp_comm_destroy(solo);
    seldp_comm_destroy(data);
    seldp_comm_destroy(pair);
    seldp_comm_destroy(half);
    return 0;
}

static void test_nested_splits(void **state)
{
    (void)state;
    tr_run_ranks(8, TIMEOUT_S, nested_rank, NULL);
}

/* Many create/destroy cycles: group bookkeeping is released every time. */
static int churn_rank(tr_rank_ctx *ctx)
{
    for (int i = 0; i < 100; i++) {
        seldp_comm *sub = NULL;
        int color = (ctx->rank + i) % 3 == 0 ? SELDP_COMM_NO_GROUP : (ctx->rank + i) % 2;
        RANK_CHECK_OK(ctx,
                      seldp_comm_split(ctx->world, color, i % 2 ? ctx->rank : -ctx->rank, &sub));
        if (sub) {
            RANK_CHECK_OK(ctx, seldp_comm_barrier(sub));
            seldp_comm_destroy(sub);
        }
    }
    RANK_CHECK(ctx, seldp_comm_get_stats(ctx->world).splits == 100, "split count");
    return 0;
}

static void test_split_churn(void **state)
{
    (void)state;
    tr_run_ranks(5, TIMEOUT_S, churn_rank, NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_uneven_groups),
        cmocka_unit_test(test_key_ties_keep_parent_order),
        cmocka_unit_test(test_singletons_and_no_group),
        cmocka_unit_test(test_all_sizes),
        cmocka_unit_test(test_nested_splits),
        cmocka_unit_test(test_split_churn),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
