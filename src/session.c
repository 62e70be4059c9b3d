/* Selected data-parallel sessions: initialize (validate, agree, broadcast) and the
 * session queries. The texts of the collective errors the reductions share are in
 * session_messages.c; the reductions themselves are in session_reduce.c (with
 * session_agree.c and session_commit.c), the overlapped ones in session_async.c.
 *
 * Errors are collective. Each rank first validates what it can see alone; one
 * fixed-size all-gather then tells every rank every other rank's result, and when some
 * rank failed, an all-gatherv of messages gives every rank the status and message of
 * the lowest failing rank. Decisions that need every rank's data (schemas, weights,
 * gradient presence) are computed by every rank from the same gathered bytes, so they
 * agree without further communication. Nothing is written before all ranks have passed.
 *
 * Transport calls made by each public function (every rank of the group makes the same):
 *   seldp_session_initialize, seldp_session_initialize_with_buffers:
 *     1 allgather of a fixed record (status, world rank, call, root, bucket size, finiteness
 *       check, staged commit, whether the rank can take the fused reduce path);
 *     on a local failure somewhere: 1 allgatherv of the error messages, then return;
 *     1 allgatherv of the schema manifests, unless every rank's is the root's byte for byte
 *       (the record carries each manifest's length and two 64-bit digests);
 *     per dtype d of the selection, ceil(bytes_d / bucket) broadcasts from the root.
 *   seldp_session_reduce, _reduce_fp32, _sum, _sum_fp32 (session_reduce.c):
 *     1 allgatherv of a record (status, world rank, method, FP32 flag, policy, weight,
 *       the session's fingerprint, the first non-finite gradient, one presence bit per
 *       reducible parameter), variable-length so that ranks in different sessions meet
 *       in it and learn so;
 *     on a local failure somewhere: 1 allgatherv of the error messages, then return;
 *     over the parameters that have a gradient on some active rank (none when no rank is
 *       active): on the bucketed path ceil(4 * elements / bucket) F32 allreduces, on the
 *       fused path one fused reduction.
 *   seldp_session_rank, _size, _selected, _destroy: none (local). */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bucket.h"
#include "comm/comm_impl.h"
#include "device.h"
#include "env.h"
#include "internal.h"
#include "manifest.h"
#include "session_impl.h"

/* --- initialize: local validation ------------------------------------------ */

static int compare_ids(const void *a, const void *b)
{
    seldp_param_id x = *(const seldp_param_id *)a, y = *(const seldp_param_id *)b;
    return (x > y) - (x < y);
}

/* Whether a parameter of `dtype` may be selected by this call; else the error. */
static seldp_status check_selectable(const seldp_param *p, bool with_buffers)
{
    seldp_dtype dt = p->tensor.dtype;
    if (dt == SELDP_F32 || dt == SELDP_F16 || dt == SELDP_BF16)
        return SELDP_OK;
    if (dt == SELDP_F64)
        return seldp__fail(SELDP_ERR_DTYPE,
                           "'%s' is f64; sessions select F32, F16 and BF16 parameters and, with "
                           "seldp_session_initialize_with_buffers, integer or bool buffers",
                           p->path);
    if (!with_buffers)
        return seldp__fail(
            SELDP_ERR_DTYPE,
            "'%s' is an integer or bool buffer (%s); seldp_session_initialize selects F32, F16 and "
            "BF16 parameters only (use seldp_session_initialize_with_buffers for "
            "integer or bool buffers)",
            p->path, seldp_dtype_name(dt));
    return SELDP_OK;
}

