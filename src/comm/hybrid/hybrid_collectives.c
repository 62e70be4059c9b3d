/* The bodies of the hybrid collectives (hybrid_impl.h). Each is three parts: the member's
 * cell (its arguments), the leader's body (tables, steps that every member runs on its own
 * buffers, the MPI calls between the leaders), and the member's finish (its outputs copied
 * out of the group's staging).
 *
 * Sums (allreduce, reduce_scatter) keep the threads' order: the elements are cut into
 * units, each owned by one member of one process; every process sends each owner every
 * local rank's contribution to the owner's units (one alltoallv among the leaders), and the
 * owner sums them in group rank order 0, 1, ..., P-1, accumulating in the dtype from rank
 * 0's value, as the host transport's kernels do. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/hybrid/hybrid_impl.h"
#include "device.h"
#include "internal.h"

#define SUM_CHUNK 1024

static seldp_status copy_in(void *dst, const void *src, size_t bytes, seldp_device mem)
{
    if (!bytes)
        return SELDP_OK;
    if (mem.kind == SELDP_DEVICE_HOST) {
        memcpy(dst, src, bytes);
        return SELDP_OK;
    }
    return seldp__device_copy(dst, SELDP_HOST_DEVICE, src, mem, bytes);
}

static seldp_status copy_out(void *dst, const void *src, size_t bytes, seldp_device mem)
{
    if (!bytes)
        return SELDP_OK;
    if (mem.kind == SELDP_DEVICE_HOST) {
        memcpy(dst, src, bytes);
        return SELDP_OK;
    }
    return seldp__device_copy(dst, mem, src, SELDP_HOST_DEVICE, bytes);
}

#define BUF(g, i) ((unsigned char *)(g)->buf[i])

/* ---- barrier, broadcast ----------------------------------------------------------------- */

seldp_status seldp__hy_barrier(seldp_comm *comm)
{
    hy_cell s = {0};
    s.h.op = OP_BARRIER;
    return seldp__hy_collective(comm, &s, NULL, NULL, NULL);
}

static seldp_status bcast_pack(hy_group *g, int local, void *ctx)
{
    (void)ctx;
    const hy_cell *s = &g->cells[local];
    if (g->local[local] != (int)s->h.root)
        return SELDP_OK;
    return copy_in(BUF(g, 0), s->recv, (size_t)s->h.bytes, s->mem);
}

static seldp_status bcast_body(hy_group *g, void *ctx)
{
    (void)ctx;
    size_t bytes = (size_t)g->cells[0].h.bytes;
    int root = (int)g->cells[0].h.root;
    if (!seldp__hy_buf(g, 0, bytes))
        return seldp__hy_mpi_failed(g, SELDP_ERR_NOMEM);
    seldp_status st = seldp__hy_step(g, OP_BROADCAST, bcast_pack, NULL, 0);
    if (st != SELDP_OK)
        return seldp__hy_mpi_failed(g, st);
    if (g->n_procs > 1) { /* the root's process sends, every other receives */
        int P = g->n_procs, from = g->proc_of[root];
        size_t *off = seldp__hy_tab(g, 0, (size_t)P), *sl = seldp__hy_tab(g, 1, (size_t)P),
               *rl = seldp__hy_tab(g, 2, (size_t)P);
        if (!off || !sl || !rl)
            return seldp__hy_mpi_failed(g, SELDP_ERR_NOMEM);
        for (int q = 0; q < P; q++) {
            off[q] = 0;
            sl[q] = g->my_proc == from ? bytes : 0;
            rl[q] = q == from ? bytes : 0;
        }
        st = seldp__hy_exchange(g, OP_BROADCAST, BUF(g, 0), off, sl, BUF(g, 0), off, rl);
        if (st != SELDP_OK)
            return st;
    }
    return SELDP_OK;
}

static seldp_status bcast_finish(hy_group *g, int local, void *ctx)
{
    (void)ctx;
    const hy_cell *s = &g->cells[local];
    if (g->local[local] == (int)s->h.root)
        return SELDP_OK;
    return copy_out(s->recv, g->buf[0], (size_t)s->h.bytes, s->mem);
}

