/* The hybrid transport's collectives (seldp/hybrid.h) over processes x threads: every
 * collective against a reference each rank computes itself, sums bit for bit in world order
 * (the host transport's), splits across and inside processes, nested, and a disagreement
 * that every rank of every process reports. Threads per process: SELDP_HYBRID_THREADS
 * (default 2). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "hybrid_test.h"

static int threads = 2;

#define T_S 20.0

/* rank r's allreduce input: values in [-1, 1) that do not sum exactly, so that the order
 * shows in the bits */
static void input_of(int r, float *x, size_t n)
{
    tr_fill_f32(x, n, 1000u + (uint64_t)r);
}

static int allreduce_rank(tr_rank_ctx *ctx)
{
    const size_t sizes[] = {0, 1, 7, 1000, 100003};
    for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
        size_t n = sizes[k];
        float *x = malloc((n + 1) * sizeof *x), *y = malloc((n + 1) * sizeof *y),
              *ref = malloc((n + 1) * sizeof *ref), *tmp = malloc((n + 1) * sizeof *tmp);
        RANK_CHECK(ctx, x && y && ref && tmp, "out of memory");
        input_of(ctx->rank, x, n);
        RANK_CHECK_OK(ctx, seldp_comm_allreduce(ctx->world, x, y, n, SELDP_F32, SELDP_HOST_DEVICE));
        input_of(0, ref, n);
        for (int r = 1; r < ctx->size; r++) {
            input_of(r, tmp, n);
            for (size_t i = 0; i < n; i++)
                ref[i] += tmp[i];
        }
        size_t at = tr_first_diff(y, ref, n * sizeof *y);
        RANK_CHECK(ctx, at == n * sizeof *y, "allreduce of %zu floats differs at byte %zu", n, at);
        /* in place */
        RANK_CHECK_OK(ctx, seldp_comm_allreduce(ctx->world, x, x, n, SELDP_F32, SELDP_HOST_DEVICE));
        RANK_CHECK(ctx, tr_first_diff(x, ref, n * sizeof *x) == n * sizeof *x,
                   "in-place allreduce of %zu floats differs", n);
        free(x);
        free(y);
        free(ref);
        free(tmp);
    }
    int64_t v[3] = {ctx->rank, -1, (int64_t)1 << 40}, s[3];
    RANK_CHECK_OK(ctx, seldp_comm_allreduce(ctx->world, v, s, 3, SELDP_I64, SELDP_HOST_DEVICE));
    int64_t W = ctx->size;
    RANK_CHECK(ctx, s[0] == W * (W - 1) / 2 && s[1] == -W && s[2] == W << 40,
               "I64 sums %lld %lld %lld", (long long)s[0], (long long)s[1], (long long)s[2]);
    double d = 0.1 * ctx->rank, ds = 0, dref = 0;
    RANK_CHECK_OK(ctx, seldp_comm_allreduce(ctx->world, &d, &ds, 1, SELDP_F64, SELDP_HOST_DEVICE));
    for (int r = 0; r < ctx->size; r++)
        dref = r ? dref + 0.1 * r : 0.0;
    RANK_CHECK(ctx, ds == dref, "F64 sum %.17g, expected %.17g", ds, dref);
    return 0;
}

static void test_allreduce(void **state)
{
    (void)state;
    ht_run(threads, T_S, allreduce_rank, NULL);
}

