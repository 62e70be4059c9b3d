/* Helpers of the tests that run seldp-harness under mpirun: each process calls the program
 * in-process (hx_main, through tests/harness's hx_test_harness) as one rank of the run. */
#ifndef SELDP_HARNESS_MPI_H
#define SELDP_HARNESS_MPI_H

#include <stdbool.h>

#include "harness_test.h"
#include "mpi_test.h"

/* Collective: a fresh, empty directory `name` under this test's working directory (one tree
 * per process count), the same path on every rank (rank 0 empties it, the others wait).
 * Static storage, valid until the next call. */
const char *hm_dir(const char *name);

/* Collective: fail the current test on every rank unless every rank's run exited with
 * `status`; a rank that did not prints its command's stderr and output. */
void hm_expect_status(const hx_test_run *run, int status, const char *what);

/* Collective: fail the current test on every rank when `ok` is false on any (that rank
 * printed why). Rank-local checks end with it, so that every rank leaves a test at the same
 * collective. */
void hm_expect_everywhere(bool ok, const char *what);

#endif