/* The selected parameters in path order, each checked for dtype and device. */
static seldp_status collect_params(seldp_session *s, const seldp_param_id *sorted,
                                   bool with_buffers)
{
    seldp_status st = SELDP_OK;
    size_t n_params = seldp_model_count(s->model);
    bool *seen = calloc(s->n_ids ? s->n_ids : 1, sizeof *seen);
    char have[32], want[32];

    s->params = calloc(s->n_ids ? s->n_ids : 1, sizeof *s->params);
    s->slot_param = calloc(s->n_ids ? s->n_ids : 1, sizeof *s->slot_param);
    if (!seen || !s->params || !s->slot_param)
        SELDP_FAIL(SELDP_ERR_NOMEM, "out of memory recording a selection of %zu ids", s->n_ids);
    for (size_t i = 0; i < n_params; i++) {
        const seldp_param *p = seldp_model_at(s->model, i);
        const seldp_param_id *hit = bsearch(&p->id, sorted, s->n_ids, sizeof *sorted, compare_ids);
        size_t k;
        session_param *g;
        if (!hit || seen[k = (size_t)(hit - sorted)])
            continue;
        seen[k] = true;
        SELDP_CHECK(check_selectable(p, with_buffers));
        if (!seldp__device_equal(p->tensor.device, s->device))
            SELDP_FAIL(SELDP_ERR_DEVICE,
                       "'%s' is on %s but the session's communicator computes on %s", p->path,
                       seldp__session_device_name(p->tensor.device, have, sizeof have),
                       seldp__session_device_name(s->device, want, sizeof want));
        SELDP_CHECK(seldp__device_check_aligned(&p->tensor, p->path));
        g = &s->params[s->n_params++];
        g->id = p->id;
        g->path = p->path;
        g->tensor = p->tensor;
        g->frozen = p->frozen;
        g->slot = SESSION_NO_SLOT;
        if (!p->frozen && seldp_dtype_is_float(p->tensor.dtype)) {
            g->slot = s->n_slots;
            s->slot_param[s->n_slots++] = s->n_params - 1;
            s->slot_elems += seldp_tensor_numel(&p->tensor);
        }
    }
fail:
    free(seen);
    return st;
}

/* Bytes of the largest bucket any dtype of the selection needs. */
static size_t largest_bucket(const seldp_session *s)
{
    size_t largest = 0;
    for (int d = 0; d < SELDP_DTYPE_COUNT; d++) {
        size_t total = 0, cap, need;
        for (size_t i = 0; i < s->n_params; i++)
            if (s->params[i].tensor.dtype == (seldp_dtype)d)
                total += seldp_tensor_nbytes(&s->params[i].tensor);
        cap = seldp__bucket_capacity(s->cfg.bucket_bytes, seldp_dtype_size((seldp_dtype)d));
        need = total < cap ? total : cap;
        if (need > largest)
            largest = need;
    }
    return largest;
}

/* The reduce path this rank asks for: cfg.reduce_path, or for AUTO the environment's
 * SELDP_REDUCE_PATH; AUTO when neither chooses. */
static seldp_status requested_path(const seldp_session_config *cfg, seldp_reduce_path *path)
{
    int env = seldp__env_choice(SELDP__ENV_REDUCE_PATH); /* fused, bucketed, auto */
    *path = cfg->reduce_path;
    if (*path != SELDP_REDUCE_PATH_AUTO && *path != SELDP_REDUCE_PATH_FUSED &&
        *path != SELDP_REDUCE_PATH_BUCKETED)
        return seldp__fail(SELDP_ERR_INVALID_ARGUMENT,
                           "cfg.reduce_path %d is invalid (expected SELDP_REDUCE_PATH_AUTO, "
                           "_FUSED or _BUCKETED)",
                           (int)*path);
    if (*path != SELDP_REDUCE_PATH_AUTO || env == -1 || env == 2)
        return SELDP_OK;
    if (env == 0)
        *path = SELDP_REDUCE_PATH_FUSED;
    else if (env == 1)
        *path = SELDP_REDUCE_PATH_BUCKETED;
    else
        return seldp__fail(SELDP_ERR_INVALID_ARGUMENT,
                           "environment SELDP_REDUCE_PATH='%.64s' is invalid (expected fused, "
                           "bucketed or auto)",
                           seldp__env_text(SELDP__ENV_REDUCE_PATH));
    return SELDP_OK;
}

seldp_status seldp__session_choose_fused(const seldp_comm *comm, seldp_device mem,
                                         const seldp_session_config *cfg, bool *fused)
{
    seldp_reduce_path path;
    char where[32], needs[64];
    bool can = seldp__comm_fused_memory(comm, mem, needs, sizeof needs);
    seldp_status st = requested_path(cfg, &path);
    *fused = false;
    if (st != SELDP_OK)
        return st;
    if (path == SELDP_REDUCE_PATH_FUSED && !can) {
        if (!comm->ops->reduce_fused)
            return seldp__fail(SELDP_ERR_INVALID_ARGUMENT,
                               "the fused reduce path was asked for, but the %s transport has no "
                               "fused reduction (only the bucketed path)",
                               seldp_comm_transport(comm));
        return seldp__fail(SELDP_ERR_INVALID_ARGUMENT,
                           "the fused reduce path was asked for, but the %s transport's fused "
                           "reduction does not work on %s memory (it needs %s)",
                           seldp_comm_transport(comm),
                           seldp__session_device_name(mem, where, sizeof where), needs);
    }
    *fused = can && path != SELDP_REDUCE_PATH_BUCKETED;
    return SELDP_OK;
}

