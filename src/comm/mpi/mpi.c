/* The MPI transport: one process per rank, with the host transport's semantics. This file
 * makes and destroys worlds and groups and holds the table of calls; mpi_protocol.c is what
 * every collective goes through (headers, agreement, waits, abort, parking), and
 * mpi_collectives.c what each one moves (see mpi_impl.h).
 *
 * A world is the duplicate of the communicator given to seldp_mpi_comm_init, plus a
 * second duplicate (`ctrl`) that carries only abort notices and census questions: every
 * process keeps one receive of each posted on it and tests them while it waits. A rank
 * that times out, fails inside a body, or calls seldp_comm_abort sends a notice with its
 * reason to every process of the world; their pending and later calls on any communicator
 * of the world then fail with that status (SELDP_ERR_TIMEOUT for a timeout, else
 * SELDP_ERR_ABORTED) and reason, as on the host transport. */
#define _POSIX_C_SOURCE 200809L

#include <limits.h>
#include <stddef.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mpi.h>

#include "comm/mpi/mpi_fault.h"
#include "comm/mpi/mpi_impl.h"
#include "device.h"
#include "env.h"
#include "internal.h"
#include "seldp/mpi.h"
#ifdef SELDP_HAVE_NCCL
#include "seldp/nccl.h"
#endif

static const seldp_comm_ops mpi_ops;

/* ---- groups and worlds ---------------------------------------------------------------- */

static void world_release(mpi_world *w)
{
    if (--w->refs > 0)
        return;
    MPI_Request *recvs[2] = {&w->notice_recv, &w->census_recv};
    for (int i = 0; i < 2; i++) {
        if (*recvs[i] != MPI_REQUEST_NULL) {
            /* Cancelling a receive completes locally; a message that already matched is
             * kept. */
            MPI_Cancel(recvs[i]);
            MPI_Wait(recvs[i], MPI_STATUS_IGNORE);
        }
    }
    seldp__mpi_unpark_world(w);
    if (!w->aborted)
        MPI_Comm_free(&w->ctrl);
    pthread_mutex_destroy(&w->lock);
    free(w);
}

/* A communicator of an aborted world is never freed. Other processes may still have
 * messages on their way to it (a header exchange this rank never joined, a notice), and
 * MPI delivers a message for a freed communicator to the next one it creates with the
 * same context id: a later world would match them in place of its own. Kept, they land in
 * the old communicator's queue, at the cost of one handle per group of an aborted world. */
static void group_free(mpi_group *g)
{
    /* Operations still pending keep the communicator alive inside MPI. */
    if (g->comm != MPI_COMM_NULL && !g->world->aborted)
        MPI_Comm_free(&g->comm);
    for (int k = 0; k < BUF_COUNT; k++)
        seldp__pinned_free(g->buf[k]);
    free(g->world_ranks);
    free(g);
}

seldp_status seldp__mpi_group_new(mpi_world *w, MPI_Comm mc, int64_t id, int world_rank,
                                  seldp_device device, seldp_comm **out)
{
    int rank = 0, size = 0;
    MPI_Comm_rank(mc, &rank);
    MPI_Comm_size(mc, &size);
    mpi_group *g = calloc(1, sizeof *g);
    seldp_comm *comm = NULL;
    if (g) {
        g->world = w;
        g->comm = mc;
        g->id = id;
        g->device = device;
        g->clean = true;
        g->world_ranks = malloc((size_t)size * sizeof *g->world_ranks);
    }
    if (g && g->world_ranks) {
        MPI_Group from, to;
        MPI_Comm_group(mc, &from);
        MPI_Comm_group(w->ctrl, &to); /* ctrl duplicates the parent: world numbering */
        for (int r = 0; r < size; r++)
            g->world_ranks[r] = r;
        MPI_Group_translate_ranks(from, size, g->world_ranks, to, g->world_ranks);
        MPI_Group_free(&from);
        MPI_Group_free(&to);
        comm = seldp__comm_new(&mpi_ops, rank, size, world_rank, device, g);
    }
    if (!comm) {
        if (g) {
            g->comm = MPI_COMM_NULL; /* the caller still owns mc */
            group_free(g);
        }
        return seldp__fail(SELDP_ERR_NOMEM, "rank %d: out of memory creating a communicator", rank);
    }
    w->refs++;
    *out = comm;
    return SELDP_OK;
}

