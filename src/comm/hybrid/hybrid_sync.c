/* The round every hybrid collective goes through (hybrid_impl.h): the members of a process
 * meet, the leader agrees the calls in the process and across processes, runs the body and
 * closes the round; each member copies its results out and leaves.
 *
 * Waits hold the group's mutex and sleep on its condition variable in slices of at most
 * 20 ms, so that an abort of the world (a flag every wait reads) is seen within a slice even
 * where no one signals; the leader also polls its MPI world for abort notices and census
 * questions between slices. Deadlines: a member's arrival and a step's end are bounded by
 * the world's timeout T from the moment the leader waits for them; a member waiting for its
 * leader gives up when the leader made no progress for 2 T + 2 s (the leader may be inside
 * one MPI call, itself bounded by T for the arrival and T for the data, plus the census). */
#define _POSIX_C_SOURCE 200809L /* pthread_condattr_setclock, clock_gettime, nanosleep */

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm/hybrid/hybrid_fault.h"
#include "comm/hybrid/hybrid_impl.h"
#include "comm/mpi/mpi_impl.h"
#include "internal.h"

#define SLICE_S        0.02
#define LEADER_SLACK_S 2.0

static void wait_slice(hy_group *g, double until)
{
    double d = until - seldp__proto_now();
    if (d > SLICE_S)
        d = SLICE_S;
    struct timespec ts = seldp__proto_deadline_after(d > 0 ? d : 0);
    pthread_cond_timedwait(&g->cv, &g->mu, &ts);
}

/* The world's abort as this rank's error. */
static seldp_status aborted_error(hy_group *g, int rank, seldp__comm_op op)
{
    hy_world *w = g->w;
    char reason[sizeof w->abort_reason];
    pthread_mutex_lock(&w->mu);
    seldp_status st = w->abort_status;
    memcpy(reason, w->abort_reason, sizeof reason);
    pthread_mutex_unlock(&w->mu);
    return seldp__proto_aborted(rank, op, st, reason);
}

/* An abort notice on the processes' MPI world (the leader, between slices): true when that
 * world is aborted, with its status and reason. */
static bool mpi_aborted(hy_group *g, seldp_status *st, char *reason, size_t size)
{
    if (!g->w->mpi || g->n_procs < 2)
        return false;
    mpi_world *mw = seldp__mpi_group(g->w->mpi)->world;
    if (pthread_mutex_trylock(&mw->lock) != 0)
        return false;
    bool aborted = seldp__mpi_world_poll(mw);
    if (aborted) {
        *st = mw->abort_status;
        snprintf(reason, size, "%s", mw->abort_reason);
    }
    pthread_mutex_unlock(&mw->lock);
    return aborted;
}

/* The test hook's stall of member `local` at `where` (hybrid_fault.h), sleeping in slices
 * so that an abort ends it. Called without the group's mutex. */
