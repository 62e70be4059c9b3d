/* Fault injection into the host-staged transport, for tests (internal, not installed).
 *
 * Once a fault is set on a world, every collective a rank enters on any communicator of
 * that world is counted: its join (seldp_host_comm_init) is point 0, its next collective
 * point 1, and so on, whatever the group. When a rank reaches its armed point, the action
 * replaces that collective; the others must then return SELDP_ERR_ABORTED or
 * SELDP_ERR_TIMEOUT instead of hanging. A world without faults pays one predictable
 * branch per collective. */
#ifndef SELDP_HOST_FAULT_H
#define SELDP_HOST_FAULT_H

#include <stdint.h>

#include "seldp/host.h"
#include "seldp/status.h"

typedef enum seldp__host_fault_action {
    /* Count the collectives, change nothing: a clean run that measures the points. */
    SELDP__FAULT_NONE = 0,
    /* Abort the world instead of entering: the rank returns SELDP_ERR_ABORTED, as do the
     * others at once. */
    SELDP__FAULT_ABORT = 1,
    /* Skip the collective without a word to the others: the rank returns
     * SELDP_ERR_TRANSPORT at once and the others time out waiting for it. */
    SELDP__FAULT_RETURN = 2,
    /* Arrive late: wait until the world is aborted (the others' timeout) or for twice the
     * timeout, then enter the collective as usual. */
    SELDP__FAULT_STALL = 3,
    /* Stall inside: enter and arrive as usual, then stop for a while (2 x the timeout, or
     * what seldp__host_fault_set_stall says) after the first chunk of the collective's work,
     * holding access to the other ranks' buffers, as a descheduled or stopped thread does.
     * The others wait for it (it may be writing into their memory); at their timeout they
     * abort the world, and it stops at its next chunk. A collective without work of its
     * own to share (a barrier, a small one in a single phase) stalls after it. */
    SELDP__FAULT_STALL_INSIDE = 4
} seldp__host_fault_action;

/* Arm `action` at collective point `point` of world rank `rank`, replacing any fault set
 * for that rank before, and start counting collectives on the world. Set faults before the
 * ranks join, or while they are between collectives. SELDP_ERR_INVALID_ARGUMENT for a NULL
 * world, a rank outside it or an unknown action; SELDP_ERR_NOMEM. */
seldp_status seldp__host_fault_set(seldp_host_world *world, int rank, uint64_t point,
                                   seldp__host_fault_action action);

/* SELDP__FAULT_STALL_INSIDE at `point` of world rank `rank`, stopping for `seconds` (in
 * (0, 3600)). Errors as seldp__host_fault_set's, and SELDP_ERR_INVALID_ARGUMENT for a
 * duration outside that range. */
seldp_status seldp__host_fault_set_stall(seldp_host_world *world, int rank, uint64_t point,
                                         double seconds);

/* Change the world's timeout to `seconds` (> 0), so that a test can set a world up under a
 * long timeout and run the collective under test with a short one. Only while no rank is
 * inside a collective. SELDP_ERR_INVALID_ARGUMENT for a NULL world or a timeout <= 0. */
seldp_status seldp__host_fault_set_timeout(seldp_host_world *world, double seconds);

/* Collectives world rank `rank` has entered since the first seldp__host_fault_set on the
 * world (0 for a NULL world, a rank outside it, or a world without faults). */
uint64_t seldp__host_fault_count(seldp_host_world *world, int rank);

#endif
