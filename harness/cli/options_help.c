/* seldp-harness --help: the program's summary, then the option table's sections, each option
 * with its help line and the default its row declares (opt_table.c prints them). */
#define _POSIX_C_SOURCE 200809L

#include <stdio.h>

#include "options.h"
#include "options_impl.h"

void hx_options_usage(FILE *out)
{
    fprintf(out,
            "usage: seldp-harness [options]\n"
            "\n"
            "Runs tiny-moe training steps on simulated ranks (one thread each; under mpirun one\n"
            "process each, e.g. mpirun -np 4 seldp-harness): the shared parameters replicated\n"
            "over the world, each expert over its expert-data group, tokens dispatched to expert\n"
            "owners by alltoallv. Checks every reduced gradient on every rank against an FP64\n"
            "reference of the global loss, and the replicas (docs/harness.md).\n"
            "Exit status: 0 every check passed, 1 a check or the run failed, 2 bad options or "
            "layout.\n\n");
    hx_opt_print_help(&hx_options_table, out);
    fprintf(out, "\nexample: seldp-harness --world 8 --ep 4 --order ep-dp --dtype bf16\n");
}
