/* The ranks' update: SGD or AdamW (optimizer.h, docs/harness.md, Optimizers). */
#define _POSIX_C_SOURCE 200809L

#include "optimizer.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "clip.h"
#include "grid.h"
#include "gpu_rank.h"
#include "loss_scale.h"
#include "run.h"
#include "rank.h"
#include "checks.h"

seldp_status hx_opt_check(const hx_run *run)
{
    const hx_options *o = &run->opts;
    if (o->optimizer == HX_OPT_ADAMW && o->save_dir && hx_backend_multiprocess(run->backend))
        return hx_fail(SELDP_ERR_INVALID_ARGUMENT,
                       "--optimizer adamw with --save under one rank per process: the index's "
                       "step counts need every rank's optimizer state in one process");
    return SELDP_OK;
}

void hx_opt_destroy(hx_opt *opt)
{
    if (!opt)
        return;
    for (size_t i = 0; i < opt->n; i++) {
        hx_opt_param *q = &opt->p[i];
        free(q->master);
        free(q->exp_avg);
        free(q->exp_avg_sq);
        free(q->w0);
        free(q->g);
        free(q->m0);
        free(q->v0);
        free(q->stored0);
    }
    free(opt->p);
    free(opt);
}

/* The FP32 weights the update of occurrence i works on: --fp32-master's, AdamW's own master of a
 * half parameter, or NULL (the stored parameter, upcast for the update). */
static float *master_of(const hx_rank *rk, size_t i)
{
    if (rk->master && rk->master[i])
        return rk->master[i];
    return rk->opt ? rk->opt->p[i].master : NULL;
}

void hx_opt_weights(const hx_rank *rk, size_t i, float *out)
{
    const tm_param_info *p = tm_param_at(rk->model, i);
    const float *m = master_of(rk, i);
    if (m)
        memcpy(out, m, seldp_tensor_numel(&p->tensor) * sizeof *out);
    else
        hx_tensor_to_f32(&p->tensor, out);
}

/* The record and state arrays of a parameter of n elements, allocated at its first update. */
static seldp_status ensure(hx_rank *rk, size_t i, size_t n)
{
    hx_opt_param *q = &rk->opt->p[i];
    const tm_param_info *p = tm_param_at(rk->model, i);
    bool adamw = rk->run->opts.optimizer == HX_OPT_ADAMW;
    if (!q->w0) {
        q->w0 = hx_calloc(n, sizeof *q->w0);
        q->g = hx_calloc(n, sizeof *q->g);
        q->stored0 = hx_calloc(seldp_tensor_nbytes(&p->tensor), 1);
        if (adamw) {
            q->m0 = hx_calloc(n, sizeof *q->m0);
            q->v0 = hx_calloc(n, sizeof *q->v0);
            q->exp_avg = hx_calloc(n, sizeof *q->exp_avg);
            q->exp_avg_sq = hx_calloc(n, sizeof *q->exp_avg_sq);
        }
        if (adamw && p->tensor.dtype != SELDP_F32 && !(rk->master && rk->master[i])) {
            q->master = hx_calloc(n, sizeof *q->master);
            if (q->master)
                hx_tensor_to_f32(&p->tensor, q->master);
        }
    }
    if (!q->w0 || !q->g || !q->stored0 ||
        (adamw && (!q->m0 || !q->v0 || !q->exp_avg || !q->exp_avg_sq ||
                   (p->tensor.dtype != SELDP_F32 && !master_of(rk, i)))))
        return hx_fail(SELDP_ERR_NOMEM, "rank %d: out of memory for the optimizer state of %s",
                       rk->rank, p->path);
    return SELDP_OK;
}

/* torch.optim.AdamW's step of one tensor in FP32 (its single-tensor loop): the moments by
 * (beta, 1 - beta), the bias corrections in double, w *= 1 - lr wd, then
 * w -= lr / bc1 * m / (sqrt(v) / sqrt(bc2) + eps). */
static void adamw(const hx_options *o, int64_t t, size_t n, const float *g, float *w, float *m,
                  float *v)
{
    const float b1 = (float)o->adam_beta1, omb1 = (float)(1.0 - o->adam_beta1);
    const float b2 = (float)o->adam_beta2, omb2 = (float)(1.0 - o->adam_beta2);
    const double bc1 = 1.0 - pow(o->adam_beta1, (double)t);
    const double bc2 = 1.0 - pow(o->adam_beta2, (double)t);
    const float step_size = (float)(o->lr / bc1), sqrt_bc2 = (float)sqrt(bc2);
    const float eps = (float)o->adam_eps, decay = (float)(1.0 - o->lr * o->weight_decay);
    for (size_t j = 0; j < n; j++) {
        m[j] = b1 * m[j] + omb1 * g[j];
        v[j] = b2 * v[j] + omb2 * (g[j] * g[j]);
        float denom = sqrtf(v[j]) / sqrt_bc2 + eps;
        w[j] = w[j] * decay - step_size * (m[j] / denom);
    }
}

