/* The MPI transport: one process per rank, with the host transport's semantics.
 *
 * Every collective runs in two steps, like the host transport's rendezvous:
 *   1. header: each rank sends every other rank of the group a small header (the call,
 *      its sizes, root, dtype, split color and key, and whether this rank could stage
 *      its buffers) by non-blocking point-to-point messages. Once all headers are in,
 *      every rank has arrived and every rank reaches the same verdict: the calls agree,
 *      or every rank returns the same SELDP_ERR_DISAGREE (or the staging failure of
 *      the rank that had one). A rank whose header is missing at the deadline is named.
 *   2. body: the data moves by non-blocking MPI calls (MPI_Ibcast, MPI_Ialltoallv,
 *      MPI_Iallgatherv, MPI_Isend/MPI_Irecv), polled with MPI_Test against a deadline.
 * A barrier is a header alone.
 *
 * A world is the duplicate of the communicator given to seldp_mpi_comm_init, plus a
 * second duplicate (`ctrl`) that carries only abort notices: every process keeps one
 * receive posted on it and tests it while it waits. A rank that times out, fails
 * inside a body, or calls seldp_comm_abort sends a notice with its reason to every
 * process of the world; their pending and later calls on any communicator of the world
 * then fail with that status (SELDP_ERR_TIMEOUT for a timeout, else SELDP_ERR_ABORTED)
 * and reason, as on the host transport.
 *
 * MPI cannot cancel a pending collective: when a body gives up, its requests and
 * buffers are abandoned (never freed), since MPI may still use them. */
#define _POSIX_C_SOURCE 200809L /* clock_gettime, nanosleep */

#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <mpi.h>

#include "comm/comm_impl.h"
#include "device.h"
#include "internal.h"
#include "seldp/mpi.h"
#ifdef SELDP_HAVE_NCCL
#include "seldp/nccl.h"
#endif

/* Upper bound of one MPI message: far inside MPI's int counts. */
#define MAX_MESSAGE ((size_t)1 << 30)

enum { TAG_ABORT = 1, TAG_HEADER = 2, TAG_ALLTOALLV = 3 };

/* What one rank announces for one collective; int64 fields so it travels as one array. */
typedef struct header {
    int64_t op;
    int64_t staged; /* SELDP_OK, or why this rank could not prepare its buffers */
    int64_t root;
    int64_t bytes; /* broadcast, allgather: per rank; allgatherv: this rank's blob */
    int64_t count; /* allreduce */
    int64_t dtype;
    int64_t color, key; /* split */
} header;

#define HEADER_WORDS ((int)(sizeof(header) / sizeof(int64_t)))

/* An abort notice: the status the other ranks return and the reason they print. */
typedef struct notice {
    int32_t status;
    int32_t from; /* world rank */
    char reason[504];
} notice;

typedef struct mpi_world {
    MPI_Comm ctrl; /* abort notices only */
    int rank, size;
    double timeout_s;
    size_t max_message;
    int refs; /* communicators of this world alive */

    MPI_Request notice_recv;
    notice incoming, outgoing;
    MPI_Request *notice_sends; /* one per world rank, while outgoing is in flight */
    /* Held by the thread inside a call of this world (and by seldp_comm_abort while it
     * sends notices); everything below it and every MPI call on the world's
     * communicators is under it. */
    pthread_mutex_t lock;
    pthread_t owner;         /* the thread that joined: may call MPI under any thread level */
    int thread_level;        /* MPI_Query_thread at the join */
    atomic_bool abort_asked; /* seldp_comm_abort from a thread that could not send */
    bool aborted;
    seldp_status abort_status;
    char abort_reason[sizeof(((notice *)0)->reason)];
} mpi_world;

typedef struct mpi_group {
    mpi_world *world;
    MPI_Comm comm;
    int *world_ranks;  /* group rank -> world rank */
    header *headers;   /* the current collective's, one per group rank */
    header sent;       /* this rank's, alive until its sends complete */
    MPI_Request *reqs; /* header messages: receives [0, n), sends [n, 2n) */
    bool abandoned;    /* MPI may still use the buffers above */
} mpi_group;

static const seldp_comm_ops mpi_ops;

