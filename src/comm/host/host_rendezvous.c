/* The rendezvous of the host-staged transport: how every collective runs.
 *
 * Every collective is a shared-memory rendezvous over the group's cell array:
 *   1. publish: each rank writes its arguments (buffer pointers, sizes) into its
 *      cell and waits until every rank of the group has arrived (phase "arrive");
 *   2. execute: each rank reads the others' buffers directly, since ranks share
 *      memory: an allreduce owner sums its slice of every input and writes it into
 *      every output, a broadcast owner copies its slice of the root into every other
 *      rank, so each byte is read and written once, by all the cores together (large
 *      payloads with non-temporal stores); the fused reduction of the sessions does the
 *      same over many tensors, with half upcasts and the 1/W scale in the same pass
 *      (host_collectives.c, src/simd/host_sum.c);
 *   3. leave: wait once more (phase "leave") so that no rank returns, and reuses or
 *      frees a buffer, while another is still reading or writing it.
 * The timeout bounds arrival. A rank that has arrived holds access to the others' buffers
 * until it leaves, so it is waited for however late it is: at the timeout the waiters
 * abort the world, and a rank inside looks at the abort flag between chunks of its work
 * (every EXEC_PACE_BYTES) and stops. Each rank says in its cell whether it finished its
 * share; after "leave" every rank reads the same answer: success, or the world's abort
 * (outputs are then incomplete). A rank that never arrived, or arrives after the others
 * gave up, returns an error and touches nothing.
 * Collectives of at most EAGER_MAX bytes per rank (and barriers) skip "leave": the ranks
 * exchange copies of their inputs instead of reading one another's buffers.
 * Phases are counted without the lock (see seldp__host_phase_wait): every rank announces
 * its arrival on a cache line of its own and watches the others'; in a group with a core
 * per rank waiters spin briefly before sleeping (with up to YIELD_RANKS_PER_CPU ranks a core
 * they yield the core between looks first). Every wait has a deadline on
 * CLOCK_MONOTONIC; a rank that times out marks the whole world aborted so that every rank
 * of every group returns.
 *
 * One mutex per world guards the rest of the rendezvous state (abort reason, reference
 * counts, sleeping); each group has its own condition variable. Data moves outside
 * the lock. */
#define _POSIX_C_SOURCE 200809L /* pthread_condattr_setclock, clock_gettime */

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "comm/host/host_impl.h"
#include "internal.h"

/* ---- abort and waiting ----------------------------------------------------------- */

void seldp__host_world_abort_locked(seldp_host_world *w, seldp_status status, const char *reason)
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
    return seldp__proto_aborted(comm->rank, op, w->abort_status, w->abort_reason);
}

/* Whether rank r of a group has not entered a phase; ctx is a phase_probe. */
typedef struct phase_probe {
    const host_group *g;
    uint64_t gen; /* the phase */
} phase_probe;

static bool not_entered(const void *ctx, int r)
{
    const phase_probe *p = ctx;
    /* a rank that arrived and gave up is not missing */
    return atomic_load_explicit(&p->g->entered[r].value, memory_order_relaxed) <= p->gen &&
           p->g->entered[r].withdrawn != p->gen + 1;
}

/* Append the ranks of `g` other than `self` that have not entered phase `gen` ("3, 5") to
 * buf: in world numbering, or in group numbering with the world rank beside it for a split
 * group. Returns how many there are. Caller holds w->lock. */
static int missing_ranks(const host_group *g, int self, uint64_t gen, bool world_numbering,
                         char *buf, size_t size)
{
    phase_probe probe = {g, gen};
    return seldp__proto_missing_ranks(g->size, self, g->world_ranks, g != g->world->groups,
                                      world_numbering, not_entered, &probe, buf, size);
}

/* How long a waiter spins before it sleeps on the condition variable: long enough to
 * catch a rank a few microseconds behind (small collectives are latency-bound, and a
 * futex wake-up costs tens of microseconds), short enough to waste little when a rank
 * is far behind. */
#define SPIN_NS 20000L

