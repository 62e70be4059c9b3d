/* Helpers of the MPI tests (see mpi_test.h). */
#define _POSIX_C_SOURCE 200809L

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

int mt_teardown(void **state)
{
    (void)state;
    mt_sync();
    return 0;
}

void mt_expect_everywhere(seldp_comm *comm, seldp_status st, seldp_status expected,
                          const char *needle)
{
    int64_t wrong = st != expected || !strstr(seldp_last_error(), needle), ranks_wrong = 0;
    if (wrong)
        print_error("rank %d: got %s (%s), expected %s mentioning \"%s\"\n", mt_rank,
                    seldp_status_name(st), seldp_last_error(), seldp_status_name(expected), needle);
    seldp_status sum =
        seldp_comm_allreduce(comm, &wrong, &ranks_wrong, 1, SELDP_I64, SELDP_HOST_DEVICE);
    if (sum != SELDP_OK)
        fail_msg("rank %d: counting the ranks that failed: %s", mt_rank, seldp_last_error());
    if (ranks_wrong)
        fail_msg("%lld rank(s) did not return %s mentioning \"%s\"", (long long)ranks_wrong,
                 seldp_status_name(expected), needle);
}

bool mt_same_everywhere(seldp_comm *comm, const void *data, size_t bytes)
{
    int n = seldp_comm_size(comm);
    unsigned char *all = malloc((size_t)n * bytes + 1);
    assert_non_null(all);
    seldp_status st = seldp_comm_allgather(comm, data, all, bytes, SELDP_HOST_DEVICE);
    if (st != SELDP_OK) {
        free(all);
        fail_msg("rank %d: allgather: %s", mt_rank, seldp_last_error());
    }
    bool same = true;
    for (int r = 0; r < n; r++)
        same = same && memcmp(all + (size_t)r * bytes, data, bytes) == 0;
    free(all);
    return same;
}

int mt_main(int argc, char **argv, const char *name, const struct CMUnitTest *tests, size_t count)
{
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) /* a program that needs another thread level starts MPI itself */
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
    /* Open MPI connects processes at their first exchange: done here, so that a test's
     * first join under a short timeout waits for arrival, not for connection setup. */
    MPI_Barrier(MPI_COMM_WORLD);
    if (getenv("SELDP_MPI_TEST_FILTER")) /* a cmocka pattern: run those tests alone */
        cmocka_set_test_filter(getenv("SELDP_MPI_TEST_FILTER"));
    int failed = _cmocka_run_group_tests(name, tests, count, NULL, NULL);
    /* Every rank reaches this point: a stuck collective times out instead of hanging. */
    int any = 0;
    MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (any && !failed)
        fprintf(stderr, "rank %d: every test passed here, but another rank failed\n", mt_rank);
    MPI_Finalize();
    return any ? 1 : 0;
}
