/* The host-staged transport: N in-process ranks that share memory.
 *
 * This file holds its worlds, groups and communicators: creating a world, joining it,
 * splitting a group, aborting and destroying. How a collective runs is in
 * host_rendezvous.c, what it moves in host_collectives.c (with the kernels of src/simd/),
 * and the test hooks in host_fault.c; host_impl.h is the state they share. Device buffers are
 * staged through pinned host memory before "arrive" and copied back after "leave", so the
 * collectives only ever touch host memory. */
#define _POSIX_C_SOURCE 200809L /* pthread_condattr_setclock, clock_gettime */

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "comm/host/host_impl.h"
#include "simd/host_sum.h"
#include "device.h"
#include "internal.h"

/* ---- groups ------------------------------------------------------------------ */

/* A group of `size` ranks with `refs` holders, linked into the world. Caller holds no lock. */
static host_group *group_new(seldp_host_world *w, int size, const int *world_ranks, int refs)
{
    /* aligned_alloc: the counters and cells have cache lines of their own */
    host_group *g = aligned_alloc(64, (sizeof *g + 63) / 64 * 64);
    if (!g)
        return NULL;
    memset(g, 0, sizeof *g);
    g->world = w;
    g->size = size;
    g->refs = refs;
    g->world_ranks = malloc((size_t)size * sizeof *g->world_ranks);
    g->cells = aligned_alloc(64, 2 * (size_t)size * sizeof *g->cells);
    g->eager = aligned_alloc(64, 2 * (size_t)size * EAGER_MAX);
    g->entered = aligned_alloc(64, (size_t)size * sizeof *g->entered);
    if (!g->world_ranks || !g->cells || !g->eager || !g->entered ||
        pthread_cond_init(&g->cond, &w->condattr) != 0) {
        free(g->world_ranks);
        free(g->cells);
        free(g->eager);
        free(g->entered);
        free(g);
        return NULL;
    }
    memset(g->cells, 0, 2 * (size_t)size * sizeof *g->cells);
    memset(g->entered, 0, (size_t)size * sizeof *g->entered);
    memcpy(g->world_ranks, world_ranks, (size_t)size * sizeof *g->world_ranks);
    pthread_mutex_lock(&w->lock);
    /* Keep the world group at the head. */
    host_group **at = w->groups ? &w->groups->next : &w->groups;
    g->next = *at;
    *at = g;
    pthread_mutex_unlock(&w->lock);
    return g;
}

static void group_free(host_group *g)
{
    pthread_cond_destroy(&g->cond);
    free(g->world_ranks);
    free(g->cells);
    free(g->eager);
    free(g->entered);
    free(g);
}

/* Drop one holder; the last one unlinks and frees a split group. Caller holds w->lock. */
static void group_release_locked(host_group *g)
{
    seldp_host_world *w = g->world;
    if (--g->refs > 0 || g == w->groups)
        return;
    for (host_group **p = &w->groups; *p; p = &(*p)->next) {
        if (*p == g) {
            *p = g->next;
            break;
        }
    }
    group_free(g);
}

/* ---- staging of device buffers ----------------------------------------------------- */

/* Slices of the staging buffer start on cache lines, as the ranks' buffers would. */
static size_t stage_round(size_t bytes)
{
    return (bytes + 63) & ~(size_t)63;
}

seldp_status seldp__host_stage(seldp_comm *comm, seldp_device mem, host_stage_view *views, int n)
{
    host_comm *hc = impl_of(comm);
    seldp_status st = SELDP_OK;
    size_t need = 0;
    for (int i = 0; i < n; i++) {
        views[i].host = (void *)views[i].ptr;
        need += stage_round(views[i].bytes);
    }
    if (mem.kind == SELDP_DEVICE_HOST)
        return SELDP_OK;
    st = seldp__pinned_reserve(&hc->stage, mem, need);
    size_t at = 0;
    for (int i = 0; i < n && st == SELDP_OK; i++) {
        views[i].host = (char *)hc->stage.ptr + at;
        at += stage_round(views[i].bytes);
        if (views[i].fill && views[i].bytes)
            st = seldp__device_copy(views[i].host, SELDP_HOST_DEVICE, views[i].ptr, mem,
                                    views[i].bytes);
    }
    for (int i = 0; i < n && st != SELDP_OK; i++)
        views[i].host = NULL;
    return st;
}

