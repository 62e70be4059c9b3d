/* Memory on a seldp_device: the host, or a CUDA device when built with CUDA.
 * Every transport and the session allocate and copy through these, so that the
 * CUDA runtime is touched in one place. */
#ifndef SELDP_DEVICE_H
#define SELDP_DEVICE_H

#include <stdbool.h>
#include <stddef.h>

#include "seldp/tensor.h"

/* Zeroed allocation of `bytes` on `device` (bytes == 0 gives a valid unique pointer).
 * SELDP_ERR_UNSUPPORTED for CUDA in a build without CUDA. */
seldp_status seldp__device_alloc(seldp_device device, size_t bytes, void **out);
void seldp__device_free(seldp_device device, void *ptr);

/* Copy `bytes` between any two devices (host<->host is memcpy). Synchronous. */
seldp_status seldp__device_copy(void *dst, seldp_device dst_device, const void *src,
                                seldp_device src_device, size_t bytes);

/* Set `bytes` bytes at ptr on `device` to zero. */
seldp_status seldp__device_zero(seldp_device device, void *ptr, size_t bytes);

/* Page-locked host memory for staging device transfers (plain malloc without CUDA). */
seldp_status seldp__pinned_alloc(size_t bytes, void **out);
void seldp__pinned_free(void *ptr);

/* True for two descriptors naming the same device. */
bool seldp__device_equal(seldp_device a, seldp_device b);

/* Number of CUDA devices usable by this process (0 without CUDA or without a GPU). */
int seldp__cuda_device_count(void);

#endif
