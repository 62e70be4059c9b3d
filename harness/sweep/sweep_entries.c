/* The runs of a sweep (sweep_entries.h): the sweep file's objects and the presets' layouts. */
#define _POSIX_C_SOURCE 200809L

#include "sweep_entries.h"

#include <stdlib.h>
#include <string.h>

#include "json.h"
#include "layout.h"
#include "options_impl.h"
#include "util.h"

#define MAX_RUNS 256

/* The keys of a sweep file are the option table's rows (options_table.c): a row's `sweep` says
 * whether a run may set it (HX_SWEEP_KEY), or the command line only (HX_SWEEP_SHARED), and
 * its value parses through the row as on the command line. */

/* "name, world, ep, ... or capacity-factor": the keys a run may have. */
static void sweep_key_list(char *buf, size_t size)
{
    size_t at = (size_t)snprintf(buf, size, "name"), n = 0, k = 0;
    for (size_t i = 0; i < hx_option_docs_n; i++)
        n += (hx_option_docs[i].sweep == HX_SWEEP_KEY) + (hx_option_docs[i].sweep_alias != NULL);
    for (size_t i = 0; i < hx_option_docs_n && at < size; i++) {
        const hx_opt_row *r = &hx_option_docs[i];
        if (r->sweep != HX_SWEEP_KEY)
            continue;
        const char *names[2] = {r->sweep_alias, r->opt.name};
        for (int j = 0; j < 2 && at < size; j++)
            if (names[j])
                at += (size_t)snprintf(buf + at, size - at, "%s%s", ++k == n ? " or " : ", ",
                                       names[j]);
    }
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

bool hx_sweep_parse_options(int argc, char **argv, hx_options *o, char *msg, size_t size)
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

/* The options of one object of a sweep file, run `run` (1-based). */
static bool entry_from_json(const char *file, int run, const hx_json *obj, hx_sweep_entry *e,
                            FILE *err)
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
        char key[128]; /* as a message may show it */
        hx_printable(obj->keys[k], key, sizeof key);
        const hx_json *v = &obj->items[k];
        if (strcmp(key, "name") == 0) {
            if (v->type != HX_JSON_STRING || !v->string[0]) {
                fprintf(err, "seldp-harness: %s:%d:%d: \"name\": expected a non-empty string\n",
                        file, v->line, v->column);
                return false;
            }
            hx_printable(v->string, e->label, sizeof e->label);
            continue;
        }
        const hx_opt_row *r = hx_opt_find(&hx_options_table, key, true);
        if (r && r->sweep == HX_SWEEP_SHARED) {
            fprintf(err,
                    "seldp-harness: %s:%d:%d: \"%s\": the same in every run of a sweep; give "
                    "--%s on the command line\n",
                    file, v->line, v->column, key, r->opt.name);
            return false;
        }
        if (!r || r->sweep != HX_SWEEP_KEY) {
            char keys[1024];
            sweep_key_list(keys, sizeof keys);
            fprintf(err, "seldp-harness: %s:%d:%d: unknown key \"%s\": expected %s\n", file,
                    v->line, v->column, key, keys);
            return false;
        }
        char value[256];
        if (r->kind == HX_OPT_FLAG) {
            if (v->type != HX_JSON_BOOL) {
                fprintf(err, "seldp-harness: %s:%d:%d: \"%s\": expected true or false\n", file,
                        v->line, v->column, key);
                return false;
            }
            if (v->boolean && !entry_add(e, r->opt.name, NULL))
                goto nomem;
            continue;
        }
        if (v->type == HX_JSON_STRING)
            snprintf(value, sizeof value, "%s", v->string);
        else if (v->type == HX_JSON_NUMBER && v->is_integer)
            snprintf(value, sizeof value, "%lld", (long long)v->integer);
        else if (v->type == HX_JSON_NUMBER && r->kind == HX_OPT_DOUBLE)
            snprintf(value, sizeof value, "%.17g", v->number);
        else {
            fprintf(err,
                    "seldp-harness: %s:%d:%d: \"%s\": expected a string or an integer, not %s\n",
                    file, v->line, v->column, key, hx_json_type_name(v->type));
            return false;
        }
        /* the value alone through its row, so that its error points at it and reads as the
         * command line's; the rules between options are checked with the whole run
         * (hx_options_check, sweep.c) */
        char msg[640];
        hx_options scratch;
        hx_options_default(&scratch);
        if (!hx_opt_parse_value(r, value, &scratch, msg, sizeof msg)) {
            fprintf(err, "seldp-harness: %s:%d:%d: %s (run %d%s%s%s)\n", file, v->line, v->column,
                    msg, run, e->label[0] ? ", \"" : "", e->label, e->label[0] ? "\"" : "");
            return false;
        }
        if (!entry_add(e, r->opt.name, value))
            goto nomem;
    }
    return true;
nomem:
    fprintf(err, "seldp-harness: %s: out of memory or too many options in one run\n", file);
    return false;
}

