/* A scripted CUDA runtime for the unit tests that need no GPU (seldp__cuda_replace): one
 * device whose "device" memory is host memory, copies and memsets done at once, every call
 * successful, kernels not run. A test takes the table and replaces the entries it counts or
 * breaks. */
#ifndef SELDP_TEST_FAKE_CUDA_H
#define SELDP_TEST_FAKE_CUDA_H

#include "device.h"

/* The table: get_device 0 (set_device accepts any), one device, malloc/malloc_host with libc,
 * free/free_host, memset_async, memcpy_async (memmove), stream_synchronize, stream_query
 * (done), stream_create (a distinct non-NULL handle) and stream_destroy, pointer_attributes
 * (host memory, so that a pinned free goes to free_host), get_last_error, and launch_kernel
 * (nothing run, success). */
seldp__cuda_api fake_cuda_api(void);

#endif
