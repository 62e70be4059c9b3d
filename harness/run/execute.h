/* A run's execution (execute.c): the rank threads, or one rank per MPI process, or
 * processes of rank threads, driven through the phases of run.h's step. */
#ifndef HX_EXECUTE_H
#define HX_EXECUTE_H

#include <stdio.h>

#include "run.h"

/* Run every step. Progress and tables go to `out` (NULL: nothing). Returns SELDP_OK when the
 * run completed, whatever the checks found (see hx_run_passed); otherwise the status of the
 * failure, with run->error naming the rank. */
seldp_status hx_run_execute(hx_run *run, FILE *out);

#endif
