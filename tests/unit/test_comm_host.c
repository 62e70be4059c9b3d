/* host-staged communicator: every collective and dtype with 1, 2, 3, 4 and 8 ranks,
 * bit-identical reductions in a fixed order, argument checks, disagreeing ranks, stats. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "ranks.h"
#include "seldp/seldp.h"

#define MAX_RANKS 32
#define TIMEOUT_S 60.0

static const int rank_counts[] = {1, 2, 3, 4, 8};
#define N_RANK_COUNTS (sizeof rank_counts / sizeof rank_counts[0])

typedef struct shared {
    atomic_int counter;
    uint64_t digest[MAX_RANKS]; /* written by each rank, compared on the main thread */
} shared;

/* FNV-1a over bytes, continuing from h. */
static uint64_t digest_bytes(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

static uint64_t seed_of(int rank, int a, int b, int c)
{
    return ((uint64_t)rank << 48) ^ ((uint64_t)a << 32) ^ ((uint64_t)b << 16) ^ (uint64_t)c;
}

static void run_all_sizes(tr_rank_fn fn, bool check_digests)
{
    for (size_t i = 0; i < N_RANK_COUNTS; i++) {
        shared sh;
        memset(&sh, 0, sizeof sh);
        atomic_init(&sh.counter, 0);
        tr_run_ranks(rank_counts[i], TIMEOUT_S, fn, &sh);
        for (int r = 1; check_digests && r < rank_counts[i]; r++)
            if (sh.digest[r] != sh.digest[0])
                fail_msg("%d ranks: rank %d's results differ from rank 0's (digest %016llx vs "
                         "%016llx)",
                         rank_counts[i], r, (unsigned long long)sh.digest[r],
                         (unsigned long long)sh.digest[0]);
    }
}

/* ---- barrier ------------------------------------------------------------------------ */

static int barrier_rank(tr_rank_ctx *ctx)
{
    shared *sh = ctx->arg;
    for (int round = 1; round <= 20; round++) {
        atomic_fetch_add(&sh->counter, 1);
        RANK_CHECK_OK(ctx, seldp_comm_barrier(ctx->world));
        /* Nobody leaves a barrier before everyone entered it. */
        int seen = atomic_load(&sh->counter);
        RANK_CHECK(ctx, seen >= round * ctx->size, "round %d: counter %d after the barrier", round,
                   seen);
        RANK_CHECK_OK(ctx, seldp_comm_barrier(ctx->world));
    }
    return 0;
}

static void test_barrier(void **state)
{
    (void)state;
    run_all_sizes(barrier_rank, false);
}

/* ---- broadcast ------------------------------------------------------------------------ */

static int broadcast_rank(tr_rank_ctx *ctx)
{
    const size_t counts[] = {0, 1, 5, 1000};
    unsigned char *buf = malloc(8 * 1000), *want = malloc(8 * 1000);
    RANK_CHECK(ctx, buf && want, "out of memory");
    for (int d = 0; d < SELDP_DTYPE_COUNT; d++) {
        size_t esize = seldp_dtype_size((seldp_dtype)d);
        for (int root = 0; root < ctx->size; root++) {
            for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++) {
                size_t bytes = counts[c] * esize;
                /* Random bytes include NaN patterns: they must travel unchanged. */
                tr_fill_bytes(buf, bytes, seed_of(ctx->rank, d, root, (int)c));
                tr_fill_bytes(want, bytes, seed_of(root, d, root, (int)c));
                RANK_CHECK_OK(ctx, seldp_comm_broadcast(ctx->world, buf, counts[c], (seldp_dtype)d,
                                                        root, SELDP_HOST_DEVICE));
                size_t at = tr_first_diff(buf, want, bytes);
                RANK_CHECK(ctx, at == bytes, "%s x %zu from root %d: byte %zu differs",
                           seldp_dtype_name((seldp_dtype)d), counts[c], root, at);
            }
        }
    }
    free(buf);
    free(want);
    return 0;
}

static void test_broadcast(void **state)
{
    (void)state;
    run_all_sizes(broadcast_rank, false);
}

