/* The collective protocol every transport shares (internal).
 *
 * A collective of the host and MPI transports runs in the same steps: each rank announces
 * its call in a fixed-size header, every rank waits until every rank's header is in
 * (arrival, bounded by the timeout), every rank checks the same headers and reaches the
 * same verdict (agreement), and only then does data move. This file holds what does not
 * depend on how the headers travel: the header itself, the agreement check and its
 * messages, the messages of a timeout or an abort, and the clock, deadline and back-off
 * helpers of the waits. A transport file holds only what is different about its transport. */
#ifndef SELDP_PROTOCOL_H
#define SELDP_PROTOCOL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "comm/comm_impl.h"

/* What one rank announces for one collective. Plain 8-byte fields without padding, so that
 * the header travels as bytes (MPI_BYTE) between processes of one machine type. Fields a
 * call does not use are 0. */
typedef struct seldp__call_header {
    int64_t op;           /* seldp__comm_op */
    int64_t staged;       /* SELDP_OK, or why this rank could not prepare its buffers */
    int64_t seq;          /* the collectives this rank has entered on the communicator, this one
                             included; 0 where the transport does not count them */
    int64_t root;         /* broadcast */
    int64_t bytes;        /* broadcast, allgather: per rank; allgatherv: this rank's blob */
    int64_t count;        /* allreduce; fused reduction: the elements of every segment */
    int64_t dtype;        /* allreduce */
    int64_t color;        /* split */
    int64_t key;          /* split */
    int64_t n_segs;       /* fused reduction */
    int64_t bucket_elems; /* fused reduction */
    double scale;         /* fused reduction, fused reduce-scatter */
    int64_t counts;       /* reduce_scatter, allgather_counts: seldp__proto_counts_digest of the
                             per-rank counts, which must be the same array on every rank */
} seldp__call_header;

/* The headers of one collective as every rank of the group sees them, and the optional
 * checks of what does not fit a header (where the transport can see the other ranks'
 * arrays, as the host transport can; NULL skips a check). */
typedef struct seldp__proto_view {
    int size; /* ranks of the group */
    int rank; /* this rank's, in the group */
    /* The first of `size` headers, `stride` bytes apart: sizeof(seldp__call_header) for a
     * plain array, or the size of a struct that holds a header as its first member. */
    const seldp__call_header *headers;
    size_t stride;
    const void *ctx; /* passed to the callbacks */
    /* alltoallv: the byte counts rank r sends to, and expects from, each rank (size each) */
    const size_t *(*send_bytes)(const void *ctx, int r);
    const size_t *(*recv_bytes)(const void *ctx, int r);
    /* fused reduction: rank r's n_segs segments */
    const seldp__reduce_seg *(*segs)(const void *ctx, int r);
    /* fused reduce-scatter and all-gather: rank r's n_segs segments */
    const seldp__shard_seg *(*shard_segs)(const void *ctx, int r);
} seldp__proto_view;

/* A digest of n per-rank counts (64-bit FNV-1a of their values), for the header's `counts`. */
int64_t seldp__proto_counts_digest(const size_t *counts, int n);

/* Rank r's header in the view. */
const seldp__call_header *seldp__proto_header(const seldp__proto_view *v, int r);

/* Why the headers of a collective do not agree, or SELDP_OK. Every rank passes the same
 * headers, so every rank reaches the same verdict: a different call at the same point
 * (SELDP_ERR_DISAGREE), a rank that could not stage its buffers (that rank's status), then
 * the arguments that must match (root and size of a broadcast, count and dtype of an
 * allreduce, size of an allgather, the segments of a fused reduction, the counts of an
 * alltoallv where the callbacks are given). The message starts "rank <this rank>: <call>:". */
seldp_status seldp__proto_agree(const seldp__proto_view *v);

/* The error of an alltoallv whose rank `sender` sends `sends` bytes to rank `receiver`,
 * which expects `expects`, as seen by rank `rank`: SELDP_ERR_DISAGREE. */
seldp_status seldp__proto_alltoallv_mismatch(int rank, int sender, size_t sends, int receiver,
                                             size_t expects);

/* Append to buf the ranks r of a group of `size` (other than `self`) for which
 * missing(ctx, r) holds, as "3, 5": in world numbering (world_ranks[r]), or in group
 * numbering, with "(world rank N)" beside each one when the group is a split group. The
 * text is cut at bufsize. Returns how many ranks are missing, listed or not. */
