/* The execute steps of the host-staged transport's collectives: what each rank moves once
 * every rank has arrived (see host_rendezvous.c), and the calls that publish them. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "simd/host_copy.h"
#include "comm/host/host_impl.h"
#include "simd/host_sum.h"
#include "device.h"
#include "internal.h"

/* Elements per chunk of the chunked path: fully read from every rank before any output
 * is written, so in-place buffers (send == recv) are safe. */
#define REDUCE_CHUNK 1024

/* ---- moving memory ------------------------------------------------------------------ */

/* Elements per slice: an even share rounded up to whole cache lines, so that no two
 * owners write the same line of an output. */
static size_t slice_elems(size_t count, int size, size_t esize)
{
    size_t line = 64 / esize;
    size_t share = (count + (size_t)size - 1) / (size_t)size;
    return (share + line - 1) / line * line;
}

/* The ranks that move a collective's payload: every rank when each has a core, else as
 * many as the machine has cores, ranks 0..workers-1 (the others only arrive and wait).
 * Ranks that time-share a core interleave their streams through its caches and are switched
 * out halfway through them, and the last one scheduled finishes alone on an idle machine;
 * as many streaming threads as cores keep the memory busy instead. Who computes an element
 * never changes its bits: every sum is taken in rank order. */
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

/* Copy with non-temporal stores when `stream` (host_copy.h), else memcpy. Call stream_fence
 * before the collective's "leave" so that the data is visible. */
static void stream_copy(const seldp_comm *comm, void *dst, const void *src, size_t bytes,
                        bool stream)
{
    if (stream)
        seldp__stream_copy(dst, src, bytes, impl_of(comm)->world->simd);
    else
        memcpy(dst, src, bytes);
}

static void stream_fence(bool stream)
{
    if (stream)
        seldp__stream_fence();
}

/* ---- barrier, broadcast ------------------------------------------------------------- */

seldp_status seldp__host_barrier(seldp_comm *comm)
{
    host_cell cell = {.call = {.op = OP_BARRIER}};
    return seldp__host_collective_run(comm, &cell, NULL, NULL);
}

/* Bytes of the root's buffer copied to every other rank before moving on, so that the
 * root's bytes come from memory once and from the cache for the other ranks. */
#define BROADCAST_CHUNK ((size_t)64 << 10)

/* Every rank, the root included, owns a slice of the payload and copies it from the root
 * into every other rank: the root is read once, the others written once, by all the
 * ranks' cores together. */
static bool broadcast_execute(const seldp_comm *comm, void *arg)
{
    (void)arg;
    const host_group *g = impl_of(comm)->group;
    const host_cell *s = cells_of(comm);
    size_t bytes = (size_t)s[comm->rank].call.bytes;
    int root = (int)s[comm->rank].call.root;
    size_t slice = slice_elems(bytes, g->size, 1);
    size_t begin = slice * (size_t)comm->rank;
    if (begin >= bytes || g->size == 1)
        return true;
    size_t end = bytes - begin < slice ? bytes : begin + slice;
    bool stream = bytes * (size_t)(g->size - 1) >= STREAM_MIN_BYTES, going = true;
    const char *src = s[root].send;
    exec_pace p = {comm, 0};
    for (size_t at = begin; at < end && going; at += BROADCAST_CHUNK) {
        size_t n = end - at < BROADCAST_CHUNK ? end - at : BROADCAST_CHUNK;
        for (int r = 0; r < g->size; r++)
            if (r != root)
                stream_copy(comm, (char *)s[r].recv + at, src + at, n, stream);
        going = seldp__host_pace(&p, n * (size_t)(g->size - 1));
    }
    stream_fence(stream);
    return going;
}

seldp_status seldp__host_broadcast(seldp_comm *comm, void *buf, size_t bytes, int root,
                                   seldp_device mem)
{
    bool is_root = comm->rank == root;
    host_stage_view v = {buf, bytes, is_root, NULL};
    host_cell cell = {.call = {.op = OP_BROADCAST, .bytes = (int64_t)bytes, .root = root}};
    cell.call.staged = seldp__host_stage(comm, mem, &v, 1);
    cell.send = v.host;
    cell.recv = v.host;
    seldp_status st = seldp__host_collective_run(comm, &cell, broadcast_execute, NULL);
    if (st == SELDP_OK && !is_root && mem.kind != SELDP_DEVICE_HOST)
        st = seldp__device_copy(buf, mem, v.host, SELDP_HOST_DEVICE, bytes);
    return st;
}

