/* The progress thread of a session's overlapped reductions (see session_async.c): the
 * agreement of the call, then the buckets, last to first, each once every parameter it holds
 * is marked. It never touches the caller's container: the caller's thread copies the
 * descriptors of marked gradients into the call's slots under the lock. */
#define _POSIX_C_SOURCE 200809L

#include <stdio.h>

#include "bucket.h"
#include "device.h"
#include "internal.h"
#include "kernels.h"
#include "session_async.h"
#include "shard_impl.h"

/* The slots that end after the start of bucket b and have not been seen yet (*next: the
 * next slot in reverse path order), every one of them marked: their finiteness checked and, unless
 * the transport reads them itself (`convert` false), their contributions converted into the
 * staging buffer (zeros where this rank has none or is inactive). */
static seldp_status pack_through(session_async *a, size_t b, size_t *next, bool convert)
{
    seldp_status st = SELDP_OK;
    seldp_session *s = a->s;
    reduce_call *c = &a->c;
    seldp__convert_queue q = {.device = s->device};
    size_t start = b * a->capacity;

    for (; *next < s->n_slots; (*next)++) {
        size_t k = s->n_slots - 1 - *next;
        const reduce_slot *slot = &c->slots[k];
        size_t n = seldp_tensor_numel(&s->params[s->slot_param[k]].tensor);
        bool contributes;
        if (a->slot_offset[k] + n <= start)
            break; /* in an earlier bucket, maybe not marked yet: its slot is not read */
        if (n == 0)
            continue;
        contributes = c->weight > 0 && slot->has_grad;
        SELDP_CHECK(seldp__reduce_check_finite(c, k));
        if (!convert)
            continue;
        SELDP_CHECK(seldp__convert_queue_add(
            &q, (seldp__convert_seg){
                    .dst = s->staging + a->slot_offset[k],
                    .src = contributes ? slot->grad.data : NULL, /* NULL: zeros */
                    .dst_dtype = SELDP_F32,
                    .src_dtype = contributes ? slot->grad.dtype : SELDP_F32,
                    .n = n,
                }));
    }
    SELDP_CHECK(seldp__convert_queue_flush(&q));
fail:
    return st;
}

/* Collective, on a fused session (seldp__session_choose_fused: the host-staged transport
 * on host memory, NCCL on the rank's GPU): bucket b in one fused reduction that reads every
 * rank's gradients where they are and writes the scaled sums in the result dtype, the bits
 * pack, allreduce, scale and the commit's conversion give. Each slot's part in the bucket is
 * one segment; its results go into the slot's room in the staging buffer (element i at byte
 * i * the result's size), for the commit. Under cfg.overlap_in_place (the default; not with
 * cfg.staged_commit), where this rank's
 * gradient has the result's dtype, they go into the gradient itself instead, once its bytes
 * have been copied into that room (seldp__session_async_restore puts them back). */
