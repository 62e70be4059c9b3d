/* A rank that computes on a GPU (gpu_rank.h): the device mirror of the rank's model
 * (models/cuda/tinymoe_cuda.h), whose tm_compute_ops (tmc_compute) dispatch.c drives. */
#include "gpu_rank.h"

#ifdef SELDP_HAVE_CUDA
#include "cuda/tinymoe_cuda.h"
#endif

#include "rank.h"
#include "util.h"

#ifdef SELDP_HAVE_CUDA

seldp_status hx_gpu_attach(hx_rank *rk)
{
    seldp_status st = tmc_model_create(rk->model, rk->device.ordinal, &rk->gpu);
    if (st != SELDP_OK)
        return hx_fail_lib(st, "rank %d: mirroring its model on cuda:%d", rk->rank,
                           rk->device.ordinal);
    rk->ops = &tmc_compute;
    rk->compute = rk->gpu;
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

seldp_status hx_gpu_local_grad(const hx_rank *rk, const tm_param_info *p, float *out)
{
    const float *g = tmc_param_grad(rk->gpu, p->path);
    if (!g)
        return hx_fail(SELDP_ERR_NOT_FOUND, "rank %d: no gradient of %s on cuda:%d", rk->rank,
                       p->path, rk->device.ordinal);
    seldp_tensor from = p->tensor, to = p->tensor;
    from.dtype = to.dtype = SELDP_F32;
    from.device = rk->device;
    from.data = (void *)g;
    to.device = SELDP_HOST_DEVICE;
    to.data = out;
    seldp_status st = seldp_tensor_copy(&to, &from);
    if (st != SELDP_OK)
        return hx_fail_lib(st, "rank %d: copying the gradient of %s from cuda:%d", rk->rank,
                           p->path, rk->device.ordinal);
    return SELDP_OK;
}

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

seldp_status hx_gpu_local_grad(const hx_rank *rk, const tm_param_info *p, float *out)
{
    (void)p;
    (void)out;
    return no_cuda(rk);
}

#endif
