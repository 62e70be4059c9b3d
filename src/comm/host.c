/* The host-staged transport: N in-process ranks that share memory.
 *
 * Every collective is a shared-memory rendezvous over the group's slot array:
 *   1. publish: each rank writes its arguments (buffer pointers, sizes) into its
 *      slot and waits until every rank of the group has arrived (phase "arrive");
 *   2. execute: each rank reads the others' buffers directly, since ranks share
 *      memory: an allreduce owner sums its slice of every input and writes it into
 *      every output, a broadcast owner copies its slice of the root into every other
 *      rank, so each byte is read and written once, by all the cores together (large
 *      payloads with non-temporal stores); the fused reduction of the sessions does the
 *      same over many tensors, with half upcasts and the 1/W scale in the same pass;
 *   3. leave: wait once more (phase "leave") so that no rank returns, and reuses or
 *      frees a buffer, while another is still reading or writing it.
 * The timeout bounds arrival. A rank that has arrived holds access to the others' buffers
 * until it leaves, so it is waited for however late it is: at the timeout the waiters
 * abort the world, and a rank inside looks at the abort flag between chunks of its work
 * (every EXEC_PACE_BYTES) and stops. Each rank says in its slot whether it finished its
 * share; after "leave" every rank reads the same answer: success, or the world's abort
 * (outputs are then incomplete). A rank that never arrived, or arrives after the others
 * gave up, returns an error and touches nothing.
 * Collectives of at most EAGER_MAX bytes per rank (and barriers) skip "leave": the ranks
 * exchange copies of their inputs instead of reading one another's buffers.
 * Phases are counted without the lock (see phase_wait): every rank announces its arrival
 * on a cache line of its own and watches the others'; in a group with a core per rank
 * waiters spin briefly before sleeping. Every wait has a deadline on CLOCK_MONOTONIC; a
 * rank that times out marks the whole world aborted so that every rank of every group
 * returns.
 *
 * One mutex per world guards the rest of the rendezvous state (abort reason, reference
 * counts, sleeping); each group has its own condition variable. Data moves outside
 * the lock. Device buffers are staged through pinned host memory before "arrive"
 * and copied back after "leave", so the execute step only ever touches host memory. */
#define _POSIX_C_SOURCE 200809L /* pthread_condattr_setclock, clock_gettime */

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif
/* AVX2 and AVX-512 kernels compiled beside the baseline ones and chosen at run time. */
#if defined(__x86_64__) && defined(__GNUC__)
#define HOST_AVX2 1
#include <immintrin.h>
#else
#define HOST_AVX2 0
#endif

#include "comm/comm_impl.h"
#include "comm/host_fault.h"
#include "device.h"
#include "internal.h"
#include "seldp/host.h"

typedef struct host_group host_group;

/* What one rank publishes for one collective. Pointers are host memory (staged). Each
 * slot has cache lines of its own, so that ranks publishing at once do not contend. */
typedef struct host_slot {
    _Alignas(64) seldp__comm_op op;
    seldp_status staged; /* SELDP_OK, or why this rank could not prepare its buffers */
    const void *send;
    void *recv;
    size_t bytes; /* broadcast and allgather: per rank; allgatherv: this rank's blob */
    size_t count; /* allreduce */
    seldp_dtype dtype;
    int root;
    const size_t *send_bytes, *send_displs, *recv_bytes, *recv_displs; /* alltoallv */
    int color, key;                                                    /* split */
    host_group *new_group;                 /* split: published by the new group's rank 0 */
    const seldp__reduce_fused_args *fused; /* fused reduction; count holds its elements */
    const size_t *seg_starts;              /* fused: n_segs + 1 prefix sums of the counts */
    bool finished; /* written before "leave": this rank's share of the execute step is done */
} host_slot;

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

struct host_group {
    seldp_host_world *world;
    int size;
    int *world_ranks; /* group rank -> world rank */
    /* [2][size]: a collective uses the half of its parity (each rank counts its
     * collectives on the group), so a rank publishing its next collective never
     * overwrites a slot another rank may still read */
    host_slot *slots;
    unsigned char *eager;             /* [2][size][EAGER_MAX], by parity like the slots */
    rank_counter *entered;            /* phases each rank has entered (see phase_wait) */
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
    int simd;                  /* simd_width of the reduction kernels */
    atomic_bool faults_on;     /* set once by seldp__host_fault_set; read without the lock */
    struct host_fault *faults; /* [nranks] once faults_on, guarded by lock */
};

typedef struct host_comm {
    seldp_host_world *world;
    host_group *group;
    uint64_t collectives;  /* entered on this group: the parity of the current one */
    double stall_inside_s; /* armed by SELDP__FAULT_STALL_INSIDE for the current collective */
} host_comm;

static const seldp_comm_ops host_ops;

static host_comm *impl_of(const seldp_comm *comm)
{
    return comm->impl;
}

/* The slots of the group's current collective (see host_group). */
static host_slot *slots_of(const seldp_comm *comm)
{
    const host_comm *hc = impl_of(comm);
    return hc->group->slots + (size_t)((hc->collectives - 1) & 1) * (size_t)hc->group->size;
}

/* Rank r's eager buffer in the group's current collective. */
static unsigned char *eager_of(const seldp_comm *comm, int r)
{
    const host_comm *hc = impl_of(comm);
    size_t at = (size_t)((hc->collectives - 1) & 1) * (size_t)hc->group->size + (size_t)r;
    return hc->group->eager + at * EAGER_MAX;
}

/* ---- groups ------------------------------------------------------------------ */

/* A group of `size` ranks with `refs` holders, linked into the world. Caller holds no lock. */
static host_group *group_new(seldp_host_world *w, int size, const int *world_ranks, int refs)
{
    /* aligned_alloc: the counters and slots have cache lines of their own */
    host_group *g = aligned_alloc(64, (sizeof *g + 63) / 64 * 64);
    if (!g)
        return NULL;
    memset(g, 0, sizeof *g);
    g->world = w;
    g->size = size;
    g->refs = refs;
    g->world_ranks = malloc((size_t)size * sizeof *g->world_ranks);
    g->slots = aligned_alloc(64, 2 * (size_t)size * sizeof *g->slots);
    g->eager = aligned_alloc(64, 2 * (size_t)size * EAGER_MAX);
    g->entered = aligned_alloc(64, (size_t)size * sizeof *g->entered);
    if (!g->world_ranks || !g->slots || !g->eager || !g->entered ||
        pthread_cond_init(&g->cond, &w->condattr) != 0) {
        free(g->world_ranks);
        free(g->slots);
        free(g->eager);
        free(g->entered);
        free(g);
        return NULL;
    }
    memset(g->slots, 0, 2 * (size_t)size * sizeof *g->slots);
    memset(g->entered, 0, (size_t)size * sizeof *g->entered);
    memcpy(g->world_ranks, world_ranks, (size_t)size * sizeof *g->world_ranks);
    pthread_mutex_lock(&w->lock);
    /* Keep the world group at the head. */
    host_group **at = w->groups ? &w->groups->next : &w->groups;
    g->next = *at;
    *at = g;
    pthread_mutex_unlock(&w->lock);
    return g;
}

static void group_free(host_group *g)
{
    pthread_cond_destroy(&g->cond);
    free(g->world_ranks);
    free(g->slots);
    free(g->eager);
    free(g->entered);
    free(g);
}

/* Drop one holder; the last one unlinks and frees a split group. Caller holds w->lock. */
static void group_release_locked(host_group *g)
{
    seldp_host_world *w = g->world;
    if (--g->refs > 0 || g == w->groups)
        return;
    for (host_group **p = &w->groups; *p; p = &(*p)->next) {
        if (*p == g) {
            *p = g->next;
            break;
        }
    }
    group_free(g);
}

/* ---- abort and waiting ----------------------------------------------------------- */

/* Mark the world aborted (first reason wins) and wake every waiter. Caller holds w->lock. */
static void world_abort_locked(seldp_host_world *w, seldp_status status, const char *reason)
{
    if (!atomic_load(&w->aborted)) {
        atomic_store(&w->aborted, true);
        w->abort_status = status;
        snprintf(w->abort_reason, sizeof w->abort_reason, "%s", reason);
    }
    for (host_group *g = w->groups; g; g = g->next)
        pthread_cond_broadcast(&g->cond);
}

static seldp_status aborted_error_locked(const seldp_comm *comm, seldp__comm_op op)
{
    seldp_host_world *w = impl_of(comm)->world;
    return seldp__fail(w->abort_status, "rank %d: %s aborted: %s", comm->rank,
                       seldp__comm_op_name(op), w->abort_reason);
}

static struct timespec deadline_after(double seconds)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    /* Clamp so that a huge timeout cannot overflow time_t. */
    if (!(seconds < 1e9))
        seconds = 1e9;
    double whole = floor(seconds);
    ts.tv_sec += (time_t)whole;
    ts.tv_nsec += (long)((seconds - whole) * 1e9);
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    return ts;
}

/* Append the ranks of `g` other than `self` that have not entered phase `gen` ("3, 5") to
 * buf: in world numbering, or in group numbering with the world rank beside it for a split
 * group. Returns how many there are. Caller holds w->lock. */
static int missing_ranks(const host_group *g, int self, uint64_t gen, bool world_numbering,
                         char *buf, size_t size)
{
    bool split = g != g->world->groups;
    int n = 0;
    size_t used = strlen(buf);
    for (int r = 0; r < g->size; r++) {
        /* a rank that arrived and gave up is not missing */
        if (r == self || atomic_load_explicit(&g->entered[r].value, memory_order_relaxed) > gen ||
            g->entered[r].withdrawn == gen + 1)
            continue;
        int wr = g->world_ranks[r];
        if (used < size) {
            if (world_numbering || !split)
                used += (size_t)snprintf(buf + used, size - used, "%s%d", n ? ", " : "",
                                         world_numbering ? wr : r);
            else
                used += (size_t)snprintf(buf + used, size - used, "%s%d (world rank %d)",
                                         n ? ", " : "", r, wr);
        }
        n++;
    }
    return n;
}

typedef enum wait_mode {
    WAIT_UNLESS_ABORTED, /* stop waiting when the world aborts or the timeout passes */
    WAIT_FOR_ALL         /* every rank has passed the previous phase and will arrive */
} wait_mode;