/* ---- split ------------------------------------------------------------------------------ */

typedef struct split_member {
    int key;
    int parent_rank;
} split_member;

static int split_member_cmp(const void *a, const void *b)
{
    const split_member *x = a, *y = b;
    if (x->key != y->key)
        return x->key < y->key ? -1 : 1;
    return (x->parent_rank > y->parent_rank) - (x->parent_rank < y->parent_rank);
}

static seldp_status comm_wrap(seldp_host_world *w, host_group *g, int rank, seldp_device device,
                              seldp_comm **out);

static seldp_status host_split(seldp_comm *comm, int color, int key, seldp_comm **out)
{
    host_comm *hc = impl_of(comm);
    seldp_host_world *w = hc->world;
    host_group *parent = hc->group;
    split_member *members = NULL;
    int *world_ranks = NULL;
    seldp_status st = SELDP_OK;
    host_cell cell = {.call = {.op = OP_SPLIT, .color = color, .key = key}};

    st = seldp__host_collective_enter(comm, &cell);
    if (st != SELDP_OK)
        return st;
    if ((st = seldp__host_cells_agree(comm)) != SELDP_OK) {
        /* Leave as the other collectives do, so that mismatched ranks stay in step. */
        char why[1024];
        snprintf(why, sizeof why, "%s", seldp_last_error());
        seldp__host_collective_leave(comm, OP_SPLIT);
        seldp__set_error(why);
        return st;
    }
    /* Every rank has published its color and key: compute this rank's new group. */
    const host_cell *s = cells_of(comm);
    int n = 0, new_rank = -1;
    if (color != SELDP_COMM_NO_GROUP) {
        members = malloc((size_t)parent->size * sizeof *members);
        world_ranks = malloc((size_t)parent->size * sizeof *world_ranks);
        if (members && world_ranks) {
            for (int r = 0; r < parent->size; r++)
                if (s[r].call.color == color)
                    members[n++] = (split_member){(int)s[r].call.key, r};
            qsort(members, (size_t)n, sizeof *members, split_member_cmp);
            for (int i = 0; i < n; i++) {
                world_ranks[i] = parent->world_ranks[members[i].parent_rank];
                if (members[i].parent_rank == comm->rank)
                    new_rank = i;
            }
        }
    }
    /* The new group's rank 0 creates it for everyone; the others pick it up after
     * "publish" (the cell is ours until "leave"). */
    host_group *created = NULL;
    if (new_rank == 0)
        created = group_new(w, n, world_ranks, n);
    seldp__host_stall_inside(comm);
    pthread_mutex_lock(&w->lock);
    cells_of(comm)[comm->rank].new_group = created;
    cells_of(comm)[comm->rank].finished = true;
    pthread_mutex_unlock(&w->lock);
    /* Every rank has arrived and publishes its group: the wait always completes (a rank
     * slow to publish is waited for) and so does the split, on every rank alike. */
    (void)seldp__host_phase_wait(comm, OP_SPLIT, WAIT_FOR_ALL);

    host_group *group = NULL;
    if (st == SELDP_OK && color != SELDP_COMM_NO_GROUP) {
        if (new_rank < 0) {
            st = seldp__fail(SELDP_ERR_NOMEM, "rank %d: split: out of memory", comm->rank);
        } else {
            pthread_mutex_lock(&w->lock);
            group = cells_of(comm)[members[0].parent_rank].new_group;
            pthread_mutex_unlock(&w->lock);
            if (!group)
                st = seldp__fail(SELDP_ERR_NOMEM,
                                 "rank %d: split: rank %d ran out of memory creating the group "
                                 "of color %d",
                                 comm->rank, members[0].parent_rank, color);
        }
    }
    if (st == SELDP_OK && group)
        st = comm_wrap(w, group, new_rank, comm->device, out);
    if (st != SELDP_OK && group) {
        pthread_mutex_lock(&w->lock);
        group_release_locked(group);
        pthread_mutex_unlock(&w->lock);
    }
    /* every share finished (see above): the verdict is this rank's own status */
    (void)seldp__host_collective_leave(comm, OP_SPLIT);
    free(members);
    free(world_ranks);
    return st;
}

