/* The hybrid transport (seldp/hybrid.h): worlds, joins, groups, split, abort and destroy.
 * The round every collective goes through is in hybrid_sync.c, the bodies in
 * hybrid_collectives.c. */
#define _POSIX_C_SOURCE 200809L /* pthread_condattr_setclock, clock_gettime, nanosleep */

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/hybrid/hybrid_fault.h"
#include "comm/hybrid/hybrid_impl.h"
#include "internal.h"
#include "seldp/mpi.h"

/* ---- groups ----------------------------------------------------------------------------- */

static void group_free(hy_group *g)
{
    if (!g)
        return;
    seldp__hy_reap(g, true);
    free(g->proc_rank);
    for (int i = 0; i < 4; i++)
        free(g->buf[i]);
    for (int i = 0; i < 10; i++)
        free(g->tab[i]);
    free(g->world_ranks);
    free(g->proc_of);
    free(g->index_in_proc);
    free(g->proc_start);
    free(g->members);
    free(g->cells);
    free(g->cell_ex);
    free(g->sums);
    free(g->extra);
    pthread_cond_destroy(&g->cv);
    pthread_mutex_destroy(&g->mu);
    free(g);
}

hy_group *seldp__hy_group_new(hy_world *w, int size, const int *world_ranks, const int *proc_of,
                              int n_procs, int my_proc, const int *proc_rank, int64_t id)
{
    hy_group *g = calloc(1, sizeof *g);
    if (!g)
        return NULL;
    g->w = w;
    g->size = size;
    g->n_procs = n_procs;
    g->my_proc = my_proc;
    g->id = id;
    g->tag = 1 + (int)((uint64_t)id % ((1u << 29) - 1));
    pthread_mutex_init(&g->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&g->cv, &ca);
    pthread_condattr_destroy(&ca);
    g->world_ranks = malloc((size_t)size * sizeof(int));
    g->proc_of = malloc((size_t)size * sizeof(int));
    g->index_in_proc = malloc((size_t)size * sizeof(int));
    g->proc_start = calloc((size_t)n_procs + 1, sizeof(int));
    g->members = malloc((size_t)size * sizeof(int));
    g->sums = calloc((size_t)n_procs, sizeof *g->sums);
    g->proc_rank = malloc((size_t)n_procs * sizeof(int));
    if (!g->world_ranks || !g->proc_of || !g->index_in_proc || !g->proc_start || !g->members ||
        !g->sums || !g->proc_rank) {
        group_free(g);
        return NULL;
    }
    memcpy(g->world_ranks, world_ranks, (size_t)size * sizeof(int));
    memcpy(g->proc_of, proc_of, (size_t)size * sizeof(int));
    memcpy(g->proc_rank, proc_rank, (size_t)n_procs * sizeof(int));
    for (int r = 0; r < size; r++)
        g->proc_start[proc_of[r] + 1]++;
    for (int q = 0; q < n_procs; q++)
        g->proc_start[q + 1] += g->proc_start[q];
    int *fill = calloc((size_t)n_procs, sizeof(int));
    if (!fill) {
        group_free(g);
        return NULL;
    }
    for (int r = 0; r < size; r++) {
        int q = proc_of[r];
        g->index_in_proc[r] = fill[q];
        g->members[g->proc_start[q] + fill[q]++] = r;
    }
    free(fill);
    g->n_local = g->proc_start[my_proc + 1] - g->proc_start[my_proc];
    g->local = g->members + g->proc_start[my_proc];
    g->cells = calloc((size_t)g->n_local, sizeof *g->cells);
    g->cell_ex = calloc((size_t)g->n_local * 2 * (size_t)size, sizeof(int64_t));
    if (!g->cells || !g->cell_ex) {
        group_free(g);
        return NULL;
    }
    g->refs = g->n_local;
    pthread_mutex_lock(&w->mu);
    g->next = w->groups;
    w->groups = g;
    pthread_mutex_unlock(&w->mu);
    return g;
}

void seldp__hy_group_release(hy_group *g)
{
    pthread_mutex_lock(&g->mu);
    bool last = --g->refs == 0;
    pthread_mutex_unlock(&g->mu);
    if (!last)
        return;
    hy_world *w = g->w;
    pthread_mutex_lock(&w->mu);
    for (hy_group **p = &w->groups; *p; p = &(*p)->next)
        if (*p == g) {
            *p = g->next;
            break;
        }
    pthread_mutex_unlock(&w->mu);
    group_free(g);
}

