/* The MPI transport's private interface, shared by its files:
 *   mpi.c             worlds and groups: seldp_mpi_comm_init, destroy, the ops table, the
 *                     NCCL bootstrap over MPI;
 *   mpi_protocol.c    what every collective goes through: the header exchange (one
 *                     MPI_Iallgather) and agreement, the waits and their deadlines, the
 *                     abort notices, the census that names the ranks missing at a timeout,
 *                     the staging buffers and the parking of abandoned operations;
 *   mpi_collectives.c the bodies: barrier, broadcast, allreduce, allgather(v), alltoallv,
 *                     split;
 *   mpi_shard.c       the bodies of reduce_scatter and allgather_counts.
 *
 * Ownership: every buffer and request array that a non-blocking MPI call gets is the
 * library's (a group's staging buffers), never the caller's. Data is copied in before an
 * operation is posted and copied out only after it completed and succeeded. When a wait
 * gives up (timeout, abort, MPI error), the operation's requests and every staging buffer
 * of the group are parked on the world (MPI may still use them: a non-blocking collective
 * cannot be cancelled), the group gets fresh ones at its next call, and the parked entries
 * are reaped (MPI_Test) at later calls and at destroy; what is still pending when its world
 * goes away moves to a list of the process, reaped by later worlds. */
#ifndef SELDP_MPI_IMPL_H
#define SELDP_MPI_IMPL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include <mpi.h>

#include "comm/comm_impl.h"
#include "comm/protocol.h"

/* Upper bound of one MPI message: far inside MPI's int counts. */
#define SELDP__MPI_MAX_MESSAGE ((size_t)1 << 30)

/* Tags: on a world's ctrl communicator (notices, census) and on a group's (alltoallv). */
enum { TAG_ABORT = 1, TAG_CENSUS = 2, TAG_ALLTOALLV = 3, TAG_CENSUS_REPLY = 4 };

/* Where a rank's thread is inside a collective: what it answers a census with. */
typedef enum mpi_phase { PHASE_NONE = 0, PHASE_ARRIVE = 1, PHASE_BODY = 2 } mpi_phase;

/* An abort notice: the status the other ranks return and the reason they print. */
typedef struct mpi_notice {
    int64_t world; /* the world's id (see mpi_world.id) */
    int32_t status;
    int32_t from; /* world rank */
    char reason[496];
} mpi_notice;

/* A census question ("where are you?") and its answer, on the ctrl communicator. */
typedef struct mpi_census {
    int64_t world; /* the world's id */
    int64_t token; /* the asker's, echoed in the answer */
    int64_t asker; /* world rank */
    int64_t group; /* group id */
    int64_t seq;   /* the collective's number on the group */
    int64_t phase; /* mpi_phase */
} mpi_census;

/* The staging buffers of a group, grown on demand and parked whole when abandoned. */
enum {
    BUF_HEADER,
    BUF_HEADERS,
    BUF_SEND,
    BUF_RECV,
    BUF_WORK,
    BUF_INTS,
    BUF_REQS,
    BUF_PACK, /* reduce_scatter: a round's slices side by side */
    BUF_COUNT
};

/* An abandoned operation: requests MPI may still complete and the memory they use. */
typedef struct mpi_parked {
    struct mpi_parked *next;
    int n_reqs;
    MPI_Request *reqs;
    int n_mem;
    void *mem[BUF_COUNT + 2]; /* freed with seldp__pinned_free once every request completed:
                                 a group's staging buffers and two more (seldp__mpi_park) */
} mpi_parked;

