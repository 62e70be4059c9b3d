/* Failures in the middle of an overlapped reduction (seldp_session_*_start ...
 * seldp_session_finish; include/seldp/session.h): a fault injected into the host-staged
 * transport at every collective the reduction makes (its agreement, each bucket, the final
 * agreement), seldp_comm_abort from a watchdog thread while buckets are in flight, a rank
 * that marks its gradients too late, a rank that destroys its session in flight, and calls
 * made in the wrong state. Every rank's finish must return an error (or, where the fault
 * came after every collective had done its work, every rank success with the right
 * results), and every rank's gradients must be as they were after a failure. Runs on both
 * reduce paths (ctest registers it again with SELDP_REDUCE_PATH=bucketed), and with
 * cfg.overlap_in_place (SELDP_TEST_OVERLAP_IN_PLACE=1), where buckets write their results
 * into the gradients and every failure must put them back. */
#define _POSIX_C_SOURCE 200809L /* nanosleep */

#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "comm/host/host_fault.h"
#include "contract.h"

#define NRANKS    3
#define TIMEOUT_S 0.3
#define LONG_S    30.0
#define BUCKET    32 /* bytes: the standard layout's 48 reducible elements in 6 buckets */

/* The standard layout's trainable parameters, in reverse path order: the order of marks. */
static const size_t MARKS[] = {4, 3, 1, 0};
#define N_MARKS 4

typedef enum scenario {
    PLAIN,      /* every rank marks and finishes; faults come from the transport */
    WATCHDOG,   /* a thread aborts the world once rank 0 has marked half its gradients */
    LATE_RANK,  /* rank 1 marks its gradients after 4 timeouts */
    DESTROY_MID /* rank 1 destroys its session after two marks, without finish */
} scenario;

typedef struct async_run {
    seldp_host_world *world;
    scenario sc;
    double timeout_s;
    pthread_barrier_t ready; /* every rank set up: the reduction's timeout is set then */
    _Atomic(seldp_comm *) comms[NRANKS];
    atomic_int marks0;         /* marks rank 0 has made */
    atomic_bool watchdog_done; /* ranks keep their communicators until then */
    uint64_t before[NRANKS], after[NRANKS];
    seldp_status st[NRANKS];
    char msg[NRANKS][1024];
    bool exact[NRANKS];  /* success with the exact sums */
    bool intact[NRANKS]; /* the gradients as they were */
    char why[NRANKS][256];
} async_run;

typedef struct rank_arg {
    async_run *run;
    int rank;
} rank_arg;