static void stall_point(hy_group *g, int local, int where)
{
    if (g->stall_where != where || g->stall_local != local)
        return;
    g->stall_where = 0;
    double until = seldp__proto_now() + g->stall_s;
    while (seldp__proto_now() < until && !atomic_load(&g->w->aborted)) {
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
}

/* Members of this process for which pred holds, as "3, 5" in group numbering and in world
 * numbering; returns how many. */
static int local_list(const hy_group *g, bool (*pred)(const hy_group *, int), char *who,
                      size_t who_size, char *world_who, size_t world_size)
{
    int n = 0;
    size_t a = 0, b = 0;
    who[0] = world_who[0] = '\0';
    for (int i = 0; i < g->n_local; i++) {
        if (!pred(g, i))
            continue;
        int r = g->local[i];
        if (a < who_size) {
            int len = snprintf(who + a, who_size - a, "%s%d", n ? ", " : "", r);
            a += len > 0 ? (size_t)len : 0;
        }
        if (b < world_size) {
            int len =
                snprintf(world_who + b, world_size - b, "%s%d", n ? ", " : "", g->world_ranks[r]);
            b += len > 0 ? (size_t)len : 0;
        }
        n++;
    }
    return n;
}

static bool not_in(const hy_group *g, int i)
{
    return !g->cells[i].in;
}

static bool step_pending(const hy_group *g, int i)
{
    return g->cells[i].done_seq != g->step_seq;
}

/* The extra values a member brings to the agreement (hybrid_impl.h, seldp__hy_collective). */
static int n_extra_of(const hy_group *g, seldp__comm_op op)
{
    switch (op) {
    case OP_ALLTOALLV:
        return 2 * g->size;
    case OP_SPLIT:
        return 2;
    case OP_ALLGATHERV:
        return 1;
    default:
        return 0;
    }
}

static void fill_extra(hy_group *g, int local, const hy_cell *s)
{
    int64_t *ex = g->cell_ex + (size_t)local * 2 * (size_t)g->size;
    switch ((seldp__comm_op)s->h.op) {
    case OP_ALLTOALLV:
        for (int p = 0; p < g->size; p++) {
            ex[p] = (int64_t)s->send_bytes[p];
            ex[g->size + p] = (int64_t)s->recv_bytes[p];
        }
        break;
    case OP_SPLIT:
        ex[0] = s->color;
        ex[1] = s->key;
        break;
    case OP_ALLGATHERV:
        ex[0] = (int64_t)s->bytes;
        break;
    default:
        break;
    }
}

const int64_t *seldp__hy_extra(const hy_group *g, int r, int n_extra)
{
    return g->extra + (size_t)r * (size_t)n_extra;
}

void *seldp__hy_buf(hy_group *g, int which, size_t bytes)
{
    if (bytes == 0)
        bytes = 1;
    if (g->cap[which] < bytes) {
        void *p = realloc(g->buf[which], bytes);
        if (!p) {
            seldp__fail(SELDP_ERR_NOMEM, "rank %d: out of memory for %zu bytes of staging",
                        g->local[0], bytes);
            return NULL;
        }
        g->buf[which] = p;
        g->cap[which] = bytes;
    }
    return g->buf[which];
}

size_t *seldp__hy_tab(hy_group *g, int which, size_t n)
{
    if (n == 0)
        n = 1;
    if (g->tab_cap[which] < n) {
        size_t *p = realloc(g->tab[which], n * sizeof *p);
        if (!p) {
            seldp__fail(SELDP_ERR_NOMEM, "rank %d: out of memory for a table of %zu entries",
                        g->local[0], n);
            return NULL;
        }
        g->tab[which] = p;
        g->tab_cap[which] = n;
    }
    return g->tab[which];
}

seldp_status seldp__hy_mpi_failed(hy_group *g, seldp_status st)
{
    char msg[512];
    snprintf(msg, sizeof msg, "%s", seldp_last_error());
    seldp__hy_world_abort(g->w, st == SELDP_ERR_TIMEOUT ? SELDP_ERR_TIMEOUT : SELDP_ERR_ABORTED,
                          "rank %d: %s", g->world_ranks[g->local[0]], msg);
    seldp__set_error(msg);
    return st;
}

seldp_status seldp__hy_step(hy_group *g, seldp__comm_op op, hy_step_fn fn, const void *ctx,
                            size_t ctx_size)
{
    hy_world *w = g->w;
    int rank = g->local[0];
    pthread_mutex_lock(&g->mu);
    g->step = fn;
    if (ctx_size)
        memcpy(g->step_ctx, ctx, ctx_size < sizeof g->step_ctx ? ctx_size : sizeof g->step_ctx);
    g->step_seq++;
    g->progress = seldp__proto_now();
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);

    stall_point(g, 0, SELDP__HY_STALL_STEP);
    hy_cell *me = &g->cells[0];
    me->st = fn(g, 0, g->step_ctx);
    if (me->st != SELDP_OK)
        snprintf(me->why, sizeof me->why, "%s", seldp_last_error());

    pthread_mutex_lock(&g->mu);
    me->done_seq = g->step_seq;
    double deadline = seldp__proto_now() + w->timeout_s;
    for (;;) {
        int pending = 0;
        for (int i = 0; i < g->n_local; i++)
            pending += step_pending(g, i);
        if (!pending)
            break;
        if (atomic_load(&w->aborted)) {
            pthread_mutex_unlock(&g->mu);
            return aborted_error(g, rank, op);
        }
        if (seldp__proto_now() > deadline) {
            char who[300], world_who[300], reason[512];
            seldp__proto_timeout t = {
                rank, g->world_ranks[rank], g->size, op, w->timeout_s, 0, who, world_who};
            t.missing = local_list(g, step_pending, who, sizeof who, world_who, sizeof world_who);
            pthread_mutex_unlock(&g->mu);
            seldp_status st = seldp__proto_stalled_inside(&t, false, reason, sizeof reason);
            char msg[1024];
            snprintf(msg, sizeof msg, "%s", seldp_last_error());
            seldp__hy_world_abort(w, SELDP_ERR_TIMEOUT, "%s", reason);
            seldp__set_error(msg);
            return st;
        }
        wait_slice(g, deadline);
    }
    pthread_mutex_unlock(&g->mu);
    for (int i = 0; i < g->n_local; i++)
        if (g->cells[i].st != SELDP_OK) {
            seldp__set_error(g->cells[i].why);
            return g->cells[i].st;
        }
    return SELDP_OK;
}

