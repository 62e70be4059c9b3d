/* One interface for the pieces of a tiny-moe step, filled once per backend: the CPU model
 * (tm_cpu_compute, `model` a tm_model *) and its CUDA mirror (tmc_compute, `model` a
 * tmc_model *, built only with CUDA). A program that dispatches tokens itself (the harness's
 * expert parallelism) drives either through this table and keeps its activations where the
 * model computes.
 *
 * Buffers are counts of floats in the model's memory (host or its GPU); tokens, targets and
 * row indices are host arrays. The calls are tinymoe.h's (tinymoe_cuda.h's on a GPU): a
 * route's expert and gate are on the host, its x where the model computes. */
#ifndef TM_COMPUTE_H
#define TM_COMPUTE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "seldp/grads.h"
#include "seldp/status.h"
#include "tinymoe.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tm_compute_ops {
    /* zeroed; NULL on failure (tm_last_error says why) */
    float *(*alloc)(void *model, size_t floats);
    void (*release)(void *model, float *p); /* NULL is a no-op */
    /* rows of D floats: dst[dst_rows[j]] = src[src_rows[j]] for j < n (NULL: 0..n-1) */
    seldp_status (*copy_rows)(void *model, float *dst, const int64_t *dst_rows, const float *src,
                              const int64_t *src_rows, size_t n, int D);
    seldp_status (*begin_step)(void *model);
    seldp_status (*embed_forward)(void *model, const int32_t *tokens, size_t T, float *h);
    seldp_status (*route_forward)(void *model, int l, const float *h, tm_route *route);
    seldp_status (*expert_forward)(void *model, int l, int e, const float *x, size_t n, float *y);
    seldp_status (*expert_backward)(void *model, int l, int e, const float *x, const float *dy,
                                    size_t n, float *dx);
    seldp_status (*combine_forward)(void *model, int l, const float *y, float *h);
    seldp_status (*combine_backward)(void *model, int l, const float *dh, float *dy);
    seldp_status (*route_backward)(void *model, int l, const float *dx, float *dh);
    seldp_status (*head)(void *model, const float *h, const int32_t *targets, double *loss_sum,
                         float *dh);
    seldp_status (*embed_backward)(void *model, const float *dh);
    /* this step's gradient of occurrence `index` (tm_param_at) into `out`, a tensor where the
     * model computes (tm_export_grad) */
    seldp_status (*export_grad)(const void *model, size_t index, double scale, bool fp32,
                                seldp_grads *out);
    bool (*expert_seen)(const void *model, int l, int e);
    /* the next micro-batch of a step: begin_step keeping the gradients and the experts' seen
     * marks (tm_begin_micro_batch); NULL where the model cannot accumulate micro-batches */
    seldp_status (*begin_micro)(void *model);
    /* micro-batches in flight: the activation caches of set `set` in use from now on
     * (tm_model_use_caches); NULL where the model keeps one micro-batch's caches only */
    seldp_status (*use_caches)(void *model, int set);
} tm_compute_ops;

/* The CPU model (compute_cpu.c): `model` is a tm_model *. */
extern const tm_compute_ops tm_cpu_compute;

#ifdef SELDP_HAVE_CUDA
/* The CUDA mirror (cuda/compute_cuda.c): `model` is a tmc_model *. */
extern const tm_compute_ops tmc_compute;
#endif

#ifdef __cplusplus
}
#endif
#endif