/* One rank's side of the elements being reduced: its input (NULL: zeros) and output. */
typedef struct sum_side {
    const void *in;
    seldp_dtype in_dtype;
    void *out;
    seldp_dtype out_dtype;
} sum_side;

/* Rank r's side of element `at` of segment `seg` of the collective. */
static sum_side side_of(const host_cell *s, size_t seg, size_t at)
{
    sum_side d;
    if (s->call.op == OP_REDUCE_FUSED) {
        const seldp__reduce_seg *g = &s->fused->segs[seg];
        d.in_dtype = g->in_dtype;
        d.out_dtype = g->out_dtype;
        d.in = g->in ? (const char *)g->in + at * seldp_dtype_size(g->in_dtype) : NULL;
        d.out = (char *)g->out + at * seldp_dtype_size(g->out_dtype);
    } else {
        d.in_dtype = d.out_dtype = SELDP_F32;
        d.in = (const float *)s->send + at;
        d.out = (float *)s->recv + at;
    }
    return d;
}

/* Elements [begin, end) of segment seg, any dtypes, any group size, in chunks: every
 * rank's contribution upcast to F32 and summed in rank order, then scaled and written
 * to every rank in its output dtype. */
static void sum_chunked(const host_cell *s, int size, size_t seg, size_t begin, size_t end,
                        const seldp__sum_mode *m)
{
    float acc[REDUCE_CHUNK], tmp[REDUCE_CHUNK];
    for (size_t at = begin; at < end; at += REDUCE_CHUNK) {
        size_t n = end - at < REDUCE_CHUNK ? end - at : REDUCE_CHUNK;
        for (int r = 0; r < size; r++) {
            sum_side d = side_of(&s[r], seg, at);
            float *dst = r == 0 ? acc : tmp;
            const float *x = dst;
            if (!d.in)
                memset(dst, 0, n * sizeof(float));
            else if (d.in_dtype == SELDP_F32)
                x = d.in;
            else
                seldp_half_to_f32(d.in_dtype, d.in, dst, n);
            if (r == 0 && x != acc)
                memcpy(acc, x, n * sizeof(float));
            for (size_t i = 0; r > 0 && i < n; i++)
                acc[i] += x[i];
        }
        for (size_t i = 0; m->scaled && i < n; i++)
            acc[i] = (float)((double)acc[i] * m->scale);
        for (int r = 0; r < size; r++) {
            sum_side d = side_of(&s[r], seg, at);
            if (d.out_dtype == SELDP_F32 && m->stream)
                seldp__stream_copy(d.out, acc, n * sizeof(float), m->simd);
            else if (d.out_dtype == SELDP_F32)
                memcpy(d.out, acc, n * sizeof(float));
            else
                seldp_f32_to_half(d.out_dtype, acc, d.out, n);
        }
    }
}

/* Elements [begin, end) of segment seg: the register kernel in groups of at most
 * HOST_SUM_MAX_RANKS, else the chunked path. */
static void sum_range(const host_cell *s, int size, size_t seg, size_t begin, size_t end,
                      const seldp__sum_mode *m)
{
    const void *in[HOST_SUM_MAX_RANKS];
    seldp_dtype in_dtype[HOST_SUM_MAX_RANKS];
    void *out[HOST_SUM_MAX_RANKS];
    seldp_dtype out_dtype = SELDP_F32;
    bool fast = size <= HOST_SUM_MAX_RANKS;
    for (int r = 0; r < size && fast; r++) {
        sum_side d = side_of(&s[r], seg, begin);
        fast = (!d.in || seldp__host_sum_dtype(d.in_dtype)) && seldp__host_sum_dtype(d.out_dtype);
        in[r] = d.in;
        in_dtype[r] = d.in_dtype;
        out[r] = d.out;
        out_dtype = d.out_dtype;
    }
    if (fast)
        seldp__host_sum(size, in, in_dtype, size, out, out_dtype, end - begin, m);
    else
        sum_chunked(s, size, seg, begin, end, m);
}

/* Sum elements [begin, end) of every rank's input in rank order 0..P-1 and write the
 * sum into every rank's output, for the dtypes without a dedicated kernel. A chunk is
 * fully read before any output is written, so in-place buffers (send == recv) are safe. */
