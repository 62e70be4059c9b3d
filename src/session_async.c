/* Overlapped reductions: seldp_session_{reduce,reduce_fp32,sum,sum_fp32}_start,
 * seldp_session_mark_ready and seldp_session_finish (contracts in include/seldp/session.h).
 *
 * One progress thread per session (session_async_progress.c), created by the first start,
 * runs the collectives of a reduction while the caller's thread goes on with its backward:
 *   agree     the blocking call's agreement (session_agree.c) on method, policy, weight and
 *             the session's fingerprint, with no presence bits yet;
 *   buckets   the reducible parameters laid out in path order in the session's F32
 *             staging buffer (the blocking bucketed path's layout when every parameter is
 *             present), cut into buckets of cfg.bucket_bytes, taken last to first (reverse
 *             path order, as backward produces the gradients); a bucket, once every
 *             parameter it holds is marked: this rank's contributions converted into it
 *             (zeros where it has none), one allreduce, the scale by 1/W; on a fused
 *             session (a transport with a fused reduction over the session's memory:
 *             the host-staged one on host memory, NCCL on the rank's GPU) the
 *             transport's fused reduction does the three at once, the same bits, into the
 *             staging buffer.
 * The caller's thread marks (under the lock: the container is read there and only there)
 * and, at finish, marks the rest, allocates the results, waits for the thread, and runs
 * the final agreement (status, presence, first non-finite input) and the commit of the
 * blocking path (session_commit.c). Nothing is written into the container before then.
 *
 * Transport calls, the same on every rank: on the progress thread, 1 allgatherv of the
 * records (and, when some rank failed locally, 1 allgatherv of the messages); then, unless
 * no rank is active, one allreduce or one fused reduction per bucket, ceil(4 * reducible
 * elements / bucket_bytes) of them, every reducible parameter included (absent ones as
 * zeros: presence is known only at finish). On the caller's thread at finish, 1 allgatherv
 * of the final records (and 1 of the messages after a failure). */
#define _POSIX_C_SOURCE 200809L

#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bucket.h"
#include "device.h"
#include "internal.h"
#include "kernels.h"
#include "session_async.h"
#include "shard_impl.h"

#define FINISH "seldp_session_finish"
#define MARK   "seldp_session_mark_ready"

/* --- communicators owned by a progress thread ------------------------------ */

/* Process-wide: the communicators of the reductions in flight, so that a session call on
 * one of them from the caller's thread fails instead of racing the progress thread. */
static pthread_mutex_t busy_lock = PTHREAD_MUTEX_INITIALIZER;
static const seldp_comm **busy;
static size_t n_busy, busy_cap;

static bool busy_has(const seldp_comm *comm)
{
    bool hit = false;
    pthread_mutex_lock(&busy_lock);
    for (size_t i = 0; i < n_busy && !hit; i++)
        hit = busy[i] == comm;
    pthread_mutex_unlock(&busy_lock);
    return hit;
}

static seldp_status busy_add(const seldp_comm *comm)
{
    seldp_status st = SELDP_OK;
    pthread_mutex_lock(&busy_lock);
    if (n_busy == busy_cap) {
        size_t cap = busy_cap ? 2 * busy_cap : 8;
        const seldp_comm **grown = realloc(busy, cap * sizeof *grown);
        if (!grown) {
            pthread_mutex_unlock(&busy_lock);
            return seldp__fail(SELDP_ERR_NOMEM, "out of memory registering a reduction");
        }
        busy = grown;
        busy_cap = cap;
    }
    busy[n_busy++] = comm;
    pthread_mutex_unlock(&busy_lock);
    return st;
}

static void busy_remove(const seldp_comm *comm)
{
    pthread_mutex_lock(&busy_lock);
    for (size_t i = 0; i < n_busy; i++) {
        if (busy[i] == comm) {
            busy[i] = busy[--n_busy];
            break;
        }
    }
    pthread_mutex_unlock(&busy_lock);
}

seldp_status seldp__session_busy(const seldp_session *s, const char *call)
{
    if (s->async && s->async->in_flight)
        return seldp__fail(SELDP_ERR_INVALID_ARGUMENT,
                           "%s: group rank %d (world rank %d): an overlapped reduction is in "
                           "flight on this session; call seldp_session_finish first",
                           call, seldp_comm_rank(s->comm), seldp_comm_world_rank(s->comm));
    if (busy_has(s->comm))
        return seldp__fail(SELDP_ERR_INVALID_ARGUMENT,
                           "%s: group rank %d (world rank %d): an overlapped reduction of another "
                           "session is in flight on this communicator; its progress thread uses "
                           "the communicator until seldp_session_finish",
                           call, seldp_comm_rank(s->comm), seldp_comm_world_rank(s->comm));
    return SELDP_OK;
}