/* ---- the calls: one thread inside a world at a time ----------------------------------- */

static mpi_world *world_enter(seldp_comm *comm)
{
    mpi_world *w = seldp__mpi_group(comm)->world;
    pthread_mutex_lock(&w->lock);
    return w;
}

/* The end of a call: the test hook's stall after it, then no stall stays armed. */
static seldp_status world_leave(seldp_comm *comm, mpi_world *w, seldp_status st)
{
    mpi_group *g = seldp__mpi_group(comm);
    seldp__mpi_stall_point(g, SELDP__MPI_STALL_LEAVE);
    g->stall_phase = 0;
    pthread_mutex_unlock(&w->lock);
    return st;
}

static seldp_status mpi_barrier(seldp_comm *comm)
{
    mpi_world *w = world_enter(comm);
    return world_leave(comm, w, seldp__mpi_barrier(comm));
}

static seldp_status mpi_broadcast(seldp_comm *comm, void *buf, size_t bytes, int root,
                                  seldp_device mem)
{
    mpi_world *w = world_enter(comm);
    return world_leave(comm, w, seldp__mpi_broadcast(comm, buf, bytes, root, mem));
}

static seldp_status mpi_allreduce(seldp_comm *comm, const void *send, void *recv, size_t count,
                                  seldp_dtype dtype, seldp_device mem)
{
    mpi_world *w = world_enter(comm);
    return world_leave(comm, w, seldp__mpi_allreduce(comm, send, recv, count, dtype, mem));
}

static seldp_status mpi_allgather(seldp_comm *comm, const void *send, void *recv, size_t bytes,
                                  seldp_device mem)
{
    mpi_world *w = world_enter(comm);
    return world_leave(comm, w, seldp__mpi_allgather(comm, send, recv, bytes, mem));
}

static seldp_status mpi_allgatherv(seldp_comm *comm, const void *send, size_t send_bytes,
                                   void **recv, size_t *recv_bytes)
{
    mpi_world *w = world_enter(comm);
    return world_leave(comm, w, seldp__mpi_allgatherv(comm, send, send_bytes, recv, recv_bytes));
}

static seldp_status mpi_alltoallv(seldp_comm *comm, const void *send, const size_t *send_bytes,
                                  const size_t *send_displs, void *recv, const size_t *recv_bytes,
                                  const size_t *recv_displs, seldp_device mem, size_t send_extent,
                                  size_t recv_extent)
{
    (void)send_extent; /* alltoallv_locked computes them */
    (void)recv_extent;
    mpi_world *w = world_enter(comm);
    return world_leave(comm, w,
                       seldp__mpi_alltoallv(comm, send, send_bytes, send_displs, recv, recv_bytes,
                                            recv_displs, mem));
}

static seldp_status mpi_reduce_scatter(seldp_comm *comm, const void *send, void *recv,
                                       const size_t *recv_counts, seldp_dtype dtype,
                                       seldp_device mem)
{
    mpi_world *w = world_enter(comm);
    return world_leave(comm, w,
                       seldp__mpi_reduce_scatter(comm, send, recv, recv_counts, dtype, mem));
}

static seldp_status mpi_allgather_counts(seldp_comm *comm, const void *send, void *recv,
                                         const size_t *counts, seldp_dtype dtype, seldp_device mem)
{
    mpi_world *w = world_enter(comm);
    return world_leave(comm, w, seldp__mpi_allgather_counts(comm, send, recv, counts, dtype, mem));
}

static seldp_status mpi_split(seldp_comm *comm, int color, int key, seldp_comm **out)
{
    mpi_world *w = world_enter(comm);
    return world_leave(comm, w, seldp__mpi_split(comm, color, key, out));
}

/* Any thread, any time (a watchdog's ncclCommAbort): the request is recorded at once; the
 * notices go out now when this thread may call MPI (the thread that joined, or any under
 * MPI_THREAD_MULTIPLE) and no call of the world is running, else from the thread inside
 * the running call at its next poll, or at the next call of the world. */
