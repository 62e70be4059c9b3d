/* A run that left its dtypes' range (diverge.h): from the step where the FP64 reference's
 * loss or gradient no longer fits the numbers the model computes in, or either loss is not
 * finite, no check can compare the two, so none is made; the verdict stands on the steps
 * before. */
#include "diverge.h"

#include <float.h>
#include <math.h>
#include <stdio.h>

#include "bounds.h"
#include "capture.h"
#include "run.h"

/* The largest finite value of a gradient dtype. */
static double largest(seldp_dtype dtype)
{
    return dtype == SELDP_F16 ? 65504.0 : dtype == SELDP_F64 ? DBL_MAX : (double)FLT_MAX;
}

bool hx_step_diverged(hx_run *run, int step, const tm_reference *ref)
{
    hx_step_record *rec = &run->steps[step];
    if (run->diverged_step) {
        rec->diverged = true;
        return true;
    }
    /* under loss scaling an overflow is the skip's to handle (loss_scale.h), not a divergence */
    if (run->opts.loss_scale_given && run->overflow)
        return false;
    char why[sizeof run->diverged_why] = "";
    if (!isfinite(rec->ref_loss) || !isfinite(rec->loss)) {
        snprintf(why, sizeof why, "the loss is %g on the ranks and %g in the FP64 reference",
                 rec->loss, rec->ref_loss);
    } else if (!(tm_reference_largest(ref) <= (double)FLT_MAX)) {
        snprintf(why, sizeof why,
                 "the model's activations reach %.3g (a norm's sum of squares or a logit), "
                 "beyond the largest f32 (%.4g)",
                 tm_reference_largest(ref), (double)FLT_MAX);
    } else {
        /* the ranks' gradients are FP32; the members export their parts in grad_dtype, and
         * a part can be as large as the world's sum */
        const double f32 = (double)FLT_MAX;
        const double half = largest(run->grad_dtype) / (double)run->opts.world;
        const bool halves = run->grad_dtype == SELDP_F16 || run->grad_dtype == SELDP_BF16;
        const tm_model *m = run->global;
        for (size_t i = 0; i < tm_param_count(m) && !why[0]; i++) {
            const tm_param_info *p = tm_param_at(m, i);
            size_t n = 0;
            const double *g = tm_reference_grad(ref, p->path, &n);
            for (size_t k = 0; g && k < n; k++) {
                const double v = fabs(g[k]);
                if (v <= f32 && (!halves || v <= half))
                    continue;
                if (v > f32)
                    snprintf(why, sizeof why,
                             "the FP64 reference's gradient of %s reaches %.3g, beyond the "
                             "largest f32 (%.4g)",
                             p->path, v, f32);
                else
                    snprintf(why, sizeof why,
                             "the FP64 reference's gradient of %s reaches %.3g: the members' "
                             "%s parts of it may pass %.4g, the largest %s, over %d ranks",
                             p->path, v, seldp_dtype_name(run->grad_dtype),
                             largest(run->grad_dtype), seldp_dtype_name(run->grad_dtype),
                             run->opts.world);
                break;
            }
        }
        /* a member's exported part overflowed its half dtype while its FP32 gradient did not */
        for (int i = 0; halves && i < run->sets.n && !why[0]; i++) {
            const hx_capture *c = &run->capture[i];
            for (int j = 0; j < c->n && !why[0]; j++) {
                hx_capture_entry *e = &c->entries[j];
                hx_capture_settle(e);
                for (size_t k = 0; k < e->n; k++) {
                    if (isfinite(e->in_abs[k]) || !isfinite(e->local_sum[k]))
                        continue;
                    snprintf(why, sizeof why,
                             "the members' %s parts of %s overflowed (beyond %.4g) while their "
                             "FP32 gradients are finite",
                             seldp_dtype_name(run->grad_dtype), e->path, largest(run->grad_dtype));
                    break;
                }
            }
        }
    }
    if (!why[0])
        return false;
    run->diverged_step = step + 1;
    snprintf(run->diverged_why, sizeof run->diverged_why, "%s", why);
    rec->diverged = true;
    return true;
}
