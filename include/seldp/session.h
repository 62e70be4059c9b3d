/** @file
 * Selected data parallelism: explicit replica groups over chosen parameters.
 *
 * A session binds one communicator (a replica group) to a selection of ParamIds of
 * the caller's rank-local model. Initialize validates the selection collectively and
 * broadcasts it from a root; the reductions turn each rank's gradients of the selected
 * parameters into the group's weighted mean or sum. Parameters outside the selection
 * are never read, written, moved or converted, and may differ from rank to rank.
 *
 * Collective order is the lexicographic order of full paths; a ParamId tied at several
 * paths is ordered by its smallest path and communicated once. Every collective call
 * returns the same status on every rank of the group; on failure the caller's model
 * and gradient container are unchanged (initialize's one exception is documented there). */
#ifndef SELDP_SESSION_H
#define SELDP_SESSION_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "seldp/export.h"
#include "seldp/comm.h"
#include "seldp/grads.h"
#include "seldp/model.h"
#include "seldp/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/** A replica group bound to a selection of parameters (opaque). */
typedef struct seldp_session seldp_session;

/** What a rank that lacks a selected gradient means. Must be the same on every rank. */
typedef enum seldp_missing_policy {
    /** A selected trainable parameter with a gradient on some active rank must have one on
     * every active rank; the rank that lacks it is named. */
    SELDP_MISSING_ERROR = 0,
    /** A rank without a gradient contributes zero. */
    SELDP_MISSING_ZERO = 1
} seldp_missing_policy;

/** Session settings; grows at the end. */
typedef struct seldp_session_config {
    size_t bucket_bytes; /**< upper bound of one coalesced collective's payload */
    bool check_finite;   /**< reduce fails with SELDP_ERR_NONFINITE naming the first
                              non-finite input gradient (by path and rank) */
} seldp_session_config;

/** Initializer of seldp_session_config with the defaults: 25 MiB buckets, no finiteness
 * check. */
#define SELDP_SESSION_CONFIG_INIT                                                                  \
    {                                                                                              \
        (size_t)25 << 20, false                                                                    \
    }

/** Collective: validate the selection on every rank of `comm`, then broadcast every
 * selected parameter from group rank `root` into the other ranks' storage, in place.
 * Floating selections only (F32, F16, BF16). The model view and comm are borrowed and
 * must outlive the session; `ids` is copied. cfg may be NULL for the defaults.
 * Errors, the same on every rank: SELDP_ERR_INVALID_ARGUMENT (root outside the group),
 * SELDP_ERR_DUPLICATE (an id selected twice), SELDP_ERR_NOT_FOUND (selected id absent),
 * SELDP_ERR_DEVICE, SELDP_ERR_DTYPE (integer or bool selected), SELDP_ERR_SCHEMA (paths,
 * dtypes, shapes or alias topology differ between ranks). No parameter is written unless
 * validation passes on every rank. A transport failure during the broadcasts themselves (a
 * rank aborting or timing out) can leave selected parameters partly overwritten with the
 * root's values; unselected parameters are never touched. */
SELDP_API seldp_status seldp_session_initialize(seldp_comm *comm, seldp_model *model, int root,
                                                const seldp_param_id *ids, size_t n_ids,
                                                const seldp_session_config *cfg,
                                                seldp_session **out);

/** Collective: as seldp_session_initialize, but native integer and bool buffers (quantized
 * bases: NF4 bytes, AWQ words, their scales and zeros) may be selected too; they are
 * broadcast bit-exactly in their own width and never reduced. */
SELDP_API seldp_status seldp_session_initialize_with_buffers(seldp_comm *comm, seldp_model *model,
                                                             int root, const seldp_param_id *ids,
                                                             size_t n_ids,
                                                             const seldp_session_config *cfg,
                                                             seldp_session **out);

/** Collective: replace this rank's selected gradients by the group's weighted mean.
 * `grads` holds this rank's derivatives of its local loss sum
 * and may also hold gradients of unselected parameters, which stay as they are (same
 * tensor, same ownership). `local_weight` is the window's token count; 0 means inactive.
 * On success each selected gradient is sum_r g_r / sum_r w_r in the parameter dtype
 * (halves summed in FP32, cast back with round-to-nearest-even), written in place into
 * the caller's tensor when it has the parameter's dtype, or added as an owned entry where
 * this rank had none (policy zero). A parameter with no gradient on any active rank is
 * absent; with a zero global weight every selected gradient is absent (removed: borrowed
 * bytes are left alone). *global_weight (may be NULL) receives sum_r w_r.
 * Errors, the same on every rank: SELDP_ERR_DISAGREE (another method, flag or policy),
 * SELDP_ERR_MISSING_GRADIENT, SELDP_ERR_FROZEN, SELDP_ERR_SHAPE, SELDP_ERR_DTYPE,
 * SELDP_ERR_OVERFLOW, SELDP_ERR_NONFINITE, transport errors. On error `grads` is unchanged. */
SELDP_API seldp_status seldp_session_reduce(seldp_session *session, seldp_grads *grads,
                                            uint64_t local_weight, seldp_missing_policy policy,
                                            uint64_t *global_weight);

/** Collective: seldp_session_reduce with FP32 results, for FP32 master weights. Inputs may be
 * the parameter dtype or F32; a half input is replaced by an owned F32 entry. */
SELDP_API seldp_status seldp_session_reduce_fp32(seldp_session *session, seldp_grads *grads,
                                                 uint64_t local_weight, seldp_missing_policy policy,
                                                 uint64_t *global_weight);

/** Collective: sum without any division, for gradients already normalized by a global
 * objective. `local_active` decides eligibility, not scale: inactive ranks contribute
 * zero; *global_weight receives the number of active ranks. With no active rank only the
 * unselected gradients remain. Errors as seldp_session_reduce. */
SELDP_API seldp_status seldp_session_sum(seldp_session *session, seldp_grads *grads,
                                         bool local_active, seldp_missing_policy policy,
                                         uint64_t *global_weight);

/** Collective: seldp_session_sum with FP32 results, as seldp_session_reduce_fp32. */
SELDP_API seldp_status seldp_session_sum_fp32(seldp_session *session, seldp_grads *grads,
                                              bool local_active, seldp_missing_policy policy,
                                              uint64_t *global_weight);

/** Rank of the caller within the session's group (local). */
SELDP_API int seldp_session_rank(const seldp_session *session);

/** Number of ranks in the session's group (local). */
SELDP_API int seldp_session_size(const seldp_session *session);

/** The selected ids as given at initialization (local); *n receives their count. The
 * array is owned by the session. */
SELDP_API const seldp_param_id *seldp_session_selected(const seldp_session *session, size_t *n);

/** Free the session (local). The comm and the model are the caller's. NULL is a no-op. */
SELDP_API void seldp_session_destroy(seldp_session *session);

#ifdef __cplusplus
}
#endif
#endif