/* ---- abort, destroy, world ---------------------------------------------------------------- */

static void host_abort(seldp_comm *comm)
{
    seldp_host_world *w = impl_of(comm)->world;
    char reason[64];
    snprintf(reason, sizeof reason, "rank %d aborted the world", comm->world_rank);
    pthread_mutex_lock(&w->lock);
    seldp__host_world_abort_locked(w, SELDP_ERR_ABORTED, reason);
    pthread_mutex_unlock(&w->lock);
}

static void host_destroy(seldp_comm *comm)
{
    host_comm *hc = impl_of(comm);
    pthread_mutex_lock(&hc->world->lock);
    group_release_locked(hc->group);
    pthread_mutex_unlock(&hc->world->lock);
    seldp__pinned_release(&hc->stage);
    free(hc);
    seldp__comm_free(comm);
}

static const seldp_comm_ops host_ops = {
    .name = "host",
    .barrier = seldp__host_barrier,
    .broadcast = seldp__host_broadcast,
    .allreduce = seldp__host_allreduce,
    .allgather = seldp__host_allgather,
    .allgatherv = seldp__host_allgatherv,
    .alltoallv = seldp__host_alltoallv,
    .split = host_split,
    .reduce_fused = seldp__host_reduce_fused,
    .reduce_scatter = seldp__host_reduce_scatter,
    .allgather_counts = seldp__host_allgather_counts,
    .scatter_fused = seldp__host_scatter_fused,
    .gather_fused = seldp__host_gather_fused,
    .abort = host_abort,
    .destroy = host_destroy,
};

/* A communicator for `rank` of `g`, which already counts this holder in its refs. */
static seldp_status comm_wrap(seldp_host_world *w, host_group *g, int rank, seldp_device device,
                              seldp_comm **out)
{
    host_comm *hc = malloc(sizeof *hc);
    seldp_comm *comm = NULL;
    if (hc) {
        hc->world = w;
        hc->group = g;
        hc->collectives = 0;
        hc->stall_inside_s = 0.0;
        hc->stage = (seldp__pinned_buffer){0};
        comm = seldp__comm_new(&host_ops, rank, g->size, g->world_ranks[rank], device, hc);
    }
    if (!comm) {
        free(hc);
        return seldp__fail(SELDP_ERR_NOMEM, "rank %d: out of memory creating a communicator", rank);
    }
    *out = comm;
    return SELDP_OK;
}