#define DEFINE_REDUCE_SLICE(name, type)                                                            \
    static void name(const host_cell *s, int size, size_t begin, size_t end)                       \
    {                                                                                              \
        type acc[REDUCE_CHUNK];                                                                    \
        for (size_t at = begin; at < end; at += REDUCE_CHUNK) {                                    \
            size_t n = end - at < REDUCE_CHUNK ? end - at : REDUCE_CHUNK;                          \
            const type *in0 = (const type *)s[0].send + at;                                        \
            for (size_t i = 0; i < n; i++)                                                         \
                acc[i] = in0[i];                                                                   \
            for (int r = 1; r < size; r++) {                                                       \
                const type *in = (const type *)s[r].send + at;                                     \
                for (size_t i = 0; i < n; i++)                                                     \
                    acc[i] += in[i];                                                               \
            }                                                                                      \
            for (int r = 0; r < size; r++)                                                         \
                memcpy((type *)s[r].recv + at, acc, n * sizeof(type));                             \
        }                                                                                          \
    }

DEFINE_REDUCE_SLICE(reduce_slice_f64, double)
/* Signed sums wrap like unsigned ones (two's complement) instead of overflowing. */
DEFINE_REDUCE_SLICE(reduce_slice_u64, uint64_t)

static bool allreduce_execute(const seldp_comm *comm, void *arg)
{
    (void)arg;
    const host_group *g = impl_of(comm)->group;
    const host_cell *s = cells_of(comm);
    size_t count = (size_t)s[comm->rank].call.count;
    seldp_dtype dtype = (seldp_dtype)s[comm->rank].call.dtype;
    size_t esize = seldp_dtype_size(dtype);
    int workers = payload_workers(comm);
    size_t slice = slice_elems(count, workers, esize);
    size_t begin = slice * (size_t)comm->rank;
    if (comm->rank >= workers)
        return idle_share(comm);
    if (begin >= count)
        return true;
    size_t end = count - begin < slice ? count : begin + slice;
    seldp__sum_mode m = {false, 1.0, count * sizeof(float) * (size_t)g->size >= STREAM_MIN_BYTES,
                         impl_of(comm)->world->simd};
    size_t piece = seldp__host_pace_elems(esize, g->size);
    exec_pace p = {comm, 0};
    bool going = true;
    for (size_t at = begin; at < end && going; at += piece) {
        size_t stop = end - at < piece ? end : at + piece;
        switch (dtype) {
        case SELDP_F32:
            sum_range(s, g->size, 0, at, stop, &m);
            break;
        case SELDP_F64:
            reduce_slice_f64(s, g->size, at, stop);
            break;
        case SELDP_I64:
        case SELDP_U64:
            reduce_slice_u64(s, g->size, at, stop);
            break;
        default:
            break; /* rejected by seldp_comm_allreduce */
        }
        going = seldp__host_pace(&p, (stop - at) * esize * (size_t)g->size);
    }
    stream_fence(m.stream);
    return going;
}

seldp_status seldp__host_allreduce(seldp_comm *comm, const void *send, void *recv, size_t count,
                                   seldp_dtype dtype, seldp_device mem)
{
    size_t bytes = count * seldp_dtype_size(dtype);
    host_cell cell = {.call = {.op = OP_ALLREDUCE, .count = (int64_t)count, .dtype = dtype}};
    if (mem.kind == SELDP_DEVICE_HOST) {
        cell.send = send;
        cell.recv = recv;
    } else {
        /* One staging slice reduced in place. */
        host_stage_view v = {send, bytes, true, NULL};
        cell.call.staged = seldp__host_stage(comm, mem, &v, 1);
        cell.send = v.host;
        cell.recv = v.host;
    }
    seldp_status st = seldp__host_collective_run(comm, &cell, allreduce_execute, NULL);
    if (st == SELDP_OK && mem.kind != SELDP_DEVICE_HOST)
        st = seldp__device_copy(recv, mem, cell.recv, SELDP_HOST_DEVICE, bytes);
    return st;
}

/* ---- small collectives in one phase ---------------------------------------------------- */

