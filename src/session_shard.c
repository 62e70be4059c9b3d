/* The sharded collectives of a session (seldp/shard.h): the reduce-scatter of the gradients
 * into each rank's range of the shard map, and the all-gather of the ranges into the
 * parameters.
 *
 * They run in the stages of the session's reductions (session_reduce.c), and reuse their
 * checks, their agreement (session_agree.c: the record carries the call's kind, so that an
 * all-reduce on one rank and a reduce-scatter on another disagree) and their confirmation:
 *   prepare   this rank's arguments (the map, the range's size), its gradients (frozen,
 *             dtype, shape, device, finiteness), the staging buffer when the call stages;
 *   agree     one all-gatherv of a record per rank; the decision of the reductions
 *             (local failures, non-finite inputs, the global weight, presence, policy);
 *   move      on the fused path (the host-staged transport on host memory) one fused
 *             reduce-scatter or all-gather that reads and writes the caller's memory
 *             directly; else the gradients converted into the FP32 staging buffer at their
 *             map offsets, reduce-scattered in buckets, scaled, or the ranges all-gathered
 *             into it in buckets;
 *   confirm   with cfg.staged_commit only (one all-gather of every rank's status);
 *   commit    the rank's present pieces copied from the staging buffer into the range, or
 *             the gathered elements converted into the parameters.
 * Transport calls, the same on every rank: 1 allgatherv of the records (and, after a local
 * failure somewhere, 1 of the messages); then one fused collective, or
 * ceil(bytes / bucket_bytes) reduce_scatter or allgather_counts calls over the whole map
 * (none when nothing is present); with cfg.staged_commit 1 allgather of the statuses. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bucket.h"
#include "comm/comm_impl.h"
#include "device.h"
#include "internal.h"
#include "kernels.h"
#include "session_reduce.h"
#include "shard_impl.h"

/* One sharded call: the reduction's state and what the map and the caller add to it. */
typedef struct shard_call {
    reduce_call c;
    const seldp_shard_map *map;
    size_t begin, end;      /* this rank's range */
    float *range;           /* scatter: the caller's range */
    bool *present;          /* scatter: the caller's flags, or NULL */
    const void *in;         /* gather: the caller's range */
    seldp__shard_seg *segs; /* the fused path: one per slot */
    size_t *counts;         /* the bucketed path: per rank, one bucket's part of its range */
} shard_call;

static seldp_status shard_alloc(shard_call *sc)
{
    const seldp_session *s = sc->c.s;
    size_t n = (size_t)seldp_comm_size(s->comm);
    sc->segs = malloc((s->n_slots ? s->n_slots : 1) * sizeof *sc->segs);
    sc->counts = malloc(n * sizeof *sc->counts);
    if (!sc->segs || !sc->counts)
        return seldp__fail(SELDP_ERR_NOMEM, "out of memory planning a sharded call of %zu tensors",
                           s->n_slots);
    return SELDP_OK;
}

static void shard_free(shard_call *sc)
{
    seldp__reduce_call_free(&sc->c);
    free(sc->segs);
    free(sc->counts);
}

/* The group's part of bucket [b0, b1) of the index space: each rank's share of its range
 * into sc->counts; *mine receives where this rank's share starts. */
static void bucket_counts(shard_call *sc, size_t b0, size_t b1, size_t *mine)
{
    int n = seldp_comm_size(sc->c.s->comm);
    for (int r = 0; r < n; r++) {
        size_t lo, hi;
        seldp__shard_range(sc->map, r, &lo, &hi);
        lo = lo > b0 ? lo : b0;
        hi = hi < b1 ? hi : b1;
        sc->counts[r] = hi > lo ? hi - lo : 0;
    }
    *mine = sc->begin > b0 ? sc->begin : b0;
}

