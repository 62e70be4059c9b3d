/* Sweeps: parse the list of runs (a JSON file or a preset), run each in this process, compare
 * its per-step loss and final logical weights with the first run's, and write sweep.md,
 * sweep.json and a gnuplot plot. */
#define _POSIX_C_SOURCE 200809L

#include "sweep.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "inject.h"
#include "json.h"
#include "lockstep.h"
#include "grid.h"
#include "run.h"
#include "sweep_report.h"
#include "util.h"

#define MAX_RUNS 256

/* Option keys of a sweep file: the JSON key, the harness option, whether it takes no value. */
static const struct {
    const char *key;
    const char *option;
    bool flag;
} sweep_keys[] = {
    {"world", "world", false},
    {"ep", "ep", false},
    {"order", "order", false},
    {"framework", "framework", false},
    {"tp", "tp", false},
    {"pp", "pp", false},
    {"cp", "cp", false},
    {"etp", "etp", false},
    {"layout-file", "layout-file", false},
    {"roots", "roots", false},
    {"dtype", "dtype", false},
    {"quant", "quant", false},
    {"flow", "expert-reduce", false},
    {"expert-reduce", "expert-reduce", false},
    {"fp32-master", "fp32-master", true},
    {"policy", "policy", false},
    {"inject", "inject", false},
    {"lora-rank", "lora-rank", false},
    {"lora-alpha", "lora-alpha", false},
    /* the objective: a run that differs in these is compared with the first run of its own
     * objective, and its difference from run 1 is reported */
    {"aux-loss-coeff", "aux-loss-coeff", false},
    {"aux-loss-scope", "aux-loss-scope", false},
    {"z-loss-coeff", "z-loss-coeff", false},
    {"capacity-factor", "capacity-factor", false},
};
#define N_SWEEP_KEYS (sizeof sweep_keys / sizeof sweep_keys[0])

/* Options that must be the same in every run, and so only come from the command line. */
static const char *const shared_keys[] = {
    "seed",    "global-batch", "steps",   "tokens", "token-spread", "lr",      "vocab",
    "d-model", "d-ff",         "experts", "top-k",  "layers",       "backend", "shared-expert-ff"};

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

static bool entry_add(hx_sweep_entry *e, const char *option, const char *value)
{
    if (e->n_args + 2 > HX_SWEEP_MAX_ARGS)
        return false;
    size_t n = strlen(option) + 3;
    char *opt = malloc(n);
    if (!opt)
        return false;
    snprintf(opt, n, "--%s", option);
    e->args[e->n_args++] = opt;
    if (value) {
        char *v = hx_strdup(value);
        if (!v)
            return false;
        e->args[e->n_args++] = v;
    }
    return true;
}

/* Parse `argv` (argv[0] first) into *o, the error line (without the program's prefix) into
 * msg. Returns false on a bad option. */
static bool parse_options(int argc, char **argv, hx_options *o, char *msg, size_t size)
{
    hx_options_default(o);
    char *text = NULL;
    size_t len = 0;
    FILE *err = open_memstream(&text, &len);
    if (!err) {
        snprintf(msg, size, "out of memory");
        return false;
    }
    hx_parse_result r = hx_options_parse(argc, argv, o, err, err);
    fclose(err);
    const char *m = text ? text : "";
    if (strncmp(m, "seldp-harness: ", 15) == 0)
        m += 15;
    snprintf(msg, size, "%.*s", (int)strcspn(m, "\n"), m);
    free(text);
    return r == HX_PARSE_RUN;
}

