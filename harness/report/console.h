/* The run's console output (console.c): the header, the replicas after initialize, and one
 * progress line per step. */
#ifndef HX_CONSOLE_H
#define HX_CONSOLE_H

#include <stdio.h>

typedef struct hx_run hx_run;

void hx_print_header(const hx_run *run, FILE *out);
void hx_print_init(const hx_run *run);
void hx_print_progress(const hx_run *run, int step, double t_step);

#endif
