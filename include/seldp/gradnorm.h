/** @file
 * The global gradient norm across sessions, and clipping by it
 * (docs/library.md, Global gradient norm).
 *
 * A rank's gradients are reduced by several sessions: the shared weights over one group,
 * each expert over its expert-data-parallel group, tensor-parallel shards over theirs. The
 * norm a training step clips by is that of the *logical* gradient: every replica set counted
 * once, every shard once. A rank lists the sessions it belongs to, each as a part; the call
 * runs over a parent communicator that holds every member of every listed session's group
 * (usually the world) and returns the same norm, bit for bit, on every rank of it.
 *
 * Call it after the reductions: a replicated part is counted by group rank 0 of its session
 * alone, so its replicas must already hold identical gradients. The sessions of a sharded
 * optimizer (seldp/shard.h) are listed by their reduce-scattered ranges
 * (seldp_grad_norm_ranges), each counted by the rank that holds it. */
#ifndef SELDP_GRADNORM_H
#define SELDP_GRADNORM_H

#include <stdbool.h>
#include <stddef.h>

#include "seldp/export.h"
#include "seldp/comm.h"
#include "seldp/grads.h"
#include "seldp/session.h"
#include "seldp/shard.h"
#include "seldp/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/** How the ranks of a session's group hold its selected gradients. */
typedef enum seldp_norm_kind {
    /** Replicas (after a reduction): the group counts once, through its group rank 0. */
    SELDP_NORM_REPLICATED = 0,
    /** Each group rank holds a distinct piece of a larger tensor (a shard) under the same
     * paths: every rank counts its own piece. */
    SELDP_NORM_SHARDED = 1
} seldp_norm_kind;

/** One session of the rank's list: its selected trainable gradients found in `grads` count
 * towards the norm (absent ones count as zero); every other entry of `grads` is ignored, so
 * one container may serve every part. */
typedef struct seldp_norm_part {
    seldp_session *session; /**< borrowed; every member of its group lists it too */
    seldp_grads *grads;     /**< borrowed; clipping scales the selected entries in place */
    seldp_norm_kind kind;   /**< the same on every member of the group */
} seldp_norm_part;

/** One sharded session's gradient for the norm (seldp/shard.h): this rank's range of the
 * session's shard map, as seldp_shard_reduce_scatter wrote it. Every range of a group is
 * another part of the gradient, so every rank counts its own: each element once. */
typedef struct seldp_norm_range {
    seldp_session *session;     /**< borrowed; every member of its group lists it too */
    const seldp_shard_map *map; /**< the session's map */
    float *range;               /**< this rank's range (FP32, on the session's device); clipping
                                     scales its present pieces in place */
    size_t count;               /**< its elements: the rank's count in the map */
    const bool *present;        /**< per piece of the range, as the reduce-scatter set them:
                                     absent pieces count as zero and are never scaled; NULL:
                                     every piece is present */
} seldp_norm_range;

/** What a norm call found, the same on every rank of the parent. */
typedef struct seldp_grad_norm_result {
    double norm;      /**< L2 norm of the logical gradient; Inf or NaN when found_inf */
    bool found_inf;   /**< the norm is not finite (a NaN or Inf gradient, or overflow) */
    bool clipped;     /**< the selected gradients were scaled by clip_coef */
    double clip_coef; /**< min(1, max_norm / (norm + 1e-6)); 1 when nothing was clipped */
} seldp_grad_norm_result;

/** Collective over `parent`: the L2 norm of the logical gradient of the `n_parts` parts
 * (n_parts may differ between ranks, and be 0), summed in FP64. Gradients must have their
 * parameter's shape, its dtype or F32 (the FP32 reductions), and be on the session's
 * device. Nothing is written into any gradient. On success *out receives the result (norm,
 * found_inf; clipped false, clip_coef 1).
 * Errors, the same on every rank, with nothing changed: SELDP_ERR_INVALID_ARGUMENT (NULL
 * session or grads, a session listed twice, an invalid kind, a group larger than the
 * parent), SELDP_ERR_DUPLICATE (a parameter of one model selected by two parts: it would
 * count twice), SELDP_ERR_FROZEN, SELDP_ERR_DTYPE, SELDP_ERR_SHAPE, SELDP_ERR_DEVICE,
 * SELDP_ERR_DISAGREE (another call on another rank, or the lists do not agree: a member
 * of a session's group that does not list it, or lists it with another kind), transport
 * errors. */
SELDP_API seldp_status seldp_grad_norm(seldp_comm *parent, const seldp_norm_part *parts,
                                       size_t n_parts, seldp_grad_norm_result *out);

/** Collective over `parent`: seldp_grad_norm, then, when the norm is finite and
 * max_norm / (norm + 1e-6) < 1, every selected gradient of every part on every rank (the
 * counting replicas and the others alike) is multiplied by that coefficient in place
 * (halves through F32, rounded to nearest even). A non-finite norm clips nothing and sets
 * found_inf: the caller skips the step (the found-inf of loss scaling). max_norm must be
 * finite, > 0 and the same on every rank (SELDP_ERR_INVALID_ARGUMENT, SELDP_ERR_DISAGREE).
 * Errors as seldp_grad_norm, with nothing changed; only a device failure while scaling
 * device tensors could leave some gradients scaled and others not. */
SELDP_API seldp_status seldp_clip_grad_norm(seldp_comm *parent, const seldp_norm_part *parts,
                                            size_t n_parts, double max_norm,
                                            seldp_grad_norm_result *out);

/** Collective over `parent`: seldp_grad_norm over the `n_parts` parts and the `n_ranges`
 * sharded ranges together (either list may be empty, and their lengths may differ between
 * ranks): the norm of a model whose groups are partly replicated, partly sharded, as
 * Megatron-Core's distributed optimizer computes it over its gradient shards. A range counts
 * its present pieces, summed in FP64 in element order. Errors as seldp_grad_norm's, and
 * SELDP_ERR_INVALID_ARGUMENT (a NULL session, map or range, another session's map, a range
 * of the wrong size, a session listed twice, as a part or a range), SELDP_ERR_DISAGREE (a
 * member of a group that lists the session otherwise: as a part, or not at all). */
SELDP_API seldp_status seldp_grad_norm_ranges(seldp_comm *parent, const seldp_norm_part *parts,
                                              size_t n_parts, const seldp_norm_range *ranges,
                                              size_t n_ranges, seldp_grad_norm_result *out);

/** Collective over `parent`: seldp_clip_grad_norm over parts and ranges: when the norm is
 * finite and above max_norm, every selected gradient of every part and every present piece
 * of every range is multiplied by the coefficient in place (ranges in F32). Errors as
 * seldp_grad_norm_ranges and seldp_clip_grad_norm. */
SELDP_API seldp_status seldp_clip_grad_norm_ranges(seldp_comm *parent, const seldp_norm_part *parts,
                                                   size_t n_parts, const seldp_norm_range *ranges,
                                                   size_t n_ranges, double max_norm,
                                                   seldp_grad_norm_result *out);

#ifdef __cplusplus
}
#endif
#endif
