/* The NCCL transport: one rank per GPU, non-blocking NCCL communicators.
 *
 * Every NCCL call is issued on a non-blocking communicator and every wait is ours: a loop
 * that polls ncclCommGetAsyncError (NCCL's own progress: connection setup, split, finalize)
 * and then cudaStreamQuery on the rank's stream, against the configured timeout. No CUDA
 * call that could block on a peer is made before that loop has seen the NCCL work finish,
 * so a rank that never arrives costs a timeout, not a hang. On an error, a timeout or an
 * abort the rank's NCCL communicator is aborted (ncclCommAbort stops its kernels) and the
 * world is marked aborted; the other ranks of an in-process world see the mark in their own
 * wait loops and abort theirs. Ranks abort only their own NCCL communicators, from their own
 * threads.
 *
 * Buffers on the host are staged through a device buffer of the rank that grows on demand
 * and lives as long as the communicator. */
#define _POSIX_C_SOURCE 200809L /* clock_gettime, nanosleep */

#include <cuda_runtime_api.h>
#include <nccl.h>
#include <sched.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm/comm_impl.h"
#include "device.h"
#include "internal.h"
#include "seldp/nccl.h"

_Static_assert(SELDP_NCCL_UNIQUE_ID_BYTES == NCCL_UNIQUE_ID_BYTES,
               "SELDP_NCCL_UNIQUE_ID_BYTES must match nccl.h");

struct seldp_nccl_world {
    atomic_int refs;     /* the creator's reference plus one per communicator */
    atomic_bool aborted; /* sticky: every later wait of every rank returns ABORTED */
    int nranks;
    double timeout_s;
    ncclUniqueId id;
    atomic_bool *joined; /* in-process worlds: which ranks have joined (NULL otherwise) */
};

/* One rank's handle on one NCCL communicator (the world's or a split's). */
typedef struct nccl_comm {
    seldp_nccl_world *world;
    ncclComm_t nccl; /* NULL once aborted or destroyed */
    cudaStream_t stream;
    int ordinal;
    int rank, size; /* within this communicator, for messages */
    void *staging;  /* device buffer for host payloads */
    size_t staging_bytes;
    ncclComm_t split_slot; /* where ncclCommSplit's background job stores the child */
    /* Splits are destroyed only at teardown (see nccl_destroy): the rank's world handle
     * keeps every split made from it, or from its splits, in `splits`; a split whose
     * seldp_comm was destroyed is `retired` (finalized, its NCCL communicator kept). */
    bool is_world;
    struct nccl_comm *root; /* a split's world handle; NULL for the world, or once it is gone */
    struct nccl_comm *splits, *next_split;
    bool retired;
} nccl_comm;

static const seldp_comm_ops nccl_ops;

/* ---- the world ----------------------------------------------------------------------- */

static seldp_nccl_world *world_retain(seldp_nccl_world *w)
{
    atomic_fetch_add(&w->refs, 1);
    return w;
}

static void world_release(seldp_nccl_world *w)
{
    if (w && atomic_fetch_sub(&w->refs, 1) == 1) {
        free(w->joined);
        free(w);
    }
}

static seldp_status world_new(int nranks, const seldp_comm_config *cfg, bool track_joins,
                              seldp_nccl_world **out)
{
    seldp_comm_config defaults = SELDP_COMM_CONFIG_INIT;
    if (!cfg)
        cfg = &defaults;
    seldp_nccl_world *w = calloc(1, sizeof *w);
    if (!w)
        return seldp__fail(SELDP_ERR_NOMEM, "nccl: out of memory creating a world");
    if (track_joins) {
        w->joined = calloc((size_t)nranks, sizeof *w->joined);
        if (!w->joined) {
            free(w);
            return seldp__fail(SELDP_ERR_NOMEM, "nccl: out of memory creating a world of %d ranks",
                               nranks);
        }
        for (int r = 0; r < nranks; r++)
            atomic_init(&w->joined[r], false);
    }
    atomic_init(&w->refs, 1);
    atomic_init(&w->aborted, false);
    w->nranks = nranks;
    w->timeout_s = cfg->timeout_s > 0 ? cfg->timeout_s : defaults.timeout_s;
    *out = w;
    return SELDP_OK;
}

int seldp_nccl_device_count(void)
{
    return seldp__cuda_device_count();
}

seldp_status seldp_nccl_get_unique_id(void *out128)
{
    if (!out128)
        return seldp__fail(SELDP_ERR_INVALID_ARGUMENT, "nccl: get_unique_id: out is NULL");
    ncclUniqueId id;
    ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess)
        return seldp__fail(SELDP_ERR_TRANSPORT, "nccl: ncclGetUniqueId failed: %s (%s)",
                           ncclGetErrorString(r), ncclGetLastError(NULL));
    memcpy(out128, &id, sizeof id);
    return SELDP_OK;
}

