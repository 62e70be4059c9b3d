/* A rank stalled inside a collective of the host-staged transport (SPEC §3.4): it has
 * arrived and holds access to the other ranks' buffers when its thread stops (the fault
 * hook's SELDP__FAULT_STALL_INSIDE, a sleep after its first chunk of work). The others must
 * wait for it rather than return while it may still read or write their memory; at their
 * timeout they abort the world, it stops at its next chunk, and every rank returns
 * SELDP_ERR_TIMEOUT naming the stalled rank.
 *
 * Each rank frees the buffers others read and fills the ones others write with a sentinel
 * the moment its call returns: asan (the asan preset runs this) reports any later read,
 * and a sentinel overwritten after the threads are joined is a write after return.
 *
 * - every collective that moves data (broadcast, allreduce, allgather, allgatherv,
 *   alltoallv, the fused reduction), the stalled rank rotating over three;
 * - the scenario of issue 15: three ranks, a 0.5 s timeout, one selected F32 tensor of
 *   8 Mi elements, one rank stopped for 1.5 s at each collective of seldp_session_reduce;
 * - the same at each collective of seldp_session_initialize broadcasting a 16 Mi-element
 *   parameter.
 * SELDP_STALL_REPS (default 1) repeats the two scenarios. */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */

#include <pthread.h>
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

#include "comm/comm_impl.h"
#include "comm/host_fault.h"
#include "seldp/seldp.h"

#define NRANKS   3
#define SENTINEL 0xA5

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int reps(void)
{
    const char *env = getenv("SELDP_STALL_REPS");
    int n = env ? atoi(env) : 1;
    return n > 0 ? n : 1;
}

/* What one rank saw. */
typedef struct rank_out {
    seldp_status st;
    char msg[1024];
    double elapsed;          /* seconds in the call under test */
    unsigned char *poisoned; /* memory others wrote into, filled with SENTINEL after return */
    size_t poisoned_bytes;
    char setup[256]; /* a setup failure, or "" */
} rank_out;

/* The checks every stalled run shares: every rank returned SELDP_ERR_TIMEOUT naming the
 * stalled rank, none before the stalled rank stopped (when it held the others' buffers),
 * and no rank's memory was written after it returned. */
static void check_ranks(const char *what, rank_out *out, int stalled, double min_s)
{
    char named[3][64];
    snprintf(named[0], sizeof named[0], "rank %d stalled inside", stalled);
    snprintf(named[1], sizeof named[1], "rank %d had not arrived", stalled);
    snprintf(named[2], sizeof named[2], "waiting for rank %d", stalled);
    for (int r = 0; r < NRANKS; r++) {
        rank_out *o = &out[r];
        if (o->setup[0])
            fail_msg("%s: rank %d: setup: %s", what, r, o->setup);
        if (o->st != SELDP_ERR_TIMEOUT)
            fail_msg("%s, rank %d stalled: rank %d returned %s, expected timeout: %s", what,
                     stalled, r, seldp_status_name(o->st), o->msg);
        if (!strstr(o->msg, named[0]) && !strstr(o->msg, named[1]) && !strstr(o->msg, named[2]))
            fail_msg("%s: rank %d's message does not name stalled rank %d: %s", what, r, stalled,
                     o->msg);
        if (o->elapsed < min_s)
            fail_msg("%s: rank %d returned after %.3f s, before stalled rank %d stopped (%.3f s)",
                     what, r, o->elapsed, stalled, min_s);
        for (size_t i = 0; i < o->poisoned_bytes; i++)
            if (o->poisoned[i] != SENTINEL)
                fail_msg("%s: rank %d's buffer was written at byte %zu after it returned", what, r,
                         i);
        free(o->poisoned);
        o->poisoned = NULL;
    }
}

