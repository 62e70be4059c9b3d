/* The diagnosis of a failed step (diagnose.h). The checks tell apart where an error enters:
 * the ranks' own FP32 gradients (the model's computation, or the scale a framework gave a loss
 * term), the reduction of what the ranks passed (the library, a second reduction, the
 * accumulation dtype), or neither — the gradients were right and the reduction returned their
 * mean, yet the result is off the reference: the normalization the framework chose (the export
 * scale, the weights, the group) is wrong. The factor by which a class is off then names the
 * mistake, from the known-bug table (bugs.h); a router-loss scale is confirmed against a second
 * FP64 reference whose coefficients carry the suspected factor. */
#include "sets.h"
#include "diagnose.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "bugs.h"
#include "capture.h"
#include "grid.h"
#include "inject.h"
#include "microbatch.h"
#include "run.h"
#include "rank.h"
#include "checks.h"

static const char *const class_names[HX_DIAG_CLASSES] = {
    "expert gradients (layers.*.experts.*)",
    "the gradient of embed.weight (tied as lm_head.weight)",
    "the router weights (layers.*.router.weight)", "the other shared gradients (norms)",
    "the shared expert's gradients (layers.*.shared_expert.*)"};

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

/* "step N: <seen> — known bug NAME: the mistake? (citation)" into run->diagnosis (and ", or
 * <the other>" when the checks cannot tell two apart on this layout), cut to its size. */
static void name_bug(hx_run *run, int step, const char *seen, hx_fault f, hx_fault also)
{
    char cite[600], other[600] = "", text[2000];
    hx_bug_cite(f, cite, sizeof cite);
    if (also != HX_FAULT_NONE)
        hx_bug_cite(also, other, sizeof other);
    int n = snprintf(text, sizeof text, "step %d: %s \xe2\x80\x94 %s%s%s", step + 1, seen, cite,
                     other[0] ? ", or " : "", other);
    size_t len = n < 0 ? 0 : (size_t)n < sizeof text ? (size_t)n : sizeof text - 1;
    if (len >= sizeof run->diagnosis)
        len = sizeof run->diagnosis - 1;
    memcpy(run->diagnosis, text, len);
    run->diagnosis[len] = '\0';
}

/* The size of the first replica set of rank 0 of the kinds given (0 when none). */
static int first_size(const hx_run *run, hx_set_kind a, hx_set_kind b)
{
    for (int i = 0; i < run->sets.n; i++)
        if (run->sets.sets[i].kind == a || run->sets.sets[i].kind == b)
            return run->sets.sets[i].size;
    return 0;
}

static int largest_expert_set(const hx_run *run)
{
    int n = 0;
    for (int i = 0; i < run->sets.n; i++) {
        const hx_set *s = &run->sets.sets[i];
        if ((s->kind == HX_SET_DATA || s->kind == HX_SET_EXPERT) && s->size > n)
            n = s->size;
    }
    return n;
}

/* ||local / N - ref|| / ||ref|| over the routers' FP32 gradients (the members' sums as the
 * reductions captured them) against `ref`; -1 when none is comparable. */
static double router_error(const hx_run *run, const tm_reference *ref)
{
    double dd = 0, rr = 0;
    for (int i = 0; i < run->sets.n; i++) {
        const hx_set *s = &run->sets.sets[i];
        const hx_rank *rk = &run->ranks[s->root];
        for (size_t j = 0; j < rk->n_params; j++) {
            const tm_param_info *p = tm_param_at(rk->model, j);
            if (p->alias || !strstr(p->path, ".router.") || !hx_set_covers(run, s, rk->rank, p))
                continue;
            const hx_capture_entry *e = hx_capture_find(run, s, hx_grid_logical_path(p->path));
            size_t n = 0;
            const double *want = tm_reference_grad(ref, p->path, &n);
            if (!e || !want || n != e->n || rk->global_tokens == 0)
                continue;
            for (size_t k = 0; k < n; k++) {
                double d = e->local_sum[k] / (double)rk->global_tokens - want[k];
                dd += d * d;
                rr += want[k] * want[k];
            }
        }
    }
    return rr > 0 ? sqrt(dd / rr) : -1;
}