static seldp_status reduce_bucket_fused(session_async *a, size_t b, size_t *first)
{
    seldp_status st = SELDP_OK;
    seldp_session *s = a->s;
    reduce_call *c = &a->c;
    seldp__convert_queue keep = {.device = s->device, .stream = true};
    size_t lo = b * a->capacity, hi = lo + a->capacity, n = 0;

    /* slots in reverse path order (falling offsets), from the first that reaches into bucket
     * b; the buckets come last to first */
    for (size_t j = *first; j < s->n_slots; j++) {
        size_t k = s->n_slots - 1 - j;
        reduce_slot *slot = &c->slots[k];
        const session_param *g = &s->params[s->slot_param[k]];
        size_t off = a->slot_offset[k];
        size_t count = seldp_tensor_numel(&g->tensor);
        size_t from = off > lo ? off : lo, to = off + count < hi ? off + count : hi;
        if (off + count <= lo)
            break; /* in an earlier bucket, maybe not marked yet: its slot is not read */
        if (off >= hi) {
            *first = j + 1; /* in a later bucket, done: so for every bucket still to come */
            continue;
        }
        if (count == 0)
            continue;
        seldp_dtype dtype = seldp__reduce_result_dtype(c, g);
        size_t size = seldp_dtype_size(dtype);
        bool contributes = c->weight > 0 && slot->has_grad;
        bool in_place = s->cfg.overlap_in_place && !s->cfg.staged_commit && slot->has_grad &&
                        slot->grad.dtype == dtype;
        char *room = (char *)(s->staging + off) + (from - off) * size;
        char *grad = in_place ? (char *)slot->grad.data + (from - off) * size : NULL;
        if (in_place) {
            SELDP_CHECK(seldp__convert_queue_add(&keep, (seldp__convert_seg){
                                                            .dst = room,
                                                            .src = grad,
                                                            .dst_dtype = dtype,
                                                            .src_dtype = dtype,
                                                            .n = to - from,
                                                        }));
            slot->in_place = true;
            a->in_place_segments++;
        }
        c->segs[n++] = (seldp__reduce_seg){
            .in = contributes ? (const char *)slot->grad.data +
                                    (from - off) * seldp_dtype_size(slot->grad.dtype)
                              : NULL,
            .in_dtype = contributes ? slot->grad.dtype : SELDP_F32,
            .out = in_place ? (void *)grad : (void *)room,
            .out_dtype = dtype,
            .count = to - from,
        };
    }
    SELDP_CHECK(seldp__convert_queue_flush(&keep));
    a->kept_from = lo; /* kept: from here on, a failure puts the gradients back */
    seldp__reduce_fused_args args = {
        .segs = c->segs,
        .n_segs = n,
        .bucket_elems = 0,
        .scale = c->normalize ? 1.0 / (double)c->global_weight : 1.0,
        .written = NULL,
        .device = &s->device,
    };
    st = seldp__comm_reduce_fused(s->comm, &args);
fail:
    return st;
}

/* Collective, an overlapped reduce-scatter on the host-staged transport: the parts of the
 * slots in bucket b in one fused reduce-scatter, this rank's part of its range written in
 * F32 into its place in the staging buffer (element i at staging[i]), as the blocking
 * reduce-scatter stages it. Only the slots of bucket b (every one marked) are read. */
static seldp_status scatter_bucket_fused(session_async *a, size_t b)
{
    seldp_session *s = a->s;
    reduce_call *c = &a->c;
    size_t lo = b * a->capacity, hi = lo + a->capacity, n = 0;
    seldp__shard_seg *segs = a->shard_segs;

    for (size_t k = 0; k < s->n_slots; k++) {
        size_t off = a->slot_offset[k];
        size_t count = seldp_tensor_numel(&s->params[s->slot_param[k]].tensor);
        size_t from = off > lo ? off : lo, to = off + count < hi ? off + count : hi;
        if (to <= from)
            continue;
        const reduce_slot *slot = &c->slots[k];
        bool contributes = c->weight > 0 && slot->has_grad;
        segs[n++] = (seldp__shard_seg){
            .in = contributes ? (const char *)slot->grad.data +
                                    (from - off) * seldp_dtype_size(slot->grad.dtype)
                              : NULL,
            .in_dtype = contributes ? slot->grad.dtype : SELDP_F32,
            .offset = from,
            .count = to - from,
        };
    }
    size_t begin = a->begin > lo ? a->begin : lo, end = a->end < hi ? a->end : hi;
    if (end < begin)
        end = begin;
    seldp__scatter_fused_args args = {
        .segs = segs,
        .n_segs = n,
        .begin = begin,
        .end = end,
        .out = s->staging + begin,
        .scale = c->normalize ? 1.0 / (double)c->global_weight : 1.0,
        .written = NULL,
    };
    return seldp__comm_scatter_fused(s->comm, &args);
}

/* Collective, an overlapped reduce-scatter elsewhere: bucket [offset, offset + count) of the
 * staging buffer (packed) reduce-scattered, each rank receiving its range's part in place,
 * then scaled. */