/* reduce_scatter: every block equals the same elements of the allreduce, bit for bit */
static int reduce_scatter_rank(tr_rank_ctx *ctx)
{
    int W = ctx->size;
    size_t *counts = malloc((size_t)W * sizeof *counts), total = 0, first = 0;
    for (int r = 0; r < W; r++) {
        counts[r] = (size_t)(r * 37 % 11) + (r == 1 ? 0 : 3);
        if (r < ctx->rank)
            first += counts[r];
        total += counts[r];
    }
    float *x = malloc(total * sizeof *x), *all = malloc(total * sizeof *all),
          *mine = malloc((counts[ctx->rank] + 1) * sizeof *mine);
    input_of(ctx->rank, x, total);
    RANK_CHECK_OK(ctx,
                  seldp_comm_allreduce(ctx->world, x, all, total, SELDP_F32, SELDP_HOST_DEVICE));
    RANK_CHECK_OK(
        ctx, seldp_comm_reduce_scatter(ctx->world, x, mine, counts, SELDP_F32, SELDP_HOST_DEVICE));
    RANK_CHECK(ctx, !memcmp(mine, all + first, counts[ctx->rank] * sizeof *mine),
               "reduce_scatter block %d differs from the allreduce", ctx->rank);
    /* in place */
    RANK_CHECK_OK(ctx, seldp_comm_reduce_scatter(ctx->world, x, x + first, counts, SELDP_F32,
                                                 SELDP_HOST_DEVICE));
    RANK_CHECK(ctx, !memcmp(x + first, all + first, counts[ctx->rank] * sizeof *mine),
               "in-place reduce_scatter block %d differs", ctx->rank);
    free(x);
    free(all);
    free(mine);
    free(counts);
    return 0;
}

static void test_reduce_scatter(void **state)
{
    (void)state;
    ht_run(threads, T_S, reduce_scatter_rank, NULL);
}