bool hx_sweep_file_parse(hx_sweep *s, const char *text, size_t len, FILE *err)
{
    hx_json *root = NULL;
    bool ok = false;
    if (hx_json_parse(text, len, s->name, &root) != SELDP_OK) {
        fprintf(err, "seldp-harness: %s\n", hx_last_error());
        return false;
    }
    if (root->type != HX_JSON_ARRAY || root->count == 0 || root->count > MAX_RUNS) {
        fprintf(err, "seldp-harness: %s:%d:%d: expected a list of 1 to %d runs\n", s->name,
                root->line, root->column, MAX_RUNS);
        goto out;
    }
    s->entries = hx_calloc(root->count, sizeof *s->entries);
    if (!s->entries) {
        fprintf(err, "seldp-harness: out of memory\n");
        goto out;
    }
    s->n = (int)root->count;
    for (size_t i = 0; i < root->count; i++)
        if (!entry_from_json(s->name, (int)i + 1, &root->items[i], &s->entries[i], err))
            goto out;
    ok = true;
out:
    hx_json_free(root);
    return ok;
}

static bool entries_from_file(hx_sweep *s, FILE *err)
{
    char *text = NULL;
    size_t len = 0;
    if (hx_read_file(s->name, &text, &len) != SELDP_OK) {
        fprintf(err,
                "seldp-harness: --sweep %s: not a preset (ep, frameworks, worlds, worlds-32) "
                "and %s\n",
                s->name, hx_last_error());
        return false;
    }
    bool ok = hx_sweep_file_parse(s, text, len, err);
    free(text);
    return ok;
}

/* ---- the presets -------------------------------------------------------------------------- */

/* The frameworks preset: each framework with each order it has (Megatron's ep inside and
 * outside dp; DeepSpeed's expert- and data-first; torchtitan's mesh has none). DeepSpeed's are
 * the classic deepspeed.moe.layer.MoE groups, which AutoEP builds too (import_deepspeed.c). */
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

/* One layout a preset proposes. */
typedef struct candidate {
    int world, ep;
    bool world_arg;        /* the run names its world (the worlds preset) */
    const char *framework; /* NULL: the command line's */
    const char *order;     /* NULL: the framework's own */
} candidate;

typedef struct preset {
    hx_sweep *s;
    const hx_options *base;
    FILE *out;
    hx_layout **kept;        /* the layouts of the entries so far */
    const char **frameworks; /* and their candidates' frameworks */
    int cap;
} preset;

static bool same_layout(const hx_layout *a, const hx_layout *b)
{
    if (a->world != b->world || a->experts != b->experts || !a->grid || !b->grid)
        return false;
    for (int k = 0; k < SELDP_GROUP_KINDS; k++) {
        seldp_group_kind kind = (seldp_group_kind)k;
        int n = seldp_layout_group_count(a->grid, kind);
        if (n != seldp_layout_group_count(b->grid, kind))
            return false;
        for (int g = 0; g < n; g++) {
            const int *x = NULL, *y = NULL;
            int size = seldp_layout_group(a->grid, kind, g, &x);
            if (seldp_layout_group(b->grid, kind, g, &y) != size ||
                memcmp(x, y, (size_t)size * sizeof *x) != 0)
                return false;
        }
    }
    for (int e = 0; e < a->experts; e++)
        if (a->owners[e].size != b->owners[e].size ||
            memcmp(a->owners[e].ranks, b->owners[e].ranks,
                   (size_t)a->owners[e].size * sizeof *a->owners[e].ranks) != 0)
            return false;
    return true;
}

static void describe(const candidate *c, char *buf, size_t size)
{
    snprintf(buf, size, "world %d, ep %d%s%s%s%s", c->world, c->ep, c->framework ? ", " : "",
             c->framework ? c->framework : "", c->order ? " " : "", c->order ? c->order : "");
}

/* Add the run of candidate c unless the framework refuses it or an earlier run has its groups.
 * Returns false when out of memory. */
