/* Selected reductions: the weighted mean (reduce) and the sum, each with an FP32 variant.
 *
 * A call runs in stages so that nothing is written into the caller's container before
 * every rank has passed validation and every collective has completed:
 *   prepare   validate this rank's gradients, allocate the staging buffer and every owned
 *             result the commit may need (a failure here is a local failure);
 *   agree     one all-gatherv of a record per rank: status, method, FP32 flag, policy,
 *             weight, the session's fingerprint (schema digest, call count, first path),
 *             the first non-finite gradient and a presence bit per reducible parameter;
 *   decide    from the gathered records, the same on every rank: another session or
 *             call, disagreement, local failures (whose message is then shared), non-finite
 *             inputs, weight overflow, presence, and gradients missing under the error
 *             policy;
 *   pack      contributions converted to F32 into the staging buffer, zeros for a rank
 *             that is inactive or has none;
 *   allreduce the staging buffer in buckets of cfg.bucket_bytes, then scale by 1/W;
 *   confirm   with cfg.staged_commit only: one all-gather of every rank's status, so that
 *             the results are committed everywhere or nowhere;
 *   commit    results written into the caller's tensors, or put as owned entries, and
 *             gradients absent on every active rank removed.
 * On the fused path (a transport whose fused reduction works over the session's memory,
 * seldp__comm_fused_memory: the host-staged one on host memory, in one pass and one
 * rendezvous; NCCL on the rank's GPU, in one conversion launch, grouped bucket allreduces
 * in its own F32 buffer and one scale-and-cast launch; unless the session chose the
 * bucketed path) the transport's fused reduction replaces pack and allreduce: it reads
 * this rank's gradients where they are, upcasts halves, sums in F32, scales by 1/W and
 * writes the results straight into the tensors the commit would have written, with no
 * session staging buffer; the results are the same bits. A failure after that writing
 * began is SELDP_ERR_GRADS_UNDEFINED. With cfg.staged_commit it
 * writes F32 results into the staging buffer instead, and the commit converts them.
 *
 * The agreement and its decision live in session_agree.c, the commit in session_commit.c;
 * the overlapped reductions (session_async.c) reuse them and the checks of this file. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bucket.h"
#include "comm/comm_impl.h"
#include "device.h"
#include "internal.h"
#include "kernels.h"
#include "session_reduce.h"

static const char *method_name(uint64_t normalize, uint64_t fp32)
{
    return seldp__reduce_method(REDUCE_KIND_ALLREDUCE, normalize, fp32, REDUCE_BLOCKING);
}

static bool same_shape(const seldp_tensor *a, const seldp_tensor *b)
{
    return a->ndim == b->ndim &&
           memcmp(a->shape, b->shape, (size_t)a->ndim * sizeof a->shape[0]) == 0;
}

/* --- prepare --------------------------------------------------------------- */

seldp_status seldp__reduce_check_gradient(reduce_call *c, const session_param *g,
                                          const seldp_tensor *t)
{
    seldp_status st = SELDP_OK;
    char have[64], want[64];

    if (g->frozen)
        SELDP_FAIL(SELDP_ERR_FROZEN, "'%s' is frozen but a gradient was supplied for it", g->path);
    if (g->slot == SESSION_NO_SLOT)
        SELDP_FAIL(SELDP_ERR_DTYPE,
                   "'%s' is an integer or bool buffer (%s), never reduced, but a gradient was "
                   "supplied for it",
                   g->path, seldp_dtype_name(g->tensor.dtype));
    if (t->dtype != g->tensor.dtype && !(c->fp32 && t->dtype == SELDP_F32))
        SELDP_FAIL(SELDP_ERR_DTYPE, "'%s': gradient dtype %s, expected %s%s (%s)", g->path,
                   seldp_dtype_name(t->dtype), seldp_dtype_name(g->tensor.dtype),
                   c->fp32 ? " or f32" : "", seldp__reduce_call_name(c));
    if (!same_shape(t, &g->tensor))
        SELDP_FAIL(SELDP_ERR_SHAPE, "'%s': gradient shape %s differs from the parameter's %s",
                   g->path, seldp_shape_str(t, have, sizeof have),
                   seldp_shape_str(&g->tensor, want, sizeof want));
    if (!seldp__device_equal(t->device, c->s->device))
        SELDP_FAIL(SELDP_ERR_DEVICE, "'%s': gradient on %s, but the session computes on %s",
                   g->path, seldp__session_device_name(t->device, have, sizeof have),
                   seldp__session_device_name(c->s->device, want, sizeof want));
    SELDP_CHECK(seldp__device_check_aligned(t, g->path));
    c->slots[g->slot].has_grad = true;
    c->slots[g->slot].grad = *t;
fail:
    return st;
}

