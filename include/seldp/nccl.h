/** @file
 * The NCCL transport: one rank per GPU, real NCCL collectives.
 *
 * In one process, the main thread creates a world (it holds one ncclUniqueId); each rank
 * thread then selects its GPU with cudaSetDevice and joins with seldp_nccl_comm_init
 * (collective over the world, like ncclCommInitRank). Across processes, one rank draws an
 * id with seldp_nccl_get_unique_id, the caller distributes its 128 bytes (over MPI, for
 * instance) and every rank joins with seldp_nccl_comm_init_with_id.
 *
 * Communicators are non-blocking NCCL communicators driven on one CUDA stream per rank;
 * every wait polls the stream and ncclCommGetAsyncError against the configured timeout.
 * On an error, a timeout or seldp_comm_abort the rank's NCCL communicator is aborted with
 * ncclCommAbort and the world is marked aborted, so that every rank of an in-process world
 * returns SELDP_ERR_ABORTED (or the error it met) instead of hanging. Groups come from
 * ncclCommSplit. Buffers passed with mem = host are staged through device memory.
 *
 * NCCL cannot place two ranks of one communicator on one GPU: for more ranks than GPUs use
 * the host-staged transport (seldp/host.h), which accepts device tensors too.
 *
 * Streams. seldp orders its device work on its own streams (each NCCL communicator's, and
 * the calling thread's per-thread default stream for copies, zeroing and conversions), and
 * it does not wait for streams it did not create:
 * - before a call that reads device memory (seldp_session_reduce and its variants,
 *   seldp_session_initialize, the seldp_comm_* collectives), the work that wrote that
 *   memory must be complete: synchronize the stream that produced it
 *   (cudaStreamSynchronize, or cudaEventSynchronize on an event recorded after it). This
 *   is what torch.distributed asks of work outside the current stream and what ncclGroup
 *   callers do with cudaStreamWaitEvent, done on the host because seldp's waits poll.
 * - when such a call returns SELDP_OK, everything it wrote (reduced gradients, broadcast
 *   parameters, collective results) is complete: any stream may read it without waiting.
 *
 * Timeouts. Joining (seldp_nccl_comm_init, _init_with_id) and seldp_comm_split wait at least
 * 60 s whatever cfg->timeout_s says, as NCCL's bootstrap over several GPUs takes seconds;
 * the configured timeout bounds every collective.
 *
 * Memory. The transport's own buffers (staging of host payloads, the fused reduction's) only
 * grow, and what growing gives up is kept until the world communicator is destroyed:
 * cudaFree synchronizes the device and its peers, which would deadlock against a peer
 * inside an NCCL kernel waiting for this rank. Overlapped reductions
 * (seldp_session_reduce_start) are refused on this transport (seldp/session.h).
 *
 * Teardown. Communicators made by seldp_comm_split are finalized when destroyed and freed
 * with the rank's world communicator: destroy the world communicator last, on every rank
 * (see the note on ncclCommDestroy in nccl.c).
 *
 * Declared only for builds with NCCL (seldp_has_feature("nccl") is non-zero). */
#ifndef SELDP_NCCL_H
#define SELDP_NCCL_H

#include "seldp/export.h"
#include "seldp/comm.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Size of an NCCL unique id (NCCL_UNIQUE_ID_BYTES). */
#define SELDP_NCCL_UNIQUE_ID_BYTES 128

/** An in-process NCCL world: its unique id and its ranks' rendezvous (opaque). */
typedef struct seldp_nccl_world seldp_nccl_world;

/** Number of CUDA devices this process can use (0 without a GPU or a driver). Local. */
SELDP_API int seldp_nccl_device_count(void);

/** Create an in-process world of `nranks` >= 1 ranks and draw its NCCL unique id. cfg may
 * be NULL for the defaults. Returns SELDP_ERR_INVALID_ARGUMENT for nranks < 1,
 * SELDP_ERR_TRANSPORT when NCCL cannot create an id, SELDP_ERR_NOMEM. */
SELDP_API seldp_status seldp_nccl_world_create(int nranks, const seldp_comm_config *cfg,
                                               seldp_nccl_world **out);

/** Join the world as `rank` on the calling thread's current CUDA device (select it with
 * cudaSetDevice first; every rank needs its own GPU). Collective over the world: every
 * rank must join, from its own thread, within the join timeout (see Timeouts). The
 * returned communicator is the caller's to destroy. Errors: SELDP_ERR_INVALID_ARGUMENT (rank out of
 * range), SELDP_ERR_TIMEOUT (a rank did not join in time), SELDP_ERR_ABORTED (the world was
 * aborted), SELDP_ERR_TRANSPORT (CUDA or NCCL failed, e.g. two ranks on one GPU). */
SELDP_API seldp_status seldp_nccl_comm_init(seldp_nccl_world *world, int rank, seldp_comm **out);

/** Release the caller's reference to the world. Communicators keep their own, so this may
 * be called once every rank has joined; the world is freed with its last communicator.
 * NULL is a no-op. */
SELDP_API void seldp_nccl_world_destroy(seldp_nccl_world *world);

/** Draw a fresh NCCL unique id into out128 (SELDP_NCCL_UNIQUE_ID_BYTES bytes), to be
 * distributed by the caller to every rank of a multi-process world. Local. Returns
 * SELDP_ERR_TRANSPORT when NCCL fails. */
SELDP_API seldp_status seldp_nccl_get_unique_id(void *out128);

/** Join the world named by `id` (from seldp_nccl_get_unique_id, the same bytes on every
 * rank) as `rank` of `nranks`, on the calling thread's current CUDA device. Collective
 * over the world's ranks, in any processes. cfg may be NULL for the defaults. An abort is
 * seen by the communicators of this process only: ranks elsewhere return
 * SELDP_ERR_TIMEOUT (or the NCCL error) when it makes them wait. Errors as
 * seldp_nccl_comm_init. */
SELDP_API seldp_status seldp_nccl_comm_init_with_id(const void *id, int nranks, int rank,
                                                    const seldp_comm_config *cfg, seldp_comm **out);

#ifdef __cplusplus
}
#endif
#endif