typedef struct router_hyp {
    hx_fault f;
    double aux, z; /* the coefficients' factors */
    const char *what;
    int factor;
    bool times; /* factor times the share, not 1/factor of it */
} router_hyp;

/* The router-loss scales a framework got wrong, tested against the FP64 reference of the same
 * tokens with the coefficients scaled by the suspected factor: true (the diagnosis written)
 * when one explains the routers' own gradients. */
static bool router_loss_scale(hx_run *run, int step)
{
    const tm_config *cfg = &run->opts.model;
    const hx_diag_fit *rt = &run->diag[HX_DIAG_ROUTER];
    if (!rt->model_failed || !(rt->mrr > 0))
        return false;
    router_hyp cand[3];
    int n = 0, cp = hx_inject_cp(run), dp = hx_inject_dp(run), M = hx_micro_count(run);
    if (M > 1 && (cfg->aux_loss_coeff > 0 || cfg->z_loss_coeff > 0))
        cand[n++] =
            (router_hyp){HX_FAULT_AUX_MICROBATCH, M, M, "router-loss coefficients are", M, true};
    if (cp > 1 && (cfg->aux_loss_coeff > 0 || cfg->z_loss_coeff > 0))
        cand[n++] = (router_hyp){
            HX_FAULT_AUX_CP, 1.0 / cp, 1.0 / cp, "router-loss coefficients are", cp, false};
    if (dp > 1 && cfg->aux_loss_coeff > 0 && cfg->aux_loss_scope == TM_AUX_GLOBAL)
        cand[n++] = (router_hyp){
            HX_FAULT_AUX_DP, 1.0 / dp, 1.0, "load-balancing coefficient is", dp, false};
    double before = model_error(rt);
    for (int c = 0; c < n; c++) {
        tm_config h = *cfg;
        h.aux_loss_coeff *= cand[c].aux;
        h.z_loss_coeff *= cand[c].z;
        tm_reference *ref = NULL;
        /* the same step's micro-batches and weights under the hypothesis's coefficients */
        if (hx_micro_reference_of(run, step, &h, &ref) != SELDP_OK) {
            tm_reference_destroy(ref);
            continue;
        }
        double after = router_error(run, ref);
        tm_reference_destroy(ref);
        if (after >= 0 && after < 0.1 * before) {
            /* another candidate with the same coefficients (cp = dp without a z-loss) gives
             * the same reference: the checks cannot tell them apart */
            hx_fault also = HX_FAULT_NONE;
            for (int o = 0; o < n; o++)
                if (o != c && cand[o].aux == cand[c].aux &&
                    (cand[o].z == cand[c].z || !(cfg->z_loss_coeff > 0)))
                    also = cand[o].f;
            char seen[400];
            snprintf(seen, sizeof seen,
                     "%s deviate (relative error %.3g) and match the FP64 reference whose %s "
                     "%s%d%s (relative error %.3g): the router losses' gradient is %s%d%s its "
                     "share",
                     class_names[HX_DIAG_ROUTER], before, cand[c].what, cand[c].times ? "" : "1/",
                     cand[c].factor, cand[c].times ? "\xc3\x97" : "", after,
                     cand[c].times ? "" : "1/", cand[c].factor, cand[c].times ? "\xc3\x97" : " of");
            name_bug(run, step, seen, cand[c].f, also);
            return true;
        }
    }
    return false;
}

/* The step's tokens over its last micro-batch's (1 without micro-batches). */
static double last_micro_factor(const hx_run *run)
{
    const hx_rank *rk = &run->ranks[0];
    return rk->micro_last_tokens > 0 ? (double)rk->global_tokens / (double)rk->micro_last_tokens
                                     : 1.0;
}

