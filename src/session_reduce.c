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
 * On the fused path (the host-staged transport on host memory, unless the session chose
 * the bucketed one) the transport's fused reduction replaces pack and allreduce: it reads
 * every rank's gradients where they are, upcasts halves, sums in F32 in rank order, scales
 * by 1/W and writes the results straight into the tensors the commit would have written,
 * in one pass and one rendezvous, with no staging buffer; the results are the same bits. A
 * failure after that writing began is SELDP_ERR_GRADS_UNDEFINED. With cfg.staged_commit it
 * writes F32 results into the staging buffer instead, and the commit converts them. */
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

/* Bytes of a session's first path carried in the record, for messages. */
#define RECORD_PATH_MAX 64
/* reduce_record.nonfinite_slot when every input is finite (or none was checked) */
#define NO_NONFINITE UINT64_MAX

/* The fixed part of a rank's agreement record; uint64 fields and a path of a multiple of
 * 8 bytes, so no padding. The presence bitmap (n_slots bits, padded to 8 bytes) follows. */
typedef struct reduce_record {
    uint64_t status;
    uint64_t world_rank;
    uint64_t normalize;
    uint64_t fp32;
    uint64_t policy;
    uint64_t weight;
    /* the session's fingerprint */
    uint64_t digest;   /* of the selection's schema */
    uint64_t call;     /* this is the session's call-th reduction, from 1 */
    uint64_t n_groups; /* selected parameters */
    uint64_t n_slots;  /* reducible ones: bits in the bitmap */
    /* the first non-finite input gradient (cfg.check_finite, active ranks) */
    uint64_t nonfinite_slot; /* its slot (path order), or NO_NONFINITE */
    uint64_t nonfinite_elem; /* its first non-finite element */
    uint64_t nonfinite_count;
    char first_path[RECORD_PATH_MAX]; /* the session's first selected path, truncated */
} reduce_record;

