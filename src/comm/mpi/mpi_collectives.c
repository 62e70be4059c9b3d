/* The MPI transport's collectives: what each one moves once every rank has arrived and
 * agreed (mpi_protocol.c). Every body works on the group's staging buffers: the caller's
 * data is copied in before anything is posted and copied out only after every operation
 * of the body completed, so that a body given up at a timeout or an abort (parked with
 * its buffers) never touches the caller's memory after the call returned. Called under
 * the world's lock. */
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/mpi/mpi_impl.h"
#include "device.h"
#include "internal.h"

seldp_status seldp__mpi_out_of_memory(const seldp_comm *comm, seldp__comm_op op, size_t bytes)
{
    return seldp__fail(SELDP_ERR_NOMEM, "rank %d: %s: out of memory staging %zu bytes", comm->rank,
                       seldp__comm_op_name(op), bytes);
}

seldp_status seldp__mpi_stage_in(const seldp_comm *comm, seldp__comm_op op, int which,
                                 const void *src, size_t bytes, seldp_device mem, void **out)
{
    *out = seldp__mpi_buf(seldp__mpi_group(comm), which, bytes);
    if (!*out)
        return seldp__mpi_out_of_memory(comm, op, bytes);
    if (src && bytes)
        return seldp__device_copy(*out, SELDP_HOST_DEVICE, src, mem, bytes);
    return SELDP_OK;
}

/* ---- barrier, broadcast -------------------------------------------------------------- */

seldp_status seldp__mpi_barrier(seldp_comm *comm)
{
    seldp__call_header h = {.op = OP_BARRIER};
    return seldp__mpi_call_begin(comm, &h);
}

seldp_status seldp__mpi_broadcast(seldp_comm *comm, void *buf, size_t bytes, int root,
                                  seldp_device mem)
{
    mpi_group *g = seldp__mpi_group(comm);
    size_t piece = g->world->max_message;
    bool is_root = comm->rank == root;
    void *host = NULL;
    seldp__call_header h = {.op = OP_BROADCAST, .root = root, .bytes = (int64_t)bytes};
    h.staged =
        seldp__mpi_stage_in(comm, OP_BROADCAST, BUF_SEND, is_root ? buf : NULL, bytes, mem, &host);
    seldp_status st = seldp__mpi_call_begin(comm, &h);
    if (st != SELDP_OK)
        return st;

    double deadline = seldp__mpi_body_deadline(comm);
    MPI_Request *req = g->buf[BUF_REQS];
    for (size_t off = 0; off < bytes; off += piece) {
        size_t len = bytes - off < piece ? bytes - off : piece;
        int err = MPI_Ibcast((char *)host + off, (int)len, MPI_BYTE, root, g->comm, req);
        if (err != MPI_SUCCESS)
            return seldp__mpi_call_failed(comm, OP_BROADCAST, "MPI_Ibcast", err, 0);
        if ((st = seldp__mpi_body_wait(comm, OP_BROADCAST, 1, deadline)) != SELDP_OK)
            return st;
    }
    if (!is_root && bytes)
        st = seldp__device_copy(buf, mem, host, SELDP_HOST_DEVICE, bytes);
    return st;
}

/* ---- allgather, allgatherv ----------------------------------------------------------- */

/* Body of the gathers: rank r's lens[r] bytes (this rank's at `mine`) go to
 * dst + offsets[r] on every rank; mine and dst are staging buffers. One MPI_Iallgatherv
 * when it all fits in one message; otherwise rounds of at most max_message / n bytes per
 * rank through a staging block. Every rank derives the same rounds from lens, which every
 * rank knows. */