/* How long a waiter spins before it sleeps on the condition variable: long enough to
 * catch a rank a few microseconds behind (small collectives are latency-bound, and a
 * futex wake-up costs tens of microseconds), short enough to waste little when a rank
 * is far behind. */
#define SPIN_NS 20000L

static void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static bool every_rank_entered(host_group *g, uint64_t phases)
{
    for (int q = 0; q < g->size; q++)
        if (atomic_load(&g->entered[q].value) < phases)
            return false;
    return true;
}

/* Whether phase `phases - 1` has completed: two scans in a row see every rank in it. A rank
 * that gives up takes its entry back (give_up); the second scan makes sure that no rank gave
 * up between this rank's first look at it and its look at the others. */
static bool phase_complete(host_group *g, uint64_t phases)
{
    return every_rank_entered(g, phases) && every_rank_entered(g, phases);
}

/* Spin, without the lock, until the phase completes (true) or SPIN_NS have passed. */
static bool spin_until(host_group *g, uint64_t phases)
{
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        for (int i = 0; i < 16; i++) {
            if (phase_complete(g, phases))
                return true;
            cpu_relax();
        }
        clock_gettime(CLOCK_MONOTONIC, &t);
        if ((t.tv_sec - t0.tv_sec) * 1000000000L + (t.tv_nsec - t0.tv_nsec) > SPIN_NS)
            return false;
    }
}

/* Take this rank's entry in phase `phases - 1` back, unless every other rank has entered
 * it, in which case the phase is complete and the entry stays. True when this rank is out
 * of the phase. Caller holds w->lock, so that ranks give up one at a time. */
static bool give_up(host_group *g, int rank, uint64_t phases)
{
    atomic_store(&g->entered[rank].value, phases - 1);
    for (int q = 0; q < g->size; q++) {
        if (q != rank && atomic_load(&g->entered[q].value) < phases) {
            g->entered[rank].withdrawn = phases;
            return true;
        }
    }
    atomic_store(&g->entered[rank].value, phases);
    return false;
}

/* The timeout of a WAIT_FOR_ALL phase passed with `missing` ranks of `g` still inside the
 * collective (they had arrived and may be reading or writing this rank's buffers): abort
 * the world so that they stop at their next chunk, and say who they are. The caller keeps
 * waiting for them. Caller holds w->lock. */
static seldp_status stalled_inside_locked(seldp_comm *comm, seldp__comm_op op, uint64_t phase)
{
    host_comm *hc = impl_of(comm);
    seldp_host_world *w = hc->world;
    host_group *g = hc->group;
    char who[256] = "", world_who[200] = "", reason[512];
    int missing = missing_ranks(g, comm->rank, phase, false, who, sizeof who);
    missing_ranks(g, comm->rank, phase, true, world_who, sizeof world_who);
    snprintf(reason, sizeof reason,
             "rank %d timed out after %g s in %s: %s %s stalled inside it (every rank had "
             "arrived)",
             comm->world_rank, w->timeout_s, seldp__comm_op_name(op),
             missing > 1 ? "ranks" : "rank", world_who);
    world_abort_locked(w, SELDP_ERR_TIMEOUT, reason);
    return seldp__fail(SELDP_ERR_TIMEOUT,
                       "rank %d: %s timed out after %g s: %s %s stalled inside it (every rank "
                       "of the %d had arrived; this rank waited for %s to stop touching its "
                       "buffers)",
                       comm->rank, seldp__comm_op_name(op), w->timeout_s,
                       missing > 1 ? "ranks" : "rank", who, g->size, missing > 1 ? "them" : "it");
}

/* Enter one phase of the group's rendezvous and wait for every rank of the group.
 * Under WAIT_FOR_ALL neither an abort nor the timeout stops the wait: every rank has
 * arrived and may be reading or writing this rank's buffers, which the caller could free
 * or reuse once it returns. At the timeout the world is aborted instead, so that the
 * ranks still inside stop at their next chunk (see exec_pace), and the wait goes on.
 *
 * Every rank counts the phases it has entered on a cache line of its own (entered[]),
 * and every rank goes through the same phases, so phase k has completed once every
 * counter reaches k + 1: a rank enters with one store and waits by reading the others'
 * lines, without a lock or a contended read-modify-write. A rank that gives up (timeout,
 * abort) does so under the lock: it takes its entry back, then looks at the others; if
 * they have all entered, the phase completed and it stays. A rank sees the phase
 * complete only when two scans in a row find every rank in it, so either every rank sees
 * it complete or none does (the stores and loads are sequentially consistent). Waiters
 * spin first when the group has a core per rank, then sleep on the condition variable,
 * which every arriving rank signals when someone sleeps. */
static seldp_status phase_wait(seldp_comm *comm, seldp__comm_op op, wait_mode mode)
{
    host_comm *hc = impl_of(comm);
    seldp_host_world *w = hc->world;
    host_group *g = hc->group;
    seldp_status st = SELDP_OK;

    if (mode == WAIT_UNLESS_ABORTED && atomic_load(&w->aborted)) {
        pthread_mutex_lock(&w->lock);
        st = aborted_error_locked(comm, op);
        pthread_mutex_unlock(&w->lock);
        return st;
    }
    uint64_t phase = atomic_load_explicit(&g->entered[comm->rank].value, memory_order_relaxed);
    uint64_t phases = phase + 1;
    atomic_store(&g->entered[comm->rank].value, phases);
    if (atomic_load(&g->sleepers)) {
        pthread_mutex_lock(&w->lock);
        pthread_cond_broadcast(&g->cond);
        pthread_mutex_unlock(&w->lock);
    }
    if (phase_complete(g, phases) || (g->size <= w->spin_size && spin_until(g, phases)))
        return SELDP_OK;

    pthread_mutex_lock(&w->lock);
    atomic_fetch_add(&g->sleepers, 1);
    struct timespec deadline = deadline_after(w->timeout_s);
    bool overdue = false;
    while (!phase_complete(g, phases) && (mode == WAIT_FOR_ALL || !atomic_load(&w->aborted))) {
        int rc = pthread_cond_timedwait(&g->cond, &w->lock, &deadline);
        if (rc == ETIMEDOUT && mode == WAIT_FOR_ALL) {
            if (!overdue)
                st = stalled_inside_locked(comm, op, phase);
            overdue = true;
            /* look again now and then: the ranks inside signal when they enter, but a
             * look costs nothing once the collective has failed */
            deadline = deadline_after(0.05);
            continue;
        }
        if (rc == ETIMEDOUT && give_up(g, comm->rank, phases)) {
            /* The phase will never complete: this rank is out of it. */
            char who[256] = "", reason[512];
            int missing = missing_ranks(g, comm->rank, phase, false, who, sizeof who);
            char world_who[200] = "";
            missing_ranks(g, comm->rank, phase, true, world_who, sizeof world_who);
            snprintf(reason, sizeof reason, "rank %d timed out after %g s in %s waiting for %s %s",
                     comm->world_rank, w->timeout_s, seldp__comm_op_name(op),
                     missing > 1 ? "ranks" : "rank", world_who);
            world_abort_locked(w, SELDP_ERR_TIMEOUT, reason);
            st = seldp__fail(SELDP_ERR_TIMEOUT,
                             "rank %d: %s timed out after %g s: %s %s had not arrived (%d of %d "
                             "ranks missing)",
                             comm->rank, seldp__comm_op_name(op), w->timeout_s,
                             missing > 1 ? "ranks" : "rank", who, missing, g->size);
            goto out;
        }
    }
    if (mode == WAIT_UNLESS_ABORTED && !phase_complete(g, phases) && give_up(g, comm->rank, phases))
        st = aborted_error_locked(comm, op);
out:
    atomic_fetch_sub(&g->sleepers, 1);
    pthread_mutex_unlock(&w->lock);
    return st;
}

/* ---- fault injection (src/comm/host_fault.h) ---------------------------------------- */

typedef struct host_fault {
    uint64_t entered; /* collectives this world rank has entered */
    uint64_t point;
    seldp__host_fault_action action;
    double stall_s; /* SELDP__FAULT_STALL_INSIDE: how long */
} host_fault;

/* Count this collective; when it is the rank's armed point, act. Returns true when the
 * collective must not run, with its status in *st. Off the path of worlds without faults. */
static bool fault_strike(seldp_comm *comm, seldp__comm_op op, seldp_status *st)
{
    seldp_host_world *w = impl_of(comm)->world;
    host_group *g = impl_of(comm)->group;
    char reason[160];
    bool skip = false;

    pthread_mutex_lock(&w->lock);
    host_fault *f = &w->faults[comm->world_rank];
    uint64_t point = f->entered++;
    if (point != f->point || f->action == SELDP__FAULT_NONE)
        goto out;
    switch (f->action) {
    case SELDP__FAULT_ABORT:
        snprintf(reason, sizeof reason,
                 "rank %d aborted the world at collective point %llu (%s, injected fault)",
                 comm->world_rank, (unsigned long long)point, seldp__comm_op_name(op));
        world_abort_locked(w, SELDP_ERR_ABORTED, reason);
        *st = seldp__fail(SELDP_ERR_ABORTED, "rank %d: %s aborted: %s", comm->rank,
                          seldp__comm_op_name(op), reason);
        skip = true;
        break;
    case SELDP__FAULT_RETURN:
        *st = seldp__fail(SELDP_ERR_TRANSPORT,
                          "rank %d: %s: injected fault: returned early from collective point %llu",
                          comm->rank, seldp__comm_op_name(op), (unsigned long long)point);
        skip = true;
        break;
    case SELDP__FAULT_STALL: {
        /* The others give up at their timeout and abort the world, which wakes this wait. */
        struct timespec deadline = deadline_after(2.0 * w->timeout_s);
        while (!w->aborted && pthread_cond_timedwait(&g->cond, &w->lock, &deadline) != ETIMEDOUT)
            ;
        break;
    }
    case SELDP__FAULT_STALL_INSIDE:
        /* taken by the execute step after its first chunk (stall_inside) */
        impl_of(comm)->stall_inside_s = f->stall_s > 0 ? f->stall_s : 2.0 * w->timeout_s;
        break;
    default:
        break;
    }
out:
    pthread_mutex_unlock(&w->lock);
    return skip;
}

