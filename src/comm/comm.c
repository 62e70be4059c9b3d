/* The public communicator calls: argument checks, stats, and dispatch to the
 * transport's table of function pointers (src/comm/comm_impl.h).
 *
 * Checks here are local: they catch a caller's mistake before the transport sees
 * it. Transports may assume valid pointers, counts that fit in size_t and roots
 * inside the group. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm_impl.h"
#include "env.h"
#include "internal.h"

/* SELDP_DEBUG_COLLECTIVES set to anything but "" or "0". */
static bool debug_collectives(void)
{
    return seldp__env_flag(SELDP__ENV_DEBUG_COLLECTIVES);
}

seldp_comm *seldp__comm_new(const seldp_comm_ops *ops, int rank, int size, int world_rank,
                            seldp_device device, void *impl)
{
    seldp_comm *comm = calloc(1, sizeof *comm);
    if (!comm)
        return NULL;
    comm->ops = ops;
    comm->rank = rank;
    comm->size = size;
    comm->world_rank = world_rank;
    comm->device = device;
    comm->impl = impl;
    comm->debug = debug_collectives();
    return comm;
}

void seldp__comm_free(seldp_comm *comm)
{
    free(comm);
}

int seldp_comm_rank(const seldp_comm *comm)
{
    return comm ? comm->rank : -1;
}

int seldp_comm_size(const seldp_comm *comm)
{
    return comm ? comm->size : 0;
}

int seldp_comm_world_rank(const seldp_comm *comm)
{
    return comm ? comm->world_rank : -1;
}

seldp_device seldp_comm_device(const seldp_comm *comm)
{
    return comm ? comm->device : SELDP_HOST_DEVICE;
}

const char *seldp_comm_transport(const seldp_comm *comm)
{
    return comm && comm->ops ? comm->ops->name : "none";
}

bool seldp__comm_fused_memory(const seldp_comm *comm, seldp_device mem, char *needs, size_t size)
{
    const seldp_comm_ops *ops = comm ? comm->ops : NULL;
    if (!ops || !ops->reduce_fused) {
        if (needs && size)
            snprintf(needs, size, "no fused reduction");
        return false;
    }
    if (ops->fused_memory)
        return ops->fused_memory(comm, mem, needs, size);
    if (needs && size)
        snprintf(needs, size, "host memory");
    return mem.kind == SELDP_DEVICE_HOST;
}

seldp_comm_stats seldp_comm_get_stats(const seldp_comm *comm)
{
    seldp_comm_stats none = {0};
    return comm ? comm->stats : none;
}

/* ---- the debug mode (comm_impl.h) ----------------------------------------------------- */

/* One rank's fingerprint of one call; int64 fields, so that it is the same bytes on every
 * rank and transport. */
typedef struct call_print {
    int64_t op, count, dtype, root;
    uint64_t seq; /* the call's number on this communicator, from 1 */
} call_print;

/* "call #3 allreduce(count 64, f32)" */
static void call_describe(const call_print *p, char *buf, size_t size)
{
    int n = snprintf(buf, size, "call #%llu %s(", (unsigned long long)p->seq,
                     seldp__comm_op_name((int)p->op));
    const char *sep = "";
    if (n > 0 && (size_t)n < size && p->count >= 0) {
        const char *unit = p->op == OP_ALLGATHER ? "bytes" : "count";
        n += snprintf(buf + n, size - (size_t)n, "%s %lld", unit, (long long)p->count);
        sep = ", ";
    }
    if (n > 0 && (size_t)n < size && p->dtype >= 0) {
        n += snprintf(buf + n, size - (size_t)n, "%s%s", sep,
                      seldp_dtype_name((seldp_dtype)p->dtype));
        sep = ", ";
    }
    if (n > 0 && (size_t)n < size && p->root >= 0)
        n += snprintf(buf + n, size - (size_t)n, "%sroot %lld", sep, (long long)p->root);
    if (n > 0 && (size_t)n < size)
        snprintf(buf + n, size - (size_t)n, ")");
}

