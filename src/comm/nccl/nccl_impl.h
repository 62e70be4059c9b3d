/* The NCCL transport's private header: a rank's handle on an NCCL communicator and what the
 * transport's files share (nccl.c: the world, joining, splits and teardown; nccl_wait.c:
 * waiting, failing and staging; nccl_collectives.c: the collectives; nccl_reduce.c: the
 * fused reduction). Built only with NCCL and CUDA. */
#ifndef SELDP_NCCL_IMPL_H
#define SELDP_NCCL_IMPL_H

#include <cuda_runtime_api.h>
#include <nccl.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>

#include "comm/comm_impl.h"
#include "device.h"
#include "kernels.h"
#include "seldp/nccl.h"

struct seldp_nccl_world {
    atomic_int refs;     /* the creator's reference plus one per communicator */
    atomic_bool aborted; /* sticky: every later wait of every rank returns ABORTED */
    int nranks;
    double timeout_s;
    ncclUniqueId id;
    atomic_bool *joined; /* in-process worlds: which ranks have joined (NULL otherwise) */
};

/* At most this many NCCL operations in one ncclGroupStart/End: a reduction cut into many
 * small buckets issues several groups, each waited for (NCCL's state, not the stream)
 * before the next, so that NCCL never plans an unbounded group. */
#define SELDP_NCCL_GROUP_MAX 64

/* Joining a world and splitting wait at least this long, whatever the configured timeout:
 * NCCL's bootstrap over 8 GPUs takes seconds, and a short timeout meant for a rank missing
 * from a collective must not fail a join that is merely slow. */
#define SELDP_NCCL_JOIN_TIMEOUT_MIN_S 60.0

/* The buffers of the fused reduction (nccl_reduce.c), kept by the communicator and grown
 * when a reduction needs more, so that a reduction allocates nothing once they fit. What
 * growing gives up is retired (nccl_comm.retired), never freed while the world is live. */
typedef struct seldp__nccl_reduce_buffers {
    seldp__device_buffer sum;   /* the F32 elements reduced, on the rank's device */
    seldp__device_buffer desc;  /* the kernels' segment descriptions, on the device */
    seldp__pinned_buffer descs; /* the same, written on the host and copied up */
    seldp__pinned_buffer host;  /* F32 elements of host segments, both ways */
    bool *side;                 /* per segment of the call: on the GPU (else the host) */
    size_t side_cap;
    seldp__convert_seg *segs; /* the device segments as the kernels take them */
    size_t segs_cap;
} seldp__nccl_reduce_buffers;

/* What one fused reduction needs (seldp__nccl_reduce_prepare). */
typedef struct seldp__nccl_reduce_plan {
    size_t elems;                  /* F32 elements of all segments */
    size_t device_segs, host_segs; /* segments whose result is on the GPU, on the host */
    size_t desc_bytes;             /* descriptions of the device segments, for one launch */
} seldp__nccl_reduce_plan;

/* One rank's handle on one NCCL communicator (the world's or a split's). */
typedef struct nccl_comm {
    seldp_nccl_world *world;
    ncclComm_t nccl; /* NULL once aborted or destroyed */
    cudaStream_t stream;
    int ordinal;
    int rank, size; /* within this communicator, for messages */
    void *staging;  /* device buffer for host payloads */
    size_t staging_bytes;
    seldp__nccl_reduce_buffers reduce;
    /* Buffers this rank gave up while its peers may be inside an NCCL kernel waiting for it
     * (growing staging or reduction buffers, a split's at its destroy): freeing synchronizes
     * the device and its peers (device.h), so they are freed at the world's destroy. */
    seldp__retired retired_buffers;
    ncclComm_t split_child; /* where ncclCommSplit's background job stores the child */
    /* Splits are destroyed only at teardown (see nccl_destroy): the rank's world handle
     * keeps every split made from it, or from its splits, in `splits`; a split whose
     * seldp_comm was destroyed is `retired` (finalized, its NCCL communicator kept). */
    bool is_world;
    struct nccl_comm *root; /* a split's world handle; NULL for the world, or once it is gone */
    struct nccl_comm *splits, *next_split;
    bool retired;
} nccl_comm;

/* ---- waiting, failing and aborting (nccl_wait.c) ---- */

/* Seconds on CLOCK_MONOTONIC. */
double seldp__nccl_now(void);

/* Between polls of a wait: spin briefly, then sleep. */
void seldp__nccl_backoff(unsigned *polls);

/* A non-blocking NCCL call returned: in progress and success are fine, anything else is
 * the rank's failure. */
static inline bool nccl_started(ncclResult_t r)
{
    return r == ncclSuccess || r == ncclInProgress;
}

/* Abort this rank's NCCL communicator; local, the handle becomes unusable. */
void seldp__nccl_abort_local(nccl_comm *c);

/* Record why this rank gives up, mark the world aborted, abort the rank's communicator and
 * return `status`. */
