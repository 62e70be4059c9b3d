/* Planted framework bugs (--inject ep-scale|rank-mean|world-div|tied-twice|local-aux) and their
 * diagnosis from the gradients and the FP64 reference. */
#include "inject.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

bool hx_inject_is_framework_bug(hx_fault fault)
{
    return fault == HX_FAULT_EP_SCALE || fault == HX_FAULT_RANK_MEAN ||
           fault == HX_FAULT_WORLD_DIV || fault == HX_FAULT_TIED_TWICE ||
           fault == HX_FAULT_LOCAL_AUX;
}

const char *hx_inject_describe(hx_fault fault)
{
    switch (fault) {
    case HX_FAULT_EP_SCALE:
        return "expert gradients scaled by the EP size (DeepSpeed #6545)";
    case HX_FAULT_RANK_MEAN:
        return "each rank's token mean averaged over the ranks instead of the global token mean "
               "(torchtitan #1842)";
    case HX_FAULT_WORLD_DIV:
        return "expert gradients divided by the world size instead of the expert-data size";
    case HX_FAULT_TIED_TWICE:
        return "the tied embedding's gradient reduced a second time, as a sum over the "
               "embedding group";
    case HX_FAULT_LOCAL_AUX:
        return "the global-scope load-balancing loss normalized by each data shard's own tokens "
               "(f_e from the shard's counts over its token count; the counts never combined)";
    default:
        return "";
    }
}

/* The size of rank rk's expert-parallel group. */
static int ep_size(const hx_rank *rk)
{
    const hx_layout *l = rk->run->layout;
    return l->ep[l->ep_of[rk->rank]].size;
}

static bool expert_set(const hx_set *s)
{
    return s->kind == HX_SET_DATA || s->kind == HX_SET_EXPERT || s->kind == HX_SET_EXPERT_TP;
}

static bool dense_set(const hx_set *s)
{
    return s->kind == HX_SET_SHARED || s->kind == HX_SET_DENSE || s->kind == HX_SET_SP;
}

double hx_inject_scale(const hx_rank *rk, const hx_set *s)
{
    const hx_run *run = rk->run;
    switch (run->opts.inject) {
    case HX_FAULT_EP_SCALE:
        /* DeepSpeed #6545: the expert-data mean already has the right denominator, and the
         * expert grads are multiplied by the EP size on top of it */
        return expert_set(s) ? (double)ep_size(rk) : 1.0;
    case HX_FAULT_WORLD_DIV:
        /* a mean over the expert-data group divides by world / ep; dividing by the world
         * size instead makes the expert grads ep times too small */
        return expert_set(s) ? 1.0 / (double)ep_size(rk) : 1.0;
    case HX_FAULT_RANK_MEAN:
        /* torchtitan #1842: each rank's loss sum over its own tokens, then the mean over the
         * ranks with equal weights. The dense sets' weights become 1 (hx_inject_weight); in
         * the sum flow the experts' loss_sum / global tokens becomes loss_sum / (T_rank *
         * ranks) */
        if (rk->T == 0)
            return 1.0;
        if (dense_set(s))
            return 1.0 / (double)rk->T;
        if (expert_set(s) && s->sums)
            return (double)rk->global_tokens / ((double)rk->T * (double)run->opts.world);
        return 1.0;
    default:
        return 1.0;
    }
}

uint64_t hx_inject_weight(const hx_rank *rk, const hx_set *s, uint64_t weight)
{
    if (rk->run->opts.inject == HX_FAULT_RANK_MEAN && dense_set(s))
        return rk->T > 0 ? 1 : 0;
    return weight;
}

static void tensor_to_f32(const seldp_tensor *t, float *out)
{
    size_t n = seldp_tensor_numel(t);
    if (t->dtype == SELDP_F32)
        memcpy(out, t->data, n * sizeof(float));
    else
        seldp_half_to_f32(t->dtype, t->data, out, n);
}

static void tensor_from_f32(const float *in, const seldp_tensor *t)
{
    size_t n = seldp_tensor_numel(t);
    if (t->dtype == SELDP_F32)
        memcpy(t->data, in, n * sizeof(float));
    else
        seldp_f32_to_half(t->dtype, in, t->data, n);
}

