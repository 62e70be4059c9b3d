/* The interface every transport fills in: a table of function pointers.
 *
 * src/comm/comm.c implements the public seldp_comm_* calls: it validates the
 * arguments, counts the call in the stats and dispatches to the transport's table.
 * A transport (host.c, nccl.c, mpi.c) allocates a seldp_comm, sets `ops` and its
 * own `impl`, and never sees invalid arguments. */
#ifndef SELDP_COMM_IMPL_H
#define SELDP_COMM_IMPL_H

#include <stdbool.h>

#include "seldp/comm.h"

/* One tensor's part of a fused reduction (see reduce_fused below). */
typedef struct seldp__reduce_seg {
    const void *in;        /* this rank's contribution, or NULL for zeros */
    seldp_dtype in_dtype;  /* F32, F16 or BF16 */
    void *out;             /* receives the result; may equal in */
    seldp_dtype out_dtype; /* F32, F16 or BF16; the same on every rank */
    size_t count;          /* elements; the same on every rank */
} seldp__reduce_seg;

/* A reduction of many tensors in one pass over memory. Every rank passes its segments in
 * the same order with the same counts. For each element, the transport sums the ranks'
 * contributions in F32 (halves upcast exactly) in rank order 0..P-1, multiplies by
 * `scale` as (float)((double)sum * scale) unless scale is 1, and writes the result in
 * out_dtype (round to nearest even) into every rank's `out`: the bits the session's
 * bucketed path gets from F32 allreduces, seldp__scale_f32 and seldp__convert. The
 * segments are seen as one stream of F32 elements cut into buckets of bucket_elems
 * (0: one bucket), each reduced as one allreduce would be. */
typedef struct seldp__reduce_fused_args {
    const seldp__reduce_seg *segs;
    size_t n_segs;
    size_t bucket_elems;
    double scale;
    /* May be NULL; else the transport sets *written once outputs of this rank may have been
     * written (every rank arrived), so that a failure after it is told from one before. */
    bool *written;
    /* May be NULL; else every segment's in and out is on *device (the caller, a session, has
     * checked each tensor), so the transport need not ask where each pointer is. */
    const seldp_device *device;
} seldp__reduce_fused_args;

/* One tensor's part of a sharded session's fused reduce-scatter or all-gather (see
 * seldp__scatter_fused_args and seldp__gather_fused_args): where its elements sit in the
 * shard map's index space (src/shard_map.c). */
typedef struct seldp__shard_seg {
    const void *in;        /* scatter: this rank's contribution, or NULL for zeros */
    seldp_dtype in_dtype;  /* scatter: F32, F16 or BF16 */
    void *out;             /* gather: this rank's storage of the tensor */
    seldp_dtype out_dtype; /* gather: F32, F16 or BF16 */
    size_t offset;         /* the tensor's first element in the index space; the same on every
                              rank, ascending from segment to segment */
    size_t count;          /* elements; the same on every rank */
} seldp__shard_seg;

/* A reduce-scatter over many tensors in one pass: every rank passes the same segments
 * (offsets and counts) and its own range [begin, end) of the index space (the ranges of the
 * ranks do not overlap). Rank r reads elements [begin_r, end_r) of every rank's segments,
 * sums them in F32 in rank order 0..P-1 (halves upcast exactly), multiplies by `scale` as
 * seldp__reduce_fused_args does, and writes element i into out[i - begin_r]: the bits of the
 * same elements of the fused reduction. Elements of the range no segment covers are not
 * written. */
typedef struct seldp__scatter_fused_args {
    const seldp__shard_seg *segs;
    size_t n_segs;
    size_t begin, end;
    float *out;
    double scale;
    bool *written; /* may be NULL; as in seldp__reduce_fused_args */
} seldp__scatter_fused_args;

/* An all-gather of ranges into many tensors in one pass: every rank passes the same
 * segments (offsets, counts and output dtypes), each pointing at its own storage, and its
 * range [begin, end) of the index space with its elements `in` (end - begin of in_dtype).
 * Rank r converts its range once, element by element, into the output dtype (round to
 * nearest even) and writes it into every rank's segments, so that every rank's storage
 * receives the same bits. Outside the segments nothing is written. */