seldp_status seldp_nccl_world_create(int nranks, const seldp_comm_config *cfg,
                                     seldp_nccl_world **out)
{
    seldp_nccl_world *w = NULL;
    seldp_status st = SELDP_OK;
    if (!out)
        return seldp__fail(SELDP_ERR_INVALID_ARGUMENT, "nccl: world_create: out is NULL");
    *out = NULL;
    if (nranks < 1)
        return seldp__fail(SELDP_ERR_INVALID_ARGUMENT,
                           "nccl: a world needs at least one rank, got %d", nranks);
    SELDP_CHECK(world_new(nranks, cfg, true, &w));
    SELDP_CHECK(seldp_nccl_get_unique_id(&w->id));
    *out = w;
    return SELDP_OK;
fail:
    world_release(w);
    return st;
}

void seldp_nccl_world_destroy(seldp_nccl_world *world)
{
    world_release(world);
}

/* ---- waiting, failing and aborting --------------------------------------------------- */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Spin briefly (collectives often finish in microseconds), then sleep between polls so
 * that waiting ranks leave the CPU to NCCL's proxy threads. */
static void backoff(unsigned *polls)
{
    if (++*polls < 2000) {
        sched_yield();
        return;
    }
    struct timespec ts = {0, 50 * 1000};
    nanosleep(&ts, NULL);
}

/* Abort this rank's NCCL communicator (its kernels stop, its resources are reclaimed by
 * NCCL in the background). Local; the handle becomes unusable. */
static void abort_local(nccl_comm *c)
{
    if (c->nccl) {
        ncclCommAbort(c->nccl);
        c->nccl = NULL;
    }
}

/* Record why this rank gives up, mark the world aborted so that no other rank waits for
 * it, abort the rank's communicator and return `status`. */
#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
static seldp_status
fail_abort(nccl_comm *c, seldp_status status, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    atomic_store(&c->world->aborted, true);
    abort_local(c);
    return seldp__fail(status, "%s", msg);
}

/* In a function with `st`, `c` and a `fail:` label: give up and abort the world, so that
 * the ranks waiting for this one in the collective return at once. */
#define FAIL_ABORT(...)                                                                            \
    do {                                                                                           \
        st = fail_abort(c, __VA_ARGS__);                                                           \
        goto fail;                                                                                 \
    } while (0)

static seldp_status fail_nccl(nccl_comm *c, const char *what, ncclResult_t r)
{
    return fail_abort(c, SELDP_ERR_TRANSPORT,
                      "nccl rank %d/%d (cuda:%d): %s failed: %s (%s); the world is aborted",
                      c->rank, c->size, c->ordinal, what, ncclGetErrorString(r),
                      ncclGetLastError(NULL));
}

static seldp_status fail_cuda(nccl_comm *c, const char *what, cudaError_t err)
{
    return fail_abort(c, SELDP_ERR_TRANSPORT,
                      "nccl rank %d/%d (cuda:%d): %s failed: %s; the world is aborted", c->rank,
                      c->size, c->ordinal, what, cudaGetErrorString(err));
}

static seldp_status fail_aborted(nccl_comm *c, const char *what)
{
    abort_local(c);
    return seldp__fail(SELDP_ERR_ABORTED,
                       "nccl rank %d/%d (cuda:%d): %s: the world was aborted (by a rank's "
                       "seldp_comm_abort, an error or a timeout)",
                       c->rank, c->size, c->ordinal, what);
}

static seldp_status fail_timeout(nccl_comm *c, const char *what)
{
    return fail_abort(c, SELDP_ERR_TIMEOUT,
                      "nccl rank %d/%d (cuda:%d): %s did not complete within %.1f s (a rank did "
                      "not arrive); the world is aborted",
                      c->rank, c->size, c->ordinal, what, c->world->timeout_s);
}

/* A non-blocking NCCL call returned: in progress and success are fine, anything else is
 * the rank's failure. */
static bool nccl_started(ncclResult_t r)
{
    return r == ncclSuccess || r == ncclInProgress;
}

/* Wait until NCCL is done with what was issued on c (ncclCommGetAsyncError no longer in
 * progress) and, with `stream`, until c's stream has drained. Aborts on a world abort, an
 * asynchronous NCCL error, a CUDA error or the timeout. */
static seldp_status wait_done(nccl_comm *c, const char *what, bool stream)
{
    double deadline = now_s() + c->world->timeout_s;
    unsigned polls = 0;
    for (;;) {
        if (atomic_load(&c->world->aborted))
            return fail_aborted(c, what);
        ncclResult_t state = ncclSuccess;
        ncclResult_t r = ncclCommGetAsyncError(c->nccl, &state);
        if (r != ncclSuccess)
            return fail_nccl(c, "ncclCommGetAsyncError", r);
        if (state != ncclSuccess && state != ncclInProgress)
            return fail_nccl(c, what, state);
        if (state == ncclSuccess) {
            if (!stream)
                return SELDP_OK;
            cudaError_t q = cudaStreamQuery(c->stream);
            if (q == cudaSuccess)
                return SELDP_OK;
            if (q != cudaErrorNotReady)
                return fail_cuda(c, what, q);
        }
        if (now_s() > deadline)
            return fail_timeout(c, what);
        backoff(&polls);
    }
}

