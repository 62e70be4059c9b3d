/* The diagnosis of a failed step (diagnose.h). The checks tell apart where an error enters:
 * the ranks' own FP32 gradients (the model's computation), the reduction of what the ranks
 * passed (the library, or a second reduction), or neither — the gradients were right and the
 * reduction returned their mean, yet the result is off the reference: the normalization the
 * framework chose (the export scale, the weights) is wrong. The factor by which a class is off
 * then names the mistake. */
#include "diagnose.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static const char *const class_names[HX_DIAG_CLASSES] = {
    "expert gradients (layers.*.experts.*)",
    "the gradient of embed.weight (tied as lm_head.weight)",
    "the router weights (layers.*.router.weight)",
    "the other shared gradients (norms, shared expert)"};

static double fit_scale(const hx_diag_fit *f)
{
    return f->rr > 0 ? f->gr / f->rr : 0;
}

/* ||g - s ref|| / ||ref|| at the best-fit scale s: near 0 when g is a multiple of ref. */
static double fit_residual(const hx_diag_fit *f)
{
    if (!(f->rr > 0))
        return 0;
    double s = fit_scale(f);
    double r2 = f->gg - 2 * s * f->gr + s * s * f->rr;
    return sqrt(fmax(r2, 0) / f->rr);
}

/* ||g - ref|| / ||ref|| over the class's FP32 gradients of the ranks (before export). */
static double model_error(const hx_diag_fit *f)
{
    return f->mrr > 0 ? sqrt(f->mdd / f->mrr) : sqrt(f->mdd);
}

static bool near(double x, double want)
{
    return fabs(x / want - 1.0) < 0.05;
}

static bool failed(const hx_diag_fit *f)
{
    return f->reduction_failed || f->model_failed || f->result_failed;
}

