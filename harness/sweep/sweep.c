/* Sweeps: parse the list of runs (a JSON file or a preset), run each in this process, compare
 * its per-step loss and final logical weights with the first run's, and write sweep.md,
 * sweep.json and a gnuplot plot. */
#define _POSIX_C_SOURCE 200809L

#include "bugs.h"
#include "sweep.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "exit.h"
#include "inject.h"
#include "json.h"
#include "lockstep.h"
#include "grid.h"
#include "run.h"
#include "run_create.h"
#include "sweep_entries.h"
#include "sweep_report.h"
#include "util.h"

static void entries_free(hx_sweep *s)
{
    for (int i = 0; s->entries && i < s->n; i++)
        for (int a = 0; a < s->entries[i].n_args; a++)
            free(s->entries[i].args[a]);
    free(s->entries);
    for (int i = 0; s->results && i < s->n; i++) {
        free(s->results[i].loss);
        free(s->results[i].loss_dev);
        free(s->results[i].lock_ratio);
    }
    for (int i = 0; s->locks && i < s->n; i++)
        hx_lockstep_destroy(s->locks[i]);
    free(s->locks);
    free(s->results);
    for (int i = 0; s->baselines && i < s->n; i++)
        hx_sweep_weights_free(&s->baselines[i]);
    free(s->baselines);
}

/* The terms of the objective a run trains (docs/model.md, Routing extensions): runs that differ in
 * them train different models, and are not expected to agree. */
static bool same_objective(const tm_config *a, const tm_config *b)
{
    bool aux = a->aux_loss_coeff > 0.0;
    return a->aux_loss_coeff == b->aux_loss_coeff &&
           (!aux || a->aux_loss_scope == b->aux_loss_scope) && a->z_loss_coeff == b->z_loss_coeff &&
           a->capacity_factor == b->capacity_factor;
}

static void objective_describe(const tm_config *m, char *buf, size_t size)
{
    if (!(m->aux_loss_coeff > 0.0) && !(m->z_loss_coeff > 0.0) && !(m->capacity_factor > 0.0)) {
        snprintf(buf, size, "plain");
        return;
    }
    int len = 0;
    buf[0] = '\0';
    if (m->aux_loss_coeff > 0.0)
        len += snprintf(buf + len, size - (size_t)len, "aux %g %s", m->aux_loss_coeff,
                        tm_aux_scope_name(m->aux_loss_scope));
    if (m->z_loss_coeff > 0.0 && (size_t)len < size)
        len += snprintf(buf + len, size - (size_t)len, "%sz %g", len ? ", " : "", m->z_loss_coeff);
    if (m->capacity_factor > 0.0 && (size_t)len < size)
        snprintf(buf + len, size - (size_t)len, "%scf %g", len ? ", " : "", m->capacity_factor);
}

/* Append to a label, cutting it at its size. */
static void label_append(hx_sweep_entry *e, const char *fmt, ...)
{
    size_t len = strlen(e->label);
    va_list ap;
    va_start(ap, fmt);
    if (len + 1 < sizeof e->label)
        vsnprintf(e->label + len, sizeof e->label - len, fmt, ap);
    va_end(ap);
}

/* A run's name when the file gives none: world, framework, layout, objective, dtype, bug. */
static void label_of(hx_sweep_entry *e)
{
    const hx_options *o = &e->opts;
    e->label[0] = '\0';
    label_append(e, "w%d-", o->world);
    if (o->grid_given)
        label_append(e, "%s-", seldp_framework_name(o->grid.framework));
    if (o->layout_file)
        label_append(e, "file");
    else if (strcmp(e->order, "-") != 0)
        label_append(e, "ep%d-%s", o->ep, e->order);
    else
        label_append(e, "ep%d", o->ep);
    if (o->model.aux_loss_coeff > 0.0)
        label_append(e, "-aux-%s", tm_aux_scope_name(o->model.aux_loss_scope));
    if (o->model.z_loss_coeff > 0.0)
        label_append(e, "-z");
    if (o->model.capacity_factor > 0.0)
        label_append(e, "-cf");
    label_append(e, "-%s", tm_dtype_name(o->model.dtype));
    if (o->inject != HX_FAULT_NONE)
        label_append(e, "-%s", hx_fault_name(o->inject));
}

/* Resolve every entry's options on top of the command line's, and validate each run as the
 * harness would, before anything runs or is written. */