/* Sum n elements of every rank's eager buffer in rank order into out. */
#define DEFINE_EAGER_SUM(name, type)                                                               \
    static void name(const seldp_comm *comm, void *out, size_t n)                                  \
    {                                                                                              \
        type *o = out;                                                                             \
        for (size_t i = 0; i < n; i++) {                                                           \
            type acc = ((const type *)eager_of(comm, 0))[i];                                       \
            for (int r = 1; r < comm->size; r++)                                                   \
                acc += ((const type *)eager_of(comm, r))[i];                                       \
            o[i] = acc;                                                                            \
        }                                                                                          \
    }

DEFINE_EAGER_SUM(eager_sum_f32, float)
DEFINE_EAGER_SUM(eager_sum_f64, double)
DEFINE_EAGER_SUM(eager_sum_u64, uint64_t)

/* A collective that eager_op accepts, from the eager buffers into this rank's own: the
 * same results as the two-phase path, bit for bit. */
void seldp__host_eager_execute(const seldp_comm *comm)
{
    const host_cell *s = cells_of(comm);
    const host_cell *mine = &s[comm->rank];
    size_t bytes = (size_t)mine->call.bytes, count = (size_t)mine->call.count;
    int root = (int)mine->call.root;
    switch (mine->call.op) {
    case OP_BROADCAST:
        if (comm->rank != root && bytes)
            memcpy(mine->recv, eager_of(comm, root), bytes);
        break;
    case OP_ALLGATHER:
        for (int r = 0; r < comm->size && bytes; r++) {
            char *dst = (char *)mine->recv + (size_t)r * bytes;
            /* a rank may gather in place, its send block already at its own offset */
            if (dst != (const char *)s[r].send || r != comm->rank)
                memcpy(dst, eager_of(comm, r), bytes);
        }
        break;
    case OP_ALLREDUCE:
        if (mine->call.dtype == SELDP_F32 && comm->size <= HOST_SUM_MAX_RANKS) {
            const void *in[HOST_SUM_MAX_RANKS];
            seldp_dtype in_dtype[HOST_SUM_MAX_RANKS];
            void *out[1] = {mine->recv};
            seldp__sum_mode m = {false, 1.0, false, impl_of(comm)->world->simd};
            for (int r = 0; r < comm->size; r++) {
                in[r] = eager_of(comm, r);
                in_dtype[r] = SELDP_F32;
            }
            seldp__host_sum(comm->size, in, in_dtype, 1, out, SELDP_F32, count, &m);
        } else if (mine->call.dtype == SELDP_F32) {
            eager_sum_f32(comm, mine->recv, count);
        } else if (mine->call.dtype == SELDP_F64) {
            eager_sum_f64(comm, mine->recv, count);
        } else {
            eager_sum_u64(comm, mine->recv, count);
        }
        break;
    default:
        break; /* init, barrier: the rendezvous is all */
    }
}

/* ---- fused reduction ------------------------------------------------------------------ */

/* The segment holding stream element `at` (< the stream's length): the last one that
 * starts at or before it, which skips empty segments. */