seldp_comm *seldp__hy_handle(hy_group *g, int rank, int local, seldp_device device)
{
    hy_member *m = calloc(1, sizeof *m);
    if (!m)
        return NULL;
    m->g = g;
    m->local = local;
    seldp_comm *comm =
        seldp__comm_new(&seldp__hy_ops, rank, g->size, g->world_ranks[rank], device, m);
    if (!comm)
        free(m);
    return comm;
}

/* ---- abort and destroy ------------------------------------------------------------------ */

void seldp__hy_world_abort(hy_world *w, seldp_status status, const char *fmt, ...)
{
    pthread_mutex_lock(&w->mu);
    if (!atomic_load(&w->aborted)) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(w->abort_reason, sizeof w->abort_reason, fmt, ap);
        va_end(ap);
        w->abort_status = status;
        atomic_store(&w->aborted, true);
    }
    if (w->mpi)
        seldp_comm_abort(w->mpi); /* the notice to every other process */
    for (hy_group *g = w->groups; g; g = g->next) {
        pthread_mutex_lock(&g->mu);
        pthread_cond_broadcast(&g->cv);
        pthread_mutex_unlock(&g->mu);
    }
    pthread_mutex_unlock(&w->mu);
}

void seldp__hy_abort(seldp_comm *comm)
{
    hy_group *g = seldp__hy_member(comm)->g;
    seldp__hy_world_abort(g->w, SELDP_ERR_ABORTED, "rank %d aborted the world", comm->world_rank);
}

void seldp__hy_destroy(seldp_comm *comm)
{
    hy_member *m = seldp__hy_member(comm);
    hy_group *g = m->g;
    free(m);
    seldp__comm_free(comm);
    seldp__hy_group_release(g);
}

seldp_status seldp__hy_fault_stall(seldp_comm *comm, seldp__hy_stall where, double seconds)
{
    if (!comm || comm->ops != &seldp__hy_ops)
        return seldp__fail(SELDP_ERR_INVALID_ARGUMENT,
                           "hy_fault_stall: comm is %s, expected a hybrid communicator",
                           comm ? comm->ops->name : "NULL");
    if (where < SELDP__HY_STALL_ARRIVE || where > SELDP__HY_STALL_LEAVE)
        return seldp__fail(SELDP_ERR_INVALID_ARGUMENT,
                           "rank %d: hy_fault_stall: point %d, expected 1 to 3", comm->rank,
                           (int)where);
    if (!(seconds > 0 && seconds < 3600))
        return seldp__fail(SELDP_ERR_INVALID_ARGUMENT,
                           "rank %d: hy_fault_stall: %g s, expected in (0, 3600)", comm->rank,
                           seconds);
    hy_member *m = seldp__hy_member(comm);
    pthread_mutex_lock(&m->g->mu);
    m->g->stall_local = m->local;
    m->g->stall_s = seconds;
    m->g->stall_where = (int)where;
    pthread_mutex_unlock(&m->g->mu);
    return SELDP_OK;
}

/* ---- split ------------------------------------------------------------------------------ */

typedef struct split_rank {
    int rank, color, key;
} split_rank;

static int by_color_key(const void *a, const void *b)
{
    const split_rank *x = a, *y = b;
    if (x->color != y->color)
        return x->color < y->color ? -1 : 1;
    if (x->key != y->key)
        return x->key < y->key ? -1 : 1;
    return x->rank < y->rank ? -1 : x->rank > y->rank;
}

/* A child's id: the same in every process of the group, from the parent's, the split's
 * number on the parent and the colour's rank among the split's colours (splitmix64). */
static int64_t child_id(const hy_group *g, int64_t split, int color_index)
{
    uint64_t z = (uint64_t)g->id * 0x9e3779b97f4a7c15ull + (uint64_t)split * 0xbf58476d1ce4e5b9ull +
                 (uint64_t)color_index + 0x632be59bd9b4e019ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return (int64_t)((z ^ (z >> 31)) >> 1);
}