static seldp_status scatter_bucket(session_async *a, size_t offset, size_t count)
{
    seldp_status st = SELDP_OK;
    seldp_session *s = a->s;
    reduce_call *c = &a->c;
    int n = seldp_comm_size(s->comm), me = seldp_comm_rank(s->comm);
    for (int r = 0; r < n; r++) {
        size_t lo, hi;
        seldp__shard_range(a->map, r, &lo, &hi);
        lo = lo > offset ? lo : offset;
        hi = hi < offset + count ? hi : offset + count;
        a->counts[r] = hi > lo ? hi - lo : 0;
    }
    float *mine = s->staging + (a->begin > offset ? a->begin : offset);
    SELDP_CHECK(seldp_comm_reduce_scatter(s->comm, s->staging + offset, mine, a->counts, SELDP_F32,
                                          s->device));
    if (c->normalize && a->counts[me])
        SELDP_CHECK(
            seldp__scale_f32(s->device, mine, a->counts[me], 1.0 / (double)c->global_weight));
fail:
    return st;
}

/* Collective: the call's collectives, on the progress thread. */
static seldp_status progress_run(session_async *a)
{
    seldp_status st = SELDP_OK;
    seldp_session *s = a->s;
    reduce_call *c = &a->c;
    size_t total = s->slot_elems * sizeof(float), next = 0, first = 0;
    bool scatter = c->kind == REDUCE_KIND_SCATTER;
    /* the fused buckets of a reduce-scatter are the transport's fused reduce-scatters */
    bool fused = s->fused && (!scatter || a->shard_fused);

    st = seldp__reduce_agree(c, a->mine, a->start_message, NULL);
    if (st != SELDP_OK) {
        a->start_failed = true;
        return st;
    }
    if (c->global_weight == 0)
        return SELDP_OK; /* no active rank: nothing is reduced, every result is absent */
    for (size_t i = 0; i < a->n_buckets; i++) {
        size_t b = a->n_buckets - 1 - i, offset, bytes; /* last to first */
        float *at;
        bool cancelled;
        pthread_mutex_lock(&a->lock);
        while (a->pending[b] > 0 && !a->cancel)
            pthread_cond_wait(&a->wake, &a->lock);
        cancelled = a->cancel;
        pthread_mutex_unlock(&a->lock);
        if (cancelled)
            return seldp__fail(SELDP_ERR_ABORTED, "the session was destroyed during the "
                                                  "reduction");
        SELDP_CHECK(pack_through(a, b, &next, !fused));
        if (fused) {
            SELDP_CHECK(scatter ? scatter_bucket_fused(a, b) : reduce_bucket_fused(a, b, &first));
            continue;
        }
        seldp__bucket_span(total, a->capacity * sizeof(float), b, &offset, &bytes);
        if (scatter) {
            SELDP_CHECK(scatter_bucket(a, offset / sizeof(float), bytes / sizeof(float)));
            continue;
        }
        at = s->staging + offset / sizeof(float);
        SELDP_CHECK(
            seldp_comm_allreduce(s->comm, at, at, bytes / sizeof(float), SELDP_F32, s->device));
        if (c->normalize)
            SELDP_CHECK(seldp__scale_f32(s->device, at, bytes / sizeof(float),
                                         1.0 / (double)c->global_weight));
    }
fail:
    return seldp__session_name_call(
        st, seldp__reduce_method(c->kind, c->normalize, c->fp32, REDUCE_START),
        "the overlapped reduction");
}

void *seldp__session_progress_main(void *arg)
{
    session_async *a = arg;
#ifdef SELDP_HAVE_CUDA
    /* the device of the communicator, for the kernels and the transport's streams */
    if (a->s->device.kind == SELDP_DEVICE_CUDA)
        (void)seldp__cuda()->set_device(a->s->device.ordinal);
#endif
    pthread_mutex_lock(&a->lock);
    for (;;) {
        while (!a->job && !a->quit)
            pthread_cond_wait(&a->wake, &a->lock);
        if (a->quit)
            break;
        pthread_mutex_unlock(&a->lock);
        seldp_status st = progress_run(a);
        pthread_mutex_lock(&a->lock);
        a->thread_status = st;
        snprintf(a->thread_message, sizeof a->thread_message, "%s",
                 st != SELDP_OK ? seldp_last_error() : "");
        a->job = false;
        pthread_cond_broadcast(&a->idle);
    }
    pthread_mutex_unlock(&a->lock);
    return NULL;
}