/* Elements [off, off + cnt) of occurrence i updated from the gradient values g (cnt floats):
 * the whole parameter (off 0, cnt numel) or, under --zero 1, a piece of the rank's range. The
 * record keeps the state before the update; with `out` (a range to all-gather) the updated FP32
 * values go there and the stored parameter is left to the all-gather, else it is the update
 * rounded to its dtype. */
seldp_status hx_opt_update_elements(hx_rank *rk, size_t i, size_t off, size_t cnt, const float *g,
                                    bool skip, float *out)
{
    const hx_options *o = &rk->run->opts;
    const tm_param_info *p = tm_param_at(rk->model, i);
    hx_opt_param *q = &rk->opt->p[i];
    size_t n = seldp_tensor_numel(&p->tensor);
    seldp_status st = ensure(rk, i, n);
    if (st != SELDP_OK)
        return st;
    float *master = master_of(rk, i);
    float *w = master ? master : hx_calloc(n, sizeof *w);
    if (!w)
        return hx_fail(SELDP_ERR_NOMEM, "rank %d: out of memory", rk->rank);
    if (!master)
        hx_tensor_to_f32(&p->tensor, w);
    memcpy(q->w0, w, n * sizeof *w);
    if (!q->snap)
        memcpy(q->stored0, p->tensor.data, seldp_tensor_nbytes(&p->tensor));
    q->snap = true;
    if (q->exp_avg) {
        memcpy(q->m0, q->exp_avg, n * sizeof *q->m0);
        memcpy(q->v0, q->exp_avg_sq, n * sizeof *q->v0);
    }
    memset(q->g, 0, n * sizeof *q->g);
    memcpy(q->g + off, g, cnt * sizeof *g);
    q->steps0 = q->steps;
    q->has_grad = true;
    if (!skip) {
        if (o->optimizer == HX_OPT_ADAMW) {
            adamw(o, q->steps + 1, cnt, q->g + off, w + off, q->exp_avg + off, q->exp_avg_sq + off);
        } else {
            for (size_t j = off; j < off + cnt; j++)
                w[j] -= (float)o->lr * q->g[j];
        }
        if (out) {
            memcpy(out, w + off, cnt * sizeof *out);
        } else {
            seldp_tensor storage = p->tensor;
            hx_tensor_from_f32(w, &storage);
        }
        q->steps++;
        q->updated = true;
    }
    if (!master)
        free(w);
    return SELDP_OK;
}

seldp_status hx_opt_snapshot(hx_rank *rk, size_t i)
{
    const tm_param_info *p = tm_param_at(rk->model, i);
    hx_opt_param *q = &rk->opt->p[i];
    size_t bytes = seldp_tensor_nbytes(&p->tensor);
    if (!q->stored0)
        q->stored0 = hx_calloc(bytes, 1);
    if (!q->stored0)
        return hx_fail(SELDP_ERR_NOMEM, "rank %d: out of memory", rk->rank);
    memcpy(q->stored0, p->tensor.data, bytes);
    q->snap = true;
    return SELDP_OK;
}

/* One parameter's update from its reduced gradient gt. */
static seldp_status update_param(hx_rank *rk, size_t i, const seldp_tensor *gt, bool skip)
{
    const tm_param_info *p = tm_param_at(rk->model, i);
    size_t n = seldp_tensor_numel(&p->tensor);
    float *g = hx_calloc(n, sizeof *g);
    if (!g)
        return hx_fail(SELDP_ERR_NOMEM, "rank %d: out of memory", rk->rank);
    hx_tensor_to_f32(gt, g);
    /* --loss-scale: the gradient of the loss, not of S times it */
    double unscale = 1.0 / hx_loss_scale_factor(rk);
    if (unscale != 1.0)
        for (size_t j = 0; j < n; j++)
            g[j] = (float)(g[j] * unscale);
    seldp_status st = hx_opt_update_elements(rk, i, 0, n, g, skip, NULL);
    free(g);
    return st;
}

bool hx_opt_keeps_master(const hx_options *o, seldp_dtype dtype)
{
    return o->fp32_master || (o->optimizer == HX_OPT_ADAMW && dtype != SELDP_F32);
}