seldp_status seldp__mpi_gather_body(seldp_comm *comm, seldp__comm_op op, const void *mine,
                                    const size_t *lens, char *dst, const size_t *offsets)
{
    mpi_group *g = seldp__mpi_group(comm);
    int n = comm->size;
    size_t limit = g->world->max_message;
    double deadline = seldp__mpi_body_deadline(comm);
    seldp_status st = SELDP_OK;
    MPI_Request *req = g->buf[BUF_REQS];
    int *counts = seldp__mpi_buf(g, BUF_INTS, 2 * (size_t)n * sizeof *counts);
    if (!counts)
        return seldp__mpi_fail_alone(
            comm, op, seldp__mpi_out_of_memory(comm, op, 2 * (size_t)n * sizeof(int)));
    int *displs = counts + n;

    size_t total = 0, longest = 0;
    bool direct = true;
    for (int r = 0; r < n; r++) {
        total += lens[r];
        longest = lens[r] > longest ? lens[r] : longest;
        direct = direct && offsets[r] <= limit;
    }
    if (direct && total <= limit) {
        for (int r = 0; r < n; r++) {
            counts[r] = (int)lens[r];
            displs[r] = (int)offsets[r];
        }
        int err = MPI_Iallgatherv(mine, counts[comm->rank], MPI_BYTE, dst, counts, displs, MPI_BYTE,
                                  g->comm, req);
        if (err != MPI_SUCCESS)
            return seldp__mpi_call_failed(comm, op, "MPI_Iallgatherv", err, 0);
        return seldp__mpi_body_wait(comm, op, 1, deadline);
    }

    size_t chunk = limit / (size_t)n ? limit / (size_t)n : 1;
    char *block = seldp__mpi_buf(g, BUF_WORK, chunk * (size_t)n);
    if (!block)
        return seldp__mpi_fail_alone(comm, op,
                                     seldp__mpi_out_of_memory(comm, op, chunk * (size_t)n));
    for (size_t start = 0; start < longest; start += chunk) {
        int at = 0;
        for (int r = 0; r < n; r++) {
            size_t left = lens[r] > start ? lens[r] - start : 0;
            counts[r] = (int)(left < chunk ? left : chunk);
            displs[r] = at;
            at += counts[r];
        }
        const char *from = counts[comm->rank] ? (const char *)mine + start : mine;
        int err = MPI_Iallgatherv(from, counts[comm->rank], MPI_BYTE, block, counts, displs,
                                  MPI_BYTE, g->comm, req);
        if (err != MPI_SUCCESS)
            return seldp__mpi_call_failed(comm, op, "MPI_Iallgatherv", err, 0);
        if ((st = seldp__mpi_body_wait(comm, op, 1, deadline)) != SELDP_OK)
            return st;
        for (int r = 0; r < n; r++)
            if (counts[r])
                memcpy(dst + offsets[r] + start, block + displs[r], (size_t)counts[r]);
    }
    return st;
}

seldp_status seldp__mpi_allgather(seldp_comm *comm, const void *send, void *recv, size_t bytes,
                                  seldp_device mem)
{
    int n = comm->size;
    size_t total = bytes * (size_t)n;
    void *hsend = NULL, *hrecv = NULL;
    size_t *lens = malloc(2 * (size_t)n * sizeof *lens);
    seldp__call_header h = {.op = OP_ALLGATHER, .bytes = (int64_t)bytes};
    if (!lens)
        h.staged = seldp__mpi_out_of_memory(comm, OP_ALLGATHER, 2 * (size_t)n * sizeof *lens);
    else
        h.staged = seldp__mpi_stage_in(comm, OP_ALLGATHER, BUF_SEND, send, bytes, mem, &hsend);
    if (h.staged == SELDP_OK)
        h.staged = seldp__mpi_stage_in(comm, OP_ALLGATHER, BUF_RECV, NULL, total, mem, &hrecv);
    seldp_status st = seldp__mpi_call_begin(comm, &h);
    if (st != SELDP_OK)
        goto fail;
    size_t *offsets = lens + n;
    for (int r = 0; r < n; r++) {
        lens[r] = bytes;
        offsets[r] = (size_t)r * bytes;
    }
    SELDP_CHECK(seldp__mpi_gather_body(comm, OP_ALLGATHER, hsend, lens, hrecv, offsets));
    if (total)
        st = seldp__device_copy(recv, mem, hrecv, SELDP_HOST_DEVICE, total);
fail:
    free(lens);
    return st;
}