typedef struct mpi_world {
    MPI_Comm ctrl; /* abort notices and census only */
    /* Larger than the id of every world this process joined before, the same on every rank:
     * a message of an old world still in flight when its ctrl communicator was freed can
     * reach a new ctrl communicator that MPI gave the same context, and is dropped. */
    int64_t id;
    int rank, size;
    double timeout_s;
    size_t max_message;
    int refs; /* communicators of this world alive */

    MPI_Request notice_recv;
    mpi_notice incoming;
    MPI_Request census_recv; /* questions from ranks that timed out */
    mpi_census census_in;
    /* what this rank is waiting in now (PHASE_NONE outside a wait) */
    int64_t wait_group, wait_seq, wait_phase;
    int64_t census_tokens;
    mpi_parked *parked;
    /* Held by the thread inside a call of this world (and by seldp_comm_abort while it
     * sends notices); everything below it and every MPI call on the world's
     * communicators is under it. */
    pthread_mutex_t lock;
    pthread_t owner;         /* the thread that joined: may call MPI under any thread level */
    int thread_level;        /* MPI_Query_thread at the join */
    atomic_bool abort_asked; /* seldp_comm_abort from a thread that could not send */
    bool aborted;
    seldp_status abort_status;
    char abort_reason[sizeof(((mpi_notice *)0)->reason)];
} mpi_world;

typedef struct mpi_group {
    mpi_world *world;
    MPI_Comm comm;
    int64_t id;       /* the same on every rank of the group, unique in the world */
    int *world_ranks; /* group rank -> world rank */
    int64_t seq;      /* collectives entered on this group */
    int64_t splits;   /* splits made from this group (ids of the children) */
    /* the communicator's device: staging is page-locked only for a GPU */
    seldp_device device;
    void *buf[BUF_COUNT];
    size_t cap[BUF_COUNT];
    const seldp__call_header *headers; /* the current collective's, once exchanged */
    /* This rank's last collective on the group ended with nothing pending and nothing
     * was posted since: the late-arrival drain may post the next header (see
     * seldp__mpi_call_begin). */
    bool clean;
    /* test hook (mpi_fault.h): stall at `stall_phase` of the next collective */
    int stall_phase;
    double stall_s;
} mpi_group;

static inline mpi_group *seldp__mpi_group(const seldp_comm *comm)
{
    return comm->impl;
}

/* ---- mpi_protocol.c ----------------------------------------------------------------- */

/* A staging buffer `which` of at least `bytes` (grow-only, library memory). NULL when out
 * of memory, with the error recorded. */
void *seldp__mpi_buf(mpi_group *g, int which, size_t bytes);

/* The start of every collective: reap parked operations, exchange headers with every rank
 * of the group (one MPI_Iallgather on library memory) and check their agreement. On
 * success g->headers holds every rank's header. Nothing of the body has started when this
 * fails. `mine` is completed with the sequence number. */
seldp_status seldp__mpi_call_begin(seldp_comm *comm, seldp__call_header *mine);

/* After the headers of a split: every rank learns whether any rank knows the world is
 * aborted (one MPI_Iallreduce, waited for through aborts, bounded by the timeout), so that
 * every rank enters the blocking MPI_Comm_split or none does. */
seldp_status seldp__mpi_confirm(seldp_comm *comm, seldp__comm_op op);

/* Wait for g's requests [0, n) (in the BUF_REQS buffer) of a body until they complete, the
 * world aborts, or `deadline` (seldp__proto_now) passes. Every rank had arrived, so a
 * timeout names the ranks that stalled inside. On failure the world is aborted and the
 * group's operation parked. */
seldp_status seldp__mpi_body_wait(seldp_comm *comm, seldp__comm_op op, int n, double deadline);

/* The deadline of a body that starts now. */
double seldp__mpi_body_deadline(const seldp_comm *comm);

/* Park the group's pending requests [0, n) and every staging buffer of the group, with up
 * to two more blocks of library memory (NULL: none) that MPI may still use. */
void seldp__mpi_park(mpi_group *g, int n, void *extra1, void *extra2);

/* Park requests that belong to no world (a join that timed out): reqs lies inside one of
 * the memory blocks (malloc or seldp__pinned_alloc), freed once every request completed. */
void seldp__mpi_park_orphan(MPI_Request *reqs, int n, void *const *mem, int n_mem);

/* An MPI call failed inside a body (after arrival): abort the world so that the others
 * return too, park the group's first n requests, and return SELDP_ERR_TRANSPORT. */