static void mpi_abort(seldp_comm *comm)
{
    mpi_world *w = seldp__mpi_group(comm)->world;
    atomic_store(&w->abort_asked, true);
    if (!pthread_equal(pthread_self(), w->owner) && w->thread_level != MPI_THREAD_MULTIPLE)
        return;
    if (pthread_mutex_trylock(&w->lock) != 0)
        return; /* a call is running: it sends the notices at its next poll */
    seldp__mpi_world_abort(w, SELDP_ERR_ABORTED, "rank %d aborted the world", comm->world_rank);
    pthread_mutex_unlock(&w->lock);
}

static void mpi_destroy(seldp_comm *comm)
{
    mpi_group *g = seldp__mpi_group(comm);
    mpi_world *w = world_enter(comm);
    (void)seldp__mpi_world_poll(
        w); /* an abort asked from another thread leaves now at the latest */
    seldp__mpi_reap(w);
    group_free(g);
    pthread_mutex_unlock(&w->lock);
    world_release(w);
    seldp__comm_free(comm);
}

static const seldp_comm_ops mpi_ops = {
    .name = "mpi",
    .barrier = mpi_barrier,
    .broadcast = mpi_broadcast,
    .allreduce = mpi_allreduce,
    .allgather = mpi_allgather,
    .allgatherv = mpi_allgatherv,
    .alltoallv = mpi_alltoallv,
    .split = mpi_split,
    .reduce_scatter = mpi_reduce_scatter,
    .allgather_counts = mpi_allgather_counts,
    .abort = mpi_abort,
    .destroy = mpi_destroy,
};

seldp_status seldp__mpi_fault_stall(seldp_comm *comm, seldp__mpi_stall where, double seconds)
{
    if (!comm || comm->ops != &mpi_ops)
        return seldp__fail(SELDP_ERR_INVALID_ARGUMENT,
                           "mpi_fault_stall: comm is %s, expected an MPI communicator",
                           comm ? comm->ops->name : "NULL");
    if (where < SELDP__MPI_STALL_ARRIVE || where > SELDP__MPI_STALL_LEAVE)
        return seldp__fail(SELDP_ERR_INVALID_ARGUMENT,
                           "rank %d: mpi_fault_stall: phase %d, expected 1 to 4", comm->rank,
                           (int)where);
    if (!(seconds > 0 && seconds < 3600))
        return seldp__fail(SELDP_ERR_INVALID_ARGUMENT,
                           "rank %d: mpi_fault_stall: %g s, expected in (0, 3600)", comm->rank,
                           seconds);
    mpi_world *w = world_enter(comm);
    mpi_group *g = seldp__mpi_group(comm);
    g->stall_phase = (int)where;
    g->stall_s = seconds;
    pthread_mutex_unlock(&w->lock);
    return SELDP_OK;
}

/* ---- init ------------------------------------------------------------------------------ */

/* The bound on one message: 1 GiB, lowered by SELDP_MPI_MAX_MESSAGE. */
static size_t local_max_message(void)
{
    unsigned long long v = 0; /* 1 to 1 GiB; another value is ignored */
    if (!seldp__env_number(SELDP__ENV_MPI_MAX_MESSAGE, &v) || v > SELDP__MPI_MAX_MESSAGE)
        return SELDP__MPI_MAX_MESSAGE;
    return (size_t)v;
}

/* What a join hands MPI: heap memory, parked with its request when the join times out
 * (MPI writes the new communicator's handle and the agreed bound when it completes). */
typedef struct join_state {
    MPI_Request reqs[2];
    MPI_Comm ctrl, data;
    int64_t mine[2], agreed[2]; /* -(bound on a message), world id */
} join_state;

/* The largest world id this process has joined. */
static _Atomic int64_t joined;

/* Poll a request that builds a world (no abort channel exists yet) until `deadline`. On a
 * timeout the caller parks what the request uses. */
static seldp_status init_wait(int rank, const char *call, MPI_Request *reqs, int n,
                              double timeout_s, double deadline)
{
    seldp__proto_backoff backoff = SELDP__PROTO_BACKOFF_INIT;
    for (;;) {
        int done = 0;
        int err = MPI_Testall(n, reqs, &done, MPI_STATUSES_IGNORE);
        if (err != MPI_SUCCESS) {
            char text[MPI_MAX_ERROR_STRING];
            seldp__mpi_error_text(err, text, sizeof text);
            return seldp__fail(SELDP_ERR_TRANSPORT, "rank %d: %s: MPI failed: %s", rank, call,
                               text);
        }
        if (done)
            return SELDP_OK;
        if (seldp__proto_now() > deadline)
            return seldp__fail(SELDP_ERR_TIMEOUT,
                               "rank %d: %s timed out after %g s waiting for the other ranks", rank,
                               call, timeout_s);
        seldp__proto_backoff_wait(&backoff);
    }
}