seldp_status seldp__host_fault_set(seldp_host_world *world, int rank, uint64_t point,
                                   seldp__host_fault_action action)
{
    if (!world || rank < 0 || rank >= world->nranks)
        return seldp__fail(SELDP_ERR_INVALID_ARGUMENT,
                           "host_fault_set: rank %d is outside the world", rank);
    if ((int)action < (int)SELDP__FAULT_NONE || (int)action > (int)SELDP__FAULT_STALL_INSIDE)
        return seldp__fail(SELDP_ERR_INVALID_ARGUMENT, "host_fault_set: unknown action %d",
                           (int)action);
    pthread_mutex_lock(&world->lock);
    if (!world->faults)
        world->faults = calloc((size_t)world->nranks, sizeof *world->faults);
    if (world->faults) {
        world->faults[rank].point = point;
        world->faults[rank].action = action;
        world->faults[rank].stall_s = 0.0;
        atomic_store(&world->faults_on, true);
    }
    pthread_mutex_unlock(&world->lock);
    if (!world->faults)
        return seldp__fail(SELDP_ERR_NOMEM, "host_fault_set: out of memory");
    return SELDP_OK;
}

seldp_status seldp__host_fault_set_stall(seldp_host_world *world, int rank, uint64_t point,
                                         double seconds)
{
    if (!(seconds > 0 && seconds < 3600))
        return seldp__fail(SELDP_ERR_INVALID_ARGUMENT,
                           "host_fault_set_stall: rank %d: stall of %g s, expected (0, 3600)", rank,
                           seconds);
    seldp_status st = seldp__host_fault_set(world, rank, point, SELDP__FAULT_STALL_INSIDE);
    if (st == SELDP_OK) {
        pthread_mutex_lock(&world->lock);
        world->faults[rank].stall_s = seconds;
        pthread_mutex_unlock(&world->lock);
    }
    return st;
}

seldp_status seldp__host_fault_set_timeout(seldp_host_world *world, double seconds)
{
    if (!world || !(seconds > 0))
        return seldp__fail(SELDP_ERR_INVALID_ARGUMENT,
                           "host_fault_set_timeout: %s, expected a world and a timeout > 0 s",
                           world ? "timeout <= 0" : "world is NULL");
    pthread_mutex_lock(&world->lock);
    world->timeout_s = seconds;
    pthread_mutex_unlock(&world->lock);
    return SELDP_OK;
}

uint64_t seldp__host_fault_count(seldp_host_world *world, int rank)
{
    uint64_t n = 0;
    if (!world || rank < 0 || rank >= world->nranks)
        return 0;
    pthread_mutex_lock(&world->lock);
    if (world->faults)
        n = world->faults[rank].entered;
    pthread_mutex_unlock(&world->lock);
    return n;
}

/* ---- the collective rendezvous --------------------------------------------------- */

/* Why the published slots of a collective do not agree, or SELDP_OK. Every rank reads
 * the same slots after "arrive", so every rank reaches the same verdict. */
static seldp_status slots_agree(const seldp_comm *comm)
{
    const host_group *g = impl_of(comm)->group;
    const host_slot *s = slots_of(comm);
    const host_slot *mine = &s[comm->rank];
    for (int r = 0; r < g->size; r++) {
        if (s[r].op != mine->op)
            return seldp__fail(SELDP_ERR_DISAGREE,
                               "rank %d: %s: rank %d called %s at the same point, expected every "
                               "rank to call %s",
                               comm->rank, seldp__comm_op_name(mine->op), r,
                               seldp__comm_op_name(s[r].op), seldp__comm_op_name(mine->op));
    }
    for (int r = 0; r < g->size; r++) {
        if (s[r].staged != SELDP_OK)
            return seldp__fail(s[r].staged, "rank %d: %s: rank %d could not stage its buffers (%s)",
                               comm->rank, seldp__comm_op_name(mine->op), r,
                               seldp_status_name(s[r].staged));
    }
    for (int r = 0; r < g->size; r++) {
        const host_slot *o = &s[r];
        switch (mine->op) {
        case OP_BROADCAST:
            if (o->root != s[0].root || o->bytes != s[0].bytes)
                return seldp__fail(SELDP_ERR_DISAGREE,
                                   "rank %d: broadcast: rank 0 passed root %d and %zu bytes but "
                                   "rank %d root %d and %zu bytes",
                                   comm->rank, s[0].root, s[0].bytes, r, o->root, o->bytes);
            break;
        case OP_ALLREDUCE:
            if (o->count != s[0].count || o->dtype != s[0].dtype)
                return seldp__fail(SELDP_ERR_DISAGREE,
                                   "rank %d: allreduce: rank 0 passed %zu elements of %s but rank "
                                   "%d %zu of %s",
                                   comm->rank, s[0].count, seldp_dtype_name(s[0].dtype), r,
                                   o->count, seldp_dtype_name(o->dtype));
            break;
        case OP_ALLGATHER:
            if (o->bytes != s[0].bytes)
                return seldp__fail(SELDP_ERR_DISAGREE,
                                   "rank %d: allgather: rank 0 passed %zu bytes but rank %d %zu",
                                   comm->rank, s[0].bytes, r, o->bytes);
            break;
        case OP_REDUCE_FUSED:
            if (o->count != s[0].count || o->fused->n_segs != s[0].fused->n_segs ||
                o->fused->bucket_elems != s[0].fused->bucket_elems ||
                o->fused->scale != s[0].fused->scale)
                return seldp__fail(SELDP_ERR_DISAGREE,
                                   "rank %d: reduction: rank 0 passed %zu tensors of %zu elements "
                                   "(buckets of %zu, scale %g) but rank %d %zu of %zu (buckets of "
                                   "%zu, scale %g)",
                                   comm->rank, s[0].fused->n_segs, s[0].count,
                                   s[0].fused->bucket_elems, s[0].fused->scale, r, o->fused->n_segs,
                                   o->count, o->fused->bucket_elems, o->fused->scale);
            for (size_t j = 0; j < o->fused->n_segs; j++) {
                const seldp__reduce_seg *a = &s[0].fused->segs[j], *b = &o->fused->segs[j];
                if (a->count != b->count || a->out_dtype != b->out_dtype)
                    return seldp__fail(SELDP_ERR_DISAGREE,
                                       "rank %d: reduction: tensor %zu is %zu elements of %s on "
                                       "rank 0 but %zu of %s on rank %d",
                                       comm->rank, j, a->count, seldp_dtype_name(a->out_dtype),
                                       b->count, seldp_dtype_name(b->out_dtype), r);
            }
            break;
        case OP_ALLTOALLV:
            for (int p = 0; p < g->size; p++) {
                if (o->send_bytes[p] != s[p].recv_bytes[r])
                    return seldp__fail(SELDP_ERR_DISAGREE,
                                       "rank %d: alltoallv: rank %d sends %zu bytes to rank %d, "
                                       "which expects %zu",
                                       comm->rank, r, o->send_bytes[p], p, s[p].recv_bytes[r]);
            }
            break;
        default:
            break;
        }
    }
    return SELDP_OK;
}

/* Whether a collective takes one phase, and the bytes of its eager buffers (see
 * EAGER_MAX): this rank's input, or the root's for a broadcast. Every rank computes the
 * same answer once the slots agree. */
static bool eager_op(const host_slot *slot)
{
    switch (slot->op) {
    case OP_INIT:
    case OP_BARRIER:
        return true;
    case OP_BROADCAST:
    case OP_ALLGATHER:
        return slot->bytes <= EAGER_MAX;
    case OP_ALLREDUCE:
        return slot->count <= EAGER_MAX / seldp_dtype_size(slot->dtype);
    default:
        return false;
    }
}

static size_t eager_bytes(const host_slot *slot)
{
    if (!eager_op(slot) || slot->staged != SELDP_OK)
        return 0;
    return slot->op == OP_ALLREDUCE ? slot->count * seldp_dtype_size(slot->dtype) : slot->bytes;
}

/* The one place every collective of this transport enters: publish this rank's slot
 * and wait for the group. A fault-injection point for a collective belongs here. */
static seldp_status collective_enter(seldp_comm *comm, const host_slot *slot)
{
    host_comm *hc = impl_of(comm);
    seldp_status struck;
    if (atomic_load_explicit(&hc->world->faults_on, memory_order_relaxed) &&
        fault_strike(comm, slot->op, &struck))
        return struck;
    /* A collective of an aborted world fails at once, without publishing anything: an
     * earlier collective failed, so the others may never have finished with the slot. */
    if (atomic_load(&hc->world->aborted))
        return phase_wait(comm, slot->op, WAIT_UNLESS_ABORTED);
    /* No other rank reads this slot before the arrival below publishes it, and every rank
     * finished reading its contents of two collectives ago before arriving at the last. */
    hc->collectives++;
    slots_of(comm)[comm->rank] = *slot;
    size_t eager = eager_bytes(slot);
    if (eager && (slot->op != OP_BROADCAST || comm->rank == slot->root))
        memcpy(eager_of(comm, comm->rank), slot->send, eager);
    return phase_wait(comm, slot->op, WAIT_UNLESS_ABORTED);
}

/* Every rank has finished touching the others' buffers once this returns. */
static seldp_status collective_leave(seldp_comm *comm, seldp__comm_op op)
{
    return phase_wait(comm, op, WAIT_FOR_ALL);
}

/* Runs this rank's share of a collective that reads and writes the other ranks' buffers;
 * false when it stopped early because the world was aborted (see exec_pace). */
typedef bool (*execute_fn)(const seldp_comm *comm, void *arg);

static void eager_execute(const seldp_comm *comm);

/* A stall armed by SELDP__FAULT_STALL_INSIDE for this collective: sleep, holding access to
 * the other ranks' buffers, as a descheduled or stopped thread would. */
