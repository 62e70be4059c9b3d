/* The main thread's checks of a run (step_checks.c): after initialize, and after each step
 * against the FP64 reference. */
#ifndef HX_STEP_CHECKS_H
#define HX_STEP_CHECKS_H

#include "seldp/status.h"
#include "tinymoe.h"

#include "run.h"

void hx_check_init(hx_run *run);
seldp_status hx_check_step(hx_run *run, int step, const tm_reference *ref);

#endif