/* Everything this rank can check and allocate alone, before the agreement. */
static seldp_status shard_prepare(shard_call *sc, const void *range, size_t range_count)
{
    seldp_status st = SELDP_OK;
    reduce_call *c = &sc->c;
    seldp_session *s = c->s;
    const char *call = seldp__reduce_call_name(c);

    SELDP_CHECK(seldp__shard_check(sc->map, s, range, range_count, call));
    if (c->kind == REDUCE_KIND_SCATTER) {
        if (!c->grads)
            SELDP_FAIL(SELDP_ERR_INVALID_ARGUMENT, "%s: grads must not be NULL", call);
        if (c->policy != SELDP_MISSING_ERROR && c->policy != SELDP_MISSING_ZERO)
            SELDP_FAIL(SELDP_ERR_INVALID_ARGUMENT, "%s: missing-gradient policy %d is invalid",
                       call, (int)c->policy);
    } else if (c->range_dtype != SELDP_F32 && c->range_dtype != SELDP_F16 &&
               c->range_dtype != SELDP_BF16) {
        SELDP_FAIL(SELDP_ERR_DTYPE, "%s: ranges of %s, expected f32, f16 or bf16", call,
                   seldp_dtype_name(c->range_dtype));
    } else if (c->range_dtype != SELDP_F32) {
        /* a half range goes into parameters of its dtype, or F32 ones (exactly) */
        for (size_t k = 0; k < s->n_slots; k++) {
            const session_param *g = &s->params[s->slot_param[k]];
            if (g->tensor.dtype != c->range_dtype && g->tensor.dtype != SELDP_F32)
                SELDP_FAIL(SELDP_ERR_DTYPE,
                           "%s: '%s' is %s, but the ranges are %s (F32 ranges convert into "
                           "every parameter dtype; a half range only into its own dtype or "
                           "F32)",
                           call, g->path, seldp_dtype_name(g->tensor.dtype),
                           seldp_dtype_name(c->range_dtype));
        }
    }
    c->fused = s->fused && seldp__comm_shard_fused(s->comm, s->device);
    c->staged = !c->fused || s->cfg.staged_commit;
    SELDP_CHECK(shard_alloc(sc));
    if (c->staged && !s->staging && s->slot_elems)
        SELDP_CHECK(
            seldp__device_alloc(s->device, s->slot_elems * sizeof(float), (void **)&s->staging));
    for (size_t i = 0; c->kind == REDUCE_KIND_SCATTER && i < s->n_params; i++) {
        const seldp_tensor *t = seldp_grads_get(c->grads, s->params[i].id);
        if (!t)
            continue;
        SELDP_CHECK(seldp__reduce_check_gradient(c, &s->params[i], t));
        SELDP_CHECK(seldp__reduce_check_finite(c, s->params[i].slot));
    }
fail:
    return st;
}

/* --- reduce-scatter ------------------------------------------------------------ */

/* Collective: the fused reduce-scatter of the present parameters, into the range, or into
 * the staging buffer at the range's offsets when the call is staged. */
static seldp_status scatter_fused(shard_call *sc, bool *written)
{
    reduce_call *c = &sc->c;
    seldp_session *s = c->s;
    size_t n = 0;
    for (size_t k = 0; k < s->n_slots; k++) {
        const reduce_slot *slot = &c->slots[k];
        size_t count = seldp_tensor_numel(&s->params[s->slot_param[k]].tensor);
        if (!slot->present || !count)
            continue;
        bool contributes = c->weight > 0 && slot->has_grad;
        sc->segs[n++] = (seldp__shard_seg){
            .in = contributes ? slot->grad.data : NULL,
            .in_dtype = contributes ? slot->grad.dtype : SELDP_F32,
            .offset = sc->map->offset[k],
            .count = count,
        };
    }
    if (!n)
        return SELDP_OK;
    seldp__scatter_fused_args args = {
        .segs = sc->segs,
        .n_segs = n,
        .begin = sc->begin,
        .end = sc->end,
        .out = c->staged ? s->staging + sc->begin : sc->range,
        .scale = c->normalize ? 1.0 / (double)c->global_weight : 1.0,
        .written = written,
    };
    return seldp__comm_scatter_fused(s->comm, &args);
}

/* Collective: the bucketed reduce-scatter. Every slot at its map offset in the staging
 * buffer (this rank's contributions, zeros elsewhere), reduce-scattered in buckets of
 * cfg.bucket_bytes into the range's place there, then scaled. */