/* --- the session's layout ---------------------------------------------------- */

static int compare_id_param(const void *a, const void *b)
{
    seldp_param_id x = ((const id_param *)a)->id, y = ((const id_param *)b)->id;
    return (x > y) - (x < y);
}

/* The blocking bucketed path's layout when every parameter is present: path order, cut into
 * buckets of `capacity` elements, so that each bucket is the same collective over the same
 * bytes as there (bit-identical results even where a transport's sum depends on the
 * position in the buffer, as NCCL's does). The buckets are reduced last to first: reverse
 * path order, the order backward produces the gradients. */
static void layout(session_async *a)
{
    const seldp_session *s = a->s;
    size_t offset = 0;

    for (size_t k = 0; k < s->n_slots; k++) {
        size_t n = seldp_tensor_numel(&s->params[s->slot_param[k]].tensor);
        a->slot_offset[k] = offset;
        a->slot_first[k] = 1;
        a->slot_last[k] = 0;
        if (n > 0) {
            a->slot_first[k] = offset / a->capacity;
            a->slot_last[k] = (offset + n - 1) / a->capacity;
            for (size_t b = a->slot_first[k]; b <= a->slot_last[k]; b++)
                a->bucket_slots[b]++;
        }
        offset += n;
    }
}

static void async_destroy(session_async *a)
{
    if (!a)
        return;
    free(a->slot_offset);
    free(a->slot_first);
    free(a->slot_last);
    free(a->bucket_slots);
    free(a->pending);
    free(a->marked);
    free(a->index);
    free(a->counts);
    free(a->shard_segs);
    pthread_cond_destroy(&a->idle);
    pthread_cond_destroy(&a->wake);
    pthread_mutex_destroy(&a->lock);
    free(a);
}

static seldp_status async_create(seldp_session *s, session_async **out)
{
    seldp_status st = SELDP_OK;
    session_async *a = calloc(1, sizeof *a);
    size_t slots = s->n_slots ? s->n_slots : 1, buckets;

    *out = NULL;
    if (!a)
        return seldp__fail(SELDP_ERR_NOMEM, "out of memory for an overlapped reduction");
    if (pthread_mutex_init(&a->lock, NULL) != 0 || pthread_cond_init(&a->wake, NULL) != 0 ||
        pthread_cond_init(&a->idle, NULL) != 0) {
        free(a);
        return seldp__fail(SELDP_ERR_NOMEM, "could not create the progress thread's lock");
    }
    a->s = s;
    a->capacity = seldp__bucket_capacity(s->cfg.bucket_bytes, sizeof(float)) / sizeof(float);
    a->n_buckets = seldp__bucket_count(s->slot_elems * sizeof(float), a->capacity * sizeof(float));
    buckets = a->n_buckets ? a->n_buckets : 1;
    a->slot_offset = calloc(slots, sizeof *a->slot_offset);
    a->slot_first = calloc(slots, sizeof *a->slot_first);
    a->slot_last = calloc(slots, sizeof *a->slot_last);
    a->marked = calloc(slots, sizeof *a->marked);
    a->bucket_slots = calloc(buckets, sizeof *a->bucket_slots);
    a->pending = calloc(buckets, sizeof *a->pending);
    a->index = calloc(s->n_params ? s->n_params : 1, sizeof *a->index);
    if (!a->slot_offset || !a->slot_first || !a->slot_last || !a->marked || !a->bucket_slots ||
        !a->pending || !a->index)
        SELDP_FAIL(SELDP_ERR_NOMEM, "out of memory laying out %zu buckets of %zu parameters",
                   a->n_buckets, s->n_slots);
    layout(a);
    for (size_t i = 0; i < s->n_params; i++)
        a->index[i] = (id_param){s->params[i].id, i};
    a->n_index = s->n_params;
    qsort(a->index, a->n_index, sizeof *a->index, compare_id_param);
    *out = a;
    a = NULL;
fail:
    async_destroy(a);
    return st;
}

