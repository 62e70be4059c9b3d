/* Element-wise operations on host memory, and the dispatch of device pointers to
 * the CUDA versions in src/cuda/ (builds with CUDA only). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "simd/host_copy.h"
#include "internal.h"
#include "kernels.h"
#include "seldp_half_bits.cuh"

#ifdef SELDP_HAVE_CUDA
#include "cuda/cuda_kernels.h"
#endif

/* Host code handles the host; a CUDA device goes to the CUDA kernels when built with them. */
#ifdef SELDP_HAVE_CUDA
#define DISPATCH_CUDA(device, call)                                                                \
    do {                                                                                           \
        if ((device).kind == SELDP_DEVICE_CUDA)                                                    \
            return (call);                                                                         \
    } while (0)
#else
#define DISPATCH_CUDA(device, call)                                                                \
    do {                                                                                           \
        if ((device).kind == SELDP_DEVICE_CUDA)                                                    \
            return seldp__fail(SELDP_ERR_UNSUPPORTED,                                              \
                               "cuda:%d kernel requested but seldp was built without CUDA",        \
                               (device).ordinal);                                                  \
    } while (0)
#endif

/* SELDP_OK when convert supports src_dtype -> dst_dtype. */
static seldp_status check_pair(seldp_dtype dst_dtype, seldp_dtype src_dtype, const char *what)
{
    if (!seldp_dtype_valid(dst_dtype) || !seldp_dtype_valid(src_dtype))
        return seldp__fail(SELDP_ERR_DTYPE, "%s: invalid dtype (%d -> %d)", what, (int)src_dtype,
                           (int)dst_dtype);
    bool same = dst_dtype == src_dtype;
    bool to_f32 = dst_dtype == SELDP_F32 && seldp_dtype_is_half(src_dtype);
    bool from_f32 = src_dtype == SELDP_F32 && seldp_dtype_is_half(dst_dtype);
    if (!same && !to_f32 && !from_f32)
        return seldp__fail(SELDP_ERR_DTYPE,
                           "%s: %s -> %s is not supported, expected a copy or F32 <-> "
                           "F16/BF16",
                           what, seldp_dtype_name(src_dtype), seldp_dtype_name(dst_dtype));
    return SELDP_OK;
}

/* The host conversion of a checked pair. */
static void host_convert(void *dst, seldp_dtype dst_dtype, const void *src, seldp_dtype src_dtype,
                         size_t n)
{
    if (dst_dtype == src_dtype)
        memmove(dst, src, n * seldp_dtype_size(src_dtype));
    else if (dst_dtype == SELDP_F32)
        seldp_half_to_f32(src_dtype, src, dst, n);
    else
        seldp_f32_to_half(dst_dtype, src, dst, n);
}

seldp_status seldp__convert(seldp_device device, void *dst, seldp_dtype dst_dtype, const void *src,
                            seldp_dtype src_dtype, size_t n)
{
    seldp_status st = check_pair(dst_dtype, src_dtype, "convert");
    if (st != SELDP_OK)
        return st;
    if (n == 0)
        return SELDP_OK;
    DISPATCH_CUDA(device, seldp__cuda_convert(device.ordinal, dst, dst_dtype, src, src_dtype, n));
    host_convert(dst, dst_dtype, src, src_dtype, n);
    return SELDP_OK;
}

/* Batches writing at least this many bytes stream their copies (see seldp__convert_batch). */
#define BATCH_STREAM_MIN_BYTES ((size_t)8 << 20)

static bool overlap(const void *a, const void *b, size_t n)
{
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return x < y + n && y < x + n;
}