seldp_status seldp__hy_broadcast(seldp_comm *comm, void *buf, size_t bytes, int root,
                                 seldp_device mem)
{
    hy_cell s = {0};
    s.h.op = OP_BROADCAST;
    s.h.root = root;
    s.h.bytes = (int64_t)bytes;
    s.recv = buf;
    s.mem = mem;
    return seldp__hy_collective(comm, &s, bcast_body, bcast_finish, NULL);
}

/* ---- the gathers: allgather, allgather_counts, allgatherv ------------------------------- */

/* Tables: 0 len[r] (bytes), 1 out_off[r] (in the output, group order), 2 src_off[r] (in the
 * gathered staging, process order), 3 bytes of each process. */
enum { G_LEN, G_OUT, G_SRC, G_PROC };

static seldp_status gather_pack(hy_group *g, int local, void *ctx)
{
    (void)ctx;
    const hy_cell *s = &g->cells[local];
    int r = g->local[local];
    size_t base = g->tab[G_SRC][g->local[0]];
    return copy_in(BUF(g, 0) + g->tab[G_SRC][r] - base, s->send, g->tab[G_LEN][r], s->mem);
}

static seldp_status vblock_alloc(hy_group *g, int local, void *ctx)
{
    (void)ctx;
    hy_cell *s = &g->cells[local];
    size_t total = g->tab[G_OUT][g->size - 1] + g->tab[G_LEN][g->size - 1];
    s->vblock = malloc(total ? total : 1);
    if (!s->vblock)
        return seldp__fail(SELDP_ERR_NOMEM, "rank %d: allgatherv: out of memory for %zu bytes",
                           g->local[local], total);
    return SELDP_OK;
}

static seldp_status gather_body(hy_group *g, void *ctx)
{
    (void)ctx;
    const hy_cell *s0 = &g->cells[0];
    seldp__comm_op op = (seldp__comm_op)s0->h.op;
    int n = g->size;
    size_t *len = seldp__hy_tab(g, G_LEN, (size_t)n), *out = seldp__hy_tab(g, G_OUT, (size_t)n),
           *src = seldp__hy_tab(g, G_SRC, (size_t)n),
           *pb = seldp__hy_tab(g, G_PROC, (size_t)g->n_procs);
    if (!len || !out || !src || !pb)
        return seldp__hy_mpi_failed(g, SELDP_ERR_NOMEM);
    size_t es = op == OP_ALLGATHER_COUNTS ? seldp_dtype_size(s0->dtype) : 1;
    for (int r = 0; r < n; r++) {
        if (op == OP_ALLGATHER)
            len[r] = s0->bytes;
        else if (op == OP_ALLGATHER_COUNTS)
            len[r] = s0->counts[r] * es; /* the leader's own array; the same on every rank */
        else
            len[r] = (size_t)seldp__hy_extra(g, r, 1)[0];
        out[r] = r ? out[r - 1] + len[r - 1] : 0;
    }
    size_t at = 0;
    for (int q = 0; q < g->n_procs; q++) {
        size_t begin = at;
        for (int i = g->proc_start[q]; i < g->proc_start[q + 1]; i++) {
            src[g->members[i]] = at;
            at += len[g->members[i]];
        }
        pb[q] = at - begin;
    }
    if (!seldp__hy_buf(g, 0, pb[g->my_proc]) || (g->n_procs > 1 && !seldp__hy_buf(g, 1, at)))
        return seldp__hy_mpi_failed(g, SELDP_ERR_NOMEM);
    seldp_status st;
    if (op == OP_ALLGATHERV && (st = seldp__hy_step(g, op, vblock_alloc, NULL, 0)) != SELDP_OK)
        return seldp__hy_mpi_failed(g, st);
    if ((st = seldp__hy_step(g, op, gather_pack, NULL, 0)) != SELDP_OK)
        return seldp__hy_mpi_failed(g, st);
    if (g->n_procs > 1) { /* every process's blob to every other, its own copied */
        int P = g->n_procs;
        size_t *so = seldp__hy_tab(g, 4, (size_t)P), *sl = seldp__hy_tab(g, 5, (size_t)P),
               *ro = seldp__hy_tab(g, 6, (size_t)P);
        if (!so || !sl || !ro)
            return seldp__hy_mpi_failed(g, SELDP_ERR_NOMEM);
        for (int q = 0; q < P; q++) {
            so[q] = 0;
            sl[q] = pb[g->my_proc];
            ro[q] = src[g->members[g->proc_start[q]]]; /* where process q's blob starts */
        }
        st = seldp__hy_exchange_self(g, op, BUF(g, 0), so, sl, BUF(g, 1), ro, pb);
        if (st != SELDP_OK)
            return st;
    }
    return SELDP_OK;
}

