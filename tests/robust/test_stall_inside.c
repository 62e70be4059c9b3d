/* A rank stalled inside a collective of the host-staged transport (docs/library.md, Communicators
 * and transports): it has arrived and holds access to the other ranks' buffers when its thread
 * stops (the fault hook's SELDP__FAULT_STALL_INSIDE, a sleep after its first chunk of work). The
 * others must wait for it rather than return while it may still read or write their memory; at
 * their timeout they abort the world, it stops at its next chunk, and every rank returns
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
 * SELDP_STALL_REPS (default 1) repeats the two scenarios. Each world is set up under a
 * long timeout and the call under test runs under the short one; under ThreadSanitizer
 * every timeout and stall is five times longer. */
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
#include "comm/host/host_fault.h"
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
    char setup[256];       /* a setup failure, or "" */
    seldp_status setup_st; /* its status */
    char grads[256];       /* a reduce's gradient not as its status says, or "" */
} rank_out;

/* The short timeouts below bound the setup too (the join, the initialize before a
 * reduce): on a loaded machine a rank can miss them before the collective under test. Such
 * a run says nothing about stalls and is run again, a few times at most. */
#define SETUP_TRIES 5

static bool setup_timed_out(const rank_out *out)
{
    for (int r = 0; r < NRANKS; r++)
        if (out[r].setup[0] &&
            (out[r].setup_st == SELDP_ERR_TIMEOUT || out[r].setup_st == SELDP_ERR_ABORTED))
            return true;
    return false;
}

/* Record a setup failure of status st. */
static void setup_failed(rank_out *o, seldp_status st, const char *what)
{
    o->setup_st = st;
    snprintf(o->setup, sizeof o->setup, "%s: %s", what, seldp_last_error());
}

/* Sanitizers slow the work itself down so much that the others may still be busy when
 * a stall ends, and nobody times out: a consistent success is then allowed too. */
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
#define SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer) || __has_feature(address_sanitizer)
#define SANITIZED 1
#endif
#endif
#ifndef SANITIZED
#define SANITIZED 0
#endif
/* ThreadSanitizer slows copies and sums down most: a root packing a bucket can take longer
 * than a 0.5 s timeout before it arrives. Its timeouts and stalls are scaled up. */
#if defined(__SANITIZE_THREAD__)
#define TIME_SCALE 5.0
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define TIME_SCALE 5.0
#endif
#endif
#ifndef TIME_SCALE
#define TIME_SCALE 1.0
#endif

/* Whether the list of ranks ("2" or "1, 2") that ends at `end` holds `rank`. */
static bool list_holds(const char *msg, const char *end, int rank)
{
    const char *at = end;
    while (at > msg && (at[-1] == ' ' || at[-1] == ',' || (at[-1] >= '0' && at[-1] <= '9')))
        at--;
    while (at < end) {
        char *next = NULL;
        long v = strtol(at, &next, 10);
        if (next == at)
            at++;
        else if (v == rank)
            return true;
        else
            at = next;
    }
    return false;
}

/* Whether msg names `rank` as stalled inside, never arrived, or awaited. */
static bool names_rank(const char *msg, int rank)
{
    static const char *const after[] = {" stalled inside", " had not arrived"};
    for (int k = 0; k < 2; k++) {
        const char *at = strstr(msg, after[k]);
        if (at && list_holds(msg, at, rank))
            return true;
    }
    const char *w = strstr(msg, "waiting for rank");
    if (w) {
        w += strlen("waiting for rank");
        w += *w == 's';
        const char *end = w;
        while (*end == ' ' || *end == ',' || (*end >= '0' && *end <= '9'))
            end++;
        return list_holds(msg, end, rank);
    }
    return false;
}

/* A run that timed out on every rank without naming the stalled rank: another rank was
 * late on a loaded machine (a root packing a bucket under asan), which says nothing about
 * the stall either. Run again, a few times at most; a transport that names the wrong rank
 * fails every try. */
