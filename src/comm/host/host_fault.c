/* Fault injection into the host-staged transport, for tests (see host_fault.h): the
 * collectives each world rank enters are counted, and the armed one is replaced. */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

#include "comm/host/host_fault.h"
#include "comm/host/host_impl.h"
#include "internal.h"

typedef struct host_fault {
    uint64_t entered; /* collectives this world rank has entered */
    uint64_t point;
    seldp__host_fault_action action;
    double stall_s; /* SELDP__FAULT_STALL_INSIDE: how long */
} host_fault;

bool seldp__host_fault_strike(seldp_comm *comm, seldp__comm_op op, seldp_status *st)
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
        seldp__host_world_abort_locked(w, SELDP_ERR_ABORTED, reason);
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
        struct timespec deadline = seldp__proto_deadline_after(2.0 * w->timeout_s);
        while (!w->aborted && pthread_cond_timedwait(&g->cond, &w->lock, &deadline) != ETIMEDOUT)
            ;
        break;
    }
    case SELDP__FAULT_STALL_INSIDE:
        /* taken by the execute step after its first chunk (seldp__host_stall_inside) */
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
