/* Helpers of the MPI tests: every process runs the same cmocka tests as one rank of
 * MPI_COMM_WORLD, and the program fails on every rank when a test failed on any. */
#ifndef SELDP_MPI_TEST_H
#define SELDP_MPI_TEST_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <mpi.h>

#include "seldp/mpi.h"
#include "seldp/seldp.h"

/* This process's rank in MPI_COMM_WORLD and the number of processes. */
extern int mt_rank, mt_size;

/* Seconds on a monotonic clock. */
double mt_now(void);

/* Join a new seldp world over MPI_COMM_WORLD on the host with the given timeout; fails
 * the current test when that does not succeed. */
seldp_comm *mt_world(double timeout_s);

/* Wait for every process with a plain MPI barrier: realigns the processes after a test
 * whose seldp world was aborted. */
void mt_sync(void);

/* MPI_Init, run the tests on every rank, MPI_Finalize. Returns 0 when every test passed
 * on every rank, 1 otherwise, and 77 (skipped) outside mpirun with fewer than 2 ranks. */
int mt_main(int argc, char **argv, const char *name, const struct CMUnitTest *tests, size_t count);

#endif