int seldp__proto_missing_ranks(int size, int self, const int *world_ranks, bool split,
                               bool world_numbering, bool (*missing)(const void *ctx, int r),
                               const void *ctx, char *buf, size_t bufsize);

/* A wait of one collective that ran out of time. */
typedef struct seldp__proto_timeout {
    int rank;              /* this rank, in the group */
    int world_rank;        /* this rank, in the world */
    int size;              /* of the group */
    seldp__comm_op op;     /* the collective */
    double timeout_s;      /* the world's timeout */
    int missing;           /* ranks counted by seldp__proto_missing_ranks; 0 when unknown */
    const char *who;       /* them in group numbering ("" when unknown) */
    const char *world_who; /* them in world numbering ("" when unknown) */
} seldp__proto_timeout;

/* The ranks in t->who never arrived: writes the world's abort reason ("rank W timed out
 * after T s in <call> waiting for ranks ...") into reason and returns this rank's
 * SELDP_ERR_TIMEOUT ("rank R: <call> timed out after T s: ranks ... had not arrived
 * (M of N ranks missing)"). */
seldp_status seldp__proto_not_arrived(const seldp__proto_timeout *t, char *reason,
                                      size_t reason_size);

/* Every rank had arrived, and the ranks in t->who (unknown when t->missing is 0) were still
 * inside the collective at the timeout: writes the world's abort reason into reason and
 * returns this rank's SELDP_ERR_TIMEOUT, both saying they "stalled inside it". `waited`:
 * this rank keeps waiting for them to stop touching its buffers (the host transport), so
 * the message says so. */
seldp_status seldp__proto_stalled_inside(const seldp__proto_timeout *t, bool waited, char *reason,
                                         size_t reason_size);

/* Every rank had arrived, and the ranks in t->who (t->missing > 0) did not answer from
 * inside the collective at the timeout: stalled inside it, or done with their part and busy
 * elsewhere, which a transport that cannot see the others' progress cannot tell apart.
 * Writes the world's abort reason into reason and returns this rank's SELDP_ERR_TIMEOUT
 * ("rank R: <call> timed out after T s: ranks ... did not answer from inside it (stalled
 * inside it, or done with their part and busy elsewhere; every rank of the N had
 * arrived)"). */
seldp_status seldp__proto_silent_inside(const seldp__proto_timeout *t, char *reason,
                                        size_t reason_size);

/* The error of a collective of an aborted world: `status` (SELDP_ERR_ABORTED or
 * SELDP_ERR_TIMEOUT) with "rank R: <call> aborted: <reason>". */
seldp_status seldp__proto_aborted(int rank, seldp__comm_op op, seldp_status status,
                                  const char *reason);

/* ---- clocks, deadlines, waiting ----------------------------------------------------- */

/* Seconds on CLOCK_MONOTONIC. */
double seldp__proto_now(void);

/* CLOCK_MONOTONIC `seconds` from now, for pthread_cond_timedwait on a condition variable
 * whose clock is CLOCK_MONOTONIC; a huge or non-finite timeout is clamped to 1e9 s. */
struct timespec seldp__proto_deadline_after(double seconds);

/* Whether CLOCK_MONOTONIC has passed `deadline`. */
bool seldp__proto_past(const struct timespec *deadline);

/* A pause instruction in a spin loop (nothing where the CPU has none). */
void seldp__proto_cpu_relax(void);

/* Spin until done(arg) holds (true) or spin_ns nanoseconds have passed (false). */
bool seldp__proto_spin_until(bool (*done)(void *arg), void *arg, long spin_ns);

/* The same for a thread that shares its core: between looks it gives the core away
 * (sched_yield), so that the threads it waits for can run; false after yield_ns. */
bool seldp__proto_yield_until(bool (*done)(void *arg), void *arg, long yield_ns);

/* Polling without a core of one's own: the first polls spin, then each round sleeps a
 * little longer, up to a millisecond. */
typedef struct seldp__proto_backoff {
    int polls;
    double nap_s;
} seldp__proto_backoff;

#define SELDP__PROTO_BACKOFF_INIT                                                                  \
    {                                                                                              \
        0, 1e-6                                                                                    \
    }

/* Called after each unsuccessful poll. */
void seldp__proto_backoff_wait(seldp__proto_backoff *b);

#endif
