/* The reports of a sweep: sweep.json, sweep.md, and sweep.png drawn by gnuplot from sweep.dat
 * and sweep.gp (left to draw by hand when gnuplot is absent). */
#define _POSIX_C_SOURCE 200809L

#include "bugs.h"
#include "sweep_report.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tinymoe.h"
#include "util.h"

bool hx_sweep_run_ok(const hx_sweep_result *r)
{
    return r->completed && r->checks_passed && r->agrees;
}

double hx_sweep_step_ratio(const hx_sweep *s, int k)
{
    double ratio = 0;
    for (int i = 1; i < s->n; i++)
        if (s->results[i].completed && s->results[i].lockstep && k < s->results[i].steps)
            ratio = fmax(ratio, s->results[i].lock_ratio[k]);
    return ratio;
}

double hx_sweep_step_deviation(const hx_sweep *s, int k)
{
    double dev = 0;
    for (int i = 1; i < s->n; i++)
        if (s->results[i].completed && k < s->results[i].steps)
            dev = fmax(dev, s->results[i].loss_dev[k]);
    return dev;
}

static seldp_status write_json(const hx_sweep *s, bool pass)
{
    hx_buf b = {0};
    int steps = s->entries[0].opts.steps;
    hx_buf_puts(&b, "{\n  \"sweep\": ");
    hx_buf_json_string(&b, s->name);
    hx_buf_printf(&b, ",\n  \"steps\": %d,\n  \"seed\": %llu,\n  \"global_batch\": %d,\n", steps,
                  (unsigned long long)s->entries[0].opts.model.seed,
                  s->entries[0].opts.global_batch);
    hx_buf_printf(&b, "  \"result\": \"%s\",\n  \"max_lockstep_ratio_per_step\": [",
                  pass ? "PASS" : "FAIL");
    for (int k = 0; k < steps; k++) {
        hx_buf_puts(&b, k ? ", " : "");
        hx_buf_json_number(&b, hx_sweep_step_ratio(s, k));
    }
    hx_buf_puts(&b, "],\n  \"max_deviation_per_step\": [");
    for (int k = 0; k < steps; k++) {
        hx_buf_puts(&b, k ? ", " : "");
        hx_buf_json_number(&b, hx_sweep_step_deviation(s, k));
    }
    hx_buf_puts(&b, "],\n  \"runs\": [");
    for (int i = 0; i < s->n; i++) {
        const hx_sweep_entry *e = &s->entries[i];
        const hx_sweep_result *r = &s->results[i];
        hx_buf_puts(&b, i ? ",\n    {" : "\n    {");
        hx_buf_puts(&b, "\"name\": ");
        hx_buf_json_string(&b, e->label);
        hx_buf_printf(&b, ", \"world\": %d, \"ep\": %d, \"framework\": ", e->opts.world,
                      e->opts.ep);
        if (e->opts.grid_given)
            hx_buf_json_string(&b, seldp_framework_name(e->opts.grid.framework));
        else
            hx_buf_puts(&b, "null");
        hx_buf_puts(&b, ", \"order\": ");
        hx_buf_json_string(&b, e->order);
        hx_buf_printf(&b,
                      ", \"dtype\": \"%s\", \"flow\": \"%s\", \"inject\": \"%s\", \"objective\": ",
                      tm_dtype_name(e->opts.model.dtype), hx_flow_name(e->opts.flow),
                      hx_fault_name(e->opts.inject));
        hx_buf_json_string(&b, e->objective);
        hx_buf_printf(&b, ", \"compared_with_run\": %d, \"objective_deviation_from_run_1\": ",
                      e->baseline + 1);
        hx_buf_json_number(&b, r->objective_dev);
        hx_buf_puts(&b, ", \"layout_file\": ");
        if (e->opts.layout_file)
            hx_buf_json_string(&b, e->opts.layout_file);
        else
            hx_buf_puts(&b, "null");
        hx_buf_printf(&b,
                      ",\n     \"completed\": %s, \"checks_passed\": %s, \"failed_checks\": "
                      "%lld, \"agrees\": %s, \"lockstep\": %s, \"lockstep_loss\": ",
                      r->completed ? "true" : "false", r->checks_passed ? "true" : "false",
                      (long long)r->failures, r->agrees ? "true" : "false",
                      r->lockstep ? "true" : "false");
        hx_buf_json_number(&b, r->lockstep ? r->lock_loss : NAN);
        hx_buf_puts(&b, ", \"lockstep_gradients\": ");
        hx_buf_json_number(&b, r->lockstep ? r->lock_grads : NAN);
        hx_buf_puts(&b, ", \"lockstep_update\": ");
        hx_buf_json_number(&b, r->lockstep ? r->lock_update : NAN);
        hx_buf_printf(&b, ", \"near_tie_steps\": %d, \"lockstep_ratio\": [", r->ties);
        for (int k = 0; k < r->steps; k++) {
            hx_buf_puts(&b, k ? ", " : "");
            hx_buf_json_number(&b, r->completed && r->lockstep ? r->lock_ratio[k] : NAN);
        }
        hx_buf_puts(&b, "],\n     \"free_running\": \"information\", \"tolerance\": ");
        hx_buf_json_number(&b, r->tolerance);
        hx_buf_puts(&b, ", \"max_loss_deviation\": ");
        hx_buf_json_number(&b, r->max_loss_dev);
        hx_buf_puts(&b, ", \"weight_deviation\": ");
        hx_buf_json_number(&b, r->weight_dev);
        hx_buf_puts(&b, ", \"worst_tensor\": ");
        hx_buf_json_string(&b, r->worst_tensor[0] ? r->worst_tensor : "-");
        hx_buf_puts(&b, ",\n     \"loss\": [");
        for (int k = 0; k < r->steps; k++) {
            hx_buf_puts(&b, k ? ", " : "");
            hx_buf_json_number(&b, r->completed ? r->loss[k] : NAN);
        }
        hx_buf_puts(&b, "], \"loss_deviation\": [");
        for (int k = 0; k < r->steps; k++) {
            hx_buf_puts(&b, k ? ", " : "");
            hx_buf_json_number(&b, r->completed ? r->loss_dev[k] : NAN);
        }
        hx_buf_puts(&b, "],\n     \"diagnosis\": ");
        hx_buf_json_string(&b, r->diagnosis);
        hx_buf_puts(&b, ", \"error\": ");
        hx_buf_json_string(&b, r->error);
        hx_buf_printf(&b, ", \"seconds\": %.3f}", r->seconds);
    }
    hx_buf_puts(&b, "\n  ]\n}\n");
    seldp_status st = hx_buf_ok(&b) ? SELDP_OK : SELDP_ERR_NOMEM;
    char path[1100];
    snprintf(path, sizeof path, "%s/sweep.json", s->out_dir);
    if (st == SELDP_OK)
        st = hx_write_file(path, b.data, b.len);
    hx_buf_free(&b);
    return st;
}