static seldp_status gather_finish(hy_group *g, int local, void *ctx)
{
    (void)ctx;
    hy_cell *s = &g->cells[local];
    const unsigned char *all = g->n_procs > 1 ? BUF(g, 1) : BUF(g, 0);
    const size_t *len = g->tab[G_LEN], *out = g->tab[G_OUT], *src = g->tab[G_SRC];
    unsigned char *dst = s->h.op == OP_ALLGATHERV ? s->vblock : s->recv;
    seldp_device mem = s->h.op == OP_ALLGATHERV ? SELDP_HOST_DEVICE : s->mem;
    bool in_order = true;
    for (int r = 0; r < g->size && in_order; r++)
        in_order = out[r] == src[r];
    seldp_status st = SELDP_OK;
    if (in_order)
        st = copy_out(dst, all, out[g->size - 1] + len[g->size - 1], mem);
    else
        for (int r = 0; r < g->size && st == SELDP_OK; r++)
            st = copy_out(dst + out[r], all + src[r], len[r], mem);
    if (st == SELDP_OK && s->h.op == OP_ALLGATHERV) {
        for (int r = 0; r < g->size; r++)
            s->vrecv_bytes[r] = len[r];
        *s->vrecv = s->vblock;
        s->vblock = NULL;
    }
    return st;
}

seldp_status seldp__hy_allgather(seldp_comm *comm, const void *send, void *recv, size_t bytes,
                                 seldp_device mem)
{
    hy_cell s = {0};
    s.h.op = OP_ALLGATHER;
    s.h.bytes = (int64_t)bytes;
    s.send = send;
    s.recv = recv;
    s.bytes = bytes;
    s.mem = mem;
    return seldp__hy_collective(comm, &s, gather_body, gather_finish, NULL);
}

seldp_status seldp__hy_allgather_counts(seldp_comm *comm, const void *send, void *recv,
                                        const size_t *counts, seldp_dtype dtype, seldp_device mem)
{
    hy_cell s = {0};
    s.h.op = OP_ALLGATHER_COUNTS;
    s.h.dtype = dtype;
    s.h.counts = seldp__proto_counts_digest(counts, comm->size);
    s.send = send;
    s.recv = recv;
    s.counts = counts;
    s.dtype = dtype;
    s.mem = mem;
    return seldp__hy_collective(comm, &s, gather_body, gather_finish, NULL);
}

seldp_status seldp__hy_allgatherv(seldp_comm *comm, const void *send, size_t send_bytes,
                                  void **recv, size_t *recv_bytes)
{
    hy_cell s = {0};
    s.h.op = OP_ALLGATHERV;
    s.h.bytes = (int64_t)send_bytes;
    s.send = send;
    s.bytes = send_bytes;
    s.mem = SELDP_HOST_DEVICE;
    s.vrecv = recv;
    s.vrecv_bytes = recv_bytes;
    seldp_status st = seldp__hy_collective(comm, &s, gather_body, gather_finish, NULL);
    if (st != SELDP_OK) {
        /* a block allocated before the round failed (this rank's cell stays its own) */
        hy_member *m = seldp__hy_member(comm);
        free(m->g->cells[m->local].vblock);
        m->g->cells[m->local].vblock = NULL;
    }
    return st;
}

/* ---- alltoallv -------------------------------------------------------------------------- */

/* Tables: 0 pack offset of (local sender i, receiver d) at i * size + d, 1 receive offset of
 * (local receiver i, sender s) at i * size + s, 2..5 the leaders' send counts and
 * displacements, receive counts and displacements (bytes, per process). */
