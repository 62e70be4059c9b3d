/* The gradient and loss checks under the tolerance model (bounds.h, docs/tolerances.md), set
 * by set:
 *
 *   reduction     every member's result against the FP64 mean or sum of the inputs the
 *                 members really passed (capture.h), rounded once to the result dtype: within
 *                 one ulp of a half result (plus the FP32 sum's own rounding), within a few
 *                 FP32 roundings of an FP32 one. The library's whole job, exact at any size.
 *   ranks' grads  the members' FP32 gradients, summed before any export rounding and divided by
 *                 the global token count, against the FP64 reference: within c u_c ||m|| (m the
 *                 reference's magnitude). The model's computation, as sharp in bf16 as in f32.
 *   reduced grads every member's result against the FP64 reference: the model's bound plus
 *                 the roundings of the export, the sum and the result, and the best-fit scale
 *                 within its bound (a systematic error below the rounding noise).
 * Each records its error-to-bound ratio and its resolution (the smallest relative scale error
 * it would catch); a check fails above a ratio of 1. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sets.h"
#include "set_rank.h"
#include "capture.h"
#include "grid.h"
#include "checks.h"
#include "rank.h"
#include "run.h"
#include "verdict.h"

/* The reference's gradient and magnitude of rank r's occurrence p: the logical tensors, or
 * the slice its shard is. false when the reference has none (an expert no token reached). */
typedef struct ref_view {
    const double *want, *mag;
    size_t n;
    double *own; /* the slices, when p is a shard */
} ref_view;

static bool ref_of(const hx_run *run, const tm_reference *ref, int r, const tm_param_info *p,
                   ref_view *v)
{
    *v = (ref_view){0};
    v->want = tm_reference_grad(ref, p->path, &v->n);
    v->mag = tm_reference_magnitude(ref, p->path, &v->n);
    if (!v->want || !v->mag)
        return false;
    hx_shard shard = hx_grid_shard(run, r, p->path);
    if (shard.parts == 1)
        return true;
    const tm_param_info *logical = tm_param_find(run->global, hx_grid_logical_path(p->path));
    size_t n = seldp_tensor_numel(&p->tensor);
    v->own = hx_calloc(2 * n + 1, sizeof *v->own);
    if (!v->own || !logical) {
        free(v->own);
        *v = (ref_view){0};
        return false;
    }
    hx_shard_slice(v->want, &logical->tensor, shard, v->own);
    hx_shard_slice(v->mag, &logical->tensor, shard, v->own + n);
    v->want = v->own;
    v->mag = v->own + n;
    v->n = n;
    return true;
}

static double stored(const seldp_tensor *t, size_t i)
{
    switch (t->dtype) {
    case SELDP_F32:
        return ((const float *)t->data)[i];
    case SELDP_F16:
        return seldp_f16_to_f32(((const uint16_t *)t->data)[i]);
    case SELDP_BF16:
        return seldp_bf16_to_f32(((const uint16_t *)t->data)[i]);
    default:
        return NAN;
    }
}

/* Whether every element of a tensor is finite. */
static bool all_finite(const seldp_tensor *t)
{
    for (size_t i = 0; i < seldp_tensor_numel(t); i++)
        if (!isfinite(stored(t, i)))
            return false;
    return true;
}

hx_diag_class hx_diag_class_of(const tm_param_info *p)
{
    if (p->expert >= 0)
        return HX_DIAG_EXPERT;
    if (strcmp(hx_grid_logical_path(p->path), "embed.weight") == 0)
        return HX_DIAG_EMBED;
    if (strstr(p->path, ".router."))
        return HX_DIAG_ROUTER;
    if (strstr(p->path, ".shared_expert."))
        return HX_DIAG_SHARED_EXPERT;
    return HX_DIAG_SHARED;
}