/* The leader, once every member arrived: the calls agree in this process, then across the
 * processes (one allgatherv of the processes' summaries among the leaders); g->extra then
 * holds every group rank's extra values. */
static seldp_status agree(hy_group *g, seldp__comm_op op)
{
    int rank = g->local[0];
    int n_extra = n_extra_of(g, op);
    const char *name = seldp__comm_op_name((int)op);
    size_t per = (size_t)n_extra;
    if (n_extra) {
        size_t need = (size_t)g->size * per;
        int64_t *p = realloc(g->extra, need * sizeof *p);
        if (!p)
            return seldp__fail(SELDP_ERR_NOMEM, "rank %d: %s: out of memory agreeing the calls",
                               rank, name);
        g->extra = p;
    }
    seldp__proto_view v = {
        .size = g->n_local, .rank = 0, .headers = &g->cells[0].h, .stride = sizeof(hy_cell)};
    seldp_status local = seldp__proto_agree(&v);
    char local_msg[1024] = "";
    if (local != SELDP_OK)
        snprintf(local_msg, sizeof local_msg,
                 "rank %d: %s: the ranks of process %d disagree (local ranks): %s", rank, name,
                 g->w->proc, seldp_last_error());
    if (g->n_procs == 1) {
        if (local != SELDP_OK)
            return seldp__fail(local, "%s", local_msg);
        for (int i = 0; i < g->n_local; i++)
            memcpy(g->extra + (size_t)g->local[i] * per, g->cell_ex + (size_t)i * 2 * g->size,
                   per * sizeof(int64_t));
        return SELDP_OK;
    }

    /* this process's summary and its members' extra values, in local order */
    size_t blob_bytes = sizeof(seldp__call_header) + (size_t)g->n_local * per * sizeof(int64_t);
    unsigned char *blob = seldp__hy_buf(g, 3, blob_bytes);
    if (!blob)
        return SELDP_ERR_NOMEM;
    seldp__call_header sum = g->cells[0].h;
    sum.staged = local;
    sum.key = g->id; /* the same group everywhere (its tag is made from it) */
    if (op == OP_ALLGATHERV)
        sum.bytes = 0; /* per rank */
    memcpy(blob, &sum, sizeof sum);
    for (int i = 0; i < g->n_local; i++)
        memcpy(blob + sizeof sum + (size_t)i * per * sizeof(int64_t),
               g->cell_ex + (size_t)i * 2 * g->size, per * sizeof(int64_t));
    void *all = NULL;
    size_t *lens = seldp__hy_tab(g, 5, (size_t)g->n_procs);
    if (!lens)
        return SELDP_ERR_NOMEM;
    seldp_status st = seldp__hy_share(g, op, blob, blob_bytes, &all, lens);
    if (st != SELDP_OK)
        return st;
    const unsigned char *at = all;
    for (int q = 0; q < g->n_procs; q++) {
        int members = g->proc_start[q + 1] - g->proc_start[q];
        size_t expect = sizeof sum + (size_t)members * per * sizeof(int64_t);
        if (lens[q] != expect) {
            free(all);
            return seldp__hy_mpi_failed(
                g, seldp__fail(SELDP_ERR_INTERNAL,
                               "rank %d: %s: process %d sent a summary of %zu bytes, expected %zu",
                               rank, name, q, lens[q], expect));
        }
        memcpy(&g->sums[q], at, sizeof sum);
        if (g->sums[q].key != g->id) {
            free(all);
            return seldp__hy_mpi_failed(
                g, seldp__fail(SELDP_ERR_INTERNAL,
                               "rank %d: %s: process %d answered for another group (id %lld, "
                               "expected %lld): two groups share a tag",
                               rank, name, g->proc_rank[q], (long long)g->sums[q].key,
                               (long long)g->id));
        }
        for (int i = 0; i < members; i++)
            memcpy(g->extra + (size_t)g->members[g->proc_start[q] + i] * per,
                   at + sizeof sum + (size_t)i * per * sizeof(int64_t), per * sizeof(int64_t));
        at += lens[q];
    }
    free(all);
    for (int q = 0; q < g->n_procs; q++) {
        seldp_status s = (seldp_status)g->sums[q].staged;
        if (s == SELDP_OK)
            continue;
        if (q == g->my_proc)
            return seldp__fail(s, "%s", local_msg);
        return seldp__fail(s, "rank %d: %s: the ranks of another process (%d) disagree (%s)", rank,
                           name, q, seldp_status_name(s));
    }
    seldp__proto_view pv = {.size = g->n_procs,
                            .rank = g->my_proc,
                            .headers = g->sums,
                            .stride = sizeof(seldp__call_header)};
    st = seldp__proto_agree(&pv);
    if (st != SELDP_OK) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", seldp_last_error());
        return seldp__fail(st, "rank %d: %s: across processes (numbered as processes): %s", rank,
                           name, msg);
    }
    if (op == OP_ALLTOALLV) {
        /* every rank's counts are known to every leader: the same verdict everywhere */
        for (int s = 0; s < g->size; s++)
            for (int d = 0; d < g->size; d++) {
                int64_t sends = seldp__hy_extra(g, s, n_extra)[d];
                int64_t expects = seldp__hy_extra(g, d, n_extra)[g->size + s];
                if (sends != expects)
                    return seldp__proto_alltoallv_mismatch(rank, s, (size_t)sends, d,
                                                           (size_t)expects);
            }
    }
    return SELDP_OK;
}