/* Groups with more ranks than cores cannot spin: the rank a waiter waits for may need the
 * waiter's core. Up to YIELD_RANKS_PER_CPU ranks a core, a waiter gives its core away
 * (sched_yield) between looks for up to YIELD_NS before it sleeps: the ranks behind run at
 * once instead of after a futex wake-up each (tens of microseconds; small collectives on
 * an oversubscribed machine are made of them). Beyond that, or for longer, yielding costs
 * the ranks that work more than it saves, and waiters sleep. */
#define YIELD_NS 100000L

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

typedef struct phase_target {
    host_group *g;
    uint64_t phases;
} phase_target;

static bool phase_done(void *arg)
{
    phase_target *t = arg;
    return phase_complete(t->g, t->phases);
}

/* Spin, without the lock, until the phase completes (true) or SPIN_NS have passed; in a
 * group with more ranks than cores (and at most yield_size), yield instead for YIELD_NS. */
static bool spin_until(const seldp_host_world *w, host_group *g, uint64_t phases)
{
    phase_target t = {g, phases};
    if (g->size <= w->spin_size)
        return seldp__proto_spin_until(phase_done, &t, SPIN_NS);
    return g->size <= w->yield_size && seldp__proto_yield_until(phase_done, &t, YIELD_NS);
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
    /* the phase completed while this rank's entry was out: the arrival that completed it
     * may have found it incomplete and woken no one */
    pthread_cond_broadcast(&g->cond);
    return false;
}

/* A phase's timeout passed: abort the world and return this rank's status, naming the ranks
 * of the group that had not entered the phase. `stalled_inside`: a WAIT_FOR_ALL phase, whose
 * missing ranks had arrived at the collective and may be reading or writing this rank's
 * buffers; the abort stops them at their next chunk and the caller keeps waiting for them.
 * Otherwise they never arrived and this rank has given up. Caller holds w->lock. */
static seldp_status timeout_locked(seldp_comm *comm, seldp__comm_op op, uint64_t phase,
                                   bool stalled_inside)
{
    host_comm *hc = impl_of(comm);
    seldp_host_world *w = hc->world;
    host_group *g = hc->group;
    char who[256] = "", world_who[200] = "", reason[512];
    seldp__proto_timeout t = {.rank = comm->rank,
                              .world_rank = comm->world_rank,
                              .size = g->size,
                              .op = op,
                              .timeout_s = w->timeout_s,
                              .who = who,
                              .world_who = world_who};
    t.missing = missing_ranks(g, comm->rank, phase, false, who, sizeof who);
    missing_ranks(g, comm->rank, phase, true, world_who, sizeof world_who);
    seldp_status st = stalled_inside ? seldp__proto_stalled_inside(&t, true, reason, sizeof reason)
                                     : seldp__proto_not_arrived(&t, reason, sizeof reason);
    seldp__host_world_abort_locked(w, SELDP_ERR_TIMEOUT, reason);
    return st;
}

/* Enter one phase of the group's rendezvous and wait for every rank of the group.
 * Under WAIT_FOR_ALL neither an abort nor the timeout stops the wait: every rank has
 * arrived and may be reading or writing this rank's buffers, which the caller could free
 * or reuse once it returns. At the timeout the world is aborted instead, so that the
 * ranks still inside stop at their next chunk (see exec_pace in host_impl.h), and the wait goes on.
 *
 * Every rank counts the phases it has entered on a cache line of its own (entered[]),
 * and every rank goes through the same phases, so phase k has completed once every
 * counter reaches k + 1: a rank enters with one store and waits by reading the others'
 * lines, without a lock or a contended read-modify-write. A rank that gives up (timeout,
 * abort) does so under the lock: it takes its entry back, then looks at the others; if
 * they have all entered, the phase completed and it stays. A rank sees the phase
 * complete only when two scans in a row find every rank in it, so either every rank sees
 * it complete or none does (the stores and loads are sequentially consistent). Waiters
 * spin first when the group has a core per rank (yield-spin when it has up to
 * YIELD_RANKS_PER_CPU ranks a core), then sleep on the condition variable,
 * which the arrival that completes the phase signals when someone sleeps. */
