/* Helpers of the MPI tests: every process runs the same cmocka tests as one rank of
 * MPI_COMM_WORLD, and the program fails on every rank when a test failed on any. */
#ifndef SELDP_MPI_TEST_H
#define SELDP_MPI_TEST_H

#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
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

/* Wait for every process with a plain MPI barrier. */
void mt_sync(void);

/* cmocka teardown of every test: mt_sync, so that a rank that failed a test (and left it
 * early) starts the next test with the others. Collectives inside a test go through seldp,
 * whose timeouts release the ranks still waiting for the one that left. */
int mt_teardown(void **state);

/* A test that ends with mt_teardown. */
#define MT_TEST(f) cmocka_unit_test_teardown(f, mt_teardown)

/* Collective over comm: fail the current test on every rank unless every rank got
 * `expected` with a message containing `needle`. */
void mt_expect_everywhere(seldp_comm *comm, seldp_status st, seldp_status expected,
                          const char *needle);

/* Collective over comm (by seldp_comm_allgather): true when the `bytes` bytes at data are
 * identical on every rank of the group. */
bool mt_same_everywhere(seldp_comm *comm, const void *data, size_t bytes);

/* MPI_Init (unless the program initialized MPI itself), run the tests on every rank, MPI_Finalize.
 * Returns 0 when every test passed on every rank, 1 otherwise, and 77 (skipped) outside mpirun with
 * fewer than 2 ranks. */
int mt_main(int argc, char **argv, const char *name, const struct CMUnitTest *tests, size_t count);

#endif