/* The last member to leave opens the next round (under the mutex). */
static void leave(hy_group *g)
{
    if (++g->departed < g->n_local)
        return;
    g->round++;
    g->arrived = g->departed = 0;
    g->leader_in = false;
    g->closed = false;
    g->result = SELDP_OK;
    g->message[0] = '\0';
    for (int i = 0; i < g->n_local; i++)
        g->cells[i].in = false;
    pthread_cond_broadcast(&g->cv);
}

/* Every member, after the round closed: its results, then leave. */
static seldp_status finish_round(hy_group *g, int local, hy_finish_fn finish, void *ctx)
{
    seldp_status st = g->result;
    char msg[sizeof g->message];
    if (st != SELDP_OK)
        memcpy(msg, g->message, sizeof msg);
    pthread_mutex_unlock(&g->mu);
    if (st == SELDP_OK && finish)
        st = finish(g, local, ctx);
    else if (st != SELDP_OK)
        seldp__set_error(msg);
    stall_point(g, local, SELDP__HY_STALL_LEAVE);
    pthread_mutex_lock(&g->mu);
    leave(g);
    pthread_mutex_unlock(&g->mu);
    return st;
}

/* The leader closes the round with `st` and its message. */
static void close_round(hy_group *g, seldp_status st)
{
    pthread_mutex_lock(&g->mu);
    g->result = st;
    if (st != SELDP_OK)
        snprintf(g->message, sizeof g->message, "%s", seldp_last_error());
    g->closed = true;
    g->progress = seldp__proto_now();
    pthread_cond_broadcast(&g->cv);
}

