/* Lockstep runs of a sweep (lockstep.h). */
#include "sets.h"
#include "lockstep.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bounds.h"
#include "capture.h"
#include "grid.h"
#include "optimizer.h"
#include "checks.h"
#include "gpu_rank.h"
#include "rank.h"
#include "run.h"
#include "zero.h"

static void step_free(hx_lock_step *s)
{
    for (int i = 0; i < s->n; i++) {
        free(s->t[i].w);
        free(s->t[i].g);
        free(s->t[i].m);
        free(s->t[i].v);
    }
    free(s->t);
    *s = (hx_lock_step){0};
}

seldp_status hx_lockstep_create(int steps, double lr, hx_lockstep **out)
{
    hx_lockstep *l = hx_calloc(1, sizeof *l);
    if (l) {
        l->steps = steps;
        l->lr = lr;
        l->record = hx_calloc((size_t)steps + 1, sizeof *l->record);
        l->own = hx_calloc((size_t)steps + 1, sizeof *l->own);
        l->result = hx_calloc((size_t)steps + 1, sizeof *l->result);
    }
    if (!l || !l->record || !l->own || !l->result) {
        hx_lockstep_destroy(l);
        return hx_fail(SELDP_ERR_NOMEM, "out of memory for a lockstep of %d steps", steps);
    }
    *out = l;
    return SELDP_OK;
}

void hx_lockstep_follow(hx_lockstep *l)
{
    l->mode = HX_LOCK_FOLLOW;
    for (int k = 0; k <= l->steps; k++) {
        step_free(&l->own[k]);
        l->result[k] = (hx_lock_result){0};
    }
}

void hx_lockstep_destroy(hx_lockstep *l)
{
    if (!l)
        return;
    for (int k = 0; l->record && k <= l->steps; k++)
        step_free(&l->record[k]);
    for (int k = 0; l->own && k <= l->steps; k++)
        step_free(&l->own[k]);
    free(l->record);
    free(l->own);
    free(l->result);
    free(l);
}

/* ---- the logical tensors of a step ------------------------------------------------------- */

/* One F32 view of logical tensor q holding `data`. */
static seldp_tensor f32_view(const tm_param_info *q, void *data)
{
    seldp_tensor t = q->tensor;
    t.dtype = SELDP_F32;
    t.data = data;
    return t;
}

static hx_lock_tensor *tensor_of(hx_lock_step *s, const char *path)
{
    for (int i = 0; i < s->n; i++)
        if (strcmp(s->t[i].path, path) == 0)
            return &s->t[i];
    return NULL;
}

/* The step's tensors: every trainable logical tensor of run->global, weights from every set
 * root's parameters (or FP32 masters), gradients from their reduced gradients, bounds from
 * the checks' (capture entries). */
