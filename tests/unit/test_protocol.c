/* The collective protocol every transport shares (src/comm/protocol.h): the agreement
 * check over every rank's headers and its messages, the missing-ranks list, the timeout
 * and abort messages, and the deadline helpers. */
#define _POSIX_C_SOURCE 200809L

#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "comm/protocol.h"
#include "seldp/seldp.h"

#define N 3

static void expect(seldp_status st, seldp_status want, const char *needle)
{
    if (st != want || (needle && !strstr(seldp_last_error(), needle)))
        fail_msg("got %s (%s), expected %s mentioning \"%s\"", seldp_status_name(st),
                 seldp_last_error(), seldp_status_name(want), needle ? needle : "");
}

static seldp__proto_view view_of(const seldp__call_header *h, int rank)
{
    return (seldp__proto_view){.size = N, .rank = rank, .headers = h, .stride = sizeof *h};
}

static void test_agreeing_calls(void **state)
{
    (void)state;
    seldp__call_header h[N];
    for (int r = 0; r < N; r++)
        h[r] = (seldp__call_header){.op = OP_ALLREDUCE, .seq = 4, .count = 10, .dtype = SELDP_F32};
    seldp__proto_view v = view_of(h, 1);
    expect(seldp__proto_agree(&v), SELDP_OK, NULL);
}

static void test_each_disagreement_has_its_message(void **state)
{
    (void)state;
    seldp__call_header h[N];
    for (int r = 0; r < N; r++)
        h[r] = (seldp__call_header){.op = OP_BROADCAST, .seq = 2, .root = 0, .bytes = 64};
    seldp__proto_view v = view_of(h, 0);

    h[2].op = OP_BARRIER;
    expect(seldp__proto_agree(&v), SELDP_ERR_DISAGREE,
           "rank 0: broadcast: rank 2 called barrier at the same point, expected every rank to "
           "call broadcast");
    h[2].op = OP_BROADCAST;

    h[1].seq = 3;
    expect(seldp__proto_agree(&v), SELDP_ERR_DISAGREE, "rank 1 is at its collective 3");
    h[1].seq = 0; /* not counted: not compared */
    expect(seldp__proto_agree(&v), SELDP_OK, NULL);

    h[2].staged = SELDP_ERR_NOMEM;
    expect(seldp__proto_agree(&v), SELDP_ERR_NOMEM,
           "rank 0: broadcast: rank 2 could not stage its buffers (SELDP_ERR_NOMEM)");
    h[2].staged = SELDP_OK;

    h[1].root = 1;
    expect(seldp__proto_agree(&v), SELDP_ERR_DISAGREE,
           "rank 0: broadcast: rank 0 passed root 0 and 64 bytes but rank 1 root 1 and 64 bytes");
    h[1].root = 0;

    for (int r = 0; r < N; r++)
        h[r] = (seldp__call_header){.op = OP_ALLGATHER, .bytes = 8};
    h[2].bytes = 16;
    expect(seldp__proto_agree(&v), SELDP_ERR_DISAGREE,
           "rank 0: allgather: rank 0 passed 8 bytes but rank 2 16");

    for (int r = 0; r < N; r++)
        h[r] = (seldp__call_header){.op = OP_ALLREDUCE, .count = 5, .dtype = SELDP_F32};
    h[1].dtype = SELDP_F64;
    expect(seldp__proto_agree(&v), SELDP_ERR_DISAGREE,
           "rank 0: allreduce: rank 0 passed 5 elements of f32 but rank 1 5 of f64");
}

/* A header embedded at the front of a larger slot, as a shared-memory transport keeps it,
 * with the arrays a header cannot carry reached through the callbacks. */
typedef struct slot {
    seldp__call_header h;
    size_t send_bytes[N], recv_bytes[N];
    seldp__reduce_seg segs[2];
} slot;

static const size_t *slot_send(const void *ctx, int r)
{
    return ((const slot *)ctx)[r].send_bytes;
}