static mpi_group *group_of(const seldp_comm *comm)
{
    return comm->impl;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Ranks often share cores: spin a little, then sleep a little longer each round. */
static void backoff(int polls, double *nap)
{
    if (polls < 64)
        return;
    struct timespec ts = {0, (long)(*nap * 1e9)};
    nanosleep(&ts, NULL);
    if (*nap < 1e-3)
        *nap *= 2;
}

static void mpi_error_text(int err, char *text, size_t size)
{
    char buf[MPI_MAX_ERROR_STRING] = "";
    int len = 0;
    MPI_Error_string(err, buf, &len);
    snprintf(text, size, "%s", buf);
}

/* ---- abort ----------------------------------------------------------------------- */

/* Mark the world aborted (the first reason wins) and send the notice to every other
 * process. Local and non-blocking: the notices are small enough to go eagerly; their
 * requests are completed by later calls or freed with the world. */
#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
static void
world_abort(mpi_world *w, seldp_status status, const char *fmt, ...);

static void world_abort(mpi_world *w, seldp_status status, const char *fmt, ...)
{
    if (w->aborted)
        return;
    w->aborted = true;
    w->abort_status = status;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(w->abort_reason, sizeof w->abort_reason, fmt, ap);
    va_end(ap);
    w->outgoing.status = (int32_t)status;
    w->outgoing.from = w->rank;
    memcpy(w->outgoing.reason, w->abort_reason, sizeof w->outgoing.reason);
    w->notice_sends = malloc((size_t)w->size * sizeof *w->notice_sends);
    if (!w->notice_sends)
        return; /* the others will time out instead */
    for (int p = 0; p < w->size; p++) {
        w->notice_sends[p] = MPI_REQUEST_NULL;
        if (p != w->rank)
            MPI_Isend(&w->outgoing, (int)sizeof w->outgoing, MPI_BYTE, p, TAG_ABORT, w->ctrl,
                      &w->notice_sends[p]);
    }
    int done = 0;
    MPI_Testall(w->size, w->notice_sends, &done, MPI_STATUSES_IGNORE);
}

/* True once the world is aborted, here or by a notice from another process. */
static bool world_poll_abort(mpi_world *w)
{
    if (w->aborted)
        return true;
    if (atomic_load(&w->abort_asked)) {
        world_abort(w, SELDP_ERR_ABORTED, "rank %d aborted the world", w->rank);
        return true;
    }
    int arrived = 0;
    if (MPI_Test(&w->notice_recv, &arrived, MPI_STATUS_IGNORE) != MPI_SUCCESS || !arrived)
        return false;
    w->aborted = true;
    w->abort_status =
        w->incoming.status == SELDP_ERR_TIMEOUT ? SELDP_ERR_TIMEOUT : SELDP_ERR_ABORTED;
    w->incoming.reason[sizeof w->incoming.reason - 1] = '\0';
    memcpy(w->abort_reason, w->incoming.reason, sizeof w->abort_reason);
    return true;
}

static seldp_status aborted_error(const seldp_comm *comm, seldp__comm_op op)
{
    const mpi_world *w = group_of(comm)->world;
    return seldp__fail(w->abort_status, "rank %d: %s aborted: %s", comm->rank,
                       seldp__comm_op_name(op), w->abort_reason);
}

/* A failure of this rank inside a body, where the others may be waiting for it: abort
 * the world so that they return too. `st` and its message are kept. */
static seldp_status fail_alone(seldp_comm *comm, seldp__comm_op op, seldp_status st)
{
    world_abort(group_of(comm)->world, SELDP_ERR_ABORTED, "rank %d failed in %s: %s",
                comm->world_rank, seldp__comm_op_name(op), seldp_last_error());
    return st;
}

static seldp_status mpi_call_failed(seldp_comm *comm, seldp__comm_op op, const char *call, int err)
{
    char text[MPI_MAX_ERROR_STRING];
    mpi_error_text(err, text, sizeof text);
    return fail_alone(comm, op,
                      seldp__fail(SELDP_ERR_TRANSPORT, "rank %d: %s: %s failed: %s", comm->rank,
                                  seldp__comm_op_name(op), call, text));
}

/* ---- waiting ----------------------------------------------------------------------- */

/* Poll a body's requests until all complete, the world aborts or `deadline` passes.
 * Every rank had arrived (the headers said so): a timeout here means a rank stalled
 * or died inside the operation. Any failure aborts the world and abandons the body. */
static seldp_status body_wait(seldp_comm *comm, seldp__comm_op op, MPI_Request *reqs, int n,
                              double deadline)
{
    mpi_group *g = group_of(comm);
    mpi_world *w = g->world;
    double nap = 1e-6;
    for (int polls = 0;; polls++) {
        int done = 0;
        /* MPI_Test reports a single request's own error, not MPI_ERR_IN_STATUS. */
        int err = n == 1 ? MPI_Test(reqs, &done, MPI_STATUS_IGNORE)
                         : MPI_Testall(n, reqs, &done, MPI_STATUSES_IGNORE);
        if (err != MPI_SUCCESS) {
            g->abandoned = true;
            return mpi_call_failed(comm, op, n == 1 ? "MPI_Test" : "MPI_Testall", err);
        }
        if (done)
            return SELDP_OK;
        if (world_poll_abort(w)) {
            g->abandoned = true;
            return aborted_error(comm, op);
        }
        if (now_s() > deadline) {
            g->abandoned = true;
            world_abort(w, SELDP_ERR_TIMEOUT, "rank %d timed out after %g s inside %s",
                        comm->world_rank, w->timeout_s, seldp__comm_op_name(op));
            return seldp__fail(SELDP_ERR_TIMEOUT,
                               "rank %d: %s timed out after %g s inside the operation (every "
                               "rank of the %d had arrived)",
                               comm->rank, seldp__comm_op_name(op), w->timeout_s, comm->size);
        }
        backoff(polls, &nap);
    }
}

/* Append "a, b and c" style lists of the ranks whose header has not arrived. */
static int missing_ranks(const mpi_group *g, int size, int me, bool world_numbering, char *buf,
                         size_t bufsize)
{
    int n = 0;
    size_t used = strlen(buf);
    for (int r = 0; r < size; r++) {
        int flag = 1;
        if (r != me)
            MPI_Request_get_status(g->reqs[r], &flag, MPI_STATUS_IGNORE);
        if (flag)
            continue;
        int shown = world_numbering ? g->world_ranks[r] : r;
        if (used < bufsize)
            used += (size_t)snprintf(buf + used, bufsize - used, "%s%d", n ? ", " : "", shown);
        n++;
    }
    return n;
}

/* Step 1 of every collective: exchange headers with every rank of the group. */
static seldp_status headers_exchange(seldp_comm *comm, const header *mine)
{
    mpi_group *g = group_of(comm);
    mpi_world *w = g->world;
    int n = comm->size, me = comm->rank;
    if (world_poll_abort(w))
        return aborted_error(comm, (seldp__comm_op)mine->op);
    g->sent = *mine;
    g->headers[me] = *mine;
    for (int p = 0; p < 2 * n; p++)
        g->reqs[p] = MPI_REQUEST_NULL;
    for (int p = 0; p < n; p++) {
        if (p == me)
            continue;
        int err = MPI_Irecv(&g->headers[p], HEADER_WORDS, MPI_INT64_T, p, TAG_HEADER, g->comm,
                            &g->reqs[p]);
        if (err == MPI_SUCCESS)
            err = MPI_Isend(&g->sent, HEADER_WORDS, MPI_INT64_T, p, TAG_HEADER, g->comm,
                            &g->reqs[n + p]);
        if (err != MPI_SUCCESS) {
            g->abandoned = true;
            return mpi_call_failed(comm, (seldp__comm_op)mine->op, "MPI_Isend/MPI_Irecv", err);
        }
    }

    const char *name = seldp__comm_op_name(mine->op);
    double deadline = now_s() + w->timeout_s, nap = 1e-6;
    for (int polls = 0;; polls++) {
        int done = 0;
        int err = MPI_Testall(2 * n, g->reqs, &done, MPI_STATUSES_IGNORE);
        if (err != MPI_SUCCESS) {
            g->abandoned = true;
            return mpi_call_failed(comm, (seldp__comm_op)mine->op, "MPI_Testall", err);
        }
        if (done)
            return SELDP_OK;
        if (world_poll_abort(w)) {
            g->abandoned = true;
            return aborted_error(comm, (seldp__comm_op)mine->op);
        }
        if (now_s() > deadline)
            break;
        backoff(polls, &nap);
    }
    char who[256] = "", world_who[256] = "";
    int missing = missing_ranks(g, n, me, false, who, sizeof who);
    missing_ranks(g, n, me, true, world_who, sizeof world_who);
    g->abandoned = true;
    world_abort(w, SELDP_ERR_TIMEOUT, "rank %d timed out after %g s in %s waiting for %s %s",
                comm->world_rank, w->timeout_s, name, missing > 1 ? "ranks" : "rank", world_who);
    return seldp__fail(SELDP_ERR_TIMEOUT,
                       "rank %d: %s timed out after %g s: %s %s had not arrived (%d of %d ranks "
                       "missing)",
                       comm->rank, name, w->timeout_s, missing > 1 ? "ranks" : "rank", who, missing,
                       n);
}

/* Why the headers of a collective do not agree, or SELDP_OK. Every rank holds the same
 * headers, so every rank reaches the same verdict (the host transport's checks). */
static seldp_status headers_agree(const seldp_comm *comm)
{
    const header *s = group_of(comm)->headers;
    const header *mine = &s[comm->rank];
    int n = comm->size;
    const char *name = seldp__comm_op_name(mine->op);
    for (int r = 0; r < n; r++) {
        if (s[r].op != mine->op)
            return seldp__fail(SELDP_ERR_DISAGREE,
                               "rank %d: %s: rank %d called %s at the same point, expected every "
                               "rank to call %s",
                               comm->rank, name, r, seldp__comm_op_name((int)s[r].op), name);
    }
    for (int r = 0; r < n; r++) {
        if (s[r].staged != SELDP_OK)
            return seldp__fail((seldp_status)s[r].staged,
                               "rank %d: %s: rank %d could not stage its buffers (%s)", comm->rank,
                               name, r, seldp_status_name((seldp_status)s[r].staged));
    }
    for (int r = 0; r < n; r++) {
        const header *o = &s[r];
        switch (mine->op) {
        case OP_BROADCAST:
            if (o->root != s[0].root || o->bytes != s[0].bytes)
                return seldp__fail(SELDP_ERR_DISAGREE,
                                   "rank %d: broadcast: rank 0 passed root %d and %zu bytes but "
                                   "rank %d root %d and %zu bytes",
                                   comm->rank, (int)s[0].root, (size_t)s[0].bytes, r, (int)o->root,
                                   (size_t)o->bytes);
            break;
        case OP_ALLREDUCE:
            if (o->count != s[0].count || o->dtype != s[0].dtype)
                return seldp__fail(SELDP_ERR_DISAGREE,
                                   "rank %d: allreduce: rank 0 passed %zu elements of %s but rank "
                                   "%d %zu of %s",
                                   comm->rank, (size_t)s[0].count,
                                   seldp_dtype_name((seldp_dtype)s[0].dtype), r, (size_t)o->count,
                                   seldp_dtype_name((seldp_dtype)o->dtype));
            break;
        case OP_ALLGATHER:
            if (o->bytes != s[0].bytes)
                return seldp__fail(SELDP_ERR_DISAGREE,
                                   "rank %d: allgather: rank 0 passed %zu bytes but rank %d %zu",
                                   comm->rank, (size_t)s[0].bytes, r, (size_t)o->bytes);
            break;
        default:
            break;
        }
    }
    return SELDP_OK;
}

/* Announce, wait for the group and check agreement. Nothing of the body has started
 * when this fails, so the caller may free its buffers. */
static seldp_status collective_begin(seldp_comm *comm, const header *mine)
{
    seldp_status st = headers_exchange(comm, mine);
    return st == SELDP_OK ? headers_agree(comm) : st;
}

static double body_deadline(const seldp_comm *comm)
{
    return now_s() + group_of(comm)->world->timeout_s;
}

/* ---- host staging of device buffers ---------------------------------------------- */

/* A host view of `bytes` at buf on `mem`: buf itself on the host unless `copy`, else
 * pinned memory, filled from buf when `fill`. Released by stage_release. */
static seldp_status stage(const void *buf, size_t bytes, seldp_device mem, bool fill, bool copy,
                          void **host)
{
    if (mem.kind == SELDP_DEVICE_HOST && !copy) {
        *host = (void *)buf;
        return SELDP_OK;
    }
    seldp_status st = seldp__pinned_alloc(bytes, host);
    if (st == SELDP_OK && fill && bytes)
        st = seldp__device_copy(*host, SELDP_HOST_DEVICE, buf, mem, bytes);
    if (st != SELDP_OK) {
        seldp__pinned_free(*host);
        *host = NULL;
    }
    return st;
}

static void stage_release(void *host, const void *buf)
{
    if (host != buf)
        seldp__pinned_free(host);
}

/* ---- barrier, broadcast -------------------------------------------------------------- */

static seldp_status barrier_locked(seldp_comm *comm)
{
    header h = {.op = OP_BARRIER};
    return collective_begin(comm, &h);
}

static seldp_status broadcast_locked(seldp_comm *comm, void *buf, size_t bytes, int root,
                                     seldp_device mem)
{
    mpi_group *g = group_of(comm);
    size_t piece = g->world->max_message;
    bool is_root = comm->rank == root, abandon = false;
    void *host = NULL;
    header h = {.op = OP_BROADCAST, .root = root, .bytes = (int64_t)bytes};
    h.staged = stage(buf, bytes, mem, is_root, false, &host);
    seldp_status st = collective_begin(comm, &h);
    if (st != SELDP_OK)
        goto fail;

    double deadline = body_deadline(comm);
    abandon = true;
    for (size_t off = 0; off < bytes; off += piece) {
        size_t len = bytes - off < piece ? bytes - off : piece;
        MPI_Request req = MPI_REQUEST_NULL;
        int err = MPI_Ibcast((char *)host + off, (int)len, MPI_BYTE, root, g->comm, &req);
        if (err != MPI_SUCCESS)
            SELDP_CHECK(mpi_call_failed(comm, OP_BROADCAST, "MPI_Ibcast", err));
        SELDP_CHECK(body_wait(comm, OP_BROADCAST, &req, 1, deadline));
    }
    abandon = false;
    if (!is_root && host != buf)
        st = seldp__device_copy(buf, mem, host, SELDP_HOST_DEVICE, bytes);
fail:
    if (!abandon && h.staged == SELDP_OK)
        stage_release(host, buf);
    return st;
}

/* ---- allgather, allgatherv ----------------------------------------------------------- */

/* Body of the gathers: rank r's lens[r] bytes (this rank's at `mine`) go to
 * dst + offsets[r] on every rank. One MPI_Iallgatherv when it all fits in one message;
 * otherwise rounds of at most max_message / n bytes per rank through a staging block.
 * Every rank derives the same rounds from lens, which every rank knows. On failure the
 * buffers are abandoned. */
static seldp_status gather_body(seldp_comm *comm, seldp__comm_op op, const void *mine,
                                const size_t *lens, char *dst, const size_t *offsets)
{
    mpi_group *g = group_of(comm);
    int n = comm->size;
    size_t limit = g->world->max_message;
    double deadline = body_deadline(comm);
    seldp_status st = SELDP_OK;
    char *block = NULL;
    int *counts = malloc(2 * (size_t)n * sizeof *counts);
    if (!counts)
        return fail_alone(comm, op,
                          seldp__fail(SELDP_ERR_NOMEM, "rank %d: %s: out of memory", comm->rank,
                                      seldp__comm_op_name(op)));
    int *displs = counts + n;

    size_t total = 0, longest = 0;
    bool direct = true;
    for (int r = 0; r < n; r++) {
        total += lens[r];
        longest = lens[r] > longest ? lens[r] : longest;
        direct = direct && offsets[r] <= limit;
    }
    if (direct && total <= limit) {
        for (int r = 0; r < n; r++) {
            counts[r] = (int)lens[r];
            displs[r] = (int)offsets[r];
        }
        MPI_Request req = MPI_REQUEST_NULL;
        int err = MPI_Iallgatherv(mine, counts[comm->rank], MPI_BYTE, dst, counts, displs, MPI_BYTE,
                                  g->comm, &req);
        if (err != MPI_SUCCESS)
            SELDP_CHECK(mpi_call_failed(comm, op, "MPI_Iallgatherv", err));
        SELDP_CHECK(body_wait(comm, op, &req, 1, deadline));
        goto fail;
    }

    size_t chunk = limit / (size_t)n ? limit / (size_t)n : 1;
    block = malloc(chunk * (size_t)n);
    if (!block)
        SELDP_CHECK(
            fail_alone(comm, op,
                       seldp__fail(SELDP_ERR_NOMEM, "rank %d: %s: out of memory staging %zu bytes",
                                   comm->rank, seldp__comm_op_name(op), chunk * (size_t)n)));
    for (size_t start = 0; start < longest; start += chunk) {
        int at = 0;
        for (int r = 0; r < n; r++) {
            size_t left = lens[r] > start ? lens[r] - start : 0;
            counts[r] = (int)(left < chunk ? left : chunk);
            displs[r] = at;
            at += counts[r];
        }
        const char *from = counts[comm->rank] ? (const char *)mine + start : mine;
        MPI_Request req = MPI_REQUEST_NULL;
        int err = MPI_Iallgatherv(from, counts[comm->rank], MPI_BYTE, block, counts, displs,
                                  MPI_BYTE, g->comm, &req);
        if (err != MPI_SUCCESS)
            SELDP_CHECK(mpi_call_failed(comm, op, "MPI_Iallgatherv", err));
        SELDP_CHECK(body_wait(comm, op, &req, 1, deadline));
        for (int r = 0; r < n; r++)
            if (counts[r])
                memcpy(dst + offsets[r] + start, block + displs[r], (size_t)counts[r]);
    }
fail:
    if (st != SELDP_OK)
        return st; /* MPI may still read counts and write block */
    free(block);
    free(counts);
    return st;
}

static seldp_status allgather_locked(seldp_comm *comm, const void *send, void *recv, size_t bytes,
                                     seldp_device mem)
{
    int n = comm->size;
    size_t total = bytes * (size_t)n;
    void *hsend = NULL, *hrecv = NULL;
    bool abandon = false;
    size_t *lens = malloc(2 * (size_t)n * sizeof *lens);
    header h = {.op = OP_ALLGATHER, .bytes = (int64_t)bytes};
    /* MPI forbids a send buffer inside the receive buffer, which an in-place gather
     * passes; such a send block gets a private copy. */
    const char *s0 = send, *r0 = recv;
    bool overlaps = bytes && s0 < r0 + total && r0 < s0 + bytes;
    if (!lens)
        h.staged = seldp__fail(SELDP_ERR_NOMEM, "rank %d: allgather: out of memory", comm->rank);
    else
        h.staged = stage(send, bytes, mem, true, overlaps, &hsend);
    if (h.staged == SELDP_OK) {
        h.staged = stage(recv, total, mem, false, false, &hrecv);
        if (h.staged != SELDP_OK)
            stage_release(hsend, send);
    }
    seldp_status st = collective_begin(comm, &h);
    if (st != SELDP_OK)
        goto fail;

    size_t *offsets = lens + n;
    for (int r = 0; r < n; r++) {
        lens[r] = bytes;
        offsets[r] = (size_t)r * bytes;
    }
    abandon = true;
    SELDP_CHECK(gather_body(comm, OP_ALLGATHER, hsend, lens, hrecv, offsets));
    abandon = false;
    if (hrecv != recv)
        st = seldp__device_copy(recv, mem, hrecv, SELDP_HOST_DEVICE, total);
fail:
    if (!abandon) {
        if (h.staged == SELDP_OK) {
            stage_release(hsend, send);
            stage_release(hrecv, recv);
        }
        free(lens);
    }
    return st;
}

static seldp_status allgatherv_locked(seldp_comm *comm, const void *send, size_t send_bytes,
                                      void **recv, size_t *recv_bytes)
{
    int n = comm->size;
    const header *s = group_of(comm)->headers;
    char *blob = NULL;
    bool abandon = false;
    size_t *offsets = malloc((size_t)n * sizeof *offsets);
    header h = {.op = OP_ALLGATHERV, .bytes = (int64_t)send_bytes};
    if (!offsets)
        h.staged = seldp__fail(SELDP_ERR_NOMEM, "rank %d: allgatherv: out of memory", comm->rank);
    seldp_status st = collective_begin(comm, &h);
    if (st != SELDP_OK)
        goto fail;

    /* Every rank sees the same sizes, so this error needs no abort: all return it. */
    size_t total = 0;
    for (int r = 0; r < n; r++) {
        if ((uint64_t)s[r].bytes > SIZE_MAX - total)
            SELDP_FAIL(SELDP_ERR_INVALID_ARGUMENT,
                       "rank %d: allgatherv: the blobs' total size overflows size_t", comm->rank);
        offsets[r] = total;
        recv_bytes[r] = (size_t)s[r].bytes;
        total += (size_t)s[r].bytes;
    }
    blob = malloc(total ? total : 1);
    if (!blob)
        SELDP_CHECK(fail_alone(comm, OP_ALLGATHERV,
                               seldp__fail(SELDP_ERR_NOMEM,
                                           "rank %d: allgatherv: out of memory for %zu bytes",
                                           comm->rank, total)));
    abandon = true;
    SELDP_CHECK(gather_body(comm, OP_ALLGATHERV, send, recv_bytes, blob, offsets));
    abandon = false;
    *recv = blob;
    blob = NULL;
fail:
    if (!abandon) {
        free(blob);
        free(offsets);
    }
    return st;
}

/* ---- allreduce ----------------------------------------------------------------------- */

/* dst[i] += src[i]; signed sums wrap like unsigned ones (two's complement). */
static void add_into(void *dst, const void *src, size_t count, seldp_dtype dtype)
{
    if (dtype == SELDP_F32) {
        float *d = dst;
        const float *s = src;
        for (size_t i = 0; i < count; i++)
            d[i] += s[i];
    } else if (dtype == SELDP_F64) {
        double *d = dst;
        const double *s = src;
        for (size_t i = 0; i < count; i++)
            d[i] += s[i];
    } else {
        uint64_t *d = dst;
        const uint64_t *s = src;
        for (size_t i = 0; i < count; i++)
            d[i] += s[i];
    }
}

/* Deterministic, in rounds of at most max_message bytes: in a round of m elements rank p
 * owns the slice [m*p/n, m*(p+1)/n). An MPI_Ialltoallv brings every rank's copy of the
 * slice to its owner, which sums them in rank order 0..n-1 in the dtype (as the host
 * transport does), and an MPI_Iallgatherv hands the sums to every rank. The order never
 * depends on MPI's choice of algorithm, so results are bit-identical on every rank,
 * from run to run, and to the host transport's. */
static seldp_status allreduce_locked(seldp_comm *comm, const void *send, void *recv, size_t count,
                                     seldp_dtype dtype, seldp_device mem)
{
    mpi_group *g = group_of(comm);
    int n = comm->size, me = comm->rank;
    size_t esize = seldp_dtype_size(dtype), bytes = count * esize;
    size_t round = g->world->max_message / esize ? g->world->max_message / esize : 1;
    size_t widest = count < round ? count : round; /* elements in the largest round */
    size_t slice_max = (widest + (size_t)n - 1) / (size_t)n;
    bool abandon = false;
    void *hsend = NULL, *hrecv = NULL;
    int *ints = malloc(6 * (size_t)n * sizeof *ints);
    char *slices = malloc(slice_max * esize * (size_t)n + 1);
    header h = {.op = OP_ALLREDUCE, .count = (int64_t)count, .dtype = dtype};
    if (!ints || !slices)
        h.staged = seldp__fail(SELDP_ERR_NOMEM, "rank %d: allreduce: out of memory", comm->rank);
    else if (mem.kind == SELDP_DEVICE_HOST) {
        hsend = (void *)send;
        hrecv = recv;
    } else { /* one staging buffer, reduced in place */
        h.staged = stage(send, bytes, mem, true, true, &hsend);
        hrecv = hsend;
    }
    seldp_status st = collective_begin(comm, &h);
    if (st != SELDP_OK)
        goto fail;

    int *scounts = ints, *sdispls = ints + n, *rcounts = ints + 2 * n, *rdispls = ints + 3 * n;
    int *gcounts = ints + 4 * n, *gdispls = ints + 5 * n;
    double deadline = body_deadline(comm);
    abandon = true;
    size_t start = 0;
    do {
        size_t m = count - start < round ? count - start : round;
        for (int p = 0; p < n; p++) {
            size_t lo = m * (size_t)p / (size_t)n, hi = m * (size_t)(p + 1) / (size_t)n;
            gcounts[p] = scounts[p] = (int)((hi - lo) * esize);
            gdispls[p] = sdispls[p] = (int)(lo * esize);
        }
        size_t mine = (size_t)gcounts[me];
        for (int q = 0; q < n; q++) {
            rcounts[q] = (int)mine;
            rdispls[q] = (int)((size_t)q * mine);
        }
        const char *src = (const char *)hsend + start * esize;
        char *dst = (char *)hrecv + start * esize;
        MPI_Request req = MPI_REQUEST_NULL;
        int err = MPI_Ialltoallv(src, scounts, sdispls, MPI_BYTE, slices, rcounts, rdispls,
                                 MPI_BYTE, g->comm, &req);
        if (err != MPI_SUCCESS)
            SELDP_CHECK(mpi_call_failed(comm, OP_ALLREDUCE, "MPI_Ialltoallv", err));
        SELDP_CHECK(body_wait(comm, OP_ALLREDUCE, &req, 1, deadline));

        /* The inputs of this round are all read: in-place buffers are safe to write. */
        char *sum = dst + gdispls[me];
        memcpy(sum, slices, mine);
        for (int q = 1; q < n; q++)
            add_into(sum, slices + (size_t)q * mine, mine / esize, dtype);

        err = MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_BYTE, dst, gcounts, gdispls, MPI_BYTE, g->comm,
                              &req);
        if (err != MPI_SUCCESS)
            SELDP_CHECK(mpi_call_failed(comm, OP_ALLREDUCE, "MPI_Iallgatherv", err));
        SELDP_CHECK(body_wait(comm, OP_ALLREDUCE, &req, 1, deadline));
        start += m;
    } while (start < count);
    abandon = false;
    if (hrecv != recv)
        st = seldp__device_copy(recv, mem, hrecv, SELDP_HOST_DEVICE, bytes);
fail:
    if (!abandon) {
        if (hsend != send)
            seldp__pinned_free(hsend);
        free(ints);
        free(slices);
    }
    return st;
}