static seldp_status write_md(const hx_sweep *s, bool pass, const char *plot_note)
{
    hx_buf b = {0};
    const hx_options *o = &s->entries[0].opts;
    hx_buf_printf(&b, "# Sweep %s: %s\n\n", s->name, pass ? "PASS" : "FAIL");
    hx_buf_printf(&b,
                  "%d runs, %d steps each, seed %llu, global batch %d. The verdict is in lockstep: "
                  "every run starts each step from the logical weights the run it is compared "
                  "with (column vs: run 1, or the first run of its objective where its router "
                  "losses or capacity differ) started that step from, and its loss, gradients and "
                  "update are compared with that run's within the sum of the two runs' bounds "
                  "(the tolerance model, docs/tolerances.md): a ratio of 1 or less agrees. The "
                  "same layouts running free part with no bug at all (a top-K flip moves every "
                  "later loss): their deviations are shown as information, against the dtype's "
                  "relative limit (f32 1e-5, f16 2e-3, bf16 1e-2).\n\n",
                  s->n, o->steps, (unsigned long long)o->model.seed, o->global_batch);
    hx_buf_puts(&b, "| # | run | world | ep | order | dtype | objective | inject | vs | checks | "
                    "lockstep loss | gradients | update | agrees | free loss dev | free weight "
                    "dev | worst tensor |\n");
    hx_buf_puts(&b, "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (int i = 0; i < s->n; i++) {
        const hx_sweep_entry *e = &s->entries[i];
        const hx_sweep_result *r = &s->results[i];
        hx_buf_printf(&b, "| %d | %s | %d | %d | %s | %s | %s | %s | %d | ", i + 1, e->label,
                      e->opts.world, e->opts.ep, e->order, tm_dtype_name(e->opts.model.dtype),
                      e->objective, hx_fault_name(e->opts.inject), e->baseline + 1);
        if (!r->completed) {
            hx_buf_puts(&b, "stopped | - | - | - | no | - | - | - |\n");
            continue;
        }
        hx_buf_printf(&b, "%s (%lld failed) | ", r->checks_passed ? "PASS" : "FAIL",
                      (long long)r->failures);
        if (r->lockstep)
            hx_buf_printf(&b, "%.2f | %.2f%s | %.2f | ", r->lock_loss, r->lock_grads,
                          r->ties ? " (ties)" : "", r->lock_update);
        else
            hx_buf_puts(&b, i == e->baseline ? "recorded | - | - | " : "- | - | - | ");
        hx_buf_printf(&b, "%s | %.2e | %.2e | %s |\n", r->agrees ? "yes" : "**no**",
                      r->max_loss_dev, r->weight_dev, r->worst_tensor[0] ? r->worst_tensor : "-");
    }
    hx_buf_puts(&b, "\n## Per step\n\nThe largest lockstep ratio to its bound (the verdict), and "
                    "the largest free-running relative loss deviation (information).\n\n"
                    "| step | lockstep ratio | free-running deviation |\n|---|---|---|\n");
    for (int k = 0; k < o->steps; k++)
        hx_buf_printf(&b, "| %d | %.3f | %.3e |\n", k + 1, hx_sweep_step_ratio(s, k),
                      hx_sweep_step_deviation(s, k));
    /* the objectives: each is compared with itself; how far apart they are is reported */
    bool objectives = false;
    for (int i = 1; i < s->n; i++) {
        const hx_sweep_entry *e = &s->entries[i];
        if (e->baseline != i)
            continue;
        if (!objectives)
            hx_buf_printf(&b,
                          "\n## Objectives\n\nRuns of another objective than run 1's (%s) "
                          "train another model and are compared among themselves; their "
                          "largest relative loss difference from run 1 is reported, not "
                          "checked.\n\n| first run | objective | loss difference from run 1 "
                          "|\n|---|---|---|\n",
                          s->entries[0].objective);
        objectives = true;
        hx_buf_printf(&b, "| %d (%s) | %s | %.3e |\n", i + 1, e->label, e->objective,
                      s->results[i].objective_dev);
    }
    bool any = false;
    for (int i = 0; i < s->n; i++) {
        const hx_sweep_result *r = &s->results[i];
        if (!r->diagnosis[0] && !r->error[0])
            continue;
        if (!any)
            hx_buf_puts(&b, "\n## Findings\n\n");
        any = true;
        hx_buf_printf(&b, "- run %d (%s): %s\n", i + 1, s->entries[i].label,
                      r->diagnosis[0] ? r->diagnosis : r->error);
    }
    hx_buf_printf(&b, "\n## Plot\n\n%s\n", plot_note);
    seldp_status st = hx_buf_ok(&b) ? SELDP_OK : SELDP_ERR_NOMEM;
    char path[1100];
    snprintf(path, sizeof path, "%s/sweep.md", s->out_dir);
    if (st == SELDP_OK)
        st = hx_write_file(path, b.data, b.len);
    hx_buf_free(&b);
    return st;
}

