/* One run of a sweep (sweep_run.c): the first run of an objective free, recording the
 * lockstep; any other in lockstep with it (the verdict) and then free (the curves, for
 * information); the comparisons into its result. */
#define _POSIX_C_SOURCE 200809L

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grid.h"
#include "lockstep.h"
#include "report.h"
#include "run.h"
#include "execute.h"
#include "run_create.h"
#include "sweep.h"
#include "sweep_report.h"
#include "util.h"

static double dtype_tolerance(seldp_dtype dtype)
{
    return dtype == SELDP_BF16 ? 1e-2 : dtype == SELDP_F16 ? 2e-3 : 1e-5;
}

void hx_sweep_weights_free(hx_sweep_weights *w)
{
    for (size_t i = 0; i < w->n; i++) {
        free(w->paths[i]);
        free(w->values[i]);
    }
    free(w->paths);
    free(w->values);
    free(w->numel);
    *w = (hx_sweep_weights){0};
}

static seldp_status weights_of(const hx_run *run, hx_sweep_weights *w)
{
    seldp_status st = SELDP_OK;
    const hx_layout *l = run->layout;
    tm_model *m = NULL;
    int *all = hx_calloc((size_t)l->experts, sizeof *all);
    if (!all)
        return SELDP_ERR_NOMEM;
    for (int e = 0; e < l->experts; e++)
        all[e] = e;
    HX_CHECK_LIB(tm_model_create(&run->opts.model, 0, all, l->experts, NULL, NULL, &m),
                 "the logical model of a sweep run");
    HX_CHECK(hx_grid_assemble(run, m)); /* every set root's tensors (grid.h) */
    size_t count = tm_param_count(m);
    w->paths = hx_calloc(count, sizeof *w->paths);
    w->values = hx_calloc(count, sizeof *w->values);
    w->numel = hx_calloc(count, sizeof *w->numel);
    if (!w->paths || !w->values || !w->numel)
        HX_FAIL(SELDP_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < count; i++) {
        const tm_param_info *p = tm_param_at(m, i);
        if (p->alias || p->frozen || !(p->role & TM_ROLES_TRAINABLE))
            continue;
        size_t n = seldp_tensor_numel(&p->tensor);
        w->paths[w->n] = hx_strdup(p->path);
        w->values[w->n] = hx_calloc(n ? n : 1, sizeof(float));
        w->numel[w->n] = n;
        if (!w->paths[w->n] || !w->values[w->n]) {
            w->n++;
            HX_FAIL(SELDP_ERR_NOMEM, "out of memory");
        }
        if (p->tensor.dtype == SELDP_F32)
            memcpy(w->values[w->n], p->tensor.data, n * sizeof(float));
        else
            seldp_half_to_f32(p->tensor.dtype, p->tensor.data, w->values[w->n], n);
        w->n++;
    }
fail:
    tm_model_destroy(m);
    free(all);
    return st;
}

/* One run of entry i: free (lockstep NULL) or in lockstep. Its report goes to `dir` (NULL:
 * none); its final logical weights into *w. */
static bool run_once(hx_sweep *s, int i, hx_lockstep *lockstep, const char *dir,
                     hx_sweep_weights *w, hx_run **out)
{
    hx_sweep_entry *e = &s->entries[i];
    hx_sweep_result *r = &s->results[i];
    hx_run *run = NULL;
    *out = NULL;
    if (hx_run_create(&e->opts, &run) != SELDP_OK) {
        snprintf(r->error, sizeof r->error, "%s", hx_last_error());
        return false;
    }
    *out = run;
    run->lockstep = lockstep;
    if (hx_run_execute(run, NULL) != SELDP_OK) {
        snprintf(r->error, sizeof r->error, "%s", run->error);
        return false;
    }
    if (dir && hx_report_write(run, dir) != SELDP_OK)
        snprintf(r->error, sizeof r->error, "%s", hx_last_error());
    if (weights_of(run, w) != SELDP_OK) {
        snprintf(r->error, sizeof r->error, "%s", hx_last_error());
        return false;
    }
    return true;
}

