/* Tensor descriptors: sizes, validation, and storage seldp allocates itself. */
#include <stdio.h>
#include <string.h>

#include "device.h"
#include "internal.h"
#include "seldp/tensor.h"

seldp_tensor seldp_tensor_view(seldp_dtype dtype, seldp_device device, void *data, int ndim,
                               const int64_t *shape)
{
    seldp_tensor t;
    memset(&t, 0, sizeof t);
    t.dtype = dtype;
    t.device = device;
    t.data = data;
    t.ndim = ndim;
    for (int i = 0; i < ndim && i < SELDP_MAX_DIMS; i++)
        t.shape[i] = shape ? shape[i] : 0;
    return t;
}

size_t seldp_tensor_numel(const seldp_tensor *t)
{
    size_t n = 1;
    for (int i = 0; i < t->ndim && i < SELDP_MAX_DIMS; i++)
        n *= t->shape[i] > 0 ? (size_t)t->shape[i] : 0;
    return n;
}

size_t seldp_tensor_nbytes(const seldp_tensor *t)
{
    return seldp_tensor_numel(t) * seldp_dtype_size(t->dtype);
}

bool seldp_tensor_same_layout(const seldp_tensor *a, const seldp_tensor *b)
{
    if (a->dtype != b->dtype || a->ndim != b->ndim)
        return false;
    for (int i = 0; i < a->ndim && i < SELDP_MAX_DIMS; i++)
        if (a->shape[i] != b->shape[i])
            return false;
    return true;
}

seldp_status seldp_tensor_check(const seldp_tensor *t, const char *what)
{
    if (!what)
        what = "tensor";
    if (!t)
        return seldp__fail(SELDP_ERR_INVALID_ARGUMENT, "%s: tensor descriptor is NULL", what);
    if (!seldp_dtype_valid(t->dtype))
        return seldp__fail(SELDP_ERR_INVALID_ARGUMENT, "%s: invalid dtype %d", what, (int)t->dtype);
    if (t->ndim < 0 || t->ndim > SELDP_MAX_DIMS)
        return seldp__fail(SELDP_ERR_INVALID_ARGUMENT, "%s: ndim %d outside 0..%d", what, t->ndim,
                           SELDP_MAX_DIMS);
    if (t->device.kind != SELDP_DEVICE_HOST && t->device.kind != SELDP_DEVICE_CUDA)
        return seldp__fail(SELDP_ERR_INVALID_ARGUMENT, "%s: invalid device kind %d", what,
                           (int)t->device.kind);
    if (t->device.kind == SELDP_DEVICE_CUDA && t->device.ordinal < 0)
        return seldp__fail(SELDP_ERR_INVALID_ARGUMENT, "%s: negative CUDA ordinal %d", what,
                           t->device.ordinal);
    bool empty = false;
    for (int i = 0; i < t->ndim; i++) {
        if (t->shape[i] < 0)
            return seldp__fail(SELDP_ERR_INVALID_ARGUMENT, "%s: extent %d is %lld, expected >= 0",
                               what, i, (long long)t->shape[i]);
        empty = empty || t->shape[i] == 0;
    }
    /* With no zero extent, check the byte size for overflow one extent at a time. */
    size_t bytes = seldp_dtype_size(t->dtype);
    for (int i = 0; i < t->ndim && !empty; i++) {
        if ((uint64_t)t->shape[i] > SIZE_MAX / bytes)
            return seldp__fail(SELDP_ERR_INVALID_ARGUMENT,
                               "%s: byte size of shape overflows size_t at extent %d", what, i);
        bytes *= (size_t)t->shape[i];
    }
    if (!empty && !t->data)
        return seldp__fail(SELDP_ERR_INVALID_ARGUMENT, "%s: data is NULL for %zu bytes", what,
                           bytes);
    return SELDP_OK;
}

seldp_status seldp_tensor_alloc(seldp_tensor *t)
{
    if (!t)
        return seldp__fail(SELDP_ERR_INVALID_ARGUMENT, "tensor_alloc: tensor is NULL");
    /* The data pointer is an output here, so validate the layout with a placeholder. */
    seldp_tensor probe = *t;
    probe.data = &probe;
    seldp_status st = seldp_tensor_check(&probe, "tensor_alloc");
    if (st != SELDP_OK)
        return st;
    void *p = NULL;
    st = seldp__device_alloc(t->device, seldp_tensor_nbytes(t), &p);
    if (st != SELDP_OK)
        return st;
    t->data = p;
    return SELDP_OK;
}

void seldp_tensor_free(seldp_tensor *t)
{
    if (!t || !t->data)
        return;
    seldp__device_free(t->device, t->data);
    t->data = NULL;
}

seldp_status seldp_tensor_copy(seldp_tensor *dst, const seldp_tensor *src)
{
    seldp_status st = seldp_tensor_check(dst, "tensor_copy destination");
    if (st != SELDP_OK)
        return st;
    st = seldp_tensor_check(src, "tensor_copy source");
    if (st != SELDP_OK)
        return st;
    if (!seldp_tensor_same_layout(dst, src)) {
        char a[96], b[96];
        return seldp__fail(SELDP_ERR_SHAPE,
                           "tensor_copy: destination is %s %s but source is %s %s, expected the "
                           "same layout",
                           seldp_dtype_name(dst->dtype), seldp_shape_str(dst, a, sizeof a),
                           seldp_dtype_name(src->dtype), seldp_shape_str(src, b, sizeof b));
    }
    return seldp__device_copy(dst->data, dst->device, src->data, src->device,
                              seldp_tensor_nbytes(src));
}

const char *seldp_shape_str(const seldp_tensor *t, char *buf, size_t size)
{
    if (!buf || size == 0)
        return buf;
    size_t used = 0;
    buf[0] = '\0';
    int ndim = t ? t->ndim : 0;
    if (ndim < 0)
        ndim = 0;
    if (ndim > SELDP_MAX_DIMS)
        ndim = SELDP_MAX_DIMS;
    int n = snprintf(buf, size, "[");
    for (int i = 0; i < ndim && n >= 0; i++) {
        used += (size_t)n;
        if (used >= size)
            return buf;
        n = snprintf(buf + used, size - used, i ? ", %lld" : "%lld", (long long)t->shape[i]);
    }
    if (n < 0)
        return buf;
    used += (size_t)n;
    if (used < size)
        snprintf(buf + used, size - used, "]");
    return buf;
}
