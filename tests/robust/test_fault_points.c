/* Faults injected at every collective point of a session's life (docs/library.md, Communicators and
 * transports): one rank of three aborts, returns early or stalls at the k-th collective it enters,
 * for every k of the join, initialize and the four reductions; and one rank of four, in a session
 * over a group split from the world in reverse order, at every point of the join, the split,
 * initialize and a reduction. The others must return SELDP_ERR_ABORTED
 * or SELDP_ERR_TIMEOUT within the timeout, naming the faulty rank; every rank must fail in
 * the same call; the callers' gradients and (before the broadcasts) models must be
 * unchanged; everything is released (the asan preset runs this too); and a new world in
 * the same process works afterwards.
 *
 * The points are counted first with a clean run (SELDP__FAULT_NONE only counts). */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */

#include <pthread.h>
#include <stdatomic.h>
#include <setjmp.h>
#include <stdarg.h>
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

#define NRANKS       3 /* ranks of the plain walks */
#define SPLIT_RANKS  4 /* ranks of the walk over a split group */
#define MAX_RANKS_UP 4
#define TIMEOUT_S    0.3
/* Time a rank may take beyond the timeout to notice and return (sanitizers run this too). */
#define SLACK_S 1.5
/* Small buckets, so that initialize and each reduction make several collectives. */
#define BUCKET_BYTES 64

typedef enum phase {
    PH_JOIN,
    PH_SPLIT, /* only in the split walk; otherwise no collective */
    PH_INIT,
    PH_REDUCE,
    PH_REDUCE_FP32,
    PH_SUM,
    PH_SUM_FP32,
    PH_DONE
} phase;

static const char *const phase_names[] = {"join",        "split", "initialize", "reduce",
                                          "reduce_fp32", "sum",   "sum_fp32",   "(no failure)"};

/* Ranks left with part of the root's bytes by a failure inside initialize's broadcasts. */
static atomic_int partly_written;

static const char *const action_names[] = {"none", "abort", "return early", "stall"};

/* What one rank saw. */
typedef struct rank_result {
    phase failed_in; /* PH_DONE when every call succeeded */
    seldp_status st;
    char msg[1024];
    double elapsed;               /* of the failing call, seconds */
    bool intact;                  /* inputs as documented after the failure */
    char why[256];                /* why not intact, or a setup failure */
    uint64_t points[PH_DONE + 1]; /* collectives entered before each phase */
} rank_result;

typedef struct world_run {
    seldp_host_world *world;
    int n;      /* ranks */
    bool split; /* the session runs over a group split from the world, ranks reversed */
    phase last; /* the last phase run */
    rank_result r[MAX_RANKS_UP];
} world_run;

typedef struct rank_arg {
    world_run *run;
    int rank;
} rank_arg;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void record(rank_result *res, phase ph, seldp_status st, double t0)
{
    res->failed_in = ph;
    res->st = st;
    res->elapsed = now_s() - t0;
    snprintf(res->msg, sizeof res->msg, "%s", seldp_last_error());
}

/* After a failure inside initialize's broadcasts a non-root parameter may hold part of the
 * root's bytes (buckets already received): every byte must be its own or the root's. */
static bool only_own_or_root_bytes(test_model *m, char *why, size_t size)
{
    bool written = false;
    for (size_t k = 0; k < STD_N; k++) {
        ct_param *p = ct_find(m, STD[k].path);
        size_t bytes = seldp_tensor_nbytes(&p->tensor);
        unsigned char *root = calloc(1, bytes + 1);
        const unsigned char *now = p->tensor.data;
        if (!root) {
            snprintf(why, size, "out of memory");
            return false;
        }
        ct_fill(p->tensor.dtype, root, seldp_tensor_numel(&p->tensor), std_seed(0, k));
        for (size_t i = 0; i < bytes; i++) {
            if (now[i] != p->snapshot[i] && now[i] != root[i]) {
                snprintf(why, size, "'%s' byte %zu is neither its own nor the root's", p->path, i);
                free(root);
                return false;
            }
            written = written || now[i] != p->snapshot[i];
        }
        free(root);
    }
    if (written)
        atomic_fetch_add(&partly_written, 1);
    return true;
}