bool hx_opt_moments(hx_rank *rk, size_t i, float **exp_avg, float **exp_avg_sq)
{
    const tm_param_info *p = tm_param_at(rk->model, i);
    if (rk->run->opts.optimizer != HX_OPT_ADAMW || p->alias || p->frozen ||
        !(p->role & TM_ROLES_TRAINABLE) || hx_opt_ensure(rk) != SELDP_OK ||
        ensure(rk, i, seldp_tensor_numel(&p->tensor)) != SELDP_OK)
        return false;
    *exp_avg = rk->opt->p[i].exp_avg;
    *exp_avg_sq = rk->opt->p[i].exp_avg_sq;
    return true;
}

void hx_opt_set_steps(hx_rank *rk, size_t i, int64_t steps)
{
    if (hx_opt_ensure(rk) == SELDP_OK)
        rk->opt->p[i].steps = steps;
}

void hx_opt_ckpt_json(const hx_run *run, hx_buf *b)
{
    const hx_options *o = &run->opts;
    hx_buf_printf(b, ", \"optimizer\": \"%s\"", hx_optimizer_name(o->optimizer));
    {
        hx_buf steps = {0};
        char key[200];
        for (int r = 0; r < o->world; r++) {
            const hx_rank *rk = &run->ranks[r];
            for (size_t i = 0; rk->opt && i < rk->opt->n; i++) {
                const tm_param_info *p = tm_param_at(rk->model, i);
                if (p->alias || p->frozen || !(p->role & TM_ROLES_TRAINABLE))
                    continue;
                snprintf(key, sizeof key, "\"%s\":", hx_grid_logical_path(p->path));
                if (steps.len && strstr(hx_buf_str(&steps), key))
                    continue;
                hx_buf_printf(&steps, "%s%s %lld", steps.len ? ", " : "", key,
                              (long long)rk->opt->p[i].steps);
            }
        }
        hx_buf_printf(b, ", \"optimizer_steps\": {%s}", hx_buf_str(&steps));
        hx_buf_free(&steps);
    }
    if (o->loss_scale_given) {
        int first =
            hx_backend_multiprocess(run->backend) ? hx_backend_process_rank(run->backend) : 0;
        hx_buf_puts(b, ", \"loss_scale\": ");
        hx_buf_json_number(b, run->ranks[first].loss_scale);
        hx_buf_printf(b, ", \"loss_scale_good\": %lld", (long long)run->ranks[first].scale_good);
    }
}

seldp_status hx_opt_ensure(hx_rank *rk)
{
    if (rk->opt)
        return SELDP_OK;
    rk->opt = hx_calloc(1, sizeof *rk->opt);
    if (rk->opt)
        rk->opt->p = hx_calloc(rk->n_params, sizeof *rk->opt->p);
    if (!rk->opt || !rk->opt->p)
        return hx_fail(SELDP_ERR_NOMEM, "rank %d: out of memory", rk->rank);
    rk->opt->n = rk->n_params;
    return SELDP_OK;
}

seldp_status hx_opt_update(hx_rank *rk)
{
    seldp_status st0 = hx_opt_ensure(rk);
    if (st0 != SELDP_OK)
        return st0;
    /* --loss-scale: one found_inf over the world (loss_scale.h) */
    seldp_status st = hx_loss_scale_found_inf(rk);
    if (st != SELDP_OK)
        return st;
    bool skip = false;
    if (rk->run->opts.clip_grad > 0 && !rk->found_inf) {
        st = hx_clip_apply(rk, &skip);
        if (st != SELDP_OK)
            return st;
    }
    rk->opt->skipped = skip || rk->found_inf;
    rk->opt->loss_scale = hx_loss_scale_factor(rk);
    bool any = false;
    for (size_t i = 0; i < rk->n_params; i++) {
        const tm_param_info *p = tm_param_at(rk->model, i);
        rk->opt->p[i].has_grad = rk->opt->p[i].updated = rk->opt->p[i].snap = false;
        if (p->alias || p->frozen || !(p->role & TM_ROLES_TRAINABLE))
            continue;
        const seldp_tensor *g = seldp_grads_get(rk->grads, p->id);
        if (!g)
            continue;
        bool skip_p = skip || hx_loss_scale_skips(rk, p);
        st = update_param(rk, i, g, skip_p);
        if (st != SELDP_OK)
            return st;
        any = any || !skip_p;
    }
    hx_loss_scale_update(rk); /* backoff or growth of a dynamic scale */
    return rk->gpu && any ? hx_gpu_upload(rk) : SELDP_OK;
}