static const size_t *slot_recv(const void *ctx, int r)
{
    return ((const slot *)ctx)[r].recv_bytes;
}

static const seldp__reduce_seg *slot_segs(const void *ctx, int r)
{
    return ((const slot *)ctx)[r].segs;
}

static void test_callbacks_check_what_a_header_cannot_carry(void **state)
{
    (void)state;
    slot s[N];
    memset(s, 0, sizeof s);
    seldp__proto_view v = {.size = N,
                           .rank = 2,
                           .headers = &s[0].h,
                           .stride = sizeof *s,
                           .ctx = s,
                           .send_bytes = slot_send,
                           .recv_bytes = slot_recv,
                           .segs = slot_segs};
    for (int r = 0; r < N; r++) {
        s[r].h.op = OP_ALLTOALLV;
        for (int p = 0; p < N; p++)
            s[r].send_bytes[p] = s[r].recv_bytes[p] = (size_t)(r + p);
    }
    expect(seldp__proto_agree(&v), SELDP_OK, NULL);
    s[1].send_bytes[2] = 9; /* rank 2 expects 3 from rank 1 */
    expect(seldp__proto_agree(&v), SELDP_ERR_DISAGREE,
           "rank 2: alltoallv: rank 1 sends 9 bytes to rank 2, which expects 3");

    for (int r = 0; r < N; r++) {
        s[r].h = (seldp__call_header){
            .op = OP_REDUCE_FUSED, .count = 12, .n_segs = 2, .bucket_elems = 4, .scale = 0.5};
        s[r].segs[0] = (seldp__reduce_seg){.count = 4, .out_dtype = SELDP_F32};
        s[r].segs[1] = (seldp__reduce_seg){.count = 8, .out_dtype = SELDP_BF16};
    }
    expect(seldp__proto_agree(&v), SELDP_OK, NULL);
    s[1].segs[1].out_dtype = SELDP_F16;
    expect(seldp__proto_agree(&v), SELDP_ERR_DISAGREE,
           "rank 2: reduction: tensor 1 is 8 elements of bf16 on rank 0 but 8 of f16 on rank 1");
    s[1].segs[1].out_dtype = SELDP_BF16;
    s[2].h.scale = 0.25;
    expect(seldp__proto_agree(&v), SELDP_ERR_DISAGREE, "(buckets of 4, scale 0.25)");
}

static bool flagged(const void *ctx, int r)
{
    return ((const bool *)ctx)[r];
}