static seldp_status put_grads(test_grads *g, int rank)
{
    static const size_t trainable[] = {0, 1, 3, 4};
    seldp_status st = tg_init(g);
    for (size_t j = 0; st == SELDP_OK && j < 4; j++)
        st = std_put_grad(g, rank, trainable[j], STD[trainable[j]].dtype, rank == 1, NULL);
    /* an unselected gradient passes through every call untouched */
    if (st == SELDP_OK)
        st = tg_put(g, 999, SELDP_F32, false, 7, 1, SHAPE(5), NULL);
    return st;
}

static seldp_status reduce_call(phase ph, seldp_session *s, seldp_grads *g, int rank)
{
    uint64_t total = 0;
    switch (ph) {
    case PH_REDUCE:
        return seldp_session_reduce(s, g, 3 + (uint64_t)rank, SELDP_MISSING_ERROR, &total);
    case PH_REDUCE_FP32:
        return seldp_session_reduce_fp32(s, g, 3 + (uint64_t)rank, SELDP_MISSING_ERROR, &total);
    case PH_SUM:
        return seldp_session_sum(s, g, true, SELDP_MISSING_ERROR, &total);
    case PH_SUM_FP32:
        return seldp_session_sum_fp32(s, g, true, SELDP_MISSING_ERROR, &total);
    default:
        return SELDP_ERR_INTERNAL;
    }
}

/* Join, initialize, then the four reductions, stopping at the first failure. */
static void *rank_main(void *p)
{
    rank_arg *a = p;
    seldp_host_world *w = a->run->world;
    int rank = a->rank;
    rank_result *res = &a->run->r[rank];
    seldp_comm *comm = NULL, *group = NULL, *on;
    seldp_session *s = NULL;
    test_model m;
    seldp_param_id ids[STD_N];
    seldp_session_config cfg = SELDP_SESSION_CONFIG_INIT;
    seldp_status st;
    double t0;

    memset(&m, 0, sizeof m);
    res->failed_in = PH_DONE;
    res->intact = true;
    res->points[PH_JOIN] = seldp__host_fault_count(w, rank);
    t0 = now_s();
    st = seldp_host_comm_init(w, rank, SELDP_HOST_DEVICE, &comm);
    if (st != SELDP_OK) {
        record(res, PH_JOIN, st, t0);
        return NULL;
    }

    res->points[PH_SPLIT] = seldp__host_fault_count(w, rank);
    on = comm;
    if (a->run->split) {
        t0 = now_s();
        st = seldp_comm_split(comm, 0, a->run->n - 1 - rank, &group);
        if (st != SELDP_OK) {
            record(res, PH_SPLIT, st, t0);
            goto out;
        }
        on = group;
    }
    /* the model is the group rank's: group rank 0 is the root */
    int grank = seldp_comm_rank(on);

    res->points[PH_INIT] = seldp__host_fault_count(w, rank);
    if (ct_init(&m, grank) != SELDP_OK || std_model(&m, grank) != SELDP_OK) {
        res->intact = false;
        snprintf(res->why, sizeof res->why, "setup: the test model could not be built");
        goto out;
    }
    std_selection(grank, ids);
    cfg.bucket_bytes = BUCKET_BYTES;
    ct_snapshot(&m);
    t0 = now_s();
    st = seldp_session_initialize(on, m.model, 0, ids, STD_N, &cfg, &s);
    if (st != SELDP_OK) {
        /* the first two collectives (records, manifests) come before any write */
        uint64_t at = seldp__host_fault_count(w, rank) - res->points[PH_INIT];
        record(res, PH_INIT, st, t0);
        if (s) {
            res->intact = false;
            snprintf(res->why, sizeof res->why, "*out is not NULL after a failure");
        } else if (at <= 2) {
            res->intact = ct_unchanged(&m, res->why, sizeof res->why);
        } else {
            res->intact = only_own_or_root_bytes(&m, res->why, sizeof res->why);
        }
        goto out;
    }

    for (phase ph = PH_REDUCE; ph <= a->run->last; ph++) {
        test_grads g;
        grads_snapshot before;
        res->points[ph] = seldp__host_fault_count(w, rank);
        if (put_grads(&g, grank) != SELDP_OK) {
            res->intact = false;
            snprintf(res->why, sizeof res->why, "setup: gradients could not be built");
            tg_free(&g);
            goto out;
        }
        gs_take(&before, g.grads);
        ct_snapshot(&m);
        t0 = now_s();
        st = reduce_call(ph, s, g.grads, grank);
        if (st != SELDP_OK) {
            record(res, ph, st, t0);
            res->intact = gs_same(&before, g.grads, res->why, sizeof res->why) &&
                          ct_unchanged(&m, res->why, sizeof res->why);
        } else if (!gs_entry_same(&before, g.grads, 999)) {
            res->intact = false;
            snprintf(res->why, sizeof res->why, "%s changed the unselected gradient",
                     phase_names[ph]);
        }
        gs_free(&before);
        tg_free(&g);
        if (st != SELDP_OK)
            goto out;
    }
    for (phase ph = a->run->last + 1; ph <= PH_DONE; ph++)
        res->points[ph] = seldp__host_fault_count(w, rank);
out:
    seldp_session_destroy(s);
    seldp_comm_destroy(group);
    seldp_comm_destroy(comm);
    ct_free(&m);
    return NULL;
}

