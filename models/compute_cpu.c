/* The CPU model behind tm_compute_ops (compute.h): activations in host memory. */
#include "compute.h"

#include <stdlib.h>
#include <string.h>

#include "tm_error.h"

static float *cpu_alloc(void *model, size_t floats)
{
    (void)model;
    float *p = calloc(floats ? floats : 1, sizeof *p);
    if (!p)
        tm__fail(SELDP_ERR_NOMEM, "out of memory allocating %zu floats", floats);
    return p;
}

static void cpu_release(void *model, float *p)
{
    (void)model;
    free(p);
}

static seldp_status cpu_copy_rows(void *model, float *dst, const int64_t *dst_rows,
                                  const float *src, const int64_t *src_rows, size_t n, int D)
{
    (void)model;
    for (size_t j = 0; j < n; j++) {
        size_t to = dst_rows ? (size_t)dst_rows[j] : j;
        size_t from = src_rows ? (size_t)src_rows[j] : j;
        memcpy(dst + to * (size_t)D, src + from * (size_t)D, (size_t)D * sizeof *dst);
    }
    return SELDP_OK;
}

static seldp_status cpu_begin_step(void *model)
{
    tm_begin_step(model);
    return SELDP_OK;
}

static seldp_status cpu_begin_micro(void *model)
{
    tm_begin_micro_batch(model);
    return SELDP_OK;
}

static seldp_status cpu_use_caches(void *model, int set)
{
    return tm_model_use_caches(model, set);
}

static seldp_status cpu_embed_forward(void *model, const int32_t *tokens, size_t T, float *h)
{
    return tm_embed_forward(model, tokens, T, h);
}

static seldp_status cpu_route_forward(void *model, int l, const float *h, tm_route *route)
{
    return tm_route_forward(model, l, h, route);
}

static seldp_status cpu_expert_forward(void *model, int l, int e, const float *x, size_t n,
                                       float *y)
{
    return tm_expert_forward(model, l, e, x, n, y);
}

static seldp_status cpu_expert_backward(void *model, int l, int e, const float *x, const float *dy,
                                        size_t n, float *dx)
{
    return tm_expert_backward(model, l, e, x, dy, n, dx);
}

static seldp_status cpu_combine_forward(void *model, int l, const float *y, float *h)
{
    return tm_combine_forward(model, l, y, h);
}

static seldp_status cpu_combine_backward(void *model, int l, const float *dh, float *dy)
{
    return tm_combine_backward(model, l, dh, dy);
}

static seldp_status cpu_route_backward(void *model, int l, const float *dx, float *dh)
{
    return tm_route_backward(model, l, dx, dh);
}

static seldp_status cpu_head(void *model, const float *h, const int32_t *targets, double *loss_sum,
                             float *dh)
{
    return tm_head_forward_backward(model, h, targets, loss_sum, dh);
}

static seldp_status cpu_embed_backward(void *model, const float *dh)
{
    return tm_embed_backward(model, dh);
}

static seldp_status cpu_export_grad(const void *model, size_t index, double scale, bool fp32,
                                    seldp_grads *out)
{
    return tm_export_grad(model, index, scale, fp32, out);
}

static bool cpu_expert_seen(const void *model, int l, int e)
{
    return tm_expert_seen(model, l, e);
}

const tm_compute_ops tm_cpu_compute = {
    .alloc = cpu_alloc,
    .release = cpu_release,
    .copy_rows = cpu_copy_rows,
    .begin_step = cpu_begin_step,
    .embed_forward = cpu_embed_forward,
    .route_forward = cpu_route_forward,
    .expert_forward = cpu_expert_forward,
    .expert_backward = cpu_expert_backward,
    .combine_forward = cpu_combine_forward,
    .combine_backward = cpu_combine_backward,
    .route_backward = cpu_route_backward,
    .head = cpu_head,
    .embed_backward = cpu_embed_backward,
    .export_grad = cpu_export_grad,
    .expert_seen = cpu_expert_seen,
    .begin_micro = cpu_begin_micro,
    .use_caches = cpu_use_caches,
};
