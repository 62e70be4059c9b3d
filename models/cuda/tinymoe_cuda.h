/* tiny-moe on one CUDA device: the forward and backward of models/tinymoe.h with cuBLAS
 * GEMMs (FP32, no TF32) and small kernels for RMSNorm, routing, SiLU and cross-entropy, for a
 * rank that computes on a GPU. Built only with CUDA (SELDP_HAVE_CUDA).
 *
 * A GPU model mirrors a host model made by tm_model_create: every parameter occurrence gets
 * device storage of the same dtype and shape, registered in a device model view with the same
 * paths, ids, frozen flags and tags, so that sessions initialize and reduce device tensors.
 * The step mirrors the host API one to one (tmc_X is tm_X) with these differences:
 *   - activations (h, dh, x, y, dy, dx) are device pointers on the model's GPU;
 *   - tokens and targets are host arrays;
 *   - a route's expert and gate arrays are host copies (the harness dispatches with them),
 *     its x is on the device;
 *   - exported gradients are owned device tensors.
 * Every function returns when its work on the device is complete. One thread at a time per
 * model; distinct models may run on distinct threads and share a GPU. */
#ifndef TINYMOE_CUDA_H
#define TINYMOE_CUDA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "seldp/grads.h"
#include "seldp/model.h"
#include "seldp/status.h"
#include "tinymoe.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tmc_model tmc_model;

/** Mirror `host` on cuda:`ordinal`: device storage with the host's current bytes, a device
 * view, FP32 working copies and gradient accumulators, a cuBLAS handle and a stream. `host`
 * is borrowed (its config and parameter infos are read) and must outlive the mirror. Errors:
 * INVALID_ARGUMENT, NOMEM (device memory), TRANSPORT (CUDA or cuBLAS failed). */
seldp_status tmc_model_create(const tm_model *host, int ordinal, tmc_model **out);

/** Free the mirror and its device memory. NULL is a no-op. */
void tmc_model_destroy(tmc_model *m);

/** The device view (tensors on the model's GPU). Owned by the model. */
seldp_model *tmc_model_view(tmc_model *m);

/** The model's CUDA device ordinal. */
int tmc_model_device(const tmc_model *m);

/** The device storage of the occurrence at `path` (NULL when unknown). */
const seldp_tensor *tmc_param_tensor(const tmc_model *m, const char *path);

/** Copy every occurrence's device storage into the host model's storage (for the reference,
 * dumps and checks). Errors: INVALID_ARGUMENT (another model), TRANSPORT. */
seldp_status tmc_download_params(const tmc_model *m, tm_model *host);

/** tm_begin_step from the device storage: FP32 working copies, dequantized bases plus
 * (alpha/r) B A, zeroed gradients, no expert seen. */
seldp_status tmc_begin_step(tmc_model *m);

/** The routing of one layer: expert and gate on the host, x on the device. Valid until the
 * next tmc_begin_step or tmc_embed_forward. */
typedef struct tmc_route {
    size_t T;
    int K;
    const int *expert; /**< host (T,K) */
    const float *gate; /**< host (T,K) */
    const float *x;    /**< device (T,D) */
} tmc_route;

/** tokens (T) host, h (T,D) device out. */
seldp_status tmc_embed_forward(tmc_model *m, const int32_t *tokens, size_t T, float *h);
seldp_status tmc_route_forward(tmc_model *m, int l, const float *h, tmc_route *route);
/** The route of layer l computed in this step's forward (for the backward). */
seldp_status tmc_route_get(const tmc_model *m, int l, tmc_route *route);
seldp_status tmc_expert_forward(tmc_model *m, int l, int e, const float *x, size_t n, float *y);
seldp_status tmc_expert_backward(tmc_model *m, int l, int e, const float *x, const float *dy,
                                 size_t n, float *dx);
seldp_status tmc_combine_forward(tmc_model *m, int l, const float *y, float *h);
seldp_status tmc_combine_backward(tmc_model *m, int l, const float *dh, float *dy);
seldp_status tmc_route_backward(tmc_model *m, int l, const float *dx, float *dh);
/** targets (T) host; *loss_sum (may be NULL) the loss sum, accumulated in double on the host. */
seldp_status tmc_head_forward_backward(tmc_model *m, const float *h, const int32_t *targets,
                                       double *loss_sum, float *dh);
seldp_status tmc_embed_backward(tmc_model *m, const float *dh);

/** A whole step with every expert held on this GPU, as tm_step_local. */
seldp_status tmc_step_local(tmc_model *m, const int32_t *tokens, const int32_t *targets, size_t T,
                            double *loss_sum);

/** Copy rows of D floats on the model's GPU: dst[dst_rows[j]] = src[src_rows[j]] for j < n
 * (host index arrays; NULL means 0..n-1). Packs the rows routed to an expert, and unpacks
 * its results. */
seldp_status tmc_copy_rows(tmc_model *m, float *dst, const int64_t *dst_rows, const float *src,
                           const int64_t *src_rows, size_t n, int D);

/** True when expert e of layer l received rows in this step's backward. */
bool tmc_expert_seen(const tmc_model *m, int l, int e);

/** The device FP32 gradient accumulator of `path` (NULL for frozen or unknown paths). */
const float *tmc_param_grad(const tmc_model *m, const char *path);

/** tm_export_grad with an owned tensor on the model's GPU: occurrence `index` of the host
 * model the mirror was made from (tm_param_at). */
seldp_status tmc_export_grad(const tmc_model *m, size_t index, double scale, bool fp32,
                             seldp_grads *out);

/** tm_export_grads with owned tensors on the model's GPU. */
seldp_status tmc_export_grads(const tmc_model *m, unsigned roles, double scale, bool fp32,
                              seldp_grads *out);

#ifdef __cplusplus
}
#endif
#endif
