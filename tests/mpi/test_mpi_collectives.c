/* The MPI transport's collectives, one process per rank: every collective and dtype,
 * bit-identical deterministic sums (equal to the host transport's), messages cut into
 * pieces, splits with uneven, nested and absent groups, and disagreements that every
 * rank reports alike. */
#define _POSIX_C_SOURCE 200809L

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mpi_test.h"
#include "ranks.h"

#define TIMEOUT_S 10.0

static void assert_ok(seldp_status st)
{
    if (st != SELDP_OK)
        fail_msg("rank %d: %s: %s", mt_rank, seldp_status_name(st), seldp_last_error());
}

static void *xmalloc(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    assert_non_null(p);
    return p;
}

static void sleep_s(double s)
{
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

/* ---- basics --------------------------------------------------------------------- */

static void test_world_properties(void **state)
{
    (void)state;
    seldp_comm *world = mt_world(TIMEOUT_S);
    assert_int_equal(seldp_comm_rank(world), mt_rank);
    assert_int_equal(seldp_comm_size(world), mt_size);
    assert_int_equal(seldp_comm_world_rank(world), mt_rank);
    assert_string_equal(seldp_comm_transport(world), "mpi");
    assert_int_equal(seldp_comm_device(world).kind, SELDP_DEVICE_HOST);
    assert_ok(seldp_comm_barrier(world));
    assert_ok(seldp_comm_barrier(world));
    assert_int_equal(seldp_comm_get_stats(world).barriers, 2);

    seldp_comm_config bad = SELDP_COMM_CONFIG_INIT;
    bad.timeout_s = 0.0;
    seldp_comm *none = world;
    assert_int_equal(seldp_mpi_comm_init(MPI_COMM_WORLD, SELDP_HOST_DEVICE, &bad, &none),
                     SELDP_ERR_INVALID_ARGUMENT);
    assert_null(none);
    seldp_comm_config unsized = {0};
    unsized.timeout_s = 5.0;
    none = world;
    assert_int_equal(seldp_mpi_comm_init(MPI_COMM_WORLD, SELDP_HOST_DEVICE, &unsized, &none),
                     SELDP_ERR_INVALID_ARGUMENT);
    assert_null(none);
    assert_non_null(strstr(seldp_last_error(), "SELDP_COMM_CONFIG_INIT"));
    assert_int_equal(seldp_mpi_comm_init(MPI_COMM_NULL, SELDP_HOST_DEVICE, NULL, &none),
                     SELDP_ERR_INVALID_ARGUMENT);
    seldp_comm_destroy(world);
}

static void test_barrier_waits_for_the_last_rank(void **state)
{
    (void)state;
    seldp_comm *world = mt_world(TIMEOUT_S);
    assert_ok(seldp_comm_barrier(world));
    if (mt_rank == mt_size - 1)
        sleep_s(0.25);
    double t0 = mt_now();
    assert_ok(seldp_comm_barrier(world));
    double waited = mt_now() - t0;
    if (mt_rank != mt_size - 1 && waited < 0.15)
        fail_msg("rank %d left the barrier after %.3f s, before the last rank arrived", mt_rank,
                 waited);
    seldp_comm_destroy(world);
}

/* ---- broadcast ------------------------------------------------------------------ */

static void test_broadcast_every_dtype_and_root(void **state)
{
    (void)state;
    static const size_t counts[] = {0, 1, 1003};
    seldp_comm *world = mt_world(TIMEOUT_S);
    for (int dt = 0; dt < SELDP_DTYPE_COUNT; dt++) {
        size_t esize = seldp_dtype_size((seldp_dtype)dt);
        for (int root = 0; root < mt_size; root++) {
            for (size_t c = 0; c < sizeof counts / sizeof *counts; c++) {
                size_t bytes = counts[c] * esize;
                uint64_t seed = (uint64_t)(dt * 100 + root * 10) + c;
                unsigned char *buf = xmalloc(bytes), *want = xmalloc(bytes);
                tr_fill_bytes(want, bytes, seed);
                tr_fill_bytes(buf, bytes, mt_rank == root ? seed : seed + 7777);
                assert_ok(seldp_comm_broadcast(world, buf, counts[c], (seldp_dtype)dt, root,
                                               SELDP_HOST_DEVICE));
                size_t at = tr_first_diff(buf, want, bytes);
                if (at != bytes)
                    fail_msg("rank %d: broadcast of %zu %s from root %d differs at byte %zu",
                             mt_rank, counts[c], seldp_dtype_name((seldp_dtype)dt), root, at);
                free(buf);
                free(want);
            }
        }
    }
    seldp_comm_destroy(world);
}

/* ---- allreduce ------------------------------------------------------------------ */

static const seldp_dtype sum_dtypes[] = {SELDP_F32, SELDP_F64, SELDP_I64, SELDP_U64};

/* Rank r's input: floats spread over many binades, so that the order of the sum shows in
 * the bits; integers over the full 64-bit range, so that sums wrap. */
static void sum_input(seldp_dtype dtype, int rank, void *buf, size_t count)
{
    for (size_t i = 0; i < count; i++) {
        uint64_t h = tr_hash((uint64_t)rank * 1000003u + (uint64_t)dtype, i);
        double mant = (double)(h >> 11) / (double)(1ull << 53) * 2.0 - 1.0;
        double value = ldexp(mant, (int)((h & 0xff) % 41) - 20);
        switch (dtype) {
        case SELDP_F32:
            ((float *)buf)[i] = (float)value;
            break;
        case SELDP_F64:
            ((double *)buf)[i] = value;
            break;
        default:
            ((uint64_t *)buf)[i] = h;
            break;
        }
    }
}

/* The sum of every rank's input in rank order: ((in0 + in1) + in2) + ... */
static void sum_expected(seldp_dtype dtype, int n, size_t count, void *out, bool right_fold)
{
    size_t esize = seldp_dtype_size(dtype);
    void *in = xmalloc(count * esize);
    for (int k = 0; k < n; k++) {
        int r = right_fold ? n - 1 - k : k;
        sum_input(dtype, r, k == 0 ? out : in, count);
        if (k == 0)
            continue;
        for (size_t i = 0; i < count; i++) {
            switch (dtype) {
            case SELDP_F32:
                ((float *)out)[i] = right_fold ? ((float *)in)[i] + ((float *)out)[i]
                                               : ((float *)out)[i] + ((float *)in)[i];
                break;
            case SELDP_F64:
                ((double *)out)[i] = right_fold ? ((double *)in)[i] + ((double *)out)[i]
                                                : ((double *)out)[i] + ((double *)in)[i];
                break;
            default:
                ((uint64_t *)out)[i] += ((uint64_t *)in)[i];
                break;
            }
        }
    }
    free(in);
}

static void test_allreduce_every_dtype(void **state)
{
    (void)state;
    static const size_t counts[] = {0, 1, 5, 1000, 4099};
    seldp_comm *world = mt_world(TIMEOUT_S);
    for (size_t d = 0; d < sizeof sum_dtypes / sizeof *sum_dtypes; d++) {
        seldp_dtype dtype = sum_dtypes[d];
        size_t esize = seldp_dtype_size(dtype);
        for (size_t c = 0; c < sizeof counts / sizeof *counts; c++) {
            for (int in_place = 0; in_place < 2; in_place++) {
                size_t count = counts[c], bytes = count * esize;
                unsigned char *send = xmalloc(bytes), *recv = xmalloc(bytes);
                unsigned char *want = xmalloc(bytes), *mine = xmalloc(bytes);
                sum_input(dtype, mt_rank, send, count);
                memcpy(mine, send, bytes);
                memset(recv, 0xee, bytes);
                sum_expected(dtype, mt_size, count, want, false);
                unsigned char *out = in_place ? send : recv;
                assert_ok(seldp_comm_allreduce(world, send, out, count, dtype, SELDP_HOST_DEVICE));
                size_t at = tr_first_diff(out, want, bytes);
                if (at != bytes)
                    fail_msg("rank %d: allreduce of %zu %s (%s) differs from the rank-order sum "
                             "at element %zu",
                             mt_rank, count, seldp_dtype_name(dtype),
                             in_place ? "in place" : "out of place", at / esize);
                if (!in_place)
                    assert_memory_equal(send, mine, bytes);
                free(send);
                free(recv);
                free(want);
                free(mine);
            }
        }
    }
    seldp_comm_destroy(world);
}

/* The inputs above are sensitive to the order of the sum, so the bit-exact comparison is
 * a real test of the order; every rank holds the same bits, and a second call too. */
static void test_allreduce_bit_identical_on_every_rank(void **state)
{
    (void)state;
    const size_t count = 20000;
    seldp_comm *world = mt_world(TIMEOUT_S);
    float *send = xmalloc(count * sizeof *send), *first = xmalloc(count * sizeof *first);
    float *again = xmalloc(count * sizeof *again);
    sum_input(SELDP_F32, mt_rank, send, count);
    assert_ok(seldp_comm_allreduce(world, send, first, count, SELDP_F32, SELDP_HOST_DEVICE));
    assert_ok(seldp_comm_allreduce(world, send, again, count, SELDP_F32, SELDP_HOST_DEVICE));
    assert_memory_equal(first, again, count * sizeof *first);

    if (!mt_same_everywhere(world, first, count * sizeof *first))
        fail_msg("rank %d: the ranks' allreduce results differ", mt_rank);
    if (mt_size >= 3) {
        float *other = xmalloc(count * sizeof *other);
        sum_expected(SELDP_F32, mt_size, count, other, true);
        if (tr_first_diff(other, first, count * sizeof *first) == count * sizeof *first)
            fail_msg("the test inputs do not depend on the order of the sum");
        free(other);
    }
    free(send);
    free(first);
    free(again);
    seldp_comm_destroy(world);
}

typedef struct host_sum {
    size_t count;
    float *result; /* written by host rank 0 */
} host_sum;

static int host_sum_rank(tr_rank_ctx *ctx)
{
    host_sum *hs = ctx->arg;
    float *send = malloc(hs->count * sizeof *send), *recv = malloc(hs->count * sizeof *recv);
    RANK_CHECK(ctx, send && recv, "out of memory");
    sum_input(SELDP_F32, ctx->rank, send, hs->count);
    RANK_CHECK_OK(
        ctx, seldp_comm_allreduce(ctx->world, send, recv, hs->count, SELDP_F32, SELDP_HOST_DEVICE));
    if (ctx->rank == 0)
        memcpy(hs->result, recv, hs->count * sizeof *recv);
    free(send);
    free(recv);
    return 0;
}

/* Moving a layout from threads to processes changes no bit of a reduction. */
static void test_allreduce_equals_host_transport(void **state)
{
    (void)state;
    const size_t count = 5000;
    host_sum hs = {count, xmalloc(count * sizeof(float))};
    tr_run_ranks(mt_size, TIMEOUT_S, host_sum_rank, &hs);

    seldp_comm *world = mt_world(TIMEOUT_S);
    float *send = xmalloc(count * sizeof *send), *recv = xmalloc(count * sizeof *recv);
    sum_input(SELDP_F32, mt_rank, send, count);
    assert_ok(seldp_comm_allreduce(world, send, recv, count, SELDP_F32, SELDP_HOST_DEVICE));
    size_t at = tr_first_diff(recv, hs.result, count * sizeof *recv);
    if (at != count * sizeof *recv)
        fail_msg("rank %d: mpi and host allreduce differ at element %zu", mt_rank,
                 at / sizeof *recv);
    free(send);
    free(recv);
    free(hs.result);
    seldp_comm_destroy(world);
}

/* ---- allgather, allgatherv --------------------------------------------------------- */

static void check_allgather(seldp_comm *world, size_t bytes)
{
    size_t total = bytes * (size_t)mt_size;
    unsigned char *send = xmalloc(bytes), *recv = xmalloc(total), *want = xmalloc(total);
    for (int r = 0; r < mt_size; r++)
        tr_fill_bytes(want + (size_t)r * bytes, bytes, 500u + (uint64_t)r);
    for (int in_place = 0; in_place < 2; in_place++) {
        memset(recv, 0xcd, total);
        unsigned char *from = send;
        if (in_place)
            from = recv + (size_t)mt_rank * bytes;
        tr_fill_bytes(from, bytes, 500u + (uint64_t)mt_rank);
        assert_ok(seldp_comm_allgather(world, from, recv, bytes, SELDP_HOST_DEVICE));
        size_t at = tr_first_diff(recv, want, total);
        if (at != total)
            fail_msg("rank %d: allgather of %zu bytes (%s) differs at byte %zu (from rank %zu)",
                     mt_rank, bytes, in_place ? "in place" : "out of place", at,
                     bytes ? at / bytes : 0);
    }
    free(send);
    free(recv);
    free(want);
}

static void test_allgather(void **state)
{
    (void)state;
    seldp_comm *world = mt_world(TIMEOUT_S);
    check_allgather(world, 0);
    check_allgather(world, 1);
    check_allgather(world, 13);
    check_allgather(world, 4096);
    seldp_comm_destroy(world);
}

/* Blob lengths: some ranks send nothing. */
static size_t blob_len(int rank, int variant)
{
    if (variant == 0)
        return 0;
    return rank % 3 == 1 ? 0 : (size_t)(11 * rank + 3 * variant);
}

static void check_allgatherv(seldp_comm *world, int variant)
{
    size_t mine = blob_len(mt_rank, variant);
    unsigned char *send = xmalloc(mine);
    tr_fill_bytes(send, mine, 900u + (uint64_t)mt_rank);
    size_t *lens = xmalloc((size_t)mt_size * sizeof *lens);
    void *blob = NULL;
    assert_ok(seldp_comm_allgatherv(world, send, mine, &blob, lens));
    assert_non_null(blob);
    size_t at = 0;
    for (int r = 0; r < mt_size; r++) {
        size_t len = blob_len(r, variant);
        assert_int_equal(lens[r], len);
        unsigned char *want = xmalloc(len);
        tr_fill_bytes(want, len, 900u + (uint64_t)r);
        if (len && memcmp((unsigned char *)blob + at, want, len) != 0)
            fail_msg("rank %d: allgatherv blob of rank %d differs", mt_rank, r);
        at += len;
        free(want);
    }
    free(blob);
    free(lens);
    free(send);
}

static void test_allgatherv(void **state)
{
    (void)state;
    seldp_comm *world = mt_world(TIMEOUT_S);
    check_allgatherv(world, 0);
    check_allgatherv(world, 1);
    check_allgatherv(world, 40);
    seldp_comm_destroy(world);
}

/* ---- alltoallv --------------------------------------------------------------------- */

/* Elements rank `from` sends to rank `to`; zero for some pairs. */
static size_t pair_count(int from, int to, size_t scale)
{
    return (size_t)((from * 3 + to * 5) % 7) * scale;
}

/* Value of element i of the piece from -> to, the same bytes whatever the dtype width. */
static unsigned char pair_byte(int from, int to, size_t i)
{
    return (unsigned char)(tr_hash((uint64_t)(from * 64 + to), i / 8) >> (8 * (i % 8)));
}

static void check_alltoallv(seldp_comm *world, seldp_dtype dtype, size_t scale)
{
    int n = mt_size, me = mt_rank;
    size_t esize = seldp_dtype_size(dtype);
    size_t *sc = xmalloc((size_t)n * sizeof *sc), *sd = xmalloc((size_t)n * sizeof *sd);
    size_t *rc = xmalloc((size_t)n * sizeof *rc), *rd = xmalloc((size_t)n * sizeof *rd);
    size_t send_total = 0, recv_total = 0;
    for (int p = 0; p < n; p++) { /* send pieces in rank order, 2-element gaps */
        sc[p] = pair_count(me, p, scale);
        sd[p] = send_total;
        send_total += sc[p] + 2;
    }
    for (int q = n - 1; q >= 0; q--) { /* receive pieces in reverse order, 3-element gaps */
        rc[q] = pair_count(q, me, scale);
        rd[q] = recv_total + 3;
        recv_total += rc[q] + 3;
    }
    unsigned char *send = xmalloc(send_total * esize), *recv = xmalloc(recv_total * esize);
    for (int p = 0; p < n; p++)
        for (size_t i = 0; i < sc[p] * esize; i++)
            send[sd[p] * esize + i] = pair_byte(me, p, i);
    memset(recv, 0xab, recv_total * esize);
    assert_ok(seldp_comm_alltoallv(world, send, sc, sd, recv, rc, rd, dtype, SELDP_HOST_DEVICE));
    bool *written = calloc(recv_total * esize + 1, 1);
    assert_non_null(written);
    for (int q = 0; q < n; q++) {
        for (size_t i = 0; i < rc[q] * esize; i++) {
            size_t at = rd[q] * esize + i;
            written[at] = true;
            if (recv[at] != pair_byte(q, me, i))
                fail_msg("rank %d: alltoallv (%s) byte %zu of the piece from rank %d differs",
                         mt_rank, seldp_dtype_name(dtype), i, q);
        }
    }
    for (size_t at = 0; at < recv_total * esize; at++)
        if (!written[at] && recv[at] != 0xab)
            fail_msg("rank %d: alltoallv wrote byte %zu, outside every piece", mt_rank, at);
    free(written);
    free(send);
    free(recv);
    free(sc);
    free(sd);
    free(rc);
    free(rd);
}

static void test_alltoallv(void **state)
{
    (void)state;
    seldp_comm *world = mt_world(TIMEOUT_S);
    check_alltoallv(world, SELDP_U8, 1);
    check_alltoallv(world, SELDP_F64, 3);
    check_alltoallv(world, SELDP_I32, 257);
    seldp_comm_destroy(world);
}

/* ---- messages cut into pieces -------------------------------------------------------- */

/* With SELDP_MPI_MAX_MESSAGE set on rank 0 only, the ranks agree on its bound (or their
 * messages would not match) and every collective runs in many pieces. */
static void test_pieces_of_a_small_max_message(void **state)
{
    (void)state;
    if (mt_rank == 0)
        setenv("SELDP_MPI_MAX_MESSAGE", "48", 1);
    seldp_comm *world = mt_world(TIMEOUT_S);
    if (mt_rank == 0)
        unsetenv("SELDP_MPI_MAX_MESSAGE");

    size_t bytes = 1000;
    unsigned char *buf = xmalloc(bytes), *want = xmalloc(bytes);
    tr_fill_bytes(want, bytes, 31);
    tr_fill_bytes(buf, bytes, mt_rank == mt_size - 1 ? 31 : 32);
    assert_ok(seldp_comm_broadcast(world, buf, bytes, SELDP_U8, mt_size - 1, SELDP_HOST_DEVICE));
    assert_memory_equal(buf, want, bytes);
    free(buf);
    free(want);

    for (size_t d = 0; d < sizeof sum_dtypes / sizeof *sum_dtypes; d++) {
        const size_t count = 301;
        size_t esize = seldp_dtype_size(sum_dtypes[d]);
        unsigned char *send = xmalloc(count * esize), *sum = xmalloc(count * esize);
        unsigned char *expect = xmalloc(count * esize);
        sum_input(sum_dtypes[d], mt_rank, send, count);
        sum_expected(sum_dtypes[d], mt_size, count, expect, false);
        assert_ok(seldp_comm_allreduce(world, send, sum, count, sum_dtypes[d], SELDP_HOST_DEVICE));
        assert_memory_equal(sum, expect, count * esize);
        free(send);
        free(sum);
        free(expect);
    }

    check_allgather(world, 100);
    check_allgatherv(world, 40);
    check_alltoallv(world, SELDP_I32, 9);
    seldp_comm_destroy(world);
}

/* ---- split ------------------------------------------------------------------------- */

/* Sum over the group of (world rank + 1), checked against the members we expect. */
static void check_group_sum(seldp_comm *group, int64_t expected)
{
    int64_t mine = seldp_comm_world_rank(group) + 1, sum = 0;
    assert_ok(seldp_comm_allreduce(group, &mine, &sum, 1, SELDP_I64, SELDP_HOST_DEVICE));
    if (sum != expected)
        fail_msg("rank %d: group sum %lld, expected %lld", mt_rank, (long long)sum,
                 (long long)expected);
}

static void test_split_uneven_nested_and_absent(void **state)
{
    (void)state;
    int n = mt_size, me = mt_rank;
    seldp_comm *world = mt_world(TIMEOUT_S), *group = NULL, *nested = NULL, *most = NULL;

    /* {0} and {1..n-1}, the latter ordered by descending world rank (key = -rank). */
    assert_ok(seldp_comm_split(world, me == 0 ? 0 : 1, -me, &group));
    assert_non_null(group);
    assert_string_equal(seldp_comm_transport(group), "mpi");
    assert_int_equal(seldp_comm_world_rank(group), me);
    if (me == 0) {
        assert_int_equal(seldp_comm_size(group), 1);
        assert_int_equal(seldp_comm_rank(group), 0);
        check_group_sum(group, 1);
    } else {
        assert_int_equal(seldp_comm_size(group), n - 1);
        assert_int_equal(seldp_comm_rank(group), n - 1 - me);
        check_group_sum(group, (int64_t)n * (n + 1) / 2 - 1);
    }

    /* Nested: the big group split again by the parity of its group rank. */
    int grank = seldp_comm_rank(group);
    assert_ok(seldp_comm_split(group, grank % 2, grank, &nested));
    assert_non_null(nested);
    int64_t expected = 0, members = 0;
    for (int r = (me == 0 ? 0 : 1); r < (me == 0 ? 1 : n); r++) {
        int their_grank = me == 0 ? 0 : n - 1 - r;
        if (their_grank % 2 == grank % 2) {
            expected += r + 1;
            members++;
        }
    }
    assert_int_equal(seldp_comm_size(nested), members);
    assert_int_equal(seldp_comm_rank(nested), grank / 2);
    check_group_sum(nested, expected);
    uint64_t token = me == 0 || seldp_comm_rank(nested) == 0 ? 4242u + (uint64_t)me : 0;
    assert_ok(seldp_comm_broadcast(nested, &token, 1, SELDP_U64, 0, SELDP_HOST_DEVICE));
    int root_world = me == 0 ? 0 : n - 1 - (grank % 2); /* nested rank 0's world rank */
    assert_int_equal(token, 4242u + (uint64_t)root_world);

    /* The last rank joins no group. */
    assert_ok(seldp_comm_split(world, me == n - 1 ? SELDP_COMM_NO_GROUP : 7, 0, &most));
    if (me == n - 1) {
        assert_null(most);
    } else {
        assert_non_null(most);
        assert_int_equal(seldp_comm_size(most), n - 1);
        assert_int_equal(seldp_comm_rank(most), me);
        check_group_sum(most, (int64_t)(n - 1) * n / 2);
    }
    assert_int_equal(seldp_comm_get_stats(world).splits, 2);
    assert_int_equal(seldp_comm_get_stats(group).allreduces, 1);

    seldp_comm_destroy(most);
    seldp_comm_destroy(nested);
    seldp_comm_destroy(group);
    assert_ok(seldp_comm_barrier(world));
    seldp_comm_destroy(world);
}

/* ---- disagreement ---------------------------------------------------------------------- */

static void test_disagreement_is_reported_by_every_rank(void **state)
{
    (void)state;
    int n = mt_size, me = mt_rank;
    seldp_comm *world = mt_world(TIMEOUT_S);
    uint64_t word[8] = {0};

    /* Different roots. */
    seldp_status st =
        seldp_comm_broadcast(world, word, 1, SELDP_U64, me == 1 ? 1 : 0, SELDP_HOST_DEVICE);
    mt_expect_everywhere(world, st, SELDP_ERR_DISAGREE, "root");

    /* Different counts. */
    st = seldp_comm_allreduce(world, word, word, me == 1 ? 2 : 1, SELDP_U64, SELDP_HOST_DEVICE);
    mt_expect_everywhere(world, st, SELDP_ERR_DISAGREE, "allreduce: rank 0 passed 1 elements");

    /* Different collectives. */
    if (me == 0)
        st = seldp_comm_barrier(world);
    else
        st = seldp_comm_allgather(world, word, word + 1, 0, SELDP_HOST_DEVICE);
    mt_expect_everywhere(world, st, SELDP_ERR_DISAGREE, "called");

    /* Rank 0 sends one I32 to the last rank, which expects two. */
    size_t *sc = xmalloc((size_t)n * sizeof *sc), *sd = xmalloc((size_t)n * sizeof *sd);
    size_t *rc = xmalloc((size_t)n * sizeof *rc), *rd = xmalloc((size_t)n * sizeof *rd);
    int32_t out[8] = {0}, in[16] = {0};
    for (int p = 0; p < n; p++) {
        sc[p] = rc[p] = 1;
        sd[p] = rd[p] = (size_t)p * 2;
    }
    if (me == n - 1)
        rc[0] = 2;
    st = seldp_comm_alltoallv(world, out, sc, sd, in, rc, rd, SELDP_I32, SELDP_HOST_DEVICE);
    char needle[96];
    snprintf(needle, sizeof needle, "rank 0 sends 4 bytes to rank %d, which expects 8", n - 1);
    mt_expect_everywhere(world, st, SELDP_ERR_DISAGREE, needle);

    /* A buffer that one rank cannot stage fails the collective on every rank. */
    if (!seldp_has_feature("cuda")) {
        seldp_device cuda = {SELDP_DEVICE_CUDA, 0};
        st = seldp_comm_broadcast(world, word, 1, SELDP_U64, 0, cuda);
        mt_expect_everywhere(world, st, SELDP_ERR_UNSUPPORTED,
                             "rank 0 could not stage its buffers");
    }

    /* None of that aborted the world. */
    assert_ok(seldp_comm_barrier(world));
    int64_t one = 1, count = 0;
    assert_ok(seldp_comm_allreduce(world, &one, &count, 1, SELDP_I64, SELDP_HOST_DEVICE));
    assert_int_equal(count, n);
    free(sc);
    free(sd);
    free(rc);
    free(rd);
    seldp_comm_destroy(world);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        MT_TEST(test_world_properties),
        MT_TEST(test_barrier_waits_for_the_last_rank),
        MT_TEST(test_broadcast_every_dtype_and_root),
        MT_TEST(test_allreduce_every_dtype),
        MT_TEST(test_allreduce_bit_identical_on_every_rank),
        MT_TEST(test_allreduce_equals_host_transport),
        MT_TEST(test_allgather),
        MT_TEST(test_allgatherv),
        MT_TEST(test_alltoallv),
        MT_TEST(test_pieces_of_a_small_max_message),
        MT_TEST(test_split_uneven_nested_and_absent),
        MT_TEST(test_disagreement_is_reported_by_every_rank),
    };
    return mt_main(argc, argv, "mpi_collectives", tests, sizeof tests / sizeof *tests);
}