/* ---- alltoallv ----------------------------------------------------------------------- */

/* The host transport's check that rank r sends rank p what p expects from r, made the
 * same on every rank: an MPI_Ialltoall of the counts lets each p compare its column, and
 * an MPI_Iallgather of each column's first mismatch lets every rank name the same one. */
static seldp_status alltoallv_agree(seldp_comm *comm, const size_t *send_bytes,
                                    const size_t *recv_bytes, uint64_t *work)
{
    mpi_group *g = group_of(comm);
    int n = comm->size;
    uint64_t *sent = work, *got = work + n;
    int64_t *verdicts = (int64_t *)(work + 2 * n), mine[3] = {-1, 0, 0};
    double deadline = body_deadline(comm);
    MPI_Request req = MPI_REQUEST_NULL;
    for (int p = 0; p < n; p++)
        sent[p] = send_bytes[p];
    int err = MPI_Ialltoall(sent, 1, MPI_UINT64_T, got, 1, MPI_UINT64_T, g->comm, &req);
    if (err != MPI_SUCCESS)
        return mpi_call_failed(comm, OP_ALLTOALLV, "MPI_Ialltoall", err);
    seldp_status st = body_wait(comm, OP_ALLTOALLV, &req, 1, deadline);
    if (st != SELDP_OK)
        return st;
    for (int r = 0; r < n && mine[0] < 0; r++) {
        if (got[r] != recv_bytes[r]) {
            mine[0] = r;
            mine[1] = (int64_t)got[r];
            mine[2] = (int64_t)recv_bytes[r];
        }
    }
    err = MPI_Iallgather(mine, 3, MPI_INT64_T, verdicts, 3, MPI_INT64_T, g->comm, &req);
    if (err != MPI_SUCCESS)
        return mpi_call_failed(comm, OP_ALLTOALLV, "MPI_Iallgather", err);
    if ((st = body_wait(comm, OP_ALLTOALLV, &req, 1, deadline)) != SELDP_OK)
        return st;
    int first = -1; /* the receiver p of the smallest (sender r, receiver p) */
    for (int p = 0; p < n; p++) {
        int64_t r = verdicts[3 * p];
        if (r >= 0 && (first < 0 || r < verdicts[3 * first]))
            first = p;
    }
    if (first < 0)
        return SELDP_OK;
    const int64_t *v = &verdicts[3 * first];
    return seldp__fail(SELDP_ERR_DISAGREE,
                       "rank %d: alltoallv: rank %d sends %zu bytes to rank %d, which expects %zu",
                       comm->rank, (int)v[0], (size_t)v[1], first, (size_t)v[2]);
}