seldp_status seldp__mpi_call_failed(seldp_comm *comm, seldp__comm_op op, const char *call, int err,
                                    int n);

/* A local failure inside a body (after arrival) where the others may be waiting: abort
 * the world with its message. `st` and its message are kept. */
seldp_status seldp__mpi_fail_alone(seldp_comm *comm, seldp__comm_op op, seldp_status st);

/* Mark the world aborted (the first reason wins) and send the notice to every process. */
#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
void seldp__mpi_world_abort(mpi_world *w, seldp_status status, const char *fmt, ...);

/* True once the world is aborted, here or by a notice; answers pending census questions. */
bool seldp__mpi_world_poll(mpi_world *w);

/* Test every parked operation and free those that completed (under the world's lock). */
void seldp__mpi_reap(mpi_world *w);

/* The world goes away: reap, and move what is still pending to the process's list. */
void seldp__mpi_unpark_world(mpi_world *w);

/* The test hook's stall, when armed for `phase` of this collective. */
void seldp__mpi_stall_point(mpi_group *g, int phase);

/* MPI's text for an error code. */
void seldp__mpi_error_text(int err, char *text, size_t size);

/* ---- mpi_collectives.c, under the world's lock ---------------------------------------- */

/* SELDP_ERR_NOMEM naming the collective and the bytes. */
seldp_status seldp__mpi_out_of_memory(const seldp_comm *comm, seldp__comm_op op, size_t bytes);

/* Stage `bytes` of `src` on `mem` into the group's buffer `which` (filled when src is not
 * NULL): the status a header announces. */
seldp_status seldp__mpi_stage_in(const seldp_comm *comm, seldp__comm_op op, int which,
                                 const void *src, size_t bytes, seldp_device mem, void **out);

/* The body of the gathers: rank r's lens[r] bytes (this rank's at `mine`) go to
 * dst + offsets[r] on every rank; mine and dst are staging buffers (see mpi_collectives.c). */
seldp_status seldp__mpi_gather_body(seldp_comm *comm, seldp__comm_op op, const void *mine,
                                    const size_t *lens, char *dst, const size_t *offsets);

seldp_status seldp__mpi_barrier(seldp_comm *comm);
seldp_status seldp__mpi_broadcast(seldp_comm *comm, void *buf, size_t bytes, int root,
                                  seldp_device mem);
seldp_status seldp__mpi_allreduce(seldp_comm *comm, const void *send, void *recv, size_t count,
                                  seldp_dtype dtype, seldp_device mem);
seldp_status seldp__mpi_allgather(seldp_comm *comm, const void *send, void *recv, size_t bytes,
                                  seldp_device mem);
seldp_status seldp__mpi_allgatherv(seldp_comm *comm, const void *send, size_t send_bytes,
                                   void **recv, size_t *recv_bytes);
seldp_status seldp__mpi_alltoallv(seldp_comm *comm, const void *send, const size_t *send_bytes,
                                  const size_t *send_displs, void *recv, const size_t *recv_bytes,
                                  const size_t *recv_displs, seldp_device mem);
seldp_status seldp__mpi_split(seldp_comm *comm, int color, int key, seldp_comm **out);

/* ---- mpi_shard.c, under the world's lock ---------------------------------------------- */

seldp_status seldp__mpi_reduce_scatter(seldp_comm *comm, const void *send, void *recv,
                                       const size_t *recv_counts, seldp_dtype dtype,
                                       seldp_device mem);
seldp_status seldp__mpi_allgather_counts(seldp_comm *comm, const void *send, void *recv,
                                         const size_t *counts, seldp_dtype dtype, seldp_device mem);

/* ---- mpi.c -------------------------------------------------------------------------- */

/* A group over `mc` (taken over, freed with the group) of world `w`, with id `id`. */
seldp_status seldp__mpi_group_new(mpi_world *w, MPI_Comm mc, int64_t id, int world_rank,
                                  seldp_device device, seldp_comm **out);

#endif
