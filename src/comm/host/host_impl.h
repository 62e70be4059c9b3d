/* The host-staged transport's shared state (private to src/comm/host/).
 *
 * The transport is cut along its seams:
 *   host.c             worlds, groups, communicators, split, abort, destroy, staging
 *   host_rendezvous.c  the phases of a collective: publish, agree, wait, give up, leave
 *   host_collectives.c what moves in the execute step of each collective
 *   host_shard.c       the same for the sharded ones: reduce-scatter, all-gather of blocks
 *   host_fault.c       fault injection for the tests (host_fault.h)
 * Below it, in src/simd/: host_sum.c, the SIMD kernels of the reductions (host_sum.h), and
 * host_copy.c, the streaming copy of large payloads (host_copy.h).
 * See host_rendezvous.c for how a collective runs. */
#ifndef SELDP_HOST_IMPL_H
#define SELDP_HOST_IMPL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "comm/comm_impl.h"
#include "comm/protocol.h"
#include "device.h"
#include "seldp/host.h"

typedef struct host_group host_group;

/* A rank's cell: what it publishes for one collective. Pointers are host memory (staged). Each
 * cell has cache lines of its own, so that ranks publishing at once do not contend. */
typedef struct host_cell {
    /* the call (comm/protocol.h): op, staged, root, bytes (broadcast and allgather: per
     * rank; allgatherv: this rank's blob), count (allreduce; fused: the elements of every
     * segment), dtype, color and key (split), n_segs, bucket_elems and scale (fused) */
    _Alignas(64) seldp__call_header call;
    const void *send;
    void *recv;
    const size_t *send_bytes, *send_displs, *recv_bytes, *recv_displs; /* alltoallv */
    host_group *new_group;                    /* split: published by the new group's rank 0 */
    const seldp__reduce_fused_args *fused;    /* fused reduction */
    const size_t *seg_starts;                 /* fused: n_segs + 1 prefix sums of the counts */
    const size_t *counts;                     /* reduce_scatter, allgather_counts: per rank */
    const seldp__scatter_fused_args *scatter; /* fused reduce-scatter */
    const seldp__gather_fused_args *gather;   /* fused all-gather */
    bool finished; /* written before "leave": this rank's share of the execute step is done */
} host_cell;

/* A counter written by one rank, on a cache line of its own. */
typedef struct rank_counter {
    _Alignas(64) _Atomic uint64_t value;
    uint64_t withdrawn; /* entered: the count of the phase it gave up (under the lock) */
} rank_counter;

/* Collectives of at most this many bytes per rank take one phase instead of two: every
 * rank copies its input into its eager buffer before arriving and reads the others'
 * eager buffers, never their own buffers, so no rank waits for the others to leave.
 * Beyond a few cache lines, reading every rank's whole input costs more than the second
 * phase of the owner-of-slice path (measured on two cores: 8 B to 512 B). */
#define EAGER_MAX ((size_t)512)

/* Groups of up to this many ranks per core yield-spin before they sleep (see YIELD_NS in
 * host_rendezvous.c). */
#define YIELD_RANKS_PER_CPU 4

struct host_group {
    seldp_host_world *world;
    int size;
    int *world_ranks; /* group rank -> world rank */
    /* [2][size]: a collective uses the half of its parity (each rank counts its
     * collectives on the group), so a rank publishing its next collective never
     * overwrites a cell another rank may still read */
    host_cell *cells;
    unsigned char *eager;  /* [2][size][EAGER_MAX], by parity like the cells */
    rank_counter *entered; /* phases each rank has entered (see seldp__host_phase_wait) */
    _Alignas(64) atomic_int sleepers; /* ranks waiting on cond */
    _Alignas(64) int refs;            /* communicators holding the group */
    pthread_cond_t cond;
    host_group *next; /* the world's list of groups */
};