/* ---- allreduce ------------------------------------------------------------------------ */

/* Rank r's input for one case: values of very different magnitudes, so that a different
 * summation order would give a different float result. */
static void fill_input(void *x, seldp_dtype dtype, size_t n, uint64_t seed)
{
    for (size_t i = 0; i < n; i++) {
        uint64_t h = tr_hash(seed, i);
        double v =
            ((double)(h >> 11) / (double)(1ull << 53) - 0.5) * ldexp(1.0, (int)(h % 40) - 20);
        switch (dtype) {
        case SELDP_F32:
            ((float *)x)[i] = (float)v;
            break;
        case SELDP_F64:
            ((double *)x)[i] = v;
            break;
        /* Large values, so that the sums wrap around 64 bits. */
        case SELDP_I64:
        case SELDP_U64:
            ((uint64_t *)x)[i] = h;
            break;
        default:
            break;
        }
    }
}

/* The sum in rank order 0, 1, ..., P-1, the order every rank must get. */
static void reference_sum(void *acc, const void *in, seldp_dtype dtype, size_t n, bool first)
{
    for (size_t i = 0; i < n; i++) {
        switch (dtype) {
        case SELDP_F32:
            ((float *)acc)[i] =
                first ? ((const float *)in)[i] : ((float *)acc)[i] + ((const float *)in)[i];
            break;
        case SELDP_F64:
            ((double *)acc)[i] =
                first ? ((const double *)in)[i] : ((double *)acc)[i] + ((const double *)in)[i];
            break;
        default:
            ((uint64_t *)acc)[i] = first ? ((const uint64_t *)in)[i]
                                         : ((uint64_t *)acc)[i] + ((const uint64_t *)in)[i];
            break;
        }
    }
}

static int allreduce_rank(tr_rank_ctx *ctx)
{
    shared *sh = ctx->arg;
    const seldp_dtype dtypes[] = {SELDP_F32, SELDP_F64, SELDP_I64, SELDP_U64};
    const size_t counts[] = {0, 1, 3, 17, 1000, 4099};
    enum { MAXN = 4099 };
    /* One spare element after recv tells whether anything was written past the end. */
    uint64_t *send = malloc(MAXN * 8), *recv = malloc((MAXN + 1) * 8), *other = malloc(MAXN * 8),
             *want = malloc(MAXN * 8);
    RANK_CHECK(ctx, send && recv && other && want, "out of memory");
    uint64_t digest = 0xcbf29ce484222325ull;
    for (size_t d = 0; d < 4; d++) {
        for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++) {
            for (int in_place = 0; in_place < 2; in_place++) {
                seldp_dtype dt = dtypes[d];
                size_t n = counts[c], bytes = n * seldp_dtype_size(dt);
                for (int r = 0; r < ctx->size; r++) {
                    fill_input(other, dt, n, seed_of(r, (int)d, (int)c, in_place));
                    reference_sum(want, other, dt, n, r == 0);
                }
                fill_input(send, dt, n, seed_of(ctx->rank, (int)d, (int)c, in_place));
                memset(recv, 0xab, (MAXN + 1) * 8);
                void *out = in_place ? (void *)send : (void *)recv;
                RANK_CHECK_OK(
                    ctx, seldp_comm_allreduce(ctx->world, send, out, n, dt, SELDP_HOST_DEVICE));
                size_t at = tr_first_diff(out, want, bytes);
                RANK_CHECK(ctx, at == bytes,
                           "%s x %zu (%s): byte %zu differs from the rank-order sum",
                           seldp_dtype_name(dt), n, in_place ? "in place" : "out of place", at);
                if (!in_place) {
                    /* The send buffer is left alone and nothing is written past the end. */
                    uint64_t *again = other;
                    fill_input(again, dt, n, seed_of(ctx->rank, (int)d, (int)c, in_place));
                    RANK_CHECK(ctx, memcmp(send, again, bytes) == 0, "send buffer changed");
                    RANK_CHECK(ctx, ((unsigned char *)recv)[bytes] == 0xab,
                               "allreduce wrote past %zu bytes", bytes);
                }
                digest = digest_bytes(digest, out, bytes);
            }
        }
    }
    sh->digest[ctx->rank] = digest;
    free(send);
    free(recv);
    free(other);
    free(want);
    return 0;
}