static void note(hx_error_stat *s, const char *path, int rank, int step, double rel, double ratio,
                 double resolution)
{
    s->tensors++;
    if (s->tensors == 1 || rel > s->worst || isnan(rel)) {
        s->worst = rel;
        snprintf(s->worst_path, sizeof s->worst_path, "%s", path);
        s->worst_rank = rank;
        s->worst_step = step;
    }
    if (ratio > s->ratio || isnan(ratio))
        s->ratio = ratio;
    if (isfinite(resolution) && resolution > s->resolution)
        s->resolution = resolution;
}

static void note_model(hx_error_stat *s, double ratio, double resolution)
{
    if (ratio > s->model_ratio || isnan(ratio))
        s->model_ratio = ratio;
    if (isfinite(resolution) && resolution > s->model_resolution)
        s->model_resolution = resolution;
}

static void step_ratio(hx_step_record *rec, double ratio, const char *path, int rank,
                       const char *check)
{
    if (ratio > rec->ratio || isnan(ratio) || !rec->ratio_check) {
        rec->ratio = ratio;
        snprintf(rec->ratio_path, sizeof rec->ratio_path, "%s", path);
        rec->ratio_rank = rank;
        rec->ratio_check = check;
    }
}

/* One set's reduction as its members passed it this step. */
typedef struct set_step {
    const hx_set *set;
    double sigma;   /* 1 / the total weight of a mean, 1 for a sum; 0: nothing reduced */
    int active;     /* members that took part */
    double tokens;  /* the global token count */
    double unscale; /* 1 / the step's loss scale: the results are S times the loss's */
} set_step;

static set_step set_step_of(const hx_run *run, const hx_set *s)
{
    set_step ss = {s, 0, 0, 0, 1};
    double total = 0;
    for (int k = 0; k < s->size; k++) {
        uint64_t w = hx_set_weight_of(&run->ranks[s->ranks[k]], s);
        total += (double)w;
        ss.active += w > 0;
    }
    ss.sigma = s->sums ? 1.0 : total > 0 ? 1.0 / total : 0.0;
    ss.tokens = (double)run->ranks[s->ranks[0]].global_tokens;
    ss.unscale = run->loss_scale > 0 ? 1.0 / run->loss_scale : 1.0; /* --loss-scale */
    return ss;
}

/* What one member's result of one tensor measures, computed on the reference's threads
 * (tm_parallel_for) and recorded afterwards in the sets' order: its reduction against the
 * inputs, its fit to the reference and, at the set's root, the members' FP32 gradients' fit. */
typedef struct measure {
    double worst, resolution, at_S, at_R, rs, ss2; /* the reduction */
    size_t worst_i;
    hx_fit result, ranks; /* against the reference */
} measure;

/* One item of the step's checks: a member's trainable tensor in a set. */
typedef struct item {
    const hx_set *set;
    const set_step *ss;
    int r;
    const tm_param_info *p;
    const seldp_tensor *got;
    hx_capture_entry *e;
    bool has_ref;        /* the reference has it (else: an expert no token reached) */
    const char *missing; /* why there is nothing to compare, or NULL */
    bool skipped;        /* a loss-scale overflow reached it */
    measure m;
} item;

static void measure_reduction(const hx_run *run, const set_step *ss, const seldp_tensor *got,
                              const hx_capture_entry *e, measure *m)
{
    const hx_tolerance *t = &run->tol;
    double worst = 0, resolution = INFINITY, at_S = 0, at_R = 0;
    size_t worst_i = 0;
    double slack = (double)(ss->active + 1) * t->u_c, rs = 0, ss2 = 0;
    for (size_t i = 0; i < e->n; i++) {
        double S = ss->sigma * e->in_sum[i], A = ss->sigma * e->in_abs[i], R = stored(got, i);
        double target = t->result == SELDP_F32 ? S : hx_round_to(t->result, S);
        double allowed = (t->result == SELDP_F32 ? 0.5 : 1.0) * hx_ulp(t->result, S) + slack * A +
                         (double)(ss->active + 1) * t->eta_r;
        double ratio = fabs(R - target) / allowed;
        rs += R * S;
        ss2 += S * S;
        if (!(ratio <= worst)) {
            worst = ratio;
            worst_i = i;
            at_S = S;
            at_R = R;
        }
        if (fabs(S) > 0 && allowed / fabs(S) < resolution)
            resolution = allowed / fabs(S);
    }
    m->worst = worst;
    m->worst_i = worst_i;
    m->resolution = resolution;
    m->at_S = at_S;
    m->at_R = at_R;
    m->rs = rs;
    m->ss2 = ss2;
}