seldp_status seldp__mpi_allgatherv(seldp_comm *comm, const void *send, size_t send_bytes,
                                   void **recv, size_t *recv_bytes)
{
    int n = comm->size;
    char *blob = NULL;
    void *hsend = NULL, *hrecv = NULL;
    size_t *offsets = malloc((size_t)n * sizeof *offsets);
    size_t *lens = malloc((size_t)n * sizeof *lens);
    seldp__call_header h = {.op = OP_ALLGATHERV, .bytes = (int64_t)send_bytes};
    if (!offsets || !lens)
        h.staged = seldp__mpi_out_of_memory(comm, OP_ALLGATHERV, 2 * (size_t)n * sizeof *offsets);
    else
        h.staged = seldp__mpi_stage_in(comm, OP_ALLGATHERV, BUF_SEND, send, send_bytes,
                                       SELDP_HOST_DEVICE, &hsend);
    seldp_status st = seldp__mpi_call_begin(comm, &h);
    if (st != SELDP_OK)
        goto fail;

    /* Every rank sees the same sizes, so this error needs no abort: all return it. */
    const seldp__call_header *s = seldp__mpi_group(comm)->headers;
    size_t total = 0;
    for (int r = 0; r < n; r++) {
        if ((uint64_t)s[r].bytes > SIZE_MAX - total)
            SELDP_FAIL(SELDP_ERR_INVALID_ARGUMENT,
                       "rank %d: allgatherv: the blobs' total size overflows size_t", comm->rank);
        offsets[r] = total;
        lens[r] = (size_t)s[r].bytes;
        total += (size_t)s[r].bytes;
    }
    blob = malloc(total ? total : 1);
    if (!blob || seldp__mpi_stage_in(comm, OP_ALLGATHERV, BUF_RECV, NULL, total, SELDP_HOST_DEVICE,
                                     &hrecv) != SELDP_OK)
        SELDP_CHECK(seldp__mpi_fail_alone(comm, OP_ALLGATHERV,
                                          seldp__mpi_out_of_memory(comm, OP_ALLGATHERV, total)));
    SELDP_CHECK(seldp__mpi_gather_body(comm, OP_ALLGATHERV, hsend, lens, hrecv, offsets));
    if (total)
        memcpy(blob, hrecv, total);
    memcpy(recv_bytes, lens, (size_t)n * sizeof *lens);
    *recv = blob;
    blob = NULL;
fail:
    free(blob);
    free(offsets);
    free(lens);
    return st;
}

/* ---- allreduce ----------------------------------------------------------------------- */

/* dst[i] += src[i]; signed sums wrap like unsigned ones (two's complement). */
static void add_into(void *dst, const void *src, size_t count, seldp_dtype dtype)
{
    if (dtype == SELDP_F32) {
        float *d = dst;
        const float *s = src;
        for (size_t i = 0; i < count; i++)
            d[i] += s[i];
    } else if (dtype == SELDP_F64) {
        double *d = dst;
        const double *s = src;
        for (size_t i = 0; i < count; i++)
            d[i] += s[i];
    } else {
        uint64_t *d = dst;
        const uint64_t *s = src;
        for (size_t i = 0; i < count; i++)
            d[i] += s[i];
    }
}

/* Deterministic, in rounds of at most max_message bytes: in a round of m elements rank p
 * owns the slice [m*p/n, m*(p+1)/n). An MPI_Ialltoallv brings every rank's copy of the
 * slice to its owner, which sums them in rank order 0..n-1 in the dtype (as the host
 * transport does), and an MPI_Iallgatherv hands the sums to every rank. The order never
 * depends on MPI's choice of algorithm, so results are bit-identical on every rank,
 * from run to run, and to the host transport's. The sums are made in place in the
 * staging copy of the input. */