void hx_diagnose(hx_run *run, int step)
{
    if (run->diagnosis[0])
        return;
    const hx_diag_fit *d = run->diag;
    const hx_diag_fit *ex = &d[HX_DIAG_EXPERT], *em = &d[HX_DIAG_EMBED];
    const hx_diag_fit *rt = &d[HX_DIAG_ROUTER], *sh = &d[HX_DIAG_SHARED];
    bool any = false, reduction = false, model = false;
    for (int c = 0; c < HX_DIAG_CLASSES; c++) {
        any = any || failed(&d[c]);
        reduction = reduction || d[c].reduction_failed;
        model = model || d[c].model_failed;
    }
    if (!any)
        return;
    char *out = run->diagnosis;
    size_t size = sizeof run->diagnosis;
    size_t lo = SIZE_MAX, hi = 0;
    for (int r = 0; r < run->opts.world; r++) {
        lo = run->ranks[r].T < lo ? run->ranks[r].T : lo;
        hi = run->ranks[r].T > hi ? run->ranks[r].T : hi;
    }
    /* a global-scope load-balancing loss with local statistics changes the forward's loss
     * (its aux term) and the ranks' own router-logit gradients: the router weights deviate
     * most, the rest only through what flows back from the router; the routing is untouched.
     * Measured on the ranks' FP32 gradients, before the export rounding hides it in bf16. */
    const tm_config *cfg = &run->opts.model;
    double other = fmax(model_error(ex), fmax(model_error(em), model_error(sh)));
    if (rt->model_failed && cfg->aux_loss_coeff > 0.0 && cfg->aux_loss_scope == TM_AUX_GLOBAL &&
        run->checks[HX_CHECK_ROUTING].failed == 0 &&
        run->checks[HX_CHECK_GRAD_REPLICAS].failed == 0 && model_error(rt) > 2.0 * other) {
        snprintf(out, size,
                 "step %d: %s deviate most (relative error %.3g, every other class at most "
                 "%.3g) with the load-balancing loss in global scope: its statistics f_e "
                 "normalized by each data shard's own token count instead of the global batch's "
                 "(the assignment counts not combined over the data shards)?",
                 step + 1, class_names[HX_DIAG_ROUTER], model_error(rt), other);
        return;
    }
    /* a reduction bug leaves the forward alone: when the loss or the routing already differ
     * (a near tie between experts), the gradients differ for that reason */
    if (run->checks[HX_CHECK_LOSS].failed > 0 || run->checks[HX_CHECK_ROUTING].failed > 0) {
        snprintf(out, size,
                 "step %d: the loss or the routing already differs from the reference's, so the "
                 "gradients differ too: not a reduction bug (a near tie between experts?)",
                 step + 1);
        return;
    }
    /* the framework bugs make every rank reduce the same wrong value */
    if (run->checks[HX_CHECK_GRAD_REPLICAS].failed > 0) {
        snprintf(out, size,
                 "step %d: the replicas of a reduced gradient differ: a defect on one rank, not "
                 "a reduction mistake every rank makes (see the replica check)",
                 step + 1);
        return;
    }
    double se = fit_scale(ex), sm = fit_scale(em);
    int ep = run->layout->ep[0].size;
    bool scaled_ex = ex->result_failed && !ex->model_failed && !ex->reduction_failed &&
                     fit_residual(ex) < 0.05 * fabs(se);
    bool sh_bad = failed(sh) || failed(rt);
    if (em->reduction_failed && !failed(ex) && !sh_bad && fit_residual(em) < 0.05 * fabs(sm)) {
        snprintf(out, size,
                 "step %d: %s is %.3g\xc3\x97 too large while every other gradient agrees: the "
                 "tied embedding reduced twice?",
                 step + 1, class_names[HX_DIAG_EMBED], sm);
    } else if (reduction) {
        int c = ex->reduction_failed   ? HX_DIAG_EXPERT
                : em->reduction_failed ? HX_DIAG_EMBED
                : rt->reduction_failed ? HX_DIAG_ROUTER
                                       : HX_DIAG_SHARED;
        snprintf(out, size,
                 "step %d: the reductions of %s do not return the mean or sum of the inputs the "
                 "ranks passed (result %.4g\xc3\x97 of it): a defect of the reduction itself, not "
                 "of what was reduced",
                 step + 1, class_names[c], d[c].ratio);
    } else if (scaled_ex && !failed(em) && !sh_bad && ep > 1 && near(se, ep)) {
        snprintf(out, size,
                 "step %d: %s are %d\xc3\x97 too large (EP size %d) while the shared gradients "
                 "agree: expert grads scaled by the EP size? (DeepSpeed #6545)",
                 step + 1, class_names[HX_DIAG_EXPERT], ep, ep);
    } else if (scaled_ex && !failed(em) && !sh_bad && ep > 1 && near(se * ep, 1.0)) {
        snprintf(out, size,
                 "step %d: %s are %d\xc3\x97 too small (EP size %d) while the shared gradients "
                 "agree: expert grads divided by the world size instead of the expert-data size?",
                 step + 1, class_names[HX_DIAG_EXPERT], ep, ep);
    } else if ((failed(em) || sh_bad) && !model && lo != hi) {
        snprintf(out, size,
                 "step %d: embed.weight and the shared gradients (norms, routers) deviate without "
                 "a common scale (best fit %.4g, residual %.3g) while the ranks held %zu to %zu "
                 "tokens: a per-rank token mean instead of the global token mean? (torchtitan "
                 "#1842)",
                 step + 1, fit_scale(sh), fit_residual(sh), lo, hi);
    } else if (model) {
        int c = ex->model_failed   ? HX_DIAG_EXPERT
                : rt->model_failed ? HX_DIAG_ROUTER
                : em->model_failed ? HX_DIAG_EMBED
                                   : HX_DIAG_SHARED;
        snprintf(out, size,
                 "step %d: the ranks' own FP32 %s deviate from the reference before any "
                 "reduction (relative error %.3g): the model's computation, not the reduction; "
                 "no known framework bug matches",
                 step + 1, class_names[c], model_error(&d[c]));
    } else {
        int c = failed(ex)   ? HX_DIAG_EXPERT
                : failed(em) ? HX_DIAG_EMBED
                : failed(rt) ? HX_DIAG_ROUTER
                             : HX_DIAG_SHARED;
        snprintf(out, size,
                 "step %d: %s deviate from the reference (best-fit scale %.4g, residual %.3g) "
                 "while the ranks' own gradients and the reductions of them are right: the "
                 "normalization (export scale or weights); no known framework bug matches",
                 step + 1, class_names[c], fit_scale(&d[c]), fit_residual(&d[c]));
    }
}