static seldp_status leader_round(seldp_comm *comm, hy_group *g, hy_body_fn body,
                                 hy_finish_fn finish, void *ctx, double t0)
{
    hy_world *w = g->w;
    seldp__comm_op op = (seldp__comm_op)g->cells[0].h.op;
    g->leader_in = true;
    g->progress = seldp__proto_now();
    pthread_cond_broadcast(&g->cv);
    double deadline = t0 + w->timeout_s;
    seldp_status st = SELDP_OK;
    while (g->arrived < g->n_local) {
        if (atomic_load(&w->aborted)) {
            pthread_mutex_unlock(&g->mu);
            st = aborted_error(g, comm->rank, op);
            close_round(g, st);
            return finish_round(g, 0, NULL, NULL);
        }
        if (seldp__proto_now() > deadline) {
            char who[300], world_who[300], reason[512];
            seldp__proto_timeout t = {comm->rank, comm->world_rank, g->size, op, w->timeout_s, 0,
                                      who,        world_who};
            t.missing = local_list(g, not_in, who, sizeof who, world_who, sizeof world_who);
            pthread_mutex_unlock(&g->mu);
            st = seldp__proto_not_arrived(&t, reason, sizeof reason);
            char msg[1024];
            snprintf(msg, sizeof msg, "%s", seldp_last_error());
            seldp__hy_world_abort(w, SELDP_ERR_TIMEOUT, "%s", reason);
            seldp__set_error(msg);
            close_round(g, st);
            return finish_round(g, 0, NULL, NULL);
        }
        seldp_status nst;
        char reason[512];
        pthread_mutex_unlock(&g->mu);
        bool notice = mpi_aborted(g, &nst, reason, sizeof reason);
        if (notice)
            seldp__hy_world_abort(w, nst, "%s", reason);
        pthread_mutex_lock(&g->mu);
        if (!notice)
            wait_slice(g, deadline);
    }
    pthread_mutex_unlock(&g->mu);
    st = agree(g, op);
    if (st == SELDP_OK && atomic_load(&w->aborted))
        st = aborted_error(g, comm->rank, op);
    if (st == SELDP_OK && body)
        st = body(g, ctx);
    close_round(g, st);
    return finish_round(g, 0, finish, ctx);
}