/* A stalled run that every rank survived: nothing written after return either. */
static void check_ranks_clean(const char *what, rank_out *out)
{
    for (int r = 0; r < NRANKS; r++) {
        rank_out *o = &out[r];
        for (size_t i = 0; i < o->poisoned_bytes; i++)
            if (o->poisoned[i] != SENTINEL)
                fail_msg("%s: rank %d's buffer was written at byte %zu after it returned", what, r,
                         i);
        free(o->poisoned);
        o->poisoned = NULL;
    }
}

/* Fill what others write with the sentinel and keep it, to look at after the join. */
static void poison(rank_out *o, void *buf, size_t bytes)
{
    if (bytes)
        memset(buf, SENTINEL, bytes);
    o->poisoned = buf;
    o->poisoned_bytes = bytes;
}

/* ---- the collectives of the transport ------------------------------------------------ */

#define COLL_TIMEOUT_S 0.2
#define COLL_STALL_S   0.6
#define COLL_ELEMS     ((size_t)1 << 20) /* per rank: far beyond the one-phase path */

typedef enum coll {
    C_BROADCAST,
    C_ALLREDUCE,
    C_ALLGATHER,
    C_ALLGATHERV,
    C_ALLTOALLV,
    C_FUSED,
    C_COUNT
} coll;

static const char *const coll_names[] = {"broadcast",  "allreduce", "allgather",
                                         "allgatherv", "alltoallv", "fused reduction"};

typedef struct coll_run {
    seldp_host_world *world;
    coll op;
    rank_out out[NRANKS];
} coll_run;

typedef struct coll_arg {
    coll_run *run;
    int rank;
} coll_arg;