/* The reduction check of one member's result against the entry's inputs. */
static void check_reduction(hx_run *run, int step, const item *it)
{
    const hx_tolerance *t = &run->tol;
    const set_step *ss = it->ss;
    const measure *m = &it->m;
    const double worst = m->worst, resolution = m->resolution;
    hx_check_metric(run, HX_CHECK_REDUCTION, !(worst <= 1.0), worst, resolution, resolution,
                    "step %d: rank %d: %s over %s: element %zu is %.9g, the FP64 %s of the %d "
                    "members' inputs rounded to %s is %.9g (%.2f of the allowed difference)",
                    step + 1, it->r, it->p->path, ss->set->label, m->worst_i, m->at_R,
                    ss->set->sums ? "sum" : "mean", ss->active, seldp_dtype_name(t->result),
                    t->result == SELDP_F32 ? m->at_S : hx_round_to(t->result, m->at_S), worst);
    step_ratio(&run->steps[step], worst, it->p->path, it->r, "reduction");
    if (!(worst <= 1.0)) {
        hx_diag_fit *d = &run->diag[hx_diag_class_of(it->p)];
        d->reduction_failed = true;
        double k = m->ss2 > 0 ? m->rs / m->ss2 : 0;
        if (fabs(k) > fabs(d->ratio))
            d->ratio = k;
    }
}

/* The members' FP32 gradients against the reference (once per set and tensor). */
static void check_rank_grads(hx_run *run, int step, const item *it)
{
    const set_step *ss = it->ss;
    const tm_param_info *p = it->p;
    const hx_fit f = it->m.ranks;
    double bound = hx_fit_bound(&run->tol, &f, ss->active, false);
    double err = sqrt(f.err2), norm = sqrt(f.want2);
    double scale = hx_fit_scale(&f), sbound = hx_fit_scale_bound(&run->tol, &f, ss->active, false);
    double ratio = fmax(err / bound, fabs(scale - 1) / sbound);
    double resolution = fmin(norm > 0 ? bound / norm : INFINITY, sbound);
    hx_check_metric(run, HX_CHECK_RANK_GRADS, !(ratio <= 1.0), ratio, bound / norm, resolution,
                    "step %d: %s: the members' FP32 gradients of %s (summed before export, over "
                    "the global tokens) differ from the FP64 reference by %.3e, bound %.3e "
                    "(relative %.2e; best-fit scale %.6g, bound %.2e)",
                    step + 1, ss->set->label, p->path, err, bound, norm > 0 ? err / norm : err,
                    scale, sbound);
    note_model(&run->classes[hx_class_of(p->path)], ratio, resolution);
    hx_diag_fit *d = &run->diag[hx_diag_class_of(p)];
    d->model_failed = d->model_failed || !(ratio <= 1.0);
    d->mdd += f.err2;
    d->mrr += f.want2;
    note_model(&run->set_errors[ss->set->index], ratio, resolution);
    step_ratio(&run->steps[step], ratio, p->path, it->r, "ranks' gradients");
}

