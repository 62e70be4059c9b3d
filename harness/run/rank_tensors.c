/* A rank's tensors where it computes (rank_tensors.h): the storage of a parameter (the GPU
 * mirror's on a GPU rank) and the hash of a tensor's bytes on the host or a GPU (hx_bytes_hash). */
#include "rank_tensors.h"

#include "gpu_rank.h"
#include "rank.h"
#include "util.h"

/* The storage of parameter p where the rank computes (the device mirror's on a GPU). */
const seldp_tensor *hx_param_storage(const hx_rank *rk, const tm_param_info *p)
{
    return rk->gpu ? hx_gpu_param(rk, p->path) : &p->tensor;
}

/* Checksum of a tensor's bytes on the host or a GPU (read through a host copy). */
seldp_status hx_tensor_checksum(const hx_rank *rk, const seldp_tensor *t, uint64_t *sum)
{
    if (!t)
        return hx_fail(SELDP_ERR_INTERNAL, "rank %d: a parameter without device storage", rk->rank);
    if (t->device.kind == SELDP_DEVICE_HOST) {
        *sum = hx_bytes_hash(t->data, seldp_tensor_nbytes(t));
        return SELDP_OK;
    }
    seldp_tensor copy = *t;
    copy.device = SELDP_HOST_DEVICE;
    copy.data = NULL;
    seldp_status st = seldp_tensor_alloc(&copy);
    if (st == SELDP_OK)
        st = seldp_tensor_copy(&copy, t);
    if (st == SELDP_OK)
        *sum = hx_bytes_hash(copy.data, seldp_tensor_nbytes(&copy));
    seldp_tensor_free(&copy);
    if (st != SELDP_OK)
        return hx_fail_lib(st, "rank %d: reading a tensor on cuda:%d", rk->rank, t->device.ordinal);
    return SELDP_OK;
}
