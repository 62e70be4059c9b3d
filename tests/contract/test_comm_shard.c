/* Contract of the communicator's sharded collectives on the host-staged transport
 * (seldp/comm.h): seldp_comm_reduce_scatter gives rank r block r of the element-wise sum,
 * bit-identical to the same elements of seldp_comm_allreduce of the same inputs;
 * seldp_comm_allgather_counts gives every rank every block; both with uneven and empty
 * blocks, in place, on every world of 1 to 8 ranks, and large enough for the streaming
 * stores and several paced pieces per rank. Counts that differ between ranks are
 * SELDP_ERR_DISAGREE on every rank; bad arguments are refused locally. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "contract.h"

typedef struct comm_arg {
    size_t scale; /* elements per unit of the counts' pattern */
    bool in_place;
    outcome o;
} comm_arg;

/* Block r's elements: uneven, rank 1's empty when the group has more than two ranks. */
static size_t block_of(int r, int n, size_t scale)
{
    if (n > 2 && r == 1)
        return 0;
    return scale * (size_t)(1 + (r * 7 + 3) % 5) + (size_t)r;
}

static int rank_reduce_scatter(tr_rank_ctx *ctx)
{
    const comm_arg *a = ctx->arg;
    int n = ctx->size, me = ctx->rank;
    size_t counts[MAX_RANKS], total = 0, at = 0;
    for (int r = 0; r < n; r++) {
        counts[r] = block_of(r, n, a->scale);
        if (r == me)
            at = total;
        total += counts[r];
    }
    float *send = malloc((total + 1) * sizeof *send), *sum = malloc((total + 1) * sizeof *sum);
    float *recv = malloc((counts[me] + 1) * sizeof *recv);
    RANK_CHECK(ctx, send && sum && recv, "out of memory");
    tr_fill_f32(send, total, 100 + (uint64_t)me);
    RANK_CHECK_OK(ctx,
                  seldp_comm_allreduce(ctx->world, send, sum, total, SELDP_F32, SELDP_HOST_DEVICE));
    seldp_comm_stats before = seldp_comm_get_stats(ctx->world);
    float *out = a->in_place ? send + at : recv;
    RANK_CHECK_OK(ctx, seldp_comm_reduce_scatter(ctx->world, send, out, counts, SELDP_F32,
                                                 SELDP_HOST_DEVICE));
    seldp_comm_stats after = seldp_comm_get_stats(ctx->world);
    RANK_CHECK(ctx, after.reduce_scatters == before.reduce_scatters + 1,
               "reduce_scatters counted %llu, expected %llu",
               (unsigned long long)after.reduce_scatters,
               (unsigned long long)before.reduce_scatters + 1);
    size_t diff = tr_first_diff(out, sum + at, counts[me] * sizeof(float));
    RANK_CHECK(ctx, diff == counts[me] * sizeof(float),
               "block %d element %zu: %.9g, the allreduce's %.9g", me, diff / 4,
               (double)out[diff / 4], (double)sum[at + diff / 4]);
    /* the other blocks of an in-place input are left alone */
    if (a->in_place) {
        float *mine = malloc((total + 1) * sizeof *mine);
        RANK_CHECK(ctx, mine, "out of memory");
        tr_fill_f32(mine, total, 100 + (uint64_t)me);
        RANK_CHECK(ctx,
                   memcmp(mine, send, at * 4) == 0 &&
                       memcmp(mine + at + counts[me], send + at + counts[me],
                              (total - at - counts[me]) * 4) == 0,
                   "an in-place reduce-scatter wrote outside the rank's block");
        free(mine);
    }
    free(send);
    free(sum);
    free(recv);
    return 0;
}

static int rank_allgather(tr_rank_ctx *ctx)
{
    const comm_arg *a = ctx->arg;
    int n = ctx->size, me = ctx->rank;
    size_t counts[MAX_RANKS], starts[MAX_RANKS], total = 0;
    for (int r = 0; r < n; r++) {
        counts[r] = block_of(r, n, a->scale);
        starts[r] = total;
        total += counts[r];
    }
    uint16_t *recv = malloc((total + 1) * sizeof *recv);
    uint16_t *send = malloc((counts[me] + 1) * sizeof *send);
    RANK_CHECK(ctx, recv && send, "out of memory");
    memset(recv, 0xff, total * sizeof *recv);
    uint16_t *from = a->in_place ? recv + starts[me] : send;
    for (size_t i = 0; i < counts[me]; i++)
        from[i] = (uint16_t)(me * 4099 + (int)i * 7);
    RANK_CHECK_OK(ctx, seldp_comm_allgather_counts(ctx->world, from, recv, counts, SELDP_BF16,
                                                   SELDP_HOST_DEVICE));
    for (int r = 0; r < n; r++)
        for (size_t i = 0; i < counts[r]; i++)
            RANK_CHECK(ctx, recv[starts[r] + i] == (uint16_t)(r * 4099 + (int)i * 7),
                       "block %d element %zu: %u", r, i, (unsigned)recv[starts[r] + i]);
    free(recv);
    free(send);
    return 0;
}