static void test_missing_ranks_and_timeout_messages(void **state)
{
    (void)state;
    bool missing[5] = {false, true, false, true, true};
    int world[5] = {10, 11, 12, 13, 14};
    char group[64] = "", in_world[64] = "", split[64] = "", tiny[6] = "";
    assert_int_equal(seldp__proto_missing_ranks(5, 4, world, false, false, flagged, missing, group,
                                                sizeof group),
                     2);
    assert_string_equal(group, "1, 3");
    seldp__proto_missing_ranks(5, 4, world, true, true, flagged, missing, in_world,
                               sizeof in_world);
    assert_string_equal(in_world, "11, 13");
    seldp__proto_missing_ranks(5, 0, world, true, false, flagged, missing, split, sizeof split);
    assert_string_equal(split, "1 (world rank 11), 3 (world rank 13), 4 (world rank 14)");
    /* cut, but every missing rank counted */
    assert_int_equal(
        seldp__proto_missing_ranks(5, 0, world, false, false, flagged, missing, tiny, sizeof tiny),
        3);
    assert_true(strlen(tiny) < sizeof tiny);

    char reason[256];
    seldp__proto_timeout t = {.rank = 0,
                              .world_rank = 10,
                              .size = 5,
                              .op = OP_ALLGATHERV,
                              .timeout_s = 2,
                              .missing = 2,
                              .who = group,
                              .world_who = in_world};
    expect(seldp__proto_not_arrived(&t, reason, sizeof reason), SELDP_ERR_TIMEOUT,
           "rank 0: allgatherv timed out after 2 s: ranks 1, 3 had not arrived (2 of 5 ranks "
           "missing)");
    assert_string_equal(reason, "rank 10 timed out after 2 s in allgatherv waiting for ranks "
                                "11, 13");
    expect(seldp__proto_stalled_inside(&t, true, reason, sizeof reason), SELDP_ERR_TIMEOUT,
           "ranks 1, 3 stalled inside it (every rank of the 5 had arrived; this rank waited for "
           "them to stop touching its buffers)");
    assert_non_null(strstr(reason, "ranks 11, 13 stalled inside it"));
    expect(seldp__proto_silent_inside(&t, reason, sizeof reason), SELDP_ERR_TIMEOUT,
           "rank 0: allgatherv timed out after 2 s: ranks 1, 3 did not answer from inside it "
           "(stalled inside it, or done with their part and busy elsewhere; every rank of the 5 "
           "had arrived)");
    assert_string_equal(reason, "rank 10 timed out after 2 s in allgatherv: ranks 11, 13 did not "
                                "answer from inside it (every rank had arrived)");
    t.missing = 0;
    expect(seldp__proto_stalled_inside(&t, false, reason, sizeof reason), SELDP_ERR_TIMEOUT,
           "a rank stalled inside it (every rank of the 5 had arrived)");
    expect(seldp__proto_aborted(3, OP_SPLIT, SELDP_ERR_ABORTED, "rank 1 aborted the world"),
           SELDP_ERR_ABORTED, "rank 3: split aborted: rank 1 aborted the world");
}

static bool after_three(void *arg)
{
    return ++*(int *)arg >= 3;
}

static bool never(void *arg)
{
    (void)arg;
    return false;
}

static void test_clocks(void **state)
{
    (void)state;
    double t0 = seldp__proto_now();
    struct timespec soon = seldp__proto_deadline_after(0.02),
                    far = seldp__proto_deadline_after(1e30);
    assert_true(soon.tv_nsec >= 0 && soon.tv_nsec < 1000000000L);
    assert_false(seldp__proto_past(&far));
    struct timespec past = seldp__proto_deadline_after(-1);
    assert_true(seldp__proto_past(&past));
    while (!seldp__proto_past(&soon))
        seldp__proto_cpu_relax();
    assert_true(seldp__proto_now() - t0 >= 0.019);

    int calls = 0;
    assert_true(seldp__proto_spin_until(after_three, &calls, 1000000000L));
    assert_int_equal(calls, 3);
    double t1 = seldp__proto_now();
    assert_false(seldp__proto_spin_until(never, NULL, 1000000L));
    assert_true(seldp__proto_now() - t1 >= 0.001);
    /* the same giving the core away between looks (ranks that share cores) */
    calls = 0;
    assert_true(seldp__proto_yield_until(after_three, &calls, 1000000000L));
    assert_int_equal(calls, 3);
    t1 = seldp__proto_now();
    assert_false(seldp__proto_yield_until(never, NULL, 1000000L));
    assert_true(seldp__proto_now() - t1 >= 0.001);

    /* the first polls spin, later ones sleep a growing nap, up to a millisecond */
    seldp__proto_backoff b = SELDP__PROTO_BACKOFF_INIT;
    for (int i = 0; i < 64; i++)
        seldp__proto_backoff_wait(&b);
    assert_true(b.nap_s == 1e-6);
    for (int i = 0; i < 20; i++)
        seldp__proto_backoff_wait(&b);
    assert_true(b.nap_s >= 1e-3 && b.nap_s < 2.1e-3);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_agreeing_calls),
        cmocka_unit_test(test_each_disagreement_has_its_message),
        cmocka_unit_test(test_callbacks_check_what_a_header_cannot_carry),
        cmocka_unit_test(test_missing_ranks_and_timeout_messages),
        cmocka_unit_test(test_clocks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