seldp_status seldp__comm_debug_agree(seldp_comm *comm, seldp__comm_op op, int64_t count, int dtype,
                                     int root)
{
    if (!comm->debug)
        return SELDP_OK;
    call_print mine = {op, count, dtype, root, ++comm->debug_calls};
    call_print *all = calloc((size_t)comm->size, sizeof *all);
    if (!all)
        return seldp__fail(SELDP_ERR_NOMEM, "rank %d: %s: out of memory for the debug fingerprints",
                           comm->rank, seldp__comm_op_name(op));
    seldp_status st = comm->ops->allgather(comm, &mine, all, sizeof mine, SELDP_HOST_DEVICE);
    if (st != SELDP_OK) {
        free(all);
        return st;
    }
    /* every rank holds the same fingerprints: the first that differs from rank 0's is named
     * alike everywhere */
    for (int r = 1; r < comm->size; r++) {
        if (memcmp(&all[r], &all[0], sizeof mine) != 0) {
            char first[160], other[160];
            call_describe(&all[0], first, sizeof first);
            call_describe(&all[r], other, sizeof other);
            st = seldp__fail(SELDP_ERR_DISAGREE,
                             "rank %d: %s: collective mismatch (SELDP_DEBUG_COLLECTIVES): rank 0 "
                             "made %s but rank %d made %s",
                             comm->rank, seldp__comm_op_name(op), first, r, other);
            break;
        }
    }
    free(all);
    return st;
}

/* The communicator itself is usable; names the call when it is not. */
static seldp_status check_comm(const seldp_comm *comm, const char *call)
{
    if (!comm || !comm->ops)
        return seldp__fail(SELDP_ERR_INVALID_ARGUMENT, "%s: communicator is NULL", call);
    return SELDP_OK;
}

static seldp_status check_mem(const seldp_comm *comm, const char *call, seldp_device mem)
{
    if (mem.kind == SELDP_DEVICE_HOST)
        return SELDP_OK;
    if (mem.kind == SELDP_DEVICE_CUDA && mem.ordinal >= 0)
        return SELDP_OK;
    return seldp__fail(
        SELDP_ERR_INVALID_ARGUMENT,
        "rank %d: %s: invalid buffer device (kind %d, ordinal %d), expected the host "
        "or a CUDA device",
        comm->rank, call, (int)mem.kind, mem.ordinal);
}

/* count * size of dtype into *bytes, failing on an invalid dtype or a size_t overflow. */
static seldp_status count_bytes(const seldp_comm *comm, const char *call, size_t count,
                                seldp_dtype dtype, size_t *bytes)
{
    size_t esize = seldp_dtype_size(dtype);
    if (esize == 0)
        return seldp__fail(SELDP_ERR_DTYPE, "rank %d: %s: invalid dtype %d", comm->rank, call,
                           (int)dtype);
    if (count > SIZE_MAX / esize)
        return seldp__fail(SELDP_ERR_INVALID_ARGUMENT,
                           "rank %d: %s: %zu elements of %s overflow size_t", comm->rank, call,
                           count, seldp_dtype_name(dtype));
    *bytes = count * esize;
    return SELDP_OK;
}

seldp_status seldp_comm_barrier(seldp_comm *comm)
{
    seldp_status st = check_comm(comm, "barrier");
    if (st != SELDP_OK)
        return st;
    if ((st = seldp__comm_debug_agree(comm, OP_BARRIER, -1, -1, -1)) != SELDP_OK)
        return st;
    comm->stats.barriers++;
    return comm->ops->barrier(comm);
}

seldp_status seldp_comm_broadcast(seldp_comm *comm, void *buf, size_t count, seldp_dtype dtype,
                                  int root, seldp_device mem)
{
    size_t bytes = 0;
    seldp_status st = check_comm(comm, "broadcast");
    if (st != SELDP_OK)
        return st;
    if ((st = count_bytes(comm, "broadcast", count, dtype, &bytes)) != SELDP_OK ||
        (st = check_mem(comm, "broadcast", mem)) != SELDP_OK)
        return st;
    if (root < 0 || root >= comm->size)
        return seldp__fail(SELDP_ERR_INVALID_ARGUMENT,
                           "rank %d: broadcast root %d is outside the group of %d ranks",
                           comm->rank, root, comm->size);
    if (bytes && !buf)
        return seldp__fail(SELDP_ERR_INVALID_ARGUMENT,
                           "rank %d: broadcast buffer is NULL for %zu bytes", comm->rank, bytes);
    if ((st = seldp__comm_debug_agree(comm, OP_BROADCAST, (int64_t)count, (int)dtype, root)) !=
        SELDP_OK)
        return st;
    comm->stats.broadcasts++;
    comm->stats.bytes += bytes;
    return comm->ops->broadcast(comm, buf, bytes, root, mem);
}