static int moves_rank(tr_rank_ctx *ctx)
{
    int W = ctx->size, me = ctx->rank;
    /* broadcast from every root */
    for (int root = 0; root < W; root++) {
        unsigned char b[300];
        if (me == root)
            tr_fill_bytes(b, sizeof b, 50u + (uint64_t)root);
        else
            memset(b, 0, sizeof b);
        RANK_CHECK_OK(
            ctx, seldp_comm_broadcast(ctx->world, b, sizeof b, SELDP_U8, root, SELDP_HOST_DEVICE));
        unsigned char e[300];
        tr_fill_bytes(e, sizeof e, 50u + (uint64_t)root);
        RANK_CHECK(ctx, !memcmp(b, e, sizeof b), "broadcast from %d differs", root);
    }
    /* allgather */
    uint64_t mine[5], *all = malloc((size_t)W * sizeof mine);
    for (int i = 0; i < 5; i++)
        mine[i] = tr_hash((uint64_t)me, (uint64_t)i);
    RANK_CHECK_OK(ctx, seldp_comm_allgather(ctx->world, mine, all, sizeof mine, SELDP_HOST_DEVICE));
    for (int r = 0; r < W; r++)
        for (int i = 0; i < 5; i++)
            RANK_CHECK(ctx, all[r * 5 + i] == tr_hash((uint64_t)r, (uint64_t)i),
                       "allgather block %d", r);
    free(all);
    /* allgatherv: rank r sends r * 3 bytes */
    unsigned char blob[256];
    tr_fill_bytes(blob, sizeof blob, 77u + (uint64_t)me);
    void *got = NULL;
    size_t *lens = malloc((size_t)W * sizeof *lens);
    RANK_CHECK_OK(ctx, seldp_comm_allgatherv(ctx->world, blob, (size_t)me * 3, &got, lens));
    size_t at = 0;
    for (int r = 0; r < W; r++) {
        unsigned char e[256];
        tr_fill_bytes(e, sizeof e, 77u + (uint64_t)r);
        RANK_CHECK(ctx, lens[r] == (size_t)r * 3, "allgatherv length of %d: %zu", r, lens[r]);
        RANK_CHECK(ctx, !memcmp((unsigned char *)got + at, e, lens[r]), "allgatherv blob %d", r);
        at += lens[r];
    }
    free(got);
    free(lens);
    /* allgather_counts: rank r sends r % 3 + 1 floats, in place */
    size_t *counts = malloc((size_t)W * sizeof *counts), total = 0, off = 0;
    for (int r = 0; r < W; r++) {
        counts[r] = (size_t)(r % 3) + 1;
        if (r < me)
            off += counts[r];
        total += counts[r];
    }
    float *v = calloc(total, sizeof *v);
    for (size_t i = 0; i < counts[me]; i++)
        v[off + i] = (float)(me * 10 + (int)i);
    RANK_CHECK_OK(ctx, seldp_comm_allgather_counts(ctx->world, v + off, v, counts, SELDP_F32,
                                                   SELDP_HOST_DEVICE));
    at = 0;
    for (int r = 0; r < W; r++)
        for (size_t i = 0; i < counts[r]; i++, at++)
            RANK_CHECK(ctx, v[at] == (float)(r * 10 + (int)i), "allgather_counts %d[%zu]", r, i);
    free(v);
    free(counts);
    /* alltoallv: rank s sends (s + d) % 4 values s * 1000 + d to rank d, in reverse order of
     * the destinations in its buffer */
    size_t *sc = calloc((size_t)W, sizeof *sc), *sd = calloc((size_t)W, sizeof *sd),
           *rc = calloc((size_t)W, sizeof *rc), *rd = calloc((size_t)W, sizeof *rd);
    size_t stot = 0, rtot = 0;
    for (int d = W - 1; d >= 0; d--) {
        sc[d] = (size_t)((me + d) % 4);
        sd[d] = stot;
        stot += sc[d];
    }
    for (int s = 0; s < W; s++) {
        rc[s] = (size_t)((s + me) % 4);
        rd[s] = rtot;
        rtot += rc[s];
    }
    int32_t *sb = malloc((stot + 1) * sizeof *sb), *rb = malloc((rtot + 1) * sizeof *rb);
    for (int d = 0; d < W; d++)
        for (size_t i = 0; i < sc[d]; i++)
            sb[sd[d] + i] = me * 1000 + d;
    RANK_CHECK_OK(ctx, seldp_comm_alltoallv(ctx->world, sb, sc, sd, rb, rc, rd, SELDP_I32,
                                            SELDP_HOST_DEVICE));
    for (int s = 0; s < W; s++)
        for (size_t i = 0; i < rc[s]; i++)
            RANK_CHECK(ctx, rb[rd[s] + i] == s * 1000 + me, "alltoallv from %d: %d", s,
                       (int)rb[rd[s] + i]);
    free(sb);
    free(rb);
    free(sc);
    free(sd);
    free(rc);
    free(rd);
    RANK_CHECK_OK(ctx, seldp_comm_barrier(ctx->world));
    return 0;
}

static void test_moves(void **state)
{
    (void)state;
    ht_run(threads, T_S, moves_rank, NULL);
}

/* the sum over the group of ranks (world ranks `members`, in group order) of input_of */
static int check_group_sum(tr_rank_ctx *ctx, seldp_comm *g, const char *what)
{
    int n = seldp_comm_size(g);
    int *members = malloc((size_t)n * sizeof *members);
    int wr = seldp_comm_world_rank(g);
    RANK_CHECK_OK(ctx, seldp_comm_allgather(g, &wr, members, sizeof wr, SELDP_HOST_DEVICE));
    RANK_CHECK(ctx, members[seldp_comm_rank(g)] == ctx->rank, "%s: world rank", what);
    enum { N = 513 };
    float x[N], y[N], ref[N], tmp[N];
    input_of(ctx->rank, x, N);
    RANK_CHECK_OK(ctx, seldp_comm_allreduce(g, x, y, N, SELDP_F32, SELDP_HOST_DEVICE));
    input_of(members[0], ref, N);
    for (int r = 1; r < n; r++) {
        input_of(members[r], tmp, N);
        for (int i = 0; i < N; i++)
            ref[i] += tmp[i];
    }
    free(members);
    RANK_CHECK(ctx, !memcmp(y, ref, sizeof y), "%s: allreduce differs", what);
    return 0;
}