/* Everything initialize can check and prepare on its own: the arguments, the selection,
 * this rank's manifest blob and the bucket buffer. */
static seldp_status init_prepare(seldp_session *s, int root, const seldp_param_id *ids,
                                 bool with_buffers, void **blob, size_t *blob_bytes, void **bucket,
                                 bool *fused)
{
    seldp_status st = SELDP_OK;
    seldp_param_id *sorted = NULL;
    seldp__manifest manifest = {0, NULL, NULL};
    int size = seldp_comm_size(s->comm);

    if (!s->model || (s->n_ids && !ids))
        SELDP_FAIL(SELDP_ERR_INVALID_ARGUMENT, "model and ids must not be NULL");
    if (root < 0 || root >= size)
        SELDP_FAIL(SELDP_ERR_INVALID_ARGUMENT, "root %d is outside the group of %d ranks", root,
                   size);
    if (s->cfg.bucket_bytes == 0)
        SELDP_FAIL(SELDP_ERR_INVALID_ARGUMENT, "cfg.bucket_bytes must be positive");
    SELDP_CHECK(seldp__session_choose_fused(s->comm, s->device, &s->cfg, fused));

    s->ids = malloc((s->n_ids ? s->n_ids : 1) * sizeof *s->ids);
    sorted = malloc((s->n_ids ? s->n_ids : 1) * sizeof *sorted);
    if (!s->ids || !sorted)
        SELDP_FAIL(SELDP_ERR_NOMEM, "out of memory copying a selection of %zu ids", s->n_ids);
    if (s->n_ids) {
        memcpy(s->ids, ids, s->n_ids * sizeof *ids);
        memcpy(sorted, ids, s->n_ids * sizeof *ids);
    }
    qsort(sorted, s->n_ids, sizeof *sorted, compare_ids);
    for (size_t k = 1; k < s->n_ids; k++) {
        if (sorted[k] == sorted[k - 1]) {
            const seldp_param *p = seldp_model_find_id(s->model, sorted[k]);
            SELDP_FAIL(SELDP_ERR_DUPLICATE, "ParamId %" PRIu64 " ('%s') is selected twice",
                       sorted[k], p ? p->path : "not in the model");
        }
    }
    for (size_t k = 0; k < s->n_ids; k++)
        if (!seldp_model_find_id(s->model, ids[k]))
            SELDP_FAIL(SELDP_ERR_NOT_FOUND,
                       "selected ParamId %" PRIu64 " is not registered in the local model", ids[k]);

    SELDP_CHECK(collect_params(s, sorted, with_buffers));
    SELDP_CHECK(seldp__manifest_build(s->model, sorted, s->n_ids, &manifest));
    SELDP_CHECK(seldp__manifest_encode(&manifest, blob, blob_bytes));
    SELDP_CHECK(seldp__device_alloc(s->device, largest_bucket(s), bucket));
fail:
    seldp__manifest_free(&manifest);
    free(sorted);
    return st;
}

/* --- initialize: agreement ------------------------------------------------- */

/* What each rank tells the others before anything else; int64 fields, so no padding. */
typedef struct init_record {
    int64_t status;
    int64_t world_rank;
    int64_t with_buffers;
    int64_t root;
    int64_t bucket_bytes;
    int64_t check_finite;
    int64_t staged_commit;
    int64_t fused; /* this rank can and may take the fused reduce path */
    /* this rank's schema manifest: its length and two independent 64-bit digests of its
       bytes (schema_agree exchanges the manifests only when some rank's differ from the
       root's) */
    uint64_t schema_bytes;
    uint64_t schema_fnv;
    uint64_t schema_mix;
} init_record;

static const char *init_name(int64_t with_buffers)
{
    return with_buffers ? "seldp_session_initialize_with_buffers" : "seldp_session_initialize";
}

/* Collective: exchange the records; fail, the same on every rank, when the ranks called
 * different functions, with different roots, bucket sizes or finiteness checks, or when
 * any rank failed locally. world_ranks[r] receives group rank r's world rank. */
