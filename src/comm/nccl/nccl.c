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
 * Buffers on the host are staged through a device buffer of the rank that grows on demand.
 * No buffer is freed while the world is live: cudaFree synchronizes the device (and, with
 * peer access, its peers), which deadlocks against a peer inside an NCCL kernel waiting for
 * this rank; what growing gives up, and a split's buffers at its destroy, are retired and
 * freed when the rank destroys its world communicator.
 *
 * This file: the world (its unique id and abort mark), joining it, splits and teardown, and
 * the transport's table. nccl_wait.c: waiting, failing and staging; nccl_collectives.c: the
 * collectives; nccl_reduce.c: the fused reduction of a session's tensors. */
#define _POSIX_C_SOURCE 200809L

#include <cuda_runtime_api.h>
#include <nccl.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/nccl/nccl_impl.h"
#include "device.h"
#include "internal.h"
#include "seldp/nccl.h"

_Static_assert(SELDP_NCCL_UNIQUE_ID_BYTES == NCCL_UNIQUE_ID_BYTES,
               "SELDP_NCCL_UNIQUE_ID_BYTES must match nccl.h");

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
    seldp_comm_config defaults = SELDP_COMM_CONFIG_INIT, given = SELDP_COMM_CONFIG_INIT;
    seldp_status read = seldp__config_read(&given, sizeof given, cfg, "seldp_nccl_world_create",
                                           "seldp_comm_config", "SELDP_COMM_CONFIG_INIT");
    if (read != SELDP_OK)
        return read;
    cfg = &given;
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
    c->reduce.sum.retire = c->reduce.desc.retire = &c->retired_buffers;
    c->reduce.descs.retire = c->reduce.host.retire = &c->retired_buffers;
    cudaError_t err = seldp__cuda()->stream_create(&c->stream, cudaStreamNonBlocking);
    if (err != cudaSuccess) {
        seldp__cuda_ignore(err);
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

/* The stream, and the buffers handed to `into` (NULL: freed, with what c retired). */
static void handle_buffers_free(nccl_comm *c, seldp__retired *into)
{
    if (c->stream)
        seldp__cuda_ignore(seldp__cuda()->stream_destroy(c->stream));
    c->stream = NULL;
    seldp__device_buffer staging = {
        .device = {SELDP_DEVICE_CUDA, c->ordinal}, .ptr = c->staging, .bytes = c->staging_bytes};
    seldp__device_retire(&staging, into);
    c->staging = NULL;
    c->staging_bytes = 0;
    seldp__nccl_reduce_release(&c->reduce, into);
    if (into)
        seldp__retired_move(into, &c->retired_buffers);
    else
        seldp__retired_free(&c->retired_buffers);
}

static void handle_free(nccl_comm *c)
{
    if (!c)
        return;
    seldp__nccl_abort_local(c);
    handle_buffers_free(c, NULL);
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
        seldp__cuda_ignore(err);
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
        st = seldp__nccl_fail_aborted(c, "ncclCommInitRankConfig");
        goto fail;
    }

    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    config.commName = "seldp";
    ncclResult_t r = ncclCommInitRankConfig(&c->nccl, world->nranks, world->id, rank, &config);
    if (!nccl_started(r)) {
        st = seldp__nccl_fail_nccl(c, "ncclCommInitRankConfig", r);
        goto fail;
    }
    /* the join's own bound: a slow bootstrap is not a missing rank */
    SELDP_CHECK(
        seldp__nccl_wait_within(c, "ncclCommInitRankConfig", false, seldp__nccl_join_timeout(c)));

    c->is_world = true;
    comm = seldp__comm_new(&nccl_ops, rank, world->nranks, rank,
                           (seldp_device){SELDP_DEVICE_CUDA, ordinal}, c);
    if (!comm) /* the others have joined and go on to a collective: abort the world */
        NCCL_FAIL_ABORT(SELDP_ERR_NOMEM, "nccl rank %d: out of memory after joining the world",
                        rank);
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

/* ---- groups and teardown -------------------------------------------------------------- */

/* ncclCommSplit runs in the background on a non-blocking parent: wait for the parent to
 * leave the in-progress state, then (for a rank with a color) for the child it produced. */
static seldp_status wait_split(nccl_comm *c, bool want_child)
{
    double limit = seldp__nccl_join_timeout(c), deadline = seldp__nccl_now() + limit;
    unsigned polls = 0;
    seldp_status st = SELDP_OK;
    for (;;) {
        if (atomic_load(&c->world->aborted)) {
            st = seldp__nccl_fail_aborted(c, "split");
            break;
        }
        ncclResult_t state = ncclSuccess;
        ncclResult_t r = ncclCommGetAsyncError(c->nccl, &state);
        if (r != ncclSuccess || (state != ncclSuccess && state != ncclInProgress)) {
            st = seldp__nccl_fail_nccl(c, "ncclCommSplit", r != ncclSuccess ? r : state);
            break;
        }
        if (state == ncclSuccess) {
            if (!want_child)
                return SELDP_OK;
            ncclComm_t child = c->split_child;
            if (child) {
                r = ncclCommGetAsyncError(child, &state);
                if (r != ncclSuccess || (state != ncclSuccess && state != ncclInProgress)) {
                    st = seldp__nccl_fail_nccl(c, "ncclCommSplit (new communicator)",
                                               r != ncclSuccess ? r : state);
                    break;
                }
                if (state == ncclSuccess)
                    return SELDP_OK;
            }
        }
        if (seldp__nccl_now() > deadline) {
            st = seldp__nccl_fail_timeout_after(c, "split", limit);
            break;
        }
        seldp__nccl_backoff(&polls);
    }
    /* The parent is aborted by now, which also stops and joins the split's background job;
     * a child it produced is ours to abort. */
    if (c->split_child) {
        ncclCommAbort(c->split_child);
        c->split_child = NULL;
    }
    return st;
}

static seldp_status nccl_split(seldp_comm *comm, int color, int key, seldp_comm **out)
{
    nccl_comm *c = comm->impl, *child = NULL;
    seldp_comm *result = NULL;
    seldp_status st = SELDP_OK;
    bool member = color != SELDP_COMM_NO_GROUP;
    SELDP_CHECK(seldp__nccl_enter(c, "split"));
    if (member && (st = handle_new(c->world, -1, 0, c->ordinal, &child)) != SELDP_OK) {
        /* the other ranks are entering the split: do not let them wait for this one */
        atomic_store(&c->world->aborted, true);
        seldp__nccl_abort_local(c);
        goto fail;
    }

    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    config.commName = "seldp";
    c->split_child = NULL;
    ncclResult_t r =
        ncclCommSplit(c->nccl, member ? color : NCCL_SPLIT_NOCOLOR, key, &c->split_child, &config);
    if (!nccl_started(r)) {
        st = seldp__nccl_fail_nccl(c, "ncclCommSplit", r);
        goto fail;
    }
    SELDP_CHECK(wait_split(c, member));
    if (!member)
        return SELDP_OK;

    child->nccl = c->split_child;
    c->split_child = NULL;
    r = ncclCommUserRank(child->nccl, &child->rank);
    if (r == ncclSuccess)
        r = ncclCommCount(child->nccl, &child->size);
    if (r != ncclSuccess) {
        st = seldp__nccl_fail_nccl(child, "ncclCommUserRank", r);
        goto fail;
    }
    result =
        seldp__comm_new(&nccl_ops, child->rank, child->size, comm->world_rank, comm->device, child);
    if (!result)
        NCCL_FAIL_ABORT(SELDP_ERR_NOMEM, "nccl rank %d/%d: split: out of memory", c->rank, c->size);
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
    cudaError_t err = seldp__cuda()->get_device(&cur);
    if (err == cudaSuccess && cur != c->ordinal)
        err = seldp__cuda()->set_device(c->ordinal);
    seldp__cuda_ignore(err); /* finalize on the current device all the same */
    if (atomic_load(&c->world->aborted)) {
        seldp__nccl_abort_local(c);
        return;
    }
    ncclResult_t r = ncclCommFinalize(c->nccl);
    if (!nccl_started(r))
        seldp__nccl_abort_local(c);
    else
        (void)seldp__nccl_wait_done(c, "ncclCommFinalize",
                                    false); /* aborts the handle on failure */
}

/* Finalize, then ncclCommDestroy (or the abort finalize chose). */
static void destroy_nccl(nccl_comm *c)
{
    finalize(c);
    if (c->nccl && atomic_load(&c->world->aborted))
        seldp__nccl_abort_local(c);
    if (c->nccl) {
        ncclCommDestroy(c->nccl);
        c->nccl = NULL;
    }
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
        /* its buffers go to the world handle, which frees them at the world's destroy */
        finalize(c);
        handle_buffers_free(c, &c->root->retired_buffers);
        if (!c->nccl) {
            unlink_split(c);
            handle_free(c);
        } else {
            c->retired = true;
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
            if (s->retired) { /* finalized already: destroy, or abort on an aborted world */
                destroy_nccl(s);
                handle_buffers_free(s, &c->retired_buffers);
                handle_free(s);
            }
        }
        c->splits = NULL;
    }
    destroy_nccl(c); /* the world's finalize meets the other local ranks: then free */
    handle_free(c);
    seldp__comm_free(comm);
}

static const seldp_comm_ops nccl_ops = {
    .name = "nccl",
    .thread_bound = true,
    .barrier = seldp__nccl_barrier,
    .broadcast = seldp__nccl_broadcast,
    .allreduce = seldp__nccl_allreduce,
    .allgather = seldp__nccl_allgather,
    .allgatherv = seldp__nccl_allgatherv,
    .alltoallv = seldp__nccl_alltoallv,
    .split = nccl_split,
    .reduce_fused = seldp__nccl_reduce_fused,
    .fused_memory = seldp__nccl_fused_memory,
    .reduce_scatter = seldp__nccl_reduce_scatter,
    .allgather_counts = seldp__nccl_allgather_counts,
    .abort = nccl_abort,
    .destroy = nccl_destroy,
};

const seldp_comm_ops *seldp__nccl_ops(void)
{
    return &nccl_ops;
}
