/** @file
 * The MPI transport: one process per rank, launched by mpirun.
 *
 * Each process initializes MPI itself (MPI_Init or MPI_Init_thread), then joins with
 * seldp_mpi_comm_init over a communicator such as MPI_COMM_WORLD. The result is a seldp
 * communicator like any other: the seldp_comm_* calls of comm.h, with the semantics,
 * errors and messages of the host-staged transport.
 *
 * How it behaves:
 * - Every collective first exchanges a small fixed-size header among the ranks of the group
 *   (one MPI_Iallgather: the call, its sizes, root and dtype, split color and key). When the
 *   calls disagree, or a rank could not stage its buffers, every rank returns the same error
 *   (SELDP_ERR_DISAGREE, or that rank's status) and the world stays usable. A barrier is
 *   that exchange alone.
 * - Every wait is non-blocking MPI polled with MPI_Test against a deadline of
 *   cfg->timeout_s: once for every rank to arrive, once for the data to move. At a timeout
 *   the rank asks the other ranks of the group where they are (over a private duplicate of
 *   the parent); the message names the ranks that had not arrived, or, once every rank had
 *   arrived, those that did not answer from inside the operation (stalled inside it, or
 *   done with their part and busy elsewhere: MPI does not show which).
 *   This takes up to a further min(max(cfg->timeout_s, 0.3 s), 1 s). The communicators use
 *   MPI_ERRORS_RETURN: an MPI failure returns SELDP_ERR_TRANSPORT.
 * - A rank that times out or fails while moving data aborts the world: an out-of-band
 *   notice on a private duplicate of the parent communicator reaches every process, whose
 *   pending and later calls on any communicator of the world return SELDP_ERR_TIMEOUT
 *   (after a timeout) or SELDP_ERR_ABORTED with the first rank's reason.
 *   seldp_comm_abort sends the same notice; MPI_Abort is never called.
 * - Allreduce is deterministic: a reduce-scatter (each rank owns one slice), a sum in
 *   rank order 0, 1, ..., n-1 in the dtype's own arithmetic, then an allgather of the
 *   slices. Every rank receives bit-identical results, the same from run to run and
 *   the same as the host transport's, whatever algorithm MPI picks.
 * - Messages are cut into pieces of at most 1 GiB, so buffers beyond MPI's int counts
 *   work. The environment variable SELDP_MPI_MAX_MESSAGE (bytes) lowers that bound; the
 *   smallest value over the ranks is used.
 * - Buffers: MPI never sees the caller's memory. Inputs are copied into library buffers
 *   before anything is posted, outputs copied out only after every operation of the call
 *   completed and succeeded (device buffers are staged the same way, through pinned host
 *   memory). What the caller may rely on: once a call returned, with any status, nothing
 *   reads or writes its buffers any more, on this rank or another, so they may be reused
 *   or freed at once; after an error the outputs are as they were before the call (an
 *   alltoallv, an allgather, an allreduce, a broadcast's non-root buffers; an allgatherv's
 *   *recv and recv_bytes), unless the error is the final copy into a device buffer
 *   itself. An operation given up at a timeout or an abort cannot be cancelled in MPI: it
 *   stays pending inside MPI with its library buffers, which are freed when a later call,
 *   seldp_comm_destroy or a later world finds it completed; a rank that arrives late at a
 *   collective still posts the header the others were waiting for, so that their
 *   abandoned exchange completes. Until then each abandoned operation holds about the size
 *   of its call's data.
 * - Each world has an id larger than those of the worlds this process joined before: a
 *   notice of an old, destroyed world that MPI still delivers is dropped. A new world of
 *   the same parent can be created while operations of an aborted one are pending.
 * - MPI has no non-blocking split: seldp_comm_split calls MPI_Comm_split once the headers
 *   show that every rank has arrived and one more exchange (an MPI_Iallreduce) shows that
 *   no rank knows of an abort, so every rank enters it or none does. A rank descheduled for
 *   longer than the timeout between those two exchanges can still leave the others inside
 *   MPI_Comm_split.
 * - Open MPI before 5.0 raises the errors of non-blocking collectives on MPI_COMM_WORLD,
 *   whose default handler aborts the job: set MPI_ERRORS_RETURN on MPI_COMM_WORLD after
 *   MPI_Init to get SELDP_ERR_TRANSPORT instead. seldp never changes the caller's
 *   communicators.
 *
 * Threads: call a world's communicators from one thread at a time (MPI_THREAD_FUNNELED
 * or MPI_THREAD_SERIALIZED is enough). seldp_comm_abort is the exception: any thread may
 * call it at any time. From the thread that joined the world (or any thread under
 * MPI_THREAD_MULTIPLE), while no call of the world runs, it sends the notices itself;
 * otherwise it records the abort, and the thread inside a call of the world sends the
 * notices at its next poll (within a millisecond), or, when none is running, the next call
 * of the world or seldp_comm_destroy does. */
#ifndef SELDP_MPI_H
#define SELDP_MPI_H

#include <mpi.h>

#include "seldp/export.h"
#include "seldp/comm.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Collective over `parent` (for example MPI_COMM_WORLD): join a new seldp world whose ranks
 * are parent's, this process computing on `device`. parent is duplicated, never used or
 * changed afterwards, and may be freed by the caller. cfg may be NULL for the defaults.
 * On success *out is the caller's to release with seldp_comm_destroy (after every
 * communicator split from it), before MPI_Finalize. Returns SELDP_ERR_INVALID_ARGUMENT
 * when MPI is not initialized or an argument is invalid, SELDP_ERR_TIMEOUT when a rank of
 * parent does not join in time, SELDP_ERR_TRANSPORT when MPI fails; *out is then NULL. */
SELDP_API seldp_status seldp_mpi_comm_init(MPI_Comm parent, seldp_device device,
                                           const seldp_comm_config *cfg, seldp_comm **out);

/** NCCL bootstrapped over MPI, the multi-node recipe: collective over `parent`. Rank 0 of
 * parent draws an ncclUniqueId, MPI broadcasts it, and every process joins the NCCL world
 * as its parent rank on its current CUDA device (select it with cudaSetDevice first, one
 * GPU per process on each node: for instance the rank within MPI_Comm_split_type's
 * MPI_COMM_TYPE_SHARED group). The result is an NCCL communicator (seldp/nccl.h):
 * collectives, splits and timeouts are NCCL's, MPI is not used after this call. parent is
 * duplicated for the broadcast and never changed. cfg may be NULL for the defaults. On
 * success *out is the caller's to release with seldp_comm_destroy. Returns
 * SELDP_ERR_UNSUPPORTED in a build without NCCL (every rank, nothing is exchanged),
 * SELDP_ERR_INVALID_ARGUMENT when MPI is not initialized or an argument is invalid,
 * SELDP_ERR_TIMEOUT when a rank does not arrive in time, SELDP_ERR_TRANSPORT when MPI, CUDA
 * or NCCL fails (on every rank when rank 0 cannot draw the id); *out is then NULL. */
SELDP_API seldp_status seldp_mpi_nccl_comm_init(MPI_Comm parent, const seldp_comm_config *cfg,
                                                seldp_comm **out);

#ifdef __cplusplus
}
#endif
#endif
