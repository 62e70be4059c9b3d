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
/* Free an allocation of seldp__device_alloc, on the device it was made on (the caller's
 * current device is restored). NULL is a no-op. */
void seldp__device_free(seldp_device device, void *ptr);

/* A tensor the CUDA kernels and NCCL can read: SELDP_OK for host tensors, and for device
 * tensors whose data pointer is a multiple of the element size; otherwise
 * SELDP_ERR_INVALID_ARGUMENT, the message naming `what` (the parameter's path). */
seldp_status seldp__device_check_aligned(const seldp_tensor *t, const char *what);

/* Copy `bytes` between any two devices (host<->host is memcpy). Complete on return (see
 * the stream contract above), also for device-to-device copies and pageable host memory. */
seldp_status seldp__device_copy(void *dst, seldp_device dst_device, const void *src,
                                seldp_device src_device, size_t bytes);

/* Set `bytes` bytes at ptr on `device` to zero; complete on return. */
seldp_status seldp__device_zero(seldp_device device, void *ptr, size_t bytes);

/* Host memory for staging transfers with `device`: page-locked (cudaMallocHost) when
 * `device` is a CUDA device and the runtime gives it, plain malloc otherwise, so that a
 * communicator on the host never touches the CUDA runtime (no context on GPU 0 in every
 * process). On failure *out is NULL. */
seldp_status seldp__pinned_alloc(seldp_device device, size_t bytes, void **out);
/* Free what seldp__pinned_alloc returned; asks the CUDA runtime only in a process that has
 * pinned memory. NULL is a no-op. */
void seldp__pinned_free(void *ptr);

/* Allocations a growing buffer gave up, kept until their owner frees them all where no peer
 * can be inside a kernel that waits for this rank (an NCCL communicator's destroy): cudaFree
 * and cudaFreeHost synchronize the device, and with peer access the peers' devices, so a rank
 * freeing while a peer sits in an NCCL kernel waiting for it deadlocks. Start from {0}. */
typedef struct seldp__retired {
    struct seldp__retired_block *head;
    size_t blocks, bytes;
} seldp__retired;

/* Free every block of r (device blocks on their device); r is empty afterwards. */
void seldp__retired_free(seldp__retired *r);
/* Move every block of `from` into `into` (from is empty afterwards). */
void seldp__retired_move(seldp__retired *into, seldp__retired *from);

/* A buffer kept across calls (by a communicator, a session) and grown when a call needs
 * more, so that calls of the same size allocate nothing. Growing does not keep the contents;
 * a new allocation is zeroed. The old allocation is freed first, or, with `retire` set, kept
 * in that list and freed with it (the buffer then at least doubles when it grows, so what is
 * retired stays below what it holds). Start from {0}. */
typedef struct seldp__device_buffer {
    seldp_device device;
    void *ptr;
    size_t bytes;
    seldp__retired *retire;
} seldp__device_buffer;

/* At least `bytes` on `device` in b (a buffer on another device is replaced). On failure b
 * holds nothing. */
seldp_status seldp__device_reserve(seldp__device_buffer *b, seldp_device device, size_t bytes);
/* Free what b holds now (at its owner's destroy); b->retire is not touched. */
void seldp__device_release(seldp__device_buffer *b);
/* Hand what b holds to `into` instead of freeing it (into NULL: free it); b is empty after. */
void seldp__device_retire(seldp__device_buffer *b, seldp__retired *into);

/* The same for staging host memory of `device` (seldp__pinned_alloc). */
typedef struct seldp__pinned_buffer {
    void *ptr;
    size_t bytes;
    seldp__retired *retire;
} seldp__pinned_buffer;

seldp_status seldp__pinned_reserve(seldp__pinned_buffer *b, seldp_device device, size_t bytes);
void seldp__pinned_release(seldp__pinned_buffer *b);
void seldp__pinned_retire(seldp__pinned_buffer *b, seldp__retired *into);

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
    cudaError_t (*stream_query)(cudaStream_t stream);
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

/* The one way to drop the result of a CUDA call made deliberately without a check (a cleanup,
 * restoring the caller's device, a probe that may fail): a non-sticky error is also cleared
 * from the thread's last error, so that the next checked call does not report it. */
void seldp__cuda_ignore(cudaError_t err);
#endif

#endif