seldp_status seldp_mpi_comm_init(MPI_Comm parent, seldp_device device, const seldp_comm_config *cfg,
                                 seldp_comm **out)
{
    seldp_comm_config defaults = SELDP_COMM_CONFIG_INIT;
    seldp_status st = SELDP_OK;
    mpi_world *w = NULL;
    join_state *js = NULL;
    int initialized = 0, finalized = 0, rank = -1, err;
    char text[MPI_MAX_ERROR_STRING];

    if (!out)
        return seldp__fail(SELDP_ERR_INVALID_ARGUMENT, "mpi_comm_init: out is NULL");
    *out = NULL;
    st = seldp__config_read(&defaults, sizeof defaults, cfg, "seldp_mpi_comm_init",
                            "seldp_comm_config", "SELDP_COMM_CONFIG_INIT");
    if (st != SELDP_OK)
        return st;
    cfg = &defaults;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (!initialized || finalized)
        return seldp__fail(SELDP_ERR_INVALID_ARGUMENT,
                           "mpi_comm_init: MPI is %s; call MPI_Init before and MPI_Finalize after",
                           finalized ? "already finalized" : "not initialized");
    if (parent == MPI_COMM_NULL)
        return seldp__fail(SELDP_ERR_INVALID_ARGUMENT, "mpi_comm_init: parent is MPI_COMM_NULL");
    MPI_Comm_rank(parent, &rank);
    if (!(cfg->timeout_s > 0))
        return seldp__fail(SELDP_ERR_INVALID_ARGUMENT,
                           "rank %d: mpi_comm_init: timeout %g s, expected > 0", rank,
                           cfg->timeout_s);
    if (device.kind != SELDP_DEVICE_HOST &&
        (device.kind != SELDP_DEVICE_CUDA || device.ordinal < 0))
        return seldp__fail(SELDP_ERR_INVALID_ARGUMENT,
                           "rank %d: mpi_comm_init: invalid device (kind %d, ordinal %d)", rank,
                           (int)device.kind, device.ordinal);

    w = calloc(1, sizeof *w);
    js = calloc(1, sizeof *js);
    if (!w || !js) {
        free(w);
        free(js);
        return seldp__fail(SELDP_ERR_NOMEM, "rank %d: mpi_comm_init: out of memory", rank);
    }
    if (pthread_mutex_init(&w->lock, NULL) != 0) {
        free(w);
        free(js);
        return seldp__fail(SELDP_ERR_INTERNAL, "rank %d: mpi_comm_init: pthread_mutex_init failed",
                           rank);
    }
    w->owner = pthread_self();
    MPI_Query_thread(&w->thread_level);
    atomic_init(&w->abort_asked, false);
    js->ctrl = js->data = MPI_COMM_NULL;
    js->reqs[0] = js->reqs[1] = MPI_REQUEST_NULL;
    w->ctrl = MPI_COMM_NULL;
    w->notice_recv = w->census_recv = MPI_REQUEST_NULL;
    w->rank = rank;
    MPI_Comm_size(parent, &w->size);
    w->timeout_s = cfg->timeout_s;
    seldp__mpi_reap(w); /* what earlier worlds left pending */

    /* Both duplicates in flight at once: a join costs one round of latency less. */
    double deadline = seldp__proto_now() + cfg->timeout_s;
    err = MPI_Comm_idup(parent, &js->ctrl, &js->reqs[0]);
    if (err == MPI_SUCCESS)
        err = MPI_Comm_idup(parent, &js->data, &js->reqs[1]);
    if (err != MPI_SUCCESS) {
        seldp__mpi_error_text(err, text, sizeof text);
        SELDP_FAIL(SELDP_ERR_TRANSPORT, "rank %d: init: MPI_Comm_idup failed: %s", rank, text);
    }
    SELDP_CHECK(init_wait(rank, "init", js->reqs, 2, cfg->timeout_s, deadline));
    w->ctrl = js->ctrl;
    MPI_Comm_set_errhandler(js->ctrl, MPI_ERRORS_RETURN);
    MPI_Comm_set_errhandler(js->data, MPI_ERRORS_RETURN);

    /* Messages must be cut alike on every rank: the smallest bound wins. The world's id
     * is the largest of the ranks' next ids. Both are one MPI_MAX. */
    js->mine[0] = -(int64_t)local_max_message();
    js->mine[1] = atomic_load(&joined) + 1;
    err = MPI_Iallreduce(js->mine, js->agreed, 2, MPI_INT64_T, MPI_MAX, js->data, &js->reqs[0]);
    if (err != MPI_SUCCESS) {
        seldp__mpi_error_text(err, text, sizeof text);
        SELDP_FAIL(SELDP_ERR_TRANSPORT, "rank %d: init: MPI_Iallreduce failed: %s", rank, text);
    }
    SELDP_CHECK(
        init_wait(rank, "init", js->reqs, 1, cfg->timeout_s, seldp__proto_now() + cfg->timeout_s));
    w->max_message = (size_t)-js->agreed[0];
    w->id = js->agreed[1];
    atomic_store(&joined, w->id);

    err = MPI_Irecv(&w->incoming, (int)sizeof w->incoming, MPI_BYTE, MPI_ANY_SOURCE, TAG_ABORT,
                    w->ctrl, &w->notice_recv);
    if (err == MPI_SUCCESS)
        err = MPI_Irecv(&w->census_in, (int)sizeof w->census_in, MPI_BYTE, MPI_ANY_SOURCE,
                        TAG_CENSUS, w->ctrl, &w->census_recv);
    if (err != MPI_SUCCESS) {
        seldp__mpi_error_text(err, text, sizeof text);
        SELDP_FAIL(SELDP_ERR_TRANSPORT, "rank %d: init: MPI_Irecv failed: %s", rank, text);
    }
    SELDP_CHECK(seldp__mpi_group_new(w, js->data, 1, rank, device, out));
    free(js);
    return SELDP_OK;

fail:
    if (st == SELDP_ERR_TIMEOUT) {
        /* A duplicate or the agreement is still pending inside MPI, which writes into js
         * when it completes: parked with it. */
        void *mem[1] = {js};
        seldp__mpi_park_orphan(js->reqs, 2, mem, 1);
        js = NULL;
    }
    MPI_Request *recvs[2] = {&w->notice_recv, &w->census_recv};
    for (int i = 0; i < 2; i++) {
        if (*recvs[i] != MPI_REQUEST_NULL) {
            MPI_Cancel(recvs[i]);
            MPI_Wait(recvs[i], MPI_STATUS_IGNORE);
        }
    }
    if (js && js->data != MPI_COMM_NULL)
        MPI_Comm_free(&js->data);
    if (js && js->ctrl != MPI_COMM_NULL)
        MPI_Comm_free(&js->ctrl);
    pthread_mutex_destroy(&w->lock);
    free(w);
    free(js);
    return st;
}