static bool someone_else_was_late(const rank_out *out, int stalled)
{
    for (int r = 0; r < NRANKS; r++)
        if (out[r].st != SELDP_ERR_TIMEOUT || names_rank(out[r].msg, stalled))
            return false;
    return true;
}

/* No rank's memory was written after it returned. */
static void check_sentinels(const char *what, rank_out *out)
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

/* The checks of a stalled run: no setup failure; every rank returned SELDP_ERR_TIMEOUT
 * (or SELDP_ERR_GRADS_UNDEFINED caused by it, a fused reduction that was writing) naming the
 * stalled rank, none before `min_s` (when it held the others' buffers); no
 * rank's memory was written after it returned. Every rank succeeding is allowed only when
 * `ok_allowed`. Returns whether the run failed as a stalled run should. */
static bool check_ranks(const char *what, rank_out *out, int stalled, double min_s, bool ok_allowed)
{
    bool all_ok = true;
    for (int r = 0; r < NRANKS; r++) {
        if (out[r].setup[0])
            fail_msg("%s: rank %d: setup: %s", what, r, out[r].setup);
        all_ok = all_ok && out[r].st == SELDP_OK;
    }
    if (all_ok && ok_allowed) {
        check_sentinels(what, out);
        return false;
    }
    for (int r = 0; r < NRANKS; r++) {
        rank_out *o = &out[r];
        /* a fused reduction stalled while writing says so, with the timeout as its cause */
        if (o->st != SELDP_ERR_TIMEOUT &&
            !(o->st == SELDP_ERR_GRADS_UNDEFINED && strstr(o->msg, "(SELDP_ERR_TIMEOUT)")))
            fail_msg("%s, rank %d stalled: rank %d returned %s, expected timeout: %s", what,
                     stalled, r, seldp_status_name(o->st), o->msg);
        if (!names_rank(o->msg, stalled))
            fail_msg("%s: rank %d's message does not name stalled rank %d: %s", what, r, stalled,
                     o->msg);
        if (o->elapsed < min_s)
            fail_msg("%s: rank %d returned after %.3f s, before stalled rank %d stopped (%.3f s)",
                     what, r, o->elapsed, stalled, min_s);
    }
    check_sentinels(what, out);
    return true;
}

/* Set up under the world's long timeout, then every rank waits here while rank 0 sets the
 * short one of the collective under test. */
