/* A stall injected into the hybrid transport, for tests (internal, not installed): one rank
 * thread stops for a while at one point of its next collective on a communicator, as a
 * descheduled or stuck thread would, so that tests can check that every rank of every
 * process returns an error within the timeout. */
#ifndef SELDP_HYBRID_FAULT_H
#define SELDP_HYBRID_FAULT_H

#include "seldp/comm.h"

typedef enum seldp__hy_stall {
    /* before the rank arrives: it arrives late */
    SELDP__HY_STALL_ARRIVE = 1,
    /* every rank of the process arrived and agreed; the rank stops in the first step of the
     * body (copying its input in): stalled inside the collective */
    SELDP__HY_STALL_STEP = 2,
    /* the round is over on this rank (results copied out); it stops before leaving */
    SELDP__HY_STALL_LEAVE = 3
} seldp__hy_stall;

/* Arm a stall of `seconds` (in (0, 3600)) at `where` of the next collective the calling rank
 * makes on `comm` (a hybrid communicator): collective over nothing, call it from the rank's
 * own thread between collectives. SELDP_ERR_INVALID_ARGUMENT for another transport, an
 * unknown point or a duration outside the range. */
seldp_status seldp__hy_fault_stall(seldp_comm *comm, seldp__hy_stall where, double seconds);

#endif
