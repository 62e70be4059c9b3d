/** @file
 * The hybrid transport: one world over several MPI processes, each hosting several rank
 * threads (processes x threads, as "one process per node, a pthread per GPU").
 *
 * One thread of every process (the main thread, say) creates the process's part of the
 * world with seldp_hybrid_world_create, collective over an MPI communicator; then each of
 * the process's rank threads joins with seldp_hybrid_comm_init, collective over the whole
 * world. World ranks are numbered process by process: the threads of the communicator's
 * process 0 are world ranks 0 .. n0-1, those of process 1 follow, and so on. The result is
 * a seldp communicator like any other: every call of comm.h, the same split, the sessions
 * of session.h and shard.h on top (through their bucketed and staged paths).
 *
 * How a collective runs (docs/library.md, The hybrid transport):
 * - Inside a process the group's ranks meet in shared memory; the member with the smallest
 *   group rank is the process's leader. Each rank copies its own input into the process's
 *   staging memory and its own output out of it: no thread touches another rank's buffers,
 *   so once a call returned on a rank (any status), nothing reads or writes its buffers.
 * - Between processes only the leaders talk: non-blocking point-to-point MPI on one duplicate
 *   of `parent`, each group under its own tag, polled against the timeout; abort notices on
 *   a seldp MPI world of the processes (seldp/mpi.h). A group whose ranks are all in one
 *   process never uses MPI. No MPI communicator is made per group.
 * - Agreement: every rank's call is first checked against the others of its process, then
 *   the leaders exchange one summary per process (the call, its sizes, root, dtype, every
 *   rank's alltoallv counts, split colors and keys, and whether the process's ranks
 *   agreed), so that every rank of every process reaches the same verdict before data
 *   moves (SELDP_ERR_DISAGREE, the world stays usable). SELDP_DEBUG_COLLECTIVES works as on
 *   every transport.
 * - Sums keep the threads' order: allreduce and reduce-scatter send every rank's
 *   contribution of an element to the process that owns the element, which sums them in
 *   world order 0, 1, ..., P-1 as the host transport does. Results are bit-identical on
 *   every rank and equal, bit for bit, to the same world run on threads of one process (or
 *   on the MPI transport). The cost: between processes an allreduce moves every rank's
 *   contribution (N x count elements out of a process of N ranks) instead of one partial
 *   sum per process.
 * - A process that dies is noticed through the timeouts (under Open MPI, mpirun
 *   --enable-recovery keeps the others running so that they can report it).
 * - Timeouts: every wait is bounded by cfg->timeout_s. A rank that does not arrive, a
 *   thread that stalls inside a collective, a process that stops answering, make every
 *   rank of every process return SELDP_ERR_TIMEOUT (the ranks that noticed it) or
 *   SELDP_ERR_ABORTED / SELDP_ERR_TIMEOUT with the first reason (the others, through the
 *   world's abort); a rank waiting for its process's leader gives up when the leader made
 *   no progress for timeout_s + 2 s. seldp_comm_abort aborts the world on both levels.
 *
 * Requires MPI initialized with MPI_THREAD_MULTIPLE: the leaders of different groups of one
 * process are different threads, and may be inside MPI at the same time. */
#ifndef SELDP_HYBRID_H
#define SELDP_HYBRID_H

#include <mpi.h>

#include "seldp/export.h"
#include "seldp/comm.h"

#ifdef __cplusplus
extern "C" {
#endif

/** One process's part of a hybrid world (opaque). */
typedef struct seldp_hybrid_world seldp_hybrid_world;

/** Collective over `parent` (one thread of every process): create this process's part of a
 * world whose processes are the ranks of `parent`, this one hosting `local_ranks` >= 1 rank
 * threads (processes may host different numbers). cfg may be NULL for the defaults.
 * `parent` is duplicated and never changed. On success *out is the caller's, released with
 * seldp_hybrid_world_destroy once every communicator of the world is destroyed. Errors:
 * SELDP_ERR_INVALID_ARGUMENT (MPI not initialized, not at MPI_THREAD_MULTIPLE, a bad
 * argument), SELDP_ERR_TIMEOUT (a process did not arrive in time), SELDP_ERR_TRANSPORT (MPI
 * failed), SELDP_ERR_NOMEM; *out is then NULL. */
SELDP_API seldp_status seldp_hybrid_world_create(MPI_Comm parent, int local_ranks,
                                                 const seldp_comm_config *cfg,
                                                 seldp_hybrid_world **out);

/** Ranks in the world, over every process (local). */
SELDP_API int seldp_hybrid_world_size(const seldp_hybrid_world *world);

/** World rank of this process's local rank 0 (local): local rank t is world rank
 * first + t. */
SELDP_API int seldp_hybrid_world_first_rank(const seldp_hybrid_world *world);

/** Rank threads this process hosts (local). */
SELDP_API int seldp_hybrid_world_local_ranks(const seldp_hybrid_world *world);

/** The process (rank in `parent`) hosting world rank `rank`; -1 outside the world (local). */
SELDP_API int seldp_hybrid_world_process_of(const seldp_hybrid_world *world, int rank);

/** Join the world as this process's local rank `local_rank` (0 <= local_rank < local_ranks)
 * computing on `device`: collective over every rank of every process (it ends with a
 * barrier of the world, bounded by the timeout). Each local rank joins once, from its own
 * thread, which then makes every collective of the returned communicator and of the
 * communicators split from it. On success *out is the caller's to destroy (before
 * seldp_hybrid_world_destroy); on error *out is NULL and the world is aborted. */
SELDP_API seldp_status seldp_hybrid_comm_init(seldp_hybrid_world *world, int local_rank,
                                              seldp_device device, seldp_comm **out);

/** Release this process's part of the world once every communicator of it is destroyed
 * (local). NULL is a no-op. */
SELDP_API void seldp_hybrid_world_destroy(seldp_hybrid_world *world);

#ifdef __cplusplus
}
#endif
#endif
