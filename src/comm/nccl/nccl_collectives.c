/* The NCCL transport's collectives: barrier, broadcast, allreduce, allgather(v) and
 * alltoallv on a non-blocking NCCL communicator, each waited for by seldp__nccl_wait_done.
 * Buffers on the host go through the rank's device staging buffer. See nccl_impl.h. */
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

/* ---- collectives --------------------------------------------------------------------- */

seldp_status seldp__nccl_barrier(seldp_comm *comm)
{
    nccl_comm *c = comm->impl;
    seldp_status st = SELDP_OK;
    SELDP_CHECK(seldp__nccl_enter(c, "barrier"));
    SELDP_CHECK(seldp__nccl_ensure_staging(c, sizeof(int32_t)));
    ncclResult_t r =
        ncclAllReduce(c->staging, c->staging, 1, ncclInt32, ncclSum, c->nccl, c->stream);
    if (!nccl_started(r))
        return seldp__nccl_fail_nccl(c, "ncclAllReduce (barrier)", r);
    return seldp__nccl_wait_done(c, "barrier", true);
fail:
    return st;
}

seldp_status seldp__nccl_broadcast(seldp_comm *comm, void *buf, size_t bytes, int root,
                                   seldp_device mem)
{
    nccl_comm *c = comm->impl;
    seldp_status st = SELDP_OK;
    SELDP_CHECK(seldp__nccl_enter(c, "broadcast"));
    SELDP_CHECK(seldp__nccl_check_device_mem(c, "broadcast", mem));
    if (bytes == 0)
        return SELDP_OK;
    bool host = mem.kind == SELDP_DEVICE_HOST;
    void *dbuf = buf;
    if (host) {
        SELDP_CHECK(seldp__nccl_ensure_staging(c, bytes));
        dbuf = c->staging;
        if (c->rank == root)
            SELDP_CHECK(seldp__nccl_copy_sync(c, dbuf, buf, bytes, cudaMemcpyHostToDevice));
    }
    ncclResult_t r = ncclBroadcast(dbuf, dbuf, bytes, ncclUint8, root, c->nccl, c->stream);
    if (!nccl_started(r))
        return seldp__nccl_fail_nccl(c, "ncclBroadcast", r);
    SELDP_CHECK(seldp__nccl_wait_done(c, "broadcast", true));
    if (host && c->rank != root)
        SELDP_CHECK(seldp__nccl_copy_sync(c, buf, dbuf, bytes, cudaMemcpyDeviceToHost));
    return SELDP_OK;
fail:
    return st;
}

seldp_status seldp__nccl_allreduce(seldp_comm *comm, const void *send, void *recv, size_t count,
                                   seldp_dtype dtype, seldp_device mem)
{
    nccl_comm *c = comm->impl;
    seldp_status st = SELDP_OK;
    ncclDataType_t type;
    SELDP_CHECK(seldp__nccl_enter(c, "allreduce"));
    SELDP_CHECK(seldp__nccl_check_device_mem(c, "allreduce", mem));
    if (!seldp__nccl_type(dtype, &type))
        return seldp__nccl_fail_abort(c, SELDP_ERR_DTYPE,
                                      "nccl rank %d/%d: allreduce of %s is not supported", c->rank,
                                      c->size, seldp_dtype_name(dtype));
    if (count == 0)
        return SELDP_OK;
    size_t bytes = count * seldp_dtype_size(dtype);
    bool host = mem.kind == SELDP_DEVICE_HOST;
    const void *dsend = send;
    void *drecv = recv;
    if (host) {
        SELDP_CHECK(seldp__nccl_ensure_staging(c, bytes));
        SELDP_CHECK(seldp__nccl_copy_sync(c, c->staging, send, bytes, cudaMemcpyHostToDevice));
        dsend = drecv = c->staging;
    }
    ncclResult_t r = ncclAllReduce(dsend, drecv, count, type, ncclSum, c->nccl, c->stream);
    if (!nccl_started(r))
        return seldp__nccl_fail_nccl(c, "ncclAllReduce", r);
    SELDP_CHECK(seldp__nccl_wait_done(c, "allreduce", true));
    if (host)
        SELDP_CHECK(seldp__nccl_copy_sync(c, recv, drecv, bytes, cudaMemcpyDeviceToHost));
    return SELDP_OK;
fail:
    return st;
}

