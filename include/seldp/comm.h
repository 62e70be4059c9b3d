/** @file
 * Communicators: one interface over every transport (host-staged, NCCL, MPI).
 *
 * A communicator is one rank's handle on a group. Every call below is collective
 * over the group unless marked local: every rank of the group must make it, in the
 * same order. Every blocking wait has a timeout; when a rank aborts or fails to
 * arrive in time, the others return SELDP_ERR_ABORTED or SELDP_ERR_TIMEOUT instead
 * of hanging, and the world (every communicator split from it) stays aborted.
 *
 * The timeout bounds arrival. On the host transport a rank that has arrived may be reading
 * or writing the others' buffers, so it is waited for however late it is: at the timeout
 * the waiting ranks abort the world, the late rank stops at its next chunk of work (a few
 * hundred KiB), and every rank returns SELDP_ERR_TIMEOUT naming the ranks that stalled
 * inside, or those that never arrived. Once a call has returned on a rank (success or
 * error), no other rank reads or writes that rank's buffers. (MPI: see seldp/mpi.h.)
 *
 * Buffers are on the device named by the `mem` argument: the host, or the CUDA
 * device of the rank. Transports stage what they cannot address directly.
 *
 * Debug mode: with the environment variable SELDP_DEBUG_COLLECTIVES=1 when a communicator
 * is created (the same on every rank), each of its collectives first agrees on a
 * fingerprint of the call (collective, count, dtype, root, and the call's sequence number
 * on the communicator), like TORCH_DISTRIBUTED_DEBUG=DETAIL; a mismatch is
 * SELDP_ERR_DISAGREE on every rank, naming both calls, before any data moves. It costs one
 * small allgather per call and is off by default. */
#ifndef SELDP_COMM_H
#define SELDP_COMM_H

#include <stddef.h>
#include <stdint.h>

#include "seldp/export.h"
#include "seldp/dtype.h"
#include "seldp/status.h"
#include "seldp/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/** One rank's handle on a group, over any transport (opaque). */
typedef struct seldp_comm seldp_comm;

/** Passed as `color` to seldp_comm_split by a rank that joins no group. */
#define SELDP_COMM_NO_GROUP (-1)

/** Settings shared by the transports; grows at the end. */
typedef struct seldp_comm_config {
    size_t struct_size; /**< sizeof(seldp_comm_config) as the caller's header declared it: set by
                           SELDP_COMM_CONFIG_INIT, which every config must start from (the struct
                           grows at the end) */
    double timeout_s;   /**< every blocking wait gives up after this many seconds */
} seldp_comm_config;

/** Initializer of seldp_comm_config with the defaults (a 300 s timeout). */
#define SELDP_COMM_CONFIG_INIT                                                                     \
    {                                                                                              \
        sizeof(seldp_comm_config), 300.0                                                           \
    }

/** Rank of the caller within the group (local). */
SELDP_API int seldp_comm_rank(const seldp_comm *comm);

/** Number of ranks in the group (local). */
SELDP_API int seldp_comm_size(const seldp_comm *comm);

/** Rank of the caller in the world this group was split from (local). */
SELDP_API int seldp_comm_world_rank(const seldp_comm *comm);

/** The device this rank computes on (local): where sessions place their buckets. */
SELDP_API seldp_device seldp_comm_device(const seldp_comm *comm);

/** Transport name: "host", "nccl" or "mpi" (local). */
SELDP_API const char *seldp_comm_transport(const seldp_comm *comm);

/** Wait until every rank of the group has arrived. */
SELDP_API seldp_status seldp_comm_barrier(seldp_comm *comm);

/** Broadcast `count` elements of `dtype` from group rank `root` into every rank's `buf`.
 * Any dtype; bytes are copied exactly. */
SELDP_API seldp_status seldp_comm_broadcast(seldp_comm *comm, void *buf, size_t count,
                                            seldp_dtype dtype, int root, seldp_device mem);

/** Element-wise SUM of `count` elements over the group into every rank's `recv`
 * (`send` == `recv` reduces in place). dtype F32, F64, I64 or U64 on every transport.
 * Every rank receives bit-identical results (a fixed summation order). */
SELDP_API seldp_status seldp_comm_allreduce(seldp_comm *comm, const void *send, void *recv,
                                            size_t count, seldp_dtype dtype, seldp_device mem);

/** Gather `bytes` from every rank into `recv`, rank r's at offset r * bytes. */
SELDP_API seldp_status seldp_comm_allgather(seldp_comm *comm, const void *send, void *recv,
                                            size_t bytes, seldp_device mem);

/** Gather a host blob of any length from every rank. On success *recv is one malloc'd
 * block (the caller frees it with free()) holding every rank's blob back to back in rank
 * order, and recv_bytes[r] (an array of group-size entries, supplied by the caller) the
 * length of rank r's. */
SELDP_API seldp_status seldp_comm_allgatherv(seldp_comm *comm, const void *send, size_t send_bytes,
                                             void **recv, size_t *recv_bytes);

