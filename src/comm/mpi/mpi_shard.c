/* The MPI transport's sharded collectives: reduce_scatter and allgather_counts, under the
 * staging and parking rules of mpi_collectives.c (the caller's data copied into the group's
 * buffers before anything is posted, copied out only after every operation completed; a
 * body given up is parked with its buffers). Called under the world's lock.
 *
 * The reduce-scatter is deterministic, like the allreduce, rather than MPI_Reduce_scatter,
 * whose summation order depends on the algorithm MPI picks: an MPI_Ialltoallv brings every
 * rank's copy of block r to rank r, which sums them in rank order 0..n-1, so block r equals,
 * bit for bit, the same elements of seldp's allreduce (this transport's and the host
 * transport's). The all-gather is MPI_Iallgatherv (seldp__mpi_gather_body). */
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "comm/mpi/mpi_impl.h"
#include "device.h"
#include "internal.h"

/* dst[i] += src[i] in F32. */
static void add_f32(float *dst, const float *src, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] += src[i];
}

/* In rounds: a round takes up to `per` elements of every block (so that a rank sends at
 * most max_message bytes), every rank's slice of block p goes to rank p, which sums the n
 * slices of its own block into its result. A single round sends from the staged input
 * itself; with several (or an input beyond MPI's int displacements) each round's slices are
 * packed side by side first. */
seldp_status seldp__mpi_reduce_scatter(seldp_comm *comm, const void *send, void *recv,
                                       const size_t *recv_counts, seldp_dtype dtype,
                                       seldp_device mem)
{
    mpi_group *g = seldp__mpi_group(comm);
    int n = comm->size, me = comm->rank;
    size_t esize = seldp_dtype_size(dtype), total = 0, longest = 0, mine = recv_counts[me];
    for (int p = 0; p < n; p++) {
        total += recv_counts[p];
        longest = recv_counts[p] > longest ? recv_counts[p] : longest;
    }
    size_t per = g->world->max_message / (esize * (size_t)n);
    per = per ? per : 1;
    size_t widest = longest < per ? longest : per; /* elements of a block in one round */
    size_t my_widest = mine < per ? mine : per;
    /* one round over an input within int counts goes straight from the staged input */
    bool direct = longest <= per && total * esize <= (size_t)INT_MAX;
    void *stage = NULL, *result = NULL, *slices = NULL, *ints = NULL, *pack = NULL;
    seldp__call_header h = {.op = OP_REDUCE_SCATTER,
                            .count = (int64_t)total,
                            .dtype = dtype,
                            .counts = seldp__proto_counts_digest(recv_counts, n)};
    h.staged =
        seldp__mpi_stage_in(comm, OP_REDUCE_SCATTER, BUF_SEND, send, total * esize, mem, &stage);
    if (h.staged == SELDP_OK)
        h.staged = seldp__mpi_stage_in(comm, OP_REDUCE_SCATTER, BUF_RECV, NULL, mine * esize, mem,
                                       &result);
    if (h.staged == SELDP_OK)
        h.staged = seldp__mpi_stage_in(comm, OP_REDUCE_SCATTER, BUF_WORK, NULL,
                                       my_widest * esize * (size_t)n, mem, &slices);
    if (h.staged == SELDP_OK)
        h.staged = seldp__mpi_stage_in(comm, OP_REDUCE_SCATTER, BUF_INTS, NULL,
                                       4 * (size_t)n * sizeof(int), mem, &ints);
    if (h.staged == SELDP_OK && !direct)
        h.staged = seldp__mpi_stage_in(comm, OP_REDUCE_SCATTER, BUF_PACK, NULL,
                                       widest * esize * (size_t)n, mem, &pack);
    seldp_status st = seldp__mpi_call_begin(comm, &h);
    if (st != SELDP_OK)
        return st;

    int *scounts = ints, *sdispls = scounts + n, *rcounts = scounts + 2 * n;
    int *rdispls = scounts + 3 * n;
    MPI_Request *req = g->buf[BUF_REQS];
    double deadline = seldp__mpi_body_deadline(comm);
    for (size_t start = 0; start < longest; start += per) {
        size_t at = 0, packed = 0;
        for (int p = 0; p < n; p++) {
            size_t lo = recv_counts[p] < start ? recv_counts[p] : start;
            size_t hi = recv_counts[p] < start + per ? recv_counts[p] : start + per;
            size_t from = (at + lo) * esize, bytes = (hi - lo) * esize;
            scounts[p] = (int)bytes;
            if (direct) {
                sdispls[p] = (int)from;
            } else {
                memcpy((char *)pack + packed, (const char *)stage + from, bytes);
                sdispls[p] = (int)packed;
                packed += bytes;
            }
            at += recv_counts[p];
        }
        size_t lo = mine < start ? mine : start, hi = mine < start + per ? mine : start + per;
        size_t slice = (hi - lo) * esize;
        for (int q = 0; q < n; q++) {
            rcounts[q] = (int)slice;
            rdispls[q] = (int)((size_t)q * slice);
        }
        int err = MPI_Ialltoallv(direct ? stage : pack, scounts, sdispls, MPI_BYTE, slices, rcounts,
                                 rdispls, MPI_BYTE, g->comm, req);
        if (err != MPI_SUCCESS)
            return seldp__mpi_call_failed(comm, OP_REDUCE_SCATTER, "MPI_Ialltoallv", err, 0);
        if ((st = seldp__mpi_body_wait(comm, OP_REDUCE_SCATTER, 1, deadline)) != SELDP_OK)
            return st;
        float *sum = (float *)result + lo;
        if (slice)
            memcpy(sum, slices, slice);
        for (int q = 1; q < n; q++)
            add_f32(sum, (const float *)((const char *)slices + (size_t)q * slice), hi - lo);
    }
    if (mine)
        st = seldp__device_copy(recv, mem, result, SELDP_HOST_DEVICE, mine * esize);
    return st;
}