/* The lockstep results of run i into r. */
static void take_lockstep(hx_sweep_result *r, const hx_lockstep *l)
{
    r->lock_loss = r->lock_grads = r->lock_update = 0;
    for (int k = 0; k < r->steps; k++) {
        const hx_lock_result *q = &l->result[k];
        double worst = fmax(q->loss, fmax(isnan(q->grads) ? 0 : q->grads, q->update));
        r->ties += isnan(q->grads);
        r->lock_ratio[k] = worst;
        r->lock_loss = fmax(r->lock_loss, q->loss);
        r->lock_grads = fmax(r->lock_grads, isnan(q->grads) ? 0 : q->grads);
        r->lock_update = fmax(r->lock_update, q->update);
        if (k == 0 || !(worst <= r->lock_ratio[r->lock_worst_step])) {
            r->lock_worst_step = k;
            snprintf(r->lock_worst, sizeof r->lock_worst, "%s", q->worst);
        }
    }
}

/* Run entry i: the first run of its objective free, recording the lockstep; any other in
 * lockstep with it (the verdict) and then free (the curves, information). */
void hx_sweep_run(hx_sweep *s, int i, FILE *out)
{
    hx_sweep_entry *e = &s->entries[i];
    hx_sweep_result *r = &s->results[i];
    int steps = e->opts.steps;
    r->steps = steps;
    r->loss = hx_calloc((size_t)(steps ? steps : 1), sizeof *r->loss);
    r->loss_dev = hx_calloc((size_t)(steps ? steps : 1), sizeof *r->loss_dev);
    r->lock_ratio = hx_calloc((size_t)(steps ? steps : 1), sizeof *r->lock_ratio);
    const int b = e->baseline;
    const hx_options *base = &s->entries[b].opts;
    r->tolerance = fmax(dtype_tolerance(e->opts.model.dtype), dtype_tolerance(base->model.dtype));
    r->lockstep = b != i && s->results[b].completed && s->locks[b] &&
                  e->opts.model.dtype == base->model.dtype &&
                  (e->opts.fp32_master || e->opts.zero) == (base->fp32_master || base->zero);
    double t0 = hx_now();
    hx_run *run = NULL, *free_run = NULL;
    hx_sweep_weights w = {0}, wf = {0};
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/runs/%02d-%s", s->out_dir, i + 1, e->label);
    if (!r->loss || !r->loss_dev || !r->lock_ratio) {
        snprintf(r->error, sizeof r->error, "out of memory");
        goto done;
    }
    if (b == i) {
        if (hx_lockstep_create(steps, e->opts.lr, &s->locks[i]) != SELDP_OK) {
            snprintf(r->error, sizeof r->error, "%s", hx_last_error());
            goto done;
        }
    } else if (r->lockstep) {
        hx_lockstep_follow(s->locks[b]);
    }
    hx_lockstep *lock = b == i || r->lockstep ? s->locks[b] : NULL;
    if (!run_once(s, i, lock, dir, &w, &run))
        goto done;
    r->checks_passed = hx_run_passed(run);
    r->failures = hx_run_failures(run);
    snprintf(r->diagnosis, sizeof r->diagnosis, "%s", run->diagnosis);
    if (r->lockstep)
        take_lockstep(r, s->locks[b]);
    /* the free-running curve of this layout: the first run's own, or another run */
    if (b == i || !lock) {
        free_run = run;
        run = NULL;
        wf = w;
        w = (hx_sweep_weights){0};
    } else {
        char free_dir[1100];
        snprintf(free_dir, sizeof free_dir, "%s-free", dir);
        if (!run_once(s, i, NULL, free_dir, &wf, &free_run))
            goto done;
        r->checks_passed = r->checks_passed && hx_run_passed(free_run);
        r->failures += hx_run_failures(free_run);
        if (!r->diagnosis[0])
            snprintf(r->diagnosis, sizeof r->diagnosis, "%s", free_run->diagnosis);
    }
    r->completed = true;
    for (int k = 0; k < steps; k++)
        r->loss[k] = free_run->steps[k].loss;
    if (b == i) {
        s->baselines[i] = wf;
        wf = (hx_sweep_weights){0};
    } else if (s->results[b].completed) {
        r->weight_dev = hx_sweep_weights_deviation(&s->baselines[b], &wf, r->worst_tensor,
                                                   sizeof r->worst_tensor);
    }
    for (int k = 0; k < steps && s->results[b].completed; k++) {
        double l0 = s->results[b].loss[k];
        r->loss_dev[k] = fabs(r->loss[k] - l0) / fmax(fabs(l0), 1e-300);
        if (!(r->loss_dev[k] <= r->max_loss_dev))
            r->max_loss_dev = r->loss_dev[k];
    }
    /* another objective than run 1's: how far it is from run 1, for the report only */
    for (int k = 0; k < steps && b != 0 && s->results[0].completed; k++) {
        double l0 = s->results[0].loss[k];
        r->objective_dev = fmax(r->objective_dev, fabs(r->loss[k] - l0) / fmax(fabs(l0), 1e-300));
    }
    r->agrees =
        s->results[b].completed && !r->error[0] &&
        (!r->lockstep || (r->lock_loss <= 1.0 && r->lock_grads <= 1.0 && r->lock_update <= 1.0));
done:
    r->seconds = hx_now() - t0;
    hx_sweep_weights_free(&w);
    hx_sweep_weights_free(&wf);
    hx_run_destroy(run);
    hx_run_destroy(free_run);
    if (!out)
        return;
    if (!r->completed) {
        fprintf(out, "sweep [%d/%d] %s: the run stopped: %s\n", i + 1, s->n, e->label, r->error);
    } else if (b == i) {
        fprintf(out,
                "sweep [%d/%d] %s: checks %s (%lld failed): the run the others follow in "
                "lockstep (%.2f s)\n",
                i + 1, s->n, e->label, r->checks_passed ? "PASS" : "FAIL", (long long)r->failures,
                r->seconds);
    } else {
        if (r->lockstep)
            fprintf(out,
                    "sweep [%d/%d] %s: checks %s (%lld failed); in lockstep with run %d: loss "
                    "%.2f, gradients %.2f, update %.2f of their bounds%s: %s (%.2f s)\n",
                    i + 1, s->n, e->label, r->checks_passed ? "PASS" : "FAIL",
                    (long long)r->failures, b + 1, r->lock_loss, r->lock_grads, r->lock_update,
                    r->ties ? " (near ties: some steps against the reference only)" : "",
                    r->agrees ? "agrees" : "DEVIATES", r->seconds);
        else
            fprintf(out,
                    "sweep [%d/%d] %s: checks %s (%lld failed); not in lockstep with run %d "
                    "(another dtype or master weights): checked against the reference only: %s "
                    "(%.2f s)\n",
                    i + 1, s->n, e->label, r->checks_passed ? "PASS" : "FAIL",
                    (long long)r->failures, b + 1, r->agrees ? "agrees" : "DEVIATES", r->seconds);
        fprintf(out,
                "  free-running (information): loss deviation %.2e, final weights %.2e from "
                "run %d\n",
                r->max_loss_dev, r->weight_dev, b + 1);
        if (r->lockstep && !r->agrees)
            fprintf(out, "  deviates: %.2f of its bound at step %d in %s\n",
                    r->lock_ratio[r->lock_worst_step], r->lock_worst_step + 1,
                    r->lock_worst[0] ? r->lock_worst : "the loss");
    }
    if (r->completed && b != 0)
        fprintf(out, "  objective %s: compared with run %d; differs from run 1 (%s) by %.2e\n",
                e->objective, b + 1, s->entries[0].objective, r->objective_dev);
    if (r->diagnosis[0])
        fprintf(out, "  diagnosis: %s\n", r->diagnosis);
    fflush(out);
}
