/* The hybrid transport's private interface (seldp/hybrid.h), shared by its files:
 *   hybrid.c             worlds, joins, groups, split, abort, destroy, the ops table;
 *   hybrid_sync.c        what every collective goes through: the meeting of a group's ranks
 *                        inside a process, the leader's steps, the waits and their
 *                        deadlines, and the agreement across processes;
 *   hybrid_collectives.c the bodies of the collectives;
 *   hybrid_move.c        the messages between the leaders.
 *
 * A group (hy_group) is the state one process holds of a communicator: its members in
 * this process (cells, one per member thread), where every group rank lives, and for a
 * group over several processes its id, tag and the processes' ranks in the parent. A collective is
 * a round: every member arrives (fills its cell), the leader (local member 0, the smallest group
 * rank of the process) checks the calls, runs the body (steps that every member runs on
 * its own buffers, and MPI calls of its own), and closes the round with one status; each
 * member then copies out its results and leaves, the last one opening the next round.
 * Members touch only their own buffers and the group's staging memory, which the leader
 * grows only between steps and which lives as long as the group. */
#ifndef SELDP_HYBRID_IMPL_H
#define SELDP_HYBRID_IMPL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include <mpi.h>

#include "comm/comm_impl.h"
#include "comm/protocol.h"
#include "seldp/hybrid.h"

typedef struct hy_group hy_group;
typedef struct hy_parked hy_parked;

/* A member's cell: its call, as it arrives. */
typedef struct hy_cell {
    seldp__call_header h; /* first: the protocol's views read headers at a stride */
    int world_rank;
    seldp_device device;
    const void *send;
    void *recv;
    size_t bytes; /* broadcast, allgather: per rank; allgatherv: this rank's */
    seldp_dtype dtype;
    seldp_device mem;
    const size_t *send_bytes, *send_displs, *recv_bytes, *recv_displs; /* alltoallv */
    const size_t *counts; /* reduce_scatter, allgather_counts */
    void **vrecv;         /* allgatherv */
    size_t *vrecv_bytes;
    int color, key; /* split */
    /* written by the leader or the step */
    seldp_comm *child; /* split: this member's new communicator (NULL: no group) */
    void *vblock;      /* allgatherv: the block this member allocated */
    seldp_status st;   /* this member's status in the last step */
    char why[512];     /* and its message */
    bool in;           /* arrived in the current round */
    uint64_t done_seq; /* the last step this member finished */
} hy_cell;

/* A step every member runs on its own cell (the leader too), between the leader's MPI
 * calls. Returns the member's status (its message in cell->why). */
typedef seldp_status (*hy_step_fn)(hy_group *g, int local, void *ctx);

/* The process's part of a world. */
typedef struct hy_world {
    pthread_mutex_t mu; /* the list of groups, the abort reason */
    int nprocs, proc;   /* the parent communicator's size and this process's rank in it */
    int size;           /* ranks of the world */
    int *first;         /* [nprocs + 1]: world rank of each process's local rank 0 */
    int n_local;
    double timeout_s;
    atomic_bool aborted;
    seldp_status abort_status;
    char abort_reason[512];
    seldp_comm *mpi;  /* the processes' seldp MPI world (nprocs > 1): abort notices only */
    MPI_Comm data;    /* a duplicate of the parent: every group's messages between leaders,
                         each group on its own tag (hybrid_move.c) */
    hy_group *groups; /* every live group of this process */
    hy_group *root;   /* the world's group */
    int joined;       /* local ranks that joined */
    bool destroyed;
} hy_world;

struct seldp_hybrid_world {
    hy_world *w;
};