seldp_status hx_inject_after_reduce(hx_rank *rk)
{
    if (rk->run->opts.inject != HX_FAULT_TIED_TWICE)
        return SELDP_OK;
    const seldp_tensor *g = NULL;
    const hx_rank_set *rs = NULL;
    for (size_t i = 0; i < rk->n_params && !g; i++) {
        const tm_param_info *p = tm_param_at(rk->model, i);
        if (!p->alias && strcmp(p->path, "embed.weight") == 0) {
            g = seldp_grads_get(rk->grads, p->id);
            rs = hx_rank_set_of(rk, p);
        }
    }
    if (!g || !rs)
        return hx_fail(SELDP_ERR_INTERNAL,
                       "rank %d: --inject tied-twice: no gradient of "
                       "embed.weight",
                       rk->rank);
    size_t n = seldp_tensor_numel(g);
    float *v = hx_calloc(n, sizeof *v);
    if (!v)
        return hx_fail(SELDP_ERR_NOMEM, "rank %d: out of memory", rk->rank);
    tensor_to_f32(g, v);
    /* the embedding group's allreduce of the tied copies, run over the already reduced
     * gradient: every rank adds the same mean once per member */
    seldp_status st = seldp_comm_allreduce(rs->comm, v, v, n, SELDP_F32, SELDP_HOST_DEVICE);
    if (st == SELDP_OK)
        tensor_from_f32(v, g);
    free(v);
    if (st != SELDP_OK)
        return hx_fail_lib(st,
                           "rank %d: --inject tied-twice: the second reduction of "
                           "embed.weight",
                           rk->rank);
    return SELDP_OK;
}

/* The classes the diagnosis tells apart. */
enum { DIAG_EXPERT, DIAG_EMBED, DIAG_ROUTER, DIAG_SHARED, DIAG_COUNT };

static const char *const diag_names[DIAG_COUNT] = {
    "expert gradients (layers.*.experts.*)",
    "the gradient of embed.weight (tied as lm_head.weight)",
    "the router weights (layers.*.router.weight)",
    "the other shared gradients (norms, shared expert)"};

/* Sums over every rank's gradients of one class: <g,ref>, <ref,ref>, <g,g>, <g-ref,g-ref>,
 * and whether a tensor of the class exceeded the tolerance. */
typedef struct diag_fit {
    double gr, rr, gg, dd;
    int64_t tensors;
    bool bad;
} diag_fit;

static double fit_scale(const diag_fit *f)
{
    return f->rr > 0 ? f->gr / f->rr : 0;
}

/* ||g - s ref|| / ||ref|| at the best-fit scale s: near 0 when g is a multiple of ref. */
static double fit_residual(const diag_fit *f)
{
    if (!(f->rr > 0))
        return 0;
    double s = fit_scale(f);
    double r2 = f->gg - 2 * s * f->gr + s * s * f->rr;
    return sqrt(fmax(r2, 0) / f->rr);
}

/* ||g - ref|| / ||ref|| over the class. */
static double fit_error(const diag_fit *f)
{
    return f->rr > 0 ? sqrt(f->dd / f->rr) : sqrt(f->dd);
}

static bool near(double x, double want)
{
    return fabs(x / want - 1.0) < 0.05;
}

static void fit_add(diag_fit *f, const seldp_tensor *got, const double *want, size_t n, double tol,
                    float *buf)
{
    tensor_to_f32(got, buf);
    double gr = 0, rr = 0, gg = 0, dd = 0;
    for (size_t i = 0; i < n; i++) {
        double g = buf[i], r = want[i];
        gr += g * r;
        rr += r * r;
        gg += g * g;
        dd += (g - r) * (g - r);
    }
    f->gr += gr;
    f->rr += rr;
    f->gg += gg;
    f->dd += dd;
    f->tensors++;
    if (!(sqrt(dd) <= tol * sqrt(rr)))
        f->bad = true;
}

