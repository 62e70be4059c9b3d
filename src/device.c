/* Memory on host and CUDA devices; the only file that calls the CUDA runtime for
 * plain allocation and copies. Device work runs on the calling thread's per-thread default
 * stream and is waited for before returning (the stream contract of device.h). */
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device.h"
#include "internal.h"

#ifdef SELDP_HAVE_CUDA
static cudaError_t real_stream_create(cudaStream_t *stream, unsigned flags)
{
    return cudaStreamCreateWithFlags(stream, flags);
}

static const seldp__cuda_api cuda_runtime = {
    .get_device = cudaGetDevice,
    .set_device = cudaSetDevice,
    .get_device_count = cudaGetDeviceCount,
    .malloc = cudaMalloc,
    .free = cudaFree,
    .memset_async = cudaMemsetAsync,
    .memcpy_async = cudaMemcpyAsync,
    .stream_synchronize = cudaStreamSynchronize,
    .stream_query = cudaStreamQuery,
    .stream_create = real_stream_create,
    .stream_destroy = cudaStreamDestroy,
    .malloc_host = cudaMallocHost,
    .free_host = cudaFreeHost,
    .pointer_attributes = cudaPointerGetAttributes,
    .get_last_error = cudaGetLastError,
    .launch_kernel = cudaLaunchKernel,
};

static const seldp__cuda_api *cuda_api = &cuda_runtime;

const seldp__cuda_api *seldp__cuda(void)
{
    return cuda_api;
}

const seldp__cuda_api *seldp__cuda_replace(const seldp__cuda_api *api)
{
    const seldp__cuda_api *prev = cuda_api;
    cuda_api = api ? api : &cuda_runtime;
    return prev;
}

void seldp__cuda_ignore(cudaError_t err)
{
    if (err != cudaSuccess)
        cuda_api->get_last_error();
}

static seldp_status cuda_fail(cudaError_t err, const char *what, seldp_device device)
{
    seldp__cuda_ignore(err); /* clear a non-sticky error for the next call */
    return seldp__fail(SELDP_ERR_TRANSPORT, "%s on cuda:%d failed: %s", what, device.ordinal,
                       cudaGetErrorString(err));
}

/* Make `device` current; *prev receives the caller's device to restore, or -1. */
static cudaError_t enter_device(seldp_device device, int *prev)
{
    int cur = -1;
    *prev = -1;
    cudaError_t err = cuda_api->get_device(&cur);
    if (err == cudaSuccess && cur != device.ordinal) {
        err = cuda_api->set_device(device.ordinal);
        if (err == cudaSuccess)
            *prev = cur;
    }
    return err;
}

static void leave_device(int prev)
{
    if (prev >= 0)
        seldp__cuda_ignore(cuda_api->set_device(prev));
}

/* Wait for what this thread queued on its per-thread stream: the point where a copy or a
 * memset becomes visible to every other stream. */
static cudaError_t drain(cudaError_t err)
{
    if (err == cudaSuccess)
        err = cuda_api->stream_synchronize(cudaStreamPerThread);
    return err;
}
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
    cudaError_t err = cuda_api->get_device_count(&n);
    seldp__cuda_ignore(err);
    return err == cudaSuccess ? n : 0;
#else
    return 0;
#endif
}