struct hy_group {
    hy_world *w;
    hy_group *next;     /* in w->groups */
    int size;           /* group ranks */
    int n_procs;        /* processes with members */
    int my_proc;        /* this process's index among them */
    int n_local;        /* members in this process */
    int *world_ranks;   /* [size] group rank -> world rank */
    int *proc_of;       /* [size] group rank -> process index in the group */
    int *index_in_proc; /* [size] group rank -> member index in its process */
    int *proc_start;    /* [n_procs + 1] into members */
    int *members;       /* [size] the group ranks of every process in turn, ascending */
    int *local;         /* members + proc_start[my_proc]: this process's, local index order */
    int *proc_rank;     /* [n_procs] each process's rank in the parent (w->data) */
    int64_t id;         /* the same in every process of the group: parent, split and colour */
    int tag;            /* the group's messages on w->data, from the id */
    int64_t splits;     /* splits made from this group */
    hy_parked *parked;  /* operations given up on, with their buffers (hybrid_move.c) */
    int refs;           /* member handles alive, and the world's for its root group */

    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint64_t round; /* the collective in progress, or the next */
    int arrived, departed;
    bool leader_in;  /* the leader has arrived in this round */
    bool closed;     /* the leader closed the round: result and message are final */
    double progress; /* when the leader last moved on (seldp__proto_now) */
    uint64_t step_seq;
    int step_done;
    hy_step_fn step;
    /* the step's context, copied: a member late in a step that the leader gave up on (a
     * timeout, an abort) still reads valid memory */
    _Alignas(16) unsigned char step_ctx[64];
    seldp_status result;
    char message[1024];
    hy_cell *cells; /* [n_local] */

    /* staging, grown by the leader between steps; buf[3] the agreement's blob */
    void *buf[4];
    size_t cap[4];
    /* the leader's per-call tables, grown alike */
    size_t *tab[10];
    size_t tab_cap[10];
    /* summaries of the processes (agreement), and every rank's split color/key */
    seldp__call_header *sums; /* [n_procs] */
    int64_t *extra;           /* [size * 2 * size]: every group rank's extra values */
    int64_t *cell_ex;         /* [n_local * 2 * size]: the local members', at arrival */

    /* test hook (hybrid_fault.h): the member that stalls, where, how long */
    int stall_local, stall_where;
    double stall_s;
};

/* One rank's handle. */
typedef struct hy_member {
    hy_group *g;
    int local;
    uint64_t calls; /* collectives entered on this handle */
} hy_member;

static inline hy_member *seldp__hy_member(const seldp_comm *comm)
{
    return comm->impl;
}

/* ---- hybrid.c ----------------------------------------------------------------------- */

/* Abort the world in this process (local, never blocks on a collective): every group's
 * waits return, every group's MPI world is aborted (its notices reach the other
 * processes). The first reason wins. Never called holding a group's mutex. */
#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
void seldp__hy_world_abort(hy_world *w, seldp_status status, const char *fmt, ...);

/* The handle of a member of `g` (group rank `rank`, local index `local`). NULL when out of
 * memory. */
seldp_comm *seldp__hy_handle(hy_group *g, int rank, int local, seldp_device device);

/* A group of this process over `size` ranks: world_ranks and proc_of given (proc_of are
 * process indices 0..n_procs-1, ascending with the processes' parent ranks, proc_rank[q]
 * process q's rank in the parent), its id. refs start at the number of local members. NULL
 * when out of memory. */
hy_group *seldp__hy_group_new(hy_world *w, int size, const int *world_ranks, const int *proc_of,
                              int n_procs, int my_proc, const int *proc_rank, int64_t id);

/* Drop one reference; the last frees the group (and its MPI communicator). */
void seldp__hy_group_release(hy_group *g);

/* The ops table's abort and destroy. */
void seldp__hy_abort(seldp_comm *comm);
void seldp__hy_destroy(seldp_comm *comm);

/* ---- hybrid_sync.c ------------------------------------------------------------------ */

/* What a collective's leader does once every member arrived and agreed: the body, which
 * returns the round's status (its message in the leader's seldp_last_error). */
typedef seldp_status (*hy_body_fn)(hy_group *g, void *ctx);

/* What a member does after a successful round (may be NULL): copy its outputs out. */
typedef seldp_status (*hy_finish_fn)(hy_group *g, int local, void *ctx);

/* Run one collective from `comm`'s thread: `mine` is the caller's filled cell (its header
 * op and the fields the op reads). The leader agrees the calls (in the process, then
 * across processes with `extra` of `n_extra` int64 per member: alltoallv counts, split
 * colors), then runs body(g, ctx); every member then runs finish. */
seldp_status seldp__hy_collective(seldp_comm *comm, hy_cell *mine, hy_body_fn body,
                                  hy_finish_fn finish, void *ctx);