/* Every class the step holds is off by about factor f, with little residual (a class that
 * agrees rules it out: ep-scale's experts alone at the EP size are not every gradient). */
static bool common_scale(const hx_run *run, double f)
{
    int seen = 0;
    for (int c = 0; c < HX_DIAG_CLASSES; c++) {
        const hx_diag_fit *d = &run->diag[c];
        if (!(d->rr > 0))
            continue; /* no tensor of the class */
        if (!failed(d))
            return false;
        if (!near(fit_scale(d), f) || !(fit_residual(d) < 0.05 * fabs(f)))
            return false;
        seen++;
    }
    return seen > 0 && !near(f, 1.0);
}

void hx_diagnose_skip(hx_run *run, int step, const int changed[2], const int seen[2])
{
    if (run->diagnosis[0] || (changed[0] > 0) == (changed[1] > 0))
        return;
    int moved = changed[0] > 0 ? 0 : 1;
    char seen_text[400];
    snprintf(seen_text, sizeof seen_text,
             "in a step every rank had to skip (a non-finite gradient), %d of %d %s parameters "
             "were updated while the %s ones skipped: the dense and the expert optimizers "
             "decided found_inf apart",
             changed[moved], seen[moved], moved ? "expert" : "dense", moved ? "dense" : "expert");
    name_bug(run, step, seen_text, HX_FAULT_FOUND_INF_LOCAL, HX_FAULT_NONE);
}