static seldp_status split_body(hy_group *g, void *ctx)
{
    (void)ctx;
    int n = g->size, rank = g->local[0];
    seldp_status st = SELDP_OK;
    split_rank *all = malloc((size_t)n * sizeof *all);
    int *wr = malloc((size_t)n * sizeof(int));
    int *po = malloc((size_t)n * sizeof(int));
    int *set = malloc((size_t)g->n_procs * sizeof(int));
    int *where = malloc((size_t)g->n_procs * sizeof(int));
    int *ranks = malloc((size_t)g->n_procs * sizeof(int));
    int64_t split = ++g->splits;
    if (!all || !wr || !po || !set || !where || !ranks)
        SELDP_FAIL(SELDP_ERR_NOMEM, "rank %d: split: out of memory", rank);
    for (int i = 0; i < g->n_local; i++)
        g->cells[i].child = NULL;
    for (int r = 0; r < n; r++) {
        const int64_t *ex = seldp__hy_extra(g, r, 2);
        all[r] = (split_rank){r, (int)ex[0], (int)ex[1]};
    }
    qsort(all, (size_t)n, sizeof *all, by_color_key);
    int tag = 0;
    for (int a = 0; a < n;) {
        int b = a;
        while (b < n && all[b].color == all[a].color)
            b++;
        if (all[a].color == SELDP_COMM_NO_GROUP) {
            a = b;
            continue;
        }
        int k = b - a, n_set = 0, mine = -1;
        for (int q = 0; q < g->n_procs; q++)
            where[q] = -1;
        for (int j = 0; j < k; j++)
            where[g->proc_of[all[a + j].rank]] = 0;
        for (int q = 0; q < g->n_procs; q++)
            if (where[q] == 0) {
                where[q] = n_set;
                set[n_set++] = q;
            }
        mine = where[g->my_proc];
        tag++;
        if (mine < 0) {
            a = b;
            continue;
        }
        for (int j = 0; j < k; j++) {
            wr[j] = g->world_ranks[all[a + j].rank];
            po[j] = where[g->proc_of[all[a + j].rank]];
        }
        for (int q = 0; q < n_set; q++)
            ranks[q] = g->proc_rank[set[q]];
        hy_group *child =
            seldp__hy_group_new(g->w, k, wr, po, n_set, mine, ranks, child_id(g, split, tag));
        if (!child)
            SELDP_FAIL(SELDP_ERR_NOMEM, "rank %d: split: out of memory", rank);
        int made = 0;
        for (int j = 0; j < k; j++) {
            int r = all[a + j].rank;
            if (g->proc_of[r] != g->my_proc)
                continue;
            int local = g->index_in_proc[r];
            seldp_comm *h =
                seldp__hy_handle(child, j, child->index_in_proc[j], g->cells[local].device);
            if (!h) {
                /* the handles not made would never release the group */
                for (int left = child->n_local - made; left > 0; left--)
                    seldp__hy_group_release(child);
                SELDP_FAIL(SELDP_ERR_NOMEM, "rank %d: split: out of memory", rank);
            }
            g->cells[local].child = h;
            made++;
        }
        a = b;
    }
fail:
    if (st != SELDP_OK) {
        for (int i = 0; i < g->n_local; i++) {
            if (g->cells[i].child)
                seldp__hy_destroy(g->cells[i].child);
            g->cells[i].child = NULL;
        }
        st = seldp__hy_mpi_failed(g, st);
    }
    free(ranks);
    free(all);
    free(wr);
    free(po);
    free(set);
    free(where);
    return st;
}

static seldp_status split_finish(hy_group *g, int local, void *ctx)
{
    *(seldp_comm **)ctx = g->cells[local].child;
    return SELDP_OK;
}

seldp_status seldp__hy_split(seldp_comm *comm, int color, int key, seldp_comm **out)
{
    hy_cell s = {0};
    s.h.op = OP_SPLIT;
    s.h.color = 0; /* colors differ from rank to rank */
    s.color = color;
    s.key = key;
    *out = NULL;
    return seldp__hy_collective(comm, &s, split_body, split_finish, out);
}

/* ---- worlds ----------------------------------------------------------------------------- */

static void world_free(hy_world *w)
{
    if (!w)
        return;
    if (w->mpi)
        seldp_comm_destroy(w->mpi);
    /* kept when aborted: messages may still be on their way to it (mpi.c, group_free) */
    if (w->data != MPI_COMM_NULL && !atomic_load(&w->aborted))
        MPI_Comm_free(&w->data);
    free(w->first);
    pthread_mutex_destroy(&w->mu);
    free(w);
}