static void stall_inside(const seldp_comm *comm)
{
    host_comm *hc = impl_of(comm);
    double s = hc->stall_inside_s;
    if (!(s > 0))
        return;
    hc->stall_inside_s = 0.0;
    struct timespec ts = {(time_t)s, (long)((s - floor(s)) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

/* Bytes an execute step moves between two looks at the abort flag: a rank that has
 * arrived holds access to the others' buffers, and they wait for it however late it is
 * (phase_wait), so it must notice an abort soon. Tens of microseconds of work. */
#define EXEC_PACE_BYTES ((size_t)256 << 10)

/* The pace of one rank's execute step: pace() after each piece of work. */
typedef struct exec_pace {
    const seldp_comm *comm;
    size_t since; /* bytes since the last look */
} exec_pace;

/* Count `bytes` of work done; after every EXEC_PACE_BYTES, look at the abort flag. False
 * once the world is aborted: the caller stops touching the other ranks' buffers. */
static bool pace(exec_pace *p, size_t bytes)
{
    p->since += bytes;
    if (p->since < EXEC_PACE_BYTES)
        return true;
    p->since = 0;
    stall_inside(p->comm);
    return !atomic_load_explicit(&impl_of(p->comm)->world->aborted, memory_order_relaxed);
}

/* Whether every rank of the group finished its share of the collective just left: the same
 * answer on every rank, read from the slots after "leave". */
static bool every_share_finished(const seldp_comm *comm)
{
    const host_slot *s = slots_of(comm);
    for (int r = 0; r < comm->size; r++)
        if (!s[r].finished)
            return false;
    return true;
}

/* The status of a collective every rank has left, from what every rank sees alike: success
 * when every share finished, else the world's abort (a rank stopped early, so some outputs
 * are incomplete). `left` is this rank's "leave" status: its own timeout message when it
 * was the rank that gave the ones inside up. */
static seldp_status collective_verdict(seldp_comm *comm, seldp__comm_op op, seldp_status left)
{
    if (every_share_finished(comm))
        return SELDP_OK;
    seldp_host_world *w = impl_of(comm)->world;
    pthread_mutex_lock(&w->lock);
    seldp_status st = w->abort_status;
    if (left == SELDP_OK || left != st)
        st = aborted_error_locked(comm, op);
    pthread_mutex_unlock(&w->lock);
    return st;
}

/* Enter, check agreement, execute, leave. Returns the first failure. A small collective
 * that every rank agrees on runs from the eager buffers and needs no "leave". */
static seldp_status collective_run(seldp_comm *comm, const host_slot *slot, execute_fn execute,
                                   void *arg)
{
    seldp_status st = collective_enter(comm, slot);
    if (st != SELDP_OK)
        return st;
    char why[1024] = "";
    seldp_status agreed = slots_agree(comm);
    if (agreed == SELDP_OK && eager_op(slot)) {
        eager_execute(comm);
        stall_inside(comm); /* after the work: no other rank waits for this one */
        return SELDP_OK;
    }
    bool finished = true;
    if (agreed == SELDP_OK && execute)
        finished = execute(comm, arg);
    else if (agreed != SELDP_OK)
        snprintf(why, sizeof why, "%s", seldp_last_error());
    stall_inside(comm); /* an armed stall the execute step did not take */
    slots_of(comm)[comm->rank].finished = finished;
    st = collective_leave(comm, slot->op);
    if (agreed != SELDP_OK) {
        seldp__set_error(why);
        return agreed;
    }
    return collective_verdict(comm, slot->op, st);
}

/* ---- staging of device buffers ----------------------------------------------------- */

/* A host view of `bytes` at `ptr` on `mem`: the pointer itself for the host, else a
 * pinned buffer, filled from the device when `fill`. Release with stage_release. */
static seldp_status stage_in(const void *ptr, size_t bytes, seldp_device mem, bool fill,
                             void **host)
{
    if (mem.kind == SELDP_DEVICE_HOST) {
        *host = (void *)ptr;
        return SELDP_OK;
    }
    seldp_status st = seldp__pinned_alloc(bytes, host);
    if (st == SELDP_OK && fill && bytes)
        st = seldp__device_copy(*host, SELDP_HOST_DEVICE, ptr, mem, bytes);
    if (st != SELDP_OK) {
        seldp__pinned_free(*host);
        *host = NULL;
    }
    return st;
}

static void stage_release(void *host, seldp_device mem)
{
    if (mem.kind != SELDP_DEVICE_HOST)
        seldp__pinned_free(host);
}

/* ---- moving memory ------------------------------------------------------------------ */

/* Elements per slice: an even share rounded up to whole cache lines, so that no two
 * owners write the same line of an output. */
static size_t slice_elems(size_t count, int size, size_t esize)
{
    size_t line = 64 / esize;
    size_t share = (count + (size_t)size - 1) / (size_t)size;
    return (share + line - 1) / line * line;
}

/* Payloads at least this large (bytes written by the whole collective) are stored with
 * non-temporal stores: they would not stay in the cache anyway, and streaming stores
 * skip the read-for-ownership of every output line, a third of the memory traffic. */
#define STREAM_MIN_BYTES ((size_t)8 << 20)

/* Copy with non-temporal stores where the destination allows it, else memcpy. Call
 * stream_fence before the collective's "leave" so that the data is visible. */
static void stream_copy(void *dst, const void *src, size_t bytes, bool stream)
{
#if defined(__SSE2__)
    if (stream && bytes >= 256) {
        size_t head = (16 - ((uintptr_t)dst & 15)) & 15;
        memcpy(dst, src, head);
        char *d = (char *)dst + head;
        const char *x = (const char *)src + head;
        size_t n = bytes - head, i = 0;
        for (; i + 64 <= n; i += 64) {
            __m128i a = _mm_loadu_si128((const __m128i *)(x + i));
            __m128i b = _mm_loadu_si128((const __m128i *)(x + i + 16));
            __m128i c = _mm_loadu_si128((const __m128i *)(x + i + 32));
            __m128i e = _mm_loadu_si128((const __m128i *)(x + i + 48));
            _mm_stream_si128((__m128i *)(d + i), a);
            _mm_stream_si128((__m128i *)(d + i + 16), b);
            _mm_stream_si128((__m128i *)(d + i + 32), c);
            _mm_stream_si128((__m128i *)(d + i + 48), e);
        }
        memcpy(d + i, x + i, n - i);
        return;
    }
#endif
    (void)stream;
    memcpy(dst, src, bytes);
}

static void stream_fence(bool stream)
{
#if defined(__SSE2__)
    if (stream)
        _mm_sfence();
#endif
    (void)stream;
}

/* ---- barrier, broadcast ------------------------------------------------------------- */

static seldp_status host_barrier(seldp_comm *comm)
{
    host_slot slot = {.op = OP_BARRIER};
    return collective_run(comm, &slot, NULL, NULL);
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
    const host_slot *s = slots_of(comm);
    size_t bytes = s[comm->rank].bytes;
    int root = s[comm->rank].root;
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
                stream_copy((char *)s[r].recv + at, src + at, n, stream);
        going = pace(&p, n * (size_t)(g->size - 1));
    }
    stream_fence(stream);
    return going;
}

static seldp_status host_broadcast(seldp_comm *comm, void *buf, size_t bytes, int root,
                                   seldp_device mem)
{
    bool is_root = comm->rank == root;
    void *host = NULL;
    host_slot slot = {.op = OP_BROADCAST, .bytes = bytes, .root = root};
    slot.staged = stage_in(buf, bytes, mem, is_root, &host);
    slot.send = host;
    slot.recv = host;
    seldp_status st = collective_run(comm, &slot, broadcast_execute, NULL);
    if (st == SELDP_OK && !is_root && mem.kind != SELDP_DEVICE_HOST)
        st = seldp__device_copy(buf, mem, host, SELDP_HOST_DEVICE, bytes);
    stage_release(host, mem);
    return st;
}

/* ---- allreduce ------------------------------------------------------------------------ */

/* Groups up to this size gather the ranks' pointers on the stack for the register
 * kernel; larger ones take the chunked path. */
#define FAST_RANKS 64

/* Elements per chunk of the chunked path: fully read from every rank before any output
 * is written, so in-place buffers (send == recv) are safe. */
#define REDUCE_CHUNK 1024

/* How an owner turns sums into results. */
/* The widest vectors this CPU has. */
typedef enum simd_width { SIMD_128, SIMD_256, SIMD_512 } simd_width;

/* The vector width the kernels use: the CPU's widest, or narrower when the environment
 * variable SELDP_HOST_SIMD says 128 or 256 (to test and compare the kernels). */
static simd_width simd_of_cpu(void)
{
    const char *force = getenv("SELDP_HOST_SIMD");
    simd_width cap = force && strcmp(force, "128") == 0   ? SIMD_128
                     : force && strcmp(force, "256") == 0 ? SIMD_256
                                                          : SIMD_512;
    simd_width have = SIMD_128;
#if HOST_AVX2
    if (__builtin_cpu_supports("avx512f"))
        have = SIMD_512;
    else if (__builtin_cpu_supports("avx2"))
        have = SIMD_256;
#endif
    return have < cap ? have : cap;
}

typedef struct sum_mode {
    bool scaled; /* multiply by scale, as seldp__scale_f32 does */
    double scale;
    bool stream;     /* non-temporal stores */
    simd_width simd; /* the world's, from simd_of_cpu */
} sum_mode;

static float sum_scale(float x, const sum_mode *m)
{
    return m->scaled ? (float)((double)x * m->scale) : x;
}

/* Element i of one rank's input (F32 or BF16; NULL counts as +0), exactly in F32. */
static float input_at(const void *in, seldp_dtype dtype, size_t i)
{
    if (!in)
        return 0.0f;
    return dtype == SELDP_F32 ? ((const float *)in)[i]
                              : seldp_bf16_to_f32(((const uint16_t *)in)[i]);
}

/* Element i summed over the ranks in rank order, then scaled. */
static float sum_at(int size, const void *const *in, const seldp_dtype *in_dtype, size_t i,
                    const sum_mode *m)
{
    float acc = input_at(in[0], in_dtype[0], i);
    for (int r = 1; r < size; r++)
        acc += input_at(in[r], in_dtype[r], i);
    return sum_scale(acc, m);
}

static void output_at(void *out, seldp_dtype dtype, size_t i, float v)
{
    if (dtype == SELDP_F32)
        ((float *)out)[i] = v;
    else
        ((uint16_t *)out)[i] = seldp_f32_to_bf16(v);
}

#if defined(__SSE2__)
static __m128 sum_scale4(__m128 x, const sum_mode *m)
{
    if (!m->scaled)
        return x;
    __m128d s = _mm_set1_pd(m->scale);
    __m128d lo = _mm_mul_pd(_mm_cvtps_pd(x), s);
    __m128d hi = _mm_mul_pd(_mm_cvtps_pd(_mm_movehl_ps(x, x)), s);
    return _mm_movelh_ps(_mm_cvtpd_ps(lo), _mm_cvtpd_ps(hi));
}

/* Elements i..i+15 of one rank's input as four F32 vectors: a BF16's bits are the top
 * half of its F32's, so widening is exact; NULL gives +0. */
static void load16(const void *in, seldp_dtype dtype, size_t i, __m128 v[4])
{
    if (!in) {
        v[0] = v[1] = v[2] = v[3] = _mm_setzero_ps();
    } else if (dtype == SELDP_F32) {
        const float *f = (const float *)in + i;
        for (int k = 0; k < 4; k++)
            v[k] = _mm_loadu_ps(f + 4 * k);
    } else {
        const uint16_t *h = (const uint16_t *)in + i;
        __m128i z = _mm_setzero_si128();
        __m128i lo = _mm_loadu_si128((const __m128i *)h);
        __m128i hi = _mm_loadu_si128((const __m128i *)(h + 8));
        v[0] = _mm_castsi128_ps(_mm_unpacklo_epi16(z, lo));
        v[1] = _mm_castsi128_ps(_mm_unpackhi_epi16(z, lo));
        v[2] = _mm_castsi128_ps(_mm_unpacklo_epi16(z, hi));
        v[3] = _mm_castsi128_ps(_mm_unpackhi_epi16(z, hi));
    }
}

/* seldp_f32_to_bf16 on four lanes: round to nearest even, a NaN stays a quiet NaN. The
 * result is sign-extended to 32 bits so that _mm_packs_epi32 keeps it exactly. */
static __m128i bf16x4(__m128 x)
{
    __m128i b = _mm_castps_si128(x);
    __m128i lsb = _mm_and_si128(_mm_srli_epi32(b, 16), _mm_set1_epi32(1));
    __m128i rounded =
        _mm_srli_epi32(_mm_add_epi32(_mm_add_epi32(b, _mm_set1_epi32(0x7fff)), lsb), 16);
    __m128i nan =
        _mm_cmpgt_epi32(_mm_and_si128(b, _mm_set1_epi32(0x7fffffff)), _mm_set1_epi32(0x7f800000));
    __m128i quiet = _mm_or_si128(_mm_srli_epi32(b, 16), _mm_set1_epi32(0x40));
    __m128i r = _mm_or_si128(_mm_and_si128(nan, quiet), _mm_andnot_si128(nan, rounded));
    return _mm_srai_epi32(_mm_slli_epi32(r, 16), 16);
}

/* A block of 16 results as the bytes of the output dtype, converted once for every output:
 * F32 in the four vectors, BF16 in the first two. */
static void encode16(seldp_dtype dtype, const __m128 v[4], __m128i e[4])
{
    if (dtype == SELDP_F32) {
        for (int k = 0; k < 4; k++)
            e[k] = _mm_castps_si128(v[k]);
    } else {
        e[0] = _mm_packs_epi32(bf16x4(v[0]), bf16x4(v[1]));
        e[1] = _mm_packs_epi32(bf16x4(v[2]), bf16x4(v[3]));
    }
}

static void store16(void *out, seldp_dtype dtype, size_t i, const __m128i e[4], bool stream)
{
    __m128i *to = (__m128i *)((char *)out + i * seldp_dtype_size(dtype));
    for (int k = 0; k < (dtype == SELDP_F32 ? 4 : 2); k++) {
        if (stream)
            _mm_stream_si128(to + k, e[k]);
        else
            _mm_storeu_si128(to + k, e[k]);
    }
}
/* Blocks of 16 elements from i while i + 16 <= n: 16 elements of every input in registers,
 * then the same 16 of every output, so that memory is read and written once. Returns the
 * first element left. */
static size_t sum_blocks_sse2(int size, const void *const *in, const seldp_dtype *in_dtype,
                              int outs, void *const *out, seldp_dtype out_dtype, size_t i, size_t n,
                              const sum_mode *m, uint64_t stream)
{
    for (; i + 16 <= n; i += 16) {
        __m128 acc[4], x[4];
        load16(in[0], in_dtype[0], i, acc);
        for (int r = 1; r < size; r++) {
            load16(in[r], in_dtype[r], i, x);
            for (int k = 0; k < 4; k++)
                acc[k] = _mm_add_ps(acc[k], x[k]);
        }
        for (int k = 0; k < 4; k++)
            acc[k] = sum_scale4(acc[k], m);
        __m128i e[4];
        encode16(out_dtype, acc, e);
        for (int r = 0; r < outs; r++)
            store16(out[r], out_dtype, i, e, stream >> r & 1);
    }
    return i;
}
#endif

#if HOST_AVX2
/* The same blocks with 256-bit vectors, for CPUs with AVX2 (half the instructions: the
 * scaling through doubles and the BF16 rounding make the 128-bit kernel compute-bound). */
#define AVX2 __attribute__((target("avx2")))

AVX2 static void load16_avx2(const void *in, seldp_dtype dtype, size_t i, __m256 v[2])
{
    if (!in) {
        v[0] = v[1] = _mm256_setzero_ps();
    } else if (dtype == SELDP_F32) {
        const float *f = (const float *)in + i;
        v[0] = _mm256_loadu_ps(f);
        v[1] = _mm256_loadu_ps(f + 8);
    } else {
        const uint16_t *h = (const uint16_t *)in + i;
        __m256i lo = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)h));
        __m256i hi = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(h + 8)));
        v[0] = _mm256_castsi256_ps(_mm256_slli_epi32(lo, 16));
        v[1] = _mm256_castsi256_ps(_mm256_slli_epi32(hi, 16));
    }
}