static seldp_status take_step(const hx_run *run, hx_lock_step *s, bool weights)
{
    const tm_model *g = run->global;
    size_t count = tm_param_count(g);
    bool adamw = run->opts.optimizer == HX_OPT_ADAMW;
    /* the gradients of the loss, not of S times it */
    double unscale = run->loss_scale > 0 ? 1.0 / run->loss_scale : 1.0;
    step_free(s);
    s->t = hx_calloc(count + 1, sizeof *s->t);
    if (!s->t)
        return hx_fail(SELDP_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < count; i++) {
        const tm_param_info *q = tm_param_at(g, i);
        if (q->alias || q->frozen || !(q->role & TM_ROLES_TRAINABLE))
            continue;
        hx_lock_tensor *t = &s->t[s->n++];
        snprintf(t->path, sizeof t->path, "%s", q->path);
        t->n = seldp_tensor_numel(&q->tensor);
        t->w = weights ? hx_calloc(t->n + 1, sizeof *t->w) : NULL;
        t->g = hx_calloc(t->n + 1, sizeof *t->g);
        if ((weights && !t->w) || !t->g)
            return hx_fail(SELDP_ERR_NOMEM, "out of memory");
        if (weights && adamw) {
            t->m = hx_calloc(t->n + 1, sizeof *t->m);
            t->v = hx_calloc(t->n + 1, sizeof *t->v);
            if (!t->m || !t->v)
                return hx_fail(SELDP_ERR_NOMEM, "out of memory");
        }
    }
    /* from every set root's occurrences; bounds of a tensor split over sets in quadrature */
    float *buf = NULL;
    size_t cap = 0;
    seldp_status st = SELDP_OK;
    for (int r = 0; r < run->opts.world && st == SELDP_OK; r++) {
        const hx_rank *rk = &run->ranks[r];
        for (size_t i = 0; i < rk->n_params; i++) {
            const tm_param_info *p = tm_param_at(rk->model, i);
            const hx_set *set = hx_set_of(run, r, p);
            if (p->frozen || !(p->role & TM_ROLES_TRAINABLE) || !set || set->root != r)
                continue;
            const char *lp = hx_grid_logical_path(p->path);
            hx_lock_tensor *t = tensor_of(s, lp);
            const tm_param_info *q = tm_param_find(g, lp);
            size_t n = seldp_tensor_numel(&p->tensor);
            if (!t || !q)
                continue;
            if (n > cap) {
                free(buf);
                cap = n;
                buf = hx_calloc(cap, sizeof *buf);
                if (!buf)
                    return hx_fail(SELDP_ERR_NOMEM, "out of memory");
            }
            hx_shard shard = hx_grid_shard(run, r, p->path);
            if (t->w) {
                if (rk->master && rk->master[i])
                    memcpy(buf, rk->master[i], n * sizeof *buf);
                else
                    hx_tensor_to_f32(&p->tensor, buf);
                seldp_tensor lt = f32_view(q, t->w);
                hx_shard_copy(t->w, &lt, buf, shard, true);
            }
            float *m = NULL, *v = NULL;
            if (t->m && hx_opt_moments((hx_rank *)rk, i, &m, &v)) {
                seldp_tensor lt = f32_view(q, t->m);
                hx_shard_copy(t->m, &lt, m, shard, true);
                lt = f32_view(q, t->v);
                hx_shard_copy(t->v, &lt, v, shard, true);
                t->steps = rk->opt->p[i].steps;
            }
            const seldp_tensor *grad = rk->grads ? seldp_grads_get(rk->grads, p->id) : NULL;
            if (grad && seldp_tensor_numel(grad) == n) {
                hx_tensor_to_f32(grad, buf);
                if (unscale != 1.0)
                    for (size_t j = 0; j < n; j++)
                        buf[j] = (float)(buf[j] * unscale);
                seldp_tensor lt = f32_view(q, t->g);
                hx_shard_copy(t->g, &lt, buf, shard, true);
            }
            const hx_capture_entry *e = hx_capture_find(run, set, lp);
            if (e)
                t->bound = sqrt(t->bound * t->bound + e->bound * e->bound);
        }
    }
    free(buf);
    return st;
}

static double distance(const float *a, const float *b, size_t n)
{
    double d = 0;
    for (size_t i = 0; i < n; i++)
        d += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
    return sqrt(d);
}

/* --clip-grad: the coefficient the step's update scales the gradients by (the library's
 * min(1, max_norm / (norm + 1e-6)), in the units of S times the loss under --loss-scale). */
static double clip_coef(const hx_run *run)
{
    double c = run->opts.clip_grad;
    if (!(c > 0) || run->opts.world < 1)
        return 1.0;
    double S = run->loss_scale > 0 ? run->loss_scale : 1.0;
    double coef = c * S / (run->ranks[0].grad_norm * S + 1e-6);
    return isfinite(coef) && coef < 1.0 ? coef : 1.0;
}