static size_t pieces_extent(const size_t *bytes, const size_t *displs, int n)
{
    size_t end = 0;
    for (int p = 0; p < n; p++)
        if (bytes[p] && displs[p] + bytes[p] > end)
            end = displs[p] + bytes[p];
    return end;
}

static size_t messages_for(size_t bytes, size_t piece)
{
    return (bytes + piece - 1) / piece;
}

/* The data moves point-to-point rather than by MPI_Ialltoallv: displacements are local
 * and may exceed int, and both ends know each pair's byte count, so every piece can be
 * cut into messages of at most max_message bytes without agreeing on rounds. MPI keeps
 * the messages of one pair, tag and communicator in order. */
static seldp_status alltoallv_locked(seldp_comm *comm, const void *send, const size_t *send_bytes,
                                     const size_t *send_displs, void *recv,
                                     const size_t *recv_bytes, const size_t *recv_displs,
                                     seldp_device mem)
{
    mpi_group *g = group_of(comm);
    int n = comm->size, me = comm->rank;
    size_t piece = g->world->max_message;
    size_t send_extent = pieces_extent(send_bytes, send_displs, n);
    size_t recv_extent = pieces_extent(recv_bytes, recv_displs, n);
    size_t messages = 0;
    for (int p = 0; p < n; p++)
        if (p != me)
            messages += messages_for(send_bytes[p], piece) + messages_for(recv_bytes[p], piece);
    bool abandon = false;
    void *hsend = NULL, *hrecv = NULL;
    uint64_t *work = malloc(5 * (size_t)n * sizeof *work);
    MPI_Request *reqs = malloc((messages ? messages : 1) * sizeof *reqs);
    header h = {.op = OP_ALLTOALLV};
    if (!work || !reqs)
        h.staged = seldp__fail(SELDP_ERR_NOMEM, "rank %d: alltoallv: out of memory", comm->rank);
    else if (messages > INT_MAX)
        h.staged = seldp__fail(SELDP_ERR_INVALID_ARGUMENT,
                               "rank %d: alltoallv needs %zu messages, more than MPI can wait on",
                               comm->rank, messages);
    else
        h.staged = stage(send, send_extent, mem, true, false, &hsend);
    if (h.staged == SELDP_OK) {
        h.staged = stage(recv, recv_extent, mem, false, false, &hrecv);
        if (h.staged != SELDP_OK)
            stage_release(hsend, send);
    }
    seldp_status st = collective_begin(comm, &h);
    if (st != SELDP_OK)
        goto fail;
    abandon = true;
    st = alltoallv_agree(comm, send_bytes, recv_bytes, work);
    if (st == SELDP_ERR_DISAGREE)
        abandon = false; /* every rank stops here, nothing pending */
    if (st != SELDP_OK)
        goto fail;

    int posted = 0;
    for (int p = 0; p < n; p++) {
        for (size_t off = 0; p != me && off < recv_bytes[p]; off += piece) {
            size_t len = recv_bytes[p] - off < piece ? recv_bytes[p] - off : piece;
            int err = MPI_Irecv((char *)hrecv + recv_displs[p] + off, (int)len, MPI_BYTE, p,
                                TAG_ALLTOALLV, g->comm, &reqs[posted]);
            if (err != MPI_SUCCESS)
                SELDP_CHECK(mpi_call_failed(comm, OP_ALLTOALLV, "MPI_Irecv", err));
            posted++;
        }
    }
    for (int k = 1; k < n; k++) { /* from the next rank on, so no rank is everyone's first */
        int p = (me + k) % n;
        for (size_t off = 0; off < send_bytes[p]; off += piece) {
            size_t len = send_bytes[p] - off < piece ? send_bytes[p] - off : piece;
            int err = MPI_Isend((const char *)hsend + send_displs[p] + off, (int)len, MPI_BYTE, p,
                                TAG_ALLTOALLV, g->comm, &reqs[posted]);
            if (err != MPI_SUCCESS)
                SELDP_CHECK(mpi_call_failed(comm, OP_ALLTOALLV, "MPI_Isend", err));
            posted++;
        }
    }
    if (send_bytes[me])
        memmove((char *)hrecv + recv_displs[me], (const char *)hsend + send_displs[me],
                send_bytes[me]);
    SELDP_CHECK(body_wait(comm, OP_ALLTOALLV, reqs, posted, body_deadline(comm)));
    abandon = false;
    /* Copy back only the pieces received, leaving the rest of recv as it was. */
    for (int p = 0; hrecv != recv && p < n; p++)
        if (recv_bytes[p])
            SELDP_CHECK(seldp__device_copy((char *)recv + recv_displs[p], mem,
                                           (char *)hrecv + recv_displs[p], SELDP_HOST_DEVICE,
                                           recv_bytes[p]));
fail:
    if (!abandon) {
        if (h.staged == SELDP_OK) {
            stage_release(hsend, send);
            stage_release(hrecv, recv);
        }
        free(work);
        free(reqs);
    }
    return st;
}

