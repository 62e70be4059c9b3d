/* Selected reductions: the weighted mean (reduce) and the sum, each with an FP32 variant.
 *
 * A call runs in stages so that nothing is written into the caller's container before
 * every rank has passed validation and every collective has completed:
 *   prepare   validate this rank's gradients, allocate the staging buffer and every owned
 *             result the commit may need (a failure here is a local failure);
 *   agree     one all-gather of a fixed record per rank: status, method, FP32 flag,
 *             policy, weight and a presence bit per reducible parameter;
 *   decide    from the gathered records, the same on every rank: disagreement, local
 *             failures (whose message is then shared), weight overflow, presence, and
 *             gradients missing under the error policy;
 *   pack      contributions converted to F32 into the staging buffer, zeros for a rank
 *             that is inactive or has none;
 *   allreduce the staging buffer in buckets of cfg.bucket_bytes, then scale by 1/W;
 *   commit    results written into the caller's tensors, or put as owned entries, and
 *             gradients absent on every active rank removed.
 * On host memory, a transport with a fused reduction (the host-staged one) replaces pack
 * and allreduce: it reads every rank's gradients where they are, upcasts halves, sums in
 * F32 in rank order, scales by 1/W and writes the results straight into the tensors the
 * commit would have written, in one pass and one rendezvous, so that a failure still
 * changes nothing. No staging buffer is allocated then; the results are the same bits. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bucket.h"
#include "comm/comm_impl.h"
#include "device.h"
#include "internal.h"
#include "kernels.h"
#include "session_impl.h"

/* This rank's side of one reducible parameter in one call. */
typedef struct reduce_slot {
    bool has_grad;
    seldp_tensor grad;   /* copy of the caller's descriptor, when has_grad */
    seldp_tensor result; /* owned result allocated in advance; data NULL when not needed */
    bool present;        /* some active rank has a gradient */
    size_t offset;       /* in the staging buffer, in elements, when present */
} reduce_slot;

/* The fixed part of a rank's agreement record; uint64 fields, so no padding. The
 * presence bitmap follows it. */
typedef struct reduce_record {
    uint64_t status;
    uint64_t world_rank;
    uint64_t normalize;
    uint64_t fp32;
    uint64_t policy;
    uint64_t weight;
    uint64_t fused; /* this rank can take the fused path */
} reduce_record;

typedef struct reduce_call {
    seldp_session *s;
    seldp_grads *grads;
    bool normalize, fp32;
    seldp_missing_policy policy;
    uint64_t weight; /* the rank's weight: local_weight, or 1/0 for active/inactive */
    reduce_slot *slots;
    size_t record_bytes;
    unsigned char *records; /* every rank's record, record_bytes each */
    int *world_ranks;
    uint64_t global_weight;
    size_t elems;            /* F32 elements of the present parameters */
    bool fused;              /* the transport reduces the tensors in place (no staging buffer) */
    seldp__reduce_seg *segs; /* fused: one per reducible parameter */
} reduce_call;

static const char *method_name(uint64_t normalize, uint64_t fp32)
{
    if (normalize)
        return fp32 ? "seldp_session_reduce_fp32" : "seldp_session_reduce";
    return fp32 ? "seldp_session_sum_fp32" : "seldp_session_sum";
}

static const char *policy_name(uint64_t policy)
{
    switch (policy) {
    case SELDP_MISSING_ERROR:
        return "error";
    case SELDP_MISSING_ZERO:
        return "zero";
    default:
        return "invalid";
    }
}

static reduce_record *record_of(const reduce_call *c, int rank)
{
    return (reduce_record *)(c->records + (size_t)rank * c->record_bytes);
}

static bool record_has(const reduce_call *c, int rank, size_t slot)
{
    const unsigned char *bits = (const unsigned char *)(record_of(c, rank) + 1);
    return bits[slot / 8] >> (slot % 8) & 1u;
}

static bool same_shape(const seldp_tensor *a, const seldp_tensor *b)
{
    return a->ndim == b->ndim &&
           memcmp(a->shape, b->shape, (size_t)a->ndim * sizeof a->shape[0]) == 0;
}