static seldp_status convert_batch(seldp_device device, const seldp__convert_seg *segs,
                                  size_t n_segs, bool stream_always)
{
    for (size_t i = 0; i < n_segs; i++) {
        const seldp__convert_seg *g = &segs[i];
        seldp_status st =
            check_pair(g->dst_dtype, g->src ? g->src_dtype : g->dst_dtype, "convert_batch");
        if (st != SELDP_OK) {
            char why[256];
            snprintf(why, sizeof why, "%s", seldp_last_error());
            return seldp__fail(st, "segment %zu of %zu: %s", i, n_segs, why);
        }
    }
    if (n_segs == 0)
        return SELDP_OK;
    DISPATCH_CUDA(device, seldp__cuda_convert_batch(device.ordinal, segs, n_segs));
    /* A batch that writes more than the cache would keep (a session's commit) copies with
     * non-temporal stores: no read-for-ownership of the destination lines. */
    size_t bytes = 0;
    for (size_t i = 0; i < n_segs; i++)
        bytes += segs[i].n * seldp_dtype_size(segs[i].dst_dtype);
    bool stream = stream_always || bytes >= BATCH_STREAM_MIN_BYTES;
    for (size_t i = 0; i < n_segs; i++) {
        const seldp__convert_seg *g = &segs[i];
        size_t n = g->n * seldp_dtype_size(g->dst_dtype);
        if (g->n == 0)
            continue;
        if (!g->src)
            memset(g->dst, 0, n);
        else if (stream && g->dst_dtype == g->src_dtype && !overlap(g->dst, g->src, n))
            seldp__stream_copy(g->dst, g->src, n, seldp__host_simd_of_cpu());
        else
            host_convert(g->dst, g->dst_dtype, g->src, g->src_dtype, g->n);
    }
    if (stream)
        seldp__stream_fence();
    return SELDP_OK;
}

seldp_status seldp__convert_batch(seldp_device device, const seldp__convert_seg *segs,
                                  size_t n_segs)
{
    return convert_batch(device, segs, n_segs, false);
}

seldp_status seldp__convert_queue_add(seldp__convert_queue *q, seldp__convert_seg seg)
{
    q->segs[q->n++] = seg;
    return q->n == SELDP_CONVERT_BATCH_MAX ? seldp__convert_queue_flush(q) : SELDP_OK;
}

seldp_status seldp__convert_queue_flush(seldp__convert_queue *q)
{
    size_t n = q->n;
    q->n = 0;
    return convert_batch(q->device, q->segs, n, q->stream);
}

seldp_status seldp__scale_f32(seldp_device device, float *x, size_t n, double factor)
{
    if (n == 0)
        return SELDP_OK;
    DISPATCH_CUDA(device, seldp__cuda_scale_f32(device.ordinal, x, n, factor));
    for (size_t i = 0; i < n; i++) {
        uint32_t bits;
        memcpy(&bits, &x[i], sizeof bits);
        bits = seldp__scale_f32_bits(bits, factor);
        memcpy(&x[i], &bits, sizeof bits);
    }
    return SELDP_OK;
}

/* A half is finite unless its exponent field is all ones. */
static size_t first_nonfinite_half(const uint16_t *x, size_t n, uint16_t exp_mask)
{
    for (size_t i = 0; i < n; i++)
        if ((x[i] & exp_mask) == exp_mask)
            return i;
    return n;
}

seldp_status seldp__find_nonfinite(seldp_device device, const void *x, seldp_dtype dtype, size_t n,
                                   size_t *first)
{
    if (!seldp_dtype_is_float(dtype))
        return seldp__fail(SELDP_ERR_DTYPE, "find_nonfinite: dtype %s is not a float type",
                           seldp_dtype_name(dtype));
    if (n == 0) {
        *first = 0;
        return SELDP_OK;
    }
    DISPATCH_CUDA(device, seldp__cuda_find_nonfinite(device.ordinal, x, dtype, n, first));
    size_t i = n;
    switch (dtype) {
    case SELDP_F32: {
        const float *f = x;
        for (i = 0; i < n && isfinite(f[i]); i++)
            ;
        break;
    }
    case SELDP_F64: {
        const double *d = x;
        for (i = 0; i < n && isfinite(d[i]); i++)
            ;
        break;
    }
    case SELDP_F16:
        i = first_nonfinite_half(x, n, 0x7c00u);
        break;
    case SELDP_BF16:
        i = first_nonfinite_half(x, n, 0x7f80u);
        break;
    default:
        break;
    }
    *first = i;
    return SELDP_OK;
}