/* Make the rank's device current and refuse to start on an aborted world. */
static seldp_status enter(nccl_comm *c, const char *what)
{
    if (atomic_load(&c->world->aborted) || !c->nccl)
        return fail_aborted(c, what);
    int cur = -1;
    cudaError_t err = cudaGetDevice(&cur);
    if (err == cudaSuccess && cur != c->ordinal)
        err = cudaSetDevice(c->ordinal);
    if (err != cudaSuccess)
        return fail_cuda(c, "cudaSetDevice", err);
    return SELDP_OK;
}

/* A device buffer must be on this rank's GPU: NCCL reads it from there. */
static seldp_status check_device_mem(nccl_comm *c, const char *what, seldp_device mem)
{
    if (mem.kind == SELDP_DEVICE_CUDA && mem.ordinal != c->ordinal)
        return fail_abort(c, SELDP_ERR_DEVICE,
                          "nccl rank %d/%d: %s: buffer on cuda:%d, expected the rank's device "
                          "cuda:%d or the host",
                          c->rank, c->size, what, mem.ordinal, c->ordinal);
    return SELDP_OK;
}

/* At least `bytes` of device staging. Only called between collectives (nothing of this
 * rank in flight), so the implicit synchronization of cudaFree costs nothing. */
static seldp_status ensure_staging(nccl_comm *c, size_t bytes)
{
    if (bytes <= c->staging_bytes)
        return SELDP_OK;
    size_t want = c->staging_bytes * 2 > bytes ? c->staging_bytes * 2 : bytes;
    if (want < 4096)
        want = 4096;
    if (c->staging) {
        cudaFree(c->staging);
        c->staging = NULL;
        c->staging_bytes = 0;
    }
    cudaError_t err = cudaMalloc(&c->staging, want);
    if (err != cudaSuccess) {
        c->staging = NULL;
        cudaGetLastError();
        return fail_abort(c, SELDP_ERR_NOMEM,
                          "nccl rank %d/%d: cudaMalloc of %zu staging bytes on cuda:%d failed: %s",
                          c->rank, c->size, want, c->ordinal, cudaGetErrorString(err));
    }
    c->staging_bytes = want;
    return SELDP_OK;
}

/* Copy between host and device on the rank's stream and wait. Used only when no NCCL work
 * is pending on the stream, so the wait cannot depend on another rank. */
static seldp_status copy_sync(nccl_comm *c, void *dst, const void *src, size_t bytes,
                              enum cudaMemcpyKind kind)
{
    if (bytes == 0)
        return SELDP_OK;
    cudaError_t err = cudaMemcpyAsync(dst, src, bytes, kind, c->stream);
    if (err == cudaSuccess)
        err = cudaStreamSynchronize(c->stream);
    if (err != cudaSuccess)
        return fail_cuda(c, "staging copy", err);
    return SELDP_OK;
}

static bool nccl_type(seldp_dtype dtype, ncclDataType_t *out)
{
    switch (dtype) {
    case SELDP_F32:
        *out = ncclFloat32;
        return true;
    case SELDP_F64:
        *out = ncclFloat64;
        return true;
    case SELDP_F16:
        *out = ncclFloat16;
        return true;
    case SELDP_BF16:
        *out = ncclBfloat16;
        return true;
    case SELDP_I8:
        *out = ncclInt8;
        return true;
    case SELDP_U8:
        *out = ncclUint8;
        return true;
    case SELDP_I32:
        *out = ncclInt32;
        return true;
    case SELDP_U32:
        *out = ncclUint32;
        return true;
    case SELDP_I64:
        *out = ncclInt64;
        return true;
    case SELDP_U64:
        *out = ncclUint64;
        return true;
    default:
        return false;
    }
}

/* ---- creation ------------------------------------------------------------------------ */

/* A rank handle on `world` for the calling thread's current device, with its stream. */
static seldp_status handle_new(seldp_nccl_world *world, int rank, int size, int ordinal,
                               nccl_comm **out)
{
    nccl_comm *c = calloc(1, sizeof *c);
    if (!c)
        return seldp__fail(SELDP_ERR_NOMEM, "nccl rank %d: out of memory", rank);
    c->world = world_retain(world);
    c->ordinal = ordinal;
    c->rank = rank;
    c->size = size;
    cudaError_t err = seldp__cuda()->stream_create(&c->stream, cudaStreamNonBlocking);
    if (err != cudaSuccess) {
        seldp__cuda()->get_last_error();
        c->stream = NULL;
        world_release(c->world);
        free(c);
        return seldp__fail(SELDP_ERR_TRANSPORT,
                           "nccl rank %d: cudaStreamCreate on cuda:%d failed: %s", rank, ordinal,
                           cudaGetErrorString(err));
    }
    *out = c;
    return SELDP_OK;
}