enum { A_PACK, A_RECV, A_SC, A_SD, A_RC, A_RD };

static seldp_status a2a_pack(hy_group *g, int local, void *ctx)
{
    (void)ctx;
    const hy_cell *s = &g->cells[local];
    const size_t *pack = g->tab[A_PACK] + (size_t)local * g->size;
    seldp_status st = SELDP_OK;
    for (int d = 0; d < g->size && st == SELDP_OK; d++)
        st = copy_in(BUF(g, 0) + pack[d], (const unsigned char *)s->send + s->send_displs[d],
                     s->send_bytes[d], s->mem);
    return st;
}

static seldp_status a2a_body(hy_group *g, void *ctx)
{
    (void)ctx;
    int n = g->size, P = g->n_procs;
    size_t *pack = seldp__hy_tab(g, A_PACK, (size_t)g->n_local * n),
           *roff = seldp__hy_tab(g, A_RECV, (size_t)g->n_local * n),
           *sc = seldp__hy_tab(g, A_SC, (size_t)P), *sd = seldp__hy_tab(g, A_SD, (size_t)P),
           *rc = seldp__hy_tab(g, A_RC, (size_t)P), *rd = seldp__hy_tab(g, A_RD, (size_t)P);
    if (!pack || !roff || !sc || !sd || !rc || !rd)
        return seldp__hy_mpi_failed(g, SELDP_ERR_NOMEM);
    size_t at = 0;
    for (int q = 0; q < P; q++) {
        sd[q] = at;
        for (int i = 0; i < g->n_local; i++) {
            const int64_t *S = seldp__hy_extra(g, g->local[i], 2 * n);
            for (int k = g->proc_start[q]; k < g->proc_start[q + 1]; k++) {
                int d = g->members[k];
                pack[(size_t)i * n + d] = at;
                at += (size_t)S[d];
            }
        }
        sc[q] = at - sd[q];
    }
    size_t send_total = at;
    at = 0;
    for (int q = 0; q < P; q++) {
        rd[q] = at;
        for (int k = g->proc_start[q]; k < g->proc_start[q + 1]; k++) {
            int s = g->members[k];
            const int64_t *S = seldp__hy_extra(g, s, 2 * n);
            for (int i = 0; i < g->n_local; i++) {
                roff[(size_t)i * n + s] = at;
                at += (size_t)S[g->local[i]];
            }
        }
        rc[q] = at - rd[q];
    }
    if (!seldp__hy_buf(g, 0, send_total) || (P > 1 && !seldp__hy_buf(g, 1, at)))
        return seldp__hy_mpi_failed(g, SELDP_ERR_NOMEM);
    seldp_status st = seldp__hy_step(g, OP_ALLTOALLV, a2a_pack, NULL, 0);
    if (st != SELDP_OK)
        return seldp__hy_mpi_failed(g, st);
    if (P > 1) {
        st = seldp__hy_exchange_self(g, OP_ALLTOALLV, BUF(g, 0), sd, sc, BUF(g, 1), rd, rc);
        if (st != SELDP_OK)
            return st;
    }
    return SELDP_OK;
}

static seldp_status a2a_finish(hy_group *g, int local, void *ctx)
{
    (void)ctx;
    const hy_cell *s = &g->cells[local];
    const unsigned char *all = g->n_procs > 1 ? BUF(g, 1) : BUF(g, 0);
    const size_t *roff = g->tab[A_RECV] + (size_t)local * g->size;
    seldp_status st = SELDP_OK;
    for (int r = 0; r < g->size && st == SELDP_OK; r++)
        st = copy_out((unsigned char *)s->recv + s->recv_displs[r], all + roff[r], s->recv_bytes[r],
                      s->mem);
    return st;
}

seldp_status seldp__hy_alltoallv(seldp_comm *comm, const void *send, const size_t *send_bytes,
                                 const size_t *send_displs, void *recv, const size_t *recv_bytes,
                                 const size_t *recv_displs, seldp_device mem, size_t send_extent,
                                 size_t recv_extent)
{
    (void)send_extent;
    (void)recv_extent;
    hy_cell s = {0};
    s.h.op = OP_ALLTOALLV;
    s.send = send;
    s.recv = recv;
    s.send_bytes = send_bytes;
    s.send_displs = send_displs;
    s.recv_bytes = recv_bytes;
    s.recv_displs = recv_displs;
    s.mem = mem;
    return seldp__hy_collective(comm, &s, a2a_body, a2a_finish, NULL);
}