/* One member's result against the reference. Returns its bound (for the norm's). */
static double check_result(hx_run *run, int step, const item *it)
{
    const set_step *ss = it->ss;
    const tm_param_info *p = it->p;
    const int r = it->r;
    const hx_fit f = it->m.result;
    double bound = hx_fit_bound(&run->tol, &f, ss->active, true);
    double err = sqrt(f.err2), norm = sqrt(f.want2);
    double scale = hx_fit_scale(&f), sbound = hx_fit_scale_bound(&run->tol, &f, ss->active, true);
    double ratio = fmax(err / bound, fabs(scale - 1) / sbound);
    double resolution = fmin(norm > 0 ? bound / norm : INFINITY, sbound);
    double rel = norm > 0 ? err / norm : err;
    hx_check_metric(run, HX_CHECK_GRAD_ERROR, !(ratio <= 1.0), ratio, bound / norm, resolution,
                    "step %d: rank %d: %s: ||g - ref|| = %.3e, bound %.3e (relative %.2e of "
                    "%.2e); best-fit scale %.6g, bound %.2e",
                    step + 1, r, p->path, err, bound, rel, norm > 0 ? bound / norm : bound, scale,
                    sbound);
    note(&run->classes[hx_class_of(p->path)], p->path, r, step, rel, ratio, resolution);
    hx_diag_fit *d = &run->diag[hx_diag_class_of(p)];
    d->gr += f.cross;
    d->rr += f.want2;
    d->gg += f.got2;
    d->dd += f.err2;
    d->tensors++;
    d->result_failed = d->result_failed || !(ratio <= 1.0);
    note(&run->set_errors[ss->set->index], p->path, r, step, rel, ratio, resolution);
    hx_step_record *rec = &run->steps[step];
    if (rel > rec->worst || isnan(rel) || !rec->worst_path[0]) {
        rec->worst = rel;
        rec->worst_rank = r;
        snprintf(rec->worst_path, sizeof rec->worst_path, "%s", p->path);
    }
    step_ratio(rec, ratio, p->path, r, "reduced gradients");
    return bound;
}

typedef struct measure_loop {
    const hx_run *run;
    const tm_reference *ref;
    item *items;
} measure_loop;

/* Item i's measures: what depends on its tensors only, so any thread may take it. */
static void measure_item(void *ctx, int i)
{
    const measure_loop *lp = ctx;
    const hx_run *run = lp->run;
    item *it = &lp->items[i];
    if (!it->has_ref || it->missing)
        return;
    if (run->overflow && !all_finite(it->got)) {
        /* a loss-scale overflow reached it: the world skips the step, which the post-step
         * check requires (loss_scale.h) */
        it->skipped = true;
        return;
    }
    ref_view v;
    if (!ref_of(run, lp->ref, it->r, it->p, &v)) {
        it->has_ref = false; /* as an expert no token reached */
        return;
    }
    const set_step *ss = it->ss;
    const hx_capture_entry *e = it->e;
    measure *m = &it->m;
    measure_reduction(run, ss, it->got, e, m);
    for (size_t k = 0; k < v.n; k++)
        hx_fit_add(&m->result, stored(it->got, k) * ss->unscale, v.want[k], v.mag[k],
                   ss->sigma * e->in_abs[k] * ss->unscale);
    if (it->r == ss->set->root)
        for (size_t k = 0; k < e->n; k++)
            hx_fit_add(&m->ranks, e->local_sum[k] / ss->tokens, v.want[k], v.mag[k], 0);
    free(v.own);
}