static seldp_status init_agree(seldp_comm *comm, const init_record *mine, const char *message,
                               init_record *all, int *world_ranks)
{
    seldp_status st = SELDP_OK;
    int n = seldp_comm_size(comm);

    SELDP_CHECK(seldp__session_name_call(
        seldp_comm_allgather(comm, mine, all, sizeof *mine, SELDP_HOST_DEVICE),
        init_name(mine->with_buffers), "the agreement"));
    for (int r = 0; r < n; r++)
        world_ranks[r] = (int)all[r].world_rank;
    for (int r = 1; r < n; r++) {
        if (all[r].with_buffers != all[0].with_buffers)
            SELDP_FAIL(SELDP_ERR_DISAGREE,
                       "ranks called different functions: group rank 0 (world rank %d) called "
                       "%s, group rank %d (world rank %d) called %s",
                       world_ranks[0], init_name(all[0].with_buffers), r, world_ranks[r],
                       init_name(all[r].with_buffers));
        if (all[r].root != all[0].root)
            SELDP_FAIL(SELDP_ERR_DISAGREE,
                       "ranks disagree on the root: group rank 0 (world rank %d) passed %" PRId64
                       ", group rank %d (world rank %d) passed %" PRId64,
                       world_ranks[0], all[0].root, r, world_ranks[r], all[r].root);
        if (all[r].bucket_bytes != all[0].bucket_bytes)
            SELDP_FAIL(SELDP_ERR_DISAGREE,
                       "ranks disagree on cfg.bucket_bytes: group rank 0 (world rank %d) passed "
                       "%" PRId64 ", group rank %d (world rank %d) passed %" PRId64,
                       world_ranks[0], all[0].bucket_bytes, r, world_ranks[r], all[r].bucket_bytes);
        if (all[r].check_finite != all[0].check_finite)
            SELDP_FAIL(SELDP_ERR_DISAGREE,
                       "ranks disagree on cfg.check_finite: group rank 0 (world rank %d) passed "
                       "%s, group rank %d (world rank %d) passed %s",
                       world_ranks[0], all[0].check_finite ? "true" : "false", r, world_ranks[r],
                       all[r].check_finite ? "true" : "false");
        if (all[r].staged_commit != all[0].staged_commit)
            SELDP_FAIL(SELDP_ERR_DISAGREE,
                       "ranks disagree on cfg.staged_commit: group rank 0 (world rank %d) passed "
                       "%s, group rank %d (world rank %d) passed %s",
                       world_ranks[0], all[0].staged_commit ? "true" : "false", r, world_ranks[r],
                       all[r].staged_commit ? "true" : "false");
    }
    for (int r = 0; r < n; r++)
        if (all[r].status != SELDP_OK)
            return seldp__session_share_error(comm, r, (seldp_status)all[r].status, message);
fail:
    return st;
}

/* 64-bit FNV-1a of n bytes (session_impl.h). */
uint64_t seldp__digest_fnv(const unsigned char *p, size_t n)
{
    uint64_t h = 0xcbf29ce484222325u;
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 0x100000001b3u;
    return h;
}

/* A second digest of n bytes, independent of FNV-1a's: 8-byte words through xxHash64's round
 * and its final avalanche, seeded with n (session_impl.h). */
uint64_t seldp__digest_mix(const unsigned char *p, size_t n)
{
    const uint64_t p1 = 0x9e3779b185ebca87u, p2 = 0xc2b2ae3d27d4eb4fu;
    uint64_t h = 0x27d4eb2f165667c5u ^ (uint64_t)n, w;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        memcpy(&w, p + i, sizeof w);
        h ^= w * p2;
        h = ((h << 31) | (h >> 33)) * p1;
    }
    for (; i < n; i++)
        h = ((h ^ p[i]) * p1) ^ (h >> 29);
    h ^= h >> 33;
    h *= p2;
    h ^= h >> 29;
    h *= 0x165667b19e3779f9u;
    return h ^ (h >> 32);
}

/* Whether every rank's manifest is the root's, byte for byte, as their records tell (the
 * same answer on every rank). */
static bool schemas_identical(const init_record *all, int n, int root)
{
    for (int r = 0; r < n; r++)
        if (all[r].schema_bytes != all[root].schema_bytes ||
            all[r].schema_fnv != all[root].schema_fnv || all[r].schema_mix != all[root].schema_mix)
            return false;
    return true;
}

/* Collective: all-gather the manifests and compare every rank's with the root's. Every rank
 * decodes the same bytes, so every rank reaches the same verdict, and the same *digest of
 * the root's manifest: the session's schema fingerprint. When the records show every
 * manifest identical to the root's (the usual case), nothing is exchanged: the verdict is
 * the same, and the digest is the root's own. */