seldp_status seldp_hybrid_world_create(MPI_Comm parent, int local_ranks,
                                       const seldp_comm_config *cfg, seldp_hybrid_world **out)
{
    seldp_comm_config defaults = SELDP_COMM_CONFIG_INIT;
    seldp_status st = SELDP_OK;
    seldp_comm *mpi = NULL;
    hy_world *w = NULL;
    seldp_hybrid_world *hw = NULL;
    int64_t *counts = NULL;
    int *wr = NULL, *po = NULL, *pr = NULL;
    MPI_Comm procs = MPI_COMM_NULL;
    int initialized = 0, finalized = 0, level = 0;

    if (!out)
        return seldp__fail(SELDP_ERR_INVALID_ARGUMENT, "hybrid_world_create: out is NULL");
    *out = NULL;
    st = seldp__config_read(&defaults, sizeof defaults, cfg, "seldp_hybrid_world_create",
                            "seldp_comm_config", "SELDP_COMM_CONFIG_INIT");
    if (st != SELDP_OK)
        return st;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (!initialized || finalized)
        return seldp__fail(SELDP_ERR_INVALID_ARGUMENT,
                           "hybrid_world_create: MPI is %s; call MPI_Init_thread before",
                           finalized ? "already finalized" : "not initialized");
    MPI_Query_thread(&level);
    if (level != MPI_THREAD_MULTIPLE)
        return seldp__fail(SELDP_ERR_INVALID_ARGUMENT,
                           "hybrid_world_create: MPI runs at thread level %d, expected "
                           "MPI_THREAD_MULTIPLE (the leaders of a process's groups call MPI from "
                           "their own threads)",
                           level);
    if (parent == MPI_COMM_NULL)
        return seldp__fail(SELDP_ERR_INVALID_ARGUMENT,
                           "hybrid_world_create: parent is MPI_COMM_NULL");
    if (local_ranks < 1)
        return seldp__fail(SELDP_ERR_INVALID_ARGUMENT,
                           "hybrid_world_create: %d local ranks, expected >= 1", local_ranks);

    SELDP_CHECK(seldp_mpi_comm_init(parent, SELDP_HOST_DEVICE, &defaults, &mpi));
    int nprocs = seldp_comm_size(mpi), proc = seldp_comm_rank(mpi);
    counts = malloc((size_t)nprocs * sizeof *counts);
    w = calloc(1, sizeof *w);
    hw = calloc(1, sizeof *hw);
    if (!counts || !w || !hw)
        SELDP_FAIL(SELDP_ERR_NOMEM, "rank %d: hybrid_world_create: out of memory", proc);
    int64_t mine = local_ranks;
    SELDP_CHECK(seldp_comm_allgather(mpi, &mine, counts, sizeof mine, SELDP_HOST_DEVICE));
    pthread_mutex_init(&w->mu, NULL);
    atomic_init(&w->aborted, false);
    w->nprocs = nprocs;
    w->proc = proc;
    w->n_local = local_ranks;
    w->timeout_s = defaults.timeout_s;
    w->first = calloc((size_t)nprocs + 1, sizeof(int));
    if (!w->first)
        SELDP_FAIL(SELDP_ERR_NOMEM, "rank %d: hybrid_world_create: out of memory", proc);
    for (int q = 0; q < nprocs; q++) {
        if (counts[q] < 1 || counts[q] > (1 << 20))
            SELDP_FAIL(SELDP_ERR_INVALID_ARGUMENT,
                       "process %d: hybrid_world_create: process %d hosts %lld ranks, expected "
                       "1 to 2^20",
                       proc, q, (long long)counts[q]);
        w->first[q + 1] = w->first[q] + (int)counts[q];
    }
    w->size = w->first[nprocs];
    wr = malloc((size_t)w->size * sizeof(int));
    po = malloc((size_t)w->size * sizeof(int));
    if (!wr || !po)
        SELDP_FAIL(SELDP_ERR_NOMEM, "rank %d: hybrid_world_create: out of memory", proc);
    for (int q = 0; q < nprocs; q++)
        for (int r = w->first[q]; r < w->first[q + 1]; r++) {
            wr[r] = r;
            po[r] = q;
        }
    pr = malloc((size_t)nprocs * sizeof(int));
    if (!pr)
        SELDP_FAIL(SELDP_ERR_NOMEM, "rank %d: hybrid_world_create: out of memory", proc);
    for (int q = 0; q < nprocs; q++)
        pr[q] = q;
    w->data = MPI_COMM_NULL;
    if (nprocs > 1) {
        /* every process arrived (the allgather): the blocking duplicate cannot wait */
        int err = MPI_Comm_dup(parent, &procs);
        if (err != MPI_SUCCESS)
            SELDP_FAIL(SELDP_ERR_TRANSPORT, "process %d: hybrid_world_create: MPI_Comm_dup failed",
                       proc);
        MPI_Comm_set_errhandler(procs, MPI_ERRORS_RETURN);
    } else {
        seldp_comm_destroy(mpi);
        mpi = NULL;
    }
    w->root = seldp__hy_group_new(w, w->size, wr, po, nprocs, proc, pr, 1);
    if (!w->root)
        SELDP_FAIL(SELDP_ERR_NOMEM, "rank %d: hybrid_world_create: out of memory", proc);
    w->mpi = mpi;
    w->data = procs;
    mpi = NULL;
    procs = MPI_COMM_NULL;
    free(pr);
    pr = NULL;
    w->root->refs++; /* the world's own */
    hw->w = w;
    *out = hw;
    free(counts);
    free(wr);
    free(po);
    return SELDP_OK;

fail:
    if (procs != MPI_COMM_NULL)
        MPI_Comm_free(&procs);
    if (mpi)
        seldp_comm_destroy(mpi);
    if (w && w->first)
        pthread_mutex_destroy(&w->mu);
    if (w)
        free(w->first);
    free(w);
    free(hw);
    free(counts);
    free(wr);
    free(po);
    free(pr);
    return st;
}