/* The parameter of a selected id, or NULL. */
static const session_param *find_group(const session_async *a, seldp_param_id id)
{
    id_param key = {id, 0};
    const id_param *hit = bsearch(&key, a->index, a->n_index, sizeof *a->index, compare_id_param);
    return hit ? &a->s->params[hit->param] : NULL;
}

/* --- the caller's side ------------------------------------------------------- */

/* Keep the caller's first failure, named after `call`, for the final agreement. */
static seldp_status record_failure(session_async *a, seldp_status st, const char *call)
{
    if (st == SELDP_OK)
        return st;
    /* named after the call the user made, even when the check names the reduction */
    if (strncmp(seldp_last_error(), "seldp_session_", 14) != 0) {
        char named[SESSION_MESSAGE_MAX];
        snprintf(named, sizeof named, "%s: %s", call, seldp_last_error());
        seldp__set_error(named);
    }
    if (a->local == SELDP_OK) {
        a->local = st;
        snprintf(a->local_message, sizeof a->local_message, "%s", seldp_last_error());
    }
    return st;
}

/* Under the lock: this rank's gradient of slot k is final (from the container now). */
static seldp_status mark_slot(session_async *a, size_t k, const char *call)
{
    seldp_status st = SELDP_OK;
    const session_param *g = &a->s->params[a->s->slot_param[k]];
    const seldp_tensor *t = seldp_grads_get(a->c.grads, g->id);

    if (a->marked[k])
        return record_failure(
            a,
            seldp__fail(SELDP_ERR_INVALID_ARGUMENT,
                        "'%s' was marked ready twice in one reduction (a gradient must not "
                        "change after it is marked ready)",
                        g->path),
            call);
    if (t)
        st = record_failure(a, seldp__reduce_check_gradient(&a->c, g, t), call);
    a->marked[k] = true;
    for (size_t b = a->slot_first[k]; b <= a->slot_last[k]; b++)
        a->pending[b]--;
    pthread_cond_broadcast(&a->wake);
    return st;
}

/* Where an overlapped reduce-scatter's finish writes its results (seldp/shard.h). */
typedef struct shard_target {
    const seldp_shard_map *map;
    float *range;
    size_t count;
    bool *present;
} shard_target;

/* The overlapped reduction of `grads`: an all-reduce, or with `shard` a reduce-scatter into
 * the shard's range. */