seldp_status hx_lockstep_step(hx_run *run, int step)
{
    hx_lockstep *l = run->lockstep;
    const hx_step_record *rec = &run->steps[step];
    hx_lock_step *s = l->mode == HX_LOCK_RECORD ? &l->record[step] : &l->own[step];
    seldp_status st = SELDP_OK;
    /* --zero 1: the record's weights and state whole on every member (each range's owner's) */
    if (l->mode == HX_LOCK_RECORD)
        st = hx_zero_consolidate(run, false);
    if (st == SELDP_OK)
        st = take_step(run, s, l->mode == HX_LOCK_RECORD);
    if (st != SELDP_OK)
        return st;
    s->loss = rec->loss;
    s->loss_bound = rec->loss_bound;
    s->tie = rec->ties_followed > 0;
    s->skipped = run->overflow;
    s->loss_scale = run->loss_scale > 0 ? run->loss_scale : 1.0;
    s->clip_coef = clip_coef(run);
    s->recorded = true;
    if (l->mode == HX_LOCK_RECORD)
        return SELDP_OK;
    const hx_lock_step *r = &l->record[step];
    hx_lock_result *res = &l->result[step];
    res->loss = fabs(s->loss - r->loss) / (s->loss_bound + r->loss_bound);
    res->grads = s->tie || r->tie ? NAN : 0.0;
    if (s->skipped != r->skipped) {
        res->grads = INFINITY; /* one run overflowed alone */
        snprintf(res->worst, sizeof res->worst, "the skip of an overflow");
    } else if (s->skipped) {
        res->grads = 0.0; /* both overflowed: non-finite gradients, nothing to compare */
    }
    for (int i = 0; i < s->n && !isnan(res->grads) && !s->skipped && !r->skipped; i++) {
        const hx_lock_tensor *a = &s->t[i], *b = tensor_of((hx_lock_step *)r, a->path);
        if (!b || b->n != a->n) {
            res->grads = INFINITY;
            snprintf(res->worst, sizeof res->worst, "%s", a->path);
            break;
        }
        double ratio = distance(a->g, b->g, a->n) / (a->bound + b->bound);
        if (!(ratio <= res->grads)) {
            res->grads = ratio;
            snprintf(res->worst, sizeof res->worst, "%s", a->path);
        }
    }
    /* the update of the previous step, compared by the ranks as they loaded this one */
    if (step > 0)
        for (int k = 0; k < run->opts.world; k++)
            if (!(run->ranks[k].lock_update <= l->result[step - 1].update))
                l->result[step - 1].update = run->ranks[k].lock_update;
    return SELDP_OK;
}

/* ||w' - w0'|| against lr (B + B0) + the spacing of w0' in dtype: the update bound. */
static double update_ratio(const hx_lockstep *l, const float *w, const float *w0, size_t n,
                           seldp_dtype dtype, double bound)
{
    double ulp2 = 0;
    for (size_t i = 0; i < n; i++) {
        double u = hx_ulp(dtype, w0[i]);
        ulp2 += u * u;
    }
    return distance(w, w0, n) / (l->lr * bound + sqrt(ulp2) + 1e-300);
}

/* The state of one tensor's elements at the start of a step and what each run did in it. */
typedef struct adamw_case {
    const float *w0, *m0, *v0; /* the record's start */
    int64_t steps0;
    const float *ga, *gb; /* the follower's and the record's unscaled reduced gradients */
    double ca, cb;        /* their clipping coefficients */
    bool skip_a, skip_b;
    double u;   /* the relative rounding of a clipped gradient (one ulp of the gradients' dtype:
                   clipping scales them in place) */
    double sub; /* its absolute rounding where it is subnormal */
} adamw_case;

/* One ulp (relative) of the gradients' dtype: the rounding --clip-grad's in-place scaling and
 * --loss-scale's unscaling give a gradient before the update. */
static double gradient_ulp(seldp_dtype dtype)
{
    return dtype == SELDP_BF16 ? 0x1p-7 : dtype == SELDP_F16 ? 0x1p-10 : 0x1p-23;
}

/* The spacing of the gradients' dtype's subnormals. */
static double gradient_subnormal(seldp_dtype dtype)
{
    return dtype == SELDP_F16 ? 0x1p-24 : dtype == SELDP_BF16 ? 0x1p-133 : 0x1p-149;
}

/* The FP64 AdamW step of one element and its bound, the bound widened by the step's change
 * under one rounding of the (clipped) gradient. */
static double expected_update(const hx_options *o, const adamw_case *c, size_t j, double g,
                              double *bound)
{
    double w, b, wp, wm, bp;
    int64_t t = c->steps0 + 1;
    hx_opt_expected(o, t, g, c->w0[j], c->m0[j], c->v0[j], &w, &b);
    /* the gradient's rounding: relative, and absolute where it is subnormal */
    double d = c->u * fabs(g) + c->sub;
    hx_opt_expected(o, t, g + d, c->w0[j], c->m0[j], c->v0[j], &wp, &bp);
    hx_opt_expected(o, t, g - d, c->w0[j], c->m0[j], c->v0[j], &wm, &bp);
    *bound = b + fmax(fabs(wp - w), fabs(wm - w));
    return w;
}

/* AdamW: the worst element of [lo, hi) of w1 - w1b (the follower's and the record's weights
 * after the step) against what the two gradients explain, over its bound. */