static void sleep_s(double s)
{
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

/* Each rank's gradient of trainable parameter k holds (rank + 1) * (i % 7): the sums are
 * exact in every dtype used. */
static bool sums_exact(int r, const seldp_grads *grads, char *why, size_t size)
{
    for (size_t j = 0; j < N_MARKS; j++) {
        size_t k = MARKS[j];
        const seldp_tensor *t = seldp_grads_get(grads, std_id(r, k));
        if (!t) {
            snprintf(why, size, "'%s' is absent", STD[k].path);
            return false;
        }
        for (size_t i = 0; i < std_numel(k); i++) {
            double want = (double)(NRANKS * (NRANKS + 1) / 2 * (int)(i % 7));
            if (ct_get(t->dtype, t->data, i) != want) {
                snprintf(why, size, "'%s'[%zu] = %g, expected %g", STD[k].path, i,
                         ct_get(t->dtype, t->data, i), want);
                return false;
            }
        }
    }
    return true;
}

static void *rank_main(void *p)
{
    rank_arg *a = p;
    async_run *run = a->run;
    int r = a->rank;
    seldp_comm *comm = NULL;
    seldp_session *s = NULL;
    seldp_session_config cfg = SELDP_SESSION_CONFIG_INIT;
    test_model m;
    test_grads g;
    grads_snapshot before;
    void *data;

    memset(&m, 0, sizeof m);
    memset(&g, 0, sizeof g);
    memset(&before, 0, sizeof before);
    cfg.bucket_bytes = BUCKET;
    cfg.overlap_in_place = getenv("SELDP_TEST_OVERLAP_IN_PLACE") != NULL;
    run->st[r] = SELDP_ERR_INTERNAL;
    bool ready = seldp_host_comm_init(run->world, r, SELDP_HOST_DEVICE, &comm) == SELDP_OK &&
                 std_session(comm, &m, &cfg, &s) == SELDP_OK && tg_init(&g) == SELDP_OK;
    for (size_t j = 0; j < N_MARKS && ready; j++) {
        size_t k = MARKS[j];
        ready = std_put_grad(&g, r, k, STD[k].dtype, r == 1, &data) == SELDP_OK;
        for (size_t i = 0; ready && i < std_numel(k); i++)
            ct_set(STD[k].dtype, data, i, (double)((r + 1) * (int)(i % 7)));
    }
    if (!ready)
        snprintf(run->why[r], sizeof run->why[r], "setup failed: %s", seldp_last_error());
    /* The setup ran under a long timeout, so that load cannot fail it; the reduction runs
     * under the run's, set while no rank is inside a collective. */
    if (pthread_barrier_wait(&run->ready) == PTHREAD_BARRIER_SERIAL_THREAD)
        (void)seldp__host_fault_set_timeout(run->world, run->timeout_s);
    pthread_barrier_wait(&run->ready);
    if (!ready)
        goto out;
    atomic_store(&run->comms[r], comm);
    gs_take(&before, g.grads);
    run->before[r] = seldp__host_fault_count(run->world, r);
    run->st[r] = seldp_session_sum_start(s, g.grads, true, SELDP_MISSING_ERROR);
    if (run->st[r] == SELDP_OK) {
        if (run->sc == LATE_RANK && r == 1)
            sleep_s(4 * run->timeout_s);
        /* backward: a millisecond of "compute" before each gradient is final */
        for (size_t j = 0; j < N_MARKS; j++) {
            sleep_s(0.001);
            if (run->sc == DESTROY_MID && r == 1 && j == 2) {
                seldp_session_destroy(s); /* cancels the reduction in flight */
                s = NULL;
                break;
            }
            (void)seldp_session_mark_ready(s, std_id(r, MARKS[j]));
            if (r == 0)
                atomic_fetch_add(&run->marks0, 1);
            if (run->sc == WATCHDOG && r == 0 && j == 1)
                sleep_s(0.05); /* the abort lands while the first buckets are in flight */
        }
        run->st[r] = s ? seldp_session_finish(s, NULL) : SELDP_ERR_ABORTED;
    }
    run->after[r] = seldp__host_fault_count(run->world, r);
    snprintf(run->msg[r], sizeof run->msg[r], "%s",
             run->st[r] != SELDP_OK ? seldp_last_error() : "");
    if (run->st[r] == SELDP_OK)
        run->exact[r] = sums_exact(r, g.grads, run->why[r], sizeof run->why[r]);
    else
        run->intact[r] = gs_same(&before, g.grads, run->why[r], sizeof run->why[r]);
out:
    while (run->sc == WATCHDOG && !atomic_load(&run->watchdog_done))
        sleep_s(0.001);
    gs_free(&before);
    tg_free(&g);
    seldp_session_destroy(s);
    ct_free(&m);
    seldp_comm_destroy(comm);
    return NULL;
}

/* Aborts the world through rank 2's handle once rank 0 has marked two gradients. */
static void *watchdog_main(void *p)
{
    async_run *run = p;
    /* gives up after 20 s (a rank whose setup failed): the test then fails on its status */
    for (int waited = 0; waited < 20000; waited++) {
        if (atomic_load(&run->marks0) >= 2 && atomic_load(&run->comms[2])) {
            seldp_comm_abort(atomic_load(&run->comms[2]));
            break;
        }
        sleep_s(0.001);
    }
    atomic_store(&run->watchdog_done, true);
    return NULL;
}

static void run_ranks(async_run *run, scenario sc, double timeout_s, int faulty, uint64_t point,
                      seldp__host_fault_action action)
{
    seldp_comm_config cfg = SELDP_COMM_CONFIG_INIT;
    pthread_t threads[NRANKS], watchdog;
    rank_arg args[NRANKS];

    memset(run, 0, sizeof *run);
    run->sc = sc;
    run->timeout_s = timeout_s;
    cfg.timeout_s = LONG_S;
    assert_int_equal(pthread_barrier_init(&run->ready, NULL, NRANKS), 0);
    assert_int_equal(seldp_host_world_create(NRANKS, &cfg, &run->world), SELDP_OK);
    for (int r = 0; r < NRANKS; r++)
        assert_int_equal(seldp__host_fault_set(run->world, r, r == faulty ? point : UINT64_MAX,
                                               r == faulty ? action : SELDP__FAULT_NONE),
                         SELDP_OK);
    for (int r = 0; r < NRANKS; r++) {
        args[r] = (rank_arg){run, r};
        assert_int_equal(pthread_create(&threads[r], NULL, rank_main, &args[r]), 0);
    }
    if (sc == WATCHDOG)
        assert_int_equal(pthread_create(&watchdog, NULL, watchdog_main, run), 0);
    for (int r = 0; r < NRANKS; r++)
        pthread_join(threads[r], NULL);
    if (sc == WATCHDOG)
        pthread_join(watchdog, NULL);
    seldp_host_world_destroy(run->world);
    run->world = NULL;
    pthread_barrier_destroy(&run->ready);
}

/* Every rank failed with its gradients as they were, each status among `allowed` (ending
 * with SELDP_OK as a terminator). */
static void expect_all_failed(const async_run *run, const char *what, const seldp_status *allowed)
{
    for (int r = 0; r < NRANKS; r++) {
        bool ok = false;
        for (size_t i = 0; allowed[i] != SELDP_OK; i++)
            ok |= run->st[r] == allowed[i];
        if (!ok)
            fail_msg("%s: rank %d returned %s: %s", what, r, seldp_status_name(run->st[r]),
                     run->msg[r]);
        if (!run->intact[r])
            fail_msg("%s: rank %d returned %s with its gradients changed: %s (%s)", what, r,
                     seldp_status_name(run->st[r]), run->why[r], run->msg[r]);
    }
}

/* DISAGREE: the transport saw a rank that left a collective early enter the next one */
static const seldp_status ANY_FAILURE[] = {SELDP_ERR_ABORTED, SELDP_ERR_TIMEOUT,
                                           SELDP_ERR_TRANSPORT, SELDP_ERR_DISAGREE, SELDP_OK};

/* Every collective of the reduction, on the progress thread or the caller's: aborted, left
 * early, or stalled inside. */
static void fault_at_every_point(void **state)
{
    static const seldp__host_fault_action actions[] = {SELDP__FAULT_ABORT, SELDP__FAULT_RETURN,
                                                       SELDP__FAULT_STALL_INSIDE};
    static const char *const names[] = {"abort", "return", "stall inside"};
    async_run *run = calloc(1, sizeof *run);
    char what[128];
    (void)state;
    assert_non_null(run);
    /* the clean run counts the collectives: a long timeout, so that load cannot fail it */
    run_ranks(run, PLAIN, LONG_S, -1, 0, SELDP__FAULT_NONE);
    for (int r = 0; r < NRANKS; r++)
        if (run->st[r] != SELDP_OK || !run->exact[r])
            fail_msg("clean run: rank %d returned %s: %s %s", r, seldp_status_name(run->st[r]),
                     run->msg[r], run->why[r]);
    uint64_t first = run->before[0], last = run->after[0];
    /* the agreement, six buckets and the final agreement */
    if (last - first != 8)
        fail_msg("the reduction entered %llu collectives, expected 8",
                 (unsigned long long)(last - first));
    for (uint64_t point = first; point < last; point++) {
        for (size_t a = 0; a < sizeof actions / sizeof actions[0]; a++) {
            int faulty = (int)(point % NRANKS);
            bool all_ok = true;
            run_ranks(run, PLAIN, TIMEOUT_S, faulty, point, actions[a]);
            snprintf(what, sizeof what, "%s at collective %llu of %llu on rank %d", names[a],
                     (unsigned long long)(point - first + 1), (unsigned long long)(last - first),
                     faulty);
            for (int r = 0; r < NRANKS; r++)
                all_ok &= run->st[r] == SELDP_OK;
            /* a rank stalled after the final agreement has done all its work: every rank may
             * then succeed, with the right sums */
            if (all_ok && actions[a] == SELDP__FAULT_STALL_INSIDE && point == last - 1) {
                for (int r = 0; r < NRANKS; r++)
                    if (!run->exact[r])
                        fail_msg("%s: rank %d succeeded with wrong sums: %s", what, r, run->why[r]);
                continue;
            }
            expect_all_failed(run, what, ANY_FAILURE);
        }
    }
    free(run);
}

static void watchdog_abort_while_buckets_fly(void **state)
{
    static const seldp_status aborted[] = {SELDP_ERR_ABORTED, SELDP_OK};
    async_run *run = calloc(1, sizeof *run);
    (void)state;
    assert_non_null(run);
    for (int trial = 0; trial < 3; trial++) {
        run_ranks(run, WATCHDOG, LONG_S, -1, 0, SELDP__FAULT_NONE);
        expect_all_failed(run, "watchdog abort", aborted);
        for (int r = 0; r < NRANKS; r++)
            if (!strstr(run->msg[r], "abort"))
                fail_msg("rank %d's message does not say it was aborted: %s", r, run->msg[r]);
    }
    free(run);
}

static void late_rank_times_out_everywhere(void **state)
{
    async_run *run = calloc(1, sizeof *run);
    (void)state;
    assert_non_null(run);
    run_ranks(run, LATE_RANK, TIMEOUT_S, -1, 0, SELDP__FAULT_NONE);
    expect_all_failed(run, "a rank 4 timeouts late", ANY_FAILURE);
    for (int r = 0; r < NRANKS; r++)
        if (r != 1 && run->st[r] != SELDP_ERR_TIMEOUT)
            fail_msg("rank %d returned %s, expected a timeout: %s", r,
                     seldp_status_name(run->st[r]), run->msg[r]);
    free(run);
}

static void destroy_in_flight(void **state)
{
    async_run *run = calloc(1, sizeof *run);
    (void)state;
    assert_non_null(run);
    run_ranks(run, DESTROY_MID, TIMEOUT_S, -1, 0, SELDP__FAULT_NONE);
    expect_all_failed(run, "rank 1 destroyed its session in flight", ANY_FAILURE);
    free(run);
}

/* --- calls in the wrong state: refused at once, the reduction in flight unharmed --------- */

static int rank_misuse(tr_rank_ctx *ctx)
{
    int r = ctx->rank;
    test_model m;
    test_grads g;
    seldp_session *s = NULL, *other = NULL;
    seldp_param_id one = std_id(r, 0);
    void *data;
    uint64_t total = 0;

    RANK_CHECK_OK(ctx, std_session(ctx->world, &m, NULL, &s));
    RANK_CHECK_OK(ctx, seldp_session_initialize(ctx->world, m.model, 0, &one, 1, NULL, &other));
    RANK_CHECK_OK(ctx, tg_init(&g));
    for (size_t j = 0; j < N_MARKS; j++) {
        size_t k = MARKS[j];
        RANK_CHECK_OK(ctx, std_put_grad(&g, r, k, STD[k].dtype, false, &data));
        for (size_t i = 0; i < std_numel(k); i++)
            ct_set(STD[k].dtype, data, i, (double)((r + 1) * (int)(i % 7)));
    }
    RANK_CHECK(ctx, seldp_session_finish(s, NULL) == SELDP_ERR_INVALID_ARGUMENT,
               "finish without a start was not refused");
    RANK_CHECK(ctx,
               strstr(seldp_last_error(), "seldp_session_finish") &&
                   strstr(seldp_last_error(), "no overlapped reduction is in flight"),
               "message: %s", seldp_last_error());
    RANK_CHECK(ctx, seldp_session_mark_ready(s, one) == SELDP_ERR_INVALID_ARGUMENT,
               "a mark without a start was not refused");
    RANK_CHECK(ctx, seldp_session_finish(NULL, NULL) == SELDP_ERR_INVALID_ARGUMENT,
               "finish of a NULL session was not refused");
    RANK_CHECK(ctx,
               seldp_session_sum_start(s, NULL, true, SELDP_MISSING_ERROR) ==
                   SELDP_ERR_INVALID_ARGUMENT,
               "a start without a container was not refused");
    RANK_CHECK(ctx,
               seldp_session_sum_start(s, g.grads, true, (seldp_missing_policy)7) ==
                   SELDP_ERR_INVALID_ARGUMENT,
               "a start with an invalid policy was not refused");

    RANK_CHECK_OK(ctx, seldp_session_sum_start(s, g.grads, true, SELDP_MISSING_ERROR));
    RANK_CHECK(ctx, seldp_session_in_flight(s), "not in flight after the start");
    RANK_CHECK(ctx,
               seldp_session_reduce_start(s, g.grads, 1, SELDP_MISSING_ERROR) ==
                   SELDP_ERR_INVALID_ARGUMENT,
               "a second start was not refused");
    RANK_CHECK(ctx, strstr(seldp_last_error(), "in flight on this session"), "message: %s",
               seldp_last_error());
    RANK_CHECK(ctx,
               seldp_session_sum(s, g.grads, true, SELDP_MISSING_ERROR, NULL) ==
                   SELDP_ERR_INVALID_ARGUMENT,
               "a blocking sum during the overlapped one was not refused");
    RANK_CHECK(ctx,
               seldp_session_sum_start(other, g.grads, true, SELDP_MISSING_ERROR) ==
                   SELDP_ERR_INVALID_ARGUMENT,
               "a start on another session of the same communicator was not refused");
    RANK_CHECK(ctx, strstr(seldp_last_error(), "another session"), "message: %s",
               seldp_last_error());
    RANK_CHECK(ctx,
               seldp_session_reduce(other, g.grads, 1, SELDP_MISSING_ERROR, NULL) ==
                   SELDP_ERR_INVALID_ARGUMENT,
               "a blocking reduce on another session of the same communicator was not refused");
    RANK_CHECK(ctx, seldp_session_mark_ready(s, 999999) == SELDP_ERR_NOT_FOUND,
               "a mark of an unselected id was not refused");
    for (size_t j = 0; j < N_MARKS; j++)
        RANK_CHECK_OK(ctx, seldp_session_mark_ready(s, std_id(r, MARKS[j])));
    RANK_CHECK_OK(ctx, seldp_session_finish(s, &total));
    RANK_CHECK(ctx, total == (uint64_t)ctx->size, "global weight %llu", (unsigned long long)total);
    RANK_CHECK(ctx, sums_exact(r, g.grads, ctx->why, sizeof ctx->why), "%s", ctx->why);
    RANK_CHECK(ctx, !seldp_session_in_flight(s), "still in flight after finish");
    /* the communicator is free again: the other session reduces */
    RANK_CHECK_OK(ctx, seldp_session_sum(other, g.grads, true, SELDP_MISSING_ERROR, NULL));
    tg_free(&g);
    seldp_session_destroy(other);
    seldp_session_destroy(s);
    ct_free(&m);
    return 0;
}

static void wrong_state_calls_are_refused(void **state)
{
    (void)state;
    tr_run_ranks(NRANKS, LONG_S, rank_misuse, NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(wrong_state_calls_are_refused),
        cmocka_unit_test(fault_at_every_point),
        cmocka_unit_test(watchdog_abort_while_buckets_fly),
        cmocka_unit_test(late_rank_times_out_everywhere),
        cmocka_unit_test(destroy_in_flight),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
