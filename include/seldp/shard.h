/** @file
 * Sharded optimizer state over a session's group: ZeRO-1/2, Megatron-Core's distributed
 * optimizer, torchtitan's FSDP2 gradient path.
 *
 * Instead of all-reducing a group's gradients and keeping the whole FP32 master copy and
 * optimizer state on every replica, each rank of the group
 *   1. reduce-scatters the gradients: it receives only its range of the reduced gradient
 *      (seldp_shard_reduce_scatter, _sum), in FP32;
 *   2. updates its range of the FP32 master weights and optimizer state (its own code: Adam,
 *      AdamW...), a 1/W share of the memory and of the work;
 *   3. all-gathers the updated ranges into every rank's parameters
 *      (seldp_shard_allgather_params), converted to each parameter's dtype.
 * A model of several groups (the dense group, each expert-data group) does this per session.
 *
 * The shard map (seldp_shard_map_create) says which elements each group rank owns. It is a
 * pure function of the session, the same on every rank: the session's selected trainable
 * parameters (F32, F16 or BF16, not frozen; integer and bool buffers are never sharded) in
 * collective order (the lexicographic order of their paths; a tied parameter once, at its
 * smallest path), flattened row-major and laid end to end into one index space of E
 * elements, cut into W contiguous ranges, one per group rank, in group rank order. Every
 * range but the last non-empty one has S = ceil(E / W) rounded up to a multiple of
 * SELDP_SHARD_ALIGN elements; the ranges after it are shorter or empty (no padding is ever
 * exposed: a range holds only elements of parameters). A parameter may span ranges, as in
 * Megatron-Core's buffers; a rank's range is a list of pieces, each (parameter, element
 * offset within it, count, offset within the range).
 *
 * Contracts, those of the session's reductions (seldp/session.h) on the new calls:
 * - Agreement: each call agrees, before anything moves, on the method (all-reduce,
 *   reduce-scatter mean or sum, all-gather and its range dtype), the missing-gradient
 *   policy and the session's fingerprint (its schema digest and its call count, which
 *   counts these calls too): seldp_session_reduce on one rank and seldp_shard_reduce_scatter
 *   on another is SELDP_ERR_DISAGREE on every rank, never a mix.
 * - Missing gradients: the policies of seldp_session_reduce; a parameter with no gradient on
 *   any active rank is absent in every range (its pieces are reported absent and not
 *   written).
 * - Frozen parameters and integer or bool buffers are outside the map: never read, written
 *   or communicated; a gradient supplied for one is an error. Unselected parameters and
 *   gradients are untouched. The gradient container is only read.
 * - Half gradients (F16, BF16) are summed in FP32; results are FP32.
 * - Each range equals, bit for bit, the same elements of seldp_session_reduce_fp32's (mean)
 *   or seldp_session_sum_fp32's (sum) results for the same inputs, flattened in map order, on
 *   the host-staged and MPI transports (both sum every element in rank order 0..W-1 in F32,
 *   wherever it lies). NCCL's sums depend on its algorithm: there the ranges match the
 *   all-reduce's within its rounding, and the all-gathered parameters are identical on every
 *   rank all the same.
 * - Errors are collective: every rank returns the same status and message, naming the call,
 *   the rank, the path and what was expected. Nothing is lost: on any error the gradient
 *   container, the model and the range are unchanged, except on the fused path of the
 *   host-staged transport (host memory) when the transport fails after writing began:
 *   SELDP_ERR_GRADS_UNDEFINED (reduce-scatter: the range holds undefined values) or
 *   SELDP_ERR_PARAMS_UNDEFINED (all-gather: the selected trainable parameters do).
 *   cfg.staged_commit keeps the full guarantee there too, at the price of the session's FP32
 *   staging buffer and one more copy.
 * - Timeouts, stalls and seldp_comm_abort behave as in the other collectives: once a call
 *   has returned, no rank reads or writes that rank's gradients, range or parameters.
 *
 * How the data moves:
 * - Host-staged transport on host memory (the fused path): one rendezvous and one pass. In
 *   the reduce-scatter each rank reads only its range of every rank's gradients (halves
 *   upcast, summed in F32, scaled by 1/W) and writes its own range; in the all-gather each
 *   rank reads its range once and writes it, converted, into every rank's parameters.
 * - Elsewhere (MPI, NCCL, the host-staged transport on a GPU, and cfg.reduce_path
 *   BUCKETED): the gradients are converted into the session's FP32 staging buffer (one F32
 *   per map element, kept until the session is destroyed), reduce-scattered in buckets of
 *   cfg.bucket_bytes with seldp_comm_reduce_scatter (MPI: an MPI_Ialltoallv and sums in rank
 *   order; NCCL: ncclReduceScatter, or grouped ncclReduce for uneven blocks), scaled, and
 *   the rank's range copied out; the ranges are all-gathered into the staging buffer in their
 *   dtype with seldp_comm_allgather_counts (MPI_Iallgatherv; ncclAllGather, or grouped
 *   ncclBroadcast) and converted into the parameters.
 *
 * Why no parameter-dtype results: the range is the input of the FP32 master update, and the
 * reduce-scatter's contract is to equal the FP32 all-reduce (seldp_session_reduce_fp32) on
 * it; results in BF16 would be that range rounded to nearest even (seldp_f32_to_half gives
 * exactly the bits seldp_session_reduce writes), a conversion the caller makes if it wants
 * one, and rounding before the update would lose the precision the master weights keep.
 *
 * Overlap with backward: seldp_shard_reduce_scatter_start (and _sum_start) starts the
 * reduce-scatter on the session's progress thread, as seldp_session_reduce_start starts an
 * all-reduce (seldp/session.h, "Overlapped reductions": the same buckets of cfg.bucket_bytes
 * in path order, reduced last to first as their gradients are marked ready with
 * seldp_session_mark_ready, the same rules for the caller); seldp_session_finish writes the
 * range and the presence flags. Each bucket is one reduce-scatter of the bucket (on the
 * host-staged transport, one fused pass that reads only this rank's part of it), so the
 * results are the blocking call's bits; nothing is written into the range before finish's
 * final agreement. */
