/* A run that diverged beyond the range of its dtypes (docs/harness.md, Checks): the step where
 * it happened and why, and the steps from there on left unchecked. */
#ifndef HX_DIVERGE_H
#define HX_DIVERGE_H

#include <stdbool.h>

#include <stddef.h>
#include <stdint.h>

#include "seldp/seldp.h"
#include "tinymoe.h"

#include "util.h"

typedef struct hx_run hx_run;

/* True when step `step` cannot be checked: an earlier step diverged, or this one's loss (the
 * ranks' or the reference's) is not finite, or an element of the reference's gradient is
 * beyond the largest value of the dtype it is compared in. The first such step is recorded
 * in run->diverged_step (1-based) and run->diverged_why; the step record is marked. */
bool hx_step_diverged(hx_run *run, int step, const tm_reference *ref);

#endif
