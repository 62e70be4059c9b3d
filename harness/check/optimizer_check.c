/* The post-step check (optimizer.h, docs/tolerances.md, The update): every rank's updated
 * weights, and AdamW's moments, against the FP64 update of the state the rank started the step
 * from with the gradient it used, under a worst-case bound of the update's FP32 rounding.
 *
 * The gradient itself is what the gradient checks compare with the FP64 reference; this check
 * sees what the update does with it, so that together the step's result is checked against the
 * reference's. A step the run must skip (a non-finite gradient norm under --clip-grad, agreed by
 * every rank) must leave every weight, moment and step count as it was. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "diagnose.h"
#include "optimizer.h"
#include "verdict.h"
#include "zero.h"
#include "run.h"
#include "rank.h"
#include "checks.h"
#include "gather.h"

/* One outcome into a rank's own result, as hx_check_metric records into the run's. */
HX_PRINTF(6, 7)
static void note(hx_check_result *c, bool failed, double ratio, double bound, double resolution,
                 const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    hx_check_vmetric(c, failed, ratio, bound, resolution, fmt, ap);
    va_end(ap);
}

/* A rank's result into the run's check, ranks in order. */
static void merge(hx_check_result *into, const hx_check_result *from)
{
    if (from->tested == 0)
        return;
    if (into->tested == 0 || from->worst > into->worst || isnan(from->worst)) {
        into->worst = from->worst;
        into->bound = from->bound;
    }
    if (from->resolution > into->resolution)
        into->resolution = from->resolution;
    into->tested += from->tested;
    if (from->failed && into->failed == 0)
        memcpy(into->first_failure, from->first_failure, sizeof into->first_failure);
    into->failed += from->failed;
}

/* The unit roundoff of FP32 and of the storage dtype. */
#define U32 0x1p-24

static double storage_roundoff(seldp_dtype dtype)
{
    switch (dtype) {
    case SELDP_BF16:
        return 0x1p-8;
    case SELDP_F16:
        return 0x1p-11;
    default:
        return 0.0;
    }
}

/* The smallest absolute rounding error of a subnormal in the storage dtype (half its spacing). */
static double storage_subnormal(seldp_dtype dtype)
{
    return dtype == SELDP_F16 ? 0x1p-25 : 0x1p-150;
}

/* The bound's constant over the worst case of the operations (docs/tolerances.md). */
#define SAFETY 2.0

typedef struct expected {
    double w, m, v;    /* the FP64 update */
    double bw, bm, bv; /* bounds of the FP32 result's error */
} expected;

/* SGD: w1 = w0 - lr g; the FP32 step rounds lr, the product and the difference. */
static expected sgd_ref(const hx_options *o, double g, double w0)
{
    expected e = {0};
    double step = o->lr * g;
    e.w = w0 - step;
    e.bw = SAFETY * (2 * U32 * fabs(step) + U32 * fabs(e.w)) + 0x1p-149;
    return e;
}

/* AdamW (optimizer.c's order of operations): each FP32 operation's result within one unit
 * roundoff of the exact value of its FP32 inputs, constants rounded once; errors carried
 * through worst-case. The division by sqrt(v) + eps amplifies the moments' errors where v is
 * small: the square root's error is bounded by min(dv / sqrt(v), sqrt(dv)). */
