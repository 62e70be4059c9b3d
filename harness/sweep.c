/* Sweeps: parse the list of runs (a JSON file or a preset), run each in this process, compare
 * its per-step loss and final logical weights with the first run's, and write sweep.md,
 * sweep.json and a gnuplot plot. */
#define _POSIX_C_SOURCE 200809L

#include "sweep.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "json.h"
#include "run.h"
#include "util.h"

#define MAX_ENTRY_ARGS 48
#define MAX_RUNS       256

/* One run of the sweep: the options it adds to the command line's. */
typedef struct sweep_entry {
    char label[128];
    char *args[MAX_ENTRY_ARGS]; /* owned: "--world", "8", ... */
    int n_args;
    int line, column; /* of its object in the sweep file; 0 for a preset */
    hx_options opts;  /* the command line's options with the entry's on top */
} sweep_entry;

/* The final logical weights of a run: every trainable tensor, as F32. */
typedef struct sweep_weights {
    size_t n;
    char **paths;
    float **values;
    size_t *numel;
} sweep_weights;

typedef struct sweep_result {
    bool completed;
    bool checks_passed;
    int64_t failures;
    int steps;
    double *loss;     /* [steps] */
    double *loss_dev; /* [steps] relative to the first run's */
    double max_loss_dev;
    double weight_dev;
    char worst_tensor[128];
    double tolerance;
    bool agrees;
    double seconds;
    char diagnosis[400];
    char error[1024];
} sweep_result;

typedef struct sweep {
    const char *name; /* the file or preset */
    const char *out_dir;
    sweep_entry *entries;
    int n;
    sweep_result *results;
    sweep_weights first;
} sweep;

/* Option keys of a sweep file: the JSON key, the harness option, whether it takes no value. */
static const struct {
    const char *key;
    const char *option;
    bool flag;
} sweep_keys[] = {
    {"world", "world", false},
    {"ep", "ep", false},
    {"order", "order", false},
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
};
#define N_SWEEP_KEYS (sizeof sweep_keys / sizeof sweep_keys[0])

/* Options that must be the same in every run, and so only come from the command line. */
static const char *const shared_keys[] = {
    "seed",    "global-batch", "steps",   "tokens", "token-spread", "lr",     "vocab",
    "d-model", "d-ff",         "experts", "top-k",  "layers",       "backend"};

static double dtype_tolerance(seldp_dtype dtype)
{
    return dtype == SELDP_BF16 ? 1e-2 : dtype == SELDP_F16 ? 2e-3 : 1e-5;
}

static void weights_free(sweep_weights *w)
{
    for (size_t i = 0; i < w->n; i++) {
        free(w->paths[i]);
        free(w->values[i]);
    }
    free(w->paths);
    free(w->values);
    free(w->numel);
    *w = (sweep_weights){0};
}

static void entries_free(sweep *s)
{
    for (int i = 0; s->entries && i < s->n; i++)
        for (int a = 0; a < s->entries[i].n_args; a++)
            free(s->entries[i].args[a]);
    free(s->entries);
    for (int i = 0; s->results && i < s->n; i++) {
        free(s->results[i].loss);
        free(s->results[i].loss_dev);
    }
    free(s->results);
    weights_free(&s->first);
}

