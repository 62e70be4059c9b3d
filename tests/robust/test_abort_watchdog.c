/* seldp_comm_abort from a watchdog thread while a collective runs (include/seldp/comm.h),
 * on the host-staged transport, at every collective point of a session's life (the fault
 * hook's points: initialize's records, manifests and broadcasts, a reduce and a sum) and
 * at each phase of it: one rank is held back before arriving (SELDP__FAULT_STALL: the
 * others wait for it to arrive) or stopped inside after its first chunk of work
 * (SELDP__FAULT_STALL_INSIDE: the others wait for it to finish, and it stops at its next
 * chunk); 30 ms after it entered, a thread that is no rank aborts the world through
 * another rank's communicator. Every rank must fail with SELDP_ERR_ABORTED in the same call,
 * naming the rank whose handle aborted, soon (the timeout is 60 s); a collective that had
 * already done all its work may still succeed everywhere, and the next one fails. The
 * asan and tsan presets run this too. */
#define _POSIX_C_SOURCE 200809L /* clock_gettime, nanosleep */

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
#include "seldp/seldp.h"

#define NRANKS    3
#define TIMEOUT_S 60.0
#define STALL_S   0.5
#define ABORT_S   0.03              /* after the held rank entered its point */
#define RETURN_S  5.0               /* the most a rank may take to return once the abort is in */
#define A_ELEMS   ((size_t)1 << 20) /* beyond one chunk of work */
#define B_ELEMS   ((size_t)100)

typedef enum call { CALL_INITIALIZE, CALL_REDUCE, CALL_SUM, CALL_DONE } call;
static const char *const call_names[] = {"seldp_session_initialize", "seldp_session_reduce",
                                         "seldp_session_sum", "(none)"};

typedef struct rank_out {
    call failed_in; /* CALL_DONE when every call succeeded */
    seldp_status st;
    char msg[1024];
    double returned_at; /* of the failing call */
    char setup[256];
    uint64_t points[CALL_DONE + 1]; /* collectives entered before each call */
} rank_out;

typedef struct run {
    seldp_host_world *world;
    _Atomic(seldp_comm *) comms[NRANKS]; /* each rank's world communicator, for the watchdog */
    atomic_bool watchdog_done;           /* ranks keep their handles until then */
    rank_out out[NRANKS];
} run;