seldp_status seldp__reduce_check_finite(reduce_call *c, size_t slot)
{
    seldp_status st = SELDP_OK;
    const seldp_tensor *t = &c->slots[slot].grad;
    size_t n = seldp_tensor_numel(t), bad;

    /* Only a slot before the first non-finite one found so far can change this rank's
     * first, so the blocking path, which checks in path order, stops scanning at the first
     * hit; the agreement picks the first of all ranks. */
    if (!c->s->cfg.check_finite || c->weight == 0 || !c->slots[slot].has_grad ||
        slot >= c->nonfinite_slot)
        return SELDP_OK;
    SELDP_CHECK(seldp__find_nonfinite(c->s->device, t->data, t->dtype, n, &bad));
    if (bad < n) {
        c->nonfinite_slot = slot;
        c->nonfinite_elem = bad;
        c->nonfinite_count = n;
    }
fail:
    return st;
}

/* Everything this rank can check and allocate alone, before the agreement. */
static seldp_status reduce_prepare(reduce_call *c)
{
    seldp_status st = SELDP_OK;
    seldp_session *s = c->s;

    if (!c->grads)
        SELDP_FAIL(SELDP_ERR_INVALID_ARGUMENT, "%s: grads must not be NULL",
                   method_name(c->normalize, c->fp32));
    if (c->policy != SELDP_MISSING_ERROR && c->policy != SELDP_MISSING_ZERO)
        SELDP_FAIL(SELDP_ERR_INVALID_ARGUMENT, "%s: missing-gradient policy %d is invalid",
                   method_name(c->normalize, c->fp32), (int)c->policy);
    c->fused = s->fused;
    c->staged = !c->fused || s->cfg.staged_commit;
    if (c->fused && !(c->segs = malloc((s->n_slots ? s->n_slots : 1) * sizeof *c->segs)))
        SELDP_FAIL(SELDP_ERR_NOMEM, "out of memory planning the reduction of %zu tensors",
                   s->n_slots);
    if (c->staged && !s->staging && s->slot_elems)
        SELDP_CHECK(
            seldp__device_alloc(s->device, s->slot_elems * sizeof(float), (void **)&s->staging));
    for (size_t i = 0; i < s->n_params; i++) {
        const seldp_tensor *t = seldp_grads_get(c->grads, s->params[i].id);
        if (!t)
            continue;
        SELDP_CHECK(seldp__reduce_check_gradient(c, &s->params[i], t));
        SELDP_CHECK(seldp__reduce_check_finite(c, s->params[i].slot));
    }
    SELDP_CHECK(seldp__reduce_allocate_results(c));
fail:
    return st;
}

