/* CUDA devices for the harness (gpu.h), and a rank that computes on one (run.h): the
 * device mirror of the rank's model (models/cuda/tinymoe_cuda.h) and the compute ops that
 * dispatch.c drives. */
#include "gpu.h"

#include <string.h>

#ifdef SELDP_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "cuda/tinymoe_cuda.h"
#endif

#include "run.h"
#include "util.h"

int hx_gpu_count(void)
{
#ifdef SELDP_HAVE_CUDA
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError(); /* no driver or no device: clear the sticky error */
        return 0;
    }
    return n;
#else
    return 0;
#endif
}

seldp_status hx_gpu_select(int ordinal)
{
#ifdef SELDP_HAVE_CUDA
    cudaError_t err = cudaSetDevice(ordinal);
    if (err != cudaSuccess)
        return hx_fail(SELDP_ERR_TRANSPORT, "cudaSetDevice(%d): %s", ordinal,
                       cudaGetErrorString(err));
    return SELDP_OK;
#else
    return hx_fail(SELDP_ERR_UNSUPPORTED, "cuda:%d: this build has no CUDA", ordinal);
#endif
}

hx_gpu_id hx_gpu_identity(int ordinal)
{
    hx_gpu_id id = {{0}};
#ifdef SELDP_HAVE_CUDA
    if (cudaDeviceGetPCIBusId(id.text, (int)sizeof id.text, ordinal) != cudaSuccess) {
        cudaGetLastError();
        id.text[0] = '\0';
    }
#else
    (void)ordinal;
#endif
    return id;
}

int hx_gpu_for_local_rank(int local_rank, int visible)
{
    if (visible <= 0 || local_rank < 0)
        return -1;
    return local_rank % visible;
}

bool hx_gpu_ids_distinct(const hx_gpu_id *ids, int n)
{
    for (int i = 0; i < n; i++) {
        if (!ids[i].text[0])
            return false;
        for (int j = 0; j < i; j++)
            if (strcmp(ids[i].text, ids[j].text) == 0)
                return false;
    }
    return true;
}

/* ---- a rank on a GPU --------------------------------------------------------------------- */

#ifdef SELDP_HAVE_CUDA

seldp_status hx_gpu_attach(hx_rank *rk)
{
    seldp_status st = tmc_model_create(rk->model, rk->device.ordinal, &rk->gpu);
    if (st != SELDP_OK)
        return hx_fail_lib(st, "rank %d: mirroring its model on cuda:%d", rk->rank,
                           rk->device.ordinal);
    return SELDP_OK;
}

void hx_gpu_detach(hx_rank *rk)
{
    tmc_model_destroy(rk->gpu);
    rk->gpu = NULL;
}

seldp_model *hx_gpu_view(hx_rank *rk)
{
    return tmc_model_view(rk->gpu);
}

const seldp_tensor *hx_gpu_param(const hx_rank *rk, const char *path)
{
    return tmc_param_tensor(rk->gpu, path);
}

seldp_status hx_gpu_download(hx_rank *rk)
{
    seldp_status st = tmc_download_params(rk->gpu, rk->model);
    if (st != SELDP_OK)
        return hx_fail_lib(st, "rank %d: copying its parameters from cuda:%d", rk->rank,
                           rk->device.ordinal);
    return SELDP_OK;
}

seldp_status hx_gpu_upload(hx_rank *rk)
{
    for (size_t i = 0; i < tm_param_count(rk->model); i++) {
        const tm_param_info *p = tm_param_at(rk->model, i);
        const seldp_tensor *storage = p->alias ? NULL : tmc_param_tensor(rk->gpu, p->path);
        if (!storage)
            continue;
        seldp_tensor dst = *storage;
        seldp_status st = seldp_tensor_copy(&dst, &p->tensor);
        if (st != SELDP_OK)
            return hx_fail_lib(st, "rank %d: copying %s to cuda:%d", rk->rank, p->path,
                               rk->device.ordinal);
    }
    return SELDP_OK;
}

static float *gpu_alloc(hx_rank *rk, size_t floats)
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
        hx_fail(SELDP_ERR_NOMEM, "rank %d: out of memory on cuda:%d allocating %zu floats",
                rk->rank, rk->device.ordinal, floats);
        return NULL;
    }
    return p;
}

static void gpu_release(hx_rank *rk, float *p)
{
    (void)rk;
    if (p)
        cudaFree(p);
}