seldp_status seldp__mpi_allreduce(seldp_comm *comm, const void *send, void *recv, size_t count,
                                  seldp_dtype dtype, seldp_device mem)
{
    mpi_group *g = seldp__mpi_group(comm);
    int n = comm->size, me = comm->rank;
    size_t esize = seldp_dtype_size(dtype), bytes = count * esize;
    size_t round = g->world->max_message / esize ? g->world->max_message / esize : 1;
    size_t widest = count < round ? count : round; /* elements in the largest round */
    size_t slice_max = (widest + (size_t)n - 1) / (size_t)n;
    void *stage = NULL, *slices = NULL, *ints = NULL;
    seldp__call_header h = {.op = OP_ALLREDUCE, .count = (int64_t)count, .dtype = dtype};
    h.staged = seldp__mpi_stage_in(comm, OP_ALLREDUCE, BUF_SEND, send, bytes, mem, &stage);
    if (h.staged == SELDP_OK)
        h.staged = seldp__mpi_stage_in(comm, OP_ALLREDUCE, BUF_WORK, NULL,
                                       slice_max * esize * (size_t)n, mem, &slices);
    if (h.staged == SELDP_OK)
        h.staged = seldp__mpi_stage_in(comm, OP_ALLREDUCE, BUF_INTS, NULL,
                                       6 * (size_t)n * sizeof(int), mem, &ints);
    seldp_status st = seldp__mpi_call_begin(comm, &h);
    if (st != SELDP_OK)
        return st;

    int *scounts = ints, *sdispls = scounts + n, *rcounts = scounts + 2 * n;
    int *rdispls = scounts + 3 * n, *gcounts = scounts + 4 * n, *gdispls = scounts + 5 * n;
    MPI_Request *req = g->buf[BUF_REQS];
    double deadline = seldp__mpi_body_deadline(comm);
    size_t start = 0;
    do {
        size_t m = count - start < round ? count - start : round;
        for (int p = 0; p < n; p++) {
            size_t lo = m * (size_t)p / (size_t)n, hi = m * (size_t)(p + 1) / (size_t)n;
            gcounts[p] = scounts[p] = (int)((hi - lo) * esize);
            gdispls[p] = sdispls[p] = (int)(lo * esize);
        }
        size_t mine = (size_t)gcounts[me];
        for (int q = 0; q < n; q++) {
            rcounts[q] = (int)mine;
            rdispls[q] = (int)((size_t)q * mine);
        }
        char *at = (char *)stage + start * esize;
        int err = MPI_Ialltoallv(at, scounts, sdispls, MPI_BYTE, slices, rcounts, rdispls, MPI_BYTE,
                                 g->comm, req);
        if (err != MPI_SUCCESS)
            return seldp__mpi_call_failed(comm, OP_ALLREDUCE, "MPI_Ialltoallv", err, 0);
        if ((st = seldp__mpi_body_wait(comm, OP_ALLREDUCE, 1, deadline)) != SELDP_OK)
            return st;

        /* The inputs of this round are all read: the staging copy is safe to write. */
        char *sum = at + gdispls[me];
        memcpy(sum, slices, mine);
        for (int q = 1; q < n; q++)
            add_into(sum, (char *)slices + (size_t)q * mine, mine / esize, dtype);

        err = MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_BYTE, at, gcounts, gdispls, MPI_BYTE, g->comm,
                              req);
        if (err != MPI_SUCCESS)
            return seldp__mpi_call_failed(comm, OP_ALLREDUCE, "MPI_Iallgatherv", err, 0);
        if ((st = seldp__mpi_body_wait(comm, OP_ALLREDUCE, 1, deadline)) != SELDP_OK)
            return st;
        start += m;
    } while (start < count);
    if (bytes)
        st = seldp__device_copy(recv, mem, stage, SELDP_HOST_DEVICE, bytes);
    return st;
}

/* ---- alltoallv ----------------------------------------------------------------------- */

/* The host transport's check that rank r sends rank p what p expects from r, made the
 * same on every rank: an MPI_Ialltoall of the counts lets each p compare its column, and
 * an MPI_Iallgather of each column's first mismatch lets every rank name the same one. */