seldp_status seldp__nccl_allgather(seldp_comm *comm, const void *send, void *recv, size_t bytes,
                                   seldp_device mem)
{
    nccl_comm *c = comm->impl;
    seldp_status st = SELDP_OK;
    SELDP_CHECK(seldp__nccl_enter(c, "allgather"));
    SELDP_CHECK(seldp__nccl_check_device_mem(c, "allgather", mem));
    if (bytes == 0)
        return SELDP_OK;
    size_t total = bytes * (size_t)c->size;
    bool host = mem.kind == SELDP_DEVICE_HOST;
    const void *dsend = send;
    void *drecv = recv;
    if (host) {
        /* In place in the staging buffer: our piece at its offset, as NCCL allows. */
        SELDP_CHECK(seldp__nccl_ensure_staging(c, total));
        drecv = c->staging;
        dsend = (char *)c->staging + (size_t)c->rank * bytes;
        SELDP_CHECK(seldp__nccl_copy_sync(c, (void *)dsend, send, bytes, cudaMemcpyHostToDevice));
    }
    ncclResult_t r = ncclAllGather(dsend, drecv, bytes, ncclUint8, c->nccl, c->stream);
    if (!nccl_started(r))
        return seldp__nccl_fail_nccl(c, "ncclAllGather", r);
    SELDP_CHECK(seldp__nccl_wait_done(c, "allgather", true));
    if (host)
        SELDP_CHECK(seldp__nccl_copy_sync(c, recv, drecv, total, cudaMemcpyDeviceToHost));
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
    SELDP_CHECK(seldp__nccl_ensure_staging(c, total));
    char *mine = (char *)c->staging + (size_t)c->rank * bytes;
    SELDP_CHECK(seldp__nccl_copy_sync(c, mine, send, bytes, cudaMemcpyHostToDevice));
    ncclResult_t r = ncclAllGather(mine, c->staging, bytes, ncclUint8, c->nccl, c->stream);
    if (!nccl_started(r))
        return seldp__nccl_fail_nccl(c, what, r);
    SELDP_CHECK(seldp__nccl_wait_done(c, what, true));
    SELDP_CHECK(seldp__nccl_copy_sync(c, out, c->staging, total, cudaMemcpyDeviceToHost));
    return SELDP_OK;
fail:
    return st;
}

/* Variable-length host blobs: an allgather of the lengths, then one of the blobs padded to
 * the longest, compacted into one block in rank order. */