seldp_status seldp__mpi_allgather_counts(seldp_comm *comm, const void *send, void *recv,
                                         const size_t *counts, seldp_dtype dtype, seldp_device mem)
{
    int n = comm->size;
    size_t esize = seldp_dtype_size(dtype), total = 0;
    void *hsend = NULL, *hrecv = NULL;
    size_t *lens = malloc(2 * (size_t)n * sizeof *lens);
    for (int r = 0; r < n; r++)
        total += counts[r];
    seldp__call_header h = {.op = OP_ALLGATHER_COUNTS,
                            .count = (int64_t)total,
                            .dtype = dtype,
                            .counts = seldp__proto_counts_digest(counts, n)};
    if (!lens)
        h.staged =
            seldp__mpi_out_of_memory(comm, OP_ALLGATHER_COUNTS, 2 * (size_t)n * sizeof *lens);
    else
        h.staged = seldp__mpi_stage_in(comm, OP_ALLGATHER_COUNTS, BUF_SEND, send,
                                       counts[comm->rank] * esize, mem, &hsend);
    if (h.staged == SELDP_OK)
        h.staged = seldp__mpi_stage_in(comm, OP_ALLGATHER_COUNTS, BUF_RECV, NULL, total * esize,
                                       mem, &hrecv);
    seldp_status st = seldp__mpi_call_begin(comm, &h);
    if (st != SELDP_OK)
        goto fail;
    size_t *offsets = lens + n, at = 0;
    for (int r = 0; r < n; r++) {
        lens[r] = counts[r] * esize;
        offsets[r] = at;
        at += lens[r];
    }
    SELDP_CHECK(seldp__mpi_gather_body(comm, OP_ALLGATHER_COUNTS, hsend, lens, hrecv, offsets));
    if (total)
        st = seldp__device_copy(recv, mem, hrecv, SELDP_HOST_DEVICE, total * esize);
fail:
    free(lens);
    return st;
}