static expected adamw_ref(const hx_options *o, int64_t t, double g, double w0, double m0, double v0)
{
    expected e = {0};
    const double b1 = o->adam_beta1, b2 = o->adam_beta2, eps = o->adam_eps;
    const double bc1 = 1.0 - pow(b1, (double)t), bc2 = 1.0 - pow(b2, (double)t);
    e.m = b1 * m0 + (1.0 - b1) * g;
    e.v = b2 * v0 + (1.0 - b2) * g * g;
    double dm = 2 * U32 * (fabs(b1 * m0) + fabs((1.0 - b1) * g)) + U32 * fabs(e.m);
    double dv = 3 * U32 * (fabs(b2 * v0) + (1.0 - b2) * g * g) + U32 * e.v;
    dm *= 1.0 + 4 * U32;
    dv *= 1.0 + 4 * U32;
    double s = sqrt(e.v / bc2), D = s + eps;
    double dsqrt = e.v > 0 ? fmin(dv / sqrt(e.v), sqrt(dv)) : sqrt(dv);
    double dD = dsqrt / sqrt(bc2) + 3 * U32 * (s + dsqrt) + U32 * (D + dsqrt) + U32 * eps;
    double Dlow = fmax(D - dD, eps * (1.0 - 2 * U32));
    double q = e.m / D;
    double dq = dm / Dlow + fabs(e.m) * dD / (D * Dlow);
    dq += U32 * (fabs(q) + dq);
    double step = o->lr / bc1;
    double dupd = step * dq + 2 * U32 * step * (fabs(q) + dq);
    double decay = 1.0 - o->lr * o->weight_decay;
    e.w = w0 * decay - step * q;
    double dw = 2 * U32 * fabs(w0 * decay) + dupd;
    dw += U32 * (fabs(e.w) + dw);
    e.bw = SAFETY * dw + 0x1p-149;
    e.bm = SAFETY * dm + 0x1p-149;
    e.bv = SAFETY * dv + 0x1p-149;
    return e;
}

void hx_opt_expected(const hx_options *o, int64_t t, double g, double w0, double m0, double v0,
                     double *w, double *bound)
{
    expected e = o->optimizer == HX_OPT_ADAMW ? adamw_ref(o, t, g, w0, m0, v0) : sgd_ref(o, g, w0);
    *w = e.w;
    *bound = e.bw;
}

/* Whether the world must skip this step's update: --clip-grad or --loss-scale and a non-finite
 * gradient anywhere (the global norm every rank computes is then non-finite; loss scaling's
 * found_inf). */
static bool skip_expected(const hx_run *run)
{
    if (!(run->opts.clip_grad > 0) && !run->opts.loss_scale_given)
        return false;
    for (int r = 0; r < run->opts.world; r++) {
        const hx_rank *rk = &run->ranks[r];
        for (size_t i = 0; rk->opt && i < rk->opt->n; i++) {
            const hx_opt_param *q = &rk->opt->p[i];
            if (!q->has_grad)
                continue;
            size_t n = seldp_tensor_numel(&tm_param_at(rk->model, i)->tensor);
            for (size_t j = 0; j < n; j++)
                if (!isfinite(q->g[j]))
                    return true;
        }
    }
    return false;
}

/* A skipped update: weights, moments and the step count as they were. */
static void check_skipped(int step, const hx_rank *rk, size_t i, const float *w1)
{
    const tm_param_info *p = tm_param_at(rk->model, i);
    const hx_opt_param *q = &rk->opt->p[i];
    size_t n = seldp_tensor_numel(&p->tensor);
    bool same = !q->updated && q->steps == q->steps0 && memcmp(w1, q->w0, n * sizeof *w1) == 0;
    if (q->exp_avg)
        same = same && memcmp(q->exp_avg, q->m0, n * sizeof(float)) == 0 &&
               memcmp(q->exp_avg_sq, q->v0, n * sizeof(float)) == 0;
    hx_rank *w = (hx_rank *)rk;
    int c = p->expert >= 0;
    w->skip_seen[c]++;
    w->skip_changed[c] += !same;
    note(&((hx_rank *)rk)->update_check, !same, same ? 0.0 : INFINITY, 0.0, 0.0,
         "step %d: rank %d: %s changed in a step every rank had to skip (a non-finite "
         "gradient: --clip-grad's norm, or loss scaling's found_inf)",
         step + 1, rk->rank, p->path);
}