seldp_status seldp_comm_allreduce(seldp_comm *comm, const void *send, void *recv, size_t count,
                                  seldp_dtype dtype, seldp_device mem)
{
    size_t bytes = 0;
    seldp_status st = check_comm(comm, "allreduce");
    if (st != SELDP_OK)
        return st;
    if ((st = count_bytes(comm, "allreduce", count, dtype, &bytes)) != SELDP_OK ||
        (st = check_mem(comm, "allreduce", mem)) != SELDP_OK)
        return st;
    if (dtype != SELDP_F32 && dtype != SELDP_F64 && dtype != SELDP_I64 && dtype != SELDP_U64)
        return seldp__fail(SELDP_ERR_DTYPE,
                           "rank %d: allreduce of %s is not supported, expected f32, f64, i64 or "
                           "u64",
                           comm->rank, seldp_dtype_name(dtype));
    if (bytes && (!send || !recv))
        return seldp__fail(SELDP_ERR_INVALID_ARGUMENT,
                           "rank %d: allreduce %s buffer is NULL for %zu bytes", comm->rank,
                           send ? "receive" : "send", bytes);
    if ((st = seldp__comm_debug_agree(comm, OP_ALLREDUCE, (int64_t)count, (int)dtype, -1)) !=
        SELDP_OK)
        return st;
    comm->stats.allreduces++;
    comm->stats.bytes += bytes;
    return comm->ops->allreduce(comm, send, recv, count, dtype, mem);
}

seldp_status seldp_comm_allgather(seldp_comm *comm, const void *send, void *recv, size_t bytes,
                                  seldp_device mem)
{
    seldp_status st = check_comm(comm, "allgather");
    if (st != SELDP_OK)
        return st;
    if ((st = check_mem(comm, "allgather", mem)) != SELDP_OK)
        return st;
    if (bytes > SIZE_MAX / (size_t)comm->size)
        return seldp__fail(SELDP_ERR_INVALID_ARGUMENT,
                           "rank %d: allgather of %zu bytes from %d ranks overflows size_t",
                           comm->rank, bytes, comm->size);
    if (bytes && (!send || !recv))
        return seldp__fail(SELDP_ERR_INVALID_ARGUMENT,
                           "rank %d: allgather %s buffer is NULL for %zu bytes per rank",
                           comm->rank, send ? "receive" : "send", bytes);
    if ((st = seldp__comm_debug_agree(comm, OP_ALLGATHER, (int64_t)bytes, -1, -1)) != SELDP_OK)
        return st;
    comm->stats.allgathers++;
    comm->stats.bytes += bytes;
    return comm->ops->allgather(comm, send, recv, bytes, mem);
}

seldp_status seldp_comm_allgatherv(seldp_comm *comm, const void *send, size_t send_bytes,
                                   void **recv, size_t *recv_bytes)
{
    seldp_status st = check_comm(comm, "allgatherv");
    if (st != SELDP_OK)
        return st;
    if (!recv || !recv_bytes)
        return seldp__fail(SELDP_ERR_INVALID_ARGUMENT,
                           "rank %d: allgatherv: recv and recv_bytes must not be NULL", comm->rank);
    if (send_bytes && !send)
        return seldp__fail(SELDP_ERR_INVALID_ARGUMENT,
                           "rank %d: allgatherv send blob is NULL for %zu bytes", comm->rank,
                           send_bytes);
    *recv = NULL;
    if ((st = seldp__comm_debug_agree(comm, OP_ALLGATHERV, -1, -1, -1)) != SELDP_OK)
        return st;
    comm->stats.allgathers++;
    comm->stats.bytes += send_bytes;
    return comm->ops->allgatherv(comm, send, send_bytes, recv, recv_bytes);
}