static void short_timeout(pthread_barrier_t *b, seldp_host_world *w, int rank, double seconds)
{
    pthread_barrier_wait(b);
    if (rank == 0 && seldp__host_fault_set_timeout(w, seconds) != SELDP_OK)
        abort();
    pthread_barrier_wait(b);
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

#define COLL_TIMEOUT_S (0.2 * TIME_SCALE)
#define COLL_STALL_S   (0.6 * TIME_SCALE)
#define COLL_ELEMS     ((size_t)1 << 19) /* per rank: far beyond the one-phase path */

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

/* Stalled runs that every rank survived (see SANITIZED). */
static int coll_survived;

typedef struct coll_run {
    seldp_host_world *world;
    pthread_barrier_t ready; /* every rank's buffers are filled: join together */
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

    for (size_t i = 0; send && i < n; i++)
        send[i] = (float)(a->rank + 1);
    pthread_barrier_wait(&a->run->ready);
    seldp_status st = seldp_host_comm_init(a->run->world, a->rank, SELDP_HOST_DEVICE, &comm);
    if (st == SELDP_OK && (!send || !recv))
        st = SELDP_ERR_NOMEM;
    short_timeout(&a->run->ready, a->run->world, a->rank, COLL_TIMEOUT_S);
    if (st != SELDP_OK) {
        setup_failed(o, st, "join");
        goto out;
    }
    for (int r = 0; r < NRANKS; r++) {
        counts[r] = per;
        displs[r] = (size_t)r * per;
    }
    seldp__reduce_seg seg = {send, SELDP_F32, recv, SELDP_F32, n};
    seldp__reduce_fused_args fused = {&seg, 1, 0, 1.0, NULL, NULL};
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
    int tries = 0;

again:
    memset(&run, 0, sizeof run);
    assert_int_equal(pthread_barrier_init(&run.ready, NULL, NRANKS), 0);
    run.op = op;
    cfg.timeout_s = 60.0; /* the setup's; the collective's is COLL_TIMEOUT_S */
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
    pthread_barrier_destroy(&run.ready);
    snprintf(what, sizeof what, "%s", coll_names[op]);
    if ((setup_timed_out(run.out) || someone_else_was_late(run.out, stalled)) &&
        ++tries < SETUP_TRIES) {
        for (int r = 0; r < NRANKS; r++)
            free(run.out[r].poisoned);
        goto again;
    }
    if (getenv("SELDP_TEST_VERBOSE"))
        printf("    %s, rank %d stalled: rank %d: %s\n", what, stalled, (stalled + 1) % NRANKS,
               run.out[(stalled + 1) % NRANKS].msg);
    if (!check_ranks(what, run.out, stalled, 0.9 * COLL_STALL_S, SANITIZED))
        coll_survived++;
}

static void stall_inside_every_collective(void **state)
{
    (void)state;
    coll_survived = 0;
    for (coll op = 0; op < C_COUNT; op++)
        for (int stalled = 0; stalled < NRANKS; stalled++)
            run_coll(op, stalled);
    printf("  %d stalled collectives, %d outlasted by the others' own work (sanitizers)\n",
           (int)C_COUNT * NRANKS, coll_survived);
}

/* ---- sessions: reduce and initialize ---------------------------------------------------- */

#define SESSION_TIMEOUT_S (0.5 * TIME_SCALE)
#define SESSION_STALL_S   (1.5 * TIME_SCALE)
#define REDUCE_ELEMS      ((size_t)8 << 20)
#define INIT_ELEMS        ((size_t)16 << 20)

typedef enum session_call { S_REDUCE, S_INITIALIZE } session_call;

typedef struct session_run {
    seldp_host_world *world;
    pthread_barrier_t ready; /* every rank's buffers are filled: join together */
    session_call call;
    double timeout_s;        /* of the call under test */
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

    seldp_status st = SELDP_OK;
    if (!param || (run->call == S_REDUCE && !grad))
        st = SELDP_ERR_NOMEM;
    for (size_t i = 0; param && i < n; i++)
        param[i] = (float)a->rank;
    for (size_t i = 0; grad && i < n; i++)
        grad[i] = (float)(a->rank + 1);
    seldp_tensor pt = seldp_tensor_view(SELDP_F32, SELDP_HOST_DEVICE, param, 1, shape);
    if (st == SELDP_OK)
        st = seldp_model_create(a->rank, &model);
    if (st == SELDP_OK)
        st = seldp_model_add(model, "layers.0.experts.0.w1.weight", id, &pt, false, NULL);
    pthread_barrier_wait(&run->ready);
    if (st == SELDP_OK)
        st = seldp_host_comm_init(run->world, a->rank, SELDP_HOST_DEVICE, &comm);
    if (st == SELDP_OK && run->call == S_REDUCE) {
        st = seldp_session_initialize(comm, model, 0, &id, 1, &cfg, &s);
        if (st == SELDP_OK)
            st = seldp_grads_create(&grads);
        seldp_tensor gt = seldp_tensor_view(SELDP_F32, SELDP_HOST_DEVICE, grad, 1, shape);
        if (st == SELDP_OK)
            st = seldp_grads_put(grads, id, &gt, SELDP_BORROWED);
    }
    if (st != SELDP_OK)
        setup_failed(o, st, "setup");
    short_timeout(&run->ready, run->world, a->rank, run->timeout_s);
    if (st != SELDP_OK)
        goto out;

    run->before[a->rank] = seldp__host_fault_count(run->world, a->rank);
    t0 = now_s();
    if (run->call == S_INITIALIZE)
        o->st = seldp_session_initialize(comm, model, 0, &id, 1, &cfg, &s);
    else
        o->st = seldp_session_reduce(s, grads, 1, SELDP_MISSING_ERROR, NULL);
    o->elapsed = now_s() - t0;
    snprintf(o->msg, sizeof o->msg, "%s", seldp_last_error());
    run->after[a->rank] = seldp__host_fault_count(run->world, a->rank);
    /* The gradient as the status says (include/seldp/session.h): the mean of the ranks'
     * (1 + 2 + 3) / 3 after success; untouched after any other failure; anything only
     * after SELDP_ERR_GRADS_UNDEFINED, which staged_commit and the bucketed path never
     * return. */
    if (run->call == S_REDUCE && o->st != SELDP_ERR_GRADS_UNDEFINED) {
        float want = o->st == SELDP_OK ? 2.0f : (float)(a->rank + 1);
        for (size_t i = 0; i < n; i++) {
            if (grad[i] != want) {
                snprintf(o->grads, sizeof o->grads, "after %s its gradient [%zu] = %g, not %g",
                         seldp_status_name(o->st), i, grad[i], want);
                break;
            }
        }
    } else if (run->call == S_REDUCE && seldp_session_reduce_path(s) != SELDP_REDUCE_PATH_FUSED) {
        snprintf(o->grads, sizeof o->grads, "SELDP_ERR_GRADS_UNDEFINED on the %s path",
                 seldp_session_reduce_path(s) == SELDP_REDUCE_PATH_BUCKETED ? "bucketed" : "other");
    }
    /* From here on no other rank may touch this rank's memory. */
    if (run->call == S_REDUCE) { /* the others read and write this rank's gradient */
        seldp_grads_destroy(grads);
        grads = NULL;
        poison(o, grad, n * sizeof *grad);
        grad = NULL;
    } else if (a->rank != 0) { /* the others write the root's values into its parameter */
        poison(o, param, n * sizeof *param);
        param = NULL;
    }
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
    int tries = 0;
again:
    memset(run, 0, sizeof *run);
    assert_int_equal(pthread_barrier_init(&run->ready, NULL, NRANKS), 0);
    run->call = call;
    cfg.timeout_s = 60.0; /* the setup's */
    run->timeout_s = stalled < 0 ? 60.0 : SESSION_TIMEOUT_S;
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
    pthread_barrier_destroy(&run->ready);
    if ((setup_timed_out(run->out) || (stalled >= 0 && someone_else_was_late(run->out, stalled))) &&
        ++tries < SETUP_TRIES) {
        for (int r = 0; r < NRANKS; r++)
            free(run->out[r].poisoned);
        goto again;
    }
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
    int k = 0, failed = 0, undefined = 0;
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
            if (check_ranks(what, run.out, stalled, 0.9 * SESSION_TIMEOUT_S,
                            SANITIZED || point + 1 == last))
                failed++;
            for (int r = 0; r < NRANKS; r++) {
                if (run.out[r].grads[0])
                    fail_msg("%s, rank %d stalled: rank %d: %s (%s)", what, stalled, r,
                             run.out[r].grads, run.out[r].msg);
                undefined += run.out[r].st == SELDP_ERR_GRADS_UNDEFINED;
            }
        }
    }
    /* the data-moving collectives (the reduction, the broadcasts) fail */
    if (!SANITIZED)
        assert_true(failed >= reps());
    /* a stall inside the fused reduction leaves the gradients half written: said so */
    const char *path = getenv("SELDP_REDUCE_PATH");
    if (call == S_REDUCE && !SANITIZED && !(path && strcmp(path, "bucketed") == 0))
        assert_true(undefined > 0);
    printf("  %s: %llu collectives, %d stalled runs, %d failed as they must, %d rank results "
           "SELDP_ERR_GRADS_UNDEFINED\n",
           name, (unsigned long long)(last - first), k, failed, undefined);
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
    /* SELDP_STALL_ONLY=stall_inside_reduce (a cmocka pattern) with SELDP_STALL_REPS=200
     * repeats one scenario many times */
    if (getenv("SELDP_STALL_ONLY"))
        cmocka_set_test_filter(getenv("SELDP_STALL_ONLY"));
    return cmocka_run_group_tests(tests, NULL, NULL);
}
