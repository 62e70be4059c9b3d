/* Helpers of the harness-under-mpirun tests (see harness_mpi.h). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "harness_mpi.h"

const char *hm_dir(const char *name)
{
    static char path[1024];
    char scoped[256];
    /* the -np 2 and -np 4 runs of one program may run at once: one tree each */
    snprintf(scoped, sizeof scoped, "np%d/%s", mt_size, name);
    if (mt_rank == 0)
        snprintf(path, sizeof path, "%s", hx_test_dir(scoped));
    else
        snprintf(path, sizeof path, "%s/%s", HX_TEST_WORKDIR, scoped);
    mt_sync();
    return path;
}

void hm_expect_status(const hx_test_run *run, int status, const char *what)
{
    int wrong = run->status != status, ranks_wrong = 0;
    if (wrong)
        print_error("rank %d: %s exited %d, expected %d\nstderr: %s\nstdout: %s\n", mt_rank, what,
                    run->status, status, run->err, run->out);
    MPI_Allreduce(&wrong, &ranks_wrong, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (ranks_wrong)
        fail_msg("%s: %d rank(s) did not exit %d", what, ranks_wrong, status);
}

void hm_expect_everywhere(bool ok, const char *what)
{
    int wrong = !ok, ranks_wrong = 0;
    MPI_Allreduce(&wrong, &ranks_wrong, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (ranks_wrong)
        fail_msg("%s: failed on %d rank(s)", what, ranks_wrong);
}
