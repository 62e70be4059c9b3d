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
 * and gradient container are unchanged (the two exceptions, both transport failures in
 * the middle of a call, are documented below and at initialize). Error messages name the
 * public call that failed (seldp_session_sum, ...).
 *
 * Agreement: the ranks of a group must make the same calls on the same sessions in the
 * same order. Each reduction agrees, before anything moves, on the method, the missing-
 * gradient policy and a fingerprint of the session: a digest of its selection's schema
 * and how many reductions the session has run (the reduce-scatters and all-gathers of
 * seldp/shard.h count too). Two sessions of one communicator called in
 * a different order on different ranks, or a call one rank missed, is SELDP_ERR_DISAGREE
 * on every rank, naming each side's session (by its first selected path), method and call
 * number; nothing is written. A session whose ranks fell out of step stays so (every later
 * reduction fails the same way): destroy it and initialize a new one. Two sessions of one
 * communicator with the same selection share a schema digest and are told apart by their
 * call counts only. Settings that change the outcome (bucket_bytes, check_finite,
 * staged_commit) must be equal on every rank at initialize. The agreement is one all-gather
 * of a 48-byte brief per rank; the full records follow only when the briefs differ or
 * report a failure (docs/library.md, Agreement).
 *
 * Memory and timing (the price of "nothing is lost"):
 * - A session stages its selection in FP32: the bucketed reduce path (MPI, and the
 *   host-staged transport on device memory) allocates, at its first reduction, one
 *   F32 buffer of every reducible selected element on the communicator's device (4 bytes
 *   an element, twice a BF16 selection's size) and keeps it until seldp_session_destroy;
 *   gradients are converted into it, reduced, and only converted back into the caller's
 *   tensors once every collective has succeeded. The fused path (the host-staged transport
 *   on host memory, NCCL on the rank's GPU, which keeps its own F32 buffer in the
 *   transport) needs no such buffer. Results that cannot be written in place (FP32
 *   variants of half inputs, entries added under the zero policy) are allocated before
 *   any collective, so that the commit cannot run out of memory halfway.
 * - A reduction starts when it is called, after backward, unless you use the overlapped
 *   reduction (seldp_session_reduce_start ... seldp_session_finish, below): a blocking call
 *   overlaps nothing with the computation of later gradients. Call it once per step, when
 *   every selected gradient of the step is final.
 *
 * A transport failure in the middle of a reduction (a rank aborts or times out after
 * every rank has passed the agreement):
 * - Bucketed path: the results are still in the staging buffer, so the caller's gradients
 *   are unchanged on every rank that returns an error.
 * - Fused path: the results are written into the caller's tensors as they are computed
 *   (the host-staged transport: in the one rendezvous every rank entered; NCCL: once every
 *   bucket's allreduce has completed). If the transport fails after that writing
 *   began, the call returns SELDP_ERR_GRADS_UNDEFINED: the selected gradients (inputs and
 *   any results) hold undefined values, while entries and ownership in the container and
 *   every unselected gradient are unchanged; a failure before it returns the transport's
 *   status with the gradients unchanged. Recompute the step's gradients (or skip the step)
 *   on SELDP_ERR_GRADS_UNDEFINED.
 * - cfg.staged_commit keeps the full guarantee on both paths: the fused reduction writes
 *   into the FP32 staging buffer instead, and every rank commits only after a final
 *   agreement (one more small all-gather) that every rank's reduction succeeded, so any
 *   failure before the commit leaves every rank's gradients unchanged. It costs the staging
 *   buffer and a conversion pass, several times the fused path's time on the host-staged
 *   transport (seldp-bench --op reduce --staged-commit; results/bench/README.md, section 5),
 *   which is why it is not the default.
 * Only the commit itself (writing the staged results into the container) follows the last
 * collective, and it cannot fail: every result buffer and the container's room for new
 * entries are allocated before the agreement. */
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

/** How a reduction moves the gradients. Both paths give bit-identical results. */
typedef enum seldp_reduce_path {
    /** The environment variable SELDP_REDUCE_PATH decides ("fused" or "bucketed"); unset,
     * empty or "auto": fused where the transport has a fused reduction over the session's
     * memory (the host-staged one on host memory, NCCL on the rank's GPU), else bucketed. */
    SELDP_REDUCE_PATH_AUTO = 0,
    /** The transport reads the gradients where they are and writes the results with no
     * session staging buffer: the host-staged transport in one pass and one rendezvous on
     * host memory, NCCL with one conversion launch, grouped bucket allreduces and one
     * scale-and-cast launch on the rank's GPU. Elsewhere (the host-staged transport on a
     * GPU, MPI) initialize fails with SELDP_ERR_INVALID_ARGUMENT. */
    SELDP_REDUCE_PATH_FUSED = 1,
    /** Gradients converted to F32 into the session's staging buffer, allreduced in buckets
     * of bucket_bytes, scaled, and converted back: what MPI always does. */
    SELDP_REDUCE_PATH_BUCKETED = 2
} seldp_reduce_path;

/** Session settings; grows at the end. */
typedef struct seldp_session_config {
    size_t struct_size; /**< sizeof(seldp_session_config) as the caller's header declared it: set by
                           SELDP_SESSION_CONFIG_INIT, which every config must start from (the struct
                           grows at the end) */
    size_t bucket_bytes;           /**< upper bound of one coalesced collective's payload; the same
                                        on every rank */
    bool check_finite;             /**< reduce fails with SELDP_ERR_NONFINITE naming the first
                                        non-finite input gradient of an active rank, in path order,
                                        then lowest group rank; the same on every rank */
    seldp_reduce_path reduce_path; /**< may differ between ranks: the group takes the
                                        fused path only when every rank can */
    bool staged_commit;            /**< keep the full guarantee on every path: results are staged in
                                        FP32 and committed only after a final agreement that every
                                        rank's reduction succeeded (overlapped reductions too,
                                        whatever overlap_in_place says); the same on every rank */
    bool overlap_in_place;         /**< overlapped reductions on the fused path write each bucket's
                                        results into this rank's gradients as the bucket completes
                                        (as DDP does), after copying the gradients' bytes into the
                                        staging buffer, and put them back from there on any failure:
                                        finish has nothing left to commit, but the marked gradients
                                        change before it returns (see seldp_session_reduce_start).
                                        True by default; false (or cfg.staged_commit) stages the
                                        results until finish's final agreement. May differ between
                                        ranks; ignored elsewhere */
} seldp_session_config;

/** Initializer of seldp_session_config with the defaults: 25 MiB buckets, no finiteness
 * check, the reduce path chosen by SELDP_REDUCE_PATH or the transport, no staged commit,
 * overlapped reductions in place. */
#define SELDP_SESSION_CONFIG_INIT                                                                  \
    {                                                                                              \
        sizeof(seldp_session_config), (size_t)25 << 20, false, SELDP_REDUCE_PATH_AUTO, false, true \
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
 * SELDP_ERR_OVERFLOW, SELDP_ERR_NONFINITE, transport errors. On error `grads` is unchanged, except
 * SELDP_ERR_GRADS_UNDEFINED (a fused reduction that failed while writing; see the file
 * comment). */
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

/* --- Overlapped reductions ----------------------------------------------------------
 *
 * The reduction of one step overlapped with its backward, as DDP's gradient hooks do:
 *
 *     seldp_session_reduce_start(s, grads, tokens, SELDP_MISSING_ERROR);
 *     for each layer, last to first:
 *         backward of the layer; put its gradients into grads;
 *         seldp_session_mark_ready(s, id) for each of its parameters;
 *     seldp_session_finish(s, &global_weight);
 *
 * A per-session progress thread (created by the first start, joined by
 * seldp_session_destroy) runs the transport's blocking collectives while the caller goes on
 * computing: the agreement of the call, then the reducible selected parameters, laid out in
 * path order in the session's FP32 staging buffer and cut into buckets of cfg.bucket_bytes,
 * as the blocking bucketed path lays them out. A bucket is converted into the staging
 * buffer, allreduced and scaled as soon as every parameter it holds is marked, last bucket
 * first (reverse path order, the order backward produces the gradients), in the same order
 * on every rank: marks in any order work, a bucket waits for the ones before it. The
 * buckets hold every reducible parameter, so a parameter no rank has a gradient for is
 * still sent (as zeros) before finish learns that it is absent. On the host-staged
 * transport's fused path each bucket is one fused reduction into the staging buffer.
 *
 * Contracts, those of the blocking calls (above; docs/library.md) unchanged:
 * - The results are bit-identical to the blocking call of the same inputs on the same
 *   communicator and reduce path: sums in F32 in rank order, scaled, converted back with
 *   round to nearest even. (The host-staged and MPI transports sum an element the same way
 *   wherever it lies in a bucket. NCCL's sums depend on the position: there the buckets are
 *   the blocking call's collectives over the same bytes, hence the same bits, when every
 *   reducible parameter has a gradient on some active rank; when some has none, the layouts
 *   differ and the results may differ from the blocking call's in the last bits, as two
 *   bucket sizes do, while staying identical across ranks.)
 * - Agreement: the start agrees, as a blocking call does, on the method, policy, weight and
 *   the session's fingerprint (a blocking call on another rank, another session, a missed
 *   call: SELDP_ERR_DISAGREE); finish agrees once more on every rank's status, presence of
 *   gradients and first non-finite input, and decides the missing-gradient policy and
 *   cfg.check_finite as the blocking call does.
 * - The guarantee, on every path: any failure, on any rank (a bucket, the final agreement:
 *   a rank's local error, the missing-gradient policy, a non-finite input), leaves every
 *   rank's container as it was when finish returns, and finish returns the failure on every
 *   rank (the first failing rank's status and message; a transport failure that leaves the
 *   ranks unable to exchange it: each rank's own). How it is kept:
 * - By default (cfg.overlap_in_place, true in SELDP_SESSION_CONFIG_INIT) on fused sessions
 *   (the host-staged transport on host memory), in place, as DDP does: before a bucket's
 *   reduction, this rank's gradients in it are copied into the staging buffer, and the
 *   bucket's results are written straight into the gradients (a gradient of another dtype
 *   than the result, or none, still goes through the staging buffer). The results are the
 *   same bits. Any failure puts every gradient written back from its copy before finish
 *   returns; a parameter that turns out absent on every active rank gets its bytes back
 *   before its entry is removed. So finish has nothing left to copy after the last bucket
 *   and the step's critical path ends with it, but between a bucket and finish a marked
 *   gradient holds results, not what the caller wrote. When putting back fails (a device
 *   copy), finish returns SELDP_ERR_GRADS_UNDEFINED; on host memory it cannot fail.
 * - Staged (cfg.overlap_in_place = false, or cfg.staged_commit, and every session that is
 *   not fused): nothing is written into the caller's container before finish has seen, in
 *   its final agreement, that every rank's every bucket succeeded; marked gradients keep
 *   what the caller wrote until then. The price is the commit after the final agreement:
 *   every result copied from the staging buffer into the gradients, after the last bucket,
 *   on the step's critical path (on the host-staged transport the reduction is itself
 *   memory traffic on the same cores, so the copy is a sizeable part of it: seldp-bench
 *   --op overlap, results/bench/README.md, section 7).
 * - Timeouts and seldp_comm_abort (from any thread) interrupt the bucket in flight; finish
 *   then returns SELDP_ERR_TIMEOUT or SELDP_ERR_ABORTED.
 *
 * Rules for the caller:
 * - Marking a gradient ready hands its bytes to the progress thread, which may read them at
 *   any time until finish returns: do not modify, free or replace a gradient after marking
 *   it (the reduction may already have read it; the results are then undefined). Marking a
 *   parameter twice is an error that fails the reduction on every rank. A gradient on a
 *   CUDA device must be complete (its stream synchronized) when it is marked.
 * - Do not change the container's entries of selected parameters that have been marked
 *   until finish returns; entries of parameters not yet marked may be added.
 * - While a reduction is in flight the session's communicator belongs to its progress
 *   thread. A blocking reduction, or another start, on this session or another session of
 *   the same communicator in this process, returns SELDP_ERR_INVALID_ARGUMENT at once (the
 *   reduction in flight goes on). Other collectives on that communicator (initialize,
 *   seldp_comm_*, the gradient norm) are not detected: do not call them before finish.
 * - Every rank must call finish. seldp_session_destroy while a reduction is in flight
 *   cancels it: it waits for the collective in progress (at most the transport's timeout)
 *   and the other ranks' finish returns an error.
 * - Sessions of different communicators may have reductions in flight at once (a shared
 *   group's and an expert group's, each with its own progress thread): on the host-staged
 *   transport they run concurrently. The MPI transport runs the collectives of one world one
 *   at a time in a process, each holding the world until it completes, so two reductions in
 *   flight on one world can wait for each other across ranks until the timeout: on MPI keep
 *   one reduction in flight per world and make no other collective of that world before its
 *   finish. The progress thread calls MPI, so MPI must be initialized with
 *   MPI_THREAD_SERIALIZED or MPI_THREAD_MULTIPLE. NCCL: refused (SELDP_ERR_UNSUPPORTED at
 *   start, on every rank): a GPU's NCCL communicators must be driven from one thread in
 *   one order on every rank, which a progress thread beside the caller's cannot keep; the
 *   blocking calls already issue their buckets as grouped, asynchronous NCCL work. */

/** Collective: start the overlapped seldp_session_reduce of `grads` (same arguments and
 * meaning) and return without waiting for the other ranks. The agreement and every bucket
 * run on the session's progress thread; their outcome is returned by seldp_session_finish.
 * `grads` is borrowed until finish returns. Errors, local and immediate (nothing starts,
 * no collective is made, the other ranks' finish then returns SELDP_ERR_TIMEOUT):
 * SELDP_ERR_INVALID_ARGUMENT (NULL session or grads, invalid policy, a reduction already in
 * flight on the session or its communicator), SELDP_ERR_UNSUPPORTED (an NCCL communicator,
 * see above), SELDP_ERR_NOMEM, SELDP_ERR_TRANSPORT (the progress thread could not be
 * created). */
SELDP_API seldp_status seldp_session_reduce_start(seldp_session *session, seldp_grads *grads,
                                                  uint64_t local_weight,
                                                  seldp_missing_policy policy);

/** Collective: the overlapped seldp_session_reduce_fp32, as seldp_session_reduce_start. */
SELDP_API seldp_status seldp_session_reduce_fp32_start(seldp_session *session, seldp_grads *grads,
                                                       uint64_t local_weight,
                                                       seldp_missing_policy policy);

/** Collective: the overlapped seldp_session_sum, as seldp_session_reduce_start. */
SELDP_API seldp_status seldp_session_sum_start(seldp_session *session, seldp_grads *grads,
                                               bool local_active, seldp_missing_policy policy);

/** Collective: the overlapped seldp_session_sum_fp32, as seldp_session_reduce_start. */
SELDP_API seldp_status seldp_session_sum_fp32_start(seldp_session *session, seldp_grads *grads,
                                                    bool local_active, seldp_missing_policy policy);

/** Local: the gradient of selected parameter `id` is final. It is looked up in the
 * container now: present, it is checked (frozen, dtype, shape, device, as the blocking call
 * does) and handed to the progress thread; absent, this rank has none for the step. Never
 * blocks on the other ranks. Errors: SELDP_ERR_INVALID_ARGUMENT (no reduction in flight),
 * SELDP_ERR_NOT_FOUND (id not selected by the session; the reduction goes on unaffected);
 * a gradient that fails a check (SELDP_ERR_FROZEN, _DTYPE, _SHAPE, _DEVICE) or a second
 * mark of one parameter (SELDP_ERR_INVALID_ARGUMENT) is returned here and fails the
 * reduction: finish returns it on every rank. Safe to call from several threads at once,
 * but not concurrently with finish. */
SELDP_API seldp_status seldp_session_mark_ready(seldp_session *session, seldp_param_id id);

/** Collective: end the overlapped reduction. Every selected parameter not yet marked is
 * marked now (from the container as it is); then finish waits for the buckets, agrees with
 * the other ranks and, when every rank's reduction succeeded, writes the results into
 * `grads` as the blocking call does (a reduce-scatter started by
 * seldp_shard_reduce_scatter_start: into its range and presence flags, seldp/shard.h).
 * *global_weight (may be NULL) receives the global weight. Errors, the same on every rank: those of
 * the blocking call (never SELDP_ERR_GRADS_UNDEFINED: on any error `grads` is unchanged); locally,
 * SELDP_ERR_INVALID_ARGUMENT when no reduction is in flight. The session is ready for its
 * next reduction when finish returns, whatever the status. */
SELDP_API seldp_status seldp_session_finish(seldp_session *session, uint64_t *global_weight);

/** Whether an overlapped reduction is in flight on the session: started, not yet finished
 * (local). */
SELDP_API bool seldp_session_in_flight(const seldp_session *session);

/** Rank of the caller within the session's group (local). */
SELDP_API int seldp_session_rank(const seldp_session *session);

/** Number of ranks in the session's group (local). */
SELDP_API int seldp_session_size(const seldp_session *session);

/** The reduce path the group agreed on at initialize (local): SELDP_REDUCE_PATH_FUSED or
 * SELDP_REDUCE_PATH_BUCKETED; SELDP_REDUCE_PATH_AUTO for a NULL session. */
SELDP_API seldp_reduce_path seldp_session_reduce_path(const seldp_session *session);

/** The selected ids as given at initialization (local); *n receives their count. The
 * array is owned by the session. */
SELDP_API const seldp_param_id *seldp_session_selected(const seldp_session *session, size_t *n);

/** Free the session (local). The comm and the model are the caller's. NULL is a no-op. */
SELDP_API void seldp_session_destroy(seldp_session *session);

#ifdef __cplusplus
}
#endif
#endif