/* The sum of the group's per-rank counts, checked: non-NULL, no overflow of size_t in
 * elements or in bytes of `esize`. */
static seldp_status total_count(const seldp_comm *comm, const char *call, const size_t *counts,
                                size_t esize, size_t *total)
{
    size_t sum = 0;
    if (!counts)
        return seldp__fail(SELDP_ERR_INVALID_ARGUMENT, "rank %d: %s: counts must not be NULL",
                           comm->rank, call);
    for (int r = 0; r < comm->size; r++) {
        if (counts[r] > SIZE_MAX - sum || sum + counts[r] > SIZE_MAX / esize)
            return seldp__fail(SELDP_ERR_INVALID_ARGUMENT,
                               "rank %d: %s: the counts of ranks 0..%d overflow size_t", comm->rank,
                               call, r);
        sum += counts[r];
    }
    *total = sum;
    return SELDP_OK;
}

seldp_status seldp_comm_reduce_scatter(seldp_comm *comm, const void *send, void *recv,
                                       const size_t *recv_counts, seldp_dtype dtype,
                                       seldp_device mem)
{
    size_t total = 0;
    seldp_status st = check_comm(comm, "reduce_scatter");
    if (st != SELDP_OK)
        return st;
    if ((st = check_mem(comm, "reduce_scatter", mem)) != SELDP_OK)
        return st;
    if (dtype != SELDP_F32)
        return seldp__fail(SELDP_ERR_DTYPE,
                           "rank %d: reduce_scatter of %s is not supported, expected f32",
                           comm->rank, seldp_dtype_name(dtype));
    if ((st = total_count(comm, "reduce_scatter", recv_counts, sizeof(float), &total)) != SELDP_OK)
        return st;
    if ((total && !send) || (recv_counts[comm->rank] && !recv))
        return seldp__fail(SELDP_ERR_INVALID_ARGUMENT,
                           "rank %d: reduce_scatter %s buffer is NULL for %zu elements", comm->rank,
                           send || !total ? "receive" : "send",
                           send || !total ? recv_counts[comm->rank] : total);
    if ((st = seldp__comm_debug_agree(comm, OP_REDUCE_SCATTER, (int64_t)total, (int)dtype, -1)) !=
        SELDP_OK)
        return st;
    if (!comm->ops->reduce_scatter)
        return seldp__fail(SELDP_ERR_UNSUPPORTED, "rank %d: the %s transport has no reduce_scatter",
                           comm->rank, comm->ops->name);
    comm->stats.reduce_scatters++;
    comm->stats.bytes += total * sizeof(float);
    return comm->ops->reduce_scatter(comm, send, recv, recv_counts, dtype, mem);
}

seldp_status seldp_comm_allgather_counts(seldp_comm *comm, const void *send, void *recv,
                                         const size_t *counts, seldp_dtype dtype, seldp_device mem)
{
    size_t total = 0;
    seldp_status st = check_comm(comm, "allgather_counts");
    if (st != SELDP_OK)
        return st;
    if ((st = check_mem(comm, "allgather_counts", mem)) != SELDP_OK)
        return st;
    size_t esize = seldp_dtype_size(dtype);
    if (esize == 0)
        return seldp__fail(SELDP_ERR_DTYPE, "rank %d: allgather_counts: invalid dtype %d",
                           comm->rank, (int)dtype);
    if ((st = total_count(comm, "allgather_counts", counts, esize, &total)) != SELDP_OK)
        return st;
    if ((counts[comm->rank] && !send) || (total && !recv))
        return seldp__fail(SELDP_ERR_INVALID_ARGUMENT,
                           "rank %d: allgather_counts %s buffer is NULL for %zu elements",
                           comm->rank, recv || !total ? "send" : "receive",
                           recv || !total ? counts[comm->rank] : total);
    if ((st = seldp__comm_debug_agree(comm, OP_ALLGATHER_COUNTS, (int64_t)total, (int)dtype, -1)) !=
        SELDP_OK)
        return st;
    if (!comm->ops->allgather_counts)
        return seldp__fail(SELDP_ERR_UNSUPPORTED,
                           "rank %d: the %s transport has no allgather_counts", comm->rank,
                           comm->ops->name);
    comm->stats.allgathers++;
    comm->stats.bytes += counts[comm->rank] * esize;
    return comm->ops->allgather_counts(comm, send, recv, counts, dtype, mem);
}