typedef struct seldp__gather_fused_args {
    const seldp__shard_seg *segs;
    size_t n_segs;
    size_t begin, end;
    const void *in;
    seldp_dtype in_dtype; /* F32, F16 or BF16; the same on every rank */
    bool *written;        /* may be NULL; as in seldp__reduce_fused_args */
} seldp__gather_fused_args;

/* The collectives, named alike in every transport's messages. */
typedef enum seldp__comm_op {
    OP_INIT,
    OP_BARRIER,
    OP_BROADCAST,
    OP_ALLREDUCE,
    OP_ALLGATHER,
    OP_ALLGATHERV,
    OP_ALLTOALLV,
    OP_SPLIT,
    OP_REDUCE_FUSED,
    OP_REDUCE_SCATTER,
    OP_ALLGATHER_COUNTS,
    OP_SCATTER_FUSED,
    OP_GATHER_FUSED,
    OP_COUNT
} seldp__comm_op;

/* "init", "barrier", "broadcast"...; "?" outside the enum. */
const char *seldp__comm_op_name(int op);

typedef struct seldp_comm_ops {
    const char *name; /* "host", "nccl", "mpi" */
    /* Collectives only from the rank's own thread, in one order on every rank (NCCL: a GPU's
     * communicators are driven by one thread), so no progress thread may run them. */
    bool thread_bound;
    seldp_status (*barrier)(seldp_comm *comm);
    seldp_status (*broadcast)(seldp_comm *comm, void *buf, size_t bytes, int root,
                              seldp_device mem);
    seldp_status (*allreduce)(seldp_comm *comm, const void *send, void *recv, size_t count,
                              seldp_dtype dtype, seldp_device mem);
    seldp_status (*allgather)(seldp_comm *comm, const void *send, void *recv, size_t bytes,
                              seldp_device mem);
    seldp_status (*allgatherv)(seldp_comm *comm, const void *send, size_t send_bytes, void **recv,
                               size_t *recv_bytes);
    /* counts and displacements in bytes; the extents are the bytes from send and from recv
     * to the end of their furthest non-empty piece (comm.c has checked that they fit) */
    seldp_status (*alltoallv)(seldp_comm *comm, const void *send, const size_t *send_bytes,
                              const size_t *send_displs, void *recv, const size_t *recv_bytes,
                              const size_t *recv_displs, seldp_device mem, size_t send_extent,
                              size_t recv_extent);
    seldp_status (*split)(seldp_comm *comm, int color, int key, seldp_comm **out);
    /* Optional (NULL: the caller falls back to bucketed allreduces): the fused reduction of
     * seldp__reduce_fused_args, so that a failure before its outputs are written leaves
     * them untouched. Its segments are on the memory fused_memory accepts, and a caller
     * (a session choosing its reduce path) asks seldp__comm_fused_memory first. */
    seldp_status (*reduce_fused)(seldp_comm *comm, const seldp__reduce_fused_args *args);
    /* The memory reduce_fused works over (read only with reduce_fused set): true when its
     * segments may be on `mem` for this communicator. NULL means host memory only, as the
     * host-staged transport's rendezvous reads every rank's host memory and stages nothing.
     * When `needs` is not NULL it receives (at most `size` bytes, NUL-terminated) what the
     * reduction works over, for messages: "host memory", "cuda:0 or host memory". The NCCL
     * transport's works over the communicator's GPU (and host memory, staged). */
    bool (*fused_memory)(const seldp_comm *comm, seldp_device mem, char *needs, size_t size);
    /* counts: one per rank, the same array on every rank (comm.c has checked the sizes) */
    seldp_status (*reduce_scatter)(seldp_comm *comm, const void *send, void *recv,
                                   const size_t *recv_counts, seldp_dtype dtype, seldp_device mem);
    seldp_status (*allgather_counts)(seldp_comm *comm, const void *send, void *recv,
                                     const size_t *counts, seldp_dtype dtype, seldp_device mem);
    /* Optional, over the memory fused_memory accepts (NULL: sharded sessions stage their
     * data and use reduce_scatter and allgather_counts): the fused reduce-scatter and
     * all-gather of seldp__scatter_fused_args and seldp__gather_fused_args, each failing
     * before it writes anything unless every rank arrived. */
    seldp_status (*scatter_fused)(seldp_comm *comm, const seldp__scatter_fused_args *args);
    seldp_status (*gather_fused)(seldp_comm *comm, const seldp__gather_fused_args *args);
    void (*abort)(seldp_comm *comm);
    void (*destroy)(seldp_comm *comm);
} seldp_comm_ops;