static int split_rank(tr_rank_ctx *ctx)
{
    int W = ctx->size, me = ctx->rank;
    seldp_comm *across = NULL, *inside = NULL, *nested = NULL, *none = NULL;
    /* across processes, ordered backwards */
    RANK_CHECK_OK(ctx, seldp_comm_split(ctx->world, me % 2, -me, &across));
    RANK_CHECK(ctx, across && seldp_comm_size(across) == (W - me % 2 + 1) / 2,
               "split across: size %d", across ? seldp_comm_size(across) : -1);
    if (check_group_sum(ctx, across, "across"))
        return 1;
    /* inside the process */
    RANK_CHECK_OK(ctx, seldp_comm_split(ctx->world, me / threads, me, &inside));
    RANK_CHECK(ctx, seldp_comm_size(inside) == threads, "split inside: size %d",
               seldp_comm_size(inside));
    if (check_group_sum(ctx, inside, "inside"))
        return 1;
    /* nested: split the across group in halves, rank 0 out */
    int color = seldp_comm_rank(across) == 0 ? SELDP_COMM_NO_GROUP : seldp_comm_rank(across) % 2;
    RANK_CHECK_OK(ctx, seldp_comm_split(across, color, 0, &nested));
    if (color == SELDP_COMM_NO_GROUP)
        RANK_CHECK(ctx, nested == NULL, "no group, but a communicator");
    else if (check_group_sum(ctx, nested, "nested"))
        return 1;
    RANK_CHECK_OK(ctx, seldp_comm_split(ctx->world, SELDP_COMM_NO_GROUP, 0, &none));
    RANK_CHECK(ctx, none == NULL, "no group, but a communicator");
    seldp_comm_destroy(nested);
    seldp_comm_destroy(inside);
    seldp_comm_destroy(across);
    /* the world still works */
    return check_group_sum(ctx, ctx->world, "world after splits");
}

static void test_split(void **state)
{
    (void)state;
    ht_run(threads, T_S, split_rank, NULL);
}

/* the last rank (in another process than rank 0) calls with another count: every rank of
 * every process returns SELDP_ERR_DISAGREE, and the world stays usable */
static int disagree_rank(tr_rank_ctx *ctx)
{
    float x[8] = {0}, y[8];
    size_t n = ctx->rank == ctx->size - 1 ? 7 : 8;
    seldp_status st = seldp_comm_allreduce(ctx->world, x, y, n, SELDP_F32, SELDP_HOST_DEVICE);
    RANK_CHECK(ctx, st == SELDP_ERR_DISAGREE, "count mismatch returned %s: %s",
               seldp_status_name(st), seldp_last_error());
    /* a different collective inside one process */
    if (ctx->rank == 1)
        st = seldp_comm_barrier(ctx->world);
    else
        st = seldp_comm_allreduce(ctx->world, x, y, 8, SELDP_F32, SELDP_HOST_DEVICE);
    RANK_CHECK(ctx, st == SELDP_ERR_DISAGREE, "call mismatch returned %s: %s",
               seldp_status_name(st), seldp_last_error());
    return check_group_sum(ctx, ctx->world, "world after disagreements");
}

static void test_disagree(void **state)
{
    (void)state;
    ht_run(threads, T_S, disagree_rank, NULL);
}

int main(int argc, char **argv)
{
    const char *env = getenv("SELDP_HYBRID_THREADS");
    if (env && atoi(env) > 0)
        threads = atoi(env);
    const struct CMUnitTest tests[] = {
        MT_TEST(test_allreduce), MT_TEST(test_reduce_scatter), MT_TEST(test_moves),
        MT_TEST(test_split),     MT_TEST(test_disagree),
    };
    return ht_main(argc, argv, "hybrid_collectives", tests, sizeof tests / sizeof *tests);
}