static void handle_free(nccl_comm *c)
{
    if (!c)
        return;
    abort_local(c);
    if (c->stream)
        seldp__cuda()->stream_destroy(c->stream);
    if (c->staging)
        cudaFree(c->staging);
    world_release(c->world);
    free(c);
}

static seldp_status comm_create(seldp_nccl_world *world, int rank, seldp_comm **out)
{
    nccl_comm *c = NULL;
    seldp_comm *comm = NULL;
    seldp_status st = SELDP_OK;
    int ordinal = -1;
    cudaError_t err = seldp__cuda()->get_device(&ordinal);
    if (err == cudaSuccess && seldp_nccl_device_count() == 0)
        err = cudaErrorNoDevice;
    if (err != cudaSuccess) {
        seldp__cuda()->get_last_error();
        atomic_store(&world->aborted, true);
        SELDP_FAIL(SELDP_ERR_TRANSPORT, "nccl rank %d: no usable CUDA device: %s", rank,
                   cudaGetErrorString(err));
    }
    if ((st = handle_new(world, rank, world->nranks, ordinal, &c)) != SELDP_OK) {
        /* the other ranks are entering ncclCommInitRankConfig: do not let them wait */
        atomic_store(&world->aborted, true);
        goto fail;
    }
    /* A rank that failed before joining has aborted the world: joining it would only wait
     * out the timeout in NCCL's bootstrap. */
    if (atomic_load(&world->aborted)) {
        st = fail_aborted(c, "ncclCommInitRankConfig");
        goto fail;
    }

    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    config.commName = "seldp";
    ncclResult_t r = ncclCommInitRankConfig(&c->nccl, world->nranks, world->id, rank, &config);
    if (!nccl_started(r)) {
        st = fail_nccl(c, "ncclCommInitRankConfig", r);
        goto fail;
    }
    SELDP_CHECK(wait_done(c, "ncclCommInitRankConfig", false));

    c->is_world = true;
    comm = seldp__comm_new(&nccl_ops, rank, world->nranks, rank,
                           (seldp_device){SELDP_DEVICE_CUDA, ordinal}, c);
    if (!comm)
        SELDP_FAIL(SELDP_ERR_NOMEM, "nccl rank %d: out of memory", rank);
    *out = comm;
    return SELDP_OK;
fail:
    handle_free(c);
    return st;
}

seldp_status seldp_nccl_comm_init(seldp_nccl_world *world, int rank, seldp_comm **out)
{
    if (!out)
        return seldp__fail(SELDP_ERR_INVALID_ARGUMENT, "nccl rank %d: comm_init: out is NULL",
                           rank);
    *out = NULL;
    if (!world)
        return seldp__fail(SELDP_ERR_INVALID_ARGUMENT, "nccl rank %d: comm_init: world is NULL",
                           rank);
    if (rank < 0 || rank >= world->nranks)
        return seldp__fail(SELDP_ERR_INVALID_ARGUMENT,
                           "nccl: rank %d is outside the world of %d ranks", rank, world->nranks);
    if (atomic_exchange(&world->joined[rank], true))
        return seldp__fail(SELDP_ERR_DUPLICATE, "nccl: rank %d joined the world twice", rank);
    return comm_create(world, rank, out);
}

seldp_status seldp_nccl_comm_init_with_id(const void *id, int nranks, int rank,
                                          const seldp_comm_config *cfg, seldp_comm **out)
{
    seldp_nccl_world *w = NULL;
    seldp_status st = SELDP_OK;
    if (!out || !id)
        return seldp__fail(SELDP_ERR_INVALID_ARGUMENT,
                           "nccl rank %d: comm_init_with_id: %s is NULL", rank, id ? "out" : "id");
    *out = NULL;
    if (nranks < 1 || rank < 0 || rank >= nranks)
        return seldp__fail(SELDP_ERR_INVALID_ARGUMENT,
                           "nccl: rank %d is outside a world of %d ranks", rank, nranks);
    SELDP_CHECK(world_new(nranks, cfg, false, &w));
    memcpy(&w->id, id, sizeof w->id);
    st = comm_create(w, rank, out);
fail:
    world_release(w); /* the communicator holds its own reference */
    return st;
}

/* ---- collectives --------------------------------------------------------------------- */