struct seldp_comm {
    const seldp_comm_ops *ops;
    int rank;       /* within the group */
    int size;       /* of the group */
    int world_rank; /* within the world the group was split from */
    seldp_device device;
    seldp_comm_stats stats;
    void *impl; /* the transport's state */
    /* SELDP_DEBUG_COLLECTIVES (see seldp__comm_debug_agree): on for this communicator, and
     * the calls it has fingerprinted */
    bool debug;
    uint64_t debug_calls;
};

/* Allocate a communicator with the common fields set; the transport fills impl.
 * Returns NULL when out of memory. Freed by seldp__comm_free. */
seldp_comm *seldp__comm_new(const seldp_comm_ops *ops, int rank, int size, int world_rank,
                            seldp_device device, void *impl);
void seldp__comm_free(seldp_comm *comm);

/* The debug mode of the collectives (like TORCH_DISTRIBUTED_DEBUG=DETAIL): with the
 * environment variable SELDP_DEBUG_COLLECTIVES set to anything but "" or "0" when a
 * communicator is created, each of its collectives first gathers every rank's fingerprint
 * of the call (the collective, its count, dtype and root where they must agree, and the
 * call's sequence number on this communicator) through the transport's own allgather. When
 * they differ every rank returns SELDP_ERR_DISAGREE naming both calls, before any data
 * moves. `count` and `root` are -1 where the ranks may differ; `dtype` is -1 where
 * there is none. SELDP_OK at once when the mode is off. */
seldp_status seldp__comm_debug_agree(seldp_comm *comm, seldp__comm_op op, int64_t count, int dtype,
                                     int root);

/* Whether the transport has a fused reduction over memory on `mem` (comm->ops->reduce_fused,
 * and fused_memory, or host memory when it is NULL). When `needs` is not NULL it receives
 * what the fused reduction works over, or "no fused reduction" when there is none. */
bool seldp__comm_fused_memory(const seldp_comm *comm, seldp_device mem, char *needs, size_t size);

/* The fused reduction when the transport has one (comm->ops->reduce_fused), counted in
 * the stats as one reduction, its bytes those of the contributions this rank passed in.
 * The caller checks with seldp__comm_fused_memory that the transport has one over the
 * segments' memory. */
static inline seldp_status seldp__comm_reduce_fused(seldp_comm *comm,
                                                    const seldp__reduce_fused_args *args)
{
    size_t elems = 0;
    for (size_t i = 0; i < args->n_segs; i++)
        elems += args->segs[i].count;
    if (comm->debug) {
        seldp_status st =
            seldp__comm_debug_agree(comm, OP_REDUCE_FUSED, (int64_t)elems, SELDP_F32, -1);
        if (st != SELDP_OK)
            return st;
    }
    for (size_t i = 0; i < args->n_segs; i++)
        if (args->segs[i].in)
            comm->stats.bytes += args->segs[i].count * seldp_dtype_size(args->segs[i].in_dtype);
    comm->stats.reductions++;
    return comm->ops->reduce_fused(comm, args);
}

/* Whether the transport has the fused reduce-scatter and all-gather of sharded sessions
 * over memory on `mem` (ops->scatter_fused and gather_fused, over the memory of
 * seldp__comm_fused_memory). */
bool seldp__comm_shard_fused(const seldp_comm *comm, seldp_device mem);

/* The fused reduce-scatter and all-gather when the transport has them
 * (seldp__comm_shard_fused), each counted in the stats as one reduction, its bytes those of
 * the contributions (scatter) or the range (gather) this rank passed in. */
seldp_status seldp__comm_scatter_fused(seldp_comm *comm, const seldp__scatter_fused_args *args);
seldp_status seldp__comm_gather_fused(seldp_comm *comm, const seldp__gather_fused_args *args);

#endif
