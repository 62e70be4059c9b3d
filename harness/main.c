/* seldp-harness: MoE group layouts on simulated ranks, checked against the FP64 reference
 * (SPEC §5). Everything is in the seldp_harness_core library (cli.c) so tests can run it. */
#include <stdio.h>

#include "cli.h"

int main(int argc, char **argv)
{
    return hx_main(argc, argv, stdout, stderr);
}