static void test_allreduce(void **state)
{
    (void)state;
    run_all_sizes(allreduce_rank, true);
}

/* Exact F32 values: the sum is known in closed form whatever the order. */
static int allreduce_exact_rank(tr_rank_ctx *ctx)
{
    enum { N = 777 };
    float x[N];
    for (int i = 0; i < N; i++)
        x[i] = (float)(ctx->rank + 1) * (float)(i % 11) - 3.0f;
    RANK_CHECK_OK(ctx, seldp_comm_allreduce(ctx->world, x, x, N, SELDP_F32, SELDP_HOST_DEVICE));
    float ranks_sum = (float)(ctx->size * (ctx->size + 1) / 2);
    for (int i = 0; i < N; i++)
        RANK_CHECK(ctx, x[i] == ranks_sum * (float)(i % 11) - 3.0f * (float)ctx->size, "x[%d] = %g",
                   i, (double)x[i]);
    int64_t v = ctx->rank % 2 ? -(int64_t)ctx->rank : (int64_t)ctx->rank * 1000;
    RANK_CHECK_OK(ctx, seldp_comm_allreduce(ctx->world, &v, &v, 1, SELDP_I64, SELDP_HOST_DEVICE));
    int64_t want = 0;
    for (int r = 0; r < ctx->size; r++)
        want += r % 2 ? -(int64_t)r : (int64_t)r * 1000;
    RANK_CHECK(ctx, v == want, "i64 sum %lld, expected %lld", (long long)v, (long long)want);
    return 0;
}

static void test_allreduce_exact(void **state)
{
    (void)state;
    run_all_sizes(allreduce_exact_rank, false);
}

/* ---- allgather, allgatherv ------------------------------------------------------------ */

static int allgather_rank(tr_rank_ctx *ctx)
{
    const size_t sizes[] = {0, 1, 13, 4096};
    int p = ctx->size;
    unsigned char *send = malloc(4096), *recv = malloc(4096 * (size_t)p + 1), *want = malloc(4096);
    RANK_CHECK(ctx, send && recv && want, "out of memory");
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        size_t b = sizes[s];
        for (int in_place = 0; in_place < 2; in_place++) {
            memset(recv, 0xcd, 4096 * (size_t)p + 1);
            unsigned char *mine = in_place ? recv + (size_t)ctx->rank * b : send;
            tr_fill_bytes(mine, b, seed_of(ctx->rank, 1, (int)s, 0));
            RANK_CHECK_OK(ctx, seldp_comm_allgather(ctx->world, mine, recv, b, SELDP_HOST_DEVICE));
            for (int r = 0; r < p; r++) {
                tr_fill_bytes(want, b, seed_of(r, 1, (int)s, 0));
                size_t at = tr_first_diff(recv + (size_t)r * b, want, b);
                RANK_CHECK(ctx, at == b, "%zu bytes (%s): rank %d's block differs at byte %zu", b,
                           in_place ? "in place" : "out of place", r, at);
            }
            RANK_CHECK(ctx, recv[b * (size_t)p] == 0xcd, "allgather wrote past the end");
        }
    }
    free(send);
    free(recv);
    free(want);
    return 0;
}

static void test_allgather(void **state)
{
    (void)state;
    run_all_sizes(allgather_rank, false);
}

