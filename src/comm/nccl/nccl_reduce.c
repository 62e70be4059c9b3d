/* The NCCL transport's fused reduction (seldp__reduce_fused_args of comm_impl.h): a session's
 * tensors packed into one F32 buffer on the rank's GPU, summed by ncclAllReduce bucket by
 * bucket, then scaled and cast into their results in one kernel pass.
 *
 *   pack      device segments: one launch converting each contribution to F32 (zeros for
 *             a NULL one) at its offset; host segments: converted on the host into pinned
 *             staging and copied up in one transfer
 *   reduce    one ncclAllReduce (F32 SUM, in place) per bucket of bucket_elems, in groups
 *             of at most SELDP_NCCL_GROUP_MAX (NCCL's state waited for between groups), then
 *             waited for (NCCL's state and the stream) against the timeout
 *   unpack    device segments: one launch of the fused scale and cast
 *             (seldp__scale_convert_bits: (float)((double)x * scale), then round to nearest
 *             even), the bits seldp__scale_f32 followed by seldp__convert would give;
 *             host segments: one copy down, then the same function on the host
 *
 * Nothing is allocated per bucket or, once the buffers fit, per call: the F32 buffer, the
 * kernels' segment descriptions (device and pinned host) and the pinned staging of host
 * segments are kept by the communicator and only grow (seldp__nccl_reduce_buffers; what
 * growing gives up is retired until the world's destroy, never freed mid-run). When the
 * caller says where every segment is (args->device: a session has checked its tensors), no
 * pointer is classified; otherwise each is asked of the runtime once a call. Outputs
 * are written only after every bucket's allreduce has completed, so a failure or timeout
 * before that leaves them untouched (args->written tells the two apart). */
#define _POSIX_C_SOURCE 200809L

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/nccl/nccl_impl.h"
#include "cuda/cuda_kernels.h"
#include "internal.h"
#include "seldp_half_bits.cuh"

/* Where a segment's memory is: this rank's GPU, or the host. */
static seldp_status segment_side(nccl_comm *c, const void *ptr, size_t seg, bool *device)
{
    struct cudaPointerAttributes attr;
    *device = false;
    if (!ptr)
        return SELDP_OK;
    cudaError_t err = seldp__cuda()->pointer_attributes(&attr, ptr);
    if (err != cudaSuccess) {
        seldp__cuda_ignore(err); /* memory CUDA does not know: the host's */
        return SELDP_OK;
    }
    if (attr.type != cudaMemoryTypeDevice && attr.type != cudaMemoryTypeManaged)
        return SELDP_OK;
    if (attr.device != c->ordinal)
        return seldp__fail(SELDP_ERR_DEVICE,
                           "nccl rank %d/%d: reduction: tensor %zu is on cuda:%d, expected the "
                           "rank's device cuda:%d or the host",
                           c->rank, c->size, seg, attr.device, c->ordinal);
    *device = true;
    return SELDP_OK;
}

bool seldp__nccl_fused_memory(const seldp_comm *comm, seldp_device mem, char *needs, size_t size)
{
    const nccl_comm *c = comm->impl;
    if (needs && size)
        snprintf(needs, size, "cuda:%d or host memory", c->ordinal);
    return mem.kind == SELDP_DEVICE_HOST || mem.ordinal == c->ordinal;
}

seldp_status seldp__nccl_reduce_prepare(nccl_comm *c, const seldp__reduce_fused_args *args,
                                        seldp__nccl_reduce_plan *plan)
{
    seldp_status st = SELDP_OK;
    seldp__nccl_reduce_buffers *b = &c->reduce;
    memset(plan, 0, sizeof *plan);
    if (b->side_cap < args->n_segs) {
        bool *side = realloc(b->side, (args->n_segs ? args->n_segs : 1) * sizeof *side);
        if (!side)
            return seldp__fail(SELDP_ERR_NOMEM,
                               "nccl rank %d/%d: reduction: out of memory for %zu tensors", c->rank,
                               c->size, args->n_segs);
        b->side = side;
        b->side_cap = args->n_segs;
    }
    const seldp_device *known = args->device;
    if (known && known->kind == SELDP_DEVICE_CUDA && known->ordinal != c->ordinal)
        SELDP_FAIL(SELDP_ERR_DEVICE,
                   "nccl rank %d/%d: reduction: tensors on cuda:%d, expected the rank's device "
                   "cuda:%d or the host",
                   c->rank, c->size, known->ordinal, c->ordinal);
    for (size_t i = 0; i < args->n_segs; i++) {
        const seldp__reduce_seg *g = &args->segs[i];
        bool in_dev = false, out_dev = false;
        if (known) {
            in_dev = out_dev = known->kind == SELDP_DEVICE_CUDA;
        } else {
            SELDP_CHECK(segment_side(c, g->in, i, &in_dev));
            SELDP_CHECK(segment_side(c, g->out, i, &out_dev));
        }
        if (g->in && in_dev != out_dev)
            SELDP_FAIL(SELDP_ERR_DEVICE,
                       "nccl rank %d/%d: reduction: tensor %zu has its contribution on the %s "
                       "and its result on the %s, expected both on one side",
                       c->rank, c->size, i, in_dev ? "GPU" : "host", out_dev ? "GPU" : "host");
        b->side[i] = out_dev;
        plan->elems += g->count;
        if (out_dev)
            plan->device_segs++;
        else
            plan->host_segs++;
    }
    seldp_device dev = {SELDP_DEVICE_CUDA, c->ordinal};
    size_t descs = seldp__cuda_batch_desc_bytes(plan->device_segs);
    SELDP_CHECK(seldp__device_reserve(&b->sum, dev, plan->elems * sizeof(float)));
    if (plan->device_segs) {
        /* the pack's descriptions, then the unpack's: both in flight on the stream at once */
        SELDP_CHECK(seldp__device_reserve(&b->desc, dev, 2 * descs));
        SELDP_CHECK(seldp__pinned_reserve(&b->descs, dev, 2 * descs));
        if (b->segs_cap < plan->device_segs) {
            seldp__convert_seg *segs = realloc(b->segs, plan->device_segs * sizeof *segs);
            if (!segs)
                SELDP_FAIL(SELDP_ERR_NOMEM,
                           "nccl rank %d/%d: reduction: out of memory for %zu tensors", c->rank,
                           c->size, plan->device_segs);
            b->segs = segs;
            b->segs_cap = plan->device_segs;
        }
    }
    if (plan->host_segs)
        SELDP_CHECK(seldp__pinned_reserve(&b->host, dev, plan->elems * sizeof(float)));
    plan->desc_bytes = descs;
fail:
    return st;
}