seldp_status seldp__reduce_allocate_results(reduce_call *c)
{
    seldp_status st = SELDP_OK;
    seldp_session *s = c->s;

    /* Results that cannot be written in place are allocated now, and room made in the
     * container for those that become new entries, so that the commit cannot fail after
     * the collectives for want of memory. */
    size_t added = 0;
    for (size_t k = 0; k < s->n_slots; k++)
        added += !c->slots[k].has_grad;
    SELDP_CHECK(seldp_grads_reserve(c->grads, added));
    for (size_t k = 0; k < s->n_slots; k++) {
        const session_param *g = &s->params[s->slot_param[k]];
        reduce_slot *slot = &c->slots[k];
        seldp_dtype dtype = seldp__reduce_result_dtype(c, g);
        if (slot->has_grad && slot->grad.dtype == dtype)
            continue;
        slot->result = g->tensor;
        slot->result.dtype = dtype;
        slot->result.device = s->device;
        slot->result.data = NULL;
        SELDP_CHECK(seldp_tensor_alloc(&slot->result));
    }
fail:
    return st;
}

/* --- pack, allreduce ------------------------------------------------------- */

/* Lay the present parameters out in the staging buffer in path order and fill in this
 * rank's contributions: conversions and zeros in batches (one kernel launch per batch of
 * SELDP_CONVERT_BATCH_MAX tensors on a GPU, not one per tensor). */