/* From the leader's body: every member (the leader too) runs fn(g, local, copy) where copy
 * is the group's copy of the `ctx_size` (at most 64) bytes at ctx; returns
 * the first member's failure (its message set on the leader's thread), SELDP_ERR_TIMEOUT
 * when a member did not finish in time (stalled inside), or the world's abort. */
seldp_status seldp__hy_step(hy_group *g, seldp__comm_op op, hy_step_fn fn, const void *ctx,
                            size_t ctx_size);

/* From the leader's body: a failure of an MPI call of the leaders' communicator: the world
 * is aborted (if the MPI transport has not already) and `st` returned with its message. */
seldp_status seldp__hy_mpi_failed(hy_group *g, seldp_status st);

/* Staging buffer `which` (0..3) of at least `bytes`, and table `which` (0..9) of at least
 * `n` entries; NULL when out of memory (SELDP_ERR_NOMEM recorded). Leader only. */
void *seldp__hy_buf(hy_group *g, int which, size_t bytes);
size_t *seldp__hy_tab(hy_group *g, int which, size_t n);

/* The extra int64 values of group rank r (after the agreement), n_extra of them. */
const int64_t *seldp__hy_extra(const hy_group *g, int r, int n_extra);

/* ---- hybrid_move.c ------------------------------------------------------------------ */

/* From the leader's body: to each other process q of the group, slen[q] bytes at
 * sbase + soff[q]; from each, rlen[q] bytes into rbase + roff[q] (this process's own entries
 * are not read). Both sides must agree on the lengths (the agreement has made sure). On a
 * timeout, an abort or an MPI failure the world is aborted, every staging buffer of the
 * group given up (parked) and the error returned. */
seldp_status seldp__hy_exchange(hy_group *g, seldp__comm_op op, const unsigned char *sbase,
                                const size_t *soff, const size_t *slen, unsigned char *rbase,
                                const size_t *roff, const size_t *rlen);

/* The same with copy_self: this process's own block is copied (memmove) as well. */
seldp_status seldp__hy_exchange_self(hy_group *g, seldp__comm_op op, const unsigned char *sbase,
                                     const size_t *soff, const size_t *slen, unsigned char *rbase,
                                     const size_t *roff, const size_t *rlen);

/* From the leader's body: every process's blob of any length to every other (the agreement's
 * summaries): on success *all (malloc'd) holds them in process order, lens[q] each one's.
 * A process that does not send in time has not arrived: SELDP_ERR_TIMEOUT naming it, the
 * world aborted. */
seldp_status seldp__hy_share(hy_group *g, seldp__comm_op op, const void *mine, size_t len,
                             void **all, size_t *lens);

/* Free the parked operations MPI has completed; `last`: the group goes, drop the rest. */
void seldp__hy_reap(hy_group *g, bool last);

/* ---- hybrid_collectives.c ------------------------------------------------------------ */

extern const seldp_comm_ops seldp__hy_ops;

seldp_status seldp__hy_barrier(seldp_comm *comm);
seldp_status seldp__hy_broadcast(seldp_comm *comm, void *buf, size_t bytes, int root,
                                 seldp_device mem);
seldp_status seldp__hy_allreduce(seldp_comm *comm, const void *send, void *recv, size_t count,
                                 seldp_dtype dtype, seldp_device mem);
seldp_status seldp__hy_allgather(seldp_comm *comm, const void *send, void *recv, size_t bytes,
                                 seldp_device mem);
seldp_status seldp__hy_allgatherv(seldp_comm *comm, const void *send, size_t send_bytes,
                                  void **recv, size_t *recv_bytes);
seldp_status seldp__hy_alltoallv(seldp_comm *comm, const void *send, const size_t *send_bytes,
                                 const size_t *send_displs, void *recv, const size_t *recv_bytes,
                                 const size_t *recv_displs, seldp_device mem, size_t send_extent,
                                 size_t recv_extent);
seldp_status seldp__hy_reduce_scatter(seldp_comm *comm, const void *send, void *recv,
                                      const size_t *recv_counts, seldp_dtype dtype,
                                      seldp_device mem);
seldp_status seldp__hy_allgather_counts(seldp_comm *comm, const void *send, void *recv,
                                        const size_t *counts, seldp_dtype dtype, seldp_device mem);
seldp_status seldp__hy_split(seldp_comm *comm, int color, int key, seldp_comm **out);

#endif
