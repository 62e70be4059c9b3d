/* The scripted CUDA runtime of fake_cuda.h. */
#include <stdlib.h>
#include <string.h>

#include "fake_cuda.h"

static cudaError_t get_device(int *ordinal)
{
    *ordinal = 0;
    return cudaSuccess;
}

static cudaError_t set_device(int ordinal)
{
    (void)ordinal;
    return cudaSuccess;
}

static cudaError_t device_count(int *n)
{
    *n = 1;
    return cudaSuccess;
}

static cudaError_t host_malloc(void **p, size_t bytes)
{
    *p = malloc(bytes ? bytes : 1);
    return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}

static cudaError_t host_free(void *p)
{
    free(p);
    return cudaSuccess;
}

static cudaError_t memset_now(void *p, int v, size_t bytes, cudaStream_t s)
{
    (void)s;
    memset(p, v, bytes);
    return cudaSuccess;
}

static cudaError_t memcpy_now(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind,
                              cudaStream_t s)
{
    (void)kind;
    (void)s;
    memmove(dst, src, bytes);
    return cudaSuccess;
}

static cudaError_t synchronize(cudaStream_t s)
{
    (void)s;
    return cudaSuccess;
}

static cudaError_t stream_done(cudaStream_t s)
{
    (void)s;
    return cudaSuccess;
}

static char stream_handles[64];
static unsigned streams_made;

static cudaError_t stream_create(cudaStream_t *s, unsigned flags)
{
    (void)flags;
    *s = (cudaStream_t)(void *)&stream_handles[streams_made++ % sizeof stream_handles];
    return cudaSuccess;
}

static cudaError_t stream_destroy(cudaStream_t s)
{
    (void)s;
    return cudaSuccess;
}

static cudaError_t launch_nothing(const void *func, dim3 grid, dim3 block, void **args,
                                  size_t shared_bytes, cudaStream_t s)
{
    (void)func;
    (void)grid;
    (void)block;
    (void)args;
    (void)shared_bytes;
    (void)s;
    return cudaSuccess;
}

static cudaError_t attributes(struct cudaPointerAttributes *attr, const void *p)
{
    (void)p;
    memset(attr, 0, sizeof *attr);
    attr->type = cudaMemoryTypeHost;
    return cudaSuccess;
}

static cudaError_t last_error(void)
{
    return cudaSuccess;
}

seldp__cuda_api fake_cuda_api(void)
{
    return (seldp__cuda_api){
        .get_device = get_device,
        .set_device = set_device,
        .get_device_count = device_count,
        .malloc = host_malloc,
        .free = host_free,
        .memset_async = memset_now,
        .memcpy_async = memcpy_now,
        .stream_synchronize = synchronize,
        .stream_query = stream_done,
        .stream_create = stream_create,
        .stream_destroy = stream_destroy,
        .launch_kernel = launch_nothing,
        .malloc_host = host_malloc,
        .free_host = host_free,
        .pointer_attributes = attributes,
        .get_last_error = last_error,
    };
}
