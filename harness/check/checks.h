/* The checks of a run (checks.c, docs/harness.md): their ids and results, the tensor classes of
 * the error tables; the main thread's checks after initialize and after each step are
 * step_checks.h, recording one outcome of a run's check is run.h's hx_check_record. */
#ifndef HX_CHECKS_H
#define HX_CHECKS_H

#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>

#include "seldp/seldp.h"
#include "tinymoe.h"

#include "util.h"

/* What the run checks (docs/harness.md). */
typedef enum hx_check_id {
    HX_CHECK_DIFFER_BEFORE_INIT, /* replicas differ before initialize (or the next is void) */
    HX_CHECK_INIT_REPLICAS,      /* after initialize every replica equals its root's values */
    HX_CHECK_INIT_UNTOUCHED,     /* initialize changes no parameter outside its selection */
    HX_CHECK_LOSS,               /* the ranks' mean loss equals the reference's */
    HX_CHECK_ROUTING,            /* tokens per expert equal the reference's */
    HX_CHECK_REDUCTION,          /* each reduced gradient vs the FP64 sum of its inputs */
    HX_CHECK_RANK_GRADS,         /* the ranks' FP32 gradients (before export) vs the reference */
    HX_CHECK_GRAD_ERROR,         /* reduced gradient vs the FP64 reference */
    HX_CHECK_GRAD_REPLICAS,      /* reduced gradients bit-identical over each group */
    HX_CHECK_PARAM_REPLICAS,     /* parameters bit-identical over each group, every step */
    HX_CHECK_REDUCE_UNTOUCHED,   /* a reduce leaves gradients outside its selection alone */
    HX_CHECK_ABSENT,             /* experts that no token reached have no gradient anywhere */
    HX_CHECK_GRAD_NORM,          /* --clip-grad: the global gradient norm vs the reference's */
    HX_CHECK_LOADED_REPLICAS,    /* --resume: every replica loaded its root's bytes */
    HX_CHECK_UPDATE, /* the post-step check: each update vs its FP64 step (optimizer.h) */
    HX_CHECK_COUNT
} hx_check_id;

typedef struct hx_check_result {
    int64_t tested;
    int64_t failed;
    bool metric;       /* worst/limit are meaningful (an error measure, not a bit comparison) */
    double worst;      /* largest error-to-bound ratio (a check passes at 1 or less) */
    double limit;      /* 1 */
    double bound;      /* the relative bound where the worst ratio was measured */
    double resolution; /* the largest (weakest) resolution over the tested tensors: the
                          smallest relative scale error the check would catch */
    char first_failure[400];
} hx_check_result;

/* Name of a check as the tables print it. */
const char *hx_check_name(hx_check_id id);

/* Tensor classes of tiny-moe, for per-class error tables. */
typedef enum hx_tensor_class {
    HX_CLASS_EMBED,
    HX_CLASS_NORM,
    HX_CLASS_ROUTER,
    HX_CLASS_FINAL_NORM,
    HX_CLASS_EXPERT_W1,
    HX_CLASS_EXPERT_W2,
    HX_CLASS_LORA_A,
    HX_CLASS_LORA_B,
    HX_CLASS_SHARED_EXPERT,
    HX_CLASS_COUNT
} hx_tensor_class;

const char *hx_class_name(hx_tensor_class c);

/* The class of a trainable parameter path. */
hx_tensor_class hx_class_of(const char *path);

/* Worst errors over a set of tensors: the relative error, the error-to-bound ratio of the
 * reduced gradients and of the ranks' own (tolerance model), and the resolutions. */
typedef struct hx_error_stat {
    int64_t tensors;
    double worst; /* relative error ||g - ref|| / ||ref|| (information) */
    char worst_path[128];
    int worst_rank;
    int worst_step;
    double ratio;            /* error / bound of the reduced gradients */
    double resolution;       /* their check's largest resolution */
    double model_ratio;      /* error / bound of the ranks' gradients before export */
    double model_resolution; /* its check's largest resolution */
} hx_error_stat;

/* Helpers shared by the rank phases (execute.c, reduce.c, grid_*.c) and the checks. */
void hx_tensor_to_f32(const seldp_tensor *t, float *out);
void hx_tensor_from_f32(const float *in, seldp_tensor *t);
HX_PRINTF(3, 4)
void hx_record_local(hx_check_result *c, bool failed, const char *fmt, ...);

/* Record one outcome of a metric check in `c`: its error-to-bound ratio, the relative bound
 * where the worst ratio was measured and the resolution (the body of hx_check_metric). */
void hx_check_vmetric(hx_check_result *c, bool failed, double ratio, double bound,
                      double resolution, const char *fmt, va_list ap);

/* Record one outcome in `c` (the shared body of every recording function). */
void hx_check_vnote(hx_check_result *c, bool failed, double value, const char *fmt, va_list ap);

#endif
