/* The MPI transport's protocol: what every collective goes through (see mpi_impl.h).
 *
 * Step 1, arrival: every rank posts one MPI_Iallgather of its fixed-size header
 * (comm/protocol.h) and polls it against the timeout. Once it completes every rank has
 * arrived and holds the same headers, so every rank reaches the same verdict
 * (seldp__proto_agree). Step 2, the body: non-blocking MPI calls polled against a second
 * deadline (mpi_collectives.c).
 *
 * The waits poll the world's abort notices (a private duplicate `ctrl` of the parent
 * communicator carries them) and answer census questions there. A rank whose wait times
 * out asks the other ranks of the group where they are (the census, over ctrl): a rank
 * waiting in the same collective answers within a poll; a rank that has not arrived (or,
 * inside a body, a rank that stalled) cannot, and is named. Then the rank aborts the world
 * so that every pending and later call of every rank returns.
 *
 * Nothing the caller owns is ever given to MPI: operations run on the group's staging
 * buffers, and an operation given up is parked with them until MPI completes it. A rank
 * that arrives after the world was aborted still posts the header it owes (the drain), so
 * that the others' abandoned header exchange completes and its buffers can be freed. */
#define _POSIX_C_SOURCE 200809L

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm/mpi/mpi_fault.h"
#include "comm/mpi/mpi_impl.h"
#include "device.h"
#include "internal.h"

void seldp__mpi_error_text(int err, char *text, size_t size)
{
    char buf[MPI_MAX_ERROR_STRING] = "";
    int len = 0;
    MPI_Error_string(err, buf, &len);
    snprintf(text, size, "%s", buf);
}

/* ---- parking ------------------------------------------------------------------------ */

/* Operations still pending when their world went away: reachable until they complete. */
static mpi_parked *orphans;
static pthread_mutex_t orphans_lock = PTHREAD_MUTEX_INITIALIZER;