static int allgatherv_rank(tr_rank_ctx *ctx)
{
    unsigned char send[64], want[64];
    size_t lens[MAX_RANKS];
    for (int iter = 0; iter < 4; iter++) {
        size_t len = (size_t)(ctx->rank * 37 + iter * 11) % 50; /* includes empty blobs */
        tr_fill_bytes(send, len, seed_of(ctx->rank, 2, iter, 0));
        void *blob = NULL;
        RANK_CHECK_OK(ctx, seldp_comm_allgatherv(ctx->world, len ? send : NULL, len, &blob, lens));
        RANK_CHECK(ctx, blob != NULL, "allgatherv returned no block");
        size_t at = 0;
        for (int r = 0; r < ctx->size; r++) {
            size_t l = (size_t)(r * 37 + iter * 11) % 50;
            RANK_CHECK(ctx, lens[r] == l, "iteration %d: rank %d's length %zu, expected %zu", iter,
                       r, lens[r], l);
            tr_fill_bytes(want, l, seed_of(r, 2, iter, 0));
            RANK_CHECK(ctx, memcmp((unsigned char *)blob + at, want, l) == 0,
                       "iteration %d: rank %d's blob differs", iter, r);
            at += l;
        }
        free(blob);
    }
    return 0;
}

static void test_allgatherv(void **state)
{
    (void)state;
    run_all_sizes(allgatherv_rank, false);
}

/* ---- alltoallv ------------------------------------------------------------------------ */

static size_t a2a_count(int from, int to, int iter)
{
    return (size_t)(from * 3 + to * 5 + iter) % 7; /* some pieces are empty */
}

static int alltoallv_rank(tr_rank_ctx *ctx)
{
    int p = ctx->size, me = ctx->rank;
    size_t scount[MAX_RANKS], sdispl[MAX_RANKS], rcount[MAX_RANKS], rdispl[MAX_RANKS];
    int32_t send[MAX_RANKS * 9], recv[MAX_RANKS * 9];
    double dsend[MAX_RANKS * 9], drecv[MAX_RANKS * 9];
    for (int iter = 0; iter < 3; iter++) {
        /* Send pieces in reverse rank order with one-element gaps; receive in rank order
         * with two-element gaps that must stay untouched. */
        size_t at = 0;
        for (int q = p - 1; q >= 0; q--) {
            scount[q] = a2a_count(me, q, iter);
            sdispl[q] = at;
            at += scount[q] + 1;
        }
        at = 0;
        for (int q = 0; q < p; q++) {
            rcount[q] = a2a_count(q, me, iter);
            rdispl[q] = at;
            at += rcount[q] + 2;
        }
        size_t rtotal = at;
        for (int q = 0; q < p; q++)
            for (size_t i = 0; i < scount[q]; i++) {
                send[sdispl[q] + i] = me * 1000000 + q * 1000 + (int)i;
                dsend[sdispl[q] + i] = -0.5 * (me * 1000000 + q * 1000 + (int)i);
            }
        for (size_t i = 0; i < rtotal; i++) {
            recv[i] = -1;
            drecv[i] = 1e300;
        }
        RANK_CHECK_OK(ctx, seldp_comm_alltoallv(ctx->world, send, scount, sdispl, recv, rcount,
                                                rdispl, SELDP_I32, SELDP_HOST_DEVICE));
        RANK_CHECK_OK(ctx, seldp_comm_alltoallv(ctx->world, dsend, scount, sdispl, drecv, rcount,
                                                rdispl, SELDP_F64, SELDP_HOST_DEVICE));
        for (int q = 0; q < p; q++) {
            for (size_t i = 0; i < rcount[q]; i++) {
                int want = q * 1000000 + me * 1000 + (int)i;
                RANK_CHECK(ctx, recv[rdispl[q] + i] == want,
                           "iteration %d: element %zu from rank %d is %d, expected %d", iter, i, q,
                           recv[rdispl[q] + i], want);
                RANK_CHECK(ctx, drecv[rdispl[q] + i] == -0.5 * want, "f64 element %zu from %d", i,
                           q);
            }
            for (size_t g = rdispl[q] + rcount[q]; g < rdispl[q] + rcount[q] + 2; g++)
                RANK_CHECK(ctx, recv[g] == -1 && drecv[g] == 1e300, "gap element %zu written", g);
        }
    }
    return 0;
}

static void test_alltoallv(void **state)
{
    (void)state;
    run_all_sizes(alltoallv_rank, false);
}