/* `text` as a single-quoted shell word, into buf. */
static void shell_quote(const char *text, char *buf, size_t size)
{
    size_t n = 0;
    if (size < 3)
        return;
    buf[n++] = '\'';
    for (const char *c = text; *c && n + 6 < size; c++) {
        if (*c == '\'') {
            memcpy(buf + n, "'\\''", 4);
            n += 4;
        } else {
            buf[n++] = *c;
        }
    }
    buf[n++] = '\'';
    buf[n] = '\0';
}

/* sweep.dat and sweep.gp, and sweep.png when gnuplot is installed. The note for sweep.md says
 * which. */
static seldp_status write_plot(const hx_sweep *s, char *note, size_t size)
{
    hx_buf dat = {0}, gp = {0};
    int steps = s->entries[0].opts.steps;
    hx_buf_puts(&dat, "# step, largest free-running relative loss deviation from the run compared "
                      "with, each run's free-running loss, then the largest lockstep ratio to its "
                      "bound\n");
    for (int k = 0; k < steps; k++) {
        hx_buf_printf(&dat, "%d %.9e", k + 1, fmax(hx_sweep_step_deviation(s, k), 1e-17));
        for (int i = 0; i < s->n; i++)
            hx_buf_printf(&dat, " %.12e", s->results[i].completed ? s->results[i].loss[k] : NAN);
        hx_buf_printf(&dat, " %.9e\n", fmax(hx_sweep_step_ratio(s, k), 1e-17));
    }
    hx_buf_printf(&gp,
                  "# gnuplot sweep.gp (in this folder) draws sweep.png from sweep.dat\n"
                  "set terminal pngcairo size 1100,900 noenhanced\n"
                  "set output 'sweep.png'\n"
                  "set multiplot layout 2,1 title 'sweep %s: free-running loss per step of every "
                  "run (information), and the lockstep verdict'\n"
                  "set xlabel 'step'\nset ylabel 'loss'\nset xtics 1\nset key outside right\n"
                  "plot ",
                  s->name);
    for (int i = 0; i < s->n; i++)
        hx_buf_printf(&gp, "%s'sweep.dat' using 1:%d with linespoints dashtype %d title '%s'",
                      i ? ", \\\n     " : "", i + 3, 1 + i % 5, s->entries[i].label);
    hx_buf_printf(&gp,
                  "\nset logscale y\nset format y '%%.0e'\nset ylabel 'ratio / deviation'\n"
                  "plot 'sweep.dat' using 1:%d with linespoints lw 2 title 'largest lockstep "
                  "ratio to its bound (verdict)', 1 with lines lw 2 title 'bound', "
                  "'sweep.dat' using 1:2 with linespoints dashtype 3 title 'largest free-running "
                  "loss deviation (information)', %g with lines dashtype 2 title '%s relative "
                  "limit'\n"
                  "unset multiplot\n",
                  s->n + 3, s->results[0].tolerance, tm_dtype_name(s->entries[0].opts.model.dtype));
    seldp_status st = hx_buf_ok(&dat) && hx_buf_ok(&gp) ? SELDP_OK : SELDP_ERR_NOMEM;
    char path[1100];
    snprintf(path, sizeof path, "%s/sweep.dat", s->out_dir);
    if (st == SELDP_OK)
        st = hx_write_file(path, dat.data, dat.len);
    snprintf(path, sizeof path, "%s/sweep.gp", s->out_dir);
    if (st == SELDP_OK)
        st = hx_write_file(path, gp.data, gp.len);
    hx_buf_free(&dat);
    hx_buf_free(&gp);
    if (st != SELDP_OK)
        return st;
    if (system("command -v gnuplot >/dev/null 2>&1") != 0) {
        snprintf(note, size,
                 "gnuplot is not installed: no sweep.png; `gnuplot sweep.gp` in this folder "
                 "draws it from sweep.dat.");
        return SELDP_OK;
    }
    char dir[2100], cmd[2300];
    shell_quote(s->out_dir, dir, sizeof dir);
    snprintf(cmd, sizeof cmd, "cd %s && gnuplot sweep.gp 2>/dev/null", dir);
    if (system(cmd) != 0) {
        snprintf(note, size, "gnuplot failed on sweep.gp: no sweep.png.");
        return SELDP_OK;
    }
    snprintf(note, size,
             "![loss per step of every run, and the largest deviation from the run compared "
             "with](sweep.png)\n\n"
             "Drawn by `gnuplot sweep.gp` from sweep.dat.");
    return SELDP_OK;
}

