/* The gradient and loss checks of a step under the tolerance model (verdict.c). */
#ifndef HX_VERDICT_H
#define HX_VERDICT_H

#include "checks.h"
#include "diag_fit.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "seldp/seldp.h"
#include "tinymoe.h"

#include "util.h"

typedef struct hx_run hx_run;

/* Every member's reduced gradient of every set: the reduction given its inputs, the members'
 * FP32 gradients and the results against the FP64 reference; the absent experts. Reads the
 * step's inputs from run->capture. */
void hx_verdict_gradients(hx_run *run, int step, const tm_reference *ref);

/* The diagnosis class of a parameter (run.h's hx_diag_class). */
hx_diag_class hx_diag_class_of(const tm_param_info *p);

/* The ranks' mean loss against the reference's, within the model's bound of its magnitude. */
void hx_verdict_loss(hx_run *run, int step, const tm_reference *ref);

#endif