/* The stored elements [lo, hi) as the rounding of their FP32 masters (every bit). */
static bool stored_is_master(const tm_param_info *p, const float *master, void *scratch, size_t lo,
                             size_t hi)
{
    seldp_tensor t = p->tensor;
    t.data = scratch;
    hx_tensor_from_f32(master, &t);
    size_t e = seldp_dtype_size(p->tensor.dtype);
    return memcmp((char *)scratch + lo * e, (char *)p->tensor.data + lo * e, (hi - lo) * e) == 0;
}

static void check_param(hx_run *run, int step, const hx_rank *rk, size_t i, const float *w1,
                        void *scratch, bool has_master)
{
    const hx_options *o = &run->opts;
    const tm_param_info *p = tm_param_at(rk->model, i);
    const hx_opt_param *q = &rk->opt->p[i];
    size_t n = seldp_tensor_numel(&p->tensor);
    /* without a master the stored half parameter is the update's FP32 result rounded once */
    double uh = has_master ? 0.0 : storage_roundoff(p->tensor.dtype);
    double sub = has_master ? 0.0 : storage_subnormal(p->tensor.dtype);
    double worst = 0.0, resolution = INFINITY, bound_at = 0.0;
    size_t at = 0;
    const char *what = "weight";
    double got_at = 0, want_at = 0;
    size_t lo = 0, hi = n; /* under --zero 1 the elements of the rank's range */
    hx_zero_owned(rk, i, &lo, &hi);
    for (size_t j = lo; j < hi; j++) {
        expected e = o->optimizer == HX_OPT_ADAMW
                         ? adamw_ref(o, q->steps0 + 1, q->g[j], q->w0[j], q->m0[j], q->v0[j])
                         : sgd_ref(o, q->g[j], q->w0[j]);
        double bw = e.bw + uh * (fabs(e.w) + e.bw) + sub;
        double r = fabs((double)w1[j] - e.w) / bw;
        double moved = fabs(e.w - q->w0[j]);
        if (moved > 0)
            resolution = fmin(resolution, bw / moved);
        if (!(r <= worst)) {
            worst = r, at = j, what = "weight", bound_at = bw;
            got_at = w1[j], want_at = e.w;
        }
        if (q->exp_avg) {
            double rm = fabs((double)q->exp_avg[j] - e.m) / e.bm;
            double rv = fabs((double)q->exp_avg_sq[j] - e.v) / e.bv;
            if (!(rm <= worst))
                worst = rm, at = j, what = "exp_avg", bound_at = e.bm, got_at = q->exp_avg[j],
                want_at = e.m;
            if (!(rv <= worst))
                worst = rv, at = j, what = "exp_avg_sq", bound_at = e.bv, got_at = q->exp_avg_sq[j],
                want_at = e.v;
        }
    }
    bool counted = q->updated && q->steps == q->steps0 + 1;
    note(&((hx_rank *)rk)->update_check, !counted, counted ? 0.0 : INFINITY, 0.0, 0.0,
         "step %d: rank %d: %s was not updated (step count %lld, %lld before)", step + 1, rk->rank,
         p->path, (long long)q->steps, (long long)q->steps0);
    if (!counted)
        return;
    double rel = bound_at / fmax(fabs(want_at), 1e-300);
    note(&((hx_rank *)rk)->update_check, !(worst <= 1.0), isnan(worst) ? INFINITY : worst, rel,
         isinf(resolution) ? 0.0 : resolution,
         "step %d: rank %d: %s[%zu]: the %s after the %s step is %.9g, the FP64 step "
         "of the same state and gradient %.9g, bound %.3g",
         step + 1, rk->rank, p->path, at, what, hx_optimizer_name(o->optimizer), got_at, want_at,
         bound_at);
    if (has_master && p->tensor.dtype != SELDP_F32)
        note(&((hx_rank *)rk)->update_check, !stored_is_master(p, w1, scratch, lo, hi), 0.0, 0.0,
             0.0, "step %d: rank %d: %s is not its FP32 master rounded to %s", step + 1, rk->rank,
             p->path, tm_dtype_name(p->tensor.dtype));
}