static seldp_status nccl_barrier(seldp_comm *comm)
{
    nccl_comm *c = comm->impl;
    seldp_status st = SELDP_OK;
    SELDP_CHECK(enter(c, "barrier"));
    SELDP_CHECK(ensure_staging(c, sizeof(int32_t)));
    ncclResult_t r =
        ncclAllReduce(c->staging, c->staging, 1, ncclInt32, ncclSum, c->nccl, c->stream);
    if (!nccl_started(r))
        return fail_nccl(c, "ncclAllReduce (barrier)", r);
    return wait_done(c, "barrier", true);
fail:
    return st;
}

static seldp_status nccl_broadcast(seldp_comm *comm, void *buf, size_t bytes, int root,
                                   seldp_device mem)
{
    nccl_comm *c = comm->impl;
    seldp_status st = SELDP_OK;
    SELDP_CHECK(enter(c, "broadcast"));
    SELDP_CHECK(check_device_mem(c, "broadcast", mem));
    if (bytes == 0)
        return SELDP_OK;
    bool host = mem.kind == SELDP_DEVICE_HOST;
    void *dbuf = buf;
    if (host) {
        SELDP_CHECK(ensure_staging(c, bytes));
        dbuf = c->staging;
        if (c->rank == root)
            SELDP_CHECK(copy_sync(c, dbuf, buf, bytes, cudaMemcpyHostToDevice));
    }
    ncclResult_t r = ncclBroadcast(dbuf, dbuf, bytes, ncclUint8, root, c->nccl, c->stream);
    if (!nccl_started(r))
        return fail_nccl(c, "ncclBroadcast", r);
    SELDP_CHECK(wait_done(c, "broadcast", true));
    if (host && c->rank != root)
        SELDP_CHECK(copy_sync(c, buf, dbuf, bytes, cudaMemcpyDeviceToHost));
    return SELDP_OK;
fail:
    return st;
}

static seldp_status nccl_allreduce(seldp_comm *comm, const void *send, void *recv, size_t count,
                                   seldp_dtype dtype, seldp_device mem)
{
    nccl_comm *c = comm->impl;
    seldp_status st = SELDP_OK;
    ncclDataType_t type;
    SELDP_CHECK(enter(c, "allreduce"));
    SELDP_CHECK(check_device_mem(c, "allreduce", mem));
    if (!nccl_type(dtype, &type))
        return fail_abort(c, SELDP_ERR_DTYPE, "nccl rank %d/%d: allreduce of %s is not supported",
                          c->rank, c->size, seldp_dtype_name(dtype));
    if (count == 0)
        return SELDP_OK;
    size_t bytes = count * seldp_dtype_size(dtype);
    bool host = mem.kind == SELDP_DEVICE_HOST;
    const void *dsend = send;
    void *drecv = recv;
    if (host) {
        SELDP_CHECK(ensure_staging(c, bytes));
        SELDP_CHECK(copy_sync(c, c->staging, send, bytes, cudaMemcpyHostToDevice));
        dsend = drecv = c->staging;
    }
    ncclResult_t r = ncclAllReduce(dsend, drecv, count, type, ncclSum, c->nccl, c->stream);
    if (!nccl_started(r))
        return fail_nccl(c, "ncclAllReduce", r);
    SELDP_CHECK(wait_done(c, "allreduce", true));
    if (host)
        SELDP_CHECK(copy_sync(c, recv, drecv, bytes, cudaMemcpyDeviceToHost));
    return SELDP_OK;
fail:
    return st;
}

static seldp_status nccl_allgather(seldp_comm *comm, const void *send, void *recv, size_t bytes,
                                   seldp_device mem)
{
    nccl_comm *c = comm->impl;
    seldp_status st = SELDP_OK;
    SELDP_CHECK(enter(c, "allgather"));
    SELDP_CHECK(check_device_mem(c, "allgather", mem));
    if (bytes == 0)
        return SELDP_OK;
    size_t total = bytes * (size_t)c->size;
    bool host = mem.kind == SELDP_DEVICE_HOST;
    const void *dsend = send;
    void *drecv = recv;
    if (host) {
        /* In place in the staging buffer: our piece at its slot, as NCCL allows. */
        SELDP_CHECK(ensure_staging(c, total));
        drecv = c->staging;
        dsend = (char *)c->staging + (size_t)c->rank * bytes;
        SELDP_CHECK(copy_sync(c, (void *)dsend, send, bytes, cudaMemcpyHostToDevice));
    }
    ncclResult_t r = ncclAllGather(dsend, drecv, bytes, ncclUint8, c->nccl, c->stream);
    if (!nccl_started(r))
        return fail_nccl(c, "ncclAllGather", r);
    SELDP_CHECK(wait_done(c, "allgather", true));
    if (host)
        SELDP_CHECK(copy_sync(c, recv, drecv, total, cudaMemcpyDeviceToHost));
    return SELDP_OK;
fail:
    return st;
}