seldp_status seldp_host_world_create(int nranks, const seldp_comm_config *cfg,
                                     seldp_host_world **out)
{
    seldp_comm_config defaults = SELDP_COMM_CONFIG_INIT;
    seldp_status st = SELDP_OK;
    seldp_host_world *w = NULL;
    int *identity = NULL;
    bool lock_ready = false, attr_ready = false;
    SELDP_CHECK(seldp__config_read(&defaults, sizeof defaults, cfg, "seldp_host_world_create",
                                   "seldp_comm_config", "SELDP_COMM_CONFIG_INIT"));
    cfg = &defaults;
    if (!out)
        SELDP_FAIL(SELDP_ERR_INVALID_ARGUMENT, "host_world_create: out is NULL");
    if (nranks < 1)
        SELDP_FAIL(SELDP_ERR_INVALID_ARGUMENT, "host world of %d ranks, expected at least 1",
                   nranks);
    if (!(cfg->timeout_s > 0))
        SELDP_FAIL(SELDP_ERR_INVALID_ARGUMENT, "host world timeout %g s, expected > 0",
                   cfg->timeout_s);
    w = calloc(1, sizeof *w);
    identity = malloc((size_t)nranks * sizeof *identity);
    if (!w || !identity)
        SELDP_FAIL(SELDP_ERR_NOMEM, "out of memory creating a host world of %d ranks", nranks);
    w->nranks = nranks;
    w->timeout_s = cfg->timeout_s;
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    w->spin_size = cpus > 1 ? (int)(cpus < INT32_MAX ? cpus : INT32_MAX) : 0;
    long yielders = (cpus > 1 ? cpus : 1) * YIELD_RANKS_PER_CPU;
    w->yield_size = (int)(yielders < INT32_MAX ? yielders : INT32_MAX);
    w->simd = (int)seldp__host_simd_of_cpu();
    w->joined = calloc((size_t)nranks, sizeof *w->joined);
    if (!w->joined)
        SELDP_FAIL(SELDP_ERR_NOMEM, "out of memory creating a host world of %d ranks", nranks);
    if (pthread_mutex_init(&w->lock, NULL) != 0)
        SELDP_FAIL(SELDP_ERR_INTERNAL, "host world: pthread_mutex_init failed");
    lock_ready = true;
    if (pthread_condattr_init(&w->condattr) != 0)
        SELDP_FAIL(SELDP_ERR_INTERNAL, "host world: pthread_condattr_init failed");
    attr_ready = true;
    if (pthread_condattr_setclock(&w->condattr, CLOCK_MONOTONIC) != 0)
        SELDP_FAIL(SELDP_ERR_INTERNAL, "host world: CLOCK_MONOTONIC condition variables "
                                       "are not supported");
    for (int r = 0; r < nranks; r++)
        identity[r] = r;
    /* The world group lives as long as the world; it is not reference-counted. */
    if (!group_new(w, nranks, identity, 0))
        SELDP_FAIL(SELDP_ERR_NOMEM, "out of memory creating a host world of %d ranks", nranks);
    free(identity);
    *out = w;
    return SELDP_OK;

fail:
    free(identity);
    if (w) {
        if (attr_ready)
            pthread_condattr_destroy(&w->condattr);
        if (lock_ready)
            pthread_mutex_destroy(&w->lock);
        free(w->joined);
        free(w);
    }
    return st;
}

seldp_status seldp_host_comm_init(seldp_host_world *world, int rank, seldp_device device,
                                  seldp_comm **out)
{
    seldp_status st = SELDP_OK;
    seldp_comm *comm = NULL;
    if (!world || !out)
        SELDP_FAIL(SELDP_ERR_INVALID_ARGUMENT, "rank %d: host_comm_init: NULL argument", rank);
    *out = NULL;
    if (rank < 0 || rank >= world->nranks)
        SELDP_FAIL(SELDP_ERR_INVALID_ARGUMENT,
                   "rank %d: host_comm_init: rank outside the world of %d ranks", rank,
                   world->nranks);
    if (device.kind != SELDP_DEVICE_HOST &&
        (device.kind != SELDP_DEVICE_CUDA || device.ordinal < 0))
        SELDP_FAIL(SELDP_ERR_INVALID_ARGUMENT,
                   "rank %d: host_comm_init: invalid device (kind %d, ordinal %d)", rank,
                   (int)device.kind, device.ordinal);

    pthread_mutex_lock(&world->lock);
    host_group *g = world->groups;
    bool again = world->joined[rank];
    world->joined[rank] = true;
    if (!again)
        g->refs++;
    pthread_mutex_unlock(&world->lock);
    if (again)
        SELDP_FAIL(SELDP_ERR_DUPLICATE, "rank %d: host_comm_init: rank already joined this world",
                   rank);
    st = comm_wrap(world, g, rank, device, &comm);
    if (st != SELDP_OK) {
        pthread_mutex_lock(&world->lock);
        g->refs--;
        pthread_mutex_unlock(&world->lock);
        goto fail;
    }
    host_cell cell = {.call = {.op = OP_INIT}};
    SELDP_CHECK(seldp__host_collective_run(comm, &cell, NULL, NULL));
    *out = comm;
    return SELDP_OK;

fail:
    seldp_comm_destroy(comm);
    return st;
}

void seldp_host_world_destroy(seldp_host_world *world)
{
    if (!world)
        return;
    host_group *g = world->groups;
    while (g) {
        host_group *next = g->next;
        group_free(g);
        g = next;
    }
    pthread_condattr_destroy(&world->condattr);
    pthread_mutex_destroy(&world->lock);
    free(world->joined);
    free(world->faults);
    free(world);
}