static seldp_status reduce_pack(reduce_call *c)
{
    seldp_status st = SELDP_OK;
    seldp_session *s = c->s;
    seldp__convert_queue q = {.device = s->device};

    c->elems = 0;
    for (size_t k = 0; k < s->n_slots; k++) {
        const session_param *g = &s->params[s->slot_param[k]];
        reduce_slot *slot = &c->slots[k];
        size_t n = seldp_tensor_numel(&g->tensor);
        bool contributes = c->weight > 0 && slot->has_grad;
        if (!slot->present)
            continue;
        slot->offset = c->elems;
        c->elems += n;
        SELDP_CHECK(seldp__convert_queue_add(
            &q, (seldp__convert_seg){
                    .dst = s->staging + slot->offset,
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

/* Collective: sum the staging buffer over the group in buckets; divide for the mean. */
static seldp_status reduce_allreduce(reduce_call *c)
{
    seldp_status st = SELDP_OK;
    seldp_session *s = c->s;
    size_t capacity = seldp__bucket_capacity(s->cfg.bucket_bytes, sizeof(float));
    size_t total = c->elems * sizeof(float);
    size_t n_buckets = seldp__bucket_count(total, capacity);

    for (size_t b = 0; b < n_buckets; b++) {
        size_t offset, bytes;
        float *at;
        seldp__bucket_span(total, capacity, b, &offset, &bytes);
        at = s->staging + offset / sizeof(float);
        SELDP_CHECK(
            seldp_comm_allreduce(s->comm, at, at, bytes / sizeof(float), SELDP_F32, s->device));
    }
    if (c->normalize && c->elems)
        SELDP_CHECK(
            seldp__scale_f32(s->device, s->staging, c->elems, 1.0 / (double)c->global_weight));
fail:
    return st;
}

/* Collective: the fused path. Each present parameter is one segment: this rank's gradient
 * (NULL for zeros when inactive or without one) reduced into the tensor the commit keeps,
 * the caller's own when it has the result dtype, else the result allocated in prepare;
 * or, when the call is staged, into its F32 place in the staging buffer. */
static seldp_status reduce_fused(reduce_call *c)
{
    seldp_session *s = c->s;
    seldp__reduce_seg *segs = c->segs;
    size_t n = 0;

    c->elems = 0;
    for (size_t k = 0; k < s->n_slots; k++) {
        const session_param *g = &s->params[s->slot_param[k]];
        const reduce_slot *slot = &c->slots[k];
        seldp_dtype dtype = seldp__reduce_result_dtype(c, g);
        if (!slot->present)
            continue;
        bool contributes = c->weight > 0 && slot->has_grad;
        bool in_place = slot->has_grad && slot->grad.dtype == dtype;
        segs[n].in = contributes ? slot->grad.data : NULL;
        segs[n].in_dtype = contributes ? slot->grad.dtype : SELDP_F32;
        segs[n].out = c->staged  ? (void *)(s->staging + c->elems)
                      : in_place ? slot->grad.data
                                 : slot->result.data;
        segs[n].out_dtype = c->staged ? SELDP_F32 : dtype;
        segs[n].count = seldp_tensor_numel(&g->tensor);
        c->slots[k].offset = c->elems;
        c->elems += segs[n].count;
        n++;
    }
    bool written = false;
    seldp__reduce_fused_args args = {
        .segs = segs,
        .n_segs = n,
        .bucket_elems = seldp__bucket_capacity(s->cfg.bucket_bytes, sizeof(float)) / sizeof(float),
        .scale = c->normalize ? 1.0 / (double)c->global_weight : 1.0,
        .written = &written,
        .device = &s->device, /* every gradient, result and the staging checked on it */
    };
    seldp_status st = c->elems ? seldp__comm_reduce_fused(s->comm, &args) : SELDP_OK;
    if (st != SELDP_OK && written && !c->staged) {
        char why[SESSION_MESSAGE_MAX];
        snprintf(why, sizeof why, "%s (%s)", seldp_last_error(), seldp_status_name(st));
        return seldp__fail(SELDP_ERR_GRADS_UNDEFINED,
                           "%s: the fused reduction failed while writing its results in place, "
                           "so the selected gradients are undefined (cfg.staged_commit keeps "
                           "them unchanged): %s",
                           method_name(c->normalize, c->fp32), why);
    }
    return st;
}

seldp_status seldp__reduce_confirm(reduce_call *c, seldp_status reduced)
{
    seldp_comm *comm = c->s->comm;
    int n = seldp_comm_size(comm);
    uint64_t mine = (uint64_t)reduced, *all = calloc((size_t)n, sizeof *all);
    char message[SESSION_MESSAGE_MAX], own[SESSION_MESSAGE_MAX];
    seldp_status st;

    seldp__session_save_message(comm, reduced, message);
    snprintf(own, sizeof own, "%s", seldp_last_error());
    if (!all)
        /* the others then time out in the confirmation: none of them commits */
        return reduced != SELDP_OK ? reduced
                                   : seldp__fail(SELDP_ERR_NOMEM,
                                                 "out of memory confirming a reduction over %d "
                                                 "ranks",
                                                 n);
    st = seldp__session_name_call(
        seldp_comm_allgather(comm, &mine, all, sizeof mine, SELDP_HOST_DEVICE),
        seldp__reduce_call_name(c), "the confirmation");
    if (st != SELDP_OK && reduced != SELDP_OK) {
        seldp__set_error(own); /* this rank's own failure says more than the confirmation's */
        st = reduced;
    }
    for (int r = 0; st == SELDP_OK && r < n; r++)
        if (all[r] != SELDP_OK)
            st = seldp__session_share_error(comm, r, (seldp_status)all[r], message);
    free(all);
    return st;
}

/* --- the call -------------------------------------------------------------- */

seldp_status seldp__reduce_call_alloc(reduce_call *c, int n)
{
    const seldp_session *s = c->s;
    c->nonfinite_slot = NO_NONFINITE;
    /* the bitmap is padded to 8 bytes so that every gathered record stays aligned */
    c->record_bytes = sizeof(reduce_record) + (s->n_slots + 63) / 64 * 8;
    c->slots = calloc(s->n_slots ? s->n_slots : 1, sizeof *c->slots);
    c->record_lengths = calloc((size_t)n, sizeof *c->record_lengths);
    c->record_offsets = calloc((size_t)n, sizeof *c->record_offsets);
    c->world_ranks = calloc((size_t)n, sizeof *c->world_ranks);
    if (!c->slots || !c->record_lengths || !c->record_offsets || !c->world_ranks)
        return seldp__fail(SELDP_ERR_NOMEM, "out of memory for the agreement of %d ranks", n);
    return SELDP_OK;
}

void seldp__reduce_call_free(reduce_call *c)
{
    for (size_t k = 0; c->slots && k < c->s->n_slots; k++)
        if (c->slots[k].result.data)
            seldp_tensor_free(&c->slots[k].result);
    free(c->segs);
    free(c->world_ranks);
    free(c->record_offsets);
    free(c->record_lengths);
    free(c->records);
    free(c->slots);
    c->segs = NULL;
    c->world_ranks = NULL;
    c->record_offsets = NULL;
    c->record_lengths = NULL;
    c->records = NULL;
    c->slots = NULL;
}

static seldp_status session_reduce(seldp_session *s, seldp_grads *grads, uint64_t weight,
                                   seldp_missing_policy policy, bool normalize, bool fp32,
                                   uint64_t *global_weight)
{
    seldp_status st = SELDP_OK, local;
    reduce_call c = {0};
    unsigned char *mine = NULL;
    char message[SESSION_MESSAGE_MAX];

    if (!s)
        return seldp__fail(SELDP_ERR_INVALID_ARGUMENT, "%s: session must not be NULL",
                           method_name(normalize, fp32));
    /* Local: the communicator belongs to an overlapped reduction's progress thread. */
    if ((st = seldp__session_busy(s, method_name(normalize, fp32))) != SELDP_OK)
        return st;
    c.s = s;
    c.grads = grads;
    c.normalize = normalize;
    c.fp32 = fp32;
    c.policy = policy;
    c.weight = weight;
    c.call = ++s->reductions;
    /* Without these this rank cannot take part; the others' collectives then end with the
     * transport's timeout rather than hanging. */
    SELDP_CHECK(seldp__reduce_call_alloc(&c, seldp_comm_size(s->comm)));
    if (!(mine = calloc(1, c.record_bytes)))
        SELDP_FAIL(SELDP_ERR_NOMEM, "out of memory for the agreement record");

    local = reduce_prepare(&c);
    seldp__session_save_message(s->comm, local, message);
    seldp__reduce_fill_record(&c, local, (reduce_record *)mine);
    SELDP_CHECK(seldp__reduce_agree(&c, mine, message, NULL));
    if (c.fused) {
        st = reduce_fused(&c);
    } else {
        st = reduce_pack(&c);
        if (st == SELDP_OK)
            st = reduce_allreduce(&c);
    }
    st = seldp__session_name_call(st, method_name(normalize, fp32), "the reduction");
    if (s->cfg.staged_commit)
        st = seldp__reduce_confirm(&c, st);
    SELDP_CHECK(st);
    SELDP_CHECK(seldp__reduce_commit(&c));
    if (global_weight)
        *global_weight = c.global_weight;
fail:
    seldp__reduce_call_free(&c);
    free(mine);
    return seldp__session_name_call(st, method_name(normalize, fp32), NULL);
}

seldp_status seldp_session_reduce(seldp_session *session, seldp_grads *grads, uint64_t local_weight,
                                  seldp_missing_policy policy, uint64_t *global_weight)
{
    return session_reduce(session, grads, local_weight, policy, true, false, global_weight);
}

seldp_status seldp_session_reduce_fp32(seldp_session *session, seldp_grads *grads,
                                       uint64_t local_weight, seldp_missing_policy policy,
                                       uint64_t *global_weight)
{
    return session_reduce(session, grads, local_weight, policy, true, true, global_weight);
}

seldp_status seldp_session_sum(seldp_session *session, seldp_grads *grads, bool local_active,
                               seldp_missing_policy policy, uint64_t *global_weight)
{
    return session_reduce(session, grads, local_active ? 1 : 0, policy, false, false,
                          global_weight);
}

seldp_status seldp_session_sum_fp32(seldp_session *session, seldp_grads *grads, bool local_active,
                                    seldp_missing_policy policy, uint64_t *global_weight)
{
    return session_reduce(session, grads, local_active ? 1 : 0, policy, false, true, global_weight);
}