void seldp__nccl_reduce_release(seldp__nccl_reduce_buffers *b, seldp__retired *into)
{
    seldp__device_retire(&b->sum, into);
    seldp__device_retire(&b->desc, into);
    seldp__pinned_retire(&b->descs, into);
    seldp__pinned_retire(&b->host, into);
    free(b->segs);
    free(b->side);
    b->segs = NULL;
    b->side = NULL;
    b->segs_cap = b->side_cap = 0; /* the retire lists stay: the buffers may grow again */
}

/* The host segments' contributions in F32 (zeros for a NULL one) at their offsets of the
 * pinned staging, then the whole of it up to the GPU (stream-ordered before the pack). */
static seldp_status pack_host(nccl_comm *c, const seldp__reduce_fused_args *args, size_t elems)
{
    seldp__nccl_reduce_buffers *b = &c->reduce;
    float *stage = b->host.ptr;
    size_t at = 0;
    for (size_t i = 0; i < args->n_segs; at += args->segs[i].count, i++) {
        const seldp__reduce_seg *g = &args->segs[i];
        if (b->side[i])
            continue;
        if (!g->in)
            memset(stage + at, 0, g->count * sizeof(float));
        else if (g->in_dtype == SELDP_F32)
            memcpy(stage + at, g->in, g->count * sizeof(float));
        else
            seldp_half_to_f32(g->in_dtype, g->in, stage + at, g->count);
    }
    cudaError_t err = seldp__cuda()->memcpy_async(b->sum.ptr, stage, elems * sizeof(float),
                                                  cudaMemcpyHostToDevice, c->stream);
    return err == cudaSuccess ? SELDP_OK
                              : seldp__nccl_fail_cuda(c, "reduction (host contributions up)", err);
}

/* One launch over the device segments: into the sum buffer (pack), or out of it with the
 * scale and cast (unpack), each with its own half of the descriptions. */
static seldp_status convert_device(nccl_comm *c, const seldp__reduce_fused_args *args, bool unpack,
                                   double scale, size_t desc_bytes)
{
    seldp__nccl_reduce_buffers *b = &c->reduce;
    float *sum = b->sum.ptr;
    size_t n = 0, at = 0;
    for (size_t i = 0; i < args->n_segs; at += args->segs[i].count, i++) {
        const seldp__reduce_seg *g = &args->segs[i];
        if (!b->side[i])
            continue;
        b->segs[n++] = unpack ? (seldp__convert_seg){.dst = g->out,
                                                     .src = sum + at,
                                                     .dst_dtype = g->out_dtype,
                                                     .src_dtype = SELDP_F32,
                                                     .n = g->count}
                              : (seldp__convert_seg){.dst = sum + at,
                                                     .src = g->in, /* NULL: zeros */
                                                     .dst_dtype = SELDP_F32,
                                                     .src_dtype = g->in ? g->in_dtype : SELDP_F32,
                                                     .n = g->count};
    }
    size_t off = unpack ? desc_bytes : 0;
    seldp_status st =
        seldp__cuda_convert_async(c->stream, b->segs, n, unpack ? scale : 1.0,
                                  (char *)b->descs.ptr + off, (char *)b->desc.ptr + off);
    if (st != SELDP_OK)
        return seldp__nccl_fail_abort(c, st, "nccl rank %d/%d: reduction (%s): %s", c->rank,
                                      c->size, unpack ? "scale and cast" : "pack",
                                      seldp_last_error());
    return SELDP_OK;
}