/* ---- the sums: allreduce, reduce_scatter ------------------------------------------------ */

/* Tables (units indexed by position in g->members): 0 first element, 1 elements, 2 offset
 * within its process's units; 3..6 the leaders' send counts and displacements, receive
 * counts and displacements (bytes); 7 for local member i and group rank r, where r's
 * contribution to i's unit starts in the received staging (elements), at i * size + r;
 * 8 the elements each process owns (allreduce's allgather), 9 where entry 7 points: 1 the
 * packed staging (this process's own ranks), 0 the received one. */
enum { S_BEG, S_LEN, S_UOFF, S_SC, S_SD, S_RC, S_RD, S_ROFF, S_SLICE, S_RSRC };

typedef struct sum_args {
    size_t count; /* allreduce: the elements */
    size_t es;
    seldp_dtype dtype;
    size_t units_me; /* elements of this process's units */
} sum_args;
_Static_assert(sizeof(sum_args) <= sizeof(((hy_group *)0)->step_ctx), "a step's context is copied");

static seldp_status sum_pack(hy_group *g, int local, void *ctx)
{
    const sum_args *a = ctx;
    const hy_cell *s = &g->cells[local];
    seldp_status st = SELDP_OK;
    for (int q = 0; q < g->n_procs && st == SELDP_OK; q++) {
        size_t L = 0;
        for (int k = g->proc_start[q]; k < g->proc_start[q + 1]; k++)
            L += g->tab[S_LEN][k];
        unsigned char *to = BUF(g, 0) + g->tab[S_SD][q] + (size_t)local * L * a->es;
        for (int k = g->proc_start[q]; k < g->proc_start[q + 1] && st == SELDP_OK; k++)
            st = copy_in(to + g->tab[S_UOFF][k] * a->es,
                         (const unsigned char *)s->send + g->tab[S_BEG][k] * a->es,
                         g->tab[S_LEN][k] * a->es, s->mem);
    }
    return st;
}

#define SUM_RANKS(type)                                                                            \
    do {                                                                                           \
        type acc[SUM_CHUNK];                                                                       \
        for (size_t at = 0; at < len; at += SUM_CHUNK) {                                           \
            size_t m = len - at < SUM_CHUNK ? len - at : SUM_CHUNK;                                \
            const type *x0 = (const type *)(src[0] ? packed : all) + roff[0] + at;                 \
            for (size_t e = 0; e < m; e++)                                                         \
                acc[e] = x0[e];                                                                    \
            for (int r = 1; r < g->size; r++) {                                                    \
                const type *x = (const type *)(src[r] ? packed : all) + roff[r] + at;              \
                for (size_t e = 0; e < m; e++)                                                     \
                    acc[e] += x[e];                                                                \
            }                                                                                      \
            st = sum_write(g, local, a, acc, at, m);                                               \
            if (st != SELDP_OK)                                                                    \
                return st;                                                                         \
        }                                                                                          \
    } while (0)

/* Where a member's sums go: allreduce into the result staging, reduce_scatter into the
 * member's own recv. */
static seldp_status sum_write(hy_group *g, int local, const sum_args *a, const void *acc, size_t at,
                              size_t m)
{
    int k = g->proc_start[g->my_proc] + local;
    size_t first = g->tab[S_BEG][k] + at;
    const hy_cell *s = &g->cells[local];
    if (s->h.op == OP_ALLREDUCE) {
        memcpy(BUF(g, 2) + first * a->es, acc, m * a->es);
        return SELDP_OK;
    }
    return copy_out((unsigned char *)s->recv + at * a->es, acc, m * a->es, s->mem);
}