static void *coll_rank(void *p)
{
    coll_arg *a = p;
    rank_out *o = &a->run->out[a->rank];
    seldp_comm *comm = NULL;
    size_t n = COLL_ELEMS, per = COLL_ELEMS / NRANKS;
    float *send = malloc(n * sizeof *send);
    float *recv = malloc(NRANKS * n * sizeof *recv);
    size_t counts[NRANKS], displs[NRANKS];
    void *blob = NULL;
    size_t blob_bytes[NRANKS];
    double t0;

    if (!send || !recv) {
        snprintf(o->setup, sizeof o->setup, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < n; i++)
        send[i] = (float)(a->rank + 1);
    if (seldp_host_comm_init(a->run->world, a->rank, SELDP_HOST_DEVICE, &comm) != SELDP_OK) {
        snprintf(o->setup, sizeof o->setup, "join: %s", seldp_last_error());
        goto out;
    }
    for (int r = 0; r < NRANKS; r++) {
        counts[r] = per;
        displs[r] = (size_t)r * per;
    }
    seldp__reduce_seg seg = {send, SELDP_F32, recv, SELDP_F32, n};
    seldp__reduce_fused_args fused = {&seg, 1, 0, 1.0};
    t0 = now_s();
    switch (a->run->op) {
    case C_BROADCAST:
        o->st = seldp_comm_broadcast(comm, send, n, SELDP_F32, 0, SELDP_HOST_DEVICE);
        break;
    case C_ALLREDUCE:
        o->st = seldp_comm_allreduce(comm, send, recv, n, SELDP_F32, SELDP_HOST_DEVICE);
        break;
    case C_ALLGATHER:
        o->st = seldp_comm_allgather(comm, send, recv, n * sizeof *send, SELDP_HOST_DEVICE);
        break;
    case C_ALLGATHERV:
        o->st = seldp_comm_allgatherv(comm, send, n * sizeof *send, &blob, blob_bytes);
        break;
    case C_ALLTOALLV:
        o->st = seldp_comm_alltoallv(comm, send, counts, displs, recv, counts, displs, SELDP_F32,
                                     SELDP_HOST_DEVICE);
        break;
    case C_FUSED:
        o->st = seldp__comm_reduce_fused(comm, &fused);
        break;
    default:
        break;
    }
    o->elapsed = now_s() - t0;
    snprintf(o->msg, sizeof o->msg, "%s", seldp_last_error());
    /* From here on no other rank may touch this rank's buffers. */
    if (a->run->op == C_BROADCAST && a->rank != 0) {
        poison(o, send, n * sizeof *send);
        send = NULL;
    } else if (a->run->op != C_BROADCAST && a->run->op != C_ALLGATHERV) {
        poison(o, recv, NRANKS * n * sizeof *recv);
        recv = NULL;
    }
    free(send);
    send = NULL;
    free(blob);
out:
    free(send);
    free(recv);
    seldp_comm_destroy(comm);
    return NULL;
}

static void run_coll(coll op, int stalled)
{
    coll_run run;
    coll_arg args[NRANKS];
    pthread_t threads[NRANKS];
    seldp_comm_config cfg = SELDP_COMM_CONFIG_INIT;
    char what[96];

    memset(&run, 0, sizeof run);
    run.op = op;
    cfg.timeout_s = COLL_TIMEOUT_S;
    assert_int_equal(seldp_host_world_create(NRANKS, &cfg, &run.world), SELDP_OK);
    /* point 0 is the join, point 1 the collective under test */
    assert_int_equal(seldp__host_fault_set_stall(run.world, stalled, 1, COLL_STALL_S), SELDP_OK);
    for (int r = 0; r < NRANKS; r++) {
        args[r] = (coll_arg){&run, r};
        assert_int_equal(pthread_create(&threads[r], NULL, coll_rank, &args[r]), 0);
    }
    for (int r = 0; r < NRANKS; r++)
        pthread_join(threads[r], NULL);
    seldp_host_world_destroy(run.world);
    snprintf(what, sizeof what, "%s", coll_names[op]);
    if (getenv("SELDP_TEST_VERBOSE"))
        printf("    %s, rank %d stalled: rank %d: %s\n", what, stalled, (stalled + 1) % NRANKS,
               run.out[(stalled + 1) % NRANKS].msg);
    check_ranks(what, run.out, stalled, 0.9 * COLL_STALL_S);
}

static void stall_inside_every_collective(void **state)
{
    (void)state;
    for (coll op = 0; op < C_COUNT; op++)
        for (int stalled = 0; stalled < NRANKS; stalled++)
            run_coll(op, stalled);
}

/* ---- sessions: reduce and initialize ---------------------------------------------------- */

#define SESSION_TIMEOUT_S 0.5
#define SESSION_STALL_S   1.5
#define REDUCE_ELEMS      ((size_t)8 << 20)
#define INIT_ELEMS        ((size_t)16 << 20)

typedef enum session_call { S_REDUCE, S_INITIALIZE } session_call;

typedef struct session_run {
    seldp_host_world *world;
    session_call call;
    uint64_t before[NRANKS]; /* collectives each rank entered before the call */
    uint64_t after[NRANKS];  /* ... and after it (a clean run) */
    rank_out out[NRANKS];
} session_run;

typedef struct session_arg {
    session_run *run;
    int rank;
} session_arg;

static void *session_rank(void *p)
{
    session_arg *a = p;
    session_run *run = a->run;
    rank_out *o = &run->out[a->rank];
    seldp_comm *comm = NULL;
    seldp_model *model = NULL;
    seldp_grads *grads = NULL;
    seldp_session *s = NULL;
    size_t n = run->call == S_REDUCE ? REDUCE_ELEMS : INIT_ELEMS;
    int64_t shape[1] = {(int64_t)n};
    float *param = malloc(n * sizeof *param);
    float *grad = run->call == S_REDUCE ? malloc(n * sizeof *grad) : NULL;
    seldp_param_id id = 7;
    seldp_session_config cfg = SELDP_SESSION_CONFIG_INIT;
    double t0;

    if (!param || (run->call == S_REDUCE && !grad)) {
        snprintf(o->setup, sizeof o->setup, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < n; i++)
        param[i] = (float)a->rank;
    seldp_tensor pt = seldp_tensor_view(SELDP_F32, SELDP_HOST_DEVICE, param, 1, shape);
    if (seldp_host_comm_init(run->world, a->rank, SELDP_HOST_DEVICE, &comm) != SELDP_OK ||
        seldp_model_create(a->rank, &model) != SELDP_OK ||
        seldp_model_add(model, "layers.0.experts.0.w1.weight", id, &pt, false, NULL) != SELDP_OK) {
        snprintf(o->setup, sizeof o->setup, "join or model: %s", seldp_last_error());
        goto out;
    }
    run->before[a->rank] = seldp__host_fault_count(run->world, a->rank);
    t0 = now_s();
    if (run->call == S_INITIALIZE) {
        o->st = seldp_session_initialize(comm, model, 0, &id, 1, &cfg, &s);
        o->elapsed = now_s() - t0;
        snprintf(o->msg, sizeof o->msg, "%s", seldp_last_error());
        run->after[a->rank] = seldp__host_fault_count(run->world, a->rank);
        if (a->rank != 0) { /* others wrote the root's values into it */
            poison(o, param, n * sizeof *param);
            param = NULL;
        }
        goto out;
    }

    if (seldp_session_initialize(comm, model, 0, &id, 1, &cfg, &s) != SELDP_OK ||
        seldp_grads_create(&grads) != SELDP_OK) {
        snprintf(o->setup, sizeof o->setup, "initialize: %s", seldp_last_error());
        goto out;
    }
    for (size_t i = 0; i < n; i++)
        grad[i] = (float)(a->rank + 1);
    seldp_tensor gt = seldp_tensor_view(SELDP_F32, SELDP_HOST_DEVICE, grad, 1, shape);
    if (seldp_grads_put(grads, id, &gt, SELDP_BORROWED) != SELDP_OK) {
        snprintf(o->setup, sizeof o->setup, "grads: %s", seldp_last_error());
        goto out;
    }
    run->before[a->rank] = seldp__host_fault_count(run->world, a->rank);
    t0 = now_s();
    o->st = seldp_session_reduce(s, grads, 1, SELDP_MISSING_ERROR, NULL);
    o->elapsed = now_s() - t0;
    snprintf(o->msg, sizeof o->msg, "%s", seldp_last_error());
    run->after[a->rank] = seldp__host_fault_count(run->world, a->rank);
    /* the others read and write this rank's gradient: not once it has returned */
    seldp_grads_destroy(grads);
    grads = NULL;
    poison(o, grad, n * sizeof *grad);
    grad = NULL;
out:
    seldp_grads_destroy(grads);
    seldp_session_destroy(s);
    seldp_model_destroy(model);
    seldp_comm_destroy(comm);
    free(param);
    free(grad);
    return NULL;
}

/* One world; `stalled` < 0 runs clean with a long timeout (to count the call's points). */
static void run_session(session_run *run, session_call call, int stalled, uint64_t point)
{
    session_arg args[NRANKS];
    pthread_t threads[NRANKS];
    seldp_comm_config cfg = SELDP_COMM_CONFIG_INIT;
    memset(run, 0, sizeof *run);
    run->call = call;
    cfg.timeout_s = stalled < 0 ? 60.0 : SESSION_TIMEOUT_S;
    assert_int_equal(seldp_host_world_create(NRANKS, &cfg, &run->world), SELDP_OK);
    for (int r = 0; r < NRANKS; r++)
        assert_int_equal(r == stalled
                             ? seldp__host_fault_set_stall(run->world, r, point, SESSION_STALL_S)
                             : seldp__host_fault_set(run->world, r, UINT64_MAX, SELDP__FAULT_NONE),
                         SELDP_OK);
    for (int r = 0; r < NRANKS; r++) {
        args[r] = (session_arg){run, r};
        assert_int_equal(pthread_create(&threads[r], NULL, session_rank, &args[r]), 0);
    }
    for (int r = 0; r < NRANKS; r++)
        pthread_join(threads[r], NULL);
    seldp_host_world_destroy(run->world);
    run->world = NULL;
}

/* Stall one rank at every collective point of the call, the stalled rank rotating. */
static void stall_every_point_of(session_call call)
{
    static session_run run; /* large: off the stack */
    const char *name = call == S_REDUCE ? "seldp_session_reduce" : "seldp_session_initialize";
    run_session(&run, call, -1, 0);
    for (int r = 0; r < NRANKS; r++) {
        if (run.out[r].setup[0] || run.out[r].st != SELDP_OK)
            fail_msg("%s, clean run: rank %d: %s %s", name, r, run.out[r].setup, run.out[r].msg);
        free(run.out[r].poisoned);
    }
    uint64_t first = run.before[0], last = run.after[0];
    assert_true(last > first);
    int k = 0, failed = 0;
    for (int rep = 0; rep < reps(); rep++) {
        for (uint64_t point = first; point < last; point++, k++) {
            int stalled = k % NRANKS;
            char what[128];
            snprintf(what, sizeof what, "%s, repetition %d, collective %llu of %llu", name, rep,
                     (unsigned long long)(point - first + 1), (unsigned long long)(last - first));
            run_session(&run, call, stalled, point);
            if (getenv("SELDP_TEST_VERBOSE"))
                printf("    %s, rank %d stalled: rank %d (%.2f s): %s\n", what, stalled,
                       (stalled + 1) % NRANKS, run.out[(stalled + 1) % NRANKS].elapsed,
                       run.out[(stalled + 1) % NRANKS].msg);
            /* A rank stalled after a one-phase collective holds nothing: the others go on
             * and time out at the next one, so only the timeout bounds their wait; after
             * the call's last collective they have nothing left to wait for, and every
             * rank succeeds. */
            bool all_ok = true;
            for (int r = 0; r < NRANKS; r++)
                all_ok = all_ok && run.out[r].st == SELDP_OK && !run.out[r].setup[0];
            if (all_ok && point + 1 == last) {
                check_ranks_clean(what, run.out);
                continue;
            }
            check_ranks(what, run.out, stalled, 0.9 * SESSION_TIMEOUT_S);
            failed++;
        }
    }
    /* the data-moving collectives (the reduction, the broadcasts) always fail */
    assert_true(failed >= reps());
    printf("  %s: %llu collectives, %d stalled runs, %d failed as they must\n", name,
           (unsigned long long)(last - first), k, failed);
}

static void stall_inside_reduce(void **state)
{
    (void)state;
    stall_every_point_of(S_REDUCE);
}

static void stall_inside_initialize(void **state)
{
    (void)state;
    stall_every_point_of(S_INITIALIZE);
}

/* The hook's own arguments. */
static void stall_hook_arguments(void **state)
{
    (void)state;
    seldp_host_world *w = NULL;
    assert_int_equal(seldp__host_fault_set_stall(NULL, 0, 0, 1.0), SELDP_ERR_INVALID_ARGUMENT);
    assert_int_equal(seldp_host_world_create(2, NULL, &w), SELDP_OK);
    assert_int_equal(seldp__host_fault_set_stall(w, 0, 0, 0.0), SELDP_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(seldp_last_error(), "0 s"));
    assert_int_equal(seldp__host_fault_set_stall(w, 0, 0, -1.0), SELDP_ERR_INVALID_ARGUMENT);
    assert_int_equal(seldp__host_fault_set_stall(w, 2, 0, 1.0), SELDP_ERR_INVALID_ARGUMENT);
    assert_int_equal(seldp__host_fault_set_stall(w, 1, 3, 1.0), SELDP_OK);
    assert_int_equal(seldp__host_fault_set(w, 1, 3, SELDP__FAULT_STALL_INSIDE), SELDP_OK);
    seldp_host_world_destroy(w);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(stall_hook_arguments),
        cmocka_unit_test(stall_inside_every_collective),
        cmocka_unit_test(stall_inside_reduce),
        cmocka_unit_test(stall_inside_initialize),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