/* Rank rk's updates of `step` into rk->update_check. */
static void check_rank(hx_run *run, int step, hx_rank *rk, bool skip)
{
    rk->update_check = (hx_check_result){.metric = true, .limit = 1.0};
    for (size_t i = 0; rk->opt && i < rk->opt->n; i++) {
        const hx_opt_param *q = &rk->opt->p[i];
        if (!q->has_grad)
            continue;
        const tm_param_info *p = tm_param_at(rk->model, i);
        size_t n = seldp_tensor_numel(&p->tensor);
        float *w1 = hx_calloc(n, sizeof *w1);
        void *scratch = hx_calloc(seldp_tensor_nbytes(&p->tensor), 1);
        if (w1 && scratch) {
            hx_opt_weights(rk, i, w1);
            bool has_master = (rk->master && rk->master[i]) || q->master;
            if (skip)
                check_skipped(step, rk, i, w1);
            else
                check_param(run, step, rk, i, w1, scratch, has_master);
        }
        free(w1);
        free(scratch);
    }
}

/* Every rank's result merged into the run's check, in rank order; the step's failures. */
static void merge_ranks(hx_run *run, int step)
{
    int64_t failed_before = hx_run_failures(run);
    int changed[2] = {0, 0}, seen[2] = {0, 0};
    for (int r = 0; r < run->opts.world; r++) {
        hx_rank *rk = &run->ranks[r];
        /* a step the run diverged in is not checked (diverge.h) */
        if (!run->steps[step].diverged)
            merge(&run->checks[HX_CHECK_UPDATE], &rk->update_check);
        rk->update_check = (hx_check_result){0};
        for (int c = 0; c < 2; c++) {
            changed[c] += rk->skip_changed[c];
            seen[c] += rk->skip_seen[c];
            rk->skip_changed[c] = rk->skip_seen[c] = 0;
        }
    }
    run->steps[step].failures += hx_run_failures(run) - failed_before;
    if (!run->steps[step].diverged)
        hx_diagnose_skip(run, step, changed, seen);
}

typedef struct rank_loop {
    hx_run *run;
    int step;
    bool skip;
} rank_loop;

static void check_rank_item(void *ctx, int r)
{
    const rank_loop *lp = ctx;
    check_rank(lp->run, lp->step, &lp->run->ranks[r], lp->skip);
}

/* Each rank's check writes only its own result, so the ranks run on the reference's threads
 * (tm_parallel_for) and merge in rank order: the same verdict for any thread count. */
void hx_opt_check_step(hx_run *run, int step)
{
    rank_loop lp = {run, step, skip_expected(run)};
    tm_parallel_for(run->opts.world, check_rank_item, &lp);
    merge_ranks(run, step);
}

seldp_status hx_opt_check_process(hx_run *run, hx_rank *rk, int step)
{
    /* the skip from every rank's gradients: one allreduce of this rank's finding */
    int64_t mine = 0, any = 0;
    if (run->opts.clip_grad > 0 || run->opts.loss_scale_given) {
        for (size_t i = 0; rk->opt && i < rk->opt->n && !mine; i++) {
            const hx_opt_param *q = &rk->opt->p[i];
            size_t n = q->has_grad ? seldp_tensor_numel(&tm_param_at(rk->model, i)->tensor) : 0;
            for (size_t j = 0; j < n && !mine; j++)
                mine = !isfinite(q->g[j]);
        }
    }
    seldp_status st = seldp_comm_allreduce(rk->world, &mine, &any, 1, SELDP_I64, SELDP_HOST_DEVICE);
    if (st != SELDP_OK)
        return hx_fail_lib(st, "rank %d: allreduce of the post-step check's skip", rk->rank);
    check_rank(run, step, rk, any != 0);
    st = hx_gather_update(run, rk); /* rank 0 receives every rank's result */
    if (st == SELDP_OK && rk->rank == 0)
        merge_ranks(run, step);
    return st;
}