static seldp_status schema_agree(seldp_comm *comm, const char *call, const void *blob,
                                 size_t blob_bytes, int root, const int *world_ranks,
                                 const init_record *records, uint64_t *digest)
{
    seldp_status st = SELDP_OK;
    int n = seldp_comm_size(comm), decoded = 0;
    if (schemas_identical(records, n, root)) {
        *digest = records[root].schema_fnv;
        return SELDP_OK;
    }
    size_t *lengths = calloc((size_t)n, sizeof *lengths);
    seldp__manifest *manifests = calloc((size_t)n, sizeof *manifests);
    char *all = NULL;
    size_t offset = 0;

    if (!lengths || !manifests)
        SELDP_FAIL(SELDP_ERR_NOMEM, "out of memory gathering %d schema manifests", n);
    SELDP_CHECK(seldp__session_name_call(
        seldp_comm_allgatherv(comm, blob, blob_bytes, (void **)&all, lengths), call,
        "the schema exchange"));
    for (; decoded < n; decoded++) {
        st = seldp__manifest_decode(all + offset, lengths[decoded], &manifests[decoded]);
        if (st != SELDP_OK) {
            char why[SESSION_MESSAGE_MAX];
            snprintf(why, sizeof why, "%s", seldp_last_error());
            SELDP_FAIL(st, "the schema manifest of group rank %d (world rank %d) is malformed: %s",
                       decoded, world_ranks[decoded], why);
        }
        if (decoded == root)
            *digest = seldp__digest_fnv((const unsigned char *)all + offset, lengths[root]);
        offset += lengths[decoded];
    }
    SELDP_CHECK(seldp__manifest_compare(manifests, n, root, world_ranks));
fail:
    for (int r = 0; r < decoded; r++)
        seldp__manifest_free(&manifests[r]);
    free(manifests);
    free(all);
    free(lengths);
    return st;
}

/* --- initialize: broadcast ------------------------------------------------- */

/* Collective: broadcast every parameter from the root, one dtype at a time, in path order,
 * through buckets of cfg.bucket_bytes. Only non-root ranks write their parameters. */
static seldp_status broadcast_selection(seldp_session *s, int root, void *bucket)
{
    seldp_status st = SELDP_OK;
    seldp__bucket_stream stream = {0};
    bool is_root = seldp_comm_rank(s->comm) == root;

    for (int d = 0; d < SELDP_DTYPE_COUNT; d++) {
        seldp_dtype dtype = (seldp_dtype)d;
        size_t esize = seldp_dtype_size(dtype), total, n_buckets;
        SELDP_CHECK(seldp__bucket_stream_init(
            &stream, s->device, seldp__bucket_capacity(s->cfg.bucket_bytes, esize), s->n_params));
        for (size_t i = 0; i < s->n_params; i++)
            if (s->params[i].tensor.dtype == dtype)
                seldp__bucket_stream_add(&stream, s->params[i].tensor.data,
                                         seldp_tensor_nbytes(&s->params[i].tensor));
        total = seldp__bucket_stream_bytes(&stream);
        n_buckets = seldp__bucket_count(total, stream.capacity);
        for (size_t b = 0; b < n_buckets; b++) {
            size_t offset, bytes;
            seldp__bucket_span(total, stream.capacity, b, &offset, &bytes);
            if (is_root)
                SELDP_CHECK(seldp__bucket_pack(&stream, b, bucket, &bytes));
            SELDP_CHECK(
                seldp_comm_broadcast(s->comm, bucket, bytes / esize, dtype, root, s->device));
            if (!is_root)
                SELDP_CHECK(seldp__bucket_unpack(&stream, b, bucket));
        }
        seldp__bucket_stream_free(&stream);
    }
fail:
    seldp__bucket_stream_free(&stream);
    return st;
}

/* --- initialize ------------------------------------------------------------ */