/** Reduce-scatter, as MPI_Reduce_scatter: the element-wise SUM over the group of every rank's
 * `send` (the sum of recv_counts elements: block 0, then block 1, ...), of which group rank r
 * receives block r, recv_counts[r] elements, in its `recv`. `recv_counts` has one entry per
 * group rank and must be the same array on every rank. dtype F32. Every rank reads only its
 * own block of the other ranks' inputs; each element is summed in rank order 0..P-1, as
 * seldp_comm_allreduce sums it, so block r equals, bit for bit, the same elements of an
 * allreduce of the same inputs (host-staged and MPI transports; NCCL sums in its own order).
 * `recv` may be `send` + the offset of the rank's block (in place). */
SELDP_API seldp_status seldp_comm_reduce_scatter(seldp_comm *comm, const void *send, void *recv,
                                                 const size_t *recv_counts, seldp_dtype dtype,
                                                 seldp_device mem);

/** All-gather of uneven blocks, as MPI_Allgatherv: group rank r sends counts[r] elements of
 * `dtype` from `send`, and every rank receives every block in `recv`, rank r's at element
 * counts[0] + ... + counts[r-1]. `counts` has one entry per group rank and must be the same
 * array on every rank. Any dtype; bytes are copied exactly. `send` may lie at the rank's own
 * offset in `recv` (in place). */
SELDP_API seldp_status seldp_comm_allgather_counts(seldp_comm *comm, const void *send, void *recv,
                                                   const size_t *counts, seldp_dtype dtype,
                                                   seldp_device mem);

/** Personalized all-to-all. Counts and displacements are in elements of `dtype`, one per
 * group rank: rank r sends send_counts[p] elements from send + send_displs[p] to rank p,
 * which receives them at recv + recv_displs[r] with recv_counts[r] == that count. */
SELDP_API seldp_status seldp_comm_alltoallv(seldp_comm *comm, const void *send,
                                            const size_t *send_counts, const size_t *send_displs,
                                            void *recv, const size_t *recv_counts,
                                            const size_t *recv_displs, seldp_dtype dtype,
                                            seldp_device mem);

/** Split the group as MPI_Comm_split does: ranks with the same `color` form a new group,
 * ordered by `key`, ties keeping their parent order. A rank passing SELDP_COMM_NO_GROUP
 * gets *out == NULL. The new communicator is the caller's to destroy. Splits nest. */
SELDP_API seldp_status seldp_comm_split(seldp_comm *comm, int color, int key, seldp_comm **out);

/** Counts of the collectives this rank's handle has issued (local), for tests and
 * benchmarks. Split communicators count separately. */
typedef struct seldp_comm_stats {
    uint64_t barriers;        /**< seldp_comm_barrier calls */
    uint64_t broadcasts;      /**< seldp_comm_broadcast calls */
    uint64_t allreduces;      /**< seldp_comm_allreduce calls */
    uint64_t allgathers;      /**< fixed-size and variable-length */
    uint64_t alltoallvs;      /**< seldp_comm_alltoallv calls */
    uint64_t splits;          /**< seldp_comm_split calls */
    uint64_t bytes;           /**< payload bytes this rank passed in (send side) */
    uint64_t reductions;      /**< fused reductions: a session reduction over many tensors in
                                   one rendezvous (host-staged transport), counted here and
                                   not as allreduces; also the fused reduce-scatters and
                                   all-gathers of sharded sessions (seldp/shard.h) */
    uint64_t reduce_scatters; /**< seldp_comm_reduce_scatter calls (seldp_comm_allgather_counts
                                   counts among allgathers) */
} seldp_comm_stats;

/** Read the counters (local). */
SELDP_API seldp_comm_stats seldp_comm_get_stats(const seldp_comm *comm);

/** Abort the world (local, never blocks): every pending and later collective of any
 * communicator of this world returns SELDP_ERR_ABORTED on every rank.
 *
 * Thread-safe, like ncclCommAbort: a watchdog thread may call it while another thread of
 * the process is inside a collective of any communicator of this world, at any phase
 * (waiting for the others to arrive, moving data, waiting for the others to finish). That
 * collective returns SELDP_ERR_ABORTED soon after, never leaving another rank reading or
 * writing the caller's buffers (host transport: a rank moving data stops at its next
 * chunk, and the others wait for it). The handle must stay alive until the call returns:
 * destroy it only after the watchdog is done with it. On the MPI transport, a thread that
 * may not call MPI (any thread but the one that joined, below MPI_THREAD_MULTIPLE) only
 * records the abort; the notice to the other processes then goes from the collective
 * running, or the next call of the world, or seldp_comm_destroy (seldp/mpi.h). */
SELDP_API void seldp_comm_abort(seldp_comm *comm);

/** Release the caller's handle (local). Destroy split communicators before the world's.
 * NULL is a no-op. */
SELDP_API void seldp_comm_destroy(seldp_comm *comm);

#ifdef __cplusplus
}
#endif
#endif
