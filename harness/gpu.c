/* CUDA devices for the harness (gpu.h). */
#include "gpu.h"

#ifdef SELDP_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

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