/* Whether every request of p has completed (those that have are set to MPI_REQUEST_NULL). */
static bool parked_done(mpi_parked *p)
{
    bool done = true;
    for (int i = 0; i < p->n_reqs; i++) {
        if (p->reqs[i] == MPI_REQUEST_NULL)
            continue;
        int flag = 0;
        if (MPI_Test(&p->reqs[i], &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS)
            p->reqs[i] = MPI_REQUEST_NULL; /* completed, with an error */
        else if (!flag)
            done = false;
    }
    return done;
}

static void parked_free(mpi_parked *p)
{
    for (int i = 0; i < p->n_mem; i++)
        seldp__pinned_free(p->mem[i]);
    free(p);
}

/* Free the completed entries of *list. */
static void reap_list(mpi_parked **list)
{
    for (mpi_parked **at = list; *at;) {
        mpi_parked *p = *at;
        if (parked_done(p)) {
            *at = p->next;
            parked_free(p);
        } else {
            at = &p->next;
        }
    }
}

void seldp__mpi_reap(mpi_world *w)
{
    reap_list(&w->parked);
    pthread_mutex_lock(&orphans_lock);
    reap_list(&orphans);
    pthread_mutex_unlock(&orphans_lock);
}

void seldp__mpi_unpark_world(mpi_world *w)
{
    seldp__mpi_reap(w);
    if (!w->parked)
        return;
    mpi_parked *last = w->parked;
    while (last->next)
        last = last->next;
    pthread_mutex_lock(&orphans_lock);
    last->next = orphans;
    orphans = w->parked;
    pthread_mutex_unlock(&orphans_lock);
    w->parked = NULL;
}

/* Park n requests (taken over from reqs, which is library memory and parked too) with the
 * memory blocks mem[0..n_mem). Out of memory, the blocks are leaked rather than freed
 * under MPI. */
static void park_on(mpi_world *w, MPI_Request *reqs, int n, void *const *mem, int n_mem)
{
    mpi_parked *p = calloc(1, sizeof *p);
    if (!p)
        return;
    p->reqs = reqs;
    p->n_reqs = n;
    for (int i = 0; i < n_mem && p->n_mem < (int)(sizeof p->mem / sizeof *p->mem); i++)
        if (mem[i])
            p->mem[p->n_mem++] = mem[i];
    if (parked_done(p)) {
        parked_free(p);
        return;
    }
    p->next = w->parked;
    w->parked = p;
}

void seldp__mpi_park_orphan(MPI_Request *reqs, int n, void *const *mem, int n_mem)
{
    mpi_parked *p = calloc(1, sizeof *p);
    if (!p)
        return;
    p->reqs = reqs;
    p->n_reqs = n;
    for (int i = 0; i < n_mem && p->n_mem < (int)(sizeof p->mem / sizeof *p->mem); i++)
        if (mem[i])
            p->mem[p->n_mem++] = mem[i];
    pthread_mutex_lock(&orphans_lock);
    p->next = orphans;
    orphans = p;
    pthread_mutex_unlock(&orphans_lock);
}

void seldp__mpi_park(mpi_group *g, int n, void *extra1, void *extra2)
{
    void *mem[BUF_COUNT + 2];
    int n_mem = 0;
    MPI_Request *reqs = g->buf[BUF_REQS];
    for (int k = 0; k < BUF_COUNT; k++) {
        mem[n_mem++] = g->buf[k];
        g->buf[k] = NULL;
        g->cap[k] = 0;
    }
    mem[n_mem++] = extra1;
    mem[n_mem++] = extra2;
    g->headers = NULL;
    g->clean = false;
    park_on(g->world, reqs, reqs ? n : 0, mem, n_mem);
}

void *seldp__mpi_buf(mpi_group *g, int which, size_t bytes)
{
    if (g->buf[which] && g->cap[which] >= bytes)
        return g->buf[which];
    seldp__pinned_free(g->buf[which]);
    g->buf[which] = NULL;
    g->cap[which] = 0;
    size_t want = bytes < 64 ? 64 : bytes;
    if (seldp__pinned_alloc(g->device, want, &g->buf[which]) != SELDP_OK) {
        g->buf[which] = NULL;
        return NULL;
    }
    g->cap[which] = want;
    return g->buf[which];
}

/* ---- abort ----------------------------------------------------------------------- */

void seldp__mpi_world_abort(mpi_world *w, seldp_status status, const char *fmt, ...)
{
    if (w->aborted)
        return;
    w->aborted = true;
    w->abort_status = status;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(w->abort_reason, sizeof w->abort_reason, fmt, ap);
    va_end(ap);
    /* The notice and its requests are parked at once: MPI reads them until the sends
     * complete. */
    mpi_notice *notice = malloc(sizeof *notice);
    MPI_Request *sends = malloc((size_t)w->size * sizeof *sends);
    if (!notice || !sends) {
        free(notice);
        free(sends);
        return; /* the others will time out instead */
    }
    notice->world = w->id;
    notice->status = (int32_t)status;
    notice->from = w->rank;
    memcpy(notice->reason, w->abort_reason, sizeof notice->reason);
    for (int p = 0; p < w->size; p++) {
        sends[p] = MPI_REQUEST_NULL;
        if (p != w->rank)
            MPI_Isend(notice, (int)sizeof *notice, MPI_BYTE, p, TAG_ABORT, w->ctrl, &sends[p]);
    }
    void *mem[2] = {notice, sends};
    park_on(w, sends, w->size, mem, 2);
}

/* Answer the census questions that have come in: where this rank's thread waits now. */
static void census_answer(mpi_world *w)
{
    for (;;) {
        int arrived = 0;
        if (w->census_recv == MPI_REQUEST_NULL ||
            MPI_Test(&w->census_recv, &arrived, MPI_STATUS_IGNORE) != MPI_SUCCESS || !arrived)
            return;
        mpi_census *a = w->census_in.world == w->id ? malloc(sizeof *a) : NULL;
        MPI_Request *req = a ? malloc(sizeof *req) : NULL;
        if (a && req) {
            *a = (mpi_census){.world = w->id,
                              .token = w->census_in.token,
                              .asker = w->rank,
                              .group = w->wait_group,
                              .seq = w->wait_seq,
                              .phase = w->wait_phase};
            *req = MPI_REQUEST_NULL;
            MPI_Isend(a, (int)sizeof *a, MPI_BYTE, (int)w->census_in.asker, TAG_CENSUS_REPLY,
                      w->ctrl, req);
            void *mem[2] = {a, req};
            park_on(w, req, 1, mem, 2);
        } else {
            free(a);
            free(req);
        }
        MPI_Irecv(&w->census_in, (int)sizeof w->census_in, MPI_BYTE, MPI_ANY_SOURCE, TAG_CENSUS,
                  w->ctrl, &w->census_recv);
    }
}

bool seldp__mpi_world_poll(mpi_world *w)
{
    census_answer(w);
    if (w->aborted)
        return true;
    if (atomic_load(&w->abort_asked)) {
        seldp__mpi_world_abort(w, SELDP_ERR_ABORTED, "rank %d aborted the world", w->rank);
        return true;
    }
    for (;;) {
        int arrived = 0;
        if (w->notice_recv == MPI_REQUEST_NULL ||
            MPI_Test(&w->notice_recv, &arrived, MPI_STATUS_IGNORE) != MPI_SUCCESS || !arrived)
            return false;
        if (w->incoming.world == w->id)
            break;
        MPI_Irecv(&w->incoming, (int)sizeof w->incoming, MPI_BYTE, MPI_ANY_SOURCE, TAG_ABORT,
                  w->ctrl, &w->notice_recv);
    }
    w->aborted = true;
    w->abort_status =
        w->incoming.status == SELDP_ERR_TIMEOUT ? SELDP_ERR_TIMEOUT : SELDP_ERR_ABORTED;
    w->incoming.reason[sizeof w->incoming.reason - 1] = '\0';
    memcpy(w->abort_reason, w->incoming.reason, sizeof w->abort_reason);
    return true;
}

static seldp_status aborted_error(const seldp_comm *comm, seldp__comm_op op)
{
    const mpi_world *w = seldp__mpi_group(comm)->world;
    return seldp__proto_aborted(comm->rank, op, w->abort_status, w->abort_reason);
}

seldp_status seldp__mpi_fail_alone(seldp_comm *comm, seldp__comm_op op, seldp_status st)
{
    seldp__mpi_world_abort(seldp__mpi_group(comm)->world, SELDP_ERR_ABORTED,
                           "rank %d failed in %s: %s", comm->world_rank, seldp__comm_op_name(op),
                           seldp_last_error());
    return st;
}

seldp_status seldp__mpi_call_failed(seldp_comm *comm, seldp__comm_op op, const char *call, int err,
                                    int n)
{
    char text[MPI_MAX_ERROR_STRING];
    seldp__mpi_error_text(err, text, sizeof text);
    seldp__mpi_park(seldp__mpi_group(comm), n, NULL, NULL);
    return seldp__mpi_fail_alone(comm, op,
                                 seldp__fail(SELDP_ERR_TRANSPORT, "rank %d: %s: %s failed: %s",
                                             comm->rank, seldp__comm_op_name(op), call, text));
}

/* ---- the census ------------------------------------------------------------------- */

/* How long a census waits for answers: a rank that waits answers at its next poll (within
 * a millisecond), but on a loaded machine a process may not run for a while. Only a census
 * with a rank missing waits this long; it is bounded by the timeout, so that a rank late
 * by more than twice the timeout finds the world aborted. */
static double census_grace(const mpi_world *w)
{
    return w->timeout_s < 0.3 ? 0.3 : w->timeout_s > 1.0 ? 1.0 : w->timeout_s;
}

typedef struct census_result {
    bool *answered; /* [size]: the rank answered */
    bool *in_it;    /* [size]: it answered that it waits in this collective's phase */
} census_result;

typedef enum census_end {
    CENSUS_TAKEN,    /* the answers are in, or the grace period passed */
    CENSUS_ABORTED,  /* the world was aborted meanwhile: the census is moot */
    CENSUS_COMPLETED /* the operation waited for completed meanwhile: no timeout after all */
} census_end;

/* Ask every other rank of the group where it is, and wait for the answers (or the grace
 * period), still testing the operation waited for: g's requests [0, n_reqs). */
static census_end census(seldp_comm *comm, int phase, int n_reqs, census_result *res)
{
    mpi_group *g = seldp__mpi_group(comm);
    mpi_world *w = g->world;
    MPI_Request *reqs = g->buf[BUF_REQS];
    int n = comm->size, answers = 0, inside = 0;
    int64_t token = ++w->census_tokens;
    mpi_census *question = malloc(sizeof *question);
    MPI_Request *asks = malloc((size_t)n * sizeof *asks);
    if (!question || !asks) {
        free(question);
        free(asks);
        return CENSUS_TAKEN; /* nobody asked: nobody answers, every other rank is named */
    }
    *question = (mpi_census){.world = w->id,
                             .token = token,
                             .asker = w->rank,
                             .group = g->id,
                             .seq = g->seq,
                             .phase = phase};
    for (int r = 0; r < n; r++) {
        asks[r] = MPI_REQUEST_NULL;
        if (r != comm->rank)
            MPI_Isend(question, (int)sizeof *question, MPI_BYTE, g->world_ranks[r], TAG_CENSUS,
                      w->ctrl, &asks[r]);
    }
    mpi_census answer;
    MPI_Request got = MPI_REQUEST_NULL;
    MPI_Irecv(&answer, (int)sizeof answer, MPI_BYTE, MPI_ANY_SOURCE, TAG_CENSUS_REPLY, w->ctrl,
              &got);
    double deadline = seldp__proto_now() + census_grace(w);
    seldp__proto_backoff backoff = SELDP__PROTO_BACKOFF_INIT;
    census_end end = CENSUS_TAKEN;
    /* Every rank answered from inside the collective: it will complete, keep testing it. */
    while (seldp__proto_now() < deadline && !(answers == n - 1 && inside < n - 1)) {
        int flag = 0;
        if (MPI_Test(&got, &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS)
            break;
        if (flag) {
            for (int r = 0; r < n && answer.token == token && answer.world == w->id; r++) {
                if (g->world_ranks[r] != answer.asker || res->answered[r])
                    continue;
                res->answered[r] = true;
                res->in_it[r] =
                    answer.group == g->id && answer.seq == g->seq && answer.phase == phase;
                answers++;
                inside += res->in_it[r];
            }
            MPI_Irecv(&answer, (int)sizeof answer, MPI_BYTE, MPI_ANY_SOURCE, TAG_CENSUS_REPLY,
                      w->ctrl, &got);
            continue;
        }
        int done = 0;
        if (MPI_Testall(n_reqs, reqs, &done, MPI_STATUSES_IGNORE) == MPI_SUCCESS && done) {
            end = CENSUS_COMPLETED;
            break;
        }
        if (seldp__mpi_world_poll(w)) {
            end = CENSUS_ABORTED;
            break;
        }
        seldp__proto_backoff_wait(&backoff);
    }
    if (got != MPI_REQUEST_NULL) { /* cancelling a receive completes locally */
        MPI_Cancel(&got);
        MPI_Wait(&got, MPI_STATUS_IGNORE);
    }
    void *mem[2] = {question, asks};
    park_on(w, asks, n, mem, 2);
    return end;
}

/* ---- waiting ---------------------------------------------------------------------- */

static bool not_in_it(const void *ctx, int r)
{
    return !((const bool *)ctx)[r];
}

/* The timeout of a wait passed: take the census, name the ranks (those not waiting in this
 * phase at arrival; those that did not answer inside a body), abort the world and return
 * this rank's error. */
static seldp_status timed_out(seldp_comm *comm, seldp__comm_op op, int phase, int n_reqs)
{
    mpi_group *g = seldp__mpi_group(comm);
    mpi_world *w = g->world;
    int n = comm->size;
    bool *flags = calloc(2 * (size_t)n, sizeof *flags);
    census_result res = {flags, flags ? flags + n : NULL};
    census_end end = flags ? census(comm, phase, n_reqs, &res) : CENSUS_TAKEN;
    if (end != CENSUS_TAKEN) {
        free(flags);
        return end == CENSUS_COMPLETED ? SELDP_OK : aborted_error(comm, op);
    }
    char who[256] = "", world_who[200] = "", reason[sizeof w->abort_reason];
    seldp__proto_timeout t = {.rank = comm->rank,
                              .world_rank = comm->world_rank,
                              .size = n,
                              .op = op,
                              .timeout_s = w->timeout_s,
                              .who = who,
                              .world_who = world_who};
    if (flags) {
        const bool *named = phase == PHASE_ARRIVE ? res.in_it : res.answered;
        bool split = g->id != 1;
        t.missing = seldp__proto_missing_ranks(n, comm->rank, g->world_ranks, split, false,
                                               not_in_it, named, who, sizeof who);
        seldp__proto_missing_ranks(n, comm->rank, g->world_ranks, split, true, not_in_it, named,
                                   world_who, sizeof world_who);
    }
    free(flags);
    seldp_status st;
    if (phase == PHASE_ARRIVE && t.missing > 0) {
        st = seldp__proto_not_arrived(&t, reason, sizeof reason);
    } else if (t.missing > 0) {
        st = seldp__proto_silent_inside(&t, reason, sizeof reason);
    } else {
        if (phase == PHASE_ARRIVE) /* every rank answered, yet MPI did not complete it */
            snprintf(who, sizeof who, "none named");
        st = seldp__proto_stalled_inside(&t, false, reason, sizeof reason);
    }
    seldp__mpi_world_abort(w, SELDP_ERR_TIMEOUT, "%s", reason);
    return st;
}

/* Poll g's requests [0, n) until they complete (SELDP_OK), the world aborts or `deadline`
 * passes; on failure the operation is parked. */
static seldp_status wait_phase(seldp_comm *comm, seldp__comm_op op, int phase, int n,
                               double deadline, bool abortable)
{
    mpi_group *g = seldp__mpi_group(comm);
    mpi_world *w = g->world;
    MPI_Request *reqs = g->buf[BUF_REQS];
    seldp__proto_backoff backoff = SELDP__PROTO_BACKOFF_INIT;
    seldp_status st = SELDP_OK;
    w->wait_group = g->id;
    w->wait_seq = g->seq;
    w->wait_phase = phase;
    for (;;) {
        int done = 0;
        /* This rank's own seldp_comm_abort (a watchdog thread's) ends its call even when the
         * operation could complete now. */
        if (abortable && atomic_load(&w->abort_asked) && seldp__mpi_world_poll(w)) {
            st = aborted_error(comm, op);
            break;
        }
        /* MPI_Test reports a single request's own error, not MPI_ERR_IN_STATUS. */
        int err = n == 1 ? MPI_Test(reqs, &done, MPI_STATUS_IGNORE)
                         : MPI_Testall(n, reqs, &done, MPI_STATUSES_IGNORE);
        if (err != MPI_SUCCESS) {
            w->wait_phase = PHASE_NONE;
            return seldp__mpi_call_failed(comm, op, n == 1 ? "MPI_Test" : "MPI_Testall", err, n);
        }
        if (done)
            break;
        if (seldp__mpi_world_poll(w) && abortable) {
            st = aborted_error(comm, op);
            break;
        }
        if (seldp__proto_now() > deadline) {
            st = timed_out(comm, op, phase, n);
            break;
        }
        seldp__proto_backoff_wait(&backoff);
    }
    w->wait_phase = PHASE_NONE;
    if (st != SELDP_OK)
        seldp__mpi_park(g, n, NULL, NULL);
    return st;
}

double seldp__mpi_body_deadline(const seldp_comm *comm)
{
    mpi_group *g = seldp__mpi_group(comm);
    seldp__mpi_stall_point(g, SELDP__MPI_STALL_BODY);
    return seldp__proto_now() + g->world->timeout_s;
}

seldp_status seldp__mpi_body_wait(seldp_comm *comm, seldp__comm_op op, int n, double deadline)
{
    return wait_phase(comm, op, PHASE_BODY, n, deadline, true);
}

void seldp__mpi_stall_point(mpi_group *g, int phase)
{
    if (g->stall_phase != phase)
        return;
    g->stall_phase = 0;
    struct timespec ts = {(time_t)g->stall_s,
                          (long)((g->stall_s - (double)(time_t)g->stall_s) * 1e9)};
    nanosleep(&ts, NULL);
}

/* ---- arrival ---------------------------------------------------------------------- */

/* This rank found the world aborted at the start of a collective whose header the others
 * may be waiting for: post it (marked aborted) so that their abandoned exchange completes,
 * once per group, and only when this rank's last collective on the group left nothing
 * pending (then no other rank can be further than this header). */
static void drain(mpi_group *g, const seldp__call_header *mine)
{
    if (!g->clean)
        return;
    g->clean = false;
    int n = 0;
    MPI_Comm_size(g->comm, &n);
    seldp__call_header *hdr = seldp__mpi_buf(g, BUF_HEADER, sizeof *hdr);
    void *all = seldp__mpi_buf(g, BUF_HEADERS, (size_t)n * sizeof *hdr);
    MPI_Request *req = seldp__mpi_buf(g, BUF_REQS, sizeof *req);
    if (!hdr || !all || !req)
        return;
    *hdr = *mine;
    hdr->staged = SELDP_ERR_ABORTED;
    *req = MPI_REQUEST_NULL;
    if (MPI_Iallgather(hdr, (int)sizeof *hdr, MPI_BYTE, all, (int)sizeof *hdr, MPI_BYTE, g->comm,
                       req) != MPI_SUCCESS)
        return;
    seldp__mpi_park(g, 1, NULL, NULL);
}

/* Whether a header was posted by a rank that had found the world aborted (drain). */
static bool drained(const seldp__call_header *hdrs, int n)
{
    for (int r = 0; r < n; r++)
        if (hdrs[r].staged == SELDP_ERR_ABORTED)
            return true;
    return false;
}

/* Some rank knows the world is aborted (a drained header, a confirmation): its notice is
 * on the way to this rank; wait for it (bounded by the timeout) and return the abort. */
static seldp_status await_notice(seldp_comm *comm, seldp__comm_op op)
{
    mpi_world *w = seldp__mpi_group(comm)->world;
    double deadline = seldp__proto_now() + w->timeout_s;
    seldp__proto_backoff backoff = SELDP__PROTO_BACKOFF_INIT;
    while (!seldp__mpi_world_poll(w) && seldp__proto_now() < deadline)
        seldp__proto_backoff_wait(&backoff);
    if (!w->aborted)
        seldp__mpi_world_abort(w, SELDP_ERR_ABORTED, "a rank of the group found the world aborted");
    return aborted_error(comm, op);
}

seldp_status seldp__mpi_call_begin(seldp_comm *comm, seldp__call_header *mine)
{
    mpi_group *g = seldp__mpi_group(comm);
    mpi_world *w = g->world;
    seldp__comm_op op = (seldp__comm_op)mine->op;
    int n = comm->size;
    g->headers = NULL;
    seldp__mpi_reap(w);
    seldp__mpi_stall_point(g, SELDP__MPI_STALL_ARRIVE);
    mine->seq = ++g->seq;
    if (seldp__mpi_world_poll(w)) {
        drain(g, mine);
        return aborted_error(comm, op);
    }
    seldp__call_header *hdr = seldp__mpi_buf(g, BUF_HEADER, sizeof *hdr);
    seldp__call_header *all = seldp__mpi_buf(g, BUF_HEADERS, (size_t)n * sizeof *hdr);
    MPI_Request *req = seldp__mpi_buf(g, BUF_REQS, sizeof *req);
    if (!hdr || !all || !req)
        return seldp__mpi_fail_alone(comm, op,
                                     seldp__fail(SELDP_ERR_NOMEM,
                                                 "rank %d: %s: out of memory for the headers",
                                                 comm->rank, seldp__comm_op_name(op)));
    *hdr = *mine;
    *req = MPI_REQUEST_NULL;
    int err = MPI_Iallgather(hdr, (int)sizeof *hdr, MPI_BYTE, all, (int)sizeof *hdr, MPI_BYTE,
                             g->comm, req);
    if (err != MPI_SUCCESS)
        return seldp__mpi_call_failed(comm, op, "MPI_Iallgather", err, 0);
    seldp__mpi_stall_point(g, SELDP__MPI_STALL_HEADER);
    seldp_status st =
        wait_phase(comm, op, PHASE_ARRIVE, 1, seldp__proto_now() + w->timeout_s, true);
    if (st != SELDP_OK)
        return st;
    if (drained(all, n))
        return await_notice(comm, op);
    seldp__proto_view view = {.size = n, .rank = comm->rank, .headers = all, .stride = sizeof *all};
    st = seldp__proto_agree(&view);
    if (st != SELDP_OK)
        return st;
    /* The exchange may have completed against the header of a rank that gave up at its
     * timeout (a rank late by about the timeout): once the world is known to be aborted,
     * the body is not started. The others get the notice in their body and return too;
     * a split, where no rank may stay out, confirms instead (seldp__mpi_confirm). */
    if (op != OP_SPLIT && seldp__mpi_world_poll(w))
        return aborted_error(comm, op);
    g->headers = all;
    return SELDP_OK;
}

seldp_status seldp__mpi_confirm(seldp_comm *comm, seldp__comm_op op)
{
    mpi_group *g = seldp__mpi_group(comm);
    mpi_world *w = g->world;
    int64_t *flags = seldp__mpi_buf(g, BUF_WORK, 2 * sizeof *flags);
    if (!flags)
        return seldp__mpi_fail_alone(comm, op,
                                     seldp__fail(SELDP_ERR_NOMEM, "rank %d: %s: out of memory",
                                                 comm->rank, seldp__comm_op_name(op)));
    flags[0] = seldp__mpi_world_poll(w);
    flags[1] = 0;
    int err =
        MPI_Iallreduce(&flags[0], &flags[1], 1, MPI_INT64_T, MPI_MAX, g->comm, g->buf[BUF_REQS]);
    if (err != MPI_SUCCESS)
        return seldp__mpi_call_failed(comm, op, "MPI_Iallreduce", err, 0);
    seldp_status st = wait_phase(comm, op, PHASE_BODY, 1, seldp__proto_now() + w->timeout_s, false);
    if (st != SELDP_OK)
        return st;
    return flags[1] ? await_notice(comm, op) : SELDP_OK;
}
