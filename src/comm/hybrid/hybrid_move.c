/* Everything between the leaders of a hybrid group (hybrid_impl.h): the agreement's
 * summaries (seldp__hy_share) and the data (seldp__hy_exchange), as non-blocking
 * point-to-point MPI on the world's data communicator under the group's own tag, straight from
 * and into the group's staging, polled against the world's timeout. No communicator is made
 * per group: MPI's communicator creation from several threads at once (the leaders of
 * different groups splitting at the same time) can wait for each other across processes. A leader
 * that times out or sees the world aborted gives its operations up: MPI may still read or write
 * their buffers, so the group parks them with their requests and takes fresh ones; the parked ones
 * are freed when MPI has completed them (tested at every exchange and when the group goes), else
 * left to the process's end. */
#define _POSIX_C_SOURCE 200809L

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/hybrid/hybrid_impl.h"
#include "comm/mpi/mpi_impl.h"
#include "internal.h"

#define PIECE ((size_t)1 << 30) /* far inside MPI's int counts */

struct hy_parked {
    struct hy_parked *next;
    int n;
    MPI_Request *reqs;
    void *mem[4];
};

void seldp__hy_reap(hy_group *g, bool last)
{
    for (hy_parked **p = &g->parked; *p;) {
        hy_parked *k = *p;
        int done = 0;
        if (MPI_Testall(k->n, k->reqs, &done, MPI_STATUSES_IGNORE) != MPI_SUCCESS)
            done = 0;
        if (done || last) {
            *p = k->next;
            if (done) { /* else MPI may still use them: left to the process's end */
                for (int i = 0; i < 4; i++)
                    free(k->mem[i]);
                free(k->reqs);
                free(k);
            }
            continue;
        }
        p = &k->next;
    }
}

/* Give up the operations: park the requests and every staging buffer of the group. */
static void park(hy_group *g, MPI_Request *reqs, int n)
{
    hy_parked *k = calloc(1, sizeof *k);
    if (!k)
        return; /* the buffers stay the group's: MPI may write into them, never freed early */
    k->n = n;
    k->reqs = reqs;
    for (int i = 0; i < 4; i++) {
        k->mem[i] = g->buf[i];
        g->buf[i] = NULL;
        g->cap[i] = 0;
    }
    k->next = g->parked;
    g->parked = k;
}

static int pieces(size_t bytes)
{
    return bytes ? (int)((bytes + PIECE - 1) / PIECE) : 0;
}

/* MPI's text for a failure, as this rank's SELDP_ERR_TRANSPORT. */
static seldp_status mpi_error(hy_group *g, const char *name, int err)
{
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(err, text, &len);
    return seldp__fail(SELDP_ERR_TRANSPORT, "rank %d (process %d): %s: MPI failed: %s",
                       g->world_ranks[g->local[0]], g->w->proc, name, text);
}

/* An abort notice on the processes' MPI world (polled now and then): the world's abort here. */
static void poll_notices(hy_group *g)
{
    hy_world *w = g->w;
    if (!w->mpi)
        return;
    mpi_world *mw = seldp__mpi_group(w->mpi)->world;
    if (pthread_mutex_trylock(&mw->lock) != 0)
        return;
    bool aborted = seldp__mpi_world_poll(mw);
    char reason[sizeof mw->abort_reason];
    seldp_status why = mw->abort_status;
    memcpy(reason, mw->abort_reason, sizeof reason);
    pthread_mutex_unlock(&mw->lock);
    if (aborted)
        seldp__hy_world_abort(w, why, "%s", reason);
}

/* One poll of the wait loops: the world's abort (an error), or the deadline (true). */
static seldp_status poll_once(hy_group *g, seldp__comm_op op, int *polls)
{
    hy_world *w = g->w;
    if ((++*polls & 63) == 0)
        poll_notices(g);
    if (atomic_load(&w->aborted)) {
        pthread_mutex_lock(&w->mu);
        seldp_status st =
            seldp__proto_aborted(g->world_ranks[g->local[0]], op, w->abort_status, w->abort_reason);
        pthread_mutex_unlock(&w->mu);
        return st;
    }
    return SELDP_OK;
}

/* A wait between processes ran out of time: the world's abort, this rank's error. */
static seldp_status timed_out(hy_group *g, seldp__comm_op op, const char *what, const char *who,
                              int missing)
{
    hy_world *w = g->w;
    seldp_status st = seldp__fail(
        SELDP_ERR_TIMEOUT,
        "rank %d (process %d): %s timed out after %g s %s: process%s %s "
        "(ranks in the MPI parent) %s",
        g->world_ranks[g->local[0]], w->proc, seldp__comm_op_name((int)op), w->timeout_s, what,
        missing > 1 ? "es" : "", who, missing > 1 ? "did not answer" : "did not answer");
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", seldp_last_error());
    seldp__hy_world_abort(w, SELDP_ERR_TIMEOUT, "%s", msg);
    seldp__set_error(msg);
    return st;
}