static seldp_status sum_units(hy_group *g, int local, void *ctx)
{
    const sum_args *a = ctx;
    int k = g->proc_start[g->my_proc] + local;
    size_t len = g->tab[S_LEN][k];
    const size_t *roff = g->tab[S_ROFF] + (size_t)local * g->size;
    const size_t *src = g->tab[S_RSRC] + (size_t)local * g->size;
    const unsigned char *all = BUF(g, 1), *packed = BUF(g, 0);
    seldp_status st = SELDP_OK;
    if (!len)
        return SELDP_OK;
    switch (a->dtype) {
    case SELDP_F32:
        SUM_RANKS(float);
        break;
    case SELDP_F64:
        SUM_RANKS(double);
        break;
    default: /* I64, U64: two's complement sums */
        SUM_RANKS(uint64_t);
        break;
    }
    return st;
}

static seldp_status sum_body(hy_group *g, void *ctx)
{
    sum_args *a = ctx;
    const hy_cell *s0 = &g->cells[0];
    bool allreduce = s0->h.op == OP_ALLREDUCE;
    seldp__comm_op op = (seldp__comm_op)s0->h.op;
    int n = g->size, P = g->n_procs;
    size_t *beg = seldp__hy_tab(g, S_BEG, (size_t)n), *len = seldp__hy_tab(g, S_LEN, (size_t)n),
           *uoff = seldp__hy_tab(g, S_UOFF, (size_t)n), *sc = seldp__hy_tab(g, S_SC, (size_t)P),
           *sd = seldp__hy_tab(g, S_SD, (size_t)P), *rc = seldp__hy_tab(g, S_RC, (size_t)P),
           *rd = seldp__hy_tab(g, S_RD, (size_t)P),
           *roff = seldp__hy_tab(g, S_ROFF, (size_t)g->n_local * n),
           *slice = seldp__hy_tab(g, S_SLICE, (size_t)P),
           *src = seldp__hy_tab(g, S_RSRC, (size_t)g->n_local * n);
    if (!beg || !len || !uoff || !sc || !sd || !rc || !rd || !roff || !slice || !src)
        return seldp__hy_mpi_failed(g, SELDP_ERR_NOMEM);
    size_t es = a->es;
    /* the units, process by process */
    for (int q = 0; q < P; q++) {
        int members = g->proc_start[q + 1] - g->proc_start[q];
        size_t lo = 0, hi = 0;
        if (allreduce) {
            size_t base = a->count / (size_t)P, extra = a->count % (size_t)P;
            lo = base * (size_t)q + ((size_t)q < extra ? (size_t)q : extra);
            hi = lo + base + ((size_t)q < extra ? 1 : 0);
            slice[q] = hi - lo;
        }
        size_t off = 0;
        for (int i = 0; i < members; i++) {
            int k = g->proc_start[q] + i;
            if (allreduce) {
                size_t span = hi - lo, b = span / (size_t)members, x = span % (size_t)members;
                beg[k] = lo + b * (size_t)i + ((size_t)i < x ? (size_t)i : x);
                len[k] = b + ((size_t)i < x ? 1 : 0);
            } else {
                int d = g->members[k];
                size_t first = 0;
                for (int r = 0; r < d; r++)
                    first += s0->counts[r];
                beg[k] = first;
                len[k] = s0->counts[d];
            }
            uoff[k] = off;
            off += len[k];
        }
    }
    size_t L_me = 0;
    for (int k = g->proc_start[g->my_proc]; k < g->proc_start[g->my_proc + 1]; k++)
        L_me += len[k];
    a->units_me = L_me;
    size_t at = 0;
    for (int q = 0; q < P; q++) {
        size_t L = 0;
        for (int k = g->proc_start[q]; k < g->proc_start[q + 1]; k++)
            L += len[k];
        sd[q] = at;
        sc[q] = (size_t)g->n_local * L * es;
        at += sc[q];
    }
    size_t send_total = at;
    at = 0;
    for (int q = 0; q < P; q++) { /* this process's own block stays in the packed staging */
        rd[q] = at;
        rc[q] = q == g->my_proc ? 0 : (size_t)(g->proc_start[q + 1] - g->proc_start[q]) * L_me * es;
        at += rc[q];
    }
    for (int i = 0; i < g->n_local; i++) {
        int k = g->proc_start[g->my_proc] + i;
        for (int r = 0; r < n; r++) {
            bool own = g->proc_of[r] == g->my_proc;
            size_t base = own ? sd[g->my_proc] : rd[g->proc_of[r]];
            roff[(size_t)i * n + r] = base / es + (size_t)g->index_in_proc[r] * L_me + uoff[k];
            src[(size_t)i * n + r] = own;
        }
    }
    if (!seldp__hy_buf(g, 0, send_total) || !seldp__hy_buf(g, 1, at) ||
        (allreduce && !seldp__hy_buf(g, 2, a->count * es)))
        return seldp__hy_mpi_failed(g, SELDP_ERR_NOMEM);
    seldp_status st = seldp__hy_step(g, op, sum_pack, a, sizeof *a);
    if (st != SELDP_OK)
        return seldp__hy_mpi_failed(g, st);
    if (P > 1 && (st = seldp__hy_exchange(g, op, BUF(g, 0), sd, sc, BUF(g, 1), rd, rc)) != SELDP_OK)
        return st;
    if ((st = seldp__hy_step(g, op, sum_units, a, sizeof *a)) != SELDP_OK)
        return seldp__hy_mpi_failed(g, st);
    if (allreduce && P > 1) {
        /* every process's slice to every other, into the result staging in place */
        size_t lo = 0;
        for (int q = 0; q < P; q++) {
            rd[q] = lo * es; /* where slice q lies */
            rc[q] = slice[q] * es;
            lo += slice[q];
        }
        for (int q = 0; q < P; q++) {
            sd[q] = rd[g->my_proc];
            sc[q] = rc[g->my_proc];
        }
        st = seldp__hy_exchange(g, op, BUF(g, 2), sd, sc, BUF(g, 2), rd, rc);
        if (st != SELDP_OK)
            return st;
    }
    return SELDP_OK;
}