static seldp_status async_start(seldp_session *s, seldp_grads *grads, uint64_t weight,
                                seldp_missing_policy policy, bool normalize, bool fp32,
                                const shard_target *shard)
{
    seldp_status st = SELDP_OK, local = SELDP_OK;
    uint64_t kind = shard ? REDUCE_KIND_SCATTER : REDUCE_KIND_ALLREDUCE;
    const char *call = seldp__reduce_method(kind, normalize, fp32, REDUCE_START);
    session_async *a;
    reduce_call *c;

    if (!s)
        return seldp__fail(SELDP_ERR_INVALID_ARGUMENT, "%s: session must not be NULL", call);
    if ((st = seldp__session_busy(s, call)) != SELDP_OK)
        return st;
    if (!grads)
        return seldp__fail(SELDP_ERR_INVALID_ARGUMENT, "%s: grads must not be NULL", call);
    if (s->comm->ops->thread_bound)
        return seldp__fail(SELDP_ERR_UNSUPPORTED,
                           "%s: not on the %s transport: its collectives must be issued by the "
                           "rank's own thread in one order on every rank (NCCL drives a GPU's "
                           "communicators from one thread), and a progress thread would issue "
                           "them beside the caller's; call %s instead (its buckets are already "
                           "grouped and asynchronous on the GPU)",
                           call, seldp_comm_transport(s->comm),
                           seldp__reduce_method(kind, normalize, fp32, REDUCE_BLOCKING));
    if (policy != SELDP_MISSING_ERROR && policy != SELDP_MISSING_ZERO)
        return seldp__fail(SELDP_ERR_INVALID_ARGUMENT, "%s: missing-gradient policy %d is invalid",
                           call, (int)policy);
    if (!s->async)
        SELDP_CHECK(async_create(s, &s->async));
    a = s->async;
    if (!a->thread_started) {
        if (pthread_create(&a->thread, NULL, seldp__session_progress_main, a) != 0)
            SELDP_FAIL(SELDP_ERR_TRANSPORT, "could not create the session's progress thread");
        a->thread_started = true;
    }
    c = &a->c;
    *c = (reduce_call){.s = s,
                       .grads = grads,
                       .normalize = normalize,
                       .fp32 = fp32,
                       .overlapped = REDUCE_START,
                       .kind = kind,
                       .policy = policy,
                       .weight = weight,
                       .staged = true,
                       .staged_as_result = s->fused};
    SELDP_CHECK(seldp__reduce_call_alloc(c, seldp_comm_size(s->comm)));
    if (!(a->mine = calloc(1, c->record_bytes)))
        SELDP_FAIL(SELDP_ERR_NOMEM, "out of memory for the agreement record");
    if (s->fused && !(c->segs = calloc(s->n_slots ? s->n_slots : 1, sizeof *c->segs)))
        SELDP_FAIL(SELDP_ERR_NOMEM, "out of memory planning the buckets of %zu tensors",
                   s->n_slots);
    SELDP_CHECK(busy_add(s->comm));
    for (size_t k = 0; k < s->n_slots; k++) {
        c->slots[k].offset = a->slot_offset[k];
        a->marked[k] = false;
    }
    for (size_t b = 0; b < a->n_buckets; b++)
        a->pending[b] = a->bucket_slots[b];
    /* A failure to allocate the staging buffer is this rank's part of the agreement: every
     * rank learns it there, as in the blocking call. */
    if (!s->staging && s->slot_elems)
        local = seldp__device_alloc(s->device, s->slot_elems * sizeof(float), (void **)&s->staging);
    a->map = NULL;
    if (shard) {
        /* a range that does not fit the map fails the start's agreement on every rank */
        if (local == SELDP_OK)
            local = seldp__shard_check(shard->map, s, shard->range, shard->count, call);
        if (local == SELDP_OK &&
            ((!a->counts &&
              !(a->counts = calloc((size_t)seldp_comm_size(s->comm), sizeof *a->counts))) ||
             (!a->shard_segs &&
              !(a->shard_segs = calloc(s->n_slots ? s->n_slots : 1, sizeof *a->shard_segs)))))
            local = seldp__fail(SELDP_ERR_NOMEM, "out of memory planning the buckets");
        if (local == SELDP_OK) {
            a->map = shard->map;
            seldp__shard_range(a->map, seldp_comm_rank(s->comm), &a->begin, &a->end);
        }
        a->range = shard->range;
        a->present = shard->present;
        a->shard_fused = s->fused && seldp__comm_shard_fused(s->comm, s->device);
    }
    seldp__session_save_message(s->comm, local, a->start_message);
    c->call = ++s->reductions;
    seldp__reduce_fill_record(c, local, (reduce_record *)a->mine);
    a->local = SELDP_OK;
    a->local_message[0] = '\0';
    a->thread_status = SELDP_OK;
    a->start_failed = false;
    a->kept_from = s->slot_elems;
    a->in_place_segments = 0;
    pthread_mutex_lock(&a->lock);
    a->cancel = false;
    a->in_flight = true;
    a->job = true;
    pthread_cond_broadcast(&a->wake);
    pthread_mutex_unlock(&a->lock);
    return SELDP_OK;
fail:
    if (s->async && !s->async->in_flight) {
        seldp__reduce_call_free(&s->async->c);
        free(s->async->mine);
        s->async->mine = NULL;
    }
    return seldp__session_name_call(st, call, NULL);
}

seldp_status seldp_session_reduce_start(seldp_session *session, seldp_grads *grads,
                                        uint64_t local_weight, seldp_missing_policy policy)
{
    return async_start(session, grads, local_weight, policy, true, false, NULL);
}

seldp_status seldp_session_reduce_fp32_start(seldp_session *session, seldp_grads *grads,
                                             uint64_t local_weight, seldp_missing_policy policy)
{
    return async_start(session, grads, local_weight, policy, true, true, NULL);
}

seldp_status seldp_session_sum_start(seldp_session *session, seldp_grads *grads, bool local_active,
                                     seldp_missing_policy policy)
{
    return async_start(session, grads, local_active ? 1 : 0, policy, false, false, NULL);
}

seldp_status seldp_session_sum_fp32_start(seldp_session *session, seldp_grads *grads,
                                          bool local_active, seldp_missing_policy policy)
{
    return async_start(session, grads, local_active ? 1 : 0, policy, false, true, NULL);
}

seldp_status seldp_shard_reduce_scatter_start(seldp_session *session, const seldp_shard_map *map,
                                              seldp_grads *grads, uint64_t local_weight,
                                              seldp_missing_policy policy, float *range,
                                              size_t range_count, bool *present)
{
    shard_target t = {map, range, range_count, present};
    return async_start(session, grads, local_weight, policy, true, true, &t);
}