static bool entry_add(sweep_entry *e, const char *option, const char *value)
{
    if (e->n_args + 2 > MAX_ENTRY_ARGS)
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
static bool entry_from_json(const char *file, const hx_json *obj, sweep_entry *e, FILE *err)
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
                    "order, layout-file, roots, dtype, quant, flow, fp32-master, policy, inject, "
                    "lora-rank or lora-alpha\n",
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
        else if (v->type == HX_JSON_NUMBER && strcmp(key, "lora-alpha") == 0)
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
        hx_options scratch;
        if (!parse_options(3, one, &scratch, msg, sizeof msg)) {
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

static bool entries_from_file(sweep *s, FILE *err)
{
    char *text = NULL;
    size_t len = 0;
    hx_json *root = NULL;
    bool ok = false;
    if (hx_read_file(s->name, &text, &len) != SELDP_OK) {
        fprintf(err, "seldp-harness: --sweep %s: not a preset (ep, worlds, worlds-32) and %s\n",
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

/* The presets: every ep of the world in both orders; worlds 1, 2, 4, 8 (and 16, 32). */
static bool entries_from_preset(sweep *s, const hx_options *base, bool *is_preset)
{
    *is_preset = true;
    int worlds[] = {1, 2, 4, 8, 16, 32};
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
                sweep_entry *e = &s->entries[s->n++];
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
        sweep_entry *e = &s->entries[s->n++];
        if (!entry_add(e, "world", w) || !entry_add(e, "ep", v))
            return false;
    }
    return true;
}

/* Resolve every entry's options on top of the command line's, and validate each run as the
 * harness would, before anything runs or is written. */
static bool entries_resolve(sweep *s, int argc, char **argv, FILE *err)
{
    char *args[512];
    int base = 0;
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
        sweep_entry *e = &s->entries[i];
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
        hx_run *run = NULL;
        if (hx_run_create(&e->opts, &run) != SELDP_OK) {
            fprintf(err, "seldp-harness: %s: %s\n", where, hx_last_error());
            return false;
        }
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
        if (!e->label[0]) {
            const hx_options *o = &e->opts;
            int len = snprintf(e->label, sizeof e->label, "w%d-%s", o->world,
                               o->layout_file ? "file" : "ep");
            if (!o->layout_file)
                len += snprintf(e->label + len, sizeof e->label - (size_t)len, "%d-%s", o->ep,
                                hx_order_name(o->order));
            len += snprintf(e->label + len, sizeof e->label - (size_t)len, "-%s",
                            tm_dtype_name(o->model.dtype));
            if (o->inject != HX_FAULT_NONE)
                snprintf(e->label + len, sizeof e->label - (size_t)len, "-%s",
                         hx_fault_name(o->inject));
        }
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

static seldp_status weights_of(const hx_run *run, sweep_weights *w)
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
    HX_CHECK_LIB(
        tm_model_copy_params(m, run->ranks[l->shared.root].model, TM_ROLES_SHARED_GROUP, -1),
        "copying the shared parameters of rank %d", l->shared.root);
    for (int e = 0; e < l->experts; e++)
        HX_CHECK_LIB(
            tm_model_copy_params(m, run->ranks[l->owners[e].root].model, TM_ROLES_EXPERT_GROUP, e),
            "copying expert %d from rank %d", e, l->owners[e].root);
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

/* The largest ||w - w0|| / ||w0|| over the tensors, and where. */
static double weights_deviation(const sweep_weights *w0, const sweep_weights *w, char *worst,
                                size_t size)
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

/* Run entry i and compare it with the first run. */
static void sweep_run(sweep *s, int i, FILE *out)
{
    sweep_entry *e = &s->entries[i];
    sweep_result *r = &s->results[i];
    int steps = e->opts.steps;
    r->steps = steps;
    r->loss = hx_calloc((size_t)(steps ? steps : 1), sizeof *r->loss);
    r->loss_dev = hx_calloc((size_t)(steps ? steps : 1), sizeof *r->loss_dev);
    r->tolerance =
        fmax(dtype_tolerance(e->opts.model.dtype), dtype_tolerance(s->entries[0].opts.model.dtype));
    double t0 = hx_now();
    hx_run *run = NULL;
    sweep_weights w = {0};
    if (!r->loss || !r->loss_dev || hx_run_create(&e->opts, &run) != SELDP_OK) {
        snprintf(r->error, sizeof r->error, "%s", hx_last_error());
        goto done;
    }
    if (hx_run_execute(run, NULL) != SELDP_OK) {
        snprintf(r->error, sizeof r->error, "%s", run->error);
        goto done;
    }
    r->completed = true;
    r->checks_passed = hx_run_passed(run);
    r->failures = hx_run_failures(run);
    snprintf(r->diagnosis, sizeof r->diagnosis, "%s", run->diagnosis);
    for (int k = 0; k < steps; k++)
        r->loss[k] = run->steps[k].loss;
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/runs/%02d-%s", s->out_dir, i + 1, e->label);
    if (hx_report_write(run, dir) != SELDP_OK)
        snprintf(r->error, sizeof r->error, "%s", hx_last_error());
    if (weights_of(run, &w) != SELDP_OK) {
        snprintf(r->error, sizeof r->error, "%s", hx_last_error());
        r->completed = false;
        goto done;
    }
    if (i == 0) {
        s->first = w;
        w = (sweep_weights){0};
    } else if (s->results[0].completed) {
        r->weight_dev = weights_deviation(&s->first, &w, r->worst_tensor, sizeof r->worst_tensor);
    }
    if (s->results[0].completed) {
        for (int k = 0; k < steps; k++) {
            double l0 = s->results[0].loss[k];
            r->loss_dev[k] = fabs(r->loss[k] - l0) / fmax(fabs(l0), 1e-300);
            if (!(r->loss_dev[k] <= r->max_loss_dev))
                r->max_loss_dev = r->loss_dev[k];
        }
    }
    r->agrees = s->results[0].completed && r->max_loss_dev <= r->tolerance &&
                r->weight_dev <= r->tolerance && !r->error[0];
done:
    r->seconds = hx_now() - t0;
    weights_free(&w);
    hx_run_destroy(run);
    if (out) {
        if (!r->completed)
            fprintf(out, "sweep [%d/%d] %s: the run stopped: %s\n", i + 1, s->n, e->label,
                    r->error);
        else
            fprintf(out,
                    "sweep [%d/%d] %s: checks %s (%lld failed), loss deviation %.2e, weight "
                    "deviation %.2e (limit %.0e): %s (%.2f s)\n",
                    i + 1, s->n, e->label, r->checks_passed ? "PASS" : "FAIL",
                    (long long)r->failures, r->max_loss_dev, r->weight_dev, r->tolerance,
                    r->agrees ? "agrees" : "DEVIATES", r->seconds);
        if (r->completed && !r->agrees && s->results[0].completed) {
            int worst = 0;
            for (int k = 1; k < steps; k++)
                worst = r->loss_dev[k] > r->loss_dev[worst] ? k : worst;
            fprintf(out, "  deviates: loss by %.2e at step %d, final weights by %.2e in %s\n",
                    steps ? r->loss_dev[worst] : 0.0, worst + 1, r->weight_dev, r->worst_tensor);
        }
        if (r->diagnosis[0])
            fprintf(out, "  diagnosis: %s\n", r->diagnosis);
        fflush(out);
    }
}

static bool run_ok(const sweep_result *r)
{
    return r->completed && r->checks_passed && r->agrees;
}

/* The largest deviation of any run from the first at each step. */
static double step_deviation(const sweep *s, int k)
{
    double dev = 0;
    for (int i = 1; i < s->n; i++)
        if (s->results[i].completed && k < s->results[i].steps)
            dev = fmax(dev, s->results[i].loss_dev[k]);
    return dev;
}

static seldp_status write_json(const sweep *s, bool pass)
{
    hx_buf b = {0};
    int steps = s->entries[0].opts.steps;
    hx_buf_puts(&b, "{\n  \"sweep\": ");
    hx_buf_json_string(&b, s->name);
    hx_buf_printf(&b, ",\n  \"steps\": %d,\n  \"seed\": %llu,\n  \"global_batch\": %d,\n", steps,
                  (unsigned long long)s->entries[0].opts.model.seed,
                  s->entries[0].opts.global_batch);
    hx_buf_printf(&b, "  \"result\": \"%s\",\n  \"max_deviation_per_step\": [",
                  pass ? "PASS" : "FAIL");
    for (int k = 0; k < steps; k++) {
        hx_buf_puts(&b, k ? ", " : "");
        hx_buf_json_number(&b, step_deviation(s, k));
    }
    hx_buf_puts(&b, "],\n  \"runs\": [");
    for (int i = 0; i < s->n; i++) {
        const sweep_entry *e = &s->entries[i];
        const sweep_result *r = &s->results[i];
        hx_buf_puts(&b, i ? ",\n    {" : "\n    {");
        hx_buf_puts(&b, "\"name\": ");
        hx_buf_json_string(&b, e->label);
        hx_buf_printf(&b,
                      ", \"world\": %d, \"ep\": %d, \"order\": \"%s\", \"dtype\": \"%s\", "
                      "\"flow\": \"%s\", \"inject\": \"%s\", \"layout_file\": ",
                      e->opts.world, e->opts.ep, hx_order_name(e->opts.order),
                      tm_dtype_name(e->opts.model.dtype), hx_flow_name(e->opts.flow),
                      hx_fault_name(e->opts.inject));
        if (e->opts.layout_file)
            hx_buf_json_string(&b, e->opts.layout_file);
        else
            hx_buf_puts(&b, "null");
        hx_buf_printf(&b,
                      ",\n     \"completed\": %s, \"checks_passed\": %s, \"failed_checks\": "
                      "%lld, \"agrees\": %s, \"tolerance\": ",
                      r->completed ? "true" : "false", r->checks_passed ? "true" : "false",
                      (long long)r->failures, r->agrees ? "true" : "false");
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

static seldp_status write_md(const sweep *s, bool pass, const char *plot_note)
{
    hx_buf b = {0};
    const hx_options *o = &s->entries[0].opts;
    hx_buf_printf(&b, "# Sweep %s: %s\n\n", s->name, pass ? "PASS" : "FAIL");
    hx_buf_printf(&b,
                  "%d runs, %d steps each, seed %llu, global batch %d; each run's per-step loss "
                  "and final logical weights compared with run 1's (relative; the limit is the "
                  "dtype's: f32 1e-5, f16 2e-3, bf16 1e-2).\n\n",
                  s->n, o->steps, (unsigned long long)o->model.seed, o->global_batch);
    hx_buf_puts(&b, "| # | run | world | ep | order | dtype | inject | checks | loss dev | weight "
                    "dev | worst tensor | limit | agrees |\n");
    hx_buf_puts(&b, "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (int i = 0; i < s->n; i++) {
        const sweep_entry *e = &s->entries[i];
        const sweep_result *r = &s->results[i];
        hx_buf_printf(&b, "| %d | %s | %d | %d | %s | %s | %s | ", i + 1, e->label, e->opts.world,
                      e->opts.ep, e->opts.layout_file ? "file" : hx_order_name(e->opts.order),
                      tm_dtype_name(e->opts.model.dtype), hx_fault_name(e->opts.inject));
        if (!r->completed)
            hx_buf_puts(&b, "stopped | - | - | - | - | no |\n");
        else
            hx_buf_printf(&b, "%s (%lld failed) | %.2e | %.2e | %s | %.0e | %s |\n",
                          r->checks_passed ? "PASS" : "FAIL", (long long)r->failures,
                          r->max_loss_dev, r->weight_dev,
                          r->worst_tensor[0] ? r->worst_tensor : "-", r->tolerance,
                          r->agrees ? "yes" : "**no**");
    }
    hx_buf_puts(&b, "\n## Largest loss deviation from run 1, per step\n\n| step | deviation |\n"
                    "|---|---|\n");
    for (int k = 0; k < o->steps; k++)
        hx_buf_printf(&b, "| %d | %.3e |\n", k + 1, step_deviation(s, k));
    bool any = false;
    for (int i = 0; i < s->n; i++) {
        const sweep_result *r = &s->results[i];
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
static seldp_status write_plot(const sweep *s, char *note, size_t size)
{
    hx_buf dat = {0}, gp = {0};
    int steps = s->entries[0].opts.steps;
    hx_buf_puts(&dat, "# step, largest relative loss deviation from run 1, then each run's loss\n");
    for (int k = 0; k < steps; k++) {
        hx_buf_printf(&dat, "%d %.9e", k + 1, fmax(step_deviation(s, k), 1e-17));
        for (int i = 0; i < s->n; i++)
            hx_buf_printf(&dat, " %.12e", s->results[i].completed ? s->results[i].loss[k] : NAN);
        hx_buf_puts(&dat, "\n");
    }
    hx_buf_printf(&gp,
                  "# gnuplot sweep.gp (in this folder) draws sweep.png from sweep.dat\n"
                  "set terminal pngcairo size 1100,900 noenhanced\n"
                  "set output 'sweep.png'\n"
                  "set multiplot layout 2,1 title 'sweep %s: loss per step of every run, and the "
                  "largest deviation from run 1'\n"
                  "set xlabel 'step'\nset ylabel 'loss'\nset xtics 1\nset key outside right\n"
                  "plot ",
                  s->name);
    for (int i = 0; i < s->n; i++)
        hx_buf_printf(&gp, "%s'sweep.dat' using 1:%d with linespoints dashtype %d title '%s'",
                      i ? ", \\\n     " : "", i + 3, 1 + i % 5, s->entries[i].label);
    hx_buf_printf(&gp,
                  "\nset logscale y\nset format y '%%.0e'\nset ylabel 'relative deviation'\n"
                  "plot 'sweep.dat' using 1:2 with linespoints lw 2 title 'largest loss "
                  "deviation', %g with lines dashtype 2 title 'limit (%s)'\n"
                  "unset multiplot\n",
                  s->results[0].tolerance, tm_dtype_name(s->entries[0].opts.model.dtype));
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
             "![loss per step of every run, and the largest deviation from run 1](sweep.png)\n\n"
             "Drawn by `gnuplot sweep.gp` from sweep.dat.");
    return SELDP_OK;
}

int hx_sweep_main(int argc, char **argv, const hx_options *opts, FILE *out, FILE *err)
{
    sweep s = {.name = opts->sweep, .out_dir = opts->out_dir};
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
    if (!s.results || hx_mkdir_p(s.out_dir) != SELDP_OK) {
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
        sweep_run(&s, i, out);
        pass = pass && run_ok(&s.results[i]);
    }
    char note[512] = "";
    status = pass ? HX_EXIT_PASS : HX_EXIT_FAIL;
    if (write_plot(&s, note, sizeof note) != SELDP_OK || write_json(&s, pass) != SELDP_OK ||
        write_md(&s, pass, note) != SELDP_OK) {
        fprintf(err, "seldp-harness: %s\n", hx_last_error());
        status = HX_EXIT_FAIL;
    }
    if (out) {
        int agree = 0;
        for (int i = 0; i < s.n; i++)
            agree += run_ok(&s.results[i]);
        fprintf(out,
                "sweep result: %s (%d of %d runs pass their checks and agree with run 1); "
                "%s/sweep.md\n",
                status == HX_EXIT_PASS ? "PASS" : "FAIL", agree, s.n, s.out_dir);
        fflush(out);
    }
out:
    entries_free(&s);
    return status;
}