AVX2 static __m256 sum_scale8(__m256 x, const sum_mode *m)
{
    if (!m->scaled)
        return x;
    __m256d s = _mm256_set1_pd(m->scale);
    __m128 lo = _mm256_cvtpd_ps(_mm256_mul_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(x)), s));
    __m128 hi = _mm256_cvtpd_ps(_mm256_mul_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(x, 1)), s));
    return _mm256_insertf128_ps(_mm256_castps128_ps256(lo), hi, 1);
}

/* bf16x4 on eight lanes, the result zero-extended (for _mm256_packus_epi32). */
AVX2 static __m256i bf16x8(__m256 x)
{
    __m256i b = _mm256_castps_si256(x);
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(1));
    __m256i rounded = _mm256_srli_epi32(
        _mm256_add_epi32(_mm256_add_epi32(b, _mm256_set1_epi32(0x7fff)), lsb), 16);
    __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(b, _mm256_set1_epi32(0x7fffffff)),
                                     _mm256_set1_epi32(0x7f800000));
    __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(0x40));
    return _mm256_blendv_epi8(rounded, quiet, nan);
}

/* encode16 with 256-bit vectors: F32 in both, BF16 in the first. */
AVX2 static void encode16_avx2(seldp_dtype dtype, const __m256 v[2], __m256i e[2])
{
    if (dtype == SELDP_F32) {
        e[0] = _mm256_castps_si256(v[0]);
        e[1] = _mm256_castps_si256(v[1]);
    } else {
        /* packus works within 128-bit lanes: put the four quarters back in order */
        e[0] = _mm256_permute4x64_epi64(_mm256_packus_epi32(bf16x8(v[0]), bf16x8(v[1])), 0xd8);
    }
}

AVX2 static void store16_avx2(void *out, seldp_dtype dtype, size_t i, const __m256i e[2],
                              bool stream)
{
    __m256i *to = (__m256i *)((char *)out + i * seldp_dtype_size(dtype));
    for (int k = 0; k < (dtype == SELDP_F32 ? 2 : 1); k++) {
        if (stream)
            _mm256_stream_si256(to + k, e[k]);
        else
            _mm256_storeu_si256(to + k, e[k]);
    }
}

AVX2 static size_t sum_blocks_avx2(int size, const void *const *in, const seldp_dtype *in_dtype,
                                   int outs, void *const *out, seldp_dtype out_dtype, size_t i,
                                   size_t n, const sum_mode *m, uint64_t stream)
{
    for (; i + 16 <= n; i += 16) {
        __m256 acc[2], x[2];
        load16_avx2(in[0], in_dtype[0], i, acc);
        for (int r = 1; r < size; r++) {
            load16_avx2(in[r], in_dtype[r], i, x);
            acc[0] = _mm256_add_ps(acc[0], x[0]);
            acc[1] = _mm256_add_ps(acc[1], x[1]);
        }
        acc[0] = sum_scale8(acc[0], m);
        acc[1] = sum_scale8(acc[1], m);
        __m256i e[2];
        encode16_avx2(out_dtype, acc, e);
        for (int r = 0; r < outs; r++)
            store16_avx2(out[r], out_dtype, i, e, stream >> r & 1);
    }
    return i;
}
#endif
#if HOST_AVX2
/* The same blocks with 512-bit vectors for CPUs with AVX-512F: a block of 16 is one vector. */
#define AVX512 __attribute__((target("avx512f")))

AVX512 static __m512 load16_avx512(const void *in, seldp_dtype dtype, size_t i)
{
    if (!in)
        return _mm512_setzero_ps();
    if (dtype == SELDP_F32)
        return _mm512_loadu_ps((const float *)in + i);
    __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)in + i));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

AVX512 static __m512 sum_scale16(__m512 x, const sum_mode *m)
{
    if (!m->scaled)
        return x;
    __m512d s = _mm512_set1_pd(m->scale);
    __m256 lo = _mm512_cvtpd_ps(_mm512_mul_pd(_mm512_cvtps_pd(_mm512_castps512_ps256(x)), s));
    __m256 hi = _mm512_cvtpd_ps(_mm512_mul_pd(
        _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1))), s));
    return _mm512_castpd_ps(
        _mm512_insertf64x4(_mm512_castpd256_pd512(_mm256_castps_pd(lo)), _mm256_castps_pd(hi), 1));
}

/* A block of 16 results in the output dtype: 64 bytes of F32, or 32 of BF16 (bf16x4 on
 * sixteen lanes) in the low half. */
AVX512 static __m512i encode16_avx512(seldp_dtype dtype, __m512 v)
{
    if (dtype == SELDP_F32)
        return _mm512_castps_si512(v);
    __m512i b = _mm512_castps_si512(v);
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(1));
    __m512i rounded = _mm512_srli_epi32(
        _mm512_add_epi32(_mm512_add_epi32(b, _mm512_set1_epi32(0x7fff)), lsb), 16);
    __mmask16 nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(b, _mm512_set1_epi32(0x7fffffff)),
                                            _mm512_set1_epi32(0x7f800000));
    __m512i quiet = _mm512_or_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(0x40));
    __m256i h = _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(nan, rounded, quiet));
    return _mm512_castsi256_si512(h);
}

