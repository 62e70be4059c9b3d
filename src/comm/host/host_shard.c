/* The execute steps of the host-staged transport's sharded collectives, and the calls that
 * publish them: the reduce-scatter and the all-gather of uneven blocks (seldp_comm.h), and
 * the fused reduce-scatter and all-gather of sharded sessions (comm_impl.h).
 *
 * Each block (a rank's range) is worked on by one rank alone, so every byte moves once; with
 * more ranks than cores only as many ranks as cores do the work, rank w the blocks of ranks
 * w, w + cores, ... (payload_workers):
 *   reduce-scatter  rank r reads block r of every rank's input, sums it in rank order and
 *                   writes it into its own output: P*N bytes read, N written by the group;
 *   all-gather      rank r reads its block once, a chunk at a time, and writes the chunk
 *                   into every rank's output while it is in the cache: N read, P*N written.
 * The fused variants do the same over many tensors, with the half upcasts and the 1/W scale
 * of the fused reduction (reduce-scatter), or the conversion of the range into each
 * parameter's dtype (all-gather), in the same pass. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "simd/host_copy.h"
#include "comm/host/host_impl.h"
#include "simd/host_sum.h"
#include "device.h"
#include "internal.h"

/* Bytes of one rank's block copied to every rank before the next: the block is read from
 * memory once and from the cache for the other ranks. */
#define GATHER_CHUNK ((size_t)64 << 10)

/* Elements of a conversion done once and written into every rank (the fused all-gather). */
#define CONVERT_CHUNK 2048

/* The first element of rank r's block. */
static size_t block_start(const size_t *counts, int r)
{
    size_t at = 0;
    for (int q = 0; q < r; q++)
        at += counts[q];
    return at;
}

static size_t counts_total(const size_t *counts, int n)
{
    return block_start(counts, n);
}

/* The ranks' inputs of one piece, gathered for the register kernel, or for the scalar one
 * beyond HOST_SUM_MAX_RANKS (heap arrays of the group's size, allocated before arriving). */
typedef struct sum_inputs {
    const void **in;
    seldp_dtype *in_dtype;
    const void *small_in[HOST_SUM_MAX_RANKS];
    seldp_dtype small_dtype[HOST_SUM_MAX_RANKS];
} sum_inputs;

static seldp_status inputs_init(sum_inputs *x, int size)
{
    x->in = x->small_in;
    x->in_dtype = x->small_dtype;
    if (size <= HOST_SUM_MAX_RANKS)
        return SELDP_OK;
    x->in = malloc((size_t)size * sizeof *x->in);
    x->in_dtype = malloc((size_t)size * sizeof *x->in_dtype);
    if (!x->in || !x->in_dtype)
        return seldp__fail(SELDP_ERR_NOMEM, "out of memory for the inputs of %d ranks", size);
    return SELDP_OK;
}

static void inputs_free(sum_inputs *x)
{
    if (x->in != x->small_in)
        free((void *)x->in);
    if (x->in_dtype != x->small_dtype)
        free(x->in_dtype);
}

/* out[i] = the ranks' x->in[q][i] summed in rank order, scaled by m; one output. */
static void sum_into(int size, sum_inputs *x, float *out, size_t n, const seldp__sum_mode *m)
{
    void *outs[1] = {out};
    if (size <= HOST_SUM_MAX_RANKS)
        seldp__host_sum(size, x->in, x->in_dtype, 1, outs, SELDP_F32, n, m);
    else
        seldp__host_sum_scalar(size, x->in, x->in_dtype, 1, outs, SELDP_F32, n, m);
}

static void stream_fence(bool stream)
{
    if (stream)
        seldp__stream_fence();
}

/* The ranks that move a collective's payload (as host_collectives.c's allreduce): every rank
 * when each has a core, else as many as there are cores, rank w doing the blocks of ranks
 * w, w + workers, ... (the others only arrive and wait). Ranks that time-share a core
 * interleave their streams and are switched out halfway through them; as many streaming
 * threads as cores keep the memory busy instead. The bits do not depend on who moves a
 * block: every sum is taken in rank order. */
static int payload_workers(const seldp_comm *comm)
{
    int size = impl_of(comm)->group->size, cores = impl_of(comm)->world->spin_size;
    return cores < 1 ? 1 : size < cores ? size : cores;
}

/* The share of a rank that moves no payload: a stall that a fault armed for this rank
 * holds it here as it would inside a share, and it stops there once the world is aborted,
 * as seldp__host_pace does. False when it stopped. */