seldp_status seldp_shard_reduce_scatter_sum_start(seldp_session *session,
                                                  const seldp_shard_map *map, seldp_grads *grads,
                                                  bool local_active, seldp_missing_policy policy,
                                                  float *range, size_t range_count, bool *present)
{
    shard_target t = {map, range, range_count, present};
    return async_start(session, grads, local_active ? 1 : 0, policy, false, true, &t);
}

static seldp_status not_in_flight(const seldp_session *s, const char *call)
{
    if (!s)
        return seldp__fail(SELDP_ERR_INVALID_ARGUMENT, "%s: session must not be NULL", call);
    return seldp__fail(SELDP_ERR_INVALID_ARGUMENT,
                       "%s: group rank %d (world rank %d): no overlapped reduction is in flight "
                       "on this session (start one with seldp_session_reduce_start, "
                       "seldp_session_sum_start or their _fp32 variants)",
                       call, seldp_comm_rank(s->comm), seldp_comm_world_rank(s->comm));
}

bool seldp_session_in_flight(const seldp_session *session)
{
    return session && session->async && session->async->in_flight;
}

seldp_status seldp_session_mark_ready(seldp_session *session, seldp_param_id id)
{
    seldp_status st = SELDP_OK;
    session_async *a;
    const session_param *g;

    if (!seldp_session_in_flight(session))
        return not_in_flight(session, MARK);
    a = session->async;
    if (!(g = find_group(a, id)))
        return seldp__fail(SELDP_ERR_NOT_FOUND,
                           MARK ": group rank %d (world rank %d): ParamId %" PRIu64
                                " is not selected by this session",
                           seldp_comm_rank(session->comm), seldp_comm_world_rank(session->comm),
                           id);
    pthread_mutex_lock(&a->lock);
    if (g->slot != SESSION_NO_SLOT) {
        st = mark_slot(a, g->slot, MARK);
    } else {
        /* frozen, or a buffer: never reduced, and a gradient for it is an error */
        const seldp_tensor *t = seldp_grads_get(a->c.grads, id);
        if (t)
            st = record_failure(a, seldp__reduce_check_gradient(&a->c, g, t), MARK);
    }
    pthread_mutex_unlock(&a->lock);
    return st;
}

seldp_status seldp__session_async_restore(session_async *a, bool all)
{
    seldp_status st = SELDP_OK;
    seldp_session *s = a->s;
    reduce_call *c = &a->c;
    seldp__convert_queue q = {.device = s->device};

    for (size_t k = 0; c->slots && k < s->n_slots; k++) {
        reduce_slot *slot = &c->slots[k];
        size_t off = a->slot_offset[k], count = seldp_tensor_numel(&slot->grad);
        size_t from = off > a->kept_from ? off : a->kept_from;
        if (!slot->in_place || (!all && slot->present))
            continue;
        slot->in_place = false;
        if (from >= off + count)
            continue;
        size_t size = seldp_dtype_size(slot->grad.dtype);
        SELDP_CHECK(seldp__convert_queue_add(
            &q, (seldp__convert_seg){
                    .dst = (char *)slot->grad.data + (from - off) * size,
                    .src = (char *)(s->staging + off) + (from - off) * size,
                    .dst_dtype = slot->grad.dtype,
                    .src_dtype = slot->grad.dtype,
                    .n = off + count - from,
                }));
    }
    SELDP_CHECK(seldp__convert_queue_flush(&q));
    return SELDP_OK;
fail:
    return seldp__fail(SELDP_ERR_GRADS_UNDEFINED,
                       "the overlapped reduction wrote results into the gradients "
                       "(cfg.overlap_in_place) and could not put them back, so the selected "
                       "gradients are undefined: %s (%s)",
                       seldp_last_error(), seldp_status_name(st));
}

size_t seldp__session_async_in_place_segments(const seldp_session *s)
{
    return s && s->async ? s->async->in_place_segments : 0;
}

/* After a failure: every gradient written in place put back; *st becomes the restore's
 * failure when that fails too (the gradients are then undefined). */
static void restore_after(session_async *a, seldp_status *st)
{
    char why[SESSION_MESSAGE_MAX];
    snprintf(why, sizeof why, "%s", seldp_last_error());
    seldp_status restored = seldp__session_async_restore(a, true);
    if (restored != SELDP_OK)
        *st = restored;
    else
        seldp__set_error(why);
}