static seldp_status scatter_bucketed(shard_call *sc)
{
    seldp_status st = SELDP_OK;
    reduce_call *c = &sc->c;
    seldp_session *s = c->s;
    seldp__convert_queue q = {.device = s->device};
    bool any = false;

    for (size_t k = 0; k < s->n_slots; k++)
        any |= c->slots[k].present;
    if (!any)
        return SELDP_OK; /* nothing to reduce: every piece is absent */
    for (size_t k = 0; k < s->n_slots; k++) {
        const reduce_slot *slot = &c->slots[k];
        bool contributes = c->weight > 0 && slot->has_grad && slot->present;
        SELDP_CHECK(seldp__convert_queue_add(
            &q, (seldp__convert_seg){
                    .dst = s->staging + sc->map->offset[k],
                    .src = contributes ? slot->grad.data : NULL, /* NULL: zeros */
                    .dst_dtype = SELDP_F32,
                    .src_dtype = contributes ? slot->grad.dtype : SELDP_F32,
                    .n = seldp_tensor_numel(&s->params[s->slot_param[k]].tensor),
                }));
    }
    SELDP_CHECK(seldp__convert_queue_flush(&q));
    size_t total = sc->map->elements * sizeof(float);
    size_t capacity = seldp__bucket_capacity(s->cfg.bucket_bytes, sizeof(float));
    for (size_t b = 0, n = seldp__bucket_count(total, capacity); b < n; b++) {
        size_t offset, bytes, mine;
        seldp__bucket_span(total, capacity, b, &offset, &bytes);
        bucket_counts(sc, offset / sizeof(float), (offset + bytes) / sizeof(float), &mine);
        SELDP_CHECK(seldp_comm_reduce_scatter(s->comm, s->staging + offset / sizeof(float),
                                              s->staging + mine, sc->counts, SELDP_F32, s->device));
    }
    if (c->normalize && sc->end > sc->begin)
        SELDP_CHECK(seldp__scale_f32(s->device, s->staging + sc->begin, sc->end - sc->begin,
                                     1.0 / (double)c->global_weight));
fail:
    return st;
}

seldp_status seldp__shard_commit(const reduce_call *c, const seldp_shard_map *map, float *range,
                                 bool *present)
{
    seldp_status st = SELDP_OK;
    const seldp_session *s = c->s;
    seldp__convert_queue q = {.device = s->device};
    int me = seldp_comm_rank(s->comm);
    size_t begin, end;

    seldp__shard_range(map, me, &begin, &end);
    for (size_t i = 0; c->staged && i < map->pieces[me]; i++) {
        size_t k = seldp__shard_piece_slot(map, me, i);
        size_t off = map->offset[k],
               to = off + seldp_tensor_numel(&s->params[s->slot_param[k]].tensor);
        size_t first = off > begin ? off : begin, last = to < end ? to : end;
        if (!c->slots[k].present || last <= first)
            continue;
        SELDP_CHECK(seldp__convert_queue_add(&q, (seldp__convert_seg){
                                                     .dst = range + (first - begin),
                                                     .src = s->staging + first,
                                                     .dst_dtype = SELDP_F32,
                                                     .src_dtype = SELDP_F32,
                                                     .n = last - first,
                                                 }));
    }
    SELDP_CHECK(seldp__convert_queue_flush(&q));
    for (size_t i = 0; present && i < map->pieces[me]; i++)
        present[i] = c->slots[seldp__shard_piece_slot(map, me, i)].present;
fail:
    return st;
}