seldp_status seldp__nccl_fail_abort(nccl_comm *c, seldp_status status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/* In a function with `st`, `c` and a `fail:` label: give up and abort the world, so that
 * the ranks waiting for this one in the collective return at once. */
#define NCCL_FAIL_ABORT(...)                                                                       \
    do {                                                                                           \
        st = seldp__nccl_fail_abort(c, __VA_ARGS__);                                               \
        goto fail;                                                                                 \
    } while (0)

/* seldp__nccl_fail_abort with the message of an NCCL result, a CUDA error, an aborted world
 * (SELDP_ERR_ABORTED, without marking anything) or the timeout. */
seldp_status seldp__nccl_fail_nccl(nccl_comm *c, const char *what, ncclResult_t r);
seldp_status seldp__nccl_fail_cuda(nccl_comm *c, const char *what, cudaError_t err);
seldp_status seldp__nccl_fail_aborted(nccl_comm *c, const char *what);
seldp_status seldp__nccl_fail_timeout(nccl_comm *c, const char *what);
seldp_status seldp__nccl_fail_timeout_after(nccl_comm *c, const char *what, double timeout_s);

/* Wait until NCCL is done with what was issued on c and, with `stream`, until c's stream
 * has drained; aborts on a world abort, an NCCL or CUDA error or the timeout. */
seldp_status seldp__nccl_wait_done(nccl_comm *c, const char *what, bool stream);
/* The same against `timeout_s` instead of the world's (joins: seldp__nccl_join_timeout). */
seldp_status seldp__nccl_wait_within(nccl_comm *c, const char *what, bool stream, double timeout_s);
/* How long a join or a split waits: the world's timeout, at least
 * SELDP_NCCL_JOIN_TIMEOUT_MIN_S. */
double seldp__nccl_join_timeout(const nccl_comm *c);

/* Make the rank's device current and refuse to start on an aborted world. */
seldp_status seldp__nccl_enter(nccl_comm *c, const char *what);

/* A device buffer must be on this rank's GPU. */
seldp_status seldp__nccl_check_device_mem(nccl_comm *c, const char *what, seldp_device mem);

/* At least `bytes` of device staging (between collectives only); a smaller buffer is
 * retired, not freed. */
seldp_status seldp__nccl_ensure_staging(nccl_comm *c, size_t bytes);

/* Copy between host and device on the rank's stream and wait (no NCCL work pending). */
seldp_status seldp__nccl_copy_sync(nccl_comm *c, void *dst, const void *src, size_t bytes,
                                   enum cudaMemcpyKind kind);

/* NCCL's type for a seldp dtype; false when it has none. */
bool seldp__nccl_type(seldp_dtype dtype, ncclDataType_t *out);

/* ---- the collectives (nccl_collectives.c) and the fused reduction (nccl_reduce.c) ---- */

seldp_status seldp__nccl_barrier(seldp_comm *comm);
seldp_status seldp__nccl_broadcast(seldp_comm *comm, void *buf, size_t bytes, int root,
                                   seldp_device mem);
seldp_status seldp__nccl_allreduce(seldp_comm *comm, const void *send, void *recv, size_t count,
                                   seldp_dtype dtype, seldp_device mem);
seldp_status seldp__nccl_allgather(seldp_comm *comm, const void *send, void *recv, size_t bytes,
                                   seldp_device mem);
seldp_status seldp__nccl_allgatherv(seldp_comm *comm, const void *send, size_t send_bytes,
                                    void **recv, size_t *recv_bytes);
seldp_status seldp__nccl_alltoallv(seldp_comm *comm, const void *send, const size_t *send_bytes,
                                   const size_t *send_displs, void *recv, const size_t *recv_bytes,
                                   const size_t *recv_displs, seldp_device mem, size_t send_extent,
                                   size_t recv_extent);
seldp_status seldp__nccl_reduce_fused(seldp_comm *comm, const seldp__reduce_fused_args *args);
seldp_status seldp__nccl_reduce_scatter(seldp_comm *comm, const void *send, void *recv,
                                        const size_t *recv_counts, seldp_dtype dtype,
                                        seldp_device mem);
seldp_status seldp__nccl_allgather_counts(seldp_comm *comm, const void *send, void *recv,
                                          const size_t *counts, seldp_dtype dtype,
                                          seldp_device mem);

/* The memory the fused reduction works over (seldp_comm_ops.fused_memory): the rank's GPU,
 * whose segments it converts, sums and scales in place with one launch each way, and the
 * host, whose segments it stages through pinned memory; not another GPU. */
bool seldp__nccl_fused_memory(const seldp_comm *comm, seldp_device mem, char *needs, size_t size);

/* The transport's table (nccl.c), for tests that look at what it offers without a GPU. */
const seldp_comm_ops *seldp__nccl_ops(void);

/* Sort a fused reduction's segments into GPU and host ones (c->reduce.side) and make the
 * communicator's buffers big enough for it, growing them only when they are not; local,
 * nothing is launched. Fails on a segment on another GPU, or with its contribution and
 * its result on different sides. */
seldp_status seldp__nccl_reduce_prepare(nccl_comm *c, const seldp__reduce_fused_args *args,
                                        seldp__nccl_reduce_plan *plan);

/* The reduction's buffers handed to `into` (NULL: freed, at teardown). */
void seldp__nccl_reduce_release(seldp__nccl_reduce_buffers *b, seldp__retired *into);

#endif