/* ---- groups and worlds ---------------------------------------------------------------- */

static void world_release(mpi_world *w)
{
    if (--w->refs > 0)
        return;
    if (w->notice_recv != MPI_REQUEST_NULL) {
        /* Cancelling a receive completes locally; a notice that already matched is kept. */
        MPI_Cancel(&w->notice_recv);
        MPI_Wait(&w->notice_recv, MPI_STATUS_IGNORE);
    }
    if (w->notice_sends) {
        int done = 0;
        MPI_Testall(w->size, w->notice_sends, &done, MPI_STATUSES_IGNORE);
        if (!done) {
            /* Freed requests still complete; MPI may read `outgoing` until then. */
            for (int p = 0; p < w->size; p++)
                if (w->notice_sends[p] != MPI_REQUEST_NULL)
                    MPI_Request_free(&w->notice_sends[p]);
            return;
        }
        free(w->notice_sends);
    }
    MPI_Comm_free(&w->ctrl);
    pthread_mutex_destroy(&w->lock);
    free(w);
}

static void group_free(mpi_group *g)
{
    if (g->comm != MPI_COMM_NULL)
        MPI_Comm_free(&g->comm); /* an abandoned operation keeps it alive inside MPI */
    if (!g->abandoned) {
        free(g->world_ranks);
        free(g->headers);
        free(g->reqs);
    }
    free(g);
}

