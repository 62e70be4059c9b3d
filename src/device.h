/* Memory on a seldp_device: the host, or a CUDA device when built with CUDA.
 * Every transport and the session allocate and copy through these, so that the
 * CUDA runtime is touched in one place.
 *
 * Stream contract. Every call below that touches a CUDA device issues its work on the
 * calling thread's per-thread default stream (cudaStreamPerThread) and waits for that
 * stream before it returns: when it returns SELDP_OK the memory is allocated, zeroed or
 * copied, and any stream of any thread (NCCL's, a model's, the caller's) may read it.
 * Nothing here waits for work queued on other streams: a buffer written by a kernel on
 * another stream must be complete (that stream synchronized) before it is passed in. The
 * CUDA element-wise kernels (src/cuda/) keep the same contract. */
#ifndef SELDP_DEVICE_H
#define SELDP_DEVICE_H

#include <stdbool.h>
#include <stddef.h>

#include "seldp/tensor.h"

#ifdef SELDP_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

/* Zeroed allocation of `bytes` on `device` (bytes == 0 gives a valid unique pointer).
 * SELDP_ERR_UNSUPPORTED for CUDA in a build without CUDA. On failure nothing stays
 * allocated and *out is NULL. */
seldp_status seldp__device_alloc(seldp_device device, size_t bytes, void **out);
void seldp__device_free(seldp_device device, void *ptr);

/* Copy `bytes` between any two devices (host<->host is memcpy). Complete on return (see
 * the stream contract above), also for device-to-device copies and pageable host memory. */
seldp_status seldp__device_copy(void *dst, seldp_device dst_device, const void *src,
                                seldp_device src_device, size_t bytes);

/* Set `bytes` bytes at ptr on `device` to zero; complete on return. */
seldp_status seldp__device_zero(seldp_device device, void *ptr, size_t bytes);

/* Page-locked host memory for staging device transfers (plain malloc without CUDA). */
seldp_status seldp__pinned_alloc(size_t bytes, void **out);
void seldp__pinned_free(void *ptr);

/* A buffer kept across calls (by a communicator, a session) and grown when a call needs
 * more, so that calls of the same size allocate nothing. Growing frees the old allocation
 * first and does not keep its contents; a new allocation is zeroed. Start from {0}. */
typedef struct seldp__device_buffer {
    seldp_device device;
    void *ptr;
    size_t bytes;
} seldp__device_buffer;

/* At least `bytes` on `device` in b (a buffer on another device is replaced). On failure b
 * holds nothing. */
seldp_status seldp__device_reserve(seldp__device_buffer *b, seldp_device device, size_t bytes);
void seldp__device_release(seldp__device_buffer *b);

/* The same for page-locked host memory (seldp__pinned_alloc). */
typedef struct seldp__pinned_buffer {
    void *ptr;
    size_t bytes;
} seldp__pinned_buffer;

seldp_status seldp__pinned_reserve(seldp__pinned_buffer *b, size_t bytes);
void seldp__pinned_release(seldp__pinned_buffer *b);

/* True for two descriptors naming the same device. */
bool seldp__device_equal(seldp_device a, seldp_device b);

/* Number of CUDA devices usable by this process (0 without CUDA or without a GPU). */
int seldp__cuda_device_count(void);

#ifdef SELDP_HAVE_CUDA
/* The CUDA runtime calls behind this file and the NCCL transport's stream handling, as a
 * table that a unit test may replace to run the device logic without a device. */
typedef struct seldp__cuda_api {
    cudaError_t (*get_device)(int *ordinal);
    cudaError_t (*set_device)(int ordinal);
    cudaError_t (*get_device_count)(int *count);
    cudaError_t (*malloc)(void **ptr, size_t bytes);
    cudaError_t (*free)(void *ptr);
    cudaError_t (*memset_async)(void *ptr, int value, size_t bytes, cudaStream_t stream);
    cudaError_t (*memcpy_async)(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind,
                                cudaStream_t stream);
    cudaError_t (*stream_synchronize)(cudaStream_t stream);
    cudaError_t (*stream_create)(cudaStream_t *stream, unsigned flags);
    cudaError_t (*stream_destroy)(cudaStream_t stream);
    cudaError_t (*malloc_host)(void **ptr, size_t bytes);
    cudaError_t (*free_host)(void *ptr);
    cudaError_t (*pointer_attributes)(struct cudaPointerAttributes *attr, const void *ptr);
    cudaError_t (*get_last_error)(void);
    /* cudaLaunchKernel: the kernels of src/cuda/ that run on descriptions kept across calls
     * (seldp__cuda_convert_async) launch through it, so that a test can count them */
    cudaError_t (*launch_kernel)(const void *func, dim3 grid, dim3 block, void **args,
                                 size_t shared_bytes, cudaStream_t stream);
} seldp__cuda_api;

/* The table in use (the CUDA runtime's unless replaced). */
const seldp__cuda_api *seldp__cuda(void);

/* Replace the table (NULL restores the CUDA runtime's) and return the previous one. For
 * tests: call it while no other thread uses the library. */
const seldp__cuda_api *seldp__cuda_replace(const seldp__cuda_api *api);
#endif

#endif