seldp_status seldp__device_alloc(seldp_device device, size_t bytes, void **out)
{
    size_t n = bytes ? bytes : 1;
    *out = NULL;
    if (device.kind == SELDP_DEVICE_HOST) {
        *out = calloc(1, n);
        if (!*out)
            return seldp__fail(SELDP_ERR_NOMEM, "out of host memory allocating %zu bytes", bytes);
        return SELDP_OK;
    }
#ifdef SELDP_HAVE_CUDA
    void *p = NULL;
    int prev;
    const char *what = "cudaSetDevice";
    cudaError_t err = enter_device(device, &prev);
    if (err == cudaSuccess) {
        what = "cudaMalloc";
        err = cuda_api->malloc(&p, n);
        if (err != cudaSuccess)
            p = NULL;
    }
    if (err == cudaSuccess) {
        what = "cudaMemsetAsync (zeroing a new allocation)";
        err = drain(cuda_api->memset_async(p, 0, n, cudaStreamPerThread));
    }
    if (err != cudaSuccess && p)
        seldp__cuda_ignore(cuda_api->free(p));
    leave_device(prev);
    if (err != cudaSuccess)
        return cuda_fail(err, what, device);
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
    /* on its own device: cudaFree with another device current would create a context there
     * and wait for that device */
    int prev;
    cudaError_t err = enter_device(device, &prev);
    if (err == cudaSuccess)
        err = cuda_api->free(ptr);
    seldp__cuda_ignore(err);
    leave_device(prev);
#endif
}

seldp_status seldp__device_check_aligned(const seldp_tensor *t, const char *what)
{
    size_t esize = seldp_dtype_size(t->dtype);
    if (t->device.kind != SELDP_DEVICE_CUDA || esize <= 1 || !t->data ||
        (uintptr_t)t->data % esize == 0)
        return SELDP_OK;
    return seldp__fail(SELDP_ERR_INVALID_ARGUMENT,
                       "'%s': its %s data on cuda:%d at %p is not aligned to its element size "
                       "(%zu bytes): the CUDA kernels and NCCL read whole elements, expected an "
                       "address that is a multiple of %zu",
                       what, seldp_dtype_name(t->dtype), t->device.ordinal, t->data, esize, esize);
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
    int prev;
    cudaError_t err = enter_device(dev, &prev);
    if (err == cudaSuccess)
        err =
            drain(cuda_api->memcpy_async(dst, src, bytes, cudaMemcpyDefault, cudaStreamPerThread));
    leave_device(prev);
    if (err != cudaSuccess)
        return cuda_fail(err, "cudaMemcpyAsync", dev);
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
    int prev;
    cudaError_t err = enter_device(device, &prev);
    if (err == cudaSuccess)
        err = drain(cuda_api->memset_async(ptr, 0, bytes, cudaStreamPerThread));
    leave_device(prev);
    if (err != cudaSuccess)
        return cuda_fail(err, "cudaMemsetAsync", device);
    return SELDP_OK;
#else
    return seldp__fail(SELDP_ERR_UNSUPPORTED, "cuda:%d memory but seldp was built without CUDA",
                       device.ordinal);
#endif
}

#ifdef SELDP_HAVE_CUDA
/* Whether this process has ever been given page-locked memory: until then every staging
 * buffer is plain malloc and freeing one asks the CUDA runtime nothing. */
static atomic_bool pinned_ever;
#endif

seldp_status seldp__pinned_alloc(seldp_device device, size_t bytes, void **out)
{
    size_t n = bytes ? bytes : 1;
#ifdef SELDP_HAVE_CUDA
    if (device.kind == SELDP_DEVICE_CUDA && seldp__cuda_device_count() > 0) {
        cudaError_t err = cuda_api->malloc_host(out, n);
        if (err == cudaSuccess) {
            atomic_store(&pinned_ever, true);
            return SELDP_OK;
        }
        seldp__cuda_ignore(err); /* plain memory works, only slower to copy */
    }
#else
    (void)device;
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
    if (atomic_load(&pinned_ever)) {
        struct cudaPointerAttributes attr;
        cudaError_t err = cuda_api->pointer_attributes(&attr, ptr);
        if (err == cudaSuccess && attr.type == cudaMemoryTypeHost) {
            seldp__cuda_ignore(cuda_api->free_host(ptr));
            return;
        }
        seldp__cuda_ignore(err);
    }
#endif
    free(ptr);
}

/* ---- retired allocations ---- */

typedef struct seldp__retired_block {
    struct seldp__retired_block *next;
    bool pinned; /* else on `device` */
    seldp_device device;
    void *ptr;
    size_t bytes;
} seldp__retired_block;