static seldp_status shard_scatter(seldp_session *s, const seldp_shard_map *map, seldp_grads *grads,
                                  uint64_t weight, seldp_missing_policy policy, bool normalize,
                                  float *range, size_t range_count, bool *present,
                                  uint64_t *global_weight)
{
    seldp_status st = SELDP_OK, local;
    shard_call sc = {.c = {.s = s,
                           .grads = grads,
                           .normalize = normalize,
                           .fp32 = true,
                           .kind = REDUCE_KIND_SCATTER,
                           .policy = policy,
                           .weight = weight},
                     .map = map,
                     .range = range,
                     .present = present};
    reduce_call *c = &sc.c;
    const char *call = seldp__reduce_call_name(c);
    unsigned char *mine = NULL;
    char message[SESSION_MESSAGE_MAX];
    bool written = false;

    if (!s)
        return seldp__fail(SELDP_ERR_INVALID_ARGUMENT, "%s: session must not be NULL", call);
    if ((st = seldp__session_busy(s, call)) != SELDP_OK)
        return st;
    c->call = ++s->reductions;
    /* Without these this rank cannot take part; the others' collectives then end with the
     * transport's timeout rather than hanging. */
    SELDP_CHECK(seldp__reduce_call_alloc(c, seldp_comm_size(s->comm)));
    if (!(mine = calloc(1, c->record_bytes)))
        SELDP_FAIL(SELDP_ERR_NOMEM, "out of memory for the agreement record");
    if (map && map->session == s)
        seldp__shard_range(map, seldp_comm_rank(s->comm), &sc.begin, &sc.end);

    local = shard_prepare(&sc, range, range_count);
    seldp__session_save_message(s->comm, local, message);
    seldp__reduce_fill_record(c, local, (reduce_record *)mine);
    SELDP_CHECK(seldp__reduce_agree(c, mine, message, NULL));
    st = c->fused ? scatter_fused(&sc, &written) : scatter_bucketed(&sc);
    if (st != SELDP_OK && written && !c->staged) {
        char why[SESSION_MESSAGE_MAX];
        snprintf(why, sizeof why, "%s (%s)", seldp_last_error(), seldp_status_name(st));
        st = seldp__fail(SELDP_ERR_GRADS_UNDEFINED,
                         "%s: the fused reduce-scatter failed while writing the range, so the "
                         "range holds undefined values (the gradients are unchanged; "
                         "cfg.staged_commit keeps the range unchanged too): %s",
                         call, why);
    }
    st = seldp__session_name_call(st, call, "the reduce-scatter");
    if (s->cfg.staged_commit)
        st = seldp__reduce_confirm(c, st);
    SELDP_CHECK(st);
    SELDP_CHECK(seldp__shard_commit(c, map, range, present));
    if (global_weight)
        *global_weight = c->global_weight;
fail:
    shard_free(&sc);
    free(mine);
    return seldp__session_name_call(st, call, NULL);
}

seldp_status seldp_shard_reduce_scatter(seldp_session *session, const seldp_shard_map *map,
                                        seldp_grads *grads, uint64_t local_weight,
                                        seldp_missing_policy policy, float *range,
                                        size_t range_count, bool *present, uint64_t *global_weight)
{
    return shard_scatter(session, map, grads, local_weight, policy, true, range, range_count,
                         present, global_weight);
}

seldp_status seldp_shard_reduce_scatter_sum(seldp_session *session, const seldp_shard_map *map,
                                            seldp_grads *grads, bool local_active,
                                            seldp_missing_policy policy, float *range,
                                            size_t range_count, bool *present,
                                            uint64_t *global_weight)
{
    return shard_scatter(session, map, grads, local_active ? 1 : 0, policy, false, range,
                         range_count, present, global_weight);
}

/* --- all-gather ---------------------------------------------------------------- */

/* Collective: the fused all-gather of the ranges into every rank's parameters, or into the
 * staging buffer (F32 at the map offsets) when the call is staged. */
static seldp_status gather_fused(shard_call *sc, bool *written)
{
    reduce_call *c = &sc->c;
    seldp_session *s = c->s;
    size_t n = 0;
    for (size_t k = 0; k < s->n_slots; k++) {
        const session_param *g = &s->params[s->slot_param[k]];
        size_t count = seldp_tensor_numel(&g->tensor);
        if (!count)
            continue;
        sc->segs[n++] = (seldp__shard_seg){
            .out = c->staged ? (void *)(s->staging + sc->map->offset[k]) : g->tensor.data,
            .out_dtype = c->staged ? SELDP_F32 : g->tensor.dtype,
            .offset = sc->map->offset[k],
            .count = count,
        };
    }
    if (!n)
        return SELDP_OK;
    seldp__gather_fused_args args = {
        .segs = sc->segs,
        .n_segs = n,
        .begin = sc->begin,
        .end = sc->end,
        .in = sc->in,
        .in_dtype = c->range_dtype,
        .written = written,
    };
    return seldp__comm_gather_fused(s->comm, &args);
}

/* Collective: the ranges all-gathered in their dtype into the staging buffer, element i at
 * byte i * its size, in buckets of cfg.bucket_bytes. */