bool seldp__comm_shard_fused(const seldp_comm *comm, seldp_device mem)
{
    return comm && comm->ops && comm->ops->scatter_fused && comm->ops->gather_fused &&
           seldp__comm_fused_memory(comm, mem, NULL, 0);
}

seldp_status seldp__comm_scatter_fused(seldp_comm *comm, const seldp__scatter_fused_args *args)
{
    size_t elems = 0;
    for (size_t i = 0; i < args->n_segs; i++)
        elems += args->segs[i].count;
    seldp_status st =
        seldp__comm_debug_agree(comm, OP_SCATTER_FUSED, (int64_t)elems, SELDP_F32, -1);
    if (st != SELDP_OK)
        return st;
    for (size_t i = 0; i < args->n_segs; i++)
        if (args->segs[i].in)
            comm->stats.bytes += args->segs[i].count * seldp_dtype_size(args->segs[i].in_dtype);
    comm->stats.reductions++;
    return comm->ops->scatter_fused(comm, args);
}

seldp_status seldp__comm_gather_fused(seldp_comm *comm, const seldp__gather_fused_args *args)
{
    size_t elems = 0;
    for (size_t i = 0; i < args->n_segs; i++)
        elems += args->segs[i].count;
    seldp_status st =
        seldp__comm_debug_agree(comm, OP_GATHER_FUSED, (int64_t)elems, (int)args->in_dtype, -1);
    if (st != SELDP_OK)
        return st;
    comm->stats.bytes += (args->end - args->begin) * seldp_dtype_size(args->in_dtype);
    comm->stats.reductions++;
    return comm->ops->gather_fused(comm, args);
}

/* Convert per-rank element counts or displacements to bytes; `what` names the array. */
static seldp_status to_bytes(const seldp_comm *comm, const char *what, const size_t *elems,
                             size_t esize, size_t *bytes)
{
    for (int p = 0; p < comm->size; p++) {
        if (elems[p] > SIZE_MAX / esize)
            return seldp__fail(SELDP_ERR_INVALID_ARGUMENT,
                               "rank %d: alltoallv %s[%d] = %zu elements overflows size_t",
                               comm->rank, what, p, elems[p]);
        bytes[p] = elems[p] * esize;
    }
    return SELDP_OK;
}

/* Largest end (displacement + count) of the per-rank pieces, with overflow checks. */
static seldp_status extent_bytes(const seldp_comm *comm, const char *what, const size_t *counts,
                                 const size_t *displs, size_t *extent)
{
    size_t end = 0;
    for (int p = 0; p < comm->size; p++) {
        if (counts[p] == 0)
            continue;
        if (displs[p] > SIZE_MAX - counts[p])
            return seldp__fail(SELDP_ERR_INVALID_ARGUMENT,
                               "rank %d: alltoallv %s piece for rank %d overflows size_t",
                               comm->rank, what, p);
        if (displs[p] + counts[p] > end)
            end = displs[p] + counts[p];
    }
    *extent = end;
    return SELDP_OK;
}