static void list_add(char *who, size_t size, size_t *used, int *missing, int rank)
{
    if (*used < size) {
        int len = snprintf(who + *used, size - *used, "%s%d", *missing ? ", " : "", rank);
        *used += len > 0 ? (size_t)len : 0;
    }
    (*missing)++;
}

static seldp_status exchange(hy_group *g, seldp__comm_op op, const unsigned char *sbase,
                             const size_t *soff, const size_t *slen, unsigned char *rbase,
                             const size_t *roff, const size_t *rlen, bool copy_self)
{
    hy_world *w = g->w;
    const char *name = seldp__comm_op_name((int)op);
    seldp__hy_reap(g, false);
    if (copy_self && slen[g->my_proc])
        memmove(rbase + roff[g->my_proc], sbase + soff[g->my_proc], slen[g->my_proc]);
    int n = 0;
    for (int q = 0; q < g->n_procs; q++)
        if (q != g->my_proc)
            n += pieces(slen[q]) + pieces(rlen[q]);
    MPI_Request *reqs = calloc((size_t)n + 1, sizeof *reqs);
    int *peer = calloc((size_t)n + 1, sizeof *peer);
    if (!reqs || !peer) {
        free(reqs);
        free(peer);
        return seldp__fail(SELDP_ERR_NOMEM, "rank %d: %s: out of memory for requests",
                           g->world_ranks[g->local[0]], name);
    }
    int k = 0, err = MPI_SUCCESS;
    for (int q = 0; q < g->n_procs && err == MPI_SUCCESS; q++) {
        if (q == g->my_proc)
            continue;
        for (size_t at = 0; at < rlen[q] && err == MPI_SUCCESS; at += PIECE, k++) {
            size_t len = rlen[q] - at < PIECE ? rlen[q] - at : PIECE;
            peer[k] = q;
            err = MPI_Irecv(rbase + roff[q] + at, (int)len, MPI_BYTE, g->proc_rank[q], g->tag,
                            w->data, &reqs[k]);
        }
    }
    for (int d = 1; d < g->n_procs && err == MPI_SUCCESS; d++) {
        int q = (g->my_proc + d) % g->n_procs; /* a different peer first on each process */
        for (size_t at = 0; at < slen[q] && err == MPI_SUCCESS; at += PIECE, k++) {
            size_t len = slen[q] - at < PIECE ? slen[q] - at : PIECE;
            peer[k] = q;
            err = MPI_Isend(sbase + soff[q] + at, (int)len, MPI_BYTE, g->proc_rank[q], g->tag,
                            w->data, &reqs[k]);
        }
    }
    seldp_status st = err == MPI_SUCCESS ? SELDP_OK : mpi_error(g, name, err);
    double deadline = seldp__proto_now() + w->timeout_s;
    seldp__proto_backoff backoff = SELDP__PROTO_BACKOFF_INIT;
    int polls = 0;
    while (st == SELDP_OK) {
        int done = 0;
        err = MPI_Testall(k, reqs, &done, MPI_STATUSES_IGNORE);
        if (err != MPI_SUCCESS) {
            st = mpi_error(g, name, err);
            break;
        }
        if (done || (st = poll_once(g, op, &polls)) != SELDP_OK)
            break;
        if (seldp__proto_now() > deadline) {
            char who[256] = "";
            size_t used = 0;
            int missing = 0;
            for (int i = 0; i < k; i++) {
                int flag = 0;
                if (MPI_Test(&reqs[i], &flag, MPI_STATUS_IGNORE) == MPI_SUCCESS && flag)
                    continue;
                bool listed = false;
                for (int j = 0; j < i; j++)
                    listed = listed || (peer[j] == peer[i] && reqs[j] != MPI_REQUEST_NULL);
                if (!listed)
                    list_add(who, sizeof who, &used, &missing, g->proc_rank[peer[i]]);
            }
            st = timed_out(g, op, "moving data between the processes", who, missing);
            break;
        }
        seldp__proto_backoff_wait(&backoff);
    }
    free(peer);
    if (st != SELDP_OK) {
        park(g, reqs, k);
        if (!atomic_load(&w->aborted)) {
            char msg[1024];
            snprintf(msg, sizeof msg, "%s", seldp_last_error());
            seldp__hy_world_abort(w, SELDP_ERR_ABORTED, "%s", msg);
            seldp__set_error(msg);
        }
        return st;
    }
    free(reqs);
    return SELDP_OK;
}

seldp_status seldp__hy_exchange(hy_group *g, seldp__comm_op op, const unsigned char *sbase,
                                const size_t *soff, const size_t *slen, unsigned char *rbase,
                                const size_t *roff, const size_t *rlen)
{
    return exchange(g, op, sbase, soff, slen, rbase, roff, rlen, false);
}

seldp_status seldp__hy_exchange_self(hy_group *g, seldp__comm_op op, const unsigned char *sbase,
                                     const size_t *soff, const size_t *slen, unsigned char *rbase,
                                     const size_t *roff, const size_t *rlen)
{
    return exchange(g, op, sbase, soff, slen, rbase, roff, rlen, true);
}