static seldp_status gather_bucketed(shard_call *sc)
{
    seldp_status st = SELDP_OK;
    reduce_call *c = &sc->c;
    seldp_session *s = c->s;
    size_t esize = seldp_dtype_size(c->range_dtype);
    size_t total = sc->map->elements * esize;
    size_t capacity = seldp__bucket_capacity(s->cfg.bucket_bytes, esize);
    char *staging = (char *)s->staging;

    for (size_t b = 0, n = seldp__bucket_count(total, capacity); b < n; b++) {
        size_t offset, bytes, mine;
        seldp__bucket_span(total, capacity, b, &offset, &bytes);
        bucket_counts(sc, offset / esize, (offset + bytes) / esize, &mine);
        int me = seldp_comm_rank(s->comm);
        const char *send = sc->counts[me] ? (const char *)sc->in + (mine - sc->begin) * esize
                                          : (const char *)sc->in;
        SELDP_CHECK(seldp_comm_allgather_counts(s->comm, send, staging + offset, sc->counts,
                                                c->range_dtype, s->device));
    }
fail:
    return st;
}

/* The staged elements converted into every parameter (F32 from the fused path, the range
 * dtype from the bucketed one). */
static seldp_status gather_commit(shard_call *sc)
{
    seldp_status st = SELDP_OK;
    reduce_call *c = &sc->c;
    seldp_session *s = c->s;
    seldp__convert_queue q = {.device = s->device};
    seldp_dtype from = c->fused ? SELDP_F32 : c->range_dtype;

    for (size_t k = 0; c->staged && k < s->n_slots; k++) {
        const session_param *g = &s->params[s->slot_param[k]];
        size_t count = seldp_tensor_numel(&g->tensor);
        if (!count)
            continue;
        SELDP_CHECK(seldp__convert_queue_add(
            &q, (seldp__convert_seg){
                    .dst = g->tensor.data,
                    .src = (char *)s->staging + sc->map->offset[k] * seldp_dtype_size(from),
                    .dst_dtype = g->tensor.dtype,
                    .src_dtype = from,
                    .n = count,
                }));
    }
    SELDP_CHECK(seldp__convert_queue_flush(&q));
fail:
    return st;
}

seldp_status seldp_shard_allgather_params(seldp_session *s, const seldp_shard_map *map,
                                          const void *range, seldp_dtype range_dtype,
                                          size_t range_count)
{
    seldp_status st = SELDP_OK, local;
    shard_call sc = {.c = {.s = s, .kind = REDUCE_KIND_GATHER, .range_dtype = range_dtype},
                     .map = map,
                     .in = range};
    reduce_call *c = &sc.c;
    const char *call = seldp__reduce_call_name(c);
    unsigned char *mine = NULL;
    char message[SESSION_MESSAGE_MAX];
    bool written = false;

    if (!s)
        return seldp__fail(SELDP_ERR_INVALID_ARGUMENT, "%s: session must not be NULL", call);
    if ((st = seldp__session_busy(s, call)) != SELDP_OK)
        return st;
    c->call = ++s->reductions;
    SELDP_CHECK(seldp__reduce_call_alloc(c, seldp_comm_size(s->comm)));
    if (!(mine = calloc(1, c->record_bytes)))
        SELDP_FAIL(SELDP_ERR_NOMEM, "out of memory for the agreement record");
    if (map && map->session == s)
        seldp__shard_range(map, seldp_comm_rank(s->comm), &sc.begin, &sc.end);

    local = shard_prepare(&sc, range, range_count);
    seldp__session_save_message(s->comm, local, message);
    seldp__reduce_fill_record(c, local, (reduce_record *)mine);
    SELDP_CHECK(seldp__reduce_agree(c, mine, message, NULL));
    st = c->fused ? gather_fused(&sc, &written) : gather_bucketed(&sc);
    if (st != SELDP_OK && written && !c->staged) {
        char why[SESSION_MESSAGE_MAX];
        snprintf(why, sizeof why, "%s (%s)", seldp_last_error(), seldp_status_name(st));
        st = seldp__fail(SELDP_ERR_PARAMS_UNDEFINED,
                         "%s: the fused all-gather failed while writing the parameters, so the "
                         "selected trainable parameters hold undefined values (cfg.staged_commit "
                         "keeps them unchanged): %s",
                         call, why);
    }
    st = seldp__session_name_call(st, call, "the all-gather");
    if (s->cfg.staged_commit)
        st = seldp__reduce_confirm(c, st);
    SELDP_CHECK(st);
    SELDP_CHECK(gather_commit(&sc));
fail:
    shard_free(&sc);
    free(mine);
    return seldp__session_name_call(st, call, NULL);
}