/* The host segments' results: the sums down into the pinned staging, then scaled and cast
 * on the host with the kernel's own arithmetic. */
static seldp_status unpack_host(nccl_comm *c, const seldp__reduce_fused_args *args, size_t elems)
{
    seldp__nccl_reduce_buffers *b = &c->reduce;
    const float *stage = b->host.ptr;
    seldp_status st = seldp__nccl_copy_sync(c, b->host.ptr, b->sum.ptr, elems * sizeof(float),
                                            cudaMemcpyDeviceToHost);
    if (st != SELDP_OK)
        return st;
    size_t at = 0;
    for (size_t i = 0; i < args->n_segs; at += args->segs[i].count, i++) {
        const seldp__reduce_seg *g = &args->segs[i];
        if (b->side[i])
            continue;
        const uint32_t *x = (const uint32_t *)(const void *)(stage + at);
        if (g->out_dtype == SELDP_F32 && args->scale == 1.0) {
            memcpy(g->out, x, g->count * sizeof(float));
        } else if (g->out_dtype == SELDP_F32) {
            uint32_t *out = g->out;
            for (size_t j = 0; j < g->count; j++)
                out[j] = seldp__scale_convert_bits(x[j], args->scale, SELDP_SCALE_TO_F32);
        } else {
            int to = g->out_dtype == SELDP_BF16 ? SELDP_SCALE_TO_BF16 : SELDP_SCALE_TO_F16;
            uint16_t *out = g->out;
            for (size_t j = 0; j < g->count; j++)
                out[j] = (uint16_t)seldp__scale_convert_bits(x[j], args->scale, to);
        }
    }
    return SELDP_OK;
}

/* One ncclAllReduce per bucket, in place on the sum buffer, SELDP_NCCL_GROUP_MAX to a group;
 * a non-blocking communicator takes the next group once NCCL's state of the last one is no
 * longer in progress (the kernels need not have run). Then the wait for the stream. */
static seldp_status allreduce_buckets(nccl_comm *c, size_t elems, size_t bucket_elems)
{
    float *sum = c->reduce.sum.ptr;
    size_t step = bucket_elems ? bucket_elems : elems;
    for (size_t at = 0; at < elems;) {
        seldp_status st;
        if (at > 0 &&
            (st = seldp__nccl_wait_done(c, "reduction (a group of buckets)", false)) != SELDP_OK)
            return st;
        ncclResult_t first = ncclSuccess, r = ncclGroupStart();
        if (r != ncclSuccess)
            return seldp__nccl_fail_nccl(c, "ncclGroupStart (reduction)", r);
        for (int k = 0; k < SELDP_NCCL_GROUP_MAX && at < elems && first == ncclSuccess; k++) {
            size_t n = elems - at < step ? elems - at : step;
            r = ncclAllReduce(sum + at, sum + at, n, ncclFloat32, ncclSum, c->nccl, c->stream);
            if (!nccl_started(r))
                first = r;
            at += n;
        }
        r = ncclGroupEnd(); /* always closes the group, also after a failed enqueue */
        if (first != ncclSuccess)
            return seldp__nccl_fail_nccl(c, "ncclAllReduce (reduction)", first);
        if (!nccl_started(r))
            return seldp__nccl_fail_nccl(c, "ncclGroupEnd (reduction)", r);
    }
    return seldp__nccl_wait_done(c, "reduction", true);
}

seldp_status seldp__nccl_reduce_fused(seldp_comm *comm, const seldp__reduce_fused_args *args)
{
    nccl_comm *c = comm->impl;
    seldp_status st = SELDP_OK;
    seldp__nccl_reduce_plan plan;
    SELDP_CHECK(seldp__nccl_enter(c, "reduction"));
    if ((st = seldp__nccl_reduce_prepare(c, args, &plan)) != SELDP_OK) {
        /* the other ranks are entering the allreduce: do not let them wait for this one */
        char why[512];
        snprintf(why, sizeof why, "%s", seldp_last_error());
        return seldp__nccl_fail_abort(c, st, "%s", why);
    }
    if (plan.elems == 0)
        return SELDP_OK;
    if (plan.host_segs)
        SELDP_CHECK(pack_host(c, args, plan.elems));
    if (plan.device_segs)
        SELDP_CHECK(convert_device(c, args, false, 1.0, plan.desc_bytes));
    SELDP_CHECK(allreduce_buckets(c, plan.elems, args->bucket_elems));
    if (args->written)
        *args->written = true;
    if (plan.device_segs) {
        SELDP_CHECK(convert_device(c, args, true, args->scale, plan.desc_bytes));
        /* NCCL is done: this wait cannot depend on another rank */
        cudaError_t err = seldp__cuda()->stream_synchronize(c->stream);
        if (err != cudaSuccess)
            return seldp__nccl_fail_cuda(c, "reduction (scale and cast)", err);
    }
    if (plan.host_segs)
        SELDP_CHECK(unpack_host(c, args, plan.elems));
fail:
    return st;
}