/* The dtype the result of a group takes in this call. */
static seldp_dtype result_dtype(const reduce_call *c, const session_group *g)
{
    return c->fp32 ? SELDP_F32 : g->tensor.dtype;
}

/* --- prepare --------------------------------------------------------------- */

/* Check this rank's gradient of group g; on success record it in its slot. */
static seldp_status check_gradient(reduce_call *c, const session_group *g, const seldp_tensor *t)
{
    seldp_status st = SELDP_OK;
    char have[64], want[64];
    size_t bad;

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
                   c->fp32 ? " or f32" : "", method_name(c->normalize, c->fp32));
    if (!same_shape(t, &g->tensor))
        SELDP_FAIL(SELDP_ERR_SHAPE, "'%s': gradient shape %s differs from the parameter's %s",
                   g->path, seldp_shape_str(t, have, sizeof have),
                   seldp_shape_str(&g->tensor, want, sizeof want));
    if (!seldp__device_equal(t->device, c->s->device))
        SELDP_FAIL(SELDP_ERR_DEVICE, "'%s': gradient on %s, but the session computes on %s",
                   g->path, seldp__session_device_name(t->device, have, sizeof have),
                   seldp__session_device_name(c->s->device, want, sizeof want));
    if (c->s->cfg.check_finite && c->weight > 0) {
        size_t n = seldp_tensor_numel(t);
        SELDP_CHECK(seldp__find_nonfinite(c->s->device, t->data, t->dtype, n, &bad));
        if (bad < n)
            SELDP_FAIL(SELDP_ERR_NONFINITE, "'%s': gradient element %zu of %zu is not finite",
                       g->path, bad, n);
    }
    c->slots[g->slot].has_grad = true;
    c->slots[g->slot].grad = *t;
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
    c->fused = s->comm->ops->reduce_fused && s->device.kind == SELDP_DEVICE_HOST;
    if (c->fused && !(c->segs = malloc((s->n_slots ? s->n_slots : 1) * sizeof *c->segs)))
        SELDP_FAIL(SELDP_ERR_NOMEM, "out of memory planning the reduction of %zu tensors",
                   s->n_slots);
    if (!c->fused && !s->staging && s->slot_elems)
        SELDP_CHECK(
            seldp__device_alloc(s->device, s->slot_elems * sizeof(float), (void **)&s->staging));
    for (size_t i = 0; i < s->n_groups; i++) {
        const seldp_tensor *t = seldp_grads_get(c->grads, s->groups[i].id);
        if (t)
            SELDP_CHECK(check_gradient(c, &s->groups[i], t));
    }
    /* Results that cannot be written in place are allocated now, so that the commit
     * cannot fail after the collectives for want of memory. */
    for (size_t k = 0; k < s->n_slots; k++) {
        const session_group *g = &s->groups[s->slot_group[k]];
        reduce_slot *slot = &c->slots[k];
        seldp_dtype dtype = result_dtype(c, g);
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

static void fill_record(const reduce_call *c, seldp_status local, reduce_record *mine)
{
    unsigned char *bits = (unsigned char *)(mine + 1);
    mine->status = (uint64_t)local;
    mine->world_rank = (uint64_t)seldp_comm_world_rank(c->s->comm);
    mine->normalize = c->normalize;
    mine->fp32 = c->fp32;
    mine->policy = (uint64_t)c->policy;
    mine->weight = c->weight;
    mine->fused = c->fused;
    for (size_t k = 0; k < c->s->n_slots; k++)
        if (c->slots[k].has_grad)
            bits[k / 8] |= (unsigned char)(1u << (k % 8));
}

/* --- decide ---------------------------------------------------------------- */

/* The outcome of the agreement, computed by every rank from the same gathered records. */
static seldp_status reduce_decide(reduce_call *c, const char *message)
{
    seldp_status st = SELDP_OK;
    seldp_session *s = c->s;
    int n = seldp_comm_size(s->comm), *lacking = NULL, *having = NULL;
    const reduce_record *first = record_of(c, 0);

    for (int r = 0; r < n; r++)
        c->world_ranks[r] = (int)record_of(c, r)->world_rank;
    for (int r = 1; r < n; r++) {
        const reduce_record *o = record_of(c, r);
        if (o->normalize != first->normalize || o->fp32 != first->fp32 ||
            o->policy != first->policy)
            SELDP_FAIL(SELDP_ERR_DISAGREE,
                       "ranks disagree on the reduction: group rank 0 (world rank %d) called %s "
                       "with policy %s, group rank %d (world rank %d) called %s with policy %s",
                       c->world_ranks[0], method_name(first->normalize, first->fp32),
                       policy_name(first->policy), r, c->world_ranks[r],
                       method_name(o->normalize, o->fp32), policy_name(o->policy));
    }
    for (int r = 0; r < n; r++)
        if (record_of(c, r)->status != SELDP_OK)
            return seldp__session_share_error(s->comm, r, (seldp_status)record_of(c, r)->status,
                                              message);

    c->global_weight = 0;
    for (int r = 0; r < n; r++) {
        uint64_t w = record_of(c, r)->weight;
        if (c->global_weight > UINT64_MAX - w)
            SELDP_FAIL(SELDP_ERR_OVERFLOW,
                       "the global weight overflows 64 bits: group rank %d (world rank %d) adds "
                       "%" PRIu64 " to %" PRIu64 " from the ranks before it",
                       r, c->world_ranks[r], w, c->global_weight);
        c->global_weight += w;
    }

    lacking = malloc((size_t)n * sizeof *lacking);
    having = malloc((size_t)n * sizeof *having);
    if (!lacking || !having)
        SELDP_FAIL(SELDP_ERR_NOMEM, "out of memory checking gradient presence on %d ranks", n);
    for (size_t k = 0; k < s->n_slots; k++) {
        size_t n_lacking = 0, n_having = 0;
        for (int r = 0; r < n; r++) {
            if (record_of(c, r)->weight == 0)
                continue;
            if (record_has(c, r, k))
                having[n_having++] = r;
            else
                lacking[n_lacking++] = r;
        }
        c->slots[k].present = n_having > 0;
        if (n_having > 0 && n_lacking > 0 && first->policy == SELDP_MISSING_ERROR) {
            char who[256], others[256];
            seldp__session_rank_list(lacking, n_lacking, c->world_ranks, who, sizeof who);
            seldp__session_rank_list(having, n_having, c->world_ranks, others, sizeof others);
            SELDP_FAIL(SELDP_ERR_MISSING_GRADIENT,
                       "'%s' has no gradient on active %s, but has one on active %s (missing-"
                       "gradient policy error)",
                       s->groups[s->slot_group[k]].path, who, others);
        }
    }
    /* The fused path needs every rank on it (a group may mix host and device ranks). */
    for (int r = 0; r < n; r++)
        if (!record_of(c, r)->fused)
            c->fused = false;
    if (!c->fused && !s->staging && s->slot_elems) {
        st = seldp__device_alloc(s->device, s->slot_elems * sizeof(float), (void **)&s->staging);
        /* the others are on their way into the allreduces: make them return at once */
        if (st != SELDP_OK)
            seldp_comm_abort(s->comm);
    }
fail:
    free(having);
    free(lacking);
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
    seldp__convert_seg batch[SELDP_CONVERT_BATCH_MAX];
    size_t n_batch = 0;

    c->elems = 0;
    for (size_t k = 0; k < s->n_slots; k++) {
        const session_group *g = &s->groups[s->slot_group[k]];
        reduce_slot *slot = &c->slots[k];
        size_t n = seldp_tensor_numel(&g->tensor);
        bool contributes = c->weight > 0 && slot->has_grad;
        if (!slot->present)
            continue;
        slot->offset = c->elems;
        c->elems += n;
        batch[n_batch++] = (seldp__convert_seg){
            .dst = s->staging + slot->offset,
            .src = contributes ? slot->grad.data : NULL, /* NULL: zeros */
            .dst_dtype = SELDP_F32,
            .src_dtype = contributes ? slot->grad.dtype : SELDP_F32,
            .n = n,
        };
        if (n_batch == SELDP_CONVERT_BATCH_MAX) {
            SELDP_CHECK(seldp__convert_batch(s->device, batch, n_batch));
            n_batch = 0;
        }
    }
    SELDP_CHECK(seldp__convert_batch(s->device, batch, n_batch));
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
 * the caller's own when it has the result dtype, else the result allocated in prepare. */
static seldp_status reduce_fused(reduce_call *c)
{
    seldp_session *s = c->s;
    seldp__reduce_seg *segs = c->segs;
    size_t n = 0;

    c->elems = 0;
    for (size_t k = 0; k < s->n_slots; k++) {
        const session_group *g = &s->groups[s->slot_group[k]];
        const reduce_slot *slot = &c->slots[k];
        seldp_dtype dtype = result_dtype(c, g);
        if (!slot->present)
            continue;
        bool contributes = c->weight > 0 && slot->has_grad;
        bool in_place = slot->has_grad && slot->grad.dtype == dtype;
        segs[n].in = contributes ? slot->grad.data : NULL;
        segs[n].in_dtype = contributes ? slot->grad.dtype : SELDP_F32;
        segs[n].out = in_place ? slot->grad.data : slot->result.data;
        segs[n].out_dtype = dtype;
        segs[n].count = seldp_tensor_numel(&g->tensor);
        c->elems += segs[n].count;
        n++;
    }
    seldp__reduce_fused_args args = {
        .segs = segs,
        .n_segs = n,
        .bucket_elems = seldp__bucket_capacity(s->cfg.bucket_bytes, sizeof(float)) / sizeof(float),
        .scale = c->normalize ? 1.0 / (double)c->global_weight : 1.0,
    };
    return c->elems ? seldp__comm_reduce_fused(s->comm, &args) : SELDP_OK;
}

/* --- commit ---------------------------------------------------------------- */

/* Remove the entry of `id`, freeing it when the container owned it. */
static void drop_gradient(seldp_grads *grads, seldp_param_id id)
{
    seldp_tensor t;
    seldp_ownership own;
    if (seldp_grads_take(grads, id, &t, &own) && own == SELDP_OWNED)
        seldp_tensor_free(&t);
}

/* Put the owned result of `id` in place of the caller's entry, if any. When the container
 * cannot grow (SELDP_ERR_NOMEM), the caller's entry is put back and the error returned. */
static seldp_status replace_gradient(seldp_grads *grads, seldp_param_id id, seldp_tensor *result)
{
    seldp_tensor old;
    seldp_ownership own = SELDP_BORROWED;
    bool had = seldp_grads_take(grads, id, &old, &own);
    seldp_status st = seldp_grads_put(grads, id, result, SELDP_OWNED);
    if (st != SELDP_OK) {
        if (had)
            seldp_grads_put(grads, id, &old, own);
        return st;
    }
    result->data = NULL; /* the container owns it now */
    if (had && own == SELDP_OWNED)
        seldp_tensor_free(&old);
    return SELDP_OK;
}

/* The staged results converted into the caller's tensors, or the results allocated in
 * prepare, in batches (one kernel launch per batch on a GPU). */
static seldp_status commit_convert(reduce_call *c)
{
    seldp_status st = SELDP_OK;
    seldp_session *s = c->s;
    seldp__convert_seg batch[SELDP_CONVERT_BATCH_MAX];
    size_t n_batch = 0;

    for (size_t k = 0; k < s->n_slots; k++) {
        const session_group *g = &s->groups[s->slot_group[k]];
        reduce_slot *slot = &c->slots[k];
        seldp_dtype dtype = result_dtype(c, g);
        if (!slot->present)
            continue;
        bool in_place = slot->has_grad && slot->grad.dtype == dtype;
        batch[n_batch++] = (seldp__convert_seg){
            .dst = in_place ? slot->grad.data : slot->result.data,
            .src = s->staging + slot->offset,
            .dst_dtype = dtype,
            .src_dtype = SELDP_F32,
            .n = seldp_tensor_numel(&g->tensor),
        };
        if (n_batch == SELDP_CONVERT_BATCH_MAX) {
            SELDP_CHECK(seldp__convert_batch(s->device, batch, n_batch));
            n_batch = 0;
        }
    }
    SELDP_CHECK(seldp__convert_batch(s->device, batch, n_batch));
fail:
    return st;
}

/* Write the results into the caller's container. Everything it needs was allocated before
 * the agreement; the only failure left possible is the container's own growth. */
static seldp_status reduce_commit(reduce_call *c)
{
    seldp_status st = SELDP_OK;
    seldp_session *s = c->s;

    if (!c->fused)
        SELDP_CHECK(commit_convert(c));
    for (size_t k = 0; k < s->n_slots; k++) {
        const session_group *g = &s->groups[s->slot_group[k]];
        reduce_slot *slot = &c->slots[k];
        seldp_dtype dtype = result_dtype(c, g);
        if (!slot->present) {
            drop_gradient(c->grads, g->id);
        } else if (!(slot->has_grad && slot->grad.dtype == dtype)) {
            /* the results written by the transport (fused) or by commit_convert go into the
             * container in place of the caller's entry */
            SELDP_CHECK(replace_gradient(c->grads, g->id, &slot->result));
        }
    }
fail:
    return st;
}

/* --- the call -------------------------------------------------------------- */

static seldp_status session_reduce(seldp_session *s, seldp_grads *grads, uint64_t weight,
                                   seldp_missing_policy policy, bool normalize, bool fp32,
                                   uint64_t *global_weight)
{
    seldp_status st = SELDP_OK, local;
    reduce_call c = {0};
    int n;
    size_t bitmap_bytes;
    unsigned char *mine = NULL;
    char message[SESSION_MESSAGE_MAX];

    if (!s)
        return seldp__fail(SELDP_ERR_INVALID_ARGUMENT, "%s: session must not be NULL",
                           method_name(normalize, fp32));
    n = seldp_comm_size(s->comm);
    c.s = s;
    c.grads = grads;
    c.normalize = normalize;
    c.fp32 = fp32;
    c.policy = policy;
    c.weight = weight;
    /* the bitmap is padded to 8 bytes so that every gathered record stays aligned */
    bitmap_bytes = (s->n_slots + 63) / 64 * 8;
    c.record_bytes = sizeof(reduce_record) + bitmap_bytes;
    /* Without these this rank cannot take part; the others' collectives then end with the
     * transport's timeout rather than hanging. */
    c.slots = calloc(s->n_slots ? s->n_slots : 1, sizeof *c.slots);
    c.records = calloc((size_t)n, c.record_bytes);
    c.world_ranks = calloc((size_t)n, sizeof *c.world_ranks);
    mine = calloc(1, c.record_bytes);
    if (!c.slots || !c.records || !c.world_ranks || !mine)
        SELDP_FAIL(SELDP_ERR_NOMEM, "%s: out of memory for the agreement of %d ranks",
                   method_name(normalize, fp32), n);

    local = reduce_prepare(&c);
    seldp__session_save_message(s->comm, local, message);
    fill_record(&c, local, (reduce_record *)mine);
    SELDP_CHECK(seldp_comm_allgather(s->comm, mine, c.records, c.record_bytes, SELDP_HOST_DEVICE));
    SELDP_CHECK(reduce_decide(&c, message));
    if (c.fused) {
        SELDP_CHECK(reduce_fused(&c));
    } else {
        SELDP_CHECK(reduce_pack(&c));
        SELDP_CHECK(reduce_allreduce(&c));
    }
    SELDP_CHECK(reduce_commit(&c));
    if (global_weight)
        *global_weight = c.global_weight;
fail:
    for (size_t k = 0; c.slots && k < s->n_slots; k++)
        if (c.slots[k].result.data)
            seldp_tensor_free(&c.slots[k].result);
    free(c.segs);
    free(mine);
    free(c.world_ranks);
    free(c.records);
    free(c.slots);
    return st;
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