/* Every member's trainable tensor of every set, in the order they are recorded. */
static item *list_items(hx_run *run, const tm_reference *ref, const set_step *steps, size_t *n)
{
    size_t count = 0, cap = 0;
    item *items = NULL;
    for (int i = 0; i < run->sets.n; i++) {
        const hx_set *s = &run->sets.sets[i];
        const set_step *ss = &steps[i];
        for (int k = 0; k < s->size; k++) {
            const hx_rank *rk = &run->ranks[s->ranks[k]];
            const int r = rk->rank;
            for (size_t j = 0; j < rk->n_params; j++) {
                const tm_param_info *p = tm_param_at(rk->model, j);
                if (p->frozen || !(p->role & TM_ROLES_TRAINABLE) || !hx_set_covers(run, s, r, p))
                    continue;
                if (count == cap) {
                    cap = cap ? 2 * cap : 256;
                    item *grown = realloc(items, cap * sizeof *items);
                    if (!grown) {
                        free(items);
                        *n = count + 1; /* not 0: the caller reports it */
                        return NULL;
                    }
                    items = grown;
                }
                item *it = &items[count++];
                *it = (item){.set = s, .ss = ss, .r = r, .p = p};
                it->got = seldp_grads_get(rk->grads, p->id);
                size_t numel = 0;
                it->has_ref = tm_reference_grad(ref, p->path, &numel) &&
                              tm_reference_magnitude(ref, p->path, &numel);
                if (!it->has_ref)
                    continue;
                hx_shard shard = hx_grid_shard(run, r, p->path);
                if (shard.parts > 1)
                    numel = seldp_tensor_numel(&p->tensor);
                it->e = hx_capture_find(run, s, hx_grid_logical_path(p->path));
                it->missing = !it->e || ss->sigma == 0 ? "no member passed one to the reduction"
                              : !it->got               ? "no reduced gradient came back"
                              : it->got->dtype != run->grad_dtype ? "it came back in another dtype"
                              : seldp_tensor_numel(it->got) != numel
                                  ? "it came back with another shape"
                                  : NULL;
            }
        }
    }
    *n = count;
    return items;
}

void hx_verdict_gradients(hx_run *run, int step, const tm_reference *ref)
{
    hx_step_record *rec = &run->steps[step];
    rec->norm_bound2 = 0;
    memset(run->diag, 0, sizeof run->diag);
    set_step *steps = hx_calloc((size_t)run->sets.n + 1, sizeof *steps);
    size_t n = 0;
    item *items = NULL;
    if (steps) {
        for (int i = 0; i < run->sets.n; i++)
            steps[i] = set_step_of(run, &run->sets.sets[i]);
        items = list_items(run, ref, steps, &n);
    }
    if (!steps || (!items && n > 0)) {
        hx_check_record(run, HX_CHECK_GRAD_ERROR, true, INFINITY,
                        "step %d: out of memory for the list of the step's gradient checks",
                        step + 1);
        free(steps);
        return;
    }
    measure_loop lp = {run, ref, items};
    tm_parallel_for((int)n, measure_item, &lp);
    for (size_t i = 0; i < n; i++) {
        const item *it = &items[i];
        const hx_set *s = it->set;
        const int r = it->r;
        const tm_param_info *p = it->p;
        if (!it->has_ref) {
            hx_check_record(run, HX_CHECK_ABSENT, it->got != NULL, 0,
                            "step %d: rank %d has a gradient of %s, but no token reached expert "
                            "%d of layer %d",
                            step + 1, r, p->path, p->expert, p->layer);
        } else if (it->missing) {
            hx_check_record(run, HX_CHECK_GRAD_ERROR, true, INFINITY,
                            "step %d: rank %d: %s over %s: %s", step + 1, r, p->path, s->label,
                            it->missing);
        } else if (!it->skipped) {
            check_reduction(run, step, it);
            double bound = check_result(run, step, it);
            if (r == s->root) {
                check_rank_grads(run, step, it);
                rec->norm_bound2 += bound * bound;
                it->e->bound = bound;
            }
        }
    }
    free(items);
    free(steps);
}

void hx_verdict_loss(hx_run *run, int step, const tm_reference *ref)
{
    hx_step_record *rec = &run->steps[step];
    const hx_tolerance *t = &run->tol;
    double mag = tm_reference_loss_magnitude(ref);
    double bound = t->c * t->u_c * mag + t->u_c * fabs(rec->ref_loss);
    double err = fabs(rec->loss - rec->ref_loss), norm = fabs(rec->ref_loss);
    double ratio = err / bound;
    rec->loss_bound = bound;
    hx_check_metric(run, HX_CHECK_LOSS, !(ratio <= 1.0), ratio, norm > 0 ? bound / norm : bound,
                    norm > 0 ? bound / norm : bound,
                    "step %d: the ranks' mean loss %.9g differs from the reference's %.9g by "
                    "%.3e, bound %.3e (magnitude %.4g)",
                    step + 1, rec->loss, rec->ref_loss, err, bound, mag);
}