seldp_status seldp__nccl_allgatherv(seldp_comm *comm, const void *send, size_t send_bytes,
                                    void **recv, size_t *recv_bytes)
{
    nccl_comm *c = comm->impl;
    seldp_status st = SELDP_OK;
    size_t n = (size_t)c->size;
    uint64_t *lengths = NULL;
    char *padded_send = NULL, *padded = NULL, *result = NULL;
    SELDP_CHECK(seldp__nccl_enter(c, "allgatherv"));

    lengths = malloc(n * sizeof *lengths);
    if (!lengths)
        NCCL_FAIL_ABORT(SELDP_ERR_NOMEM, "nccl rank %d/%d: allgatherv: out of memory", c->rank,
                        c->size);
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
        NCCL_FAIL_ABORT(SELDP_ERR_NOMEM, "nccl rank %d/%d: allgatherv: out of memory for %zu bytes",
                        c->rank, c->size, total);
    if (longest > 0) {
        padded_send = calloc(1, longest);
        padded = malloc(longest * n);
        if (!padded_send || !padded)
            NCCL_FAIL_ABORT(SELDP_ERR_NOMEM,
                            "nccl rank %d/%d: allgatherv: out of memory for %zu bytes", c->rank,
                            c->size, longest * n);
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
seldp_status seldp__nccl_alltoallv(seldp_comm *comm, const void *send, const size_t *send_bytes,
                                   const size_t *send_displs, void *recv, const size_t *recv_bytes,
                                   const size_t *recv_displs, seldp_device mem, size_t send_extent,
                                   size_t recv_extent)
{
    nccl_comm *c = comm->impl;
    seldp_status st = SELDP_OK;
    SELDP_CHECK(seldp__nccl_enter(c, "alltoallv"));
    SELDP_CHECK(seldp__nccl_check_device_mem(c, "alltoallv", mem));
    int n = c->size, me = c->rank;
    if (send_bytes[me] != recv_bytes[me])
        return seldp__nccl_fail_abort(
            c, SELDP_ERR_INVALID_ARGUMENT,
            "nccl rank %d/%d: alltoallv sends itself %zu bytes but expects %zu", me, n,
            send_bytes[me], recv_bytes[me]);
    bool host = mem.kind == SELDP_DEVICE_HOST;
    const char *dsend = send;
    char *drecv = recv;
    if (host) {
        /* Receive area first, send area after it, 256-byte aligned. */
        size_t recv_area = (recv_extent + 255) & ~(size_t)255;
        SELDP_CHECK(seldp__nccl_ensure_staging(c, recv_area + send_extent));
        drecv = c->staging;
        dsend = (char *)c->staging + recv_area;
        SELDP_CHECK(
            seldp__nccl_copy_sync(c, (void *)dsend, send, send_extent, cudaMemcpyHostToDevice));
    }
    if (send_bytes[me]) {
        cudaError_t err = cudaMemcpyAsync(drecv + recv_displs[me], dsend + send_displs[me],
                                          send_bytes[me], cudaMemcpyDeviceToDevice, c->stream);
        if (err != cudaSuccess)
            return seldp__nccl_fail_cuda(c, "alltoallv (own piece)", err);
    }
    ncclResult_t first = ncclSuccess;
    ncclResult_t r = ncclGroupStart();
    if (r != ncclSuccess)
        return seldp__nccl_fail_nccl(c, "ncclGroupStart", r);
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
        return seldp__nccl_fail_nccl(c, "ncclSend/ncclRecv", first);
    if (!nccl_started(r))
        return seldp__nccl_fail_nccl(c, "ncclGroupEnd (alltoallv)", r);
    SELDP_CHECK(seldp__nccl_wait_done(c, "alltoallv", true));
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
            return seldp__nccl_fail_cuda(c, "alltoallv (staging copy)", err);
    }
    return SELDP_OK;
fail:
    return st;
}

/* ---- the sharded collectives --------------------------------------------------------- */

/* Whether every rank's block has the same size (NCCL's own collectives need it). */
static bool counts_equal(const size_t *counts, int n)
{
    for (int p = 1; p < n; p++)
        if (counts[p] != counts[0])
            return false;
    return true;
}

/* ncclReduceScatter when every block has the same size; otherwise one ncclReduce per block
 * to its rank, grouped, as PyTorch's ProcessGroupNCCL reduces uneven blocks. Host buffers go
 * through the staging buffer: the input, then this rank's block, 256-byte aligned. */
seldp_status seldp__nccl_reduce_scatter(seldp_comm *comm, const void *send, void *recv,
                                        const size_t *recv_counts, seldp_dtype dtype,
                                        seldp_device mem)
{
    nccl_comm *c = comm->impl;
    seldp_status st = SELDP_OK;
    ncclDataType_t type;
    SELDP_CHECK(seldp__nccl_enter(c, "reduce_scatter"));
    SELDP_CHECK(seldp__nccl_check_device_mem(c, "reduce_scatter", mem));
    if (!seldp__nccl_type(dtype, &type))
        return seldp__nccl_fail_abort(c, SELDP_ERR_DTYPE,
                                      "nccl rank %d/%d: reduce_scatter of %s is not supported",
                                      c->rank, c->size, seldp_dtype_name(dtype));
    int n = c->size, me = c->rank;
    size_t esize = seldp_dtype_size(dtype), total = 0;
    for (int p = 0; p < n; p++)
        total += recv_counts[p];
    if (total == 0)
        return SELDP_OK;
    size_t mine = recv_counts[me] * esize;
    bool host = mem.kind == SELDP_DEVICE_HOST;
    const char *dsend = send;
    char *drecv = recv;
    if (host) {
        size_t in_area = (total * esize + 255) & ~(size_t)255;
        SELDP_CHECK(seldp__nccl_ensure_staging(c, in_area + mine));
        dsend = c->staging;
        drecv = (char *)c->staging + in_area;
        SELDP_CHECK(
            seldp__nccl_copy_sync(c, (void *)dsend, send, total * esize, cudaMemcpyHostToDevice));
    }
    ncclResult_t r;
    if (counts_equal(recv_counts, n)) {
        r = ncclReduceScatter(dsend, drecv, recv_counts[0], type, ncclSum, c->nccl, c->stream);
        if (!nccl_started(r))
            return seldp__nccl_fail_nccl(c, "ncclReduceScatter", r);
    } else {
        ncclResult_t first = ncclSuccess;
        if ((r = ncclGroupStart()) != ncclSuccess)
            return seldp__nccl_fail_nccl(c, "ncclGroupStart", r);
        size_t at = 0;
        for (int p = 0; p < n && first == ncclSuccess; p++) {
            const char *block = dsend + at * esize;
            if (recv_counts[p]) {
                /* recvbuff is read on the root only */
                r = ncclReduce(block, p == me ? drecv : (void *)block, recv_counts[p], type,
                               ncclSum, p, c->nccl, c->stream);
                if (!nccl_started(r))
                    first = r;
            }
            at += recv_counts[p];
        }
        r = ncclGroupEnd(); /* always closes the group, also after a failed enqueue */
        if (first != ncclSuccess)
            return seldp__nccl_fail_nccl(c, "ncclReduce (reduce_scatter)", first);
        if (!nccl_started(r))
            return seldp__nccl_fail_nccl(c, "ncclGroupEnd (reduce_scatter)", r);
    }
    SELDP_CHECK(seldp__nccl_wait_done(c, "reduce_scatter", true));
    if (host && mine)
        SELDP_CHECK(seldp__nccl_copy_sync(c, recv, drecv, mine, cudaMemcpyDeviceToHost));
    return SELDP_OK;
fail:
    return st;
}

/* ncclAllGather when every block has the same size; otherwise one ncclBroadcast per block
 * from its rank, grouped. Host buffers: gathered in place in the staging buffer. */
seldp_status seldp__nccl_allgather_counts(seldp_comm *comm, const void *send, void *recv,
                                          const size_t *counts, seldp_dtype dtype, seldp_device mem)
{
    nccl_comm *c = comm->impl;
    seldp_status st = SELDP_OK;
    SELDP_CHECK(seldp__nccl_enter(c, "allgather_counts"));
    SELDP_CHECK(seldp__nccl_check_device_mem(c, "allgather_counts", mem));
    int n = c->size, me = c->rank;
    size_t esize = seldp_dtype_size(dtype), total = 0, mine_at = 0;
    for (int p = 0; p < n; p++) {
        if (p == me)
            mine_at = total * esize;
        total += counts[p];
    }
    if (total == 0)
        return SELDP_OK;
    bool host = mem.kind == SELDP_DEVICE_HOST;
    const char *dsend = send;
    char *drecv = recv;
    if (host) {
        SELDP_CHECK(seldp__nccl_ensure_staging(c, total * esize));
        drecv = c->staging;
        dsend = drecv + mine_at;
        if (counts[me])
            SELDP_CHECK(seldp__nccl_copy_sync(c, (void *)dsend, send, counts[me] * esize,
                                              cudaMemcpyHostToDevice));
    }
    ncclResult_t r;
    if (counts_equal(counts, n)) {
        r = ncclAllGather(dsend, drecv, counts[0] * esize, ncclUint8, c->nccl, c->stream);
        if (!nccl_started(r))
            return seldp__nccl_fail_nccl(c, "ncclAllGather", r);
    } else {
        ncclResult_t first = ncclSuccess;
        if ((r = ncclGroupStart()) != ncclSuccess)
            return seldp__nccl_fail_nccl(c, "ncclGroupStart", r);
        size_t at = 0;
        for (int p = 0; p < n && first == ncclSuccess; p++) {
            char *block = drecv + at * esize;
            if (counts[p]) {
                /* sendbuff is read on the root only */
                r = ncclBroadcast(p == me ? (const void *)dsend : block, block, counts[p] * esize,
                                  ncclUint8, p, c->nccl, c->stream);
                if (!nccl_started(r))
                    first = r;
            }
            at += counts[p];
        }
        r = ncclGroupEnd();
        if (first != ncclSuccess)
            return seldp__nccl_fail_nccl(c, "ncclBroadcast (allgather_counts)", first);
        if (!nccl_started(r))
            return seldp__nccl_fail_nccl(c, "ncclGroupEnd (allgather_counts)", r);
    }
    SELDP_CHECK(seldp__nccl_wait_done(c, "allgather_counts", true));
    if (host)
        SELDP_CHECK(seldp__nccl_copy_sync(c, recv, drecv, total * esize, cudaMemcpyDeviceToHost));
    return SELDP_OK;
fail:
    return st;
}