seldp_status seldp_comm_alltoallv(seldp_comm *comm, const void *send, const size_t *send_counts,
                                  const size_t *send_displs, void *recv, const size_t *recv_counts,
                                  const size_t *recv_displs, seldp_dtype dtype, seldp_device mem)
{
    seldp_status st = check_comm(comm, "alltoallv");
    size_t *arrays = NULL;
    if (st != SELDP_OK)
        return st;
    size_t esize = seldp_dtype_size(dtype);
    if (esize == 0)
        SELDP_FAIL(SELDP_ERR_DTYPE, "rank %d: alltoallv: invalid dtype %d", comm->rank, (int)dtype);
    SELDP_CHECK(check_mem(comm, "alltoallv", mem));
    if (!send_counts || !send_displs || !recv_counts || !recv_displs)
        SELDP_FAIL(SELDP_ERR_INVALID_ARGUMENT,
                   "rank %d: alltoallv: counts and displacements must not be NULL", comm->rank);

    size_t n = (size_t)comm->size;
    arrays = malloc(4 * n * sizeof *arrays);
    if (!arrays)
        SELDP_FAIL(SELDP_ERR_NOMEM, "rank %d: alltoallv: out of memory", comm->rank);
    size_t *sb = arrays, *sd = arrays + n, *rb = arrays + 2 * n, *rd = arrays + 3 * n;
    SELDP_CHECK(to_bytes(comm, "send_counts", send_counts, esize, sb));
    SELDP_CHECK(to_bytes(comm, "send_displs", send_displs, esize, sd));
    SELDP_CHECK(to_bytes(comm, "recv_counts", recv_counts, esize, rb));
    SELDP_CHECK(to_bytes(comm, "recv_displs", recv_displs, esize, rd));
    size_t send_extent = 0, recv_extent = 0;
    SELDP_CHECK(extent_bytes(comm, "send", sb, sd, &send_extent));
    SELDP_CHECK(extent_bytes(comm, "receive", rb, rd, &recv_extent));
    if (send_extent && !send)
        SELDP_FAIL(SELDP_ERR_INVALID_ARGUMENT,
                   "rank %d: alltoallv send buffer is NULL for %zu bytes", comm->rank, send_extent);
    if (recv_extent && !recv)
        SELDP_FAIL(SELDP_ERR_INVALID_ARGUMENT,
                   "rank %d: alltoallv receive buffer is NULL for %zu bytes", comm->rank,
                   recv_extent);

    SELDP_CHECK(seldp__comm_debug_agree(comm, OP_ALLTOALLV, -1, (int)dtype, -1));
    comm->stats.alltoallvs++;
    for (size_t p = 0; p < n; p++)
        comm->stats.bytes += sb[p];
    st = comm->ops->alltoallv(comm, send, sb, sd, recv, rb, rd, mem, send_extent, recv_extent);
fail:
    free(arrays);
    return st;
}

seldp_status seldp_comm_split(seldp_comm *comm, int color, int key, seldp_comm **out)
{
    seldp_status st = check_comm(comm, "split");
    if (st != SELDP_OK)
        return st;
    if (!out)
        return seldp__fail(SELDP_ERR_INVALID_ARGUMENT, "rank %d: split: out is NULL", comm->rank);
    *out = NULL;
    if (color < SELDP_COMM_NO_GROUP)
        return seldp__fail(SELDP_ERR_INVALID_ARGUMENT,
                           "rank %d: split color %d, expected >= 0 or SELDP_COMM_NO_GROUP (-1)",
                           comm->rank, color);
    if ((st = seldp__comm_debug_agree(comm, OP_SPLIT, -1, -1, -1)) != SELDP_OK)
        return st;
    comm->stats.splits++;
    return comm->ops->split(comm, color, key, out);
}

void seldp_comm_abort(seldp_comm *comm)
{
    if (comm && comm->ops)
        comm->ops->abort(comm);
}

void seldp_comm_destroy(seldp_comm *comm)
{
    if (comm && comm->ops)
        comm->ops->destroy(comm);
}

const char *seldp__comm_op_name(int op)
{
    static const char *const names[] = {
        [OP_INIT] = "init",
        [OP_BARRIER] = "barrier",
        [OP_BROADCAST] = "broadcast",
        [OP_ALLREDUCE] = "allreduce",
        [OP_ALLGATHER] = "allgather",
        [OP_ALLGATHERV] = "allgatherv",
        [OP_ALLTOALLV] = "alltoallv",
        [OP_SPLIT] = "split",
        [OP_REDUCE_FUSED] = "reduction",
        [OP_REDUCE_SCATTER] = "reduce_scatter",
        [OP_ALLGATHER_COUNTS] = "allgather_counts",
        [OP_SCATTER_FUSED] = "sharded reduction",
        [OP_GATHER_FUSED] = "sharded gather",
    };
    return op >= 0 && op < OP_COUNT ? names[op] : "?";
}