static bool propose(preset *p, const candidate *c)
{
    hx_sweep *s = p->s;
    hx_grid grid = p->base->grid;
    hx_layout *l = NULL;
    char what[160];
    describe(c, what, sizeof what);
    if (s->n >= MAX_RUNS)
        return true;
    if (c->framework) {
        if (seldp_framework_parse(c->framework, &grid.framework) != SELDP_OK)
            return false;
        grid.framework_given = true;
    }
    if (c->order)
        grid.order = c->order;
    else if (c->framework)
        grid.order = NULL;
    if (c->world % c->ep != 0 || p->base->model.experts % c->ep != 0)
        return true; /* not an ep of this world and these experts */
    if (hx_layout_generate_grid(c->world, c->ep, p->base->model.experts, &grid, p->base->roots,
                                &l) != SELDP_OK) {
        if (p->out)
            fprintf(p->out, "sweep %s: leaves out %s: %s\n", s->name, what, hx_last_error());
        return true;
    }
    /* the frameworks preset compares frameworks with each other: only one framework's own
     * orders can repeat a layout */
    for (int i = 0; i < s->n; i++) {
        bool same_framework =
            (!c->framework && !p->frameworks[i]) ||
            (c->framework && p->frameworks[i] && strcmp(c->framework, p->frameworks[i]) == 0);
        if (same_framework && same_layout(p->kept[i], l)) {
            if (p->out)
                fprintf(p->out, "sweep %s: leaves out %s: the same groups as run %d\n", s->name,
                        what, i + 1);
            hx_layout_destroy(l);
            return true;
        }
    }
    if (s->n == p->cap) {
        int cap = p->cap ? 2 * p->cap : 16;
        hx_sweep_entry *entries = realloc(s->entries, (size_t)cap * sizeof *entries);
        hx_layout **kept = realloc(p->kept, (size_t)cap * sizeof *kept);
        const char **frameworks = realloc(p->frameworks, (size_t)cap * sizeof *frameworks);
        if (entries)
            s->entries = entries;
        if (kept)
            p->kept = kept;
        if (frameworks)
            p->frameworks = frameworks;
        if (!entries || !kept || !frameworks) {
            hx_layout_destroy(l);
            return false;
        }
        p->cap = cap;
    }
    hx_sweep_entry *e = &s->entries[s->n];
    memset(e, 0, sizeof *e);
    p->frameworks[s->n] = c->framework;
    p->kept[s->n++] = l;
    char v[16];
    bool ok = true;
    if (c->world_arg || c->world != p->base->world) {
        snprintf(v, sizeof v, "%d", c->world);
        ok = ok && entry_add(e, "world", v);
    }
    snprintf(v, sizeof v, "%d", c->ep);
    ok = ok && entry_add(e, "ep", v);
    if (c->framework)
        ok = ok && entry_add(e, "framework", c->framework);
    if (c->order)
        ok = ok && entry_add(e, "order", c->order);
    return ok;
}

/* The ep preset's orders on the command line's grid. */
static int ep_orders(const hx_options *base, const char *orders[2])
{
    if (!base->grid_given) {
        orders[0] = "ep-dp";
        orders[1] = "dp-ep";
        return 2;
    }
    switch (base->grid.framework) {
    case SELDP_FRAMEWORK_MEGATRON:
    case SELDP_FRAMEWORK_MEGATRON_0_9:
        orders[0] = "tp-cp-ep-dp-pp";
        orders[1] = "tp-cp-dp-ep-pp";
        return 2;
    case SELDP_FRAMEWORK_DEEPSPEED:
        orders[0] = "ep-dp";
        orders[1] = "dp-ep";
        return 2;
    default:
        orders[0] = NULL; /* torchtitan: its mesh */
        return 1;
    }
}

static bool build_preset(preset *p, bool *is_preset)
{
    hx_sweep *s = p->s;
    const hx_options *base = p->base;
    *is_preset = true;
    if (strcmp(s->name, "frameworks") == 0) {
        for (size_t i = 0; i < N_FRAMEWORK_RUNS; i++) {
            candidate c = {base->world, base->ep, false, framework_runs[i].framework,
                           framework_runs[i].order};
            if (!propose(p, &c))
                return false;
        }
        return true;
    }
    if (strcmp(s->name, "ep") == 0) {
        const char *orders[2];
        int n_orders = ep_orders(base, orders);
        for (int ep = 1; ep <= base->world; ep++) {
            for (int o = 0; o < n_orders; o++) {
                candidate c = {base->world, ep, false, NULL, orders[o]};
                if (!propose(p, &c))
                    return false;
            }
        }
        return true;
    }
    static const int worlds[] = {1, 2, 4, 8, 16, 32};
    int n_worlds = strcmp(s->name, "worlds") == 0 ? 4 : strcmp(s->name, "worlds-32") == 0 ? 6 : 0;
    if (n_worlds == 0) {
        *is_preset = false;
        return true;
    }
    for (int i = 0; i < n_worlds; i++) {
        /* the largest ep up to --ep that this world and the grid take */
        int before = s->n;
        for (int ep = base->ep; ep >= 1 && s->n == before; ep = ep > 1 ? ep / 2 : 0) {
            if (worlds[i] % ep != 0 || base->model.experts % ep != 0)
                continue;
            candidate c = {worlds[i], ep, true, NULL, NULL};
            FILE *quiet = p->out;
            p->out = ep > 1 ? NULL : quiet; /* only the last try says why */
            bool ok = propose(p, &c);
            p->out = quiet;
            if (!ok)
                return false;
        }
    }
    return true;
}

bool hx_sweep_entries(hx_sweep *s, const hx_options *base, FILE *out, FILE *err)
{
    preset p = {.s = s, .base = base, .out = out};
    bool is_preset = false, ok = build_preset(&p, &is_preset);
    for (int i = 0; i < s->n && is_preset; i++)
        hx_layout_destroy(p.kept[i]);
    free(p.kept);
    free(p.frameworks);
    if (!ok) {
        fprintf(err, "seldp-harness: out of memory\n");
        return false;
    }
    if (is_preset && s->n == 0) {
        fprintf(err,
                "seldp-harness: --sweep %s: no layout of the preset fits world %d, %d experts "
                "and the command line's grid (tp %d, pp %d, cp %d)\n",
                s->name, base->world, base->model.experts, base->grid.tp, base->grid.pp,
                base->grid.cp);
        return false;
    }
    return is_preset || entries_from_file(s, err);
}