void hx_inject_diagnose(hx_run *run, int step, const tm_reference *ref)
{
    if (run->diagnosis[0])
        return;
    diag_fit fits[DIAG_COUNT] = {{0}};
    size_t lo = SIZE_MAX, hi = 0;
    for (int r = 0; r < run->opts.world; r++) {
        const hx_rank *rk = &run->ranks[r];
        lo = rk->T < lo ? rk->T : lo;
        hi = rk->T > hi ? rk->T : hi;
        for (size_t i = 0; i < rk->n_params; i++) {
            const tm_param_info *p = tm_param_at(rk->model, i);
            if (p->alias || p->frozen || !(p->role & TM_ROLES_TRAINABLE))
                continue;
            size_t n = 0;
            const double *want = tm_reference_grad(ref, p->path, &n);
            const seldp_tensor *got = rk->grads ? seldp_grads_get(rk->grads, p->id) : NULL;
            if (!want || !got || got->dtype != run->grad_dtype || seldp_tensor_numel(got) != n)
                continue;
            float *buf = hx_calloc(n, sizeof *buf);
            if (!buf)
                return;
            int c = p->expert >= 0                         ? DIAG_EXPERT
                    : strcmp(p->path, "embed.weight") == 0 ? DIAG_EMBED
                    : strstr(p->path, ".router.")          ? DIAG_ROUTER
                                                           : DIAG_SHARED;
            fit_add(&fits[c], got, want, n, run->tolerance, buf);
            free(buf);
        }
    }
    bool any = false;
    for (int c = 0; c < DIAG_COUNT; c++)
        any = any || fits[c].bad;
    if (!any)
        return;
    char *d = run->diagnosis;
    size_t size = sizeof run->diagnosis;
    const diag_fit *ex = &fits[DIAG_EXPERT], *em = &fits[DIAG_EMBED], *sh = &fits[DIAG_SHARED];
    const diag_fit *rt = &fits[DIAG_ROUTER];
    /* a global-scope load-balancing loss with local statistics changes the forward's loss
     * (its aux term) and the router logits' gradient: the router weights deviate most, the
     * rest only through what flows back from the router; the routing itself is untouched */
    const tm_config *cfg = &run->opts.model;
    double other = fmax(fit_error(ex), fmax(fit_error(em), fit_error(sh)));
    if (rt->bad && cfg->aux_loss_coeff > 0.0 && cfg->aux_loss_scope == TM_AUX_GLOBAL &&
        run->checks[HX_CHECK_ROUTING].failed == 0 &&
        run->checks[HX_CHECK_GRAD_REPLICAS].failed == 0 && fit_error(rt) > 2.0 * other) {
        snprintf(d, size,
                 "step %d: %s deviate most (relative error %.3g, every other class at most "
                 "%.3g) with the load-balancing loss in global scope: its statistics f_e "
                 "normalized by each data shard's own token count instead of the global batch's "
                 "(the assignment counts not combined over the data shards)?",
                 step + 1, diag_names[DIAG_ROUTER], fit_error(rt), other);
        return;
    }
    /* a reduction bug leaves the forward alone: when the loss or the routing already differ
     * (a near tie between experts), the gradients differ for that reason */
    if (run->checks[HX_CHECK_LOSS].failed > 0 || run->checks[HX_CHECK_ROUTING].failed > 0) {
        snprintf(d, size,
                 "step %d: the loss or the routing already differs from the reference's, so the "
                 "gradients differ too: not a reduction bug (a near tie between experts?)",
                 step + 1);
        return;
    }
    /* the framework bugs make every rank reduce the same wrong value */
    if (run->checks[HX_CHECK_GRAD_REPLICAS].failed > 0) {
        snprintf(d, size,
                 "step %d: the replicas of a reduced gradient differ: a defect on one rank, not "
                 "a reduction mistake every rank makes (see the replica check)",
                 step + 1);
        return;
    }
    int ep = run->layout->ep[0].size;
    double se = fit_scale(ex), sm = fit_scale(em);
    bool scaled_ex = ex->bad && fit_residual(ex) < 0.05 * fabs(se);
    bool sh_bad = sh->bad || rt->bad;
    if (scaled_ex && !em->bad && !sh_bad && ep > 1 && near(se, ep))
        snprintf(d, size,
                 "step %d: %s are %d\xc3\x97 too large (EP size %d) while the shared gradients "
                 "agree: expert grads scaled by the EP size? (DeepSpeed #6545)",
                 step + 1, diag_names[DIAG_EXPERT], ep, ep);
    else if (scaled_ex && !em->bad && !sh_bad && ep > 1 && near(se * ep, 1.0))
        snprintf(d, size,
                 "step %d: %s are %d\xc3\x97 too small (EP size %d) while the shared gradients "
                 "agree: expert grads divided by the world size instead of the expert-data size?",
                 step + 1, diag_names[DIAG_EXPERT], ep, ep);
    else if (em->bad && !ex->bad && !sh_bad && fit_residual(em) < 0.05 * fabs(sm))
        snprintf(d, size,
                 "step %d: %s is %.3g\xc3\x97 too large while every other gradient agrees: the "
                 "tied embedding reduced twice?",
                 step + 1, diag_names[DIAG_EMBED], sm);
    else if ((em->bad || sh_bad) && lo != hi)
        snprintf(d, size,
                 "step %d: embed.weight and the shared gradients (norms, routers) deviate without "
                 "a common scale (best fit %.4g, residual %.3g) while the ranks held %zu to %zu "
                 "tokens: a per-rank token mean instead of the global token mean? (torchtitan "
                 "#1842)",
                 step + 1, fit_scale(sh), fit_residual(sh), lo, hi);
    else {
        int c = ex->bad ? DIAG_EXPERT : em->bad ? DIAG_EMBED : rt->bad ? DIAG_ROUTER : DIAG_SHARED;
        snprintf(d, size,
                 "step %d: %s deviate from the reference (best-fit scale %.4g, residual %.3g): "
                 "no known framework bug matches",
                 step + 1, diag_names[c], fit_scale(&fits[c]), fit_residual(&fits[c]));
    }
}