seldp_status seldp__hy_share(hy_group *g, seldp__comm_op op, const void *mine, size_t len,
                             void **all, size_t *lens)
{
    hy_world *w = g->w;
    const char *name = seldp__comm_op_name((int)op);
    int P = g->n_procs, me = g->my_proc;
    *all = NULL;
    seldp__hy_reap(g, false);
    if (len > PIECE)
        return seldp__fail(SELDP_ERR_INTERNAL, "rank %d: %s: a summary of %zu bytes",
                           g->world_ranks[g->local[0]], name, len);
    MPI_Request *reqs = calloc(2 * (size_t)P, sizeof *reqs);
    void **got = calloc((size_t)P, sizeof *got);
    bool *probed = calloc((size_t)P, sizeof *probed);
    if (!reqs || !got || !probed) {
        free(reqs);
        free(got);
        free(probed);
        return seldp__fail(SELDP_ERR_NOMEM, "rank %d: %s: out of memory",
                           g->world_ranks[g->local[0]], name);
    }
    for (int q = 0; q < 2 * P; q++)
        reqs[q] = MPI_REQUEST_NULL;
    int err = MPI_SUCCESS;
    for (int q = 0; q < P && err == MPI_SUCCESS; q++)
        if (q != me)
            err =
                MPI_Isend(mine, (int)len, MPI_BYTE, g->proc_rank[q], g->tag, w->data, &reqs[P + q]);
    seldp_status st = err == MPI_SUCCESS ? SELDP_OK : mpi_error(g, name, err);
    probed[me] = true;
    double deadline = seldp__proto_now() + w->timeout_s;
    seldp__proto_backoff backoff = SELDP__PROTO_BACKOFF_INIT;
    int polls = 0;
    while (st == SELDP_OK) {
        bool all_probed = true;
        for (int q = 0; q < P && st == SELDP_OK; q++) {
            if (probed[q])
                continue;
            int flag = 0, count = 0;
            MPI_Message msg;
            MPI_Status status;
            err = MPI_Improbe(g->proc_rank[q], g->tag, w->data, &flag, &msg, &status);
            if (err == MPI_SUCCESS && flag) {
                MPI_Get_count(&status, MPI_BYTE, &count);
                lens[q] = (size_t)count;
                got[q] = malloc(lens[q] ? lens[q] : 1);
                if (!got[q]) {
                    st = seldp__fail(SELDP_ERR_NOMEM, "rank %d: %s: out of memory",
                                     g->world_ranks[g->local[0]], name);
                    break;
                }
                err = MPI_Imrecv(got[q], count, MPI_BYTE, &msg, &reqs[q]);
                probed[q] = true;
            }
            if (err != MPI_SUCCESS)
                st = mpi_error(g, name, err);
            all_probed = all_probed && probed[q];
        }
        if (st != SELDP_OK)
            break;
        int done = 0;
        err = MPI_Testall(2 * P, reqs, &done, MPI_STATUSES_IGNORE);
        if (err != MPI_SUCCESS) {
            st = mpi_error(g, name, err);
            break;
        }
        if ((all_probed && done) || (st = poll_once(g, op, &polls)) != SELDP_OK)
            break;
        if (seldp__proto_now() > deadline) {
            char who[256] = "";
            size_t used = 0;
            int missing = 0;
            for (int q = 0; q < P; q++)
                if (!probed[q] || reqs[q] != MPI_REQUEST_NULL)
                    list_add(who, sizeof who, &used, &missing, g->proc_rank[q]);
            st = timed_out(g, op, "waiting for the other processes", who, missing);
            break;
        }
        seldp__proto_backoff_wait(&backoff);
    }
    if (st != SELDP_OK) {
        /* the sends read `mine` (the group's staging) and the receives write `got`: kept */
        park(g, reqs, 2 * P);
        free(probed);
        if (!atomic_load(&w->aborted)) {
            char m[1024];
            snprintf(m, sizeof m, "%s", seldp_last_error());
            seldp__hy_world_abort(w, SELDP_ERR_ABORTED, "%s", m);
            seldp__set_error(m);
        }
        return st; /* got[] left: MPI may still write into them */
    }
    lens[me] = len;
    size_t total = 0;
    for (int q = 0; q < P; q++)
        total += lens[q];
    unsigned char *out = malloc(total ? total : 1);
    if (out) {
        size_t at = 0;
        for (int q = 0; q < P; q++) {
            memcpy(out + at, q == me ? mine : got[q], lens[q]);
            at += lens[q];
        }
    }
    for (int q = 0; q < P; q++)
        free(got[q]);
    free(got);
    free(reqs);
    free(probed);
    if (!out)
        return seldp__fail(SELDP_ERR_NOMEM, "rank %d: %s: out of memory",
                           g->world_ranks[g->local[0]], name);
    *all = out;
    return SELDP_OK;
}