/* ---- many collectives back to back ------------------------------------------------------ */

static int sequence_rank(tr_rank_ctx *ctx)
{
    for (int i = 0; i < 300; i++) {
        switch (i % 4) {
        case 0: {
            uint64_t v = (uint64_t)(ctx->rank + i);
            RANK_CHECK_OK(
                ctx, seldp_comm_allreduce(ctx->world, &v, &v, 1, SELDP_U64, SELDP_HOST_DEVICE));
            uint64_t want = (uint64_t)(ctx->size * (ctx->size - 1) / 2 + ctx->size * i);
            RANK_CHECK(ctx, v == want, "step %d: sum %llu, expected %llu", i, (unsigned long long)v,
                       (unsigned long long)want);
            break;
        }
        case 1: {
            int root = i % ctx->size, v = ctx->rank == root ? i * 7 : -1;
            RANK_CHECK_OK(
                ctx, seldp_comm_broadcast(ctx->world, &v, 1, SELDP_I32, root, SELDP_HOST_DEVICE));
            RANK_CHECK(ctx, v == i * 7, "step %d: broadcast gave %d", i, v);
            break;
        }
        case 2:
            RANK_CHECK_OK(ctx, seldp_comm_barrier(ctx->world));
            break;
        default: {
            int32_t mine = ctx->rank * i, all[MAX_RANKS];
            RANK_CHECK_OK(
                ctx, seldp_comm_allgather(ctx->world, &mine, all, sizeof mine, SELDP_HOST_DEVICE));
            for (int r = 0; r < ctx->size; r++)
                RANK_CHECK(ctx, all[r] == r * i, "step %d: allgather slot %d", i, r);
        }
        }
    }
    return 0;
}

static void test_sequence(void **state)
{
    (void)state;
    run_all_sizes(sequence_rank, false);
}

/* More ranks than cores, a larger reduction. */
static void test_many_ranks(void **state)
{
    (void)state;
    shared sh;
    memset(&sh, 0, sizeof sh);
    tr_run_ranks(MAX_RANKS, TIMEOUT_S, allreduce_exact_rank, &sh);
    tr_run_ranks(MAX_RANKS, TIMEOUT_S, sequence_rank, &sh);
}

/* ---- argument checks, disagreement, stats ----------------------------------------------- */