#ifndef SELDP_SHARD_H
#define SELDP_SHARD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "seldp/export.h"
#include "seldp/dtype.h"
#include "seldp/grads.h"
#include "seldp/session.h"
#include "seldp/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Granularity of the range boundaries, in elements: every range starts at a multiple of it
 * (512 bytes of F32, 256 of BF16: whole cache lines of every dtype). */
#define SELDP_SHARD_ALIGN 128

/** The shard map of a session (opaque). */
typedef struct seldp_shard_map seldp_shard_map;

/** One piece of a group rank's range: a run of elements of one parameter. */
typedef struct seldp_shard_piece {
    seldp_param_id id;     /**< this rank's ParamId of the parameter (ids may differ between
                                ranks; everything else here is the same on every rank) */
    const char *path;      /**< its path (a tied parameter's smallest), owned by the model */
    seldp_dtype dtype;     /**< the parameter's dtype */
    size_t param_elements; /**< elements of the whole parameter */
    size_t param_offset;   /**< the piece's first element within the parameter (row-major) */
    size_t count;          /**< elements in the piece, at least 1 */
    size_t range_offset;   /**< the piece's first element within the range */
} seldp_shard_piece;

/** Local: the shard map of `session` (see the file comment), computed from the session
 * alone: the same on every rank of its group. The map borrows the session: destroy it
 * first. Errors: SELDP_ERR_INVALID_ARGUMENT (NULL session or out), SELDP_ERR_NOMEM; *out is
 * NULL then. */
SELDP_API seldp_status seldp_shard_map_create(const seldp_session *session, seldp_shard_map **out);

/** Free a map (local). NULL is a no-op. */
SELDP_API void seldp_shard_map_destroy(seldp_shard_map *map);

/** Elements in the map's index space: those of every selected trainable parameter (local). */
SELDP_API size_t seldp_shard_map_elements(const seldp_shard_map *map);

/** Number of ranges: the session's group size (local; 0 for NULL). */
SELDP_API int seldp_shard_map_size(const seldp_shard_map *map);

/** Local: group rank `group_rank`'s range, [*begin, *begin + *count) of the index space
 * (either pointer may be NULL). SELDP_ERR_INVALID_ARGUMENT for a NULL map or a rank outside
 * the group. */
SELDP_API seldp_status seldp_shard_map_range(const seldp_shard_map *map, int group_rank,
                                             size_t *begin, size_t *count);

/** Number of pieces in group rank `group_rank`'s range (local; 0 for an empty range, a NULL
 * map or a rank outside the group). */
SELDP_API size_t seldp_shard_map_pieces(const seldp_shard_map *map, int group_rank);

/** Local: piece `i` (in index order) of group rank `group_rank`'s range into *out.
 * SELDP_ERR_INVALID_ARGUMENT for a NULL argument, a rank outside the group or i out of
 * range. */
SELDP_API seldp_status seldp_shard_map_piece(const seldp_shard_map *map, int group_rank, size_t i,
                                             seldp_shard_piece *out);