struct seldp_host_world {
    int nranks;
    double timeout_s;
    pthread_mutex_t lock;
    pthread_condattr_t condattr;
    host_group *groups; /* the world group first, then every split group alive */
    bool *joined;
    atomic_bool aborted;       /* written under the lock, read without it */
    seldp_status abort_status; /* SELDP_ERR_ABORTED or SELDP_ERR_TIMEOUT */
    char abort_reason[512];
    int spin_size;             /* groups of at most this many ranks (one core each) spin */
    int yield_size;            /* larger groups of at most this many ranks yield-spin */
    int simd;                  /* simd_width of the reduction kernels */
    atomic_bool faults_on;     /* set once by seldp__host_fault_set; read without the lock */
    struct host_fault *faults; /* [nranks] once faults_on, guarded by lock */
};

typedef struct host_comm {
    seldp_host_world *world;
    host_group *group;
    uint64_t collectives;       /* entered on this group: the parity of the current one */
    double stall_inside_s;      /* armed by SELDP__FAULT_STALL_INSIDE for the current collective */
    seldp__pinned_buffer stage; /* staging of device buffers (seldp__host_stage) */
} host_comm;

static inline host_comm *impl_of(const seldp_comm *comm)
{
    return comm->impl;
}

/* The cells of the group's current collective (see host_group). */
static inline host_cell *cells_of(const seldp_comm *comm)
{
    const host_comm *hc = impl_of(comm);
    return hc->group->cells + (size_t)((hc->collectives - 1) & 1) * (size_t)hc->group->size;
}

/* Rank r's eager buffer in the group's current collective. */
static inline unsigned char *eager_of(const seldp_comm *comm, int r)
{
    const host_comm *hc = impl_of(comm);
    size_t at = (size_t)((hc->collectives - 1) & 1) * (size_t)hc->group->size + (size_t)r;
    return hc->group->eager + at * EAGER_MAX;
}

/* ---- the rendezvous (host_rendezvous.c) ------------------------------------------ */

typedef enum seldp__host_wait_mode {
    WAIT_UNLESS_ABORTED, /* stop waiting when the world aborts or the timeout passes */
    WAIT_FOR_ALL         /* every rank has passed the previous phase and will arrive */
} seldp__host_wait_mode;

/* Runs this rank's share of a collective that reads and writes the other ranks' buffers;
 * false when it stopped early because the world was aborted (see seldp__host_pace). */
typedef bool (*seldp__host_execute_fn)(const seldp_comm *comm, void *arg);

/* Mark the world aborted (first reason wins) and wake every waiter. Caller holds w->lock. */
void seldp__host_world_abort_locked(seldp_host_world *w, seldp_status status, const char *reason);

/* Enter one phase of the group's rendezvous and wait for every rank of the group. */
seldp_status seldp__host_phase_wait(seldp_comm *comm, seldp__comm_op op,
                                    seldp__host_wait_mode mode);

/* Why the published cells of a collective do not agree, or SELDP_OK. */
seldp_status seldp__host_cells_agree(const seldp_comm *comm);

/* Publish this rank's cell and wait for the group (phase "arrive"). */
seldp_status seldp__host_collective_enter(seldp_comm *comm, const host_cell *cell);

/* Every rank has finished touching the others' buffers once this returns. */
seldp_status seldp__host_collective_leave(seldp_comm *comm, seldp__comm_op op);

/* Enter, check agreement, execute, leave. Returns the first failure. */
seldp_status seldp__host_collective_run(seldp_comm *comm, const host_cell *cell,
                                        seldp__host_execute_fn execute, void *arg);

/* A stall armed by SELDP__FAULT_STALL_INSIDE for this collective, if any. */
void seldp__host_stall_inside(const seldp_comm *comm);

/* Bytes an execute step moves between two looks at the abort flag: a rank that has
 * arrived holds access to the others' buffers, and they wait for it however late it is
 * (seldp__host_phase_wait), so it must notice an abort soon. Tens of microseconds of work. */
#define EXEC_PACE_BYTES ((size_t)256 << 10)

/* Payloads at least this large (bytes written by the whole collective) are stored with
 * non-temporal stores: they would not stay in the cache anyway, and streaming stores
 * skip the read-for-ownership of every output line, a third of the memory traffic. */
#define STREAM_MIN_BYTES ((size_t)8 << 20)

