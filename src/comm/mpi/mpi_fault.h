/* A stall injected into the MPI transport, for tests (internal, not installed): the
 * calling rank stops for a while at one phase of its next collective on a communicator,
 * holding the world's lock as a descheduled or stopped process would, so that tests can
 * check what the other ranks return and that no caller's buffer is touched after a call
 * returned. */
#ifndef SELDP_MPI_FAULT_H
#define SELDP_MPI_FAULT_H

#include "seldp/comm.h"

typedef enum seldp__mpi_stall {
    /* before the header is posted: the rank arrives late */
    SELDP__MPI_STALL_ARRIVE = 1,
    /* the header is posted, then the rank stops before waiting for the others' */
    SELDP__MPI_STALL_HEADER = 2,
    /* every rank arrived and agreed; the rank stops before its first body operation is
     * posted (a barrier has no body and does not stall) */
    SELDP__MPI_STALL_BODY = 3,
    /* the collective is over on this rank (results copied out); the rank stops before the
     * call returns */
    SELDP__MPI_STALL_LEAVE = 4
} seldp__mpi_stall;

/* Arm a stall of `seconds` (in (0, 3600)) at `where` of the next collective the calling
 * rank makes on `comm` (an MPI communicator); a collective that ends without reaching it
 * disarms it. SELDP_ERR_INVALID_ARGUMENT for another transport, an unknown phase or a
 * duration outside the range. */
seldp_status seldp__mpi_fault_stall(seldp_comm *comm, seldp__mpi_stall where, double seconds);

#endif