AVX512 static void store16_avx512(void *out, seldp_dtype dtype, size_t i, __m512i e, bool stream)
{
    if (dtype == SELDP_F32) {
        float *f = (float *)out + i;
        if (stream)
            _mm512_stream_si512((__m512i *)f, e);
        else
            _mm512_storeu_si512(f, e);
        return;
    }
    __m256i *to = (__m256i *)((uint16_t *)out + i);
    if (stream)
        _mm256_stream_si256(to, _mm512_castsi512_si256(e));
    else
        _mm256_storeu_si256(to, _mm512_castsi512_si256(e));
}

AVX512 static size_t sum_blocks_avx512(int size, const void *const *in, const seldp_dtype *in_dtype,
                                       int outs, void *const *out, seldp_dtype out_dtype, size_t i,
                                       size_t n, const sum_mode *m, uint64_t stream)
{
    /* two blocks at a time: a whole cache line of every BF16 stream per iteration */
    for (; i + 32 <= n; i += 32) {
        __m512 a = load16_avx512(in[0], in_dtype[0], i);
        __m512 b = load16_avx512(in[0], in_dtype[0], i + 16);
        for (int r = 1; r < size; r++) {
            a = _mm512_add_ps(a, load16_avx512(in[r], in_dtype[r], i));
            b = _mm512_add_ps(b, load16_avx512(in[r], in_dtype[r], i + 16));
        }
        __m512i ea = encode16_avx512(out_dtype, sum_scale16(a, m));
        __m512i eb = encode16_avx512(out_dtype, sum_scale16(b, m));
        for (int r = 0; r < outs; r++) {
            store16_avx512(out[r], out_dtype, i, ea, stream >> r & 1);
            store16_avx512(out[r], out_dtype, i + 16, eb, stream >> r & 1);
        }
    }
    for (; i + 16 <= n; i += 16) {
        __m512 acc = load16_avx512(in[0], in_dtype[0], i);
        for (int r = 1; r < size; r++)
            acc = _mm512_add_ps(acc, load16_avx512(in[r], in_dtype[r], i));
        __m512i e = encode16_avx512(out_dtype, sum_scale16(acc, m));
        for (int r = 0; r < outs; r++)
            store16_avx512(out[r], out_dtype, i, e, stream >> r & 1);
    }
    return i;
}
#endif

#if defined(__SSE2__)
static size_t sum_blocks(simd_width simd, int size, const void *const *in,
                         const seldp_dtype *in_dtype, int outs, void *const *out,
                         seldp_dtype out_dtype, size_t i, size_t n, const sum_mode *m,
                         uint64_t stream)
{
#if HOST_AVX2
    if (simd == SIMD_512)
        i = sum_blocks_avx512(size, in, in_dtype, outs, out, out_dtype, i, n, m, stream);
    else if (simd == SIMD_256)
        i = sum_blocks_avx2(size, in, in_dtype, outs, out, out_dtype, i, n, m, stream);
#endif
    (void)simd;
    return sum_blocks_sse2(size, in, in_dtype, outs, out, out_dtype, i, n, m, stream);
}

/* Elements [i, i + n), n < 16, through zero-padded copies of the inputs and one of the
 * output, so that the ends of a range go through the same kernel as its middle. */
static void sum_partial(simd_width simd, int size, const void *const *in,
                        const seldp_dtype *in_dtype, int outs, void *const *out,
                        seldp_dtype out_dtype, size_t i, size_t n, const sum_mode *m)
{
    _Alignas(64) unsigned char pad[FAST_RANKS][16 * sizeof(float)], result[16 * sizeof(float)];
    const void *from[FAST_RANKS];
    void *to[1] = {result};
    size_t esize = seldp_dtype_size(out_dtype);
    for (int r = 0; r < size; r++) {
        from[r] = in[r] ? pad[r] : NULL;
        if (in[r]) {
            size_t isize = seldp_dtype_size(in_dtype[r]);
            memset(pad[r], 0, sizeof pad[r]);
            memcpy(pad[r], (const char *)in[r] + i * isize, n * isize);
        }
    }
    sum_blocks(simd, size, from, in_dtype, 1, to, out_dtype, 0, 16, m, 0);
    for (int r = 0; r < outs; r++)
        memcpy((char *)out[r] + i * esize, result, n * esize);
}
#endif

/* out[r][i] = convert(scale(sum over r of in[r][i])) for i < n, inputs F32 or BF16 (NULL:
 * zeros), outputs F32 or BF16, size <= FAST_RANKS. The sums, the scaling and the rounding
 * are the scalar ones, bit for bit; only the vector width depends on the CPU. */
static void sum_fast(int size, const void *const *in, const seldp_dtype *in_dtype, int outs,
                     void *const *out, seldp_dtype out_dtype, size_t n, const sum_mode *m)
{
    size_t i = 0;
#if defined(__SSE2__)
    size_t esize = seldp_dtype_size(out_dtype);
    simd_width simd = m->simd;
    /* a stream store writes a whole vector: 16 bytes, 32, or a 16-element block */
    size_t align = simd == SIMD_128 ? 16 : simd == SIMD_256 ? 32 : 16 * esize;
    /* Up to the first output's boundary, then whole blocks, streamed if every output is
     * on a boundary there, then the rest. */
    size_t head = ((align - ((uintptr_t)out[0] & (align - 1))) & (align - 1)) / esize;
    if ((uintptr_t)out[0] % esize || head > n)
        head = n < 16 ? n : 0;
    if (head) {
        sum_partial(simd, size, in, in_dtype, outs, out, out_dtype, 0, head, m);
        i = head;
    }
    /* Stream the outputs that are not also read here: an in-place output's lines are in
     * the cache already (just read), and a streaming store would evict them first. */
    uint64_t stream = 0;
    for (int r = 0; r < outs && m->stream; r++)
        if (((uintptr_t)((char *)out[r] + i * esize) & (align - 1)) == 0 &&
            (r >= size || out[r] != (void *)in[r] || in_dtype[r] != out_dtype))
            stream |= (uint64_t)1 << r;
    i = sum_blocks(simd, size, in, in_dtype, outs, out, out_dtype, i, n, m, stream);
    while (i < n) {
        size_t left = n - i < 16 ? n - i : 15;
        sum_partial(simd, size, in, in_dtype, outs, out, out_dtype, i, left, m);
        i += left;
    }
#endif
    for (; i < n; i++) {
        float v = sum_at(size, in, in_dtype, i, m);
        for (int r = 0; r < outs; r++)
            output_at(out[r], out_dtype, i, v);
    }
}

/* One rank's side of the elements being reduced: its input (NULL: zeros) and output. */
typedef struct sum_side {
    const void *in;
    seldp_dtype in_dtype;
    void *out;
    seldp_dtype out_dtype;
} sum_side;

/* Rank r's side of element `at` of segment `seg` of the collective. */
static sum_side side_of(const host_slot *s, size_t seg, size_t at)
{
    sum_side d;
    if (s->op == OP_REDUCE_FUSED) {
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
static void sum_chunked(const host_slot *s, int size, size_t seg, size_t begin, size_t end,
                        const sum_mode *m)
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
            if (d.out_dtype == SELDP_F32)
                stream_copy(d.out, acc, n * sizeof(float), m->stream);
            else
                seldp_f32_to_half(d.out_dtype, acc, d.out, n);
        }
    }
}

/* Elements [begin, end) of segment seg: the register kernel for F32 and BF16 in groups
 * of at most FAST_RANKS, else the chunked path (F16, larger groups). */
static void sum_range(const host_slot *s, int size, size_t seg, size_t begin, size_t end,
                      const sum_mode *m)
{
    const void *in[FAST_RANKS];
    seldp_dtype in_dtype[FAST_RANKS];
    void *out[FAST_RANKS];
    seldp_dtype out_dtype = SELDP_F32;
    bool fast = size <= FAST_RANKS;
    for (int r = 0; r < size && fast; r++) {
        sum_side d = side_of(&s[r], seg, begin);
        fast = (!d.in || d.in_dtype == SELDP_F32 || d.in_dtype == SELDP_BF16) &&
               (d.out_dtype == SELDP_F32 || d.out_dtype == SELDP_BF16);
        in[r] = d.in;
        in_dtype[r] = d.in_dtype;
        out[r] = d.out;
        out_dtype = d.out_dtype;
    }
    if (fast)
        sum_fast(size, in, in_dtype, size, out, out_dtype, end - begin, m);
    else
        sum_chunked(s, size, seg, begin, end, m);
}

/* Sum elements [begin, end) of every rank's input in rank order 0..P-1 and write the
 * sum into every rank's output, for the dtypes without a dedicated kernel. A chunk is
 * fully read before any output is written, so in-place buffers (send == recv) are safe. */
#define DEFINE_REDUCE_SLICE(name, type)                                                            \
    static void name(const host_slot *s, int size, size_t begin, size_t end)                       \
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

/* Elements of one piece of an owner's slice between two looks at the abort flag. */
static size_t pace_elems(size_t esize, int size)
{
    size_t n = EXEC_PACE_BYTES / (esize * (size_t)size);
    return n < 1024 ? 1024 : n / 64 * 64;
}

static bool allreduce_execute(const seldp_comm *comm, void *arg)
{
    (void)arg;
    const host_group *g = impl_of(comm)->group;
    const host_slot *s = slots_of(comm);
    size_t count = s[comm->rank].count;
    seldp_dtype dtype = s[comm->rank].dtype;
    size_t esize = seldp_dtype_size(dtype);
    size_t slice = slice_elems(count, g->size, esize);
    size_t begin = slice * (size_t)comm->rank;
    if (begin >= count)
        return true;
    size_t end = count - begin < slice ? count : begin + slice;
    sum_mode m = {false, 1.0, count * sizeof(float) * (size_t)g->size >= STREAM_MIN_BYTES,
                  impl_of(comm)->world->simd};
    size_t piece = pace_elems(esize, g->size);
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
        going = pace(&p, (stop - at) * esize * (size_t)g->size);
    }
    stream_fence(m.stream);
    return going;
}