/* One world of n ranks (a split one when `split`) with `action` armed at `point` of rank
 * `faulty` (NONE: a clean run that counts). */
static void run_world(world_run *run, int n, bool split, int faulty, uint64_t point,
                      seldp__host_fault_action action)
{
    seldp_comm_config cfg = SELDP_COMM_CONFIG_INIT;
    pthread_t threads[MAX_RANKS_UP];
    rank_arg args[MAX_RANKS_UP];

    memset(run, 0, sizeof *run);
    run->n = n;
    run->split = split;
    /* the split walk reduces once: the reductions differ only in their records */
    run->last = split ? PH_REDUCE : PH_SUM_FP32;
    cfg.timeout_s = TIMEOUT_S;
    assert_int_equal(seldp_host_world_create(n, &cfg, &run->world), SELDP_OK);
    for (int r = 0; r < n; r++)
        assert_int_equal(seldp__host_fault_set(run->world, r, r == faulty ? point : UINT64_MAX,
                                               r == faulty ? action : SELDP__FAULT_NONE),
                         SELDP_OK);
    for (int r = 0; r < n; r++) {
        args[r] = (rank_arg){run, r};
        assert_int_equal(pthread_create(&threads[r], NULL, rank_main, &args[r]), 0);
    }
    for (int r = 0; r < n; r++)
        pthread_join(threads[r], NULL);
    seldp_host_world_destroy(run->world);
    run->world = NULL;
}

/* The clean run: every call succeeds and every rank enters the same collectives. */
static void count_points(int n, bool split, uint64_t points[PH_DONE + 1])
{
    world_run run;
    run_world(&run, n, split, -1, 0, SELDP__FAULT_NONE);
    for (int r = 0; r < n; r++) {
        const rank_result *res = &run.r[r];
        if (res->failed_in != PH_DONE || !res->intact)
            fail_msg("clean run: rank %d failed in %s with %s: %s %s", r,
                     phase_names[res->failed_in], seldp_status_name(res->st), res->msg, res->why);
        for (int ph = 0; ph <= PH_DONE; ph++)
            if (res->points[ph] != run.r[0].points[ph])
                fail_msg("clean run: rank %d entered %llu collectives before %s, rank 0 %llu", r,
                         (unsigned long long)res->points[ph], phase_names[ph],
                         (unsigned long long)run.r[0].points[ph]);
    }
    memcpy(points, run.r[0].points, sizeof run.r[0].points);
}

