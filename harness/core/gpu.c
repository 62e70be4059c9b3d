/* CUDA devices for the harness (gpu.h); a rank that computes on one is run/gpu_rank.c. */
#include "gpu.h"

#include <string.h>

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