seldp_status seldp__host_phase_wait(seldp_comm *comm, seldp__comm_op op, seldp__host_wait_mode mode)
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
    /* Only the arrival that completes the phase wakes the sleepers: with thousands of ranks
     * in a group, a wake-up per arrival costs more than the collective. The entries are
     * sequentially consistent, so the last rank to enter sees every entry; a rank that
     * gave up and stays (give_up) wakes them itself. */
    if (atomic_load(&g->sleepers) && every_rank_entered(g, phases)) {
        pthread_mutex_lock(&w->lock);
        pthread_cond_broadcast(&g->cond);
        pthread_mutex_unlock(&w->lock);
    }
    if (phase_complete(g, phases) || spin_until(w, g, phases))
        return SELDP_OK;

    pthread_mutex_lock(&w->lock);
    atomic_fetch_add(&g->sleepers, 1);
    struct timespec deadline = seldp__proto_deadline_after(w->timeout_s);
    bool overdue = false;
    while (!phase_complete(g, phases) && (mode == WAIT_FOR_ALL || !atomic_load(&w->aborted))) {
        int rc = pthread_cond_timedwait(&g->cond, &w->lock, &deadline);
        if (rc == ETIMEDOUT && mode == WAIT_FOR_ALL) {
            if (!overdue)
                st = timeout_locked(comm, op, phase, true);
            overdue = true;
            /* look again now and then: the ranks inside signal when they enter, but a
             * look costs nothing once the collective has failed */
            deadline = seldp__proto_deadline_after(0.05);
            continue;
        }
        if (rc == ETIMEDOUT && give_up(g, comm->rank, phases)) {
            /* The phase will never complete: this rank is out of it. */
            st = timeout_locked(comm, op, phase, false);
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

/* ---- the collective rendezvous --------------------------------------------------- */

/* Why the published cells of a collective do not agree, or SELDP_OK. Every rank reads
 * the same cells after "arrive", so every rank reaches the same verdict. */
/* What the agreement check reads beyond the headers: the other ranks' arrays, which the
 * ranks of this transport can see. ctx is the group's cells. */
static const size_t *cell_send_bytes(const void *ctx, int r)
{
    return ((const host_cell *)ctx)[r].send_bytes;
}

static const size_t *cell_recv_bytes(const void *ctx, int r)
{
    return ((const host_cell *)ctx)[r].recv_bytes;
}

static const seldp__reduce_seg *cell_segs(const void *ctx, int r)
{
    return ((const host_cell *)ctx)[r].fused->segs;
}

static const seldp__shard_seg *cell_shard_segs(const void *ctx, int r)
{
    const host_cell *s = &((const host_cell *)ctx)[r];
    return s->scatter ? s->scatter->segs : s->gather->segs;
}

seldp_status seldp__host_cells_agree(const seldp_comm *comm)
{
    const host_cell *s = cells_of(comm);
    seldp__proto_view v = {.size = comm->size,
                           .rank = comm->rank,
                           .headers = &s[0].call,
                           .stride = sizeof *s,
                           .ctx = s,
                           .send_bytes = cell_send_bytes,
                           .recv_bytes = cell_recv_bytes,
                           .segs = cell_segs,
                           .shard_segs = cell_shard_segs};
    return seldp__proto_agree(&v);
}

static seldp__comm_op op_of(const host_cell *cell)
{
    return (seldp__comm_op)cell->call.op;
}

/* Whether a collective takes one phase, and the bytes of its eager buffers (see
 * EAGER_MAX): this rank's input, or the root's for a broadcast. Every rank computes the
 * same answer once the cells agree. */
static bool eager_op(const host_cell *cell)
{
    switch (cell->call.op) {
    case OP_INIT:
    case OP_BARRIER:
        return true;
    case OP_BROADCAST:
    case OP_ALLGATHER:
        return (size_t)cell->call.bytes <= EAGER_MAX;
    case OP_ALLREDUCE:
        return (size_t)cell->call.count <=
               EAGER_MAX / seldp_dtype_size((seldp_dtype)cell->call.dtype);
    default:
        return false;
    }
}

static size_t eager_bytes(const host_cell *cell)
{
    if (!eager_op(cell) || cell->call.staged != SELDP_OK)
        return 0;
    if (cell->call.op == OP_ALLREDUCE)
        return (size_t)cell->call.count * seldp_dtype_size((seldp_dtype)cell->call.dtype);
    return (size_t)cell->call.bytes;
}

/* The one place every collective of this transport enters: publish this rank's cell
 * and wait for the group. A fault-injection point for a collective belongs here. */
seldp_status seldp__host_collective_enter(seldp_comm *comm, const host_cell *cell)
{
    host_comm *hc = impl_of(comm);
    seldp_status struck;
    if (atomic_load_explicit(&hc->world->faults_on, memory_order_relaxed) &&
        seldp__host_fault_strike(comm, op_of(cell), &struck))
        return struck;
    /* A collective of an aborted world fails at once, without publishing anything: an
     * earlier collective failed, so the others may never have finished with the cell. */
    if (atomic_load(&hc->world->aborted))
        return seldp__host_phase_wait(comm, op_of(cell), WAIT_UNLESS_ABORTED);
    /* No other rank reads this cell before the arrival below publishes it, and every rank
     * finished reading its contents of two collectives ago before arriving at the last. */
    hc->collectives++;
    cells_of(comm)[comm->rank] = *cell;
    size_t eager = eager_bytes(cell);
    if (eager && (cell->call.op != OP_BROADCAST || comm->rank == cell->call.root))
        memcpy(eager_of(comm, comm->rank), cell->send, eager);
    return seldp__host_phase_wait(comm, op_of(cell), WAIT_UNLESS_ABORTED);
}

/* Every rank has finished touching the others' buffers once this returns. */
seldp_status seldp__host_collective_leave(seldp_comm *comm, seldp__comm_op op)
{
    return seldp__host_phase_wait(comm, op, WAIT_FOR_ALL);
}

/* A stall armed by SELDP__FAULT_STALL_INSIDE for this collective: sleep, holding access to
 * the other ranks' buffers, as a descheduled or stopped thread would. */
void seldp__host_stall_inside(const seldp_comm *comm)
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

/* Count `bytes` of work done; after every EXEC_PACE_BYTES, look at the abort flag. False
 * once the world is aborted: the caller stops touching the other ranks' buffers. */
bool seldp__host_pace(exec_pace *p, size_t bytes)
{
    p->since += bytes;
    if (p->since < EXEC_PACE_BYTES)
        return true;
    p->since = 0;
    seldp__host_stall_inside(p->comm);
    return !atomic_load_explicit(&impl_of(p->comm)->world->aborted, memory_order_relaxed);
}

/* Whether every rank of the group finished its share of the collective just left: the same
 * answer on every rank, read from the cells after "leave". */
static bool every_share_finished(const seldp_comm *comm)
{
    const host_cell *s = cells_of(comm);
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
seldp_status seldp__host_collective_run(seldp_comm *comm, const host_cell *cell,
                                        seldp__host_execute_fn execute, void *arg)
{
    seldp_status st = seldp__host_collective_enter(comm, cell);
    if (st != SELDP_OK)
        return st;
    char why[1024] = "";
    seldp_status agreed = seldp__host_cells_agree(comm);
    if (agreed == SELDP_OK && eager_op(cell)) {
        seldp__host_eager_execute(comm);
        seldp__host_stall_inside(comm); /* after the work: no other rank waits for this one */
        return SELDP_OK;
    }
    bool finished = true;
    if (agreed == SELDP_OK && execute)
        finished = execute(comm, arg);
    else if (agreed != SELDP_OK)
        snprintf(why, sizeof why, "%s", seldp_last_error());
    seldp__host_stall_inside(comm); /* an armed stall the execute step did not take */
    cells_of(comm)[comm->rank].finished = finished;
    st = seldp__host_collective_leave(comm, op_of(cell));
    if (agreed != SELDP_OK) {
        seldp__set_error(why);
        return agreed;
    }
    return collective_verdict(comm, op_of(cell), st);
}