static phase phase_of(const uint64_t points[PH_DONE + 1], uint64_t point)
{
    phase ph = PH_JOIN;
    for (int p = PH_JOIN; p < PH_DONE; p++)
        if (point >= points[p])
            ph = (phase)p;
    return ph;
}

/* The checks of one faulted run. */
static void check_run(const world_run *run, const uint64_t points[PH_DONE + 1], int faulty,
                      uint64_t point, seldp__host_fault_action action, double *worst)
{
    phase ph = phase_of(points, point);
    char where[160];
    snprintf(where, sizeof where, "%s by rank %d at point %llu (%s, collective %llu of it)",
             action_names[action], faulty, (unsigned long long)point, phase_names[ph],
             (unsigned long long)(point - points[ph]));
    if (getenv("SELDP_TEST_VERBOSE"))
        printf("    %s: rank %d %s\n", where, (faulty + 1) % run->n,
               run->r[(faulty + 1) % run->n].msg);
    for (int r = 0; r < run->n; r++) {
        const rank_result *res = &run->r[r];
        seldp_status want = SELDP_ERR_TIMEOUT;
        char named[2][64];
        if (res->failed_in != ph)
            fail_msg("%s: rank %d failed in %s (%s: %s), expected in %s", where, r,
                     phase_names[res->failed_in], seldp_status_name(res->st), res->msg,
                     phase_names[ph]);
        if (action == SELDP__FAULT_ABORT)
            want = SELDP_ERR_ABORTED;
        else if (action == SELDP__FAULT_RETURN && r == faulty)
            want = SELDP_ERR_TRANSPORT;
        if (res->st != want)
            fail_msg("%s: rank %d returned %s, expected %s: %s", where, r,
                     seldp_status_name(res->st), seldp_status_name(want), res->msg);
        if (!res->intact)
            fail_msg("%s: rank %d's inputs are not as documented: %s", where, r, res->why);
        /* the others name the faulty rank: as the one that aborted, or the one missing */
        if (r != faulty) {
            snprintf(named[0], sizeof named[0], "rank %d aborted the world", faulty);
            snprintf(named[1], sizeof named[1], "rank %d", faulty);
            if (action == SELDP__FAULT_ABORT && !strstr(res->msg, named[0]))
                fail_msg("%s: rank %d's message lacks \"%s\": %s", where, r, named[0], res->msg);
            if (action != SELDP__FAULT_ABORT &&
                !(strstr(res->msg, "had not arrived") || strstr(res->msg, "waiting for")))
                fail_msg("%s: rank %d's message does not say who is missing: %s", where, r,
                         res->msg);
            const char *timed_out = strstr(res->msg, "timed out");
            if (action != SELDP__FAULT_ABORT && !(timed_out && strstr(timed_out, named[1])))
                fail_msg("%s: rank %d's message does not name rank %d: %s", where, r, faulty,
                         res->msg);
        }
        double limit = action == SELDP__FAULT_ABORT ? SLACK_S : TIMEOUT_S + SLACK_S;
        if (res->elapsed > limit)
            fail_msg("%s: rank %d took %.3f s to return (limit %.3f s)", where, r, res->elapsed,
                     limit);
        if (res->elapsed > *worst)
            *worst = res->elapsed;
    }
}

/* Walk every point with one action; the faulty rank rotates so that the root (rank 0) and
 * non-root ranks both fault at every phase. A clean world follows every faulted one. */