static size_t segment_at(const size_t *starts, size_t n_segs, size_t at)
{
    size_t lo = 0, hi = n_segs;
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if (starts[mid] <= at)
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

/* Each bucket of the stream is cut into slices as an allreduce would be; this rank owns
 * its slice of every bucket and reduces it segment by segment. */
static bool fused_execute(const seldp_comm *comm, void *arg)
{
    (void)arg;
    const host_group *g = impl_of(comm)->group;
    const host_cell *s = cells_of(comm);
    const host_cell *mine = &s[comm->rank];
    const seldp__reduce_fused_args *f = mine->fused;
    const size_t *starts = mine->seg_starts;
    size_t total = (size_t)mine->call.count;
    size_t bucket = f->bucket_elems ? f->bucket_elems : total;
    size_t out_bytes = 0;
    for (size_t j = 0; j < f->n_segs; j++)
        out_bytes += f->segs[j].count * seldp_dtype_size(f->segs[j].out_dtype);
    seldp__sum_mode m = {f->scale != 1.0, f->scale, out_bytes * (size_t)g->size >= STREAM_MIN_BYTES,
                         impl_of(comm)->world->simd};
    if (f->written)
        *f->written = true;
    size_t piece = seldp__host_pace_elems(sizeof(float), g->size);
    exec_pace p = {comm, 0};
    bool going = true;
    int workers = payload_workers(comm);
    if (comm->rank >= workers)
        going = idle_share(comm);

    for (size_t b0 = 0; b0 < total && going && comm->rank < workers; b0 += bucket) {
        size_t len = total - b0 < bucket ? total - b0 : bucket;
        size_t slice = slice_elems(len, workers, sizeof(float));
        size_t lo = slice * (size_t)comm->rank;
        if (lo >= len)
            continue;
        size_t end = b0 + (len - lo < slice ? len : lo + slice);
        size_t seg = segment_at(starts, f->n_segs, b0 + lo);
        for (size_t at = b0 + lo; at < end && going;) {
            if (starts[seg + 1] <= at) {
                seg++;
                continue;
            }
            size_t stop = starts[seg + 1] < end ? starts[seg + 1] : end;
            if (stop - at > piece)
                stop = at + piece;
            sum_range(s, g->size, seg, at - starts[seg], stop - starts[seg], &m);
            going = seldp__host_pace(&p, (stop - at) * sizeof(float) * (size_t)g->size);
            at = stop;
        }
    }
    stream_fence(m.stream);
    return going;
}

seldp_status seldp__host_reduce_fused(seldp_comm *comm, const seldp__reduce_fused_args *args)
{
    size_t *starts = malloc((args->n_segs + 1) * sizeof *starts);
    host_cell cell = {.call = {.op = OP_REDUCE_FUSED,
                               .n_segs = (int64_t)args->n_segs,
                               .bucket_elems = (int64_t)args->bucket_elems,
                               .scale = args->scale},
                      .fused = args,
                      .seg_starts = starts};
    if (starts) {
        starts[0] = 0;
        for (size_t j = 0; j < args->n_segs; j++)
            starts[j + 1] = starts[j] + args->segs[j].count;
        cell.call.count = (int64_t)starts[args->n_segs];
    } else {
        cell.call.staged =
            seldp__fail(SELDP_ERR_NOMEM, "rank %d: reduction: out of memory for %zu tensors",
                        comm->rank, args->n_segs);
    }
    seldp_status st = seldp__host_collective_run(comm, &cell, fused_execute, NULL);
    free(starts);
    return st;
}

/* ---- allgather, allgatherv ------------------------------------------------------------ */

/* Copy `bytes` from src to dst in paced pieces; false when the world was aborted. */
static bool copy_paced(exec_pace *p, void *dst, const void *src, size_t bytes, bool stream)
{
    for (size_t at = 0; at < bytes; at += EXEC_PACE_BYTES) {
        size_t n = bytes - at < EXEC_PACE_BYTES ? bytes - at : EXEC_PACE_BYTES;
        stream_copy(p->comm, (char *)dst + at, (const char *)src + at, n, stream);
        if (!seldp__host_pace(p, n))
            return false;
    }
    return true;
}

static bool allgather_execute(const seldp_comm *comm, void *arg)
{
    (void)arg;
    const host_group *g = impl_of(comm)->group;
    const host_cell *s = cells_of(comm);
    size_t bytes = (size_t)s[comm->rank].call.bytes;
    char *recv = s[comm->rank].recv;
    bool stream = bytes * (size_t)g->size * (size_t)g->size >= STREAM_MIN_BYTES, going = true;
    exec_pace p = {comm, 0};
    for (int r = 0; r < g->size && going; r++) {
        char *dst = recv + (size_t)r * bytes;
        /* A rank may gather in place, its send block already at its own offset. */
        if (bytes && dst != (const char *)s[r].send)
            going = copy_paced(&p, dst, s[r].send, bytes, stream);
    }
    stream_fence(stream);
    return going;
}

seldp_status seldp__host_allgather(seldp_comm *comm, const void *send, void *recv, size_t bytes,
                                   seldp_device mem)
{
    size_t total = bytes * (size_t)comm->size;
    host_stage_view v[2] = {{send, bytes, true, NULL}, {recv, total, false, NULL}};
    host_cell cell = {.call = {.op = OP_ALLGATHER, .bytes = (int64_t)bytes}};
    cell.call.staged = seldp__host_stage(comm, mem, v, 2);
    cell.send = v[0].host;
    cell.recv = v[1].host;
    seldp_status st = seldp__host_collective_run(comm, &cell, allgather_execute, NULL);
    if (st == SELDP_OK && mem.kind != SELDP_DEVICE_HOST)
        st = seldp__device_copy(recv, mem, v[1].host, SELDP_HOST_DEVICE, total);
    return st;
}

typedef struct allgatherv_result {
    void *blob;
    size_t *recv_bytes;
    seldp_status status;
} allgatherv_result;

static bool allgatherv_execute(const seldp_comm *comm, void *arg)
{
    allgatherv_result *res = arg;
    const host_group *g = impl_of(comm)->group;
    const host_cell *s = cells_of(comm);
    size_t total = 0;
    for (int r = 0; r < g->size; r++) {
        if ((size_t)s[r].call.bytes > SIZE_MAX - total) {
            res->status = seldp__fail(SELDP_ERR_INVALID_ARGUMENT,
                                      "rank %d: allgatherv: the blobs' total size overflows size_t",
                                      comm->rank);
            return true;
        }
        total += (size_t)s[r].call.bytes;
    }
    char *blob = malloc(total ? total : 1);
    if (!blob) {
        res->status = seldp__fail(
            SELDP_ERR_NOMEM, "rank %d: allgatherv: out of memory for %zu bytes", comm->rank, total);
        return true;
    }
    size_t at = 0;
    exec_pace p = {comm, 0};
    bool going = true;
    for (int r = 0; r < g->size && going; r++) {
        size_t bytes = (size_t)s[r].call.bytes;
        going = copy_paced(&p, blob + at, s[r].send, bytes, false);
        res->recv_bytes[r] = bytes;
        at += bytes;
    }
    res->blob = blob; /* freed by the caller on failure */
    return going;
}

seldp_status seldp__host_allgatherv(seldp_comm *comm, const void *send, size_t send_bytes,
                                    void **recv, size_t *recv_bytes)
{
    host_cell cell = {.call = {.op = OP_ALLGATHERV, .bytes = (int64_t)send_bytes}, .send = send};
    allgatherv_result res = {NULL, recv_bytes, SELDP_OK};
    seldp_status st = seldp__host_collective_run(comm, &cell, allgatherv_execute, &res);
    if (st == SELDP_OK)
        st = res.status;
    if (st != SELDP_OK) {
        free(res.blob);
        return st;
    }
    *recv = res.blob;
    return SELDP_OK;
}

/* ---- alltoallv ------------------------------------------------------------------------ */

static bool alltoallv_execute(const seldp_comm *comm, void *arg)
{
    (void)arg;
    const host_group *g = impl_of(comm)->group;
    const host_cell *s = cells_of(comm);
    const host_cell *mine = &s[comm->rank];
    int me = comm->rank;
    exec_pace pc = {comm, 0};
    bool going = true;
    for (int p = 0; p < g->size && going; p++) {
        size_t n = mine->recv_bytes[p];
        going = copy_paced(&pc, (char *)mine->recv + mine->recv_displs[p],
                           (const char *)s[p].send + s[p].send_displs[me], n, false);
    }
    return going;
}

seldp_status seldp__host_alltoallv(seldp_comm *comm, const void *send, const size_t *send_bytes,
                                   const size_t *send_displs, void *recv, const size_t *recv_bytes,
                                   const size_t *recv_displs, seldp_device mem, size_t send_extent,
                                   size_t recv_extent)
{
    host_stage_view v[2] = {{send, send_extent, true, NULL}, {recv, recv_extent, false, NULL}};
    host_cell cell = {.call = {.op = OP_ALLTOALLV},
                      .send_bytes = send_bytes,
                      .send_displs = send_displs,
                      .recv_bytes = recv_bytes,
                      .recv_displs = recv_displs};
    cell.call.staged = seldp__host_stage(comm, mem, v, 2);
    cell.send = v[0].host;
    cell.recv = v[1].host;
    seldp_status st = seldp__host_collective_run(comm, &cell, alltoallv_execute, NULL);
    /* Copy back only the pieces received, leaving the rest of recv as it was. */
    for (int p = 0; st == SELDP_OK && mem.kind != SELDP_DEVICE_HOST && p < comm->size; p++)
        if (recv_bytes[p])
            st = seldp__device_copy((char *)recv + recv_displs[p], mem,
                                    (char *)v[1].host + recv_displs[p], SELDP_HOST_DEVICE,
                                    recv_bytes[p]);
    return st;
}