static seldp_status host_allreduce(seldp_comm *comm, const void *send, void *recv, size_t count,
                                   seldp_dtype dtype, seldp_device mem)
{
    size_t bytes = count * seldp_dtype_size(dtype);
    void *host = NULL;
    host_slot slot = {.op = OP_ALLREDUCE, .count = count, .dtype = dtype};
    if (mem.kind == SELDP_DEVICE_HOST) {
        slot.send = send;
        slot.recv = recv;
    } else {
        /* One staging buffer reduced in place. */
        slot.staged = stage_in(send, bytes, mem, true, &host);
        slot.send = host;
        slot.recv = host;
    }
    seldp_status st = collective_run(comm, &slot, allreduce_execute, NULL);
    if (st == SELDP_OK && mem.kind != SELDP_DEVICE_HOST)
        st = seldp__device_copy(recv, mem, host, SELDP_HOST_DEVICE, bytes);
    if (mem.kind != SELDP_DEVICE_HOST)
        stage_release(host, mem);
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
static void eager_execute(const seldp_comm *comm)
{
    const host_slot *s = slots_of(comm);
    const host_slot *mine = &s[comm->rank];
    switch (mine->op) {
    case OP_BROADCAST:
        if (comm->rank != mine->root && mine->bytes)
            memcpy(mine->recv, eager_of(comm, mine->root), mine->bytes);
        break;
    case OP_ALLGATHER:
        for (int r = 0; r < comm->size && mine->bytes; r++) {
            char *dst = (char *)mine->recv + (size_t)r * mine->bytes;
            /* a rank may gather in place, its send block already at its own offset */
            if (dst != (const char *)s[r].send || r != comm->rank)
                memcpy(dst, eager_of(comm, r), mine->bytes);
        }
        break;
    case OP_ALLREDUCE:
        if (mine->dtype == SELDP_F32 && comm->size <= FAST_RANKS) {
            const void *in[FAST_RANKS];
            seldp_dtype in_dtype[FAST_RANKS];
            void *out[1] = {mine->recv};
            sum_mode m = {false, 1.0, false, impl_of(comm)->world->simd};
            for (int r = 0; r < comm->size; r++) {
                in[r] = eager_of(comm, r);
                in_dtype[r] = SELDP_F32;
            }
            sum_fast(comm->size, in, in_dtype, 1, out, SELDP_F32, mine->count, &m);
        } else if (mine->dtype == SELDP_F32) {
            eager_sum_f32(comm, mine->recv, mine->count);
        } else if (mine->dtype == SELDP_F64) {
            eager_sum_f64(comm, mine->recv, mine->count);
        } else {
            eager_sum_u64(comm, mine->recv, mine->count);
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
    const host_slot *s = slots_of(comm);
    const host_slot *mine = &s[comm->rank];
    const seldp__reduce_fused_args *f = mine->fused;
    const size_t *starts = mine->seg_starts;
    size_t total = mine->count;
    size_t bucket = f->bucket_elems ? f->bucket_elems : total;
    size_t out_bytes = 0;
    for (size_t j = 0; j < f->n_segs; j++)
        out_bytes += f->segs[j].count * seldp_dtype_size(f->segs[j].out_dtype);
    sum_mode m = {f->scale != 1.0, f->scale, out_bytes * (size_t)g->size >= STREAM_MIN_BYTES,
                  impl_of(comm)->world->simd};
    if (f->written)
        *f->written = true;
    size_t piece = pace_elems(sizeof(float), g->size);
    exec_pace p = {comm, 0};
    bool going = true;

    for (size_t b0 = 0; b0 < total && going; b0 += bucket) {
        size_t len = total - b0 < bucket ? total - b0 : bucket;
        size_t slice = slice_elems(len, g->size, sizeof(float));
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
            going = pace(&p, (stop - at) * sizeof(float) * (size_t)g->size);
            at = stop;
        }
    }
    stream_fence(m.stream);
    return going;
}

static seldp_status host_reduce_fused(seldp_comm *comm, const seldp__reduce_fused_args *args)
{
    size_t *starts = malloc((args->n_segs + 1) * sizeof *starts);
    host_slot slot = {.op = OP_REDUCE_FUSED, .fused = args, .seg_starts = starts};
    if (starts) {
        starts[0] = 0;
        for (size_t j = 0; j < args->n_segs; j++)
            starts[j + 1] = starts[j] + args->segs[j].count;
        slot.count = starts[args->n_segs];
    } else {
        slot.staged =
            seldp__fail(SELDP_ERR_NOMEM, "rank %d: reduction: out of memory for %zu tensors",
                        comm->rank, args->n_segs);
    }
    seldp_status st = collective_run(comm, &slot, fused_execute, NULL);
    free(starts);
    return st;
}

/* ---- allgather, allgatherv ------------------------------------------------------------ */

/* Copy `bytes` from src to dst in paced pieces; false when the world was aborted. */
static bool copy_paced(exec_pace *p, void *dst, const void *src, size_t bytes, bool stream)
{
    for (size_t at = 0; at < bytes; at += EXEC_PACE_BYTES) {
        size_t n = bytes - at < EXEC_PACE_BYTES ? bytes - at : EXEC_PACE_BYTES;
        stream_copy((char *)dst + at, (const char *)src + at, n, stream);
        if (!pace(p, n))
            return false;
    }
    return true;
}

static bool allgather_execute(const seldp_comm *comm, void *arg)
{
    (void)arg;
    const host_group *g = impl_of(comm)->group;
    const host_slot *s = slots_of(comm);
    size_t bytes = s[comm->rank].bytes;
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

static seldp_status host_allgather(seldp_comm *comm, const void *send, void *recv, size_t bytes,
                                   seldp_device mem)
{
    size_t total = bytes * (size_t)comm->size;
    void *hsend = NULL, *hrecv = NULL;
    host_slot slot = {.op = OP_ALLGATHER, .bytes = bytes};
    slot.staged = stage_in(send, bytes, mem, true, &hsend);
    if (slot.staged == SELDP_OK) {
        slot.staged = stage_in(recv, total, mem, false, &hrecv);
        if (slot.staged != SELDP_OK) {
            stage_release(hsend, mem);
            hsend = NULL;
        }
    }
    slot.send = hsend;
    slot.recv = hrecv;
    seldp_status st = collective_run(comm, &slot, allgather_execute, NULL);
    if (st == SELDP_OK && mem.kind != SELDP_DEVICE_HOST)
        st = seldp__device_copy(recv, mem, hrecv, SELDP_HOST_DEVICE, total);
    stage_release(hsend, mem);
    stage_release(hrecv, mem);
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
    const host_slot *s = slots_of(comm);
    size_t total = 0;
    for (int r = 0; r < g->size; r++) {
        if (s[r].bytes > SIZE_MAX - total) {
            res->status = seldp__fail(SELDP_ERR_INVALID_ARGUMENT,
                                      "rank %d: allgatherv: the blobs' total size overflows size_t",
                                      comm->rank);
            return true;
        }
        total += s[r].bytes;
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
        going = copy_paced(&p, blob + at, s[r].send, s[r].bytes, false);
        res->recv_bytes[r] = s[r].bytes;
        at += s[r].bytes;
    }
    res->blob = blob; /* freed by the caller on failure */
    return going;
}

static seldp_status host_allgatherv(seldp_comm *comm, const void *send, size_t send_bytes,
                                    void **recv, size_t *recv_bytes)
{
    host_slot slot = {.op = OP_ALLGATHERV, .send = send, .bytes = send_bytes};
    allgatherv_result res = {NULL, recv_bytes, SELDP_OK};
    seldp_status st = collective_run(comm, &slot, allgatherv_execute, &res);
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
    const host_slot *s = slots_of(comm);
    const host_slot *mine = &s[comm->rank];
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

/* Bytes up to the end of the furthest piece. */
static size_t pieces_extent(const size_t *bytes, const size_t *displs, int n)
{
    size_t end = 0;
    for (int p = 0; p < n; p++)
        if (bytes[p] && displs[p] + bytes[p] > end)
            end = displs[p] + bytes[p];
    return end;
}

static seldp_status host_alltoallv(seldp_comm *comm, const void *send, const size_t *send_bytes,
                                   const size_t *send_displs, void *recv, const size_t *recv_bytes,
                                   const size_t *recv_displs, seldp_device mem)
{
    size_t send_extent = pieces_extent(send_bytes, send_displs, comm->size);
    size_t recv_extent = pieces_extent(recv_bytes, recv_displs, comm->size);
    void *hsend = NULL, *hrecv = NULL;
    host_slot slot = {.op = OP_ALLTOALLV,
                      .send_bytes = send_bytes,
                      .send_displs = send_displs,
                      .recv_bytes = recv_bytes,
                      .recv_displs = recv_displs};
    slot.staged = stage_in(send, send_extent, mem, true, &hsend);
    if (slot.staged == SELDP_OK) {
        slot.staged = stage_in(recv, recv_extent, mem, false, &hrecv);
        if (slot.staged != SELDP_OK) {
            stage_release(hsend, mem);
            hsend = NULL;
        }
    }
    slot.send = hsend;
    slot.recv = hrecv;
    seldp_status st = collective_run(comm, &slot, alltoallv_execute, NULL);
    /* Copy back only the pieces received, leaving the rest of recv as it was. */
    for (int p = 0; st == SELDP_OK && mem.kind != SELDP_DEVICE_HOST && p < comm->size; p++)
        if (recv_bytes[p])
            st = seldp__device_copy((char *)recv + recv_displs[p], mem,
                                    (char *)hrecv + recv_displs[p], SELDP_HOST_DEVICE,
                                    recv_bytes[p]);
    stage_release(hsend, mem);
    stage_release(hrecv, mem);
    return st;
}

/* ---- split ------------------------------------------------------------------------------ */

typedef struct split_member {
    int key;
    int parent_rank;
} split_member;

static int split_member_cmp(const void *a, const void *b)
{
    const split_member *x = a, *y = b;
    if (x->key != y->key)
        return x->key < y->key ? -1 : 1;
    return (x->parent_rank > y->parent_rank) - (x->parent_rank < y->parent_rank);
}

static seldp_status comm_wrap(seldp_host_world *w, host_group *g, int rank, seldp_device device,
                              seldp_comm **out);

static seldp_status host_split(seldp_comm *comm, int color, int key, seldp_comm **out)
{
    host_comm *hc = impl_of(comm);
    seldp_host_world *w = hc->world;
    host_group *parent = hc->group;
    split_member *members = NULL;
    int *world_ranks = NULL;
    seldp_status st = SELDP_OK;
    host_slot slot = {.op = OP_SPLIT, .color = color, .key = key};

    st = collective_enter(comm, &slot);
    if (st != SELDP_OK)
        return st;
    if ((st = slots_agree(comm)) != SELDP_OK) {
        /* Leave as the other collectives do, so that mismatched ranks stay in step. */
        char why[1024];
        snprintf(why, sizeof why, "%s", seldp_last_error());
        collective_leave(comm, OP_SPLIT);
        seldp__set_error(why);
        return st;
    }
    /* Every rank has published its color and key: compute this rank's new group. */
    const host_slot *s = slots_of(comm);
    int n = 0, new_rank = -1;
    if (color != SELDP_COMM_NO_GROUP) {
        members = malloc((size_t)parent->size * sizeof *members);
        world_ranks = malloc((size_t)parent->size * sizeof *world_ranks);
        if (members && world_ranks) {
            for (int r = 0; r < parent->size; r++)
                if (s[r].color == color)
                    members[n++] = (split_member){s[r].key, r};
            qsort(members, (size_t)n, sizeof *members, split_member_cmp);
            for (int i = 0; i < n; i++) {
                world_ranks[i] = parent->world_ranks[members[i].parent_rank];
                if (members[i].parent_rank == comm->rank)
                    new_rank = i;
            }
        }
    }
    /* The new group's rank 0 creates it for everyone; the others pick it up after
     * "publish" (the slot is ours until "leave"). */
    host_group *created = NULL;
    if (new_rank == 0)
        created = group_new(w, n, world_ranks, n);
    stall_inside(comm);
    pthread_mutex_lock(&w->lock);
    slots_of(comm)[comm->rank].new_group = created;
    slots_of(comm)[comm->rank].finished = true;
    pthread_mutex_unlock(&w->lock);
    /* Every rank has arrived and publishes its group: the wait always completes (a rank
     * slow to publish is waited for) and so does the split, on every rank alike. */
    (void)phase_wait(comm, OP_SPLIT, WAIT_FOR_ALL);

    host_group *group = NULL;
    if (st == SELDP_OK && color != SELDP_COMM_NO_GROUP) {
        if (new_rank < 0) {
            st = seldp__fail(SELDP_ERR_NOMEM, "rank %d: split: out of memory", comm->rank);
        } else {
            pthread_mutex_lock(&w->lock);
            group = slots_of(comm)[members[0].parent_rank].new_group;
            pthread_mutex_unlock(&w->lock);
            if (!group)
                st = seldp__fail(SELDP_ERR_NOMEM,
                                 "rank %d: split: rank %d ran out of memory creating the group "
                                 "of color %d",
                                 comm->rank, members[0].parent_rank, color);
        }
    }
    if (st == SELDP_OK && group)
        st = comm_wrap(w, group, new_rank, comm->device, out);
    if (st != SELDP_OK && group) {
        pthread_mutex_lock(&w->lock);
        group_release_locked(group);
        pthread_mutex_unlock(&w->lock);
    }
    /* every share finished (see above): the verdict is this rank's own status */
    (void)collective_leave(comm, OP_SPLIT);
    free(members);
    free(world_ranks);
    return st;
}

/* ---- abort, destroy, world ---------------------------------------------------------------- */

static void host_abort(seldp_comm *comm)
{
    seldp_host_world *w = impl_of(comm)->world;
    char reason[64];
    snprintf(reason, sizeof reason, "rank %d aborted the world", comm->world_rank);
    pthread_mutex_lock(&w->lock);
    world_abort_locked(w, SELDP_ERR_ABORTED, reason);
    pthread_mutex_unlock(&w->lock);
}

static void host_destroy(seldp_comm *comm)
{
    host_comm *hc = impl_of(comm);
    pthread_mutex_lock(&hc->world->lock);
    group_release_locked(hc->group);
    pthread_mutex_unlock(&hc->world->lock);
    free(hc);
    seldp__comm_free(comm);
}

static const seldp_comm_ops host_ops = {
    .name = "host",
    .barrier = host_barrier,
    .broadcast = host_broadcast,
    .allreduce = host_allreduce,
    .allgather = host_allgather,
    .allgatherv = host_allgatherv,
    .alltoallv = host_alltoallv,
    .split = host_split,
    .reduce_fused = host_reduce_fused,
    .abort = host_abort,
    .destroy = host_destroy,
};

/* A communicator for `rank` of `g`, which already counts this holder in its refs. */
static seldp_status comm_wrap(seldp_host_world *w, host_group *g, int rank, seldp_device device,
                              seldp_comm **out)
{
    host_comm *hc = malloc(sizeof *hc);
    seldp_comm *comm = NULL;
    if (hc) {
        hc->world = w;
        hc->group = g;
        hc->collectives = 0;
        hc->stall_inside_s = 0.0;
        comm = seldp__comm_new(&host_ops, rank, g->size, g->world_ranks[rank], device, hc);
    }
    if (!comm) {
        free(hc);
        return seldp__fail(SELDP_ERR_NOMEM, "rank %d: out of memory creating a communicator", rank);
    }
    *out = comm;
    return SELDP_OK;
}

seldp_status seldp_host_world_create(int nranks, const seldp_comm_config *cfg,
                                     seldp_host_world **out)
{
    seldp_comm_config defaults = SELDP_COMM_CONFIG_INIT;
    seldp_status st = SELDP_OK;
    seldp_host_world *w = NULL;
    int *identity = NULL;
    bool lock_ready = false, attr_ready = false;
    if (!cfg)
        cfg = &defaults;
    if (!out)
        SELDP_FAIL(SELDP_ERR_INVALID_ARGUMENT, "host_world_create: out is NULL");
    if (nranks < 1)
        SELDP_FAIL(SELDP_ERR_INVALID_ARGUMENT, "host world of %d ranks, expected at least 1",
                   nranks);
    if (!(cfg->timeout_s > 0))
        SELDP_FAIL(SELDP_ERR_INVALID_ARGUMENT, "host world timeout %g s, expected > 0",
                   cfg->timeout_s);
    w = calloc(1, sizeof *w);
    identity = malloc((size_t)nranks * sizeof *identity);
    if (!w || !identity)
        SELDP_FAIL(SELDP_ERR_NOMEM, "out of memory creating a host world of %d ranks", nranks);
    w->nranks = nranks;
    w->timeout_s = cfg->timeout_s;
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    w->spin_size = cpus > 1 ? (int)(cpus < INT32_MAX ? cpus : INT32_MAX) : 0;
    w->simd = (int)simd_of_cpu();
    w->joined = calloc((size_t)nranks, sizeof *w->joined);
    if (!w->joined)
        SELDP_FAIL(SELDP_ERR_NOMEM, "out of memory creating a host world of %d ranks", nranks);
    if (pthread_mutex_init(&w->lock, NULL) != 0)
        SELDP_FAIL(SELDP_ERR_INTERNAL, "host world: pthread_mutex_init failed");
    lock_ready = true;
    if (pthread_condattr_init(&w->condattr) != 0)
        SELDP_FAIL(SELDP_ERR_INTERNAL, "host world: pthread_condattr_init failed");
    attr_ready = true;
    if (pthread_condattr_setclock(&w->condattr, CLOCK_MONOTONIC) != 0)
        SELDP_FAIL(SELDP_ERR_INTERNAL, "host world: CLOCK_MONOTONIC condition variables "
                                       "are not supported");
    for (int r = 0; r < nranks; r++)
        identity[r] = r;
    /* The world group lives as long as the world; it is not reference-counted. */
    if (!group_new(w, nranks, identity, 0))
        SELDP_FAIL(SELDP_ERR_NOMEM, "out of memory creating a host world of %d ranks", nranks);
    free(identity);
    *out = w;
    return SELDP_OK;

fail:
    free(identity);
    if (w) {
        if (attr_ready)
            pthread_condattr_destroy(&w->condattr);
        if (lock_ready)
            pthread_mutex_destroy(&w->lock);
        free(w->joined);
        free(w);
    }
    return st;
}

seldp_status seldp_host_comm_init(seldp_host_world *world, int rank, seldp_device device,
                                  seldp_comm **out)
{
    seldp_status st = SELDP_OK;
    seldp_comm *comm = NULL;
    if (!world || !out)
        SELDP_FAIL(SELDP_ERR_INVALID_ARGUMENT, "rank %d: host_comm_init: NULL argument", rank);
    *out = NULL;
    if (rank < 0 || rank >= world->nranks)
        SELDP_FAIL(SELDP_ERR_INVALID_ARGUMENT,
                   "rank %d: host_comm_init: rank outside the world of %d ranks", rank,
                   world->nranks);
    if (device.kind != SELDP_DEVICE_HOST &&
        (device.kind != SELDP_DEVICE_CUDA || device.ordinal < 0))
        SELDP_FAIL(SELDP_ERR_INVALID_ARGUMENT,
                   "rank %d: host_comm_init: invalid device (kind %d, ordinal %d)", rank,
                   (int)device.kind, device.ordinal);

    pthread_mutex_lock(&world->lock);
    host_group *g = world->groups;
    bool again = world->joined[rank];
    world->joined[rank] = true;
    if (!again)
        g->refs++;
    pthread_mutex_unlock(&world->lock);
    if (again)
        SELDP_FAIL(SELDP_ERR_DUPLICATE, "rank %d: host_comm_init: rank already joined this world",
                   rank);
    st = comm_wrap(world, g, rank, device, &comm);
    if (st != SELDP_OK) {
        pthread_mutex_lock(&world->lock);
        g->refs--;
        pthread_mutex_unlock(&world->lock);
        goto fail;
    }
    host_slot slot = {.op = OP_INIT};
    SELDP_CHECK(collective_run(comm, &slot, NULL, NULL));
    *out = comm;
    return SELDP_OK;

fail:
    seldp_comm_destroy(comm);
    return st;
}

void seldp_host_world_destroy(seldp_host_world *world)
{
    if (!world)
        return;
    host_group *g = world->groups;
    while (g) {
        host_group *next = g->next;
        group_free(g);
        g = next;
    }
    pthread_condattr_destroy(&world->condattr);
    pthread_mutex_destroy(&world->lock);
    free(world->joined);
    free(world->faults);
    free(world);
}