/* A group over `mc` (taken over, freed with the group) of world `w`. */
static seldp_status group_new(mpi_world *w, MPI_Comm mc, int world_rank, seldp_device device,
                              seldp_comm **out)
{
    int rank = 0, size = 0;
    MPI_Comm_rank(mc, &rank);
    MPI_Comm_size(mc, &size);
    mpi_group *g = calloc(1, sizeof *g);
    seldp_comm *comm = NULL;
    if (g) {
        g->world = w;
        g->comm = mc;
        g->world_ranks = malloc((size_t)size * sizeof *g->world_ranks);
        g->headers = calloc((size_t)size, sizeof *g->headers);
        g->reqs = malloc(2 * (size_t)size * sizeof *g->reqs);
    }
    if (g && g->world_ranks && g->headers && g->reqs) {
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

/* MPI has no non-blocking split. The headers carry every rank's color and key and
 * prove that every rank has arrived, so the blocking MPI_Comm_split that follows only
 * waits for ranks already on their way into it. */
static seldp_status split_locked(seldp_comm *comm, int color, int key, seldp_comm **out)
{
    mpi_group *g = group_of(comm);
    header h = {.op = OP_SPLIT, .color = color, .key = key};
    seldp_status st = collective_begin(comm, &h);
    if (st != SELDP_OK)
        return st;
    MPI_Comm mc = MPI_COMM_NULL;
    int err =
        MPI_Comm_split(g->comm, color == SELDP_COMM_NO_GROUP ? MPI_UNDEFINED : color, key, &mc);
    if (err != MPI_SUCCESS)
        return mpi_call_failed(comm, OP_SPLIT, "MPI_Comm_split", err);
    if (mc == MPI_COMM_NULL)
        return SELDP_OK;
    MPI_Comm_set_errhandler(mc, MPI_ERRORS_RETURN);
    st = group_new(g->world, mc, comm->world_rank, comm->device, out);
    if (st != SELDP_OK) {
        MPI_Comm_free(&mc);
        return fail_alone(comm, OP_SPLIT, st);
    }
    return SELDP_OK;
}

/* ---- the calls: one thread inside a world at a time ----------------------------------- */

static mpi_world *world_enter(seldp_comm *comm)
{
    mpi_world *w = group_of(comm)->world;
    pthread_mutex_lock(&w->lock);
    return w;
}

static seldp_status world_leave(mpi_world *w, seldp_status st)
{
    pthread_mutex_unlock(&w->lock);
    return st;
}

static seldp_status mpi_barrier(seldp_comm *comm)
{
    mpi_world *w = world_enter(comm);
    return world_leave(w, barrier_locked(comm));
}

static seldp_status mpi_broadcast(seldp_comm *comm, void *buf, size_t bytes, int root,
                                  seldp_device mem)
{
    mpi_world *w = world_enter(comm);
    return world_leave(w, broadcast_locked(comm, buf, bytes, root, mem));
}

static seldp_status mpi_allreduce(seldp_comm *comm, const void *send, void *recv, size_t count,
                                  seldp_dtype dtype, seldp_device mem)
{
    mpi_world *w = world_enter(comm);
    return world_leave(w, allreduce_locked(comm, send, recv, count, dtype, mem));
}

static seldp_status mpi_allgather(seldp_comm *comm, const void *send, void *recv, size_t bytes,
                                  seldp_device mem)
{
    mpi_world *w = world_enter(comm);
    return world_leave(w, allgather_locked(comm, send, recv, bytes, mem));
}

static seldp_status mpi_allgatherv(seldp_comm *comm, const void *send, size_t send_bytes,
                                   void **recv, size_t *recv_bytes)
{
    mpi_world *w = world_enter(comm);
    return world_leave(w, allgatherv_locked(comm, send, send_bytes, recv, recv_bytes));
}

static seldp_status mpi_alltoallv(seldp_comm *comm, const void *send, const size_t *send_bytes,
                                  const size_t *send_displs, void *recv, const size_t *recv_bytes,
                                  const size_t *recv_displs, seldp_device mem, size_t send_extent,
                                  size_t recv_extent)
{
    (void)send_extent; /* alltoallv_locked computes them */
    (void)recv_extent;
    mpi_world *w = world_enter(comm);
    return world_leave(w, alltoallv_locked(comm, send, send_bytes, send_displs, recv, recv_bytes,
                                           recv_displs, mem));
}

static seldp_status mpi_split(seldp_comm *comm, int color, int key, seldp_comm **out)
{
    mpi_world *w = world_enter(comm);
    return world_leave(w, split_locked(comm, color, key, out));
}

/* Any thread, any time (a watchdog's ncclCommAbort): the request is recorded at once; the
 * notices go out now when this thread may call MPI (the thread that joined, or any under
 * MPI_THREAD_MULTIPLE) and no call of the world is running, else from the thread inside
 * the running call at its next poll, or at the next call of the world. */
static void mpi_abort(seldp_comm *comm)
{
    mpi_world *w = group_of(comm)->world;
    atomic_store(&w->abort_asked, true);
    if (!pthread_equal(pthread_self(), w->owner) && w->thread_level != MPI_THREAD_MULTIPLE)
        return;
    if (pthread_mutex_trylock(&w->lock) != 0)
        return; /* a call is running: it sends the notices at its next poll */
    world_abort(w, SELDP_ERR_ABORTED, "rank %d aborted the world", comm->world_rank);
    pthread_mutex_unlock(&w->lock);
}

static void mpi_destroy(seldp_comm *comm)
{
    mpi_group *g = group_of(comm);
    mpi_world *w = world_enter(comm);
    (void)world_poll_abort(w); /* an abort asked from another thread leaves now at the latest */
    group_free(g);
    world_leave(w, SELDP_OK);
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
    .abort = mpi_abort,
    .destroy = mpi_destroy,
};

/* ---- init ------------------------------------------------------------------------------ */

/* The bound on one message: 1 GiB, lowered by SELDP_MPI_MAX_MESSAGE. */
static size_t local_max_message(void)
{
    const char *env = getenv("SELDP_MPI_MAX_MESSAGE");
    if (!env || !*env)
        return MAX_MESSAGE;
    char *end = NULL;
    unsigned long long v = strtoull(env, &end, 10);
    if (*end || v == 0 || v > MAX_MESSAGE)
        return MAX_MESSAGE;
    return (size_t)v;
}

/* Poll the requests that build a world (no abort channel exists yet). */
static seldp_status init_wait(int rank, MPI_Request *reqs, int n, double timeout_s)
{
    double deadline = now_s() + timeout_s, nap = 1e-6;
    for (int polls = 0;; polls++) {
        int done = 0;
        int err = MPI_Testall(n, reqs, &done, MPI_STATUSES_IGNORE);
        if (err != MPI_SUCCESS) {
            char text[MPI_MAX_ERROR_STRING];
            mpi_error_text(err, text, sizeof text);
            return seldp__fail(SELDP_ERR_TRANSPORT, "rank %d: init: MPI failed: %s", rank, text);
        }
        if (done)
            return SELDP_OK;
        if (now_s() > deadline)
            return seldp__fail(SELDP_ERR_TIMEOUT,
                               "rank %d: init timed out after %g s waiting for the other ranks",
                               rank, timeout_s);
        backoff(polls, &nap);
    }
}

seldp_status seldp_mpi_comm_init(MPI_Comm parent, seldp_device device, const seldp_comm_config *cfg,
                                 seldp_comm **out)
{
    seldp_comm_config defaults = SELDP_COMM_CONFIG_INIT;
    seldp_status st = SELDP_OK;
    mpi_world *w = NULL;
    MPI_Comm data = MPI_COMM_NULL;
    MPI_Request reqs[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
    int initialized = 0, finalized = 0, rank = -1, err;
    char text[MPI_MAX_ERROR_STRING];

    if (!out)
        return seldp__fail(SELDP_ERR_INVALID_ARGUMENT, "mpi_comm_init: out is NULL");
    *out = NULL;
    if (!cfg)
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
    if (!w)
        return seldp__fail(SELDP_ERR_NOMEM, "rank %d: mpi_comm_init: out of memory", rank);
    if (pthread_mutex_init(&w->lock, NULL) != 0) {
        free(w);
        return seldp__fail(SELDP_ERR_INTERNAL, "rank %d: mpi_comm_init: pthread_mutex_init failed",
                           rank);
    }
    w->owner = pthread_self();
    MPI_Query_thread(&w->thread_level);
    atomic_init(&w->abort_asked, false);
    w->ctrl = MPI_COMM_NULL;
    w->notice_recv = MPI_REQUEST_NULL;
    w->rank = rank;
    MPI_Comm_size(parent, &w->size);
    w->timeout_s = cfg->timeout_s;

    err = MPI_Comm_idup(parent, &w->ctrl, &reqs[0]);
    if (err == MPI_SUCCESS)
        err = MPI_Comm_idup(parent, &data, &reqs[1]);
    if (err != MPI_SUCCESS) {
        mpi_error_text(err, text, sizeof text);
        SELDP_FAIL(SELDP_ERR_TRANSPORT, "rank %d: init: MPI_Comm_idup failed: %s", rank, text);
    }
    SELDP_CHECK(init_wait(rank, reqs, 2, cfg->timeout_s));
    MPI_Comm_set_errhandler(w->ctrl, MPI_ERRORS_RETURN);
    MPI_Comm_set_errhandler(data, MPI_ERRORS_RETURN);

    /* Messages must be cut alike on every rank: the smallest bound wins. */
    unsigned long long local = local_max_message(), agreed = 0;
    err = MPI_Iallreduce(&local, &agreed, 1, MPI_UNSIGNED_LONG_LONG, MPI_MIN, data, &reqs[0]);
    if (err != MPI_SUCCESS) {
        mpi_error_text(err, text, sizeof text);
        SELDP_FAIL(SELDP_ERR_TRANSPORT, "rank %d: init: MPI_Iallreduce failed: %s", rank, text);
    }
    SELDP_CHECK(init_wait(rank, reqs, 1, cfg->timeout_s));
    w->max_message = (size_t)agreed;

    err = MPI_Irecv(&w->incoming, (int)sizeof w->incoming, MPI_BYTE, MPI_ANY_SOURCE, TAG_ABORT,
                    w->ctrl, &w->notice_recv);
    if (err != MPI_SUCCESS) {
        mpi_error_text(err, text, sizeof text);
        SELDP_FAIL(SELDP_ERR_TRANSPORT, "rank %d: init: MPI_Irecv failed: %s", rank, text);
    }
    SELDP_CHECK(group_new(w, data, rank, device, out));
    return SELDP_OK;

fail:
    if (st == SELDP_ERR_TIMEOUT)
        return st; /* the duplicates are still pending inside MPI: abandoned */
    if (w->notice_recv != MPI_REQUEST_NULL) {
        MPI_Cancel(&w->notice_recv);
        MPI_Wait(&w->notice_recv, MPI_STATUS_IGNORE);
    }
    if (data != MPI_COMM_NULL)
        MPI_Comm_free(&data);
    if (w->ctrl != MPI_COMM_NULL)
        MPI_Comm_free(&w->ctrl);
    pthread_mutex_destroy(&w->lock);
    free(w);
    return st;
}

/* ---- NCCL bootstrapped over MPI ------------------------------------------------------- */

#ifdef SELDP_HAVE_NCCL
/* What rank 0 broadcasts: its NCCL unique id, or why it could not draw one. */
typedef struct nccl_bootstrap {
    int32_t status;
    unsigned char id[SELDP_NCCL_UNIQUE_ID_BYTES];
    char reason[380];
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
    if (!cfg)
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
    MPI_Comm dup = MPI_COMM_NULL;
    MPI_Request req = MPI_REQUEST_NULL;
    char text[MPI_MAX_ERROR_STRING];
    nccl_bootstrap *boot = NULL;
    if (!(cfg->timeout_s > 0))
        return seldp__fail(SELDP_ERR_INVALID_ARGUMENT,
                           "rank %d: mpi_nccl_comm_init: timeout %g s, expected > 0", rank,
                           cfg->timeout_s);
    /* heap, not stack: after a timeout MPI may still write into it */
    boot = calloc(1, sizeof *boot);
    if (!boot)
        return seldp__fail(SELDP_ERR_NOMEM, "rank %d: mpi_nccl_comm_init: out of memory", rank);

    /* The broadcast travels on a private duplicate: the caller's communicator keeps its
     * error handler and sees no traffic. */
    int err = MPI_Comm_idup(parent, &dup, &req);
    if (err != MPI_SUCCESS) {
        mpi_error_text(err, text, sizeof text);
        SELDP_FAIL(SELDP_ERR_TRANSPORT, "rank %d: mpi_nccl_comm_init: MPI_Comm_idup failed: %s",
                   rank, text);
    }
    SELDP_CHECK(init_wait(rank, &req, 1, cfg->timeout_s));
    MPI_Comm_set_errhandler(dup, MPI_ERRORS_RETURN);

    /* Rank 0 draws the id; a failure travels in its place so that every rank returns it. */
    if (rank == 0) {
        boot->status = (int32_t)seldp_nccl_get_unique_id(boot->id);
        if (boot->status != SELDP_OK)
            snprintf(boot->reason, sizeof boot->reason, "%s", seldp_last_error());
    }
    err = MPI_Ibcast(boot, (int)sizeof *boot, MPI_BYTE, 0, dup, &req);
    if (err != MPI_SUCCESS) {
        mpi_error_text(err, text, sizeof text);
        SELDP_FAIL(SELDP_ERR_TRANSPORT, "rank %d: mpi_nccl_comm_init: MPI_Ibcast failed: %s", rank,
                   text);
    }
    SELDP_CHECK(init_wait(rank, &req, 1, cfg->timeout_s));
    if (boot->status != SELDP_OK)
        SELDP_FAIL((seldp_status)boot->status,
                   "rank %d: mpi_nccl_comm_init: rank 0 could not draw an NCCL unique id: %s", rank,
                   boot->reason);
    SELDP_CHECK(seldp_nccl_comm_init_with_id(boot->id, size, rank, cfg, out));

fail:
    if (st == SELDP_ERR_TIMEOUT)
        return st; /* the duplicate or the broadcast is still pending inside MPI: abandoned */
    if (dup != MPI_COMM_NULL)
        MPI_Comm_free(&dup);
    free(boot);
    return st;
#endif
}
