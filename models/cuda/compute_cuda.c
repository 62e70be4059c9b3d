/* The CUDA mirror behind tm_compute_ops (compute.h): activations on the model's GPU. */
#include "compute.h"

#include <cuda_runtime_api.h>

#include "cuda/tinymoe_cuda.h"
#include "tm_error.h"

static float *cuda_alloc(void *model, size_t floats)
{
    void *p = NULL;
    size_t bytes = (floats ? floats : 1) * sizeof(float);
    /* zeroed before it is returned: the model's stream is non-blocking, so a memset still
     * queued on another stream could land after the model's first kernel wrote here */
    if (cudaMalloc(&p, bytes) != cudaSuccess ||
        cudaMemsetAsync(p, 0, bytes, cudaStreamPerThread) != cudaSuccess ||
        cudaStreamSynchronize(cudaStreamPerThread) != cudaSuccess) {
        cudaFree(p);
        cudaGetLastError();
        tm__fail(SELDP_ERR_NOMEM, "out of memory on cuda:%d allocating %zu floats",
                 tmc_model_device(model), floats);
        return NULL;
    }
    return p;
}

static void cuda_release(void *model, float *p)
{
    (void)model;
    if (p)
        cudaFree(p);
}

static seldp_status cuda_copy_rows(void *model, float *dst, const int64_t *dst_rows,
                                   const float *src, const int64_t *src_rows, size_t n, int D)
{
    return tmc_copy_rows(model, dst, dst_rows, src, src_rows, n, D);
}

static seldp_status cuda_begin_step(void *model)
{
    return tmc_begin_step(model);
}

static seldp_status cuda_embed_forward(void *model, const int32_t *tokens, size_t T, float *h)
{
    return tmc_embed_forward(model, tokens, T, h);
}

static seldp_status cuda_route_forward(void *model, int l, const float *h, tm_route *route)
{
    tmc_route r;
    seldp_status st = tmc_route_forward(model, l, h, &r);
    if (st == SELDP_OK)
        *route = (tm_route){.T = r.T, .K = r.K, .expert = r.expert, .gate = r.gate, .x = r.x};
    return st;
}

static seldp_status cuda_expert_forward(void *model, int l, int e, const float *x, size_t n,
                                        float *y)
{
    return tmc_expert_forward(model, l, e, x, n, y);
}

static seldp_status cuda_expert_backward(void *model, int l, int e, const float *x, const float *dy,
                                         size_t n, float *dx)
{
    return tmc_expert_backward(model, l, e, x, dy, n, dx);
}

static seldp_status cuda_combine_forward(void *model, int l, const float *y, float *h)
{
    return tmc_combine_forward(model, l, y, h);
}

static seldp_status cuda_combine_backward(void *model, int l, const float *dh, float *dy)
{
    return tmc_combine_backward(model, l, dh, dy);
}

static seldp_status cuda_route_backward(void *model, int l, const float *dx, float *dh)
{
    return tmc_route_backward(model, l, dx, dh);
}

static seldp_status cuda_head(void *model, const float *h, const int32_t *targets, double *loss_sum,
                              float *dh)
{
    return tmc_head_forward_backward(model, h, targets, loss_sum, dh);
}

static seldp_status cuda_embed_backward(void *model, const float *dh)
{
    return tmc_embed_backward(model, dh);
}

static seldp_status cuda_export_grad(const void *model, size_t index, double scale, bool fp32,
                                     seldp_grads *out)
{
    return tmc_export_grad(model, index, scale, fp32, out);
}

static bool cuda_expert_seen(const void *model, int l, int e)
{
    return tmc_expert_seen(model, l, e);
}

const tm_compute_ops tmc_compute = {
    .alloc = cuda_alloc,
    .release = cuda_release,
    .copy_rows = cuda_copy_rows,
    .begin_step = cuda_begin_step,
    .embed_forward = cuda_embed_forward,
    .route_forward = cuda_route_forward,
    .expert_forward = cuda_expert_forward,
    .expert_backward = cuda_expert_backward,
    .combine_forward = cuda_combine_forward,
    .combine_backward = cuda_combine_backward,
    .route_backward = cuda_route_backward,
    .head = cuda_head,
    .embed_backward = cuda_embed_backward,
    .export_grad = cuda_export_grad,
    .expert_seen = cuda_expert_seen,
};
