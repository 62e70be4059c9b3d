/* The seldp-harness program as a function, so that tests can run it in-process. */
#ifndef HX_CLI_H
#define HX_CLI_H

#include <stdio.h>

/* Exit status of the program. */
enum {
    HX_EXIT_PASS = 0, /* every check passed */
    HX_EXIT_FAIL = 1, /* a check failed, or the run stopped on an error */
    HX_EXIT_USAGE = 2 /* a bad option or layout: nothing ran */
};

/* Run seldp-harness with argv. Progress, tables and --help go to `out`, errors (one line each)
 * to `err`. Returns the exit status. */
int hx_main(int argc, char **argv, FILE *out, FILE *err);

#endif