static void walk(seldp__host_fault_action action, int n, bool split)
{
    uint64_t points[PH_DONE + 1];
    double worst = 0.0;
    atomic_store(&partly_written, 0);
    count_points(n, split, points);
    assert_true(points[PH_SPLIT] == 1);                                 /* the join */
    assert_true(points[PH_INIT] - points[PH_SPLIT] == (split ? 1 : 0)); /* the split */
    assert_true(points[PH_REDUCE] - points[PH_INIT] >= 4); /* records, manifests, buckets */
    for (uint64_t point = 0; point < points[PH_DONE]; point++) {
        world_run run;
        uint64_t again[PH_DONE + 1];
        int faulty = (int)((point + (uint64_t)action) % (uint64_t)n);
        run_world(&run, n, split, faulty, point, action);
        check_run(&run, points, faulty, point, action, &worst);
        count_points(n, split, again);
        assert_memory_equal(again, points, sizeof again);
    }
    printf("  %s%s: %llu points (join 1, split %llu, initialize %llu, reductions",
           action_names[action], split ? " over a split group" : "",
           (unsigned long long)points[PH_DONE],
           (unsigned long long)(points[PH_INIT] - points[PH_SPLIT]),
           (unsigned long long)(points[PH_REDUCE] - points[PH_INIT]));
    for (int ph = PH_REDUCE; ph < PH_DONE; ph++)
        if (points[ph + 1] > points[ph])
            printf(" %llu", (unsigned long long)(points[ph + 1] - points[ph]));
    printf("); slowest return %.3f s with a %.1f s timeout; %d ranks left partly initialized\n",
           worst, TIMEOUT_S, atomic_load(&partly_written));
}

static void abort_at_every_point(void **state)
{
    (void)state;
    walk(SELDP__FAULT_ABORT, NRANKS, false);
}

static void return_early_at_every_point(void **state)
{
    (void)state;
    walk(SELDP__FAULT_RETURN, NRANKS, false);
}

static void stall_at_every_point(void **state)
{
    (void)state;
    walk(SELDP__FAULT_STALL, NRANKS, false);
}

/* A session over a group split from the world, group ranks the reverse of world ranks: the
 * others name the faulty rank by its world rank too. */
static void faults_over_a_split_group(void **state)
{
    (void)state;
    walk(SELDP__FAULT_ABORT, SPLIT_RANKS, true);
    walk(SELDP__FAULT_RETURN, SPLIT_RANKS, true);
}

/* The hook's own arguments. */
static void hook_arguments(void **state)
{
    (void)state;
    seldp_host_world *w = NULL;
    assert_int_equal(seldp__host_fault_set(NULL, 0, 0, SELDP__FAULT_ABORT),
                     SELDP_ERR_INVALID_ARGUMENT);
    assert_int_equal(seldp_host_world_create(2, NULL, &w), SELDP_OK);
    assert_int_equal(seldp__host_fault_count(w, 0), 0);
    assert_int_equal(seldp__host_fault_set(w, 2, 0, SELDP__FAULT_ABORT),
                     SELDP_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(seldp_last_error(), "rank 2"));
    assert_int_equal(seldp__host_fault_set(w, -1, 0, SELDP__FAULT_ABORT),
                     SELDP_ERR_INVALID_ARGUMENT);
    assert_int_equal(seldp__host_fault_set(w, 0, 0, (seldp__host_fault_action)9),
                     SELDP_ERR_INVALID_ARGUMENT);
    assert_int_equal(seldp__host_fault_set(w, 1, 5, SELDP__FAULT_STALL), SELDP_OK);
    assert_int_equal(seldp__host_fault_count(w, 1), 0);
    assert_int_equal(seldp__host_fault_count(w, 7), 0);
    seldp_host_world_destroy(w);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(hook_arguments),
        cmocka_unit_test(abort_at_every_point),
        cmocka_unit_test(return_early_at_every_point),
        cmocka_unit_test(stall_at_every_point),
        cmocka_unit_test(faults_over_a_split_group),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