#define RANK_CHECK_FAILS(ctx, call, status, needle)                                                \
    do {                                                                                           \
        seldp_clear_error();                                                                       \
        seldp_status got_ = (call);                                                                \
        RANK_CHECK(ctx, got_ == (status), "%s returned %s, expected %s", #call,                    \
                   seldp_status_name(got_), seldp_status_name(status));                            \
        RANK_CHECK(ctx, strstr(seldp_last_error(), needle) != NULL, "%s: message '%s' lacks '%s'", \
                   #call, seldp_last_error(), needle);                                             \
    } while (0)

static int arguments_rank(tr_rank_ctx *ctx)
{
    seldp_comm *w = ctx->world;
    seldp_device host = SELDP_HOST_DEVICE;
    float x[4] = {0};
    char expect[128];
    snprintf(expect, sizeof expect, "rank %d: broadcast root %d is outside the group of %d ranks",
             ctx->rank, ctx->size + 1, ctx->size);
    RANK_CHECK_FAILS(ctx, seldp_comm_broadcast(w, x, 4, SELDP_F32, ctx->size + 1, host),
                     SELDP_ERR_INVALID_ARGUMENT, expect);
    RANK_CHECK_FAILS(ctx, seldp_comm_broadcast(w, x, 4, SELDP_F32, -1, host),
                     SELDP_ERR_INVALID_ARGUMENT, "outside the group");
    RANK_CHECK_FAILS(ctx, seldp_comm_broadcast(w, NULL, 4, SELDP_F32, 0, host),
                     SELDP_ERR_INVALID_ARGUMENT, "NULL");
    RANK_CHECK_FAILS(ctx, seldp_comm_broadcast(w, x, SIZE_MAX / 2, SELDP_F32, 0, host),
                     SELDP_ERR_INVALID_ARGUMENT, "overflow");
    RANK_CHECK_FAILS(ctx, seldp_comm_broadcast(w, x, 4, (seldp_dtype)40, 0, host), SELDP_ERR_DTYPE,
                     "dtype");
    RANK_CHECK_FAILS(ctx, seldp_comm_broadcast(NULL, x, 4, SELDP_F32, 0, host),
                     SELDP_ERR_INVALID_ARGUMENT, "NULL");
    const seldp_dtype no_sum[] = {SELDP_F16, SELDP_BF16, SELDP_I32, SELDP_U8, SELDP_BOOL};
    for (size_t i = 0; i < sizeof no_sum / sizeof no_sum[0]; i++)
        RANK_CHECK_FAILS(ctx, seldp_comm_allreduce(w, x, x, 2, no_sum[i], host), SELDP_ERR_DTYPE,
                         seldp_dtype_name(no_sum[i]));
    RANK_CHECK_FAILS(ctx, seldp_comm_allreduce(w, NULL, x, 2, SELDP_F32, host),
                     SELDP_ERR_INVALID_ARGUMENT, "send");
    RANK_CHECK_FAILS(ctx, seldp_comm_allreduce(w, x, NULL, 2, SELDP_F32, host),
                     SELDP_ERR_INVALID_ARGUMENT, "receive");
    RANK_CHECK_FAILS(ctx, seldp_comm_allreduce(w, x, x, SIZE_MAX / 4, SELDP_F64, host),
                     SELDP_ERR_INVALID_ARGUMENT, "overflow");
    seldp_device bogus = {(seldp_device_kind)9, 0};
    RANK_CHECK_FAILS(ctx, seldp_comm_allreduce(w, x, x, 2, SELDP_F32, bogus),
                     SELDP_ERR_INVALID_ARGUMENT, "device");
    RANK_CHECK_FAILS(ctx, seldp_comm_allgather(w, x, NULL, 4, host), SELDP_ERR_INVALID_ARGUMENT,
                     "receive");
    RANK_CHECK_FAILS(ctx, seldp_comm_allgather(w, x, x, SIZE_MAX / 2 + 1, host),
                     ctx->size > 1 ? SELDP_ERR_INVALID_ARGUMENT : SELDP_OK,
                     ctx->size > 1 ? "overflow" : "");
    void *blob = NULL;
    size_t lens[MAX_RANKS];
    RANK_CHECK_FAILS(ctx, seldp_comm_allgatherv(w, x, 4, NULL, lens), SELDP_ERR_INVALID_ARGUMENT,
                     "recv");
    RANK_CHECK_FAILS(ctx, seldp_comm_allgatherv(w, NULL, 4, &blob, lens),
                     SELDP_ERR_INVALID_ARGUMENT, "NULL");
    size_t counts[MAX_RANKS] = {0}, displs[MAX_RANKS] = {0};
    RANK_CHECK_FAILS(ctx,
                     seldp_comm_alltoallv(w, x, NULL, displs, x, counts, displs, SELDP_F32, host),
                     SELDP_ERR_INVALID_ARGUMENT, "counts");
    counts[0] = SIZE_MAX / 2;
    RANK_CHECK_FAILS(ctx,
                     seldp_comm_alltoallv(w, x, counts, displs, x, counts, displs, SELDP_F32, host),
                     SELDP_ERR_INVALID_ARGUMENT, "overflow");
    counts[0] = 1;
    RANK_CHECK_FAILS(
        ctx, seldp_comm_alltoallv(w, NULL, counts, displs, x, counts, displs, SELDP_F32, host),
        SELDP_ERR_INVALID_ARGUMENT, "send");
    seldp_comm *sub = (seldp_comm *)x;
    RANK_CHECK_FAILS(ctx, seldp_comm_split(w, -2, 0, &sub), SELDP_ERR_INVALID_ARGUMENT, "color");
    RANK_CHECK(ctx, sub == NULL, "split left *out set on failure");
    RANK_CHECK_FAILS(ctx, seldp_comm_split(w, 0, 0, NULL), SELDP_ERR_INVALID_ARGUMENT, "out");
    RANK_CHECK_FAILS(ctx, seldp_comm_barrier(NULL), SELDP_ERR_INVALID_ARGUMENT, "NULL");
    /* None of those entered the transport: the ranks are still in step. */
    seldp_comm_stats st = seldp_comm_get_stats(w);
    RANK_CHECK(ctx,
               st.broadcasts + st.allreduces + st.alltoallvs + st.splits + st.barriers == 0 &&
                   st.allgathers == (ctx->size == 1 ? 1u : 0u),
               "rejected calls were counted");
    RANK_CHECK_OK(ctx, seldp_comm_barrier(w));
    return 0;
}

static void test_argument_checks(void **state)
{
    (void)state;
    run_all_sizes(arguments_rank, false);
}

static int disagree_rank(tr_rank_ctx *ctx)
{
    seldp_comm *w = ctx->world;
    seldp_device host = SELDP_HOST_DEVICE;
    int v = 0;
    double d[4] = {0};
    /* Different roots. */
    RANK_CHECK_FAILS(ctx, seldp_comm_broadcast(w, &v, 1, SELDP_I32, ctx->rank == 0 ? 0 : 1, host),
                     SELDP_ERR_DISAGREE, "root");
    /* Different collectives at the same point. */
    seldp_status got =
        ctx->rank == 1 ? seldp_comm_allreduce(w, d, d, 4, SELDP_F64, host) : seldp_comm_barrier(w);
    RANK_CHECK(ctx, got == SELDP_ERR_DISAGREE, "mixed collectives returned %s",
               seldp_status_name(got));
    RANK_CHECK(ctx,
               strstr(seldp_last_error(),
                      ctx->rank == 1 ? "rank 0 called barrier" : "rank 1 called allreduce") != NULL,
               "message: %s", seldp_last_error());
    /* Different counts. */
    RANK_CHECK_FAILS(ctx, seldp_comm_allreduce(w, d, d, ctx->rank ? 4 : 3, SELDP_F64, host),
                     SELDP_ERR_DISAGREE, "elements");
    /* Mismatched alltoallv counts: rank 0 sends 1 element to rank 1, which expects 2. */
    size_t sc[MAX_RANKS] = {0}, rc[MAX_RANKS] = {0}, z[MAX_RANKS] = {0};
    if (ctx->rank == 0)
        sc[1] = 1;
    if (ctx->rank == 1)
        rc[0] = 2;
    RANK_CHECK_FAILS(ctx, seldp_comm_alltoallv(w, d, sc, z, d, rc, z, SELDP_F64, host),
                     SELDP_ERR_DISAGREE, "alltoallv");
    /* Split against a barrier. */
    seldp_comm *sub = NULL;
    got = ctx->rank == 0 ? seldp_comm_split(w, 0, 0, &sub) : seldp_comm_barrier(w);
    RANK_CHECK(ctx, got == SELDP_ERR_DISAGREE && sub == NULL, "split vs barrier returned %s",
               seldp_status_name(got));
    /* Disagreement does not abort the world. */
    RANK_CHECK_OK(ctx, seldp_comm_allreduce(w, d, d, 4, SELDP_F64, host));
    RANK_CHECK_OK(ctx, seldp_comm_split(w, 0, 0, &sub));
    RANK_CHECK_OK(ctx, seldp_comm_barrier(sub));
    seldp_comm_destroy(sub);
    return 0;
}

static void test_disagreement(void **state)
{
    (void)state;
    for (size_t i = 1; i < N_RANK_COUNTS; i++)
        tr_run_ranks(rank_counts[i], TIMEOUT_S, disagree_rank, NULL);
}

static int stats_rank(tr_rank_ctx *ctx)
{
    seldp_comm *w = ctx->world;
    seldp_device host = SELDP_HOST_DEVICE;
    RANK_CHECK(ctx, strcmp(seldp_comm_transport(w), "host") == 0, "transport %s",
               seldp_comm_transport(w));
    RANK_CHECK(ctx, seldp_comm_rank(w) == ctx->rank && seldp_comm_world_rank(w) == ctx->rank,
               "rank %d world rank %d", seldp_comm_rank(w), seldp_comm_world_rank(w));
    RANK_CHECK(ctx, seldp_comm_device(w).kind == SELDP_DEVICE_HOST, "device");
    float f[10] = {0};
    double d[3] = {0};
    unsigned char b[5 * MAX_RANKS] = {0};
    RANK_CHECK_OK(ctx, seldp_comm_barrier(w));
    RANK_CHECK_OK(ctx, seldp_comm_barrier(w));
    RANK_CHECK_OK(ctx, seldp_comm_broadcast(w, f, 10, SELDP_F32, 0, host));
    RANK_CHECK_OK(ctx, seldp_comm_allreduce(w, d, d, 3, SELDP_F64, host));
    RANK_CHECK_OK(ctx, seldp_comm_allgather(w, b + 5 * ctx->rank, b, 5, host));
    void *blob = NULL;
    size_t lens[MAX_RANKS];
    RANK_CHECK_OK(ctx, seldp_comm_allgatherv(w, b, 7, &blob, lens));
    free(blob);
    size_t one[MAX_RANKS], displs[MAX_RANKS];
    for (int r = 0; r < ctx->size; r++) {
        one[r] = 1;
        displs[r] = (size_t)r;
    }
    RANK_CHECK_OK(
        ctx, seldp_comm_alltoallv(w, b, one, displs, b + MAX_RANKS, one, displs, SELDP_U8, host));
    seldp_comm *sub = NULL;
    RANK_CHECK_OK(ctx, seldp_comm_split(w, 0, 0, &sub));
    seldp_comm_stats st = seldp_comm_get_stats(w);
    RANK_CHECK(ctx,
               st.barriers == 2 && st.broadcasts == 1 && st.allreduces == 1 && st.allgathers == 2 &&
                   st.alltoallvs == 1 && st.splits == 1,
               "counts %llu %llu %llu %llu %llu %llu", (unsigned long long)st.barriers,
               (unsigned long long)st.broadcasts, (unsigned long long)st.allreduces,
               (unsigned long long)st.allgathers, (unsigned long long)st.alltoallvs,
               (unsigned long long)st.splits);
    uint64_t bytes = 40 + 24 + 5 + 7 + (uint64_t)ctx->size;
    RANK_CHECK(ctx, st.bytes == bytes, "bytes %llu, expected %llu", (unsigned long long)st.bytes,
               (unsigned long long)bytes);
    seldp_comm_stats fresh = seldp_comm_get_stats(sub);
    RANK_CHECK(ctx, fresh.barriers + fresh.splits + fresh.bytes == 0, "split comm counts anew");
    RANK_CHECK_OK(ctx, seldp_comm_barrier(sub));
    RANK_CHECK(ctx, seldp_comm_get_stats(sub).barriers == 1, "sub barrier count");
    RANK_CHECK(ctx, seldp_comm_get_stats(w).barriers == 2, "world barrier count moved");
    seldp_comm_destroy(sub);
    return 0;
}

static void test_stats_and_queries(void **state)
{
    (void)state;
    run_all_sizes(stats_rank, false);
    assert_int_equal(seldp_comm_rank(NULL), -1);
    assert_int_equal(seldp_comm_size(NULL), 0);
    seldp_comm_abort(NULL);
    seldp_comm_destroy(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_barrier),      cmocka_unit_test(test_broadcast),
        cmocka_unit_test(test_allreduce),    cmocka_unit_test(test_allreduce_exact),
        cmocka_unit_test(test_allgather),    cmocka_unit_test(test_allgatherv),
        cmocka_unit_test(test_alltoallv),    cmocka_unit_test(test_sequence),
        cmocka_unit_test(test_many_ranks),   cmocka_unit_test(test_argument_checks),
        cmocka_unit_test(test_disagreement), cmocka_unit_test(test_stats_and_queries),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
