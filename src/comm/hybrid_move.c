/* The data between the leaders of a hybrid group (hybrid_impl.h, seldp__hy_exchange):
 * non-blocking point-to-point MPI on the group's own data communicator, straight from and
 * into the group's staging (no copy through the MPI transport's buffers, nothing for a
 * process's own block), polled against the world's timeout. A leader that times out or
 * sees the world aborted gives its operations up: MPI may still read or write their
 * buffers, so the group parks them with their requests and takes fresh ones; the parked
 * ones are freed when MPI has completed them (tested at every exchange and when the group
 * goes), else left to the process's end. */
#define _POSIX_C_SOURCE 200809L

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/hybrid_impl.h"
#include "comm/mpi_impl.h"
#include "internal.h"

#define PIECE  ((size_t)1 << 30) /* far inside MPI's int counts */
#define TAG_HY 11

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

seldp_status seldp__hy_exchange(hy_group *g, seldp__comm_op op, const unsigned char *sbase,
                                const size_t *soff, const size_t *slen, unsigned char *rbase,
                                const size_t *roff, const size_t *rlen)
{
    hy_world *w = g->w;
    int rank = g->world_ranks[g->local[0]];
    const char *name = seldp__comm_op_name((int)op);
    seldp__hy_reap(g, false);
    int n = 0;
    for (int q = 0; q < g->n_procs; q++)
        if (q != g->my_proc)
            n += pieces(slen[q]) + pieces(rlen[q]);
    MPI_Request *reqs = calloc((size_t)n + 1, sizeof *reqs);
    int *peer = calloc((size_t)n + 1, sizeof *peer);
    if (!reqs || !peer) {
        free(reqs);
        free(peer);
        return seldp__fail(SELDP_ERR_NOMEM, "rank %d: %s: out of memory for requests", rank, name);
    }
    int k = 0, err = MPI_SUCCESS;
    for (int q = 0; q < g->n_procs && err == MPI_SUCCESS; q++) {
        if (q == g->my_proc)
            continue;
        for (size_t at = 0; at < rlen[q] && err == MPI_SUCCESS; at += PIECE, k++) {
            size_t len = rlen[q] - at < PIECE ? rlen[q] - at : PIECE;
            peer[k] = q;
            err = MPI_Irecv(rbase + roff[q] + at, (int)len, MPI_BYTE, q, TAG_HY, g->data, &reqs[k]);
        }
    }
    for (int d = 1; d < g->n_procs && err == MPI_SUCCESS; d++) {
        int q = (g->my_proc + d) % g->n_procs; /* a different peer first on each process */
        for (size_t at = 0; at < slen[q] && err == MPI_SUCCESS; at += PIECE, k++) {
            size_t len = slen[q] - at < PIECE ? slen[q] - at : PIECE;
            peer[k] = q;
            err = MPI_Isend(sbase + soff[q] + at, (int)len, MPI_BYTE, q, TAG_HY, g->data, &reqs[k]);
        }
    }
    seldp_status st = SELDP_OK;
    if (err != MPI_SUCCESS) {
        char text[MPI_MAX_ERROR_STRING];
        int len = 0;
        MPI_Error_string(err, text, &len);
        st = seldp__fail(SELDP_ERR_TRANSPORT, "rank %d (process %d): %s: MPI failed: %s", rank,
                         w->proc, name, text);
    }
    double deadline = seldp__proto_now() + w->timeout_s;
    seldp__proto_backoff backoff = SELDP__PROTO_BACKOFF_INIT;
    int polls = 0;
    while (st == SELDP_OK) {
        int done = 0;
        err = MPI_Testall(k, reqs, &done, MPI_STATUSES_IGNORE);
        if (err != MPI_SUCCESS) {
            char text[MPI_MAX_ERROR_STRING];
            int len = 0;
            MPI_Error_string(err, text, &len);
            st = seldp__fail(SELDP_ERR_TRANSPORT, "rank %d (process %d): %s: MPI failed: %s", rank,
                             w->proc, name, text);
            break;
        }
        if (done)
            break;
        if (atomic_load(&w->aborted)) {
            pthread_mutex_lock(&w->mu);
            st = seldp__proto_aborted(rank, op, w->abort_status, w->abort_reason);
            pthread_mutex_unlock(&w->mu);
            break;
        }
        if (g->mpi && (++polls & 63) == 0) {
            mpi_world *mw = seldp__mpi_group(g->mpi)->world;
            if (pthread_mutex_trylock(&mw->lock) == 0) {
                bool aborted = seldp__mpi_world_poll(mw);
                char reason[sizeof mw->abort_reason];
                seldp_status why = mw->abort_status;
                memcpy(reason, mw->abort_reason, sizeof reason);
                pthread_mutex_unlock(&mw->lock);
                if (aborted) {
                    seldp__hy_world_abort(w, why, "%s", reason);
                    continue; /* seen as the world's abort */
                }
            }
        }
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
                if (listed)
                    continue;
                if (used < sizeof who) {
                    int len = snprintf(who + used, sizeof who - used, "%s%d", missing ? ", " : "",
                                       peer[i]);
                    used += len > 0 ? (size_t)len : 0;
                }
                missing++;
            }
            st = seldp__fail(SELDP_ERR_TIMEOUT,
                             "rank %d (process %d): %s timed out after %g s moving data between "
                             "the processes: process%s %s did not complete its part",
                             rank, w->proc, name, w->timeout_s, missing > 1 ? "es" : "", who);
            char msg[1024];
            snprintf(msg, sizeof msg, "%s", seldp_last_error());
            seldp__hy_world_abort(w, SELDP_ERR_TIMEOUT, "%s", msg);
            seldp__set_error(msg);
            break;
        }
        seldp__proto_backoff_wait(&backoff);
    }
    free(peer);
    if (st != SELDP_OK) {
        park(g, reqs, k);
        if (st != SELDP_ERR_TIMEOUT && !atomic_load(&w->aborted)) {
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