int seldp_hybrid_world_size(const seldp_hybrid_world *world)
{
    return world ? world->w->size : -1;
}

int seldp_hybrid_world_first_rank(const seldp_hybrid_world *world)
{
    return world ? world->w->first[world->w->proc] : -1;
}

int seldp_hybrid_world_local_ranks(const seldp_hybrid_world *world)
{
    return world ? world->w->n_local : -1;
}

int seldp_hybrid_world_process_of(const seldp_hybrid_world *world, int rank)
{
    if (!world || rank < 0 || rank >= world->w->size)
        return -1;
    return world->w->root->proc_of[rank];
}

seldp_status seldp_hybrid_comm_init(seldp_hybrid_world *world, int local_rank, seldp_device device,
                                    seldp_comm **out)
{
    if (!out)
        return seldp__fail(SELDP_ERR_INVALID_ARGUMENT, "hybrid_comm_init: out is NULL");
    *out = NULL;
    if (!world)
        return seldp__fail(SELDP_ERR_INVALID_ARGUMENT, "hybrid_comm_init: world is NULL");
    hy_world *w = world->w;
    if (local_rank < 0 || local_rank >= w->n_local)
        return seldp__fail(SELDP_ERR_INVALID_ARGUMENT,
                           "hybrid_comm_init: local rank %d, expected 0 to %d", local_rank,
                           w->n_local - 1);
    if (device.kind != SELDP_DEVICE_HOST &&
        (device.kind != SELDP_DEVICE_CUDA || device.ordinal < 0))
        return seldp__fail(SELDP_ERR_INVALID_ARGUMENT,
                           "rank %d: hybrid_comm_init: invalid device (kind %d, ordinal %d)",
                           w->first[w->proc] + local_rank, (int)device.kind, device.ordinal);
    int rank = w->first[w->proc] + local_rank;
    seldp_comm *comm = seldp__hy_handle(w->root, rank, local_rank, device);
    if (!comm)
        return seldp__fail(SELDP_ERR_NOMEM, "rank %d: hybrid_comm_init: out of memory", rank);
    hy_cell s = {0};
    s.h.op = OP_INIT;
    seldp_status st = seldp__hy_collective(comm, &s, NULL, NULL, NULL);
    if (st != SELDP_OK) {
        seldp__hy_world_abort(w, st == SELDP_ERR_TIMEOUT ? SELDP_ERR_TIMEOUT : SELDP_ERR_ABORTED,
                              "rank %d: %s", rank, seldp_last_error());
        seldp__hy_destroy(comm);
        return st;
    }
    *out = comm;
    return SELDP_OK;
}

void seldp_hybrid_world_destroy(seldp_hybrid_world *world)
{
    if (!world)
        return;
    hy_world *w = world->w;
    seldp__hy_group_release(w->root);
    world_free(w);
    free(world);
}