void hx_diagnose(hx_run *run, int step)
{
    if (run->diagnosis[0])
        return;
    const hx_diag_fit *d = run->diag;
    const hx_diag_fit *ex = &d[HX_DIAG_EXPERT], *em = &d[HX_DIAG_EMBED];
    const hx_diag_fit *rt = &d[HX_DIAG_ROUTER], *sh = &d[HX_DIAG_SHARED];
    const hx_diag_fit *sx = &d[HX_DIAG_SHARED_EXPERT];
    bool any = false, reduction = false, model = false;
    for (int c = 0; c < HX_DIAG_CLASSES; c++) {
        any = any || failed(&d[c]);
        reduction = reduction || d[c].reduction_failed;
        model = model || d[c].model_failed;
    }
    bool norm_failed = run->checks[HX_CHECK_GRAD_NORM].failed > 0;
    if (!any && !norm_failed)
        return;
    char *out = run->diagnosis;
    size_t size = sizeof run->diagnosis;
    char seen[500];
    /* every gradient right and the norm off: the norm's own computation */
    int ep_max = 1;
    for (int g = 0; g < run->layout->n_ep; g++)
        ep_max = run->layout->ep[g].size > ep_max ? run->layout->ep[g].size : ep_max;
    if (!any && ep_max < 2) {
        snprintf(out, size,
                 "step %d: the global gradient norm differs from the FP64 reference's while every "
                 "reduced gradient agrees with it (see the norm check): the norm's own "
                 "computation; no known bug matches (without expert parallelism every rank holds "
                 "every expert)",
                 step + 1);
        return;
    }
    if (!any) {
        name_bug(run, step,
                 "the global gradient norm differs from the FP64 reference's while every "
                 "reduced gradient agrees with it (see the norm check): the norm is not the one "
                 "of the logical gradient, each tensor counted once",
                 HX_FAULT_NORM_PER_GROUP, HX_FAULT_NONE);
        return;
    }
    size_t lo = SIZE_MAX, hi = 0;
    for (int r = 0; r < run->opts.world; r++) {
        lo = run->ranks[r].T < lo ? run->ranks[r].T : lo;
        hi = run->ranks[r].T > hi ? run->ranks[r].T : hi;
    }
    bool routing_ok = run->checks[HX_CHECK_ROUTING].failed == 0;
    bool loss_ok = run->checks[HX_CHECK_LOSS].failed == 0;
    bool replicas_ok = run->checks[HX_CHECK_GRAD_REPLICAS].failed == 0;
    /* a router-loss gradient of the wrong scale: the routers' own gradients, confirmed by a
     * reference with the suspected coefficients */
    if (routing_ok && replicas_ok && router_loss_scale(run, step))
        return;
    /* a global-scope load-balancing loss with local statistics changes the forward's loss
     * (its aux term) and the ranks' own router-logit gradients: the router weights deviate
     * most, the rest only through what flows back from the router; the routing is untouched.
     * Measured on the ranks' FP32 gradients, before the export rounding hides it in bf16. */
    const tm_config *cfg = &run->opts.model;
    double other =
        fmax(fmax(model_error(ex), model_error(em)), fmax(model_error(sh), model_error(sx)));
    if (rt->model_failed && cfg->aux_loss_coeff > 0.0 && cfg->aux_loss_scope == TM_AUX_GLOBAL &&
        routing_ok && replicas_ok && model_error(rt) > 2.0 * other) {
        snprintf(seen, sizeof seen,
                 "%s deviate most (relative error %.3g, every other class at most %.3g) with the "
                 "load-balancing loss in global scope: its statistics f_e normalized by each "
                 "data shard's own token count instead of the global batch's (the assignment "
                 "counts not combined over the data shards)?",
                 class_names[HX_DIAG_ROUTER], model_error(rt), other);
        name_bug(run, step, seen, HX_FAULT_LOCAL_AUX, HX_FAULT_NONE);
        return;
    }
    /* a reduction bug leaves the forward alone: when the loss or the routing already differ
     * (a near tie between experts), the gradients differ for that reason */
    if (!loss_ok || !routing_ok) {
        snprintf(out, size,
                 "step %d: the loss or the routing already differs from the reference's, so the "
                 "gradients differ too: not a reduction bug (a near tie between experts?); no "
                 "known bug matches",
                 step + 1);
        return;
    }
    int tp = hx_inject_tp(run);
    /* the routers' and norms' gradients of each TP rank cover its own part of the sequence:
     * without the sum over TP each holds about 1/tp, and the TP ranks disagree */
    if (tp > 1 && failed(rt) && !failed(ex) && !failed(em) && !failed(sx) &&
        near(fit_scale(rt) * tp, 1.0)) {
        snprintf(seen, sizeof seen,
                 "%s and the norms are %.4g of the reference (1/tp, tp %d) and differ between "
                 "the TP ranks while the experts and the embedding agree: each TP rank kept its "
                 "own part of the sequence's gradient",
                 class_names[HX_DIAG_ROUTER], fit_scale(rt), tp);
        name_bug(run, step, seen, HX_FAULT_ROUTER_TP, HX_FAULT_NONE);
        return;
    }
    /* the framework bugs make every rank reduce the same wrong value */
    if (!replicas_ok) {
        snprintf(out, size,
                 "step %d: the replicas of a reduced gradient differ: a defect on one rank, not "
                 "a reduction mistake every rank makes (see the replica check); no known bug "
                 "matches",
                 step + 1);
        return;
    }
    double se = fit_scale(ex), sm = fit_scale(em);
    int ep = run->layout->ep[0].size;
    int dense = first_size(run, HX_SET_SHARED, HX_SET_DENSE), edp = largest_expert_set(run);
    bool scaled_ex = ex->result_failed && !ex->model_failed && !ex->reduction_failed &&
                     fit_residual(ex) < 0.05 * fabs(se);
    bool sh_bad = failed(sh) || failed(rt) || failed(sx);
    bool half = run->grad_dtype != SELDP_F32;
    bool unit_reductions = true; /* every failed reduction returns about 1x its inputs' mean */
    for (int c = 0; c < HX_DIAG_CLASSES; c++)
        if (d[c].reduction_failed && !(fabs(d[c].ratio - 1.0) < 0.02))
            unit_reductions = false;
    if (run->opts.zero && first_size(run, HX_SET_EMB, HX_SET_EMB) > 2 && em->reduction_failed &&
        !failed(ex) && !sh_bad) {
        /* the sharded reduction of the embedding set returned something else than the sum of
         * its inputs, every other set's did not: its sum was not one reduction over the set */
        snprintf(seen, sizeof seen,
                 "under the distributed optimizer, %s: its reduce-scattered ranges are off the "
                 "sum of the gradients the ranks passed (%.4g\xc3\x97 of it, best-fit scale %.4g, "
                 "residual %.3g) while every other gradient agrees: the embedding group's "
                 "cross-stage sum run on the stages' partially reduced buffers?",
                 class_names[HX_DIAG_EMBED], d[HX_DIAG_EMBED].ratio, sm, fit_residual(em));
        name_bug(run, step, seen, HX_FAULT_TIED_ZERO, HX_FAULT_NONE);
    } else if (em->reduction_failed && !failed(ex) && !sh_bad &&
               fit_residual(em) < 0.05 * fabs(sm) && fabs(d[HX_DIAG_EMBED].ratio - 1.0) > 0.5) {
        snprintf(seen, sizeof seen,
                 "%s is %.3g\xc3\x97 too large while every other gradient agrees: the tied "
                 "embedding reduced twice?",
                 class_names[HX_DIAG_EMBED], sm);
        name_bug(run, step, seen, HX_FAULT_TIED_TWICE, HX_FAULT_NONE);
    } else if (reduction && half && unit_reductions) {
        int c = ex->reduction_failed   ? HX_DIAG_EXPERT
                : em->reduction_failed ? HX_DIAG_EMBED
                : rt->reduction_failed ? HX_DIAG_ROUTER
                : sh->reduction_failed ? HX_DIAG_SHARED
                                       : HX_DIAG_SHARED_EXPERT;
        snprintf(seen, sizeof seen,
                 "the reductions of %s are off the FP64 mean or sum of their %s inputs by more "
                 "than one ulp of the %s result while their scale is right (%.4g\xc3\x97): "
                 "rounding, accumulated in %s",
                 class_names[c], seldp_dtype_name(run->grad_dtype),
                 seldp_dtype_name(run->grad_dtype), d[c].ratio, seldp_dtype_name(run->grad_dtype));
        name_bug(run, step, seen, HX_FAULT_HALF_ACCUM, HX_FAULT_NONE);
    } else if (reduction) {
        int c = ex->reduction_failed   ? HX_DIAG_EXPERT
                : em->reduction_failed ? HX_DIAG_EMBED
                : rt->reduction_failed ? HX_DIAG_ROUTER
                : sh->reduction_failed ? HX_DIAG_SHARED
                                       : HX_DIAG_SHARED_EXPERT;
        snprintf(out, size,
                 "step %d: the reductions of %s do not return the mean or sum of the inputs the "
                 "ranks passed (result %.4g\xc3\x97 of it): a defect of the reduction itself, not "
                 "of what was reduced; no known bug matches",
                 step + 1, class_names[c], d[c].ratio);
    } else if (hx_micro_count(run) > 1 && !model && common_scale(run, last_micro_factor(run))) {
        double f = last_micro_factor(run);
        snprintf(seen, sizeof seen,
                 "every gradient is %.4g\xc3\x97 the reference's (the step's %llu tokens over "
                 "the last micro-batch's %llu) while the ranks' own gradients and the reductions "
                 "of them are right: the loss normalized by the last micro-batch's tokens",
                 f, (unsigned long long)run->ranks[0].global_tokens,
                 (unsigned long long)run->ranks[0].micro_last_tokens);
        name_bug(run, step, seen, HX_FAULT_LAST_MICROBATCH, HX_FAULT_NONE);
    } else if (tp > 1 && sx->result_failed && !sx->model_failed && !failed(ex) && !failed(em) &&
               !failed(rt) && !failed(sh)) {
        snprintf(seen, sizeof seen,
                 "%s deviate (best-fit scale %.4g, residual %.3g) while the ranks' own "
                 "gradients of them, their data-parallel reductions and every other class "
                 "agree: what the ranks passed was already off, a reduction over the TP group "
                 "(tp %d) before the data-parallel one",
                 class_names[HX_DIAG_SHARED_EXPERT], fit_scale(sx), fit_residual(sx), tp);
        name_bug(run, step, seen, HX_FAULT_SHARED_EXPERT_TP, HX_FAULT_NONE);
    } else if (scaled_ex && !failed(em) && !sh_bad && ep > 1 && near(se, ep)) {
        snprintf(seen, sizeof seen,
                 "%s are %d\xc3\x97 too large (EP size %d) while the shared gradients agree: "
                 "expert grads scaled by the EP size? (DeepSpeed #6545)",
                 class_names[HX_DIAG_EXPERT], ep, ep);
        /* with expert-data groups of one rank and a dense group of the EP size, the skipped
         * normalization gives the same factor */
        name_bug(run, step, seen, HX_FAULT_EP_SCALE,
                 edp == 1 && dense > 1 && near(se, dense) ? HX_FAULT_EDP1_SKIP : HX_FAULT_NONE);
    } else if (scaled_ex && !failed(em) && !sh_bad && edp == 1 && dense > 1 && near(se, dense)) {
        snprintf(seen, sizeof seen,
                 "%s are %d\xc3\x97 too large (the dense data-parallel size %d; expert-data "
                 "groups of one rank) while the shared gradients agree",
                 class_names[HX_DIAG_EXPERT], dense, dense);
        name_bug(run, step, seen, HX_FAULT_EDP1_SKIP, HX_FAULT_NONE);
    } else if (scaled_ex && !failed(em) && !sh_bad && ep > 1 && near(se * ep, 1.0)) {
        snprintf(seen, sizeof seen,
                 "%s are %d\xc3\x97 too small (EP size %d) while the shared gradients agree: "
                 "expert grads divided by the world size instead of the expert-data size?",
                 class_names[HX_DIAG_EXPERT], ep, ep);
        name_bug(run, step, seen, HX_FAULT_WORLD_DIV, HX_FAULT_NONE);
    } else if ((failed(em) || sh_bad) && !model && lo != hi) {
        snprintf(seen, sizeof seen,
                 "embed.weight and the shared gradients (norms, routers) deviate without a "
                 "common scale (best fit %.4g, residual %.3g) while the ranks held %zu to %zu "
                 "tokens: a per-rank token mean instead of the global token mean? (torchtitan "
                 "#1842)",
                 fit_scale(sh), fit_residual(sh), lo, hi);
        name_bug(run, step, seen, HX_FAULT_RANK_MEAN, HX_FAULT_NONE);
    } else if (model) {
        int c = ex->model_failed   ? HX_DIAG_EXPERT
                : rt->model_failed ? HX_DIAG_ROUTER
                : em->model_failed ? HX_DIAG_EMBED
                : sh->model_failed ? HX_DIAG_SHARED
                                   : HX_DIAG_SHARED_EXPERT;
        snprintf(
            out, size,
            "step %d: the ranks' own FP32 gradients of %s deviate from the reference before any "
            "reduction (relative error %.3g): the model's computation, not the reduction; "
            "no known bug matches",
            step + 1, class_names[c], model_error(&d[c]));
    } else {
        int c = failed(ex)   ? HX_DIAG_EXPERT
                : failed(em) ? HX_DIAG_EMBED
                : failed(rt) ? HX_DIAG_ROUTER
                : failed(sh) ? HX_DIAG_SHARED
                             : HX_DIAG_SHARED_EXPERT;
        snprintf(out, size,
                 "step %d: %s deviate from the reference (best-fit scale %.4g, residual %.3g) "
                 "while the ranks' own gradients and the reductions of them are right: the "
                 "normalization (export scale or weights); no known bug matches",
                 step + 1, class_names[c], fit_scale(&d[c]), fit_residual(&d[c]));
    }
}