static seldp_status alltoallv_agree(seldp_comm *comm, const size_t *send_bytes,
                                    const size_t *recv_bytes, uint64_t *work)
{
    mpi_group *g = seldp__mpi_group(comm);
    int n = comm->size;
    uint64_t *sent = work, *got = work + n;
    int64_t *verdicts = (int64_t *)(work + 2 * n), *mine = (int64_t *)(work + 5 * n);
    double deadline = seldp__mpi_body_deadline(comm);
    MPI_Request *req = g->buf[BUF_REQS];
    mine[0] = -1;
    mine[1] = mine[2] = 0;
    for (int p = 0; p < n; p++)
        sent[p] = send_bytes[p];
    int err = MPI_Ialltoall(sent, 1, MPI_UINT64_T, got, 1, MPI_UINT64_T, g->comm, req);
    if (err != MPI_SUCCESS)
        return seldp__mpi_call_failed(comm, OP_ALLTOALLV, "MPI_Ialltoall", err, 0);
    seldp_status st = seldp__mpi_body_wait(comm, OP_ALLTOALLV, 1, deadline);
    if (st != SELDP_OK)
        return st;
    for (int r = 0; r < n && mine[0] < 0; r++) {
        if (got[r] != recv_bytes[r]) {
            mine[0] = r;
            mine[1] = (int64_t)got[r];
            mine[2] = (int64_t)recv_bytes[r];
        }
    }
    err = MPI_Iallgather(mine, 3, MPI_INT64_T, verdicts, 3, MPI_INT64_T, g->comm, req);
    if (err != MPI_SUCCESS)
        return seldp__mpi_call_failed(comm, OP_ALLTOALLV, "MPI_Iallgather", err, 0);
    if ((st = seldp__mpi_body_wait(comm, OP_ALLTOALLV, 1, deadline)) != SELDP_OK)
        return st;
    int first = -1; /* the receiver p of the smallest (sender r, receiver p) */
    for (int p = 0; p < n; p++) {
        int64_t r = verdicts[3 * p];
        if (r >= 0 && (first < 0 || r < verdicts[3 * first]))
            first = p;
    }
    if (first < 0)
        return SELDP_OK;
    const int64_t *v = &verdicts[3 * first];
    return seldp__proto_alltoallv_mismatch(comm->rank, (int)v[0], (size_t)v[1], first,
                                           (size_t)v[2]);
}

static size_t pieces_extent(const size_t *bytes, const size_t *displs, int n)
{
    size_t end = 0;
    for (int p = 0; p < n; p++)
        if (bytes[p] && displs[p] + bytes[p] > end)
            end = displs[p] + bytes[p];
    return end;
}

static size_t messages_for(size_t bytes, size_t piece)
{
    return (bytes + piece - 1) / piece;
}

/* The data moves point-to-point rather than by MPI_Ialltoallv: displacements are local
 * and may exceed int, and both ends know each pair's byte count, so every piece can be
 * cut into messages of at most max_message bytes without agreeing on rounds. MPI keeps
 * the messages of one pair, tag and communicator in order. */
seldp_status seldp__mpi_alltoallv(seldp_comm *comm, const void *send, const size_t *send_bytes,
                                  const size_t *send_displs, void *recv, const size_t *recv_bytes,
                                  const size_t *recv_displs, seldp_device mem)
{
    mpi_group *g = seldp__mpi_group(comm);
    int n = comm->size, me = comm->rank;
    size_t piece = g->world->max_message;
    size_t send_extent = pieces_extent(send_bytes, send_displs, n);
    size_t recv_extent = pieces_extent(recv_bytes, recv_displs, n);
    size_t messages = 0;
    for (int p = 0; p < n; p++)
        if (p != me)
            messages += messages_for(send_bytes[p], piece) + messages_for(recv_bytes[p], piece);
    void *hsend = NULL, *hrecv = NULL, *work = NULL, *reqs_buf = NULL;
    seldp__call_header h = {.op = OP_ALLTOALLV};
    if (messages > INT_MAX)
        h.staged = seldp__fail(SELDP_ERR_INVALID_ARGUMENT,
                               "rank %d: alltoallv needs %zu messages, more than MPI can wait on",
                               comm->rank, messages);
    else
        h.staged =
            seldp__mpi_stage_in(comm, OP_ALLTOALLV, BUF_REQS, NULL,
                                (messages ? messages : 1) * sizeof(MPI_Request), mem, &reqs_buf);
    if (h.staged == SELDP_OK)
        h.staged = seldp__mpi_stage_in(comm, OP_ALLTOALLV, BUF_WORK, NULL,
                                       (6 * (size_t)n + 3) * sizeof(uint64_t), mem, &work);
    if (h.staged == SELDP_OK)
        h.staged =
            seldp__mpi_stage_in(comm, OP_ALLTOALLV, BUF_SEND, send, send_extent, mem, &hsend);
    if (h.staged == SELDP_OK)
        h.staged =
            seldp__mpi_stage_in(comm, OP_ALLTOALLV, BUF_RECV, NULL, recv_extent, mem, &hrecv);
    seldp_status st = seldp__mpi_call_begin(comm, &h);
    if (st != SELDP_OK)
        return st;
    if ((st = alltoallv_agree(comm, send_bytes, recv_bytes, work)) != SELDP_OK)
        return st;

    MPI_Request *reqs = g->buf[BUF_REQS];
    int posted = 0;
    for (int p = 0; p < n; p++) {
        for (size_t off = 0; p != me && off < recv_bytes[p]; off += piece) {
            size_t len = recv_bytes[p] - off < piece ? recv_bytes[p] - off : piece;
            int err = MPI_Irecv((char *)hrecv + recv_displs[p] + off, (int)len, MPI_BYTE, p,
                                TAG_ALLTOALLV, g->comm, &reqs[posted]);
            if (err != MPI_SUCCESS)
                return seldp__mpi_call_failed(comm, OP_ALLTOALLV, "MPI_Irecv", err, posted);
            posted++;
        }
    }
    for (int k = 1; k < n; k++) { /* from the next rank on, so no rank is everyone's first */
        int p = (me + k) % n;
        for (size_t off = 0; off < send_bytes[p]; off += piece) {
            size_t len = send_bytes[p] - off < piece ? send_bytes[p] - off : piece;
            int err = MPI_Isend((const char *)hsend + send_displs[p] + off, (int)len, MPI_BYTE, p,
                                TAG_ALLTOALLV, g->comm, &reqs[posted]);
            if (err != MPI_SUCCESS)
                return seldp__mpi_call_failed(comm, OP_ALLTOALLV, "MPI_Isend", err, posted);
            posted++;
        }
    }
    if (send_bytes[me])
        memcpy((char *)hrecv + recv_displs[me], (const char *)hsend + send_displs[me],
               send_bytes[me]);
    if ((st = seldp__mpi_body_wait(comm, OP_ALLTOALLV, posted,
                                   seldp__proto_now() + g->world->timeout_s)) != SELDP_OK)
        return st;
    /* Copy out only the pieces received, leaving the rest of recv as it was. */
    for (int p = 0; p < n; p++)
        if (recv_bytes[p])
            SELDP_CHECK(seldp__device_copy((char *)recv + recv_displs[p], mem,
                                           (char *)hrecv + recv_displs[p], SELDP_HOST_DEVICE,
                                           recv_bytes[p]));
fail:
    return st;
}

