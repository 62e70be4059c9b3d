/* The diagnosis of a failed step (diagnose.c): from what the checks saw of each class of
 * tensors — which checks failed, by what factor the reduced gradients are off — the likely
 * cause, a known framework bug (bugs.h) named with its citation, or "no known bug". */
#ifndef HX_DIAGNOSE_H
#define HX_DIAGNOSE_H

#include "diag_fit.h"

typedef struct hx_run hx_run;

/* Main thread, after the checks of `step`: when a check failed in this step and no diagnosis
 * is recorded yet, write the likely cause into run->diagnosis (run->diag holds the step's
 * classes, filled by verdict.c). Nothing when every check passed. */
void hx_diagnose(hx_run *run, int step);

/* Main thread, after the post-step check of a step every rank had to skip: changed[c] of the
 * seen[c] parameters moved ([0] dense, [1] expert). One kind moving while the other held is
 * the optimizers deciding found_inf apart; the diagnosis says so (once per run). */
void hx_diagnose_skip(hx_run *run, int step, const int changed[2], const int seen[2]);

#endif
