/* Lockstep runs of a sweep (lockstep.h). */
#include "lockstep.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bounds.h"
#include "capture.h"
#include "grid.h"
#include "run.h"

static void step_free(hx_lock_step *s)
{
    for (int i = 0; i < s->n; i++) {
        free(s->t[i].w);
        free(s->t[i].g);
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
            const seldp_tensor *grad = rk->grads ? seldp_grads_get(rk->grads, p->id) : NULL;
            if (grad && seldp_tensor_numel(grad) == n) {
                hx_tensor_to_f32(grad, buf);
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

seldp_status hx_lockstep_step(hx_run *run, int step)
{
    hx_lockstep *l = run->lockstep;
    const hx_step_record *rec = &run->steps[step];
    hx_lock_step *s = l->mode == HX_LOCK_RECORD ? &l->record[step] : &l->own[step];
    seldp_status st = take_step(run, s, l->mode == HX_LOCK_RECORD);
    if (st != SELDP_OK)
        return st;
    s->loss = rec->loss;
    s->loss_bound = rec->loss_bound;
    s->tie = rec->ties_followed > 0;
    s->recorded = true;
    if (l->mode == HX_LOCK_RECORD)
        return SELDP_OK;
    const hx_lock_step *r = &l->record[step];
    hx_lock_result *res = &l->result[step];
    res->loss = fabs(s->loss - r->loss) / (s->loss_bound + r->loss_bound);
    res->grads = s->tie || r->tie ? NAN : 0.0;
    for (int i = 0; i < s->n && !isnan(res->grads); i++) {
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

seldp_status hx_lockstep_finish(hx_run *run)
{
    hx_lockstep *l = run->lockstep;
    int last = run->opts.steps;
    if (l->mode == HX_LOCK_RECORD) {
        seldp_status st = hx_grid_assemble(run, run->global);
        if (st == SELDP_OK)
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
        double ratio = update_ratio(l, a->w, b->w, a->n, dtype, ga->bound + gb->bound);
        if (!(ratio <= res->update)) {
            res->update = ratio;
            snprintf(res->worst, sizeof res->worst, "%s", a->path);
        }
    }
    step_free(&fin);
    return st;
}

seldp_status hx_lockstep_load(hx_rank *rk, int step)
{
    hx_run *run = rk->run;
    hx_lockstep *l = run->lockstep;
    if (!l || l->mode != HX_LOCK_FOLLOW || !l->record[step].recorded)
        return SELDP_OK;
    const hx_lock_step *r = &l->record[step];
    seldp_dtype dtype = run->opts.fp32_master ? SELDP_F32 : run->opts.model.dtype;
    rk->lock_update = 0;
    float *mine = NULL, *want = NULL;
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
            free(mine);
            free(want);
            cap = n;
            mine = hx_calloc(cap, sizeof *mine);
            want = hx_calloc(cap, sizeof *want);
            if (!mine || !want) {
                free(mine);
                free(want);
                return hx_fail(SELDP_ERR_NOMEM, "rank %d: out of memory", rk->rank);
            }
        }
        seldp_tensor lt = f32_view(q, t->w);
        hx_shard_copy(t->w, &lt, want, hx_grid_shard(run, rk->rank, p->path), false);
        float *master = rk->master ? rk->master[i] : NULL;
        if (step > 0 && l->own[step - 1].recorded && !l->own[step - 1].tie &&
            !l->record[step - 1].tie) {
            /* the previous step's update, from the same weights as the first run's */
            if (master)
                memcpy(mine, master, n * sizeof *mine);
            else
                hx_tensor_to_f32(&p->tensor, mine);
            const hx_lock_tensor *ga = tensor_of(&l->own[step - 1], lp);
            const hx_lock_tensor *gb = tensor_of(&l->record[step - 1], lp);
            double bound = (ga ? ga->bound : 0) + (gb ? gb->bound : 0);
            double ratio = update_ratio(l, mine, want, n, dtype, bound);
            if (!(ratio <= rk->lock_update))
                rk->lock_update = ratio;
        }
        if (master)
            memcpy(master, want, n * sizeof *master);
        seldp_tensor storage = p->tensor;
        hx_tensor_from_f32(want, &storage);
    }
    free(mine);
    free(want);
    return rk->gpu ? hx_gpu_upload(rk) : SELDP_OK;
}