static seldp_status allreduce_finish(hy_group *g, int local, void *ctx)
{
    const sum_args *a = ctx;
    const hy_cell *s = &g->cells[local];
    return copy_out(s->recv, g->buf[2], a->count * a->es, s->mem);
}

seldp_status seldp__hy_allreduce(seldp_comm *comm, const void *send, void *recv, size_t count,
                                 seldp_dtype dtype, seldp_device mem)
{
    hy_cell s = {0};
    s.h.op = OP_ALLREDUCE;
    s.h.count = (int64_t)count;
    s.h.dtype = dtype;
    s.send = send;
    s.recv = recv;
    s.dtype = dtype;
    s.mem = mem;
    sum_args a = {count, seldp_dtype_size(dtype), dtype, 0};
    return seldp__hy_collective(comm, &s, sum_body, allreduce_finish, &a);
}

seldp_status seldp__hy_reduce_scatter(seldp_comm *comm, const void *send, void *recv,
                                      const size_t *recv_counts, seldp_dtype dtype,
                                      seldp_device mem)
{
    hy_cell s = {0};
    s.h.op = OP_REDUCE_SCATTER;
    s.h.dtype = dtype;
    s.h.counts = seldp__proto_counts_digest(recv_counts, comm->size);
    s.send = send;
    s.recv = recv;
    s.counts = recv_counts;
    s.dtype = dtype;
    s.mem = mem;
    sum_args a = {0, seldp_dtype_size(dtype), dtype, 0};
    return seldp__hy_collective(comm, &s, sum_body, NULL, &a);
}

/* ---- the table -------------------------------------------------------------------------- */

const seldp_comm_ops seldp__hy_ops = {
    .name = "hybrid",
    .barrier = seldp__hy_barrier,
    .broadcast = seldp__hy_broadcast,
    .allreduce = seldp__hy_allreduce,
    .allgather = seldp__hy_allgather,
    .allgatherv = seldp__hy_allgatherv,
    .alltoallv = seldp__hy_alltoallv,
    .split = seldp__hy_split,
    .reduce_scatter = seldp__hy_reduce_scatter,
    .allgather_counts = seldp__hy_allgather_counts,
    .abort = seldp__hy_abort,
    .destroy = seldp__hy_destroy,
};