static void block_free(const seldp__retired_block *k)
{
    if (k->pinned)
        seldp__pinned_free(k->ptr);
    else
        seldp__device_free(k->device, k->ptr);
}

/* Keep an allocation in r, or free it now when r is NULL (or no list node can be had: freeing
 * at once is then the lesser harm than leaking). */
static void retire(seldp__retired *r, bool pinned, seldp_device device, void *ptr, size_t bytes)
{
    seldp__retired_block k = {NULL, pinned, device, ptr, bytes};
    if (!ptr)
        return;
    seldp__retired_block *node = r ? malloc(sizeof *node) : NULL;
    if (!node) {
        block_free(&k);
        return;
    }
    *node = k;
    node->next = r->head;
    r->head = node;
    r->blocks++;
    r->bytes += bytes;
}

void seldp__retired_free(seldp__retired *r)
{
    seldp__retired_block *k = r->head;
    while (k) {
        seldp__retired_block *next = k->next;
        block_free(k);
        free(k);
        k = next;
    }
    memset(r, 0, sizeof *r);
}

void seldp__retired_move(seldp__retired *into, seldp__retired *from)
{
    if (!from->head)
        return;
    seldp__retired_block *tail = from->head;
    while (tail->next)
        tail = tail->next;
    tail->next = into->head;
    into->head = from->head;
    into->blocks += from->blocks;
    into->bytes += from->bytes;
    memset(from, 0, sizeof *from);
}

/* What a buffer grows to: the request, or a quarter more than it held when that is more
 * (a slowly growing need does not reallocate every call), or twice what it held for a buffer
 * that retires its old allocations, in whole 4 KiB pages. */
static size_t grown_size(size_t held, size_t want, bool retiring)
{
    size_t more = retiring ? held * 2 : held + held / 4;
    size_t n = more > want ? more : want;
    return n > SIZE_MAX - 4095 ? n : (n + 4095) & ~(size_t)4095;
}

seldp_status seldp__device_reserve(seldp__device_buffer *b, seldp_device device, size_t bytes)
{
    if (b->ptr && b->bytes >= bytes && seldp__device_equal(b->device, device))
        return SELDP_OK;
    bool same = b->ptr && seldp__device_equal(b->device, device);
    size_t n = grown_size(same ? b->bytes : 0, bytes, b->retire != NULL);
    seldp__device_retire(b, b->retire);
    seldp_status st = seldp__device_alloc(device, n, &b->ptr);
    if (st != SELDP_OK)
        return st;
    b->device = device;
    b->bytes = n;
    return SELDP_OK;
}

void seldp__device_release(seldp__device_buffer *b)
{
    seldp__device_retire(b, NULL);
}

void seldp__device_retire(seldp__device_buffer *b, seldp__retired *into)
{
    retire(into, false, b->device, b->ptr, b->bytes);
    b->ptr = NULL;
    b->bytes = 0;
}

seldp_status seldp__pinned_reserve(seldp__pinned_buffer *b, seldp_device device, size_t bytes)
{
    if (b->ptr && b->bytes >= bytes)
        return SELDP_OK;
    size_t n = grown_size(b->ptr ? b->bytes : 0, bytes, b->retire != NULL);
    seldp__pinned_retire(b, b->retire);
    seldp_status st = seldp__pinned_alloc(device, n, &b->ptr);
    if (st != SELDP_OK)
        return st;
    b->bytes = n;
    return SELDP_OK;
}

void seldp__pinned_release(seldp__pinned_buffer *b)
{
    seldp__pinned_retire(b, NULL);
}

void seldp__pinned_retire(seldp__pinned_buffer *b, seldp__retired *into)
{
    retire(into, true, SELDP_HOST_DEVICE, b->ptr, b->bytes);
    b->ptr = NULL;
    b->bytes = 0;
}