static double adamw_ratio(const hx_options *o, const adamw_case *c, const float *w1,
                          const float *w1b, size_t lo, size_t hi)
{
    if (c->skip_a != c->skip_b)
        return INFINITY;
    double worst = 0.0;
    for (size_t j = lo; j < hi; j++) {
        double want = 0.0, bound = 0x1p-149;
        if (!c->skip_a) {
            double ba, bb;
            double wa = expected_update(o, c, j, (double)c->ga[j] * c->ca, &ba);
            double wb = expected_update(o, c, j, (double)c->gb[j] * c->cb, &bb);
            want = wa - wb;
            bound += ba + bb;
        }
        double r = fabs(((double)w1[j] - w1b[j]) - want) / bound;
        if (!(r <= worst))
            worst = r;
    }
    return worst;
}

seldp_status hx_lockstep_finish(hx_run *run)
{
    hx_lockstep *l = run->lockstep;
    int last = run->opts.steps;
    if (l->mode == HX_LOCK_RECORD) {
        seldp_status st = hx_grid_assemble(run, run->global);
        if (st == SELDP_OK) /* --zero 1: made whole after the last update (execute.c) */
            st = take_step(run, &l->record[last], true);
        l->record[last].recorded = st == SELDP_OK;
        return st;
    }
    hx_lock_step fin = {0};
    seldp_status st = hx_grid_assemble(run, run->global);
    if (st == SELDP_OK)
        st = take_step(run, &fin, true);
    seldp_dtype dtype = run->opts.fp32_master ? SELDP_F32 : run->opts.model.dtype;
    hx_lock_result *res = &l->result[last - 1];
    bool tie = l->own[last - 1].tie || l->record[last - 1].tie;
    for (int i = 0; st == SELDP_OK && !tie && i < fin.n; i++) {
        const hx_lock_tensor *a = &fin.t[i], *b = tensor_of(&l->record[last], a->path);
        const hx_lock_tensor *ga = tensor_of(&l->own[last - 1], a->path);
        const hx_lock_tensor *gb = tensor_of(&l->record[last - 1], a->path);
        if (!b || !ga || !gb || b->n != a->n)
            continue;
        const hx_lock_tensor *start = tensor_of(&l->record[last - 1], a->path);
        double ratio;
        if (start && start->m) {
            adamw_case c = {start->w,
                            start->m,
                            start->v,
                            start->steps,
                            ga->g,
                            gb->g,
                            l->own[last - 1].clip_coef,
                            l->record[last - 1].clip_coef,
                            l->own[last - 1].skipped,
                            l->record[last - 1].skipped,
                            gradient_ulp(run->grad_dtype),
                            gradient_subnormal(run->grad_dtype)};
            ratio = adamw_ratio(&run->opts, &c, a->w, b->w, 0, a->n);
        } else {
            ratio = update_ratio(l, a->w, b->w, a->n, dtype, ga->bound + gb->bound);
        }
        if (!(ratio <= res->update)) {
            res->update = ratio;
            snprintf(res->worst, sizeof res->worst, "%s", a->path);
        }
    }
    step_free(&fin);
    return st;
}

/* Logical tensor t's values (`from`, NULL: none) as rank rk's shard of p, into `to`. */
static const float *shard_of(const hx_rank *rk, const tm_param_info *p, const tm_param_info *q,
                             const float *from, float *to)
{
    if (!from)
        return NULL;
    seldp_tensor lt = f32_view(q, (void *)from);
    hx_shard_copy((float *)from, &lt, to, hx_grid_shard(rk->run, rk->rank, p->path), false);
    return to;
}

enum { B_WANT, B_MINE, B_W0, B_M0, B_V0, B_GA, B_GB, N_BUFS };