static bool entries_resolve(hx_sweep *s, int argc, char **argv, FILE *err)
{
    char *args[512];
    int base = 0, shows = 0;
    char why[512] = "";
    for (int i = 0; i < argc && base < 400; i++) {
        const char *a = argv[i];
        if (i > 0 && (strcmp(a, "--sweep") == 0 || strcmp(a, "--out") == 0)) {
            i++;
            continue;
        }
        if (i > 0 && (strncmp(a, "--sweep=", 8) == 0 || strncmp(a, "--out=", 6) == 0))
            continue;
        args[base++] = argv[i];
    }
    int world0 = 0;
    bool mixed = false;
    for (int i = 0; i < s->n; i++) {
        hx_sweep_entry *e = &s->entries[i];
        int n = base;
        for (int a = 0; a < e->n_args; a++)
            args[n++] = e->args[a];
        args[n] = NULL;
        char msg[512], where[300];
        if (e->line)
            snprintf(where, sizeof where, "%s:%d:%d", s->name, e->line, e->column);
        else
            snprintf(where, sizeof where, "--sweep %s, run %d", s->name, i + 1);
        if (!hx_sweep_parse_options(n, args, &e->opts, msg, sizeof msg)) {
            fprintf(err, "seldp-harness: %s: %s\n", where, msg);
            return false;
        }
        e->opts.sweep = NULL;
        e->opts.out_dir = "";
        e->opts.quiet = true;
        e->opts.inject_anywhere = true;
        hx_run *run = NULL;
        if (hx_run_create(&e->opts, &run) != SELDP_OK) {
            fprintf(err, "seldp-harness: %s: %s\n", where, hx_last_error());
            return false;
        }
        if (hx_inject_check(run) == SELDP_OK)
            shows++;
        else if (!why[0])
            snprintf(why, sizeof why, "%s", hx_last_error());
        bool multi = hx_backend_multiprocess(run->backend);
        e->opts.world = run->opts.world;
        hx_run_destroy(run);
        if (multi) {
            fprintf(err, "seldp-harness: --sweep runs every layout in this process; start it "
                         "without mpirun\n");
            return false;
        }
        if (i == 0)
            world0 = e->opts.world;
        mixed = mixed || e->opts.world != world0;
        const hx_options *o = &e->opts;
        snprintf(e->order, sizeof e->order, "%s",
                 o->layout_file                    ? "file"
                 : o->grid_given && !o->grid.order ? "-"
                 : o->grid_given || o->order_given ? (o->grid.order ? o->grid.order : "-")
                                                   : hx_order_name(o->order));
        objective_describe(&o->model, e->objective, sizeof e->objective);
        e->baseline = i;
        for (int j = 0; j < i; j++) {
            if (same_objective(&s->entries[j].opts.model, &o->model)) {
                e->baseline = j;
                break;
            }
        }
        if (!e->label[0])
            label_of(e);
    }
    if (s->n > 0 && s->entries[0].opts.inject != HX_FAULT_NONE && shows == 0) {
        fprintf(err, "seldp-harness: --sweep %s: no run of it can show the planted bug: %s\n",
                s->name, why);
        return false;
    }
    if (mixed && s->entries[0].opts.global_batch == 0) {
        fprintf(err,
                "seldp-harness: --sweep %s mixes worlds without --global-batch: each world would "
                "train another model on other tokens; give --global-batch N\n",
                s->name);
        return false;
    }
    return true;
}

int hx_sweep_main(int argc, char **argv, const hx_options *opts, FILE *out, FILE *err)
{
    hx_sweep s = {.name = opts->sweep, .out_dir = opts->out_dir};
    int status = HX_EXIT_USAGE; /* --sweep's own rules: hx_options_rules (options_check.c) */
    if (!hx_sweep_entries(&s, opts, out, err))
        goto out;
    if (!entries_resolve(&s, argc, argv, err))
        goto out;
    s.results = hx_calloc((size_t)s.n, sizeof *s.results);
    s.baselines = hx_calloc((size_t)s.n, sizeof *s.baselines);
    s.locks = hx_calloc((size_t)s.n, sizeof *s.locks);
    if (!s.results || !s.baselines || !s.locks || hx_mkdir_p(s.out_dir) != SELDP_OK) {
        fprintf(err, "seldp-harness: %s\n", hx_last_error());
        status = HX_EXIT_FAIL;
        goto out;
    }
    if (out)
        fprintf(out, "sweep %s: %d runs, %d steps, seed %llu, global batch %d, reports in %s\n",
                s.name, s.n, s.entries[0].opts.steps,
                (unsigned long long)s.entries[0].opts.model.seed, s.entries[0].opts.global_batch,
                s.out_dir);
    bool pass = true;
    for (int i = 0; i < s.n; i++) {
        hx_sweep_run(&s, i, out);
        pass = pass && hx_sweep_run_ok(&s.results[i]);
    }
    status = pass ? HX_EXIT_PASS : HX_EXIT_FAIL;
    if (hx_sweep_write(&s, pass) != SELDP_OK) {
        fprintf(err, "seldp-harness: %s\n", hx_last_error());
        status = HX_EXIT_FAIL;
    }
    if (out) {
        int agree = 0, objectives = 0;
        for (int i = 0; i < s.n; i++) {
            agree += hx_sweep_run_ok(&s.results[i]);
            objectives += s.entries[i].baseline == i;
        }
        fprintf(out,
                "sweep result: %s (%d of %d runs pass their checks and agree with %s); "
                "%s/sweep.md\n",
                status == HX_EXIT_PASS ? "PASS" : "FAIL", agree, s.n,
                objectives > 1 ? "the first run of their objective" : "run 1", s.out_dir);
        fflush(out);
    }
out:
    entries_free(&s);
    return status;
}
