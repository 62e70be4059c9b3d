/* Helpers of the hybrid transport's tests (seldp/hybrid.h): every process of mpirun hosts
 * the same number of rank threads of one hybrid world; a test runs a function on every
 * rank thread and fails on every process when a rank of any process failed. */
#ifndef SELDP_HYBRID_TEST_H
#define SELDP_HYBRID_TEST_H

#include "mpi_test.h"
#include "ranks.h"
#include "seldp/hybrid.h"

/* Run fn on `threads` rank threads in every process (a hybrid world over MPI_COMM_WORLD
 * with the timeout; ctx->world is the rank's world communicator, ctx->rank its world rank,
 * ctx->size the world's size); then fail the current test on every process unless every
 * rank of every process returned 0. */
void ht_run(int threads, double timeout_s, tr_rank_fn fn, void *arg);

/* The same, returning the number of ranks (over every process) that failed. */
int ht_run_status(int threads, double timeout_s, tr_rank_fn fn, void *arg);

/* MPI_Init_thread(MPI_THREAD_MULTIPLE), then mt_main. */
int ht_main(int argc, char **argv, const char *name, const struct CMUnitTest *tests, size_t count);

#endif