/* The previous step's update of occurrence i against the record's (rank side), its ratio. */
static double previous_update(hx_rank *rk, size_t i, int step, const tm_param_info *q,
                              float *const *buf)
{
    hx_run *run = rk->run;
    hx_lockstep *l = run->lockstep;
    const tm_param_info *p = tm_param_at(rk->model, i);
    const char *lp = hx_grid_logical_path(p->path);
    size_t n = seldp_tensor_numel(&p->tensor);
    float *master = rk->master ? rk->master[i] : NULL;
    if (master)
        memcpy(buf[B_MINE], master, n * sizeof(float));
    else
        hx_tensor_to_f32(&p->tensor, buf[B_MINE]);
    size_t lo = 0, hi = n; /* --zero 1: the range this rank updated */
    hx_zero_owned(rk, i, &lo, &hi);
    const hx_lock_tensor *ga = tensor_of(&l->own[step - 1], lp);
    const hx_lock_tensor *gb = tensor_of(&l->record[step - 1], lp);
    const hx_lock_tensor *start = gb;
    if (start && start->m && ga && ga->g && gb->g) {
        adamw_case c = {shard_of(rk, p, q, start->w, buf[B_W0]),
                        shard_of(rk, p, q, start->m, buf[B_M0]),
                        shard_of(rk, p, q, start->v, buf[B_V0]),
                        start->steps,
                        shard_of(rk, p, q, ga->g, buf[B_GA]),
                        shard_of(rk, p, q, gb->g, buf[B_GB]),
                        l->own[step - 1].clip_coef,
                        l->record[step - 1].clip_coef,
                        l->own[step - 1].skipped,
                        l->record[step - 1].skipped,
                        gradient_ulp(run->grad_dtype),
                        gradient_subnormal(run->grad_dtype)};
        return adamw_ratio(&run->opts, &c, buf[B_MINE], buf[B_WANT], lo, hi);
    }
    seldp_dtype dtype = run->opts.fp32_master ? SELDP_F32 : run->opts.model.dtype;
    double bound = (ga ? ga->bound : 0) + (gb ? gb->bound : 0);
    return update_ratio(l, buf[B_MINE] + lo, buf[B_WANT] + lo, hi - lo, dtype, bound);
}

seldp_status hx_lockstep_load(hx_rank *rk, int step)
{
    hx_run *run = rk->run;
    hx_lockstep *l = run->lockstep;
    if (!l || l->mode != HX_LOCK_FOLLOW || !l->record[step].recorded)
        return SELDP_OK;
    const hx_lock_step *r = &l->record[step];
    seldp_status st = SELDP_OK;
    rk->lock_update = 0;
    /* --loss-scale: the scale the record's step used */
    if (run->opts.loss_scale_given)
        rk->loss_scale = r->loss_scale;
    float *buf[N_BUFS] = {0};
    size_t cap = 0;
    for (size_t i = 0; i < rk->n_params; i++) {
        const tm_param_info *p = tm_param_at(rk->model, i);
        if (p->alias || p->frozen || !(p->role & TM_ROLES_TRAINABLE))
            continue;
        const char *lp = hx_grid_logical_path(p->path);
        const hx_lock_tensor *t = tensor_of((hx_lock_step *)r, lp);
        const tm_param_info *q = tm_param_find(run->global, lp);
        size_t n = seldp_tensor_numel(&p->tensor);
        if (!t || !q)
            continue;
        if (n > cap) {
            cap = n;
            for (int b = 0; b < N_BUFS; b++) {
                free(buf[b]);
                buf[b] = hx_calloc(cap, sizeof(float));
                if (!buf[b])
                    HX_FAIL(SELDP_ERR_NOMEM, "rank %d: out of memory", rk->rank);
            }
        }
        shard_of(rk, p, q, t->w, buf[B_WANT]);
        if (step > 0 && l->own[step - 1].recorded && !l->own[step - 1].tie &&
            !l->record[step - 1].tie) {
            /* the previous step's update, from the same weights as the first run's */
            double ratio = previous_update(rk, i, step, q, buf);
            if (!(ratio <= rk->lock_update))
                rk->lock_update = ratio;
        }
        float *master = rk->master ? rk->master[i] : NULL;
        if (master)
            memcpy(master, buf[B_WANT], n * sizeof *master);
        seldp_tensor storage = p->tensor;
        hx_tensor_from_f32(buf[B_WANT], &storage);
        /* AdamW: the record's moments and step count */
        float *m = NULL, *v = NULL;
        if (t->m && hx_opt_moments(rk, i, &m, &v)) {
            shard_of(rk, p, q, t->m, m);
            shard_of(rk, p, q, t->v, v);
            hx_opt_set_steps(rk, i, t->steps);
        }
    }
    if (rk->gpu)
        st = hx_gpu_upload(rk);
fail:
    for (int b = 0; b < N_BUFS; b++)
        free(buf[b]);
    return st;
}