/* Elements of `esize` bytes of one piece of an owner's work over `size` ranks' buffers
 * between two looks at the abort flag. */
static inline size_t seldp__host_pace_elems(size_t esize, int size)
{
    size_t n = EXEC_PACE_BYTES / (esize * (size_t)size);
    return n < 1024 ? 1024 : n / 64 * 64;
}

/* The pace of one rank's execute step: seldp__host_pace() after each piece of work. */
typedef struct exec_pace {
    const seldp_comm *comm;
    size_t since; /* bytes since the last look */
} exec_pace;

/* Count `bytes` of work done; after every EXEC_PACE_BYTES, look at the abort flag. False
 * once the world is aborted: the caller stops touching the other ranks' buffers. */
bool seldp__host_pace(exec_pace *p, size_t bytes);

/* ---- the collectives (host_collectives.c) ------------------------------------------ */

/* A collective that the rendezvous runs in one phase, from the eager buffers into this
 * rank's own (see EAGER_MAX). */
void seldp__host_eager_execute(const seldp_comm *comm);

seldp_status seldp__host_barrier(seldp_comm *comm);
seldp_status seldp__host_broadcast(seldp_comm *comm, void *buf, size_t bytes, int root,
                                   seldp_device mem);
seldp_status seldp__host_allreduce(seldp_comm *comm, const void *send, void *recv, size_t count,
                                   seldp_dtype dtype, seldp_device mem);
seldp_status seldp__host_allgather(seldp_comm *comm, const void *send, void *recv, size_t bytes,
                                   seldp_device mem);
seldp_status seldp__host_allgatherv(seldp_comm *comm, const void *send, size_t send_bytes,
                                    void **recv, size_t *recv_bytes);
seldp_status seldp__host_alltoallv(seldp_comm *comm, const void *send, const size_t *send_bytes,
                                   const size_t *send_displs, void *recv, const size_t *recv_bytes,
                                   const size_t *recv_displs, seldp_device mem, size_t send_extent,
                                   size_t recv_extent);
seldp_status seldp__host_reduce_fused(seldp_comm *comm, const seldp__reduce_fused_args *args);

/* ---- the sharded collectives (host_shard.c) ---------------------------------------- */

seldp_status seldp__host_reduce_scatter(seldp_comm *comm, const void *send, void *recv,
                                        const size_t *recv_counts, seldp_dtype dtype,
                                        seldp_device mem);
seldp_status seldp__host_allgather_counts(seldp_comm *comm, const void *send, void *recv,
                                          const size_t *counts, seldp_dtype dtype,
                                          seldp_device mem);
seldp_status seldp__host_scatter_fused(seldp_comm *comm, const seldp__scatter_fused_args *args);
seldp_status seldp__host_gather_fused(seldp_comm *comm, const seldp__gather_fused_args *args);

/* ---- staging of device buffers (host.c) -------------------------------------------- */

/* One buffer of a collective on the caller's memory, and its host view. */
typedef struct host_stage_view {
    const void *ptr; /* the caller's buffer on `mem` */
    size_t bytes;
    bool fill;  /* copy the buffer's contents in (an input) */
    void *host; /* set by seldp__host_stage: where the collective reads and writes it */
} host_stage_view;

/* Host views of the `n` buffers of a collective on `mem`: each pointer itself for the host;
 * for a device, consecutive slices of the communicator's pinned staging buffer, filled from
 * the device where asked. The buffer grows to the largest collective seen and is freed
 * with the communicator, so that collectives of a steady size allocate no pinned memory.
 * The views stay valid until the communicator's next collective. On failure (out of pinned
 * memory, a failed device copy) every view is NULL. */
seldp_status seldp__host_stage(seldp_comm *comm, seldp_device mem, host_stage_view *views, int n);

/* ---- fault injection (host_fault.c) ------------------------------------------------- */

/* Count this collective; when it is the rank's armed point, act. Returns true when the
 * collective must not run, with its status in *st. Off the path of worlds without faults. */
bool seldp__host_fault_strike(seldp_comm *comm, seldp__comm_op op, seldp_status *st);

#endif