static bool idle_share(const seldp_comm *comm)
{
    seldp__host_stall_inside(comm);
    return !atomic_load_explicit(&impl_of(comm)->world->aborted, memory_order_relaxed);
}

/* ---- reduce-scatter ------------------------------------------------------------------ */

static bool reduce_scatter_execute(const seldp_comm *comm, void *arg)
{
    sum_inputs *x = arg;
    const host_group *g = impl_of(comm)->group;
    const host_cell *s = cells_of(comm);
    const host_cell *mine = &s[comm->rank];
    size_t total = (size_t)mine->call.count;
    seldp__sum_mode m = {false, 1.0, total * sizeof(float) >= STREAM_MIN_BYTES,
                         impl_of(comm)->world->simd};
    size_t piece = seldp__host_pace_elems(sizeof(float), g->size);
    exec_pace p = {comm, 0};
    bool going = true;
    int workers = payload_workers(comm);
    if (comm->rank >= workers)
        return idle_share(comm);
    for (int q = 0; q < g->size; q++)
        x->in_dtype[q] = SELDP_F32;
    /* block o of every input, summed into rank o's output */
    for (int o = comm->rank; o < g->size && going; o += workers) {
        size_t begin = block_start(mine->counts, o), n = mine->counts[o];
        for (size_t at = 0; at < n && going; at += piece) {
            size_t len = n - at < piece ? n - at : piece;
            for (int q = 0; q < g->size; q++)
                x->in[q] = (const float *)s[q].send + begin + at;
            sum_into(g->size, x, (float *)s[o].recv + at, len, &m);
            going = seldp__host_pace(&p, len * sizeof(float) * (size_t)g->size);
        }
    }
    stream_fence(m.stream);
    return going;
}

seldp_status seldp__host_reduce_scatter(seldp_comm *comm, const void *send, void *recv,
                                        const size_t *recv_counts, seldp_dtype dtype,
                                        seldp_device mem)
{
    size_t total = counts_total(recv_counts, comm->size), mine = recv_counts[comm->rank];
    size_t esize = seldp_dtype_size(dtype);
    host_stage_view v[2] = {{send, total * esize, true, NULL}, {recv, mine * esize, false, NULL}};
    host_cell cell = {.call = {.op = OP_REDUCE_SCATTER,
                               .count = (int64_t)total,
                               .dtype = dtype,
                               .counts = seldp__proto_counts_digest(recv_counts, comm->size)},
                      .counts = recv_counts};
    sum_inputs x;
    cell.call.staged = inputs_init(&x, comm->size);
    if (cell.call.staged == SELDP_OK && mem.kind != SELDP_DEVICE_HOST)
        cell.call.staged = seldp__host_stage(comm, mem, v, 2);
    cell.send = mem.kind == SELDP_DEVICE_HOST ? send : v[0].host;
    cell.recv = mem.kind == SELDP_DEVICE_HOST ? recv : v[1].host;
    seldp_status st = seldp__host_collective_run(comm, &cell, reduce_scatter_execute, &x);
    if (st == SELDP_OK && mem.kind != SELDP_DEVICE_HOST && mine)
        st = seldp__device_copy(recv, mem, v[1].host, SELDP_HOST_DEVICE, mine * esize);
    inputs_free(&x);
    return st;
}

/* ---- all-gather of blocks ------------------------------------------------------------ */

static bool allgather_counts_execute(const seldp_comm *comm, void *arg)
{
    (void)arg;
    const host_group *g = impl_of(comm)->group;
    const host_cell *s = cells_of(comm);
    const host_cell *mine = &s[comm->rank];
    size_t esize = seldp_dtype_size((seldp_dtype)mine->call.dtype);
    size_t total = (size_t)mine->call.count * esize;
    bool stream = total * (size_t)g->size >= STREAM_MIN_BYTES, going = true;
    seldp__simd_width simd = impl_of(comm)->world->simd;
    exec_pace p = {comm, 0};
    int workers = payload_workers(comm);
    if (comm->rank >= workers)
        return idle_share(comm);
    /* rank o's block, read once and written into every output */
    for (int o = comm->rank; o < g->size && going; o += workers) {
        size_t at0 = block_start(mine->counts, o) * esize;
        size_t bytes = mine->counts[o] * esize;
        const char *src = s[o].send;
        for (size_t at = 0; at < bytes && going; at += GATHER_CHUNK) {
            size_t n = bytes - at < GATHER_CHUNK ? bytes - at : GATHER_CHUNK;
            for (int q = 0; q < g->size; q++) {
                char *dst = (char *)s[q].recv + at0 + at;
                if (dst == src + at)
                    continue; /* in place: the block is already there */
                if (stream)
                    seldp__stream_copy(dst, src + at, n, simd);
                else
                    memcpy(dst, src + at, n);
            }
            going = seldp__host_pace(&p, n * (size_t)g->size);
        }
    }
    stream_fence(stream);
    return going;
}

