/* Helpers of the MPI tests (see mpi_test.h). */
#define _POSIX_C_SOURCE 200809L

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <time.h>

#include <cmocka.h>

#include "mpi_test.h"

int mt_rank = 0, mt_size = 1;

double mt_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

seldp_comm *mt_world(double timeout_s)
{
    seldp_comm_config cfg = SELDP_COMM_CONFIG_INIT;
    seldp_comm *world = NULL;
    cfg.timeout_s = timeout_s;
    seldp_status st = seldp_mpi_comm_init(MPI_COMM_WORLD, SELDP_HOST_DEVICE, &cfg, &world);
    if (st != SELDP_OK)
        fail_msg("rank %d: seldp_mpi_comm_init returned %s: %s", mt_rank, seldp_status_name(st),
                 seldp_last_error());
    return world;
}

void mt_sync(void)
{
    MPI_Barrier(MPI_COMM_WORLD);
}

int mt_main(int argc, char **argv, const char *name, const struct CMUnitTest *tests, size_t count)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &mt_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &mt_size);
    /* Open MPI 4 raises errors of non-blocking collectives on MPI_COMM_WORLD (see mpi.h). */
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    if (mt_size < 2) {
        fprintf(stderr, "%s: run under mpirun with at least 2 processes; skipped\n", name);
        MPI_Finalize();
        return 77;
    }
    int failed = _cmocka_run_group_tests(name, tests, count, NULL, NULL);
    /* Every rank reaches this point: a stuck collective times out instead of hanging. */
    int any = 0;
    MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (any && !failed)
        fprintf(stderr, "rank %d: every test passed here, but another rank failed\n", mt_rank);
    MPI_Finalize();
    return any ? 1 : 0;
}
