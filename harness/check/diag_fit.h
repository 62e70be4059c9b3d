/* The measures a step's checks keep per class of tensors for the diagnosis (diagnose.h):
 * a type of the run's record (run.h), apart from the diagnosis's code. */
#ifndef HX_DIAG_FIT_H
#define HX_DIAG_FIT_H

#include <stdbool.h>
#include <stdint.h>

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

#endif