/** Collective over the session's group: reduce-scatter the weighted mean of the selected
 * gradients, FP32 results. `grads`, `local_weight` and `policy` mean what they mean for
 * seldp_session_reduce; `grads` is only read. `map` is the session's map (another session's
 * is refused); `range` (on the session's device) receives this rank's range, `range_count`
 * elements, which must be its count in the map. On success every present piece holds
 * sum_r g_r / sum_r w_r over the group, the bits of the same elements of
 * seldp_session_reduce_fp32; the elements of absent pieces (no gradient on any active rank,
 * or a zero global weight) are not written. `present` (host memory, may be NULL) receives
 * one flag per piece of this rank's range (seldp_shard_map_pieces entries): true where the
 * piece was written. *global_weight (may be NULL) receives sum_r w_r.
 * Errors, the same on every rank: those of seldp_session_reduce, and
 * SELDP_ERR_INVALID_ARGUMENT (a NULL or another session's map, a range of the wrong size, a
 * NULL range for a non-empty one). On error the gradients, `range` and `present` are
 * unchanged, except SELDP_ERR_GRADS_UNDEFINED (see the file comment). */
SELDP_API seldp_status seldp_shard_reduce_scatter(seldp_session *session,
                                                  const seldp_shard_map *map, seldp_grads *grads,
                                                  uint64_t local_weight,
                                                  seldp_missing_policy policy, float *range,
                                                  size_t range_count, bool *present,
                                                  uint64_t *global_weight);

/** Collective: seldp_shard_reduce_scatter of the sum (seldp_session_sum: `local_active`
 * decides eligibility, not scale; *global_weight receives the number of active ranks), the
 * bits of the same elements of seldp_session_sum_fp32. */
SELDP_API seldp_status seldp_shard_reduce_scatter_sum(seldp_session *session,
                                                      const seldp_shard_map *map,
                                                      seldp_grads *grads, bool local_active,
                                                      seldp_missing_policy policy, float *range,
                                                      size_t range_count, bool *present,
                                                      uint64_t *global_weight);

/** Collective: start the overlapped seldp_shard_reduce_scatter (same arguments; `grads`,
 * `range` and `present` are borrowed until seldp_session_finish returns) and return without
 * waiting for the other ranks. Mark each gradient with seldp_session_mark_ready as backward
 * produces it; seldp_session_finish(session, &global_weight) waits, agrees, and writes the
 * range and the flags as the blocking call does (bit-identical results), or returns the
 * failure on every rank with `range` and `present` unchanged. Errors of the map or the range
 * are those of the blocking call, returned by finish on every rank. Errors, local and
 * immediate, as seldp_session_reduce_start's. */
SELDP_API seldp_status seldp_shard_reduce_scatter_start(seldp_session *session,
                                                        const seldp_shard_map *map,
                                                        seldp_grads *grads, uint64_t local_weight,
                                                        seldp_missing_policy policy, float *range,
                                                        size_t range_count, bool *present);

/** Collective: the overlapped seldp_shard_reduce_scatter_sum, as
 * seldp_shard_reduce_scatter_start. */
SELDP_API seldp_status seldp_shard_reduce_scatter_sum_start(
    seldp_session *session, const seldp_shard_map *map, seldp_grads *grads, bool local_active,
    seldp_missing_policy policy, float *range, size_t range_count, bool *present);

/** Collective over the session's group: every rank supplies its range of the map,
 * `range_count` elements of `range_dtype` (F32: the FP32 master weights; or F16, BF16: the
 * parameter dtype) at `range` (on the session's device), and every rank's storage of every
 * selected trainable parameter receives the whole parameter, each element converted from
 * range_dtype to the parameter's dtype (F32 into a half: round to nearest even; a half into
 * its own dtype or F32: exact; a half range cannot go into a parameter of the other half
 * dtype), bit-identical on every rank. Frozen parameters, buffers and unselected
 * parameters are untouched. range_dtype must be the same on every rank.
 * Errors, the same on every rank: SELDP_ERR_INVALID_ARGUMENT (a NULL or another session's
 * map, a range of the wrong size, a NULL range for a non-empty one), SELDP_ERR_DTYPE
 * (range_dtype not F32, F16 or BF16, or a half range and a parameter of the other half
 * dtype), SELDP_ERR_DISAGREE (another call, or another
 * range_dtype, on another rank), transport errors. On error no parameter is written, except
 * SELDP_ERR_PARAMS_UNDEFINED (see the file comment). */
SELDP_API seldp_status seldp_shard_allgather_params(seldp_session *session,
                                                    const seldp_shard_map *map, const void *range,
                                                    seldp_dtype range_dtype, size_t range_count);

#ifdef __cplusplus
}
#endif
#endif