/* ---- split --------------------------------------------------------------------------- */

/* An id for a child group that every member computes alike: its parent's id, the split's
 * number on the parent and the color, mixed (splitmix64). */
static int64_t child_id(int64_t parent, int64_t split, int color)
{
    uint64_t z = (uint64_t)parent * 0x9e3779b97f4a7c15u + (uint64_t)split * 0xbf58476d1ce4e5b9u +
                 (uint64_t)(uint32_t)color;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
    z ^= z >> 31;
    return (int64_t)(z >> 1) | 2; /* never the world group's 1 */
}

/* MPI has no non-blocking split. The headers carry every rank's color and key and
 * prove that every rank has arrived, and the confirmation that no rank knows of an abort,
 * so the blocking MPI_Comm_split that follows only waits for ranks already on their way
 * into it. */
seldp_status seldp__mpi_split(seldp_comm *comm, int color, int key, seldp_comm **out)
{
    mpi_group *g = seldp__mpi_group(comm);
    int64_t split = ++g->splits;
    seldp__call_header h = {.op = OP_SPLIT, .color = color, .key = key};
    seldp_status st = seldp__mpi_call_begin(comm, &h);
    if (st == SELDP_OK)
        st = seldp__mpi_confirm(comm, OP_SPLIT);
    if (st != SELDP_OK)
        return st;
    MPI_Comm mc = MPI_COMM_NULL;
    int err =
        MPI_Comm_split(g->comm, color == SELDP_COMM_NO_GROUP ? MPI_UNDEFINED : color, key, &mc);
    if (err != MPI_SUCCESS)
        return seldp__mpi_call_failed(comm, OP_SPLIT, "MPI_Comm_split", err, 0);
    if (mc == MPI_COMM_NULL)
        return SELDP_OK;
    MPI_Comm_set_errhandler(mc, MPI_ERRORS_RETURN);
    st = seldp__mpi_group_new(g->world, mc, child_id(g->id, split, color), comm->world_rank,
                              comm->device, out);
    if (st != SELDP_OK) {
        MPI_Comm_free(&mc);
        return seldp__mpi_fail_alone(comm, OP_SPLIT, st);
    }
    return SELDP_OK;
}