/* An allgather of host bytes through the staging buffer; blocks = size * bytes out. */
static seldp_status gather_host(nccl_comm *c, const void *send, size_t bytes, void *out,
                                const char *what)
{
    seldp_status st = SELDP_OK;
    size_t total = bytes * (size_t)c->size;
    SELDP_CHECK(ensure_staging(c, total));
    char *slot = (char *)c->staging + (size_t)c->rank * bytes;
    SELDP_CHECK(copy_sync(c, slot, send, bytes, cudaMemcpyHostToDevice));
    ncclResult_t r = ncclAllGather(slot, c->staging, bytes, ncclUint8, c->nccl, c->stream);
    if (!nccl_started(r))
        return fail_nccl(c, what, r);
    SELDP_CHECK(wait_done(c, what, true));
    SELDP_CHECK(copy_sync(c, out, c->staging, total, cudaMemcpyDeviceToHost));
    return SELDP_OK;
fail:
    return st;
}

/* Variable-length host blobs: an allgather of the lengths, then one of the blobs padded to
 * the longest, compacted into one block in rank order. */
static seldp_status nccl_allgatherv(seldp_comm *comm, const void *send, size_t send_bytes,
                                    void **recv, size_t *recv_bytes)
{
    nccl_comm *c = comm->impl;
    seldp_status st = SELDP_OK;
    size_t n = (size_t)c->size;
    uint64_t *lengths = NULL;
    char *padded_send = NULL, *padded = NULL, *result = NULL;
    SELDP_CHECK(enter(c, "allgatherv"));

    lengths = malloc(n * sizeof *lengths);
    if (!lengths)
        FAIL_ABORT(SELDP_ERR_NOMEM, "nccl rank %d/%d: allgatherv: out of memory", c->rank, c->size);
    uint64_t mine = send_bytes;
    SELDP_CHECK(gather_host(c, &mine, sizeof mine, lengths, "allgatherv (lengths)"));
    size_t longest = 0, total = 0;
    for (size_t r = 0; r < n; r++) {
        if (lengths[r] > SIZE_MAX / n || total > SIZE_MAX - lengths[r])
            SELDP_FAIL(SELDP_ERR_INVALID_ARGUMENT,
                       "nccl rank %d/%d: allgatherv: rank %zu sends %llu bytes, too many to "
                       "gather",
                       c->rank, c->size, r, (unsigned long long)lengths[r]);
        recv_bytes[r] = (size_t)lengths[r];
        total += recv_bytes[r];
        if (recv_bytes[r] > longest)
            longest = recv_bytes[r];
    }
    result = malloc(total ? total : 1);
    if (!result)
        FAIL_ABORT(SELDP_ERR_NOMEM, "nccl rank %d/%d: allgatherv: out of memory for %zu bytes",
                   c->rank, c->size, total);
    if (longest > 0) {
        padded_send = calloc(1, longest);
        padded = malloc(longest * n);
        if (!padded_send || !padded)
            FAIL_ABORT(SELDP_ERR_NOMEM, "nccl rank %d/%d: allgatherv: out of memory for %zu bytes",
                       c->rank, c->size, longest * n);
        if (send_bytes)
            memcpy(padded_send, send, send_bytes);
        SELDP_CHECK(gather_host(c, padded_send, longest, padded, "allgatherv (blobs)"));
        size_t at = 0;
        for (size_t r = 0; r < n; r++) {
            memcpy(result + at, padded + r * longest, recv_bytes[r]);
            at += recv_bytes[r];
        }
    }
    *recv = result;
    result = NULL;
fail:
    free(result);
    free(padded);
    free(padded_send);
    free(lengths);
    return st;
}

/* Grouped ncclSend/ncclRecv, one pair per peer with a non-empty piece; our own piece is a
 * device copy on the same stream. */
