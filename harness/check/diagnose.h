/* The diagnosis of a failed step (diagnose.c): from what the checks saw of each class of
 * tensors — which checks failed, by what factor the reduced gradients are off — the likely
 * cause, a known framework bug (bugs.h) named with its citation, or "no known bug". */
#ifndef HX_DIAGNOSE_H
#define HX_DIAGNOSE_H

#include <stdbool.h>
#include <stdint.h>

typedef struct hx_run hx_run;

/* What a step's checks saw of one class of tensors, for the diagnosis (diagnose.c): the sums
 * of <g,ref>, <ref,ref>, <g,g>, <g-ref,g-ref> over every rank's reduced gradients, and which
 * checks failed on a tensor of the class. */
typedef enum hx_diag_class {
    HX_DIAG_EXPERT,
    HX_DIAG_EMBED,
    HX_DIAG_ROUTER,
    HX_DIAG_SHARED,
    HX_DIAG_SHARED_EXPERT,
    HX_DIAG_CLASSES
} hx_diag_class;

typedef struct hx_diag_fit {
    double gr, rr, gg, dd;
    int64_t tensors;
    bool reduction_failed; /* a result is not the mean or sum of its inputs */
    bool model_failed;     /* the ranks' own FP32 gradients are off the reference */
    bool result_failed;    /* a reduced gradient is off the reference */
    double ratio;          /* the largest result-to-input ratio where the reduction failed */
    double mdd, mrr;       /* the ranks' FP32 gradients: ||g - ref||^2 and ||ref||^2 */
} hx_diag_fit;

/* Main thread, after the checks of `step`: when a check failed in this step and no diagnosis
 * is recorded yet, write the likely cause into run->diagnosis (run->diag holds the step's
 * classes, filled by verdict.c). Nothing when every check passed. */
void hx_diagnose(hx_run *run, int step);

/* Main thread, after the post-step check of a step every rank had to skip: changed[c] of the
 * seen[c] parameters moved ([0] dense, [1] expert). One kind moving while the other held is
 * the optimizers deciding found_inf apart; the diagnosis says so (once per run). */
void hx_diagnose_skip(hx_run *run, int step, const int changed[2], const int seen[2]);

#endif