/* ---- NCCL bootstrapped over MPI ------------------------------------------------------- */

#ifdef SELDP_HAVE_NCCL
/* What rank 0 broadcasts: its NCCL unique id, or why it could not draw one. */
typedef struct nccl_bootstrap {
    int32_t status;
    unsigned char id[SELDP_NCCL_UNIQUE_ID_BYTES];
    char reason[380];
    /* not broadcast: */
    MPI_Comm dup;
    MPI_Request req;
} nccl_bootstrap;
#endif

seldp_status seldp_mpi_nccl_comm_init(MPI_Comm parent, const seldp_comm_config *cfg,
                                      seldp_comm **out)
{
    seldp_comm_config defaults = SELDP_COMM_CONFIG_INIT;
    int initialized = 0, finalized = 0, rank = -1, size = 0;

    if (!out)
        return seldp__fail(SELDP_ERR_INVALID_ARGUMENT, "mpi_nccl_comm_init: out is NULL");
    *out = NULL;
    seldp_status read =
        seldp__config_read(&defaults, sizeof defaults, cfg, "seldp_mpi_nccl_comm_init",
                           "seldp_comm_config", "SELDP_COMM_CONFIG_INIT");
    if (read != SELDP_OK)
        return read;
    cfg = &defaults;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (!initialized || finalized)
        return seldp__fail(SELDP_ERR_INVALID_ARGUMENT,
                           "mpi_nccl_comm_init: MPI is %s; call MPI_Init before and "
                           "MPI_Finalize after",
                           finalized ? "already finalized" : "not initialized");
    if (parent == MPI_COMM_NULL)
        return seldp__fail(SELDP_ERR_INVALID_ARGUMENT,
                           "mpi_nccl_comm_init: parent is MPI_COMM_NULL");
    MPI_Comm_rank(parent, &rank);
    MPI_Comm_size(parent, &size);
#ifndef SELDP_HAVE_NCCL
    (void)size;
    return seldp__fail(SELDP_ERR_UNSUPPORTED,
                       "rank %d: mpi_nccl_comm_init: this build has no NCCL transport "
                       "(configure with -DSELDP_WITH_NCCL=ON on a machine with CUDA and NCCL)",
                       rank);
#else
    seldp_status st = SELDP_OK;
    char text[MPI_MAX_ERROR_STRING];
    nccl_bootstrap *boot = NULL;
    if (!(cfg->timeout_s > 0))
        return seldp__fail(SELDP_ERR_INVALID_ARGUMENT,
                           "rank %d: mpi_nccl_comm_init: timeout %g s, expected > 0", rank,
                           cfg->timeout_s);
    /* heap, not stack: after a timeout MPI may still write into it (parked then) */
    boot = calloc(1, sizeof *boot);
    if (!boot)
        return seldp__fail(SELDP_ERR_NOMEM, "rank %d: mpi_nccl_comm_init: out of memory", rank);
    boot->dup = MPI_COMM_NULL;
    boot->req = MPI_REQUEST_NULL;

    /* The broadcast travels on a private duplicate: the caller's communicator keeps its
     * error handler and sees no traffic. */
    int err = MPI_Comm_idup(parent, &boot->dup, &boot->req);
    if (err != MPI_SUCCESS) {
        seldp__mpi_error_text(err, text, sizeof text);
        SELDP_FAIL(SELDP_ERR_TRANSPORT, "rank %d: mpi_nccl_comm_init: MPI_Comm_idup failed: %s",
                   rank, text);
    }
    SELDP_CHECK(init_wait(rank, "mpi_nccl_comm_init", &boot->req, 1, cfg->timeout_s,
                          seldp__proto_now() + cfg->timeout_s));
    MPI_Comm_set_errhandler(boot->dup, MPI_ERRORS_RETURN);

    /* Rank 0 draws the id; a failure travels in its place so that every rank returns it. */
    if (rank == 0) {
        boot->status = (int32_t)seldp_nccl_get_unique_id(boot->id);
        if (boot->status != SELDP_OK)
            snprintf(boot->reason, sizeof boot->reason, "%s", seldp_last_error());
    }
    err = MPI_Ibcast(&boot->status, (int)offsetof(nccl_bootstrap, dup), MPI_BYTE, 0, boot->dup,
                     &boot->req);
    if (err != MPI_SUCCESS) {
        seldp__mpi_error_text(err, text, sizeof text);
        SELDP_FAIL(SELDP_ERR_TRANSPORT, "rank %d: mpi_nccl_comm_init: MPI_Ibcast failed: %s", rank,
                   text);
    }
    SELDP_CHECK(init_wait(rank, "mpi_nccl_comm_init", &boot->req, 1, cfg->timeout_s,
                          seldp__proto_now() + cfg->timeout_s));
    if (boot->status != SELDP_OK)
        SELDP_FAIL((seldp_status)boot->status,
                   "rank %d: mpi_nccl_comm_init: rank 0 could not draw an NCCL unique id: %s", rank,
                   boot->reason);
    SELDP_CHECK(seldp_nccl_comm_init_with_id(boot->id, size, rank, cfg, out));

fail:
    if (st == SELDP_ERR_TIMEOUT) {
        /* the duplicate or the broadcast is still pending inside MPI: parked */
        void *mem[1] = {boot};
        seldp__mpi_park_orphan(&boot->req, 1, mem, 1);
        return st;
    }
    if (boot->dup != MPI_COMM_NULL)
        MPI_Comm_free(&boot->dup);
    free(boot);
    return st;
#endif
}
