/* The debug mode of the collectives (SELDP_DEBUG_COLLECTIVES, src/comm/comm_impl.h) on the
 * host-staged transport: each call first agrees on its fingerprint (collective, count,
 * dtype, root, sequence number); a mismatch is SELDP_ERR_DISAGREE on every rank naming both
 * calls, and nothing moves. Off by default: without it, a mismatch the transport cannot see
 * (two broadcasts of the same bytes in different dtypes) passes silently. */
#define _POSIX_C_SOURCE 200809L /* setenv */

#include <setjmp.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "ranks.h"
#include "seldp/seldp.h"

#define TIMEOUT_S 30.0

#define RANK_CHECK_MSG(ctx, needle)                                                                \
    RANK_CHECK(ctx, strstr(seldp_last_error(), needle) != NULL, "message '%s' lacks '%s'",         \
               seldp_last_error(), needle)

static void debug_mode(bool on)
{
    assert_int_equal(setenv("SELDP_DEBUG_COLLECTIVES", on ? "1" : "0", 1), 0);
}

/* Calls that agree run as usual, and the fingerprints do not count in the stats. */
static int agreeing_rank(tr_rank_ctx *ctx)
{
    float x[64];
    for (int i = 0; i < 64; i++)
        x[i] = (float)(ctx->rank + 1);
    RANK_CHECK_OK(ctx, seldp_comm_barrier(ctx->world));
    RANK_CHECK_OK(ctx, seldp_comm_allreduce(ctx->world, x, x, 64, SELDP_F32, SELDP_HOST_DEVICE));
    float want = (float)(ctx->size * (ctx->size + 1) / 2);
    RANK_CHECK(ctx, x[0] == want && x[63] == want, "allreduce gave %g, expected %g", x[0], want);
    seldp_comm *half = NULL;
    RANK_CHECK_OK(ctx, seldp_comm_split(ctx->world, ctx->rank % 2, 0, &half));
    RANK_CHECK_OK(ctx, seldp_comm_broadcast(half, x, 64, SELDP_F32, 0, SELDP_HOST_DEVICE));
    seldp_comm_stats st = seldp_comm_get_stats(ctx->world);
    RANK_CHECK(ctx, st.barriers == 1 && st.allreduces == 1 && st.splits == 1 && st.allgathers == 0,
               "stats count %llu barriers, %llu allreduces, %llu splits, %llu allgathers",
               (unsigned long long)st.barriers, (unsigned long long)st.allreduces,
               (unsigned long long)st.splits, (unsigned long long)st.allgathers);
    seldp_comm_destroy(half);
    return 0;
}

static void test_agreeing_calls(void **state)
{
    (void)state;
    debug_mode(true);
    tr_run_ranks(2, TIMEOUT_S, agreeing_rank, NULL);
    tr_run_ranks(5, TIMEOUT_S, agreeing_rank, NULL);
}

/* Rank 1 broadcasts 32 F64 where the others broadcast 64 F32 (the same bytes). */
static int dtype_mismatch_rank(tr_rank_ctx *ctx)
{
    bool *debug = ctx->arg;
    unsigned char buf[256], before[256];
    tr_fill_bytes(buf, sizeof buf, (uint64_t)ctx->rank + 1);
    memcpy(before, buf, sizeof buf);
    RANK_CHECK_OK(ctx, seldp_comm_barrier(ctx->world));
    seldp_status st =
        ctx->rank == 1 ? seldp_comm_broadcast(ctx->world, buf, 32, SELDP_F64, 0, SELDP_HOST_DEVICE)
                       : seldp_comm_broadcast(ctx->world, buf, 64, SELDP_F32, 0, SELDP_HOST_DEVICE);
    if (!*debug) {
        /* the bytes agree, so the transport cannot tell */
        RANK_CHECK(ctx, st == SELDP_OK, "broadcast returned %s: %s", seldp_status_name(st),
                   seldp_last_error());
        return 0;
    }
    RANK_CHECK(ctx, st == SELDP_ERR_DISAGREE, "broadcast returned %s: %s", seldp_status_name(st),
               seldp_last_error());
    char me[32];
    snprintf(me, sizeof me, "rank %d: broadcast", ctx->rank);
    RANK_CHECK_MSG(ctx, me);
    RANK_CHECK_MSG(ctx, "collective mismatch (SELDP_DEBUG_COLLECTIVES)");
    RANK_CHECK_MSG(ctx, "rank 0 made call #2 broadcast(count 64, f32, root 0)");
    RANK_CHECK_MSG(ctx, "rank 1 made call #2 broadcast(count 32, f64, root 0)");
    RANK_CHECK(ctx, memcmp(buf, before, sizeof buf) == 0, "the buffer changed");
    /* the world is still usable */
    RANK_CHECK_OK(ctx, seldp_comm_barrier(ctx->world));
    return 0;
}

static void test_planted_dtype_mismatch(void **state)
{
    (void)state;
    bool debug = false;
    debug_mode(false);
    tr_run_ranks(3, TIMEOUT_S, dtype_mismatch_rank, &debug);
    debug = true;
    debug_mode(true);
    tr_run_ranks(3, TIMEOUT_S, dtype_mismatch_rank, &debug);
}

/* The last rank calls an allreduce where the others call a broadcast. */
static int op_mismatch_rank(tr_rank_ctx *ctx)
{
    float x[16] = {0}, y[16] = {0};
    int last = ctx->size - 1;
    seldp_status st =
        ctx->rank == last
            ? seldp_comm_allreduce(ctx->world, x, y, 16, SELDP_F32, SELDP_HOST_DEVICE)
            : seldp_comm_broadcast(ctx->world, x, 16, SELDP_F32, 1, SELDP_HOST_DEVICE);
    RANK_CHECK(ctx, st == SELDP_ERR_DISAGREE, "returned %s: %s", seldp_status_name(st),
               seldp_last_error());
    char other[96];
    snprintf(other, sizeof other, "rank %d made call #1 allreduce(count 16, f32)", last);
    RANK_CHECK_MSG(ctx, "rank 0 made call #1 broadcast(count 16, f32, root 1)");
    RANK_CHECK_MSG(ctx, other);
    return 0;
}

static void test_planted_op_mismatch(void **state)
{
    (void)state;
    debug_mode(true);
    tr_run_ranks(2, TIMEOUT_S, op_mismatch_rank, NULL);
    tr_run_ranks(4, TIMEOUT_S, op_mismatch_rank, NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_agreeing_calls),
        cmocka_unit_test(test_planted_dtype_mismatch),
        cmocka_unit_test(test_planted_op_mismatch),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    unsetenv("SELDP_DEBUG_COLLECTIVES");
    return failed;
}