/* The options of one object of a sweep file. */
static bool entry_from_json(const char *file, const hx_json *obj, hx_sweep_entry *e, FILE *err)
{
    e->line = obj->line;
    e->column = obj->column;
    if (obj->type != HX_JSON_OBJECT) {
        fprintf(err,
                "seldp-harness: %s:%d:%d: a run must be an object of harness options, not %s\n",
                file, obj->line, obj->column, hx_json_type_name(obj->type));
        return false;
    }
    for (size_t k = 0; k < obj->count; k++) {
        const char *key = obj->keys[k];
        const hx_json *v = &obj->items[k];
        if (strcmp(key, "name") == 0) {
            if (v->type != HX_JSON_STRING || !v->string[0]) {
                fprintf(err, "seldp-harness: %s:%d:%d: \"name\": expected a non-empty string\n",
                        file, v->line, v->column);
                return false;
            }
            snprintf(e->label, sizeof e->label, "%s", v->string);
            continue;
        }
        for (size_t s = 0; s < sizeof shared_keys / sizeof shared_keys[0]; s++) {
            if (strcmp(key, shared_keys[s]) == 0) {
                fprintf(err,
                        "seldp-harness: %s:%d:%d: \"%s\": the same in every run of a sweep; give "
                        "--%s on the command line\n",
                        file, v->line, v->column, key, key);
                return false;
            }
        }
        size_t s = 0;
        while (s < N_SWEEP_KEYS && strcmp(key, sweep_keys[s].key) != 0)
            s++;
        if (s == N_SWEEP_KEYS) {
            fprintf(err,
                    "seldp-harness: %s:%d:%d: unknown key \"%s\": expected name, world, ep, "
                    "order, framework, tp, pp, cp, etp, layout-file, roots, dtype, quant, flow, "
                    "fp32-master, "
                    "policy, inject, lora-rank, lora-alpha, aux-loss-coeff, aux-loss-scope, "
                    "z-loss-coeff or capacity-factor\n",
                    file, v->line, v->column, key);
            return false;
        }
        char value[256];
        if (sweep_keys[s].flag) {
            if (v->type != HX_JSON_BOOL) {
                fprintf(err, "seldp-harness: %s:%d:%d: \"%s\": expected true or false\n", file,
                        v->line, v->column, key);
                return false;
            }
            if (v->boolean && !entry_add(e, sweep_keys[s].option, NULL))
                goto nomem;
            continue;
        }
        if (v->type == HX_JSON_STRING)
            snprintf(value, sizeof value, "%s", v->string);
        else if (v->type == HX_JSON_NUMBER && v->is_integer)
            snprintf(value, sizeof value, "%lld", (long long)v->integer);
        else if (v->type == HX_JSON_NUMBER &&
                 (strcmp(key, "lora-alpha") == 0 || strstr(key, "-coeff") ||
                  strcmp(key, "capacity-factor") == 0))
            snprintf(value, sizeof value, "%.17g", v->number);
        else {
            fprintf(err,
                    "seldp-harness: %s:%d:%d: \"%s\": expected a string or an integer, not %s\n",
                    file, v->line, v->column, key, hx_json_type_name(v->type));
            return false;
        }
        /* the value alone, so that its error points at it */
        char opt[64], msg[512];
        snprintf(opt, sizeof opt, "--%s", sweep_keys[s].option);
        char *one[] = {"seldp-harness", opt, value, NULL};
        /* a planted bug's requirements on other options are checked with the whole run; here
         * only its name (local-aux needs a load-balancing loss) */
        char *bug[] = {"seldp-harness", "--aux-loss-coeff", "1", opt, value, NULL};
        bool is_inject = strcmp(key, "inject") == 0;
        hx_options scratch;
        if (!parse_options(is_inject ? 5 : 3, is_inject ? bug : one, &scratch, msg, sizeof msg)) {
            fprintf(err, "seldp-harness: %s:%d:%d: %s\n", file, v->line, v->column, msg);
            return false;
        }
        if (!entry_add(e, sweep_keys[s].option, value))
            goto nomem;
    }
    return true;
nomem:
    fprintf(err, "seldp-harness: %s: out of memory or too many options in one run\n", file);
    return false;
}

static bool entries_from_file(hx_sweep *s, FILE *err)
{
    char *text = NULL;
    size_t len = 0;
    hx_json *root = NULL;
    bool ok = false;
    if (hx_read_file(s->name, &text, &len) != SELDP_OK) {
        fprintf(err,
                "seldp-harness: --sweep %s: not a preset (ep, frameworks, worlds, worlds-32) "
                "and %s\n",
                s->name, hx_last_error());
        return false;
    }
    if (hx_json_parse(text, len, s->name, &root) != SELDP_OK) {
        fprintf(err, "seldp-harness: %s\n", hx_last_error());
        goto out;
    }
    if (root->type != HX_JSON_ARRAY || root->count == 0 || root->count > MAX_RUNS) {
        fprintf(err, "seldp-harness: %s:%d:%d: expected a list of 1 to %d runs\n", s->name,
                root->line, root->column, MAX_RUNS);
        goto out;
    }
    s->entries = hx_calloc(root->count, sizeof *s->entries);
    if (!s->entries)
        goto out;
    s->n = (int)root->count;
    for (size_t i = 0; i < root->count; i++)
        if (!entry_from_json(s->name, &root->items[i], &s->entries[i], err))
            goto out;
    ok = true;
out:
    hx_json_free(root);
    free(text);
    return ok;
}