static seldp_status gpu_copy_rows(hx_rank *rk, float *dst, const int64_t *dst_rows,
                                  const float *src, const int64_t *src_rows, size_t n)
{
    seldp_status st =
        tmc_copy_rows(rk->gpu, dst, dst_rows, src, src_rows, n, rk->run->opts.model.d_model);
    if (st != SELDP_OK)
        return hx_fail_lib(st, "rank %d: copying %zu rows on cuda:%d", rk->rank, n,
                           rk->device.ordinal);
    return SELDP_OK;
}

static seldp_status gpu_begin_step(hx_rank *rk)
{
    return tmc_begin_step(rk->gpu);
}

static seldp_status gpu_embed_forward(hx_rank *rk, float *h)
{
    return tmc_embed_forward(rk->gpu, rk->tokens, rk->T, h);
}

static seldp_status gpu_route_forward(hx_rank *rk, int l, const float *h, tm_route *route)
{
    tmc_route r;
    seldp_status st = tmc_route_forward(rk->gpu, l, h, &r);
    if (st == SELDP_OK)
        *route = (tm_route){.T = r.T, .K = r.K, .expert = r.expert, .gate = r.gate, .x = r.x};
    return st;
}

static seldp_status gpu_expert_forward(hx_rank *rk, int l, int e, const float *x, size_t n,
                                       float *y)
{
    return tmc_expert_forward(rk->gpu, l, e, x, n, y);
}

static seldp_status gpu_expert_backward(hx_rank *rk, int l, int e, const float *x, const float *dy,
                                        size_t n, float *dx)
{
    return tmc_expert_backward(rk->gpu, l, e, x, dy, n, dx);
}

static seldp_status gpu_combine_forward(hx_rank *rk, int l, const float *y, float *h)
{
    return tmc_combine_forward(rk->gpu, l, y, h);
}

static seldp_status gpu_combine_backward(hx_rank *rk, int l, const float *dh, float *dy)
{
    return tmc_combine_backward(rk->gpu, l, dh, dy);
}

static seldp_status gpu_route_backward(hx_rank *rk, int l, const float *dx, float *dh)
{
    return tmc_route_backward(rk->gpu, l, dx, dh);
}

static seldp_status gpu_head(hx_rank *rk, const float *h, double *loss_sum, float *dh)
{
    return tmc_head_forward_backward(rk->gpu, h, rk->targets, loss_sum, dh);
}

static seldp_status gpu_embed_backward(hx_rank *rk, const float *dh)
{
    return tmc_embed_backward(rk->gpu, dh);
}

static seldp_status gpu_export_grads(hx_rank *rk, unsigned roles, double scale, bool fp32,
                                     seldp_grads *out)
{
    return tmc_export_grads(rk->gpu, roles, scale, fp32, out);
}

static bool gpu_expert_seen(const hx_rank *rk, int l, int e)
{
    return tmc_expert_seen(rk->gpu, l, e);
}

const hx_compute_ops hx_gpu_compute = {
    .alloc = gpu_alloc,
    .release = gpu_release,
    .copy_rows = gpu_copy_rows,
    .begin_step = gpu_begin_step,
    .embed_forward = gpu_embed_forward,
    .route_forward = gpu_route_forward,
    .expert_forward = gpu_expert_forward,
    .expert_backward = gpu_expert_backward,
    .combine_forward = gpu_combine_forward,
    .combine_backward = gpu_combine_backward,
    .route_backward = gpu_route_backward,
    .head = gpu_head,
    .embed_backward = gpu_embed_backward,
    .export_grads = gpu_export_grads,
    .expert_seen = gpu_expert_seen,
};

#else /* no CUDA: no rank is ever placed on a GPU */

static seldp_status no_cuda(const hx_rank *rk)
{
    return hx_fail(SELDP_ERR_UNSUPPORTED, "rank %d: this build has no CUDA", rk->rank);
}

seldp_status hx_gpu_attach(hx_rank *rk)
{
    return no_cuda(rk);
}

void hx_gpu_detach(hx_rank *rk)
{
    rk->gpu = NULL;
}

seldp_model *hx_gpu_view(hx_rank *rk)
{
    (void)rk;
    return NULL;
}

const seldp_tensor *hx_gpu_param(const hx_rank *rk, const char *path)
{
    (void)rk;
    (void)path;
    return NULL;
}

seldp_status hx_gpu_download(hx_rank *rk)
{
    return no_cuda(rk);
}

seldp_status hx_gpu_upload(hx_rank *rk)
{
    return no_cuda(rk);
}

const hx_compute_ops hx_gpu_compute = {0};

#endif