seldp_status seldp__host_allgather_counts(seldp_comm *comm, const void *send, void *recv,
                                          const size_t *counts, seldp_dtype dtype, seldp_device mem)
{
    size_t esize = seldp_dtype_size(dtype), total = counts_total(counts, comm->size) * esize;
    host_stage_view v[2] = {{send, counts[comm->rank] * esize, true, NULL},
                            {recv, total, false, NULL}};
    host_cell cell = {.call = {.op = OP_ALLGATHER_COUNTS,
                               .count = (int64_t)(total / esize),
                               .dtype = dtype,
                               .counts = seldp__proto_counts_digest(counts, comm->size)},
                      .counts = counts};
    cell.call.staged = seldp__host_stage(comm, mem, v, 2);
    cell.send = v[0].host;
    cell.recv = v[1].host;
    seldp_status st = seldp__host_collective_run(comm, &cell, allgather_counts_execute, NULL);
    if (st == SELDP_OK && mem.kind != SELDP_DEVICE_HOST && total)
        st = seldp__device_copy(recv, mem, v[1].host, SELDP_HOST_DEVICE, total);
    return st;
}

/* ---- the fused reduce-scatter of a sharded session ----------------------------------- */

/* The first segment that ends after element `at` (n_segs when none does). */
static size_t first_segment_after(const seldp__shard_seg *segs, size_t n_segs, size_t at)
{
    size_t lo = 0, hi = n_segs;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (segs[mid].offset + segs[mid].count <= at)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static bool scatter_fused_execute(const seldp_comm *comm, void *arg)
{
    sum_inputs *x = arg;
    const host_group *g = impl_of(comm)->group;
    const host_cell *s = cells_of(comm);
    size_t total = (size_t)s[comm->rank].call.count;
    seldp__sum_mode m = {s[comm->rank].scatter->scale != 1.0, s[comm->rank].scatter->scale,
                         total * sizeof(float) >= STREAM_MIN_BYTES, impl_of(comm)->world->simd};
    size_t piece = seldp__host_pace_elems(sizeof(float), g->size);
    exec_pace p = {comm, 0};
    bool going = true;
    int workers = payload_workers(comm);
    if (s[comm->rank].scatter->written)
        *s[comm->rank].scatter->written = true;
    if (comm->rank >= workers)
        return idle_share(comm);
    /* rank o's range of every rank's segments, summed into rank o's output */
    for (int o = comm->rank; o < g->size && going; o += workers) {
        const seldp__scatter_fused_args *f = s[o].scatter;
        for (size_t j = first_segment_after(f->segs, f->n_segs, f->begin);
             j < f->n_segs && f->segs[j].offset < f->end && going; j++) {
            size_t off = f->segs[j].offset, end = off + f->segs[j].count;
            size_t from = off > f->begin ? off : f->begin, to = end < f->end ? end : f->end;
            for (size_t at = from; at < to && going; at += piece) {
                size_t len = to - at < piece ? to - at : piece;
                for (int q = 0; q < g->size; q++) {
                    const seldp__shard_seg *seg = &s[q].scatter->segs[j];
                    x->in_dtype[q] = seg->in ? seg->in_dtype : SELDP_F32;
                    x->in[q] = seg->in ? (const char *)seg->in +
                                             (at - off) * seldp_dtype_size(seg->in_dtype)
                                       : NULL;
                }
                sum_into(g->size, x, f->out + (at - f->begin), len, &m);
                going = seldp__host_pace(&p, len * sizeof(float) * (size_t)g->size);
            }
        }
    }
    stream_fence(m.stream);
    return going;
}

seldp_status seldp__host_scatter_fused(seldp_comm *comm, const seldp__scatter_fused_args *args)
{
    size_t elems = 0;
    for (size_t j = 0; j < args->n_segs; j++)
        elems += args->segs[j].count;
    host_cell cell = {.call = {.op = OP_SCATTER_FUSED,
                               .count = (int64_t)elems,
                               .n_segs = (int64_t)args->n_segs,
                               .dtype = SELDP_F32,
                               .scale = args->scale},
                      .scatter = args};
    sum_inputs x;
    cell.call.staged = inputs_init(&x, comm->size);
    seldp_status st = seldp__host_collective_run(comm, &cell, scatter_fused_execute, &x);
    inputs_free(&x);
    return st;
}

/* ---- the fused all-gather of a sharded session --------------------------------------- */

/* n elements of src (src_dtype) into dst (dst_dtype) of another dtype, one of them F32:
 * F32 to a half rounds to nearest even, a half to F32 is exact. */
static void convert_into(void *dst, seldp_dtype dst_dtype, const void *src, seldp_dtype src_dtype,
                         size_t n)
{
    if (src_dtype == SELDP_F32)
        seldp_f32_to_half(dst_dtype, src, dst, n);
    else
        seldp_half_to_f32(src_dtype, src, dst, n);
}

/* Write n elements of out_dtype, from `from` (the range's bytes when no conversion was
 * needed, else the converted chunk), into every rank's segment j at element `at`. */
static void write_everywhere(const seldp_comm *comm, size_t j, size_t at, const void *from,
                             seldp_dtype out_dtype, size_t n, bool stream)
{
    const host_cell *s = cells_of(comm);
    size_t esize = seldp_dtype_size(out_dtype);
    for (int q = 0; q < comm->size; q++) {
        const seldp__shard_seg *seg = &s[q].gather->segs[j];
        char *dst = (char *)seg->out + (at - seg->offset) * esize;
        if (stream)
            seldp__stream_copy(dst, from, n * esize, impl_of(comm)->world->simd);
        else
            memcpy(dst, from, n * esize);
    }
}

static bool gather_fused_execute(const seldp_comm *comm, void *arg)
{
    (void)arg;
    const host_cell *s = cells_of(comm);
    size_t out_bytes = 0;
    const seldp__gather_fused_args *own = s[comm->rank].gather;
    for (size_t j = 0; j < own->n_segs; j++)
        out_bytes += own->segs[j].count * seldp_dtype_size(own->segs[j].out_dtype);
    bool stream = out_bytes * (size_t)comm->size >= STREAM_MIN_BYTES, going = true;
    exec_pace p = {comm, 0};
    int workers = payload_workers(comm);
    /* 8 KiB, of F32 or half elements */
    _Alignas(64) unsigned char converted[CONVERT_CHUNK * sizeof(float)];
    if (own->written)
        *own->written = true;
    if (comm->rank >= workers)
        return idle_share(comm);
    /* rank o's range, converted once and written into every rank's segments */
    for (int o = comm->rank; o < comm->size && going; o += workers) {
        const seldp__gather_fused_args *f = s[o].gather;
        size_t in_size = seldp_dtype_size(f->in_dtype);
        for (size_t j = first_segment_after(f->segs, f->n_segs, f->begin);
             j < f->n_segs && f->segs[j].offset < f->end && going; j++) {
            seldp_dtype out_dtype = f->segs[j].out_dtype;
            size_t off = f->segs[j].offset, end = off + f->segs[j].count;
            size_t from = off > f->begin ? off : f->begin, to = end < f->end ? end : f->end;
            bool same = out_dtype == f->in_dtype;
            size_t chunk = same ? GATHER_CHUNK / in_size : CONVERT_CHUNK;
            for (size_t at = from; at < to && going; at += chunk) {
                size_t n = to - at < chunk ? to - at : chunk;
                const char *src = (const char *)f->in + (at - f->begin) * in_size;
                if (!same) {
                    convert_into(converted, out_dtype, src, f->in_dtype, n);
                    src = (const char *)converted;
                }
                write_everywhere(comm, j, at, src, out_dtype, n, stream);
                going = seldp__host_pace(&p, n * seldp_dtype_size(out_dtype) * (size_t)comm->size);
            }
        }
    }
    stream_fence(stream);
    return going;
}

seldp_status seldp__host_gather_fused(seldp_comm *comm, const seldp__gather_fused_args *args)
{
    size_t elems = 0;
    for (size_t j = 0; j < args->n_segs; j++)
        elems += args->segs[j].count;
    host_cell cell = {.call = {.op = OP_GATHER_FUSED,
                               .count = (int64_t)elems,
                               .n_segs = (int64_t)args->n_segs,
                               .dtype = args->in_dtype},
                      .gather = args};
    return seldp__host_collective_run(comm, &cell, gather_fused_execute, NULL);
}