typedef struct reduce_call {
    seldp_session *s;
    seldp_grads *grads;
    bool normalize, fp32;
    seldp_missing_policy policy;
    uint64_t weight; /* the rank's weight: local_weight, or 1/0 for active/inactive */
    uint64_t call;   /* the session's reduction count, this call included */
    reduce_slot *slots;
    uint64_t nonfinite_slot, nonfinite_elem, nonfinite_count; /* this rank's first */
    size_t record_bytes;
    unsigned char *records; /* every rank's record, back to back (one allgatherv) */
    size_t *record_lengths; /* bytes of each rank's record */
    size_t *record_offsets; /* where each rank's record starts in records */
    int *world_ranks;
    uint64_t global_weight;
    size_t elems;            /* F32 elements of the present parameters */
    bool fused;              /* the transport reduces the tensors in a single pass */
    bool staged;             /* results land in the staging buffer first (bucketed path) */
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
    return (reduce_record *)(c->records + c->record_offsets[rank]);
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
    /* Groups are checked in path order: the first non-finite one found is this rank's
     * first; the agreement picks the first of all ranks. */
    if (c->s->cfg.check_finite && c->weight > 0 && c->nonfinite_slot == NO_NONFINITE) {
        size_t n = seldp_tensor_numel(t);
        SELDP_CHECK(seldp__find_nonfinite(c->s->device, t->data, t->dtype, n, &bad));
        if (bad < n) {
            c->nonfinite_slot = g->slot;
            c->nonfinite_elem = bad;
            c->nonfinite_count = n;
        }
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
    c->fused = s->fused;
    c->staged = !c->fused || s->cfg.staged_commit;
    if (c->fused && !(c->segs = malloc((s->n_slots ? s->n_slots : 1) * sizeof *c->segs)))
        SELDP_FAIL(SELDP_ERR_NOMEM, "out of memory planning the reduction of %zu tensors",
                   s->n_slots);
    if (c->staged && !s->staging && s->slot_elems)
        SELDP_CHECK(
            seldp__device_alloc(s->device, s->slot_elems * sizeof(float), (void **)&s->staging));
    for (size_t i = 0; i < s->n_groups; i++) {
        const seldp_tensor *t = seldp_grads_get(c->grads, s->groups[i].id);
        if (t)
            SELDP_CHECK(check_gradient(c, &s->groups[i], t));
    }
    /* Results that cannot be written in place are allocated now, and room made in the
     * container for those that become new entries, so that the commit cannot fail after
     * the collectives for want of memory. */
    size_t added = 0;
    for (size_t k = 0; k < s->n_slots; k++)
        added += !c->slots[k].has_grad;
    SELDP_CHECK(seldp_grads_reserve(c->grads, added));
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
    const seldp_session *s = c->s;
    unsigned char *bits = (unsigned char *)(mine + 1);
    mine->status = (uint64_t)local;
    mine->world_rank = (uint64_t)seldp_comm_world_rank(s->comm);
    mine->normalize = c->normalize;
    mine->fp32 = c->fp32;
    mine->policy = (uint64_t)c->policy;
    mine->weight = c->weight;
    mine->digest = s->digest;
    mine->call = c->call;
    mine->n_groups = s->n_groups;
    mine->n_slots = s->n_slots;
    mine->nonfinite_slot = c->nonfinite_slot;
    mine->nonfinite_elem = c->nonfinite_elem;
    mine->nonfinite_count = c->nonfinite_count;
    if (s->n_groups)
        snprintf(mine->first_path, sizeof mine->first_path, "%s", s->groups[0].path);
    for (size_t k = 0; k < c->s->n_slots; k++)
        if (c->slots[k].has_grad)
            bits[k / 8] |= (unsigned char)(1u << (k % 8));
}

/* --- decide ---------------------------------------------------------------- */

/* "the session of 'path' (N parameters, schema 0x...)" into buf, from a gathered record. */
static const char *session_name(const reduce_record *rec, char *buf, size_t size)
{
    if (rec->n_groups == 0)
        snprintf(buf, size, "the session of an empty selection (schema %016" PRIx64 ")",
                 rec->digest);
    else
        snprintf(buf, size,
                 "the session of '%.*s' (%" PRIu64 " parameter%s, schema %016" PRIx64 ")",
                 RECORD_PATH_MAX - 1, rec->first_path, rec->n_groups, rec->n_groups == 1 ? "" : "s",
                 rec->digest);
    return buf;
}

/* Every record is whole and its bitmap as long as its session's slots need; a malformed
 * one means a rank is not running this library's reduction. */
static seldp_status check_records(reduce_call *c, int n)
{
    size_t offset = 0;
    for (int r = 0; r < n; r++) {
        size_t len = c->record_lengths[r];
        const reduce_record *rec = (const reduce_record *)(c->records + offset);
        c->record_offsets[r] = offset;
        if (len < sizeof *rec || len % 8 != 0 || (len - sizeof *rec) * 8 < rec->n_slots)
            return seldp__fail(SELDP_ERR_INTERNAL,
                               "%s: group rank %d sent a malformed agreement record of %zu bytes",
                               method_name(c->normalize, c->fp32), r, len);
        offset += len;
    }
    return SELDP_OK;
}

/* Every rank must be in the same call of the same session, with the same method and
 * policy: else SELDP_ERR_DISAGREE naming the first rank that differs from group rank 0. */
static seldp_status agree_on_call(const reduce_call *c, int n)
{
    const reduce_record *a = record_of(c, 0);
    const int *world = c->world_ranks;
    char sa[RECORD_PATH_MAX + 96], sb[RECORD_PATH_MAX + 96];

    for (int r = 1; r < n; r++) {
        const reduce_record *b = record_of(c, r);
        if (b->digest != a->digest || b->n_groups != a->n_groups || b->n_slots != a->n_slots)
            return seldp__fail(
                SELDP_ERR_DISAGREE,
                "ranks reduce different sessions: group rank 0 (world rank %d) called %s on %s "
                "(its call %" PRIu64 "), group rank %d (world rank %d) called %s on %s (its call "
                "%" PRIu64 "); every rank must reduce the same sessions in the same order",
                world[0], method_name(a->normalize, a->fp32), session_name(a, sa, sizeof sa),
                a->call, r, world[r], method_name(b->normalize, b->fp32),
                session_name(b, sb, sizeof sb), b->call);
        if (b->call != a->call)
            return seldp__fail(
                SELDP_ERR_DISAGREE,
                "ranks are out of step on %s: group rank 0 (world rank %d) called %s as the "
                "session's call %" PRIu64 ", group rank %d (world rank %d) called %s as its call "
                "%" PRIu64 "; a rank missed or added a call",
                session_name(a, sa, sizeof sa), world[0], method_name(a->normalize, a->fp32),
                a->call, r, world[r], method_name(b->normalize, b->fp32), b->call);
        if (b->normalize != a->normalize || b->fp32 != a->fp32 || b->policy != a->policy)
            return seldp__fail(
                SELDP_ERR_DISAGREE,
                "ranks disagree on the reduction: group rank 0 (world rank %d) called %s "
                "with policy %s, group rank %d (world rank %d) called %s with policy %s",
                world[0], method_name(a->normalize, a->fp32), policy_name(a->policy), r, world[r],
                method_name(b->normalize, b->fp32), policy_name(b->policy));
    }
    return SELDP_OK;
}

/* With cfg.check_finite: SELDP_ERR_NONFINITE naming the first non-finite input gradient
 * in path order, and of those the lowest group rank's. */
static seldp_status agree_finite(const reduce_call *c, int n)
{
    int worst = -1;
    for (int r = 0; r < n; r++) {
        uint64_t slot = record_of(c, r)->nonfinite_slot;
        if (slot != NO_NONFINITE && (worst < 0 || slot < record_of(c, worst)->nonfinite_slot))
            worst = r;
    }
    if (worst < 0)
        return SELDP_OK;
    const reduce_record *rec = record_of(c, worst);
    if (rec->nonfinite_slot >= c->s->n_slots)
        return seldp__fail(SELDP_ERR_INTERNAL,
                           "group rank %d named a non-finite slot %" PRIu64 " of %zu", worst,
                           rec->nonfinite_slot, c->s->n_slots);
    return seldp__fail(SELDP_ERR_NONFINITE,
                       "'%s': the gradient of group rank %d (world rank %d) is not finite at "
                       "element %" PRIu64 " of %" PRIu64
                       " (the first non-finite input in path order, then group rank)",
                       c->s->groups[c->s->slot_group[rec->nonfinite_slot]].path, worst,
                       c->world_ranks[worst], rec->nonfinite_elem, rec->nonfinite_count);
}

/* The outcome of the agreement, computed by every rank from the same gathered records. */
static seldp_status reduce_decide(reduce_call *c, const char *message)
{
    seldp_status st = SELDP_OK;
    seldp_session *s = c->s;
    int n = seldp_comm_size(s->comm), *lacking = NULL, *having = NULL;
    const reduce_record *first;

    SELDP_CHECK(check_records(c, n));
    first = record_of(c, 0);
    for (int r = 0; r < n; r++)
        c->world_ranks[r] = (int)record_of(c, r)->world_rank;
    SELDP_CHECK(agree_on_call(c, n));
    for (int r = 0; r < n; r++)
        if (record_of(c, r)->status != SELDP_OK)
            return seldp__session_share_error(s->comm, r, (seldp_status)record_of(c, r)->status,
                                              message);
    SELDP_CHECK(agree_finite(c, n));

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
 * the caller's own when it has the result dtype, else the result allocated in prepare;
 * or, when the call is staged, into its F32 place in the staging buffer. */
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

/* Collective, with cfg.staged_commit: every rank tells the others whether its part of the
 * reduction succeeded, and the staged results are committed only when every rank's did.
 * `reduced` is this rank's status so far; the status of the lowest failing rank, with its
 * message, is returned on every rank that can still reach the others. */
static seldp_status reduce_confirm(reduce_call *c, seldp_status reduced)
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
        method_name(c->normalize, c->fp32), "the confirmation");
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

/* Write the results into the caller's container. Everything it needs, the container's
 * room for new entries included, was allocated before the agreement. */
static seldp_status reduce_commit(reduce_call *c)
{
    seldp_status st = SELDP_OK;
    seldp_session *s = c->s;

    if (c->staged)
        SELDP_CHECK(commit_convert(c));
    for (size_t k = 0; k < s->n_slots; k++) {
        const session_group *g = &s->groups[s->slot_group[k]];
        reduce_slot *slot = &c->slots[k];
        seldp_dtype dtype = result_dtype(c, g);
        if (!slot->present) {
            drop_gradient(c->grads, g->id);
        } else if (!(slot->has_grad && slot->grad.dtype == dtype)) {
            /* owned results (written by the transport, or by commit_convert from the staging
             * buffer) go into the container in place of the caller's entry */
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
    c.call = ++s->reductions;
    c.nonfinite_slot = NO_NONFINITE;
    /* the bitmap is padded to 8 bytes so that every gathered record stays aligned */
    bitmap_bytes = (s->n_slots + 63) / 64 * 8;
    c.record_bytes = sizeof(reduce_record) + bitmap_bytes;
    /* Without these this rank cannot take part; the others' collectives then end with the
     * transport's timeout rather than hanging. */
    c.slots = calloc(s->n_slots ? s->n_slots : 1, sizeof *c.slots);
    c.record_lengths = calloc((size_t)n, sizeof *c.record_lengths);
    c.record_offsets = calloc((size_t)n, sizeof *c.record_offsets);
    c.world_ranks = calloc((size_t)n, sizeof *c.world_ranks);
    mine = calloc(1, c.record_bytes);
    if (!c.slots || !c.record_lengths || !c.record_offsets || !c.world_ranks || !mine)
        SELDP_FAIL(SELDP_ERR_NOMEM, "out of memory for the agreement of %d ranks", n);

    local = reduce_prepare(&c);
    seldp__session_save_message(s->comm, local, message);
    fill_record(&c, local, (reduce_record *)mine);
    /* Variable-length, so that ranks in sessions of different sizes meet here and say so. */
    SELDP_CHECK(seldp__session_name_call(
        seldp_comm_allgatherv(s->comm, mine, c.record_bytes, (void **)&c.records, c.record_lengths),
        method_name(normalize, fp32), "the agreement"));
    SELDP_CHECK(reduce_decide(&c, message));
    if (c.fused) {
        st = reduce_fused(&c);
    } else {
        st = reduce_pack(&c);
        if (st == SELDP_OK)
            st = reduce_allreduce(&c);
    }
    st = seldp__session_name_call(st, method_name(normalize, fp32), "the reduction");
    if (s->cfg.staged_commit)
        st = reduce_confirm(&c, st);
    SELDP_CHECK(st);
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
    free(c.record_offsets);
    free(c.record_lengths);
    free(c.records);
    free(c.slots);
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