static seldp_status session_initialize(seldp_comm *comm, seldp_model *model, int root,
                                       const seldp_param_id *ids, size_t n_ids,
                                       const seldp_session_config *cfg, bool with_buffers,
                                       seldp_session **out)
{
    seldp_status st = SELDP_OK, local = SELDP_OK;
    const seldp_session_config defaults = SELDP_SESSION_CONFIG_INIT;
    int n;
    seldp_session *s = NULL;
    init_record mine, *all = NULL;
    int *world_ranks = NULL;
    void *blob = NULL, *bucket = NULL;
    size_t blob_bytes = 0;
    bool fused = false;
    char message[SESSION_MESSAGE_MAX];

    if (!comm || !out)
        return seldp__fail(SELDP_ERR_INVALID_ARGUMENT, "%s: comm and out must not be NULL",
                           init_name(with_buffers));
    *out = NULL;
    n = seldp_comm_size(comm);
    /* Without these few bytes this rank cannot take part; the others' collectives then end
     * with the transport's timeout rather than hanging. */
    s = calloc(1, sizeof *s);
    all = calloc((size_t)n, sizeof *all);
    world_ranks = calloc((size_t)n, sizeof *world_ranks);
    if (!s || !all || !world_ranks)
        SELDP_FAIL(SELDP_ERR_NOMEM, "out of memory starting a session over %d ranks", n);
    s->comm = comm;
    s->model = model;
    s->device = seldp_comm_device(comm);
    s->cfg = defaults;
    s->n_ids = n_ids;

    /* a malformed config is this rank's failure, reported on every rank like the others */
    local = seldp__config_read(&s->cfg, sizeof s->cfg, cfg, init_name(with_buffers),
                               "seldp_session_config", "SELDP_SESSION_CONFIG_INIT");
    if (local == SELDP_OK)
        local = init_prepare(s, root, ids, with_buffers, &blob, &blob_bytes, &bucket, &fused);
    seldp__session_save_message(comm, local, message);
    mine = (init_record){.status = local,
                         .world_rank = seldp_comm_world_rank(comm),
                         .with_buffers = with_buffers,
                         .root = root,
                         .bucket_bytes = (int64_t)s->cfg.bucket_bytes,
                         .check_finite = s->cfg.check_finite,
                         .staged_commit = s->cfg.staged_commit,
                         .fused = fused,
                         .schema_bytes = blob_bytes,
                         .schema_fnv = seldp__digest_fnv(blob, blob_bytes),
                         .schema_mix = seldp__digest_mix(blob, blob_bytes)};
    SELDP_CHECK(init_agree(comm, &mine, message, all, world_ranks));
    s->fused = true;
    for (int r = 0; r < n; r++)
        s->fused = s->fused && all[r].fused;
    SELDP_CHECK(schema_agree(comm, init_name(with_buffers), blob, blob_bytes, root, world_ranks,
                             all, &s->digest));
    SELDP_CHECK(seldp__session_name_call(broadcast_selection(s, root, bucket),
                                         init_name(with_buffers),
                                         "the broadcast of the selection"));
    *out = s;
    s = NULL;
fail:
    seldp__device_free(s ? s->device : seldp_comm_device(comm), bucket);
    seldp_session_destroy(s);
    free(blob);
    free(world_ranks);
    free(all);
    return seldp__session_name_call(st, init_name(with_buffers), NULL);
}

seldp_status seldp_session_initialize(seldp_comm *comm, seldp_model *model, int root,
                                      const seldp_param_id *ids, size_t n_ids,
                                      const seldp_session_config *cfg, seldp_session **out)
{
    return session_initialize(comm, model, root, ids, n_ids, cfg, false, out);
}

seldp_status seldp_session_initialize_with_buffers(seldp_comm *comm, seldp_model *model, int root,
                                                   const seldp_param_id *ids, size_t n_ids,
                                                   const seldp_session_config *cfg,
                                                   seldp_session **out)
{
    return session_initialize(comm, model, root, ids, n_ids, cfg, true, out);
}

/* --- queries --------------------------------------------------------------- */

int seldp_session_rank(const seldp_session *session)
{
    return session ? seldp_comm_rank(session->comm) : -1;
}

int seldp_session_size(const seldp_session *session)
{
    return session ? seldp_comm_size(session->comm) : 0;
}

seldp_reduce_path seldp_session_reduce_path(const seldp_session *session)
{
    if (!session)
        return SELDP_REDUCE_PATH_AUTO;
    return session->fused ? SELDP_REDUCE_PATH_FUSED : SELDP_REDUCE_PATH_BUCKETED;
}

const seldp_param_id *seldp_session_selected(const seldp_session *session, size_t *n)
{
    if (n)
        *n = session ? session->n_ids : 0;
    return session ? session->ids : NULL;
}

void seldp_session_destroy(seldp_session *session)
{
    if (!session)
        return;
    seldp__session_async_free(session); /* first: its progress thread uses the staging */
    seldp__device_free(session->device, session->staging);
    free(session->slot_param);
    free(session->params);
    free(session->ids);
    free(session);
}