static seldp_status member_round(seldp_comm *comm, hy_group *g, int local, hy_finish_fn finish,
                                 void *ctx, double t0)
{
    hy_world *w = g->w;
    seldp__comm_op op = (seldp__comm_op)g->cells[local].h.op;
    uint64_t seen = g->step_seq;
    for (;;) {
        if (g->closed)
            return finish_round(g, local, finish, ctx);
        if (g->leader_in && g->step_seq != seen) {
            seen = g->step_seq;
            hy_step_fn fn = g->step;
            pthread_mutex_unlock(&g->mu);
            stall_point(g, local, SELDP__HY_STALL_STEP);
            pthread_mutex_lock(&g->mu);
            if (g->closed || atomic_load(&w->aborted))
                continue; /* given up on while this rank stalled */
            pthread_mutex_unlock(&g->mu);
            hy_cell *me = &g->cells[local];
            me->st = fn(g, local, g->step_ctx);
            if (me->st != SELDP_OK)
                snprintf(me->why, sizeof me->why, "%s", seldp_last_error());
            pthread_mutex_lock(&g->mu);
            me->done_seq = seen;
            pthread_cond_broadcast(&g->cv);
            continue;
        }
        if (atomic_load(&w->aborted)) {
            /* the leader never reads this rank's memory: it may leave at once */
            pthread_mutex_unlock(&g->mu);
            return aborted_error(g, comm->rank, op);
        }
        double deadline =
            g->leader_in ? g->progress + 2 * w->timeout_s + LEADER_SLACK_S : t0 + w->timeout_s;
        if (seldp__proto_now() > deadline) {
            int leader = g->local[0];
            char reason[512];
            seldp_status st;
            if (g->leader_in) {
                snprintf(reason, sizeof reason,
                         "rank %d timed out in %s: the leader of its process (rank %d) made no "
                         "progress for %g s",
                         comm->world_rank, seldp__comm_op_name((int)op), g->world_ranks[leader],
                         2 * w->timeout_s + LEADER_SLACK_S);
                st = seldp__fail(SELDP_ERR_TIMEOUT,
                                 "rank %d: %s timed out: rank %d (world rank %d), which leads the "
                                 "ranks of this process, made no progress for %g s (stalled "
                                 "inside it)",
                                 comm->rank, seldp__comm_op_name((int)op), leader,
                                 g->world_ranks[leader], 2 * w->timeout_s + LEADER_SLACK_S);
            } else {
                char who[32], world_who[32];
                snprintf(who, sizeof who, "%d", leader);
                snprintf(world_who, sizeof world_who, "%d", g->world_ranks[leader]);
                seldp__proto_timeout t = {
                    comm->rank, comm->world_rank, g->size, op, w->timeout_s, 1, who, world_who};
                st = seldp__proto_not_arrived(&t, reason, sizeof reason);
            }
            pthread_mutex_unlock(&g->mu);
            char msg[1024];
            snprintf(msg, sizeof msg, "%s", seldp_last_error());
            seldp__hy_world_abort(w, SELDP_ERR_TIMEOUT, "%s", reason);
            seldp__set_error(msg);
            return st;
        }
        wait_slice(g, deadline);
    }
}

seldp_status seldp__hy_collective(seldp_comm *comm, hy_cell *mine, hy_body_fn body,
                                  hy_finish_fn finish, void *ctx)
{
    hy_member *m = seldp__hy_member(comm);
    hy_group *g = m->g;
    hy_world *w = g->w;
    seldp__comm_op op = (seldp__comm_op)mine->h.op;
    uint64_t round = m->calls++;
    mine->h.seq = (int64_t)round + 1;
    mine->world_rank = comm->world_rank;
    mine->device = comm->device;
    stall_point(g, m->local, SELDP__HY_STALL_ARRIVE);
    double t0 = seldp__proto_now();

    pthread_mutex_lock(&g->mu);
    while (g->round != round) {
        if (atomic_load(&w->aborted))
            break;
        if (seldp__proto_now() > t0 + w->timeout_s) {
            /* the previous round: members that had not left it */
            pthread_mutex_unlock(&g->mu);
            char reason[512];
            seldp_status st = seldp__fail(SELDP_ERR_TIMEOUT,
                                          "rank %d: %s timed out after %g s: a rank of this "
                                          "process stalled inside the previous collective",
                                          comm->rank, seldp__comm_op_name((int)op), w->timeout_s);
            snprintf(reason, sizeof reason,
                     "rank %d timed out after %g s in %s: a rank of its process stalled inside "
                     "the previous collective",
                     comm->world_rank, w->timeout_s, seldp__comm_op_name((int)op));
            char msg[1024];
            snprintf(msg, sizeof msg, "%s", seldp_last_error());
            seldp__hy_world_abort(w, SELDP_ERR_TIMEOUT, "%s", reason);
            seldp__set_error(msg);
            return st;
        }
        wait_slice(g, t0 + w->timeout_s);
    }
    if (atomic_load(&w->aborted)) {
        pthread_mutex_unlock(&g->mu);
        return aborted_error(g, comm->rank, op);
    }
    hy_cell *s = &g->cells[m->local];
    uint64_t done = s->done_seq;
    *s = *mine;
    s->done_seq = done;
    s->in = true;
    s->st = SELDP_OK;
    fill_extra(g, m->local, s);
    g->arrived++;
    pthread_cond_broadcast(&g->cv);
    if (m->local == 0)
        return leader_round(comm, g, body, finish, ctx, t0);
    return member_round(comm, g, m->local, finish, ctx, t0);
}