static seldp_status nccl_alltoallv(seldp_comm *comm, const void *send, const size_t *send_bytes,
                                   const size_t *send_displs, void *recv, const size_t *recv_bytes,
                                   const size_t *recv_displs, seldp_device mem, size_t send_extent,
                                   size_t recv_extent)
{
    nccl_comm *c = comm->impl;
    seldp_status st = SELDP_OK;
    SELDP_CHECK(enter(c, "alltoallv"));
    SELDP_CHECK(check_device_mem(c, "alltoallv", mem));
    int n = c->size, me = c->rank;
    if (send_bytes[me] != recv_bytes[me])
        return fail_abort(c, SELDP_ERR_INVALID_ARGUMENT,
                          "nccl rank %d/%d: alltoallv sends itself %zu bytes but expects %zu", me,
                          n, send_bytes[me], recv_bytes[me]);
    bool host = mem.kind == SELDP_DEVICE_HOST;
    const char *dsend = send;
    char *drecv = recv;
    if (host) {
        /* Receive area first, send area after it, 256-byte aligned. */
        size_t recv_area = (recv_extent + 255) & ~(size_t)255;
        SELDP_CHECK(ensure_staging(c, recv_area + send_extent));
        drecv = c->staging;
        dsend = (char *)c->staging + recv_area;
        SELDP_CHECK(copy_sync(c, (void *)dsend, send, send_extent, cudaMemcpyHostToDevice));
    }
    if (send_bytes[me]) {
        cudaError_t err = cudaMemcpyAsync(drecv + recv_displs[me], dsend + send_displs[me],
                                          send_bytes[me], cudaMemcpyDeviceToDevice, c->stream);
        if (err != cudaSuccess)
            return fail_cuda(c, "alltoallv (own piece)", err);
    }
    ncclResult_t first = ncclSuccess;
    ncclResult_t r = ncclGroupStart();
    if (r != ncclSuccess)
        return fail_nccl(c, "ncclGroupStart", r);
    for (int p = 0; p < n && first == ncclSuccess; p++) {
        if (p == me)
            continue;
        if (send_bytes[p]) {
            r = ncclSend(dsend + send_displs[p], send_bytes[p], ncclUint8, p, c->nccl, c->stream);
            if (!nccl_started(r))
                first = r;
        }
        if (recv_bytes[p] && first == ncclSuccess) {
            r = ncclRecv(drecv + recv_displs[p], recv_bytes[p], ncclUint8, p, c->nccl, c->stream);
            if (!nccl_started(r))
                first = r;
        }
    }
    r = ncclGroupEnd(); /* always closes the group, also after a failed enqueue */
    if (first != ncclSuccess)
        return fail_nccl(c, "ncclSend/ncclRecv", first);
    if (!nccl_started(r))
        return fail_nccl(c, "ncclGroupEnd (alltoallv)", r);
    SELDP_CHECK(wait_done(c, "alltoallv", true));
    if (host) {
        /* Piece by piece: bytes of `recv` between the pieces are not ours to write. */
        cudaError_t err = cudaSuccess;
        for (int p = 0; p < n && err == cudaSuccess; p++)
            if (recv_bytes[p])
                err = cudaMemcpyAsync((char *)recv + recv_displs[p], drecv + recv_displs[p],
                                      recv_bytes[p], cudaMemcpyDeviceToHost, c->stream);
        if (err == cudaSuccess)
            err = cudaStreamSynchronize(c->stream);
        if (err != cudaSuccess)
            return fail_cuda(c, "alltoallv (staging copy)", err);
    }
    return SELDP_OK;
fail:
    return st;
}

/* ---- groups and teardown -------------------------------------------------------------- */

/* ncclCommSplit runs in the background on a non-blocking parent: wait for the parent to
 * leave the in-progress state, then (for a rank with a color) for the child it produced. */
static seldp_status wait_split(nccl_comm *c, bool want_child)
{
    double deadline = now_s() + c->world->timeout_s;
    unsigned polls = 0;
    seldp_status st = SELDP_OK;
    for (;;) {
        if (atomic_load(&c->world->aborted)) {
            st = fail_aborted(c, "split");
            break;
        }
        ncclResult_t state = ncclSuccess;
        ncclResult_t r = ncclCommGetAsyncError(c->nccl, &state);
        if (r != ncclSuccess || (state != ncclSuccess && state != ncclInProgress)) {
            st = fail_nccl(c, "ncclCommSplit", r != ncclSuccess ? r : state);
            break;
        }
        if (state == ncclSuccess) {
            if (!want_child)
                return SELDP_OK;
            ncclComm_t child = c->split_slot;
            if (child) {
                r = ncclCommGetAsyncError(child, &state);
                if (r != ncclSuccess || (state != ncclSuccess && state != ncclInProgress)) {
                    st = fail_nccl(c, "ncclCommSplit (new communicator)",
                                   r != ncclSuccess ? r : state);
                    break;
                }
                if (state == ncclSuccess)
                    return SELDP_OK;
            }
        }
        if (now_s() > deadline) {
            st = fail_timeout(c, "split");
            break;
        }
        backoff(&polls);
    }
    /* The parent is aborted by now, which also stops and joins the split's background job;
     * a child it produced is ours to abort. */
    if (c->split_slot) {
        ncclCommAbort(c->split_slot);
        c->split_slot = NULL;
    }
    return st;
}