/* What finish does before it waits: every slot not marked yet is marked, gradients of
 * parameters never reduced are refused as the blocking call refuses them, and the results the
 * commit needs are allocated. Failures are this rank's part of the final agreement. */
static void finish_marks(session_async *a)
{
    seldp_session *s = a->s;

    pthread_mutex_lock(&a->lock);
    for (size_t k = 0; k < s->n_slots; k++)
        if (!a->marked[k])
            (void)mark_slot(a, k, FINISH);
    for (size_t i = 0; i < s->n_params; i++)
        if (s->params[i].slot == SESSION_NO_SLOT && seldp_grads_get(a->c.grads, s->params[i].id))
            (void)record_failure(
                a,
                seldp__reduce_check_gradient(&a->c, &s->params[i],
                                             seldp_grads_get(a->c.grads, s->params[i].id)),
                FINISH);
    pthread_mutex_unlock(&a->lock);
    /* a reduce-scatter's results go into its range, not the container */
    if (a->local == SELDP_OK && a->c.kind != REDUCE_KIND_SCATTER)
        (void)record_failure(a, seldp__reduce_allocate_results(&a->c), FINISH);
}

seldp_status seldp_session_finish(seldp_session *session, uint64_t *global_weight)
{
    seldp_status st = SELDP_OK, local;
    session_async *a;
    reduce_call *c;
    char message[SESSION_MESSAGE_MAX];
    const char *own;
    bool gathered = false;

    if (!seldp_session_in_flight(session))
        return not_in_flight(session, FINISH);
    a = session->async;
    c = &a->c;
    finish_marks(a);
    pthread_mutex_lock(&a->lock);
    while (a->job)
        pthread_cond_wait(&a->idle, &a->lock);
    pthread_mutex_unlock(&a->lock);

    if (a->start_failed) {
        /* the first agreement's verdict, the same on every rank: no final agreement */
        seldp__set_error(a->thread_message);
        st = a->thread_status;
        goto done;
    }
    /* This rank's status: the caller's first failure, else the progress thread's. */
    local = a->local != SELDP_OK ? a->local : a->thread_status;
    own = a->local != SELDP_OK ? a->local_message : a->thread_message;
    seldp__set_error(own);
    seldp__session_save_message(session->comm, local, message);
    c->overlapped = REDUCE_FINISH;
    memset(a->mine, 0, c->record_bytes);
    seldp__reduce_fill_record(c, local, (reduce_record *)a->mine);
    st = seldp__reduce_agree(c, a->mine, message, &gathered);
    if (st != SELDP_OK && !gathered && local != SELDP_OK) {
        /* the ranks cannot reach each other: this rank's own failure says more */
        seldp__set_error(own);
        st = local;
    }
    /* results written in place (cfg.overlap_in_place) stay only where every rank succeeded
     * and the parameter is present; an entry about to be dropped gets its bytes back first */
    if (st == SELDP_OK)
        st = seldp__session_async_restore(a, false);
    else
        restore_after(a, &st);
    if (st == SELDP_OK)
        st = c->kind == REDUCE_KIND_SCATTER ? seldp__shard_commit(c, a->map, a->range, a->present)
                                            : seldp__reduce_commit(c);
    if (st == SELDP_OK && global_weight)
        *global_weight = c->global_weight;
done:
    seldp__reduce_call_free(c);
    free(a->mine);
    a->mine = NULL;
    busy_remove(session->comm);
    pthread_mutex_lock(&a->lock);
    a->in_flight = false;
    pthread_mutex_unlock(&a->lock);
    return seldp__session_name_call(st, FINISH, NULL);
}

void seldp__session_async_free(seldp_session *s)
{
    session_async *a = s->async;
    if (!a)
        return;
    pthread_mutex_lock(&a->lock);
    a->cancel = true;
    a->quit = true;
    pthread_cond_broadcast(&a->wake);
    pthread_mutex_unlock(&a->lock);
    if (a->thread_started)
        pthread_join(a->thread, NULL); /* after the collective in progress, if any */
    if (a->in_flight) {
        /* destroyed during the reduction: the gradients written in place are put back */
        (void)seldp__session_async_restore(a, true);
        seldp__reduce_call_free(&a->c);
        free(a->mine);
        busy_remove(s->comm);
    }
    async_destroy(a);
    s->async = NULL;
}