/* The frameworks preset: each framework at TP = PP = CP = ETP = 1 with each order it has
 * (Megatron's with ep inside and outside dp; DeepSpeed's expert- and data-first; torchtitan's
 * mesh has none). */
static const struct {
    const char *framework;
    const char *order; /* NULL: the framework has no order */
} framework_runs[] = {
    {"megatron", "tp-cp-ep-dp-pp"},
    {"megatron", "tp-cp-dp-ep-pp"},
    {"megatron-0.9", "tp-cp-ep-dp-pp"},
    {"megatron-0.9", "tp-cp-dp-ep-pp"},
    {"deepspeed", "ep-dp"},
    {"deepspeed", "dp-ep"},
    {"torchtitan", NULL},
};
#define N_FRAMEWORK_RUNS (sizeof framework_runs / sizeof framework_runs[0])

/* The presets: every ep of the world in both orders; every framework preset; worlds 1, 2, 4,
 * 8 (and 16, 32). */
static bool entries_from_preset(hx_sweep *s, const hx_options *base, bool *is_preset)
{
    *is_preset = true;
    int worlds[] = {1, 2, 4, 8, 16, 32};
    if (strcmp(s->name, "frameworks") == 0) {
        s->entries = hx_calloc(N_FRAMEWORK_RUNS, sizeof *s->entries);
        if (!s->entries)
            return false;
        for (size_t i = 0; i < N_FRAMEWORK_RUNS; i++) {
            hx_sweep_entry *e = &s->entries[s->n++];
            if (!entry_add(e, "framework", framework_runs[i].framework) ||
                (framework_runs[i].order && !entry_add(e, "order", framework_runs[i].order)))
                return false;
        }
        return true;
    }
    if (strcmp(s->name, "ep") == 0) {
        s->entries = hx_calloc(2 * 64, sizeof *s->entries);
        if (!s->entries)
            return false;
        for (int ep = 1; ep <= base->world && s->n < 128; ep++) {
            if (base->world % ep != 0 || base->model.experts % ep != 0)
                continue;
            for (int order = 0; order < 2; order++) {
                char v[16];
                snprintf(v, sizeof v, "%d", ep);
                hx_sweep_entry *e = &s->entries[s->n++];
                if (!entry_add(e, "ep", v) || !entry_add(e, "order", order ? "dp-ep" : "ep-dp"))
                    return false;
            }
        }
        return true;
    }
    int n_worlds = strcmp(s->name, "worlds") == 0 ? 4 : strcmp(s->name, "worlds-32") == 0 ? 6 : 0;
    if (n_worlds == 0) {
        *is_preset = false;
        return true;
    }
    s->entries = hx_calloc((size_t)n_worlds, sizeof *s->entries);
    if (!s->entries)
        return false;
    for (int i = 0; i < n_worlds; i++) {
        int ep = base->ep;
        while (ep > 1 && (worlds[i] % ep != 0 || base->model.experts % ep != 0))
            ep /= 2;
        char w[16], v[16];
        snprintf(w, sizeof w, "%d", worlds[i]);
        snprintf(v, sizeof v, "%d", ep < 1 ? 1 : ep);
        hx_sweep_entry *e = &s->entries[s->n++];
        if (!entry_add(e, "world", w) || !entry_add(e, "ep", v))
            return false;
    }
    return true;
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
        if (!parse_options(n, args, &e->opts, msg, sizeof msg)) {
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
    int status = HX_EXIT_USAGE;
    const char *excluded = opts->dump_dir     ? "--dump"
                           : opts->save_dir   ? "--save"
                           : opts->resume_dir ? "--resume"
                           : opts->summary    ? "--summary"
                                              : NULL;
    if (excluded) {
        fprintf(err,
                "seldp-harness: --sweep and %s exclude each other: a sweep writes its own "
                "reports\n",
                excluded);
        return HX_EXIT_USAGE;
    }
    if (!s.out_dir || !s.out_dir[0]) {
        fprintf(err, "seldp-harness: --sweep needs --out DIR for sweep.md and sweep.json\n");
        return HX_EXIT_USAGE;
    }
    bool is_preset = false;
    if (!entries_from_preset(&s, opts, &is_preset)) {
        fprintf(err, "seldp-harness: out of memory\n");
        goto out;
    }
    if (!is_preset && !entries_from_file(&s, err))
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