seldp_status hx_sweep_write(const hx_sweep *s, bool pass)
{
    char note[512] = "";
    seldp_status st = write_plot(s, note, sizeof note);
    if (st == SELDP_OK)
        st = write_json(s, pass);
    if (st == SELDP_OK)
        st = write_md(s, pass, note);
    return st;
}

/* The largest ||w - w0|| / ||w0|| over the tensors, and where. */
double hx_sweep_weights_deviation(const hx_sweep_weights *w0, const hx_sweep_weights *w,
                                  char *worst, size_t size)
{
    double dev = 0;
    snprintf(worst, size, "-");
    for (size_t i = 0; i < w->n; i++) {
        size_t j = 0;
        while (j < w0->n && strcmp(w0->paths[j], w->paths[i]) != 0)
            j++;
        if (j == w0->n || w0->numel[j] != w->numel[i]) {
            snprintf(worst, size, "%s (absent from the first run)", w->paths[i]);
            return INFINITY;
        }
        double d2 = 0, r2 = 0;
        for (size_t k = 0; k < w->numel[i]; k++) {
            double a = w->values[i][k], b = w0->values[j][k];
            d2 += (a - b) * (a - b);
            r2 += b * b;
        }
        double rel = r2 > 0 ? sqrt(d2 / r2) : sqrt(d2);
        if (!(rel <= dev)) {
            dev = rel;
            snprintf(worst, size, "%s", w->paths[i]);
        }
    }
    return dev;
}