typedef struct rank_arg {
    run *r;
    int rank;
} rank_arg;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void sleep_s(double s)
{
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

static void *rank_main(void *p)
{
    rank_arg *a = p;
    run *r = a->r;
    rank_out *o = &r->out[a->rank];
    seldp_comm *comm = NULL;
    seldp_model *model = NULL;
    seldp_session *s = NULL;
    float *pa = calloc(A_ELEMS, sizeof *pa), *pb = calloc(B_ELEMS, sizeof *pb);
    float *ga = calloc(A_ELEMS, sizeof *ga), *gb = calloc(B_ELEMS, sizeof *gb);
    seldp_param_id ids[2] = {1, 2};
    seldp_session_config cfg = SELDP_SESSION_CONFIG_INIT;
    seldp_status st = SELDP_OK;

    o->failed_in = CALL_DONE;
    if (!pa || !pb || !ga || !gb) {
        snprintf(o->setup, sizeof o->setup, "out of memory");
        goto out;
    }
    int64_t sa[1] = {(int64_t)A_ELEMS}, sb[1] = {(int64_t)B_ELEMS};
    seldp_tensor ta = seldp_tensor_view(SELDP_F32, SELDP_HOST_DEVICE, pa, 1, sa);
    seldp_tensor tb = seldp_tensor_view(SELDP_F32, SELDP_HOST_DEVICE, pb, 1, sb);
    if (seldp_model_create(a->rank, &model) != SELDP_OK ||
        seldp_model_add(model, "layers.0.mlp.weight", ids[0], &ta, false, NULL) != SELDP_OK ||
        seldp_model_add(model, "layers.0.norm.weight", ids[1], &tb, false, NULL) != SELDP_OK ||
        seldp_host_comm_init(r->world, a->rank, SELDP_HOST_DEVICE, &comm) != SELDP_OK) {
        snprintf(o->setup, sizeof o->setup, "setup: %s", seldp_last_error());
        goto out;
    }
    atomic_store(&r->comms[a->rank], comm);
    cfg.bucket_bytes = (size_t)1 << 20; /* initialize broadcasts in several buckets */
    for (call c = CALL_INITIALIZE; c < CALL_DONE; c++) {
        seldp_grads *g = NULL;
        o->points[c] = seldp__host_fault_count(r->world, a->rank);
        if (c == CALL_INITIALIZE) {
            st = seldp_session_initialize(comm, model, 0, ids, 2, &cfg, &s);
        } else {
            seldp_tensor tga = seldp_tensor_view(SELDP_F32, SELDP_HOST_DEVICE, ga, 1, sa);
            seldp_tensor tgb = seldp_tensor_view(SELDP_F32, SELDP_HOST_DEVICE, gb, 1, sb);
            st = seldp_grads_create(&g);
            if (st == SELDP_OK)
                st = seldp_grads_put(g, ids[0], &tga, SELDP_BORROWED);
            if (st == SELDP_OK)
                st = seldp_grads_put(g, ids[1], &tgb, SELDP_BORROWED);
            if (st != SELDP_OK) {
                snprintf(o->setup, sizeof o->setup, "gradients: %s", seldp_last_error());
                seldp_grads_destroy(g);
                break;
            }
            st = c == CALL_REDUCE ? seldp_session_reduce(s, g, 1, SELDP_MISSING_ERROR, NULL)
                                  : seldp_session_sum(s, g, true, SELDP_MISSING_ERROR, NULL);
            seldp_grads_destroy(g);
        }
        if (st != SELDP_OK) {
            o->failed_in = c;
            o->st = st;
            o->returned_at = now_s();
            snprintf(o->msg, sizeof o->msg, "%s", seldp_last_error());
            break;
        }
    }
    for (call c = o->failed_in + 1; c <= CALL_DONE && o->failed_in != CALL_DONE; c++)
        o->points[c] = o->points[o->failed_in];
    o->points[CALL_DONE] = seldp__host_fault_count(r->world, a->rank);
out:
    /* the watchdog may hold this rank's handle: keep it alive until it is done */
    while (!atomic_load(&r->watchdog_done))
        sleep_s(0.001);
    seldp_session_destroy(s);
    seldp_comm_destroy(comm);
    seldp_model_destroy(model);
    free(pa);
    free(pb);
    free(ga);
    free(gb);
    return NULL;
}

typedef struct watchdog_arg {
    run *r;
    int held;       /* the rank held back at `point` */
    uint64_t point; /* UINT64_MAX: no watchdog */
    int via;        /* whose communicator aborts */
    double aborted_at;
} watchdog_arg;

static void *watchdog_main(void *p)
{
    watchdog_arg *w = p;
    double until = now_s() + 30.0;
    w->aborted_at = 0;
    if (w->point != UINT64_MAX) {
        /* the held rank has entered its point (its count moved past it) */
        while (seldp__host_fault_count(w->r->world, w->held) <= w->point && now_s() < until)
            sleep_s(0.001);
        sleep_s(ABORT_S);
        seldp_comm *c = NULL;
        while (!(c = atomic_load(&w->r->comms[w->via])) && now_s() < until)
            sleep_s(0.001);
        if (c) {
            w->aborted_at = now_s();
            seldp_comm_abort(c);
        }
    }
    atomic_store(&w->r->watchdog_done, true);
    return NULL;
}

/* One world: rank `held` gets `action` at `point` (UINT64_MAX: a clean run). */
static void run_world(run *r, int held, uint64_t point, seldp__host_fault_action action,
                      watchdog_arg *w)
{
    seldp_comm_config cfg = SELDP_COMM_CONFIG_INIT;
    rank_arg args[NRANKS];
    pthread_t threads[NRANKS], dog;
    memset(r, 0, sizeof *r);
    cfg.timeout_s = TIMEOUT_S;
    assert_int_equal(seldp_host_world_create(NRANKS, &cfg, &r->world), SELDP_OK);
    for (int k = 0; k < NRANKS; k++) {
        seldp_status st = SELDP_OK;
        if (k == held && action == SELDP__FAULT_STALL_INSIDE)
            st = seldp__host_fault_set_stall(r->world, k, point, STALL_S);
        else
            st = seldp__host_fault_set(r->world, k, k == held ? point : UINT64_MAX,
                                       k == held ? action : SELDP__FAULT_NONE);
        assert_int_equal(st, SELDP_OK);
    }
    *w = (watchdog_arg){r, held, point, (held + 1) % NRANKS, 0};
    assert_int_equal(pthread_create(&dog, NULL, watchdog_main, w), 0);
    for (int k = 0; k < NRANKS; k++) {
        args[k] = (rank_arg){r, k};
        assert_int_equal(pthread_create(&threads[k], NULL, rank_main, &args[k]), 0);
    }
    pthread_join(dog, NULL);
    for (int k = 0; k < NRANKS; k++)
        pthread_join(threads[k], NULL);
    seldp_host_world_destroy(r->world);
    r->world = NULL;
}

static call call_of(const uint64_t points[CALL_DONE + 1], uint64_t point)
{
    call c = CALL_INITIALIZE;
    for (int k = CALL_INITIALIZE; k < CALL_DONE; k++)
        if (point >= points[k])
            c = (call)k;
    return c;
}

static void abort_at_every_point(seldp__host_fault_action action)
{
    static run r; /* large: off the stack */
    watchdog_arg w;
    uint64_t points[CALL_DONE + 1];
    run_world(&r, -1, UINT64_MAX, SELDP__FAULT_NONE, &w);
    for (int k = 0; k < NRANKS; k++)
        if (r.out[k].setup[0] || r.out[k].failed_in != CALL_DONE)
            fail_msg("clean run: rank %d: %s %s", k, r.out[k].setup, r.out[k].msg);
    memcpy(points, r.out[0].points, sizeof points);
    int failed_runs = 0, runs = 0;
    /* point 0 is the join: there is no communicator to abort with yet */
    for (uint64_t point = 1; point < points[CALL_DONE]; point++, runs++) {
        int held = (int)(point % NRANKS);
        call expected = call_of(points, point);
        char where[160];
        run_world(&r, held, point, action, &w);
        snprintf(where, sizeof where, "%s, rank %d held at point %llu (%s), abort through rank %d",
                 action == SELDP__FAULT_STALL ? "before arriving" : "inside", held,
                 (unsigned long long)point, call_names[expected], w.via);
        if (w.aborted_at == 0)
            fail_msg("%s: the watchdog never aborted", where);
        char named[64];
        snprintf(named, sizeof named, "rank %d aborted the world", w.via);
        call in = r.out[0].failed_in;
        for (int k = 0; k < NRANKS; k++) {
            const rank_out *o = &r.out[k];
            if (o->setup[0])
                fail_msg("%s: rank %d: %s", where, k, o->setup);
            if (o->failed_in != in)
                fail_msg("%s: rank %d failed in %s, rank 0 in %s", where, k,
                         call_names[o->failed_in], call_names[in]);
            if (in == CALL_DONE)
                continue;
            /* a fused reduction aborted while writing says so, with the abort as its cause */
            bool aborted = o->st == SELDP_ERR_ABORTED ||
                           (o->st == SELDP_ERR_GRADS_UNDEFINED && strstr(o->msg, "ABORTED"));
            if (!aborted || !strstr(o->msg, named))
                fail_msg("%s: rank %d returned %s, expected aborted naming rank %d: %s", where, k,
                         seldp_status_name(o->st), w.via, o->msg);
            if (o->returned_at - w.aborted_at > RETURN_S + STALL_S)
                fail_msg("%s: rank %d returned %.3f s after the abort", where, k,
                         o->returned_at - w.aborted_at);
        }
        /* it fails in the call it was aborted in, or (when that call's work was all done
         * already) in the next one; only after the last collective may everything succeed */
        if (in != CALL_DONE && in != expected && in != expected + 1)
            fail_msg("%s: every rank failed in %s", where, call_names[in]);
        if (in == CALL_DONE && point + 1 != points[CALL_DONE])
            fail_msg("%s: every call succeeded", where);
        failed_runs += in != CALL_DONE;
        if (getenv("SELDP_TEST_VERBOSE"))
            printf("    %s: %s\n", where, r.out[(held + 2) % NRANKS].msg);
    }
    printf("  %s: %d points, %d aborted runs\n",
           action == SELDP__FAULT_STALL ? "before arriving" : "inside", runs, failed_runs);
}

static void abort_while_a_rank_is_late_to_arrive(void **state)
{
    (void)state;
    abort_at_every_point(SELDP__FAULT_STALL);
}

static void abort_while_a_rank_is_inside(void **state)
{
    (void)state;
    abort_at_every_point(SELDP__FAULT_STALL_INSIDE);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(abort_while_a_rank_is_late_to_arrive),
        cmocka_unit_test(abort_while_a_rank_is_inside),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