static void run_all(size_t scale, bool in_place, int max_ranks)
{
    comm_arg a;
    memset(&a, 0, sizeof a);
    a.scale = scale;
    a.in_place = in_place;
    for (int n = 1; n <= max_ranks; n++) {
        tr_run_ranks(n, TEST_TIMEOUT_S, rank_reduce_scatter, &a);
        tr_run_ranks(n, TEST_TIMEOUT_S, rank_allgather, &a);
    }
}

static void test_small(void **state)
{
    (void)state;
    run_all(17, false, MAX_RANKS);
    run_all(17, true, MAX_RANKS);
}

/* About 12 MiB per rank at three ranks: non-temporal stores, many paced pieces. */
static void test_large(void **state)
{
    (void)state;
    run_all((size_t)1 << 20, false, 3);
    run_all((size_t)1 << 20, true, 2);
}

/* Counts that differ on rank 1, and local refusals. */
static int rank_refusals(tr_rank_ctx *ctx)
{
    comm_arg *a = ctx->arg;
    size_t counts[MAX_RANKS];
    float buf[64] = {0};
    for (int r = 0; r < ctx->size; r++)
        counts[r] = 4 + (ctx->rank == 1 && r == 0);
    seldp_status st =
        seldp_comm_reduce_scatter(ctx->world, buf, buf, counts, SELDP_F32, SELDP_HOST_DEVICE);
    outcome_record(&a->o, ctx->rank, st);
    a->o.unchanged[ctx->rank] = true;
    /* the same on the all-gather */
    st = seldp_comm_allgather_counts(ctx->world, buf, buf + 16, counts, SELDP_F32,
                                     SELDP_HOST_DEVICE);
    RANK_CHECK(ctx, st == SELDP_ERR_DISAGREE && strstr(seldp_last_error(), "allgather_counts"),
               "allgather_counts with other counts returned %s: %s", seldp_status_name(st),
               seldp_last_error());
    for (int r = 0; r < ctx->size; r++)
        counts[r] = 4;
    st = seldp_comm_reduce_scatter(ctx->world, buf, buf, NULL, SELDP_F32, SELDP_HOST_DEVICE);
    RANK_CHECK(ctx, st == SELDP_ERR_INVALID_ARGUMENT, "NULL counts: %s", seldp_status_name(st));
    st = seldp_comm_reduce_scatter(ctx->world, buf, buf, counts, SELDP_F64, SELDP_HOST_DEVICE);
    RANK_CHECK(ctx, st == SELDP_ERR_DTYPE, "an f64 reduce-scatter: %s", seldp_status_name(st));
    st = seldp_comm_reduce_scatter(ctx->world, NULL, buf, counts, SELDP_F32, SELDP_HOST_DEVICE);
    RANK_CHECK(ctx, st == SELDP_ERR_INVALID_ARGUMENT, "a NULL send: %s", seldp_status_name(st));
    st = seldp_comm_allgather_counts(ctx->world, buf, NULL, counts, SELDP_F32, SELDP_HOST_DEVICE);
    RANK_CHECK(ctx, st == SELDP_ERR_INVALID_ARGUMENT, "a NULL recv: %s", seldp_status_name(st));
    counts[0] = SIZE_MAX / 2;
    st = seldp_comm_allgather_counts(ctx->world, buf, buf, counts, SELDP_F32, SELDP_HOST_DEVICE);
    RANK_CHECK(ctx, st == SELDP_ERR_INVALID_ARGUMENT, "overflowing counts: %s",
               seldp_status_name(st));
    /* the world is still usable */
    for (int r = 0; r < ctx->size; r++)
        counts[r] = 4;
    RANK_CHECK_OK(ctx, seldp_comm_reduce_scatter(ctx->world, buf, buf + 32, counts, SELDP_F32,
                                                 SELDP_HOST_DEVICE));
    return 0;
}

static void test_refusals(void **state)
{
    (void)state;
    comm_arg a;
    memset(&a, 0, sizeof a);
    tr_run_ranks(3, TEST_TIMEOUT_S, rank_refusals, &a);
    for (int r = 0; r < 3; r++)
        if (a.o.st[r] != SELDP_ERR_DISAGREE || !strstr(a.o.msg[r], "same per-rank counts"))
            fail_msg("rank %d returned %s: %s", r, seldp_status_name(a.o.st[r]), a.o.msg[r]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_small),
        cmocka_unit_test(test_large),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
