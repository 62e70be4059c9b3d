/* Memory on host and CUDA devices; the only file that calls the CUDA runtime for
 * plain allocation and copies. */
#include <stdlib.h>
#include <string.h>

#include "device.h"
#include "internal.h"

#ifdef SELDP_HAVE_CUDA
#include <cuda_runtime_api.h>

static seldp_status cuda_fail(cudaError_t err, const char *what, seldp_device device)
{
    return seldp__fail(SELDP_ERR_TRANSPORT, "%s on cuda:%d failed: %s", what, device.ordinal,
                       cudaGetErrorString(err));
}

/* Run a CUDA call with `device` current, restoring the caller's device afterwards. */
#define WITH_DEVICE(device, call, what)                                                            \
    do {                                                                                           \
        int prev_ = 0;                                                                             \
        cudaError_t err_ = cudaGetDevice(&prev_);                                                  \
        if (err_ == cudaSuccess && prev_ != (device).ordinal)                                      \
            err_ = cudaSetDevice((device).ordinal);                                                \
        if (err_ == cudaSuccess)                                                                   \
            err_ = (call);                                                                         \
        if (prev_ != (device).ordinal)                                                             \
            cudaSetDevice(prev_);                                                                  \
        if (err_ != cudaSuccess)                                                                   \
            return cuda_fail(err_, what, device);                                                  \
    } while (0)
#endif

bool seldp__device_equal(seldp_device a, seldp_device b)
{
    if (a.kind != b.kind)
        return false;
    return a.kind == SELDP_DEVICE_HOST || a.ordinal == b.ordinal;
}

int seldp__cuda_device_count(void)
{
#ifdef SELDP_HAVE_CUDA
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return n;
#else
    return 0;
#endif
}

seldp_status seldp__device_alloc(seldp_device device, size_t bytes, void **out)
{
    size_t n = bytes ? bytes : 1;
    if (device.kind == SELDP_DEVICE_HOST) {
        *out = calloc(1, n);
        if (!*out)
            return seldp__fail(SELDP_ERR_NOMEM, "out of host memory allocating %zu bytes", bytes);
        return SELDP_OK;
    }
#ifdef SELDP_HAVE_CUDA
    void *p = NULL;
    WITH_DEVICE(device, cudaMalloc(&p, n), "cudaMalloc");
    WITH_DEVICE(device, cudaMemset(p, 0, n), "cudaMemset");
    *out = p;
    return SELDP_OK;
#else
    return seldp__fail(SELDP_ERR_UNSUPPORTED,
                       "cuda:%d memory requested but seldp was built "
                       "without CUDA",
                       device.ordinal);
#endif
}

void seldp__device_free(seldp_device device, void *ptr)
{
    if (!ptr)
        return;
    if (device.kind == SELDP_DEVICE_HOST) {
        free(ptr);
        return;
    }
#ifdef SELDP_HAVE_CUDA
    cudaFree(ptr);
#endif
}

seldp_status seldp__device_copy(void *dst, seldp_device dst_device, const void *src,
                                seldp_device src_device, size_t bytes)
{
    if (bytes == 0 || dst == src)
        return SELDP_OK;
    if (dst_device.kind == SELDP_DEVICE_HOST && src_device.kind == SELDP_DEVICE_HOST) {
        memcpy(dst, src, bytes);
        return SELDP_OK;
    }
#ifdef SELDP_HAVE_CUDA
    seldp_device dev = dst_device.kind == SELDP_DEVICE_CUDA ? dst_device : src_device;
    WITH_DEVICE(dev, cudaMemcpy(dst, src, bytes, cudaMemcpyDefault), "cudaMemcpy");
    return SELDP_OK;
#else
    return seldp__fail(SELDP_ERR_UNSUPPORTED, "device copy requested but seldp was built "
                                              "without CUDA");
#endif
}

seldp_status seldp__device_zero(seldp_device device, void *ptr, size_t bytes)
{
    if (bytes == 0)
        return SELDP_OK;
    if (device.kind == SELDP_DEVICE_HOST) {
        memset(ptr, 0, bytes);
        return SELDP_OK;
    }
#ifdef SELDP_HAVE_CUDA
    WITH_DEVICE(device, cudaMemset(ptr, 0, bytes), "cudaMemset");
    return SELDP_OK;
#else
    return seldp__fail(SELDP_ERR_UNSUPPORTED, "cuda:%d memory but seldp was built without CUDA",
                       device.ordinal);
#endif
}

seldp_status seldp__pinned_alloc(size_t bytes, void **out)
{
    size_t n = bytes ? bytes : 1;
#ifdef SELDP_HAVE_CUDA
    if (seldp__cuda_device_count() > 0) {
        cudaError_t err = cudaMallocHost(out, n);
        if (err == cudaSuccess)
            return SELDP_OK;
        cudaGetLastError();
    }
#endif
    *out = malloc(n);
    if (!*out)
        return seldp__fail(SELDP_ERR_NOMEM, "out of host memory allocating %zu staging bytes",
                           bytes);
    return SELDP_OK;
}

void seldp__pinned_free(void *ptr)
{
    if (!ptr)
        return;
#ifdef SELDP_HAVE_CUDA
    struct cudaPointerAttributes attr;
    if (cudaPointerGetAttributes(&attr, ptr) == cudaSuccess && attr.type == cudaMemoryTypeHost) {
        cudaFreeHost(ptr);
        return;
    }
    cudaGetLastError();
#endif
    free(ptr);
}
