/* The seldp-harness program as a function, so that tests can run it in-process. */
#ifndef HX_CLI_H
#define HX_CLI_H

#include <stdio.h>

#include "exit.h"

/* Run seldp-harness with argv. Progress, tables and --help go to `out`, errors (one line each)
 * to `err`. Returns the exit status. */
int hx_main(int argc, char **argv, FILE *out, FILE *err);

#endif
