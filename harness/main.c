/* seldp-harness: MoE group layouts on simulated ranks, checked against the FP64 reference
 * (docs/harness.md). Everything is in the seldp_harness_core library (cli.c) so tests can run it.
 */
#include <stdio.h>

#include "backend.h"
#include "cli.h"

int main(int argc, char **argv)
{
    int status = hx_main(argc, argv, stdout, stderr);
    hx_backend_finalize(); /* under mpirun, when the harness started MPI */
    return status;
}