static seldp_status nccl_split(seldp_comm *comm, int color, int key, seldp_comm **out)
{
    nccl_comm *c = comm->impl, *child = NULL;
    seldp_comm *result = NULL;
    seldp_status st = SELDP_OK;
    bool member = color != SELDP_COMM_NO_GROUP;
    SELDP_CHECK(enter(c, "split"));
    if (member && (st = handle_new(c->world, -1, 0, c->ordinal, &child)) != SELDP_OK) {
        /* the other ranks are entering the split: do not let them wait for this one */
        atomic_store(&c->world->aborted, true);
        abort_local(c);
        goto fail;
    }

    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    config.commName = "seldp";
    c->split_slot = NULL;
    ncclResult_t r =
        ncclCommSplit(c->nccl, member ? color : NCCL_SPLIT_NOCOLOR, key, &c->split_slot, &config);
    if (!nccl_started(r)) {
        st = fail_nccl(c, "ncclCommSplit", r);
        goto fail;
    }
    SELDP_CHECK(wait_split(c, member));
    if (!member)
        return SELDP_OK;

    child->nccl = c->split_slot;
    c->split_slot = NULL;
    r = ncclCommUserRank(child->nccl, &child->rank);
    if (r == ncclSuccess)
        r = ncclCommCount(child->nccl, &child->size);
    if (r != ncclSuccess) {
        st = fail_nccl(child, "ncclCommUserRank", r);
        goto fail;
    }
    result =
        seldp__comm_new(&nccl_ops, child->rank, child->size, comm->world_rank, comm->device, child);
    if (!result)
        FAIL_ABORT(SELDP_ERR_NOMEM, "nccl rank %d/%d: split: out of memory", c->rank, c->size);
    child->root = c->is_world ? c : c->root;
    if (child->root) {
        child->next_split = child->root->splits;
        child->root->splits = child;
    }
    *out = result;
    return SELDP_OK;
fail:
    handle_free(child);
    return st;
}

/* Local and non-blocking: every rank's next wait sees the mark, aborts its own NCCL
 * communicator and returns SELDP_ERR_ABORTED. */
static void nccl_abort(seldp_comm *comm)
{
    nccl_comm *c = comm->impl;
    atomic_store(&c->world->aborted, true);
}

/* ncclCommFinalize (flushes, and meets the other local ranks) and wait for it; an aborted
 * world, or a finalize that fails or times out, aborts the handle instead (c->nccl NULL). */
static void finalize(nccl_comm *c)
{
    if (!c->nccl || c->retired)
        return;
    int cur = -1;
    if (cudaGetDevice(&cur) == cudaSuccess && cur != c->ordinal)
        cudaSetDevice(c->ordinal);
    if (atomic_load(&c->world->aborted)) {
        abort_local(c);
        return;
    }
    ncclResult_t r = ncclCommFinalize(c->nccl);
    if (!nccl_started(r))
        abort_local(c);
    else
        (void)wait_done(c, "ncclCommFinalize", false); /* aborts the handle on failure */
}

/* Finalize, then ncclCommDestroy (or the abort finalize chose), then the stream and the
 * staging buffer. */
static void destroy_now(nccl_comm *c)
{
    finalize(c);
    if (c->nccl && atomic_load(&c->world->aborted))
        abort_local(c);
    if (c->nccl) {
        ncclCommDestroy(c->nccl);
        c->nccl = NULL;
    }
    handle_free(c);
}

static void unlink_split(nccl_comm *c)
{
    for (nccl_comm **at = &c->root->splits; *at; at = &(*at)->next_split) {
        if (*at == c) {
            *at = c->next_split;
            break;
        }
    }
    c->root = NULL;
}

/* Splits are destroyed only at teardown. In NCCL 2.28 the last local rank to destroy a
 * communicator frees resources the node's ranks share, and a rank that launches on another
 * communicator before every local rank has returned from ncclCommDestroy can stall. So a
 * split's destroy only finalizes it (and frees its stream and staging buffer) and leaves
 * its NCCL communicator to the rank's world handle; destroying the world destroys the
 * retired splits first, newest first (the same order on every rank, since splits are
 * collective), then itself, when no rank launches anything more. A split that outlives its
 * world handle, or whose finalize aborted it, is destroyed at once. */
static void nccl_destroy(seldp_comm *comm)
{
    nccl_comm *c = comm->impl;
    if (!c->is_world && c->root) {
        finalize(c);
        if (!c->nccl) {
            unlink_split(c);
            handle_free(c);
        } else {
            c->retired = true;
            if (c->stream)
                seldp__cuda()->stream_destroy(c->stream);
            c->stream = NULL;
            if (c->staging)
                cudaFree(c->staging);
            c->staging = NULL;
            c->staging_bytes = 0;
        }
        seldp__comm_free(comm);
        return;
    }
    if (c->is_world) {
        nccl_comm *next;
        for (nccl_comm *s = c->splits; s; s = next) {
            next = s->next_split;
            s->root = NULL;
            s->next_split = NULL;
            if (s->retired)
                destroy_now(s); /* finalized already: destroy, or abort on an aborted world */
        }
        c->splits = NULL;
    }
    destroy_now(c);
    seldp__comm_free(comm);
}

static const seldp_comm_ops nccl_ops = {
    .name = "nccl",
    .barrier = nccl_barrier,
    .broadcast = nccl_broadcast,
    .allreduce = nccl_allreduce,
    .allgather = nccl_allgather,
    .allgatherv = nccl_allgatherv,
    .alltoallv = nccl_alltoallv,
    .split = nccl_split,
    .abort = nccl_abort,
    .destroy = nccl_destroy,
};
