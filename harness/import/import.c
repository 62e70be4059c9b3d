/* The imports' shared part (see import.h): settings and their conflicts, the sizes the derived
 * settings need, the argument vector and the lines printed. */
#include "import.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "options_impl.h"
#include "util.h"

static const char *const kind_names[HX_IMPORT_KINDS] = {"megatron", "torchtitan", "deepspeed"};

const char *hx_import_name(hx_import_kind kind)
{
    return (unsigned)kind < HX_IMPORT_KINDS ? kind_names[kind] : "invalid";
}

static int option_row(const char *option)
{
    const hx_opt_row *row = hx_opt_find(&hx_options_table, option, false);
    return row ? (int)(row - hx_option_docs) : -1;
}

bool hx_import_given(const hx_import *imp, const char *option)
{
    int row = option_row(option);
    return row >= 0 && imp->given && imp->given[row];
}

const char *hx_import_value(const hx_import *imp, const char *option)
{
    for (size_t i = 0; i < imp->n; i++)
        if (strcmp(imp->settings[i].arg + 2, option) == 0)
            return imp->settings[i].value;
    return NULL;
}

bool hx_import_line(hx_import *imp, hx_import_kind from, const char *fmt, ...)
{
    if (imp->n_lines == imp->cap_lines) {
        size_t cap = imp->cap_lines ? 2 * imp->cap_lines : 16;
        char **grown = realloc(imp->lines, cap * sizeof *grown);
        if (!grown)
            return false;
        imp->lines = grown;
        imp->cap_lines = cap;
    }
    hx_buf b = {0};
    hx_buf_printf(&b, "import (%s): ", hx_import_name(from));
    va_list ap;
    va_start(ap, fmt);
    hx_buf_vprintf(&b, fmt, ap);
    va_end(ap);
    if (!hx_buf_ok(&b)) {
        hx_buf_free(&b);
        return false;
    }
    imp->lines[imp->n_lines++] = b.data;
    return true;
}

seldp_status hx_import_set(hx_import *imp, hx_import_kind from, const char *option,
                           const char *value, bool fallback, const char *source_fmt, ...)
{
    char source[200];
    va_list ap;
    va_start(ap, source_fmt);
    vsnprintf(source, sizeof source, source_fmt, ap);
    va_end(ap);
    if (option_row(option) < 0) {
        /* recognised, but this harness has no such option (yet) */
        if (!hx_import_line(imp, from,
                            "recognised, not applied: %s (--%s%s%s: this harness has "
                            "no --%s option)",
                            source, option, value[0] ? " " : "", value, option))
            return hx_fail(SELDP_ERR_NOMEM, "out of memory");
        return SELDP_OK;
    }
    for (size_t i = 0; i < imp->n; i++) {
        hx_import_setting *s = &imp->settings[i];
        if (strcmp(s->arg + 2, option) != 0)
            continue;
        if (strcmp(s->value, value) == 0) {
            if (s->fallback && !fallback) {
                s->fallback = false;
                s->from = from;
                snprintf(s->source, sizeof s->source, "%s", source);
            }
            return SELDP_OK;
        }
        if (fallback)
            return SELDP_OK; /* a default yields to what a config writes */
        if (!s->fallback)
            return hx_fail(SELDP_ERR_INVALID_ARGUMENT,
                           "--from-%s %s and --from-%s %s contradict each other (--%s %s against "
                           "--%s %s)",
                           hx_import_name(s->from), s->source, hx_import_name(from), source, option,
                           s->value[0] ? s->value : "(set)", option, value[0] ? value : "(set)");
        snprintf(s->value, sizeof s->value, "%s", value);
        snprintf(s->source, sizeof s->source, "%s", source);
        s->from = from;
        s->fallback = false;
        return SELDP_OK;
    }
    if (imp->n == imp->cap) {
        size_t cap = imp->cap ? 2 * imp->cap : 16;
        hx_import_setting *grown = realloc(imp->settings, cap * sizeof *grown);
        if (!grown)
            return hx_fail(SELDP_ERR_NOMEM, "out of memory");
        imp->settings = grown;
        imp->cap = cap;
    }
    hx_import_setting *s = &imp->settings[imp->n++];
    memset(s, 0, sizeof *s);
    snprintf(s->arg, sizeof s->arg, "--%s", option);
    snprintf(s->value, sizeof s->value, "%s", value);
    snprintf(s->source, sizeof s->source, "%s", source);
    s->from = from;
    s->fallback = fallback;
    return SELDP_OK;
}

static int resolved(const hx_import *imp, const char *option, int cmdline_value)
{
    if (hx_import_given(imp, option))
        return cmdline_value;
    const char *v = hx_import_value(imp, option);
    return v ? (int)strtol(v, NULL, 10) : cmdline_value;
}

hx_import_sizes hx_import_resolve(const hx_import *imp)
{
    const hx_options *o = imp->cmdline;
    hx_import_sizes s = {0};
    s.world = resolved(imp, "world", o->world);
    s.world_known = hx_import_given(imp, "world") || hx_import_value(imp, "world");
    s.tp = resolved(imp, "tp", o->grid.tp);
    s.pp = resolved(imp, "pp", o->grid.pp);
    s.cp = resolved(imp, "cp", o->grid.cp);
    s.ep = resolved(imp, "ep", o->ep);
    s.etp = resolved(imp, "etp", o->grid.etp);
    s.experts = resolved(imp, "experts", o->model.experts);
    s.d_ff = resolved(imp, "d-ff", o->model.d_ff);
    if (s.etp == 0) { /* the framework's default: Megatron's tp, the others' 1 */
        seldp_framework f = o->grid.framework;
        const char *name = hx_import_value(imp, "framework");
        if (!hx_import_given(imp, "framework") && name)
            seldp_framework_parse(name, &f);
        s.etp = f == SELDP_FRAMEWORK_MEGATRON || f == SELDP_FRAMEWORK_MEGATRON_0_9 ? s.tp : 1;
    }
    return s;
}

static long gcd(long a, long b)
{
    while (b) {
        long t = a % b;
        a = b;
        b = t;
    }
    return a;
}

/* The default experts must divide over the imported ep: the smallest multiple of both. */
static seldp_status fit_experts(hx_import *imp, const hx_import_sizes *s)
{
    if (hx_import_given(imp, "experts") || hx_import_value(imp, "experts") || s->ep < 1 ||
        s->experts % s->ep == 0)
        return SELDP_OK;
    long experts = (long)s->experts / gcd(s->experts, s->ep) * s->ep;
    char v[32];
    snprintf(v, sizeof v, "%ld", experts);
    hx_import_kind from = HX_IMPORT_MEGATRON;
    for (size_t i = 0; i < imp->n; i++)
        if (strcmp(imp->settings[i].arg, "--ep") == 0)
            from = imp->settings[i].from;
    seldp_status st = hx_import_set(imp, from, "experts", v, true,
                                    "(the config gives no expert count: the harness's %d "
                                    "experts do not divide over ep %d)",
                                    s->experts, s->ep);
    if (st == SELDP_OK && !hx_import_line(imp, from,
                                          "--experts %s: the smallest multiple of the default "
                                          "%d experts and ep %d (give --experts to choose)",
                                          v, s->experts, s->ep))
        st = hx_fail(SELDP_ERR_NOMEM, "out of memory");
    return st;
}

static seldp_status read_file(const char *option, const char *path, char **text, size_t *len)
{
    seldp_status st = hx_read_file(path, text, len);
    if (st != SELDP_OK) {
        char why[512];
        snprintf(why, sizeof why, "%s", hx_last_error());
        return hx_fail(SELDP_ERR_INVALID_ARGUMENT, "--from-%s %s", option, why);
    }
    return SELDP_OK;
}

seldp_status hx_import_read(const char *const sources[HX_IMPORT_KINDS], const hx_options *cmdline,
                            const bool *given, hx_import *imp)
{
    seldp_status st = SELDP_OK;
    char *text = NULL;
    size_t len = 0;
    imp->cmdline = cmdline;
    imp->given = given;
    if (sources[HX_IMPORT_TORCHTITAN] &&
        (sources[HX_IMPORT_MEGATRON] || sources[HX_IMPORT_DEEPSPEED]))
        return hx_fail(SELDP_ERR_INVALID_ARGUMENT,
                       "--from-torchtitan and --from-%s exclude each other: a torchtitan run has "
                       "no Megatron command line or ds_config",
                       sources[HX_IMPORT_MEGATRON] ? "megatron" : "deepspeed");
    if (sources[HX_IMPORT_MEGATRON])
        HX_CHECK(hx_import_megatron(sources[HX_IMPORT_MEGATRON], imp));
    if (sources[HX_IMPORT_TORCHTITAN]) {
        HX_CHECK(read_file("torchtitan", sources[HX_IMPORT_TORCHTITAN], &text, &len));
        HX_CHECK(hx_import_torchtitan(text, len, sources[HX_IMPORT_TORCHTITAN], imp));
        free(text);
        text = NULL;
    }
    if (sources[HX_IMPORT_DEEPSPEED]) {
        HX_CHECK(read_file("deepspeed", sources[HX_IMPORT_DEEPSPEED], &text, &len));
        HX_CHECK(hx_import_deepspeed(text, len, sources[HX_IMPORT_DEEPSPEED], imp));
    }
    hx_import_sizes sizes = hx_import_resolve(imp);
    HX_CHECK(fit_experts(imp, &sizes));
    sizes = hx_import_resolve(imp);
    if (sources[HX_IMPORT_MEGATRON])
        HX_CHECK(hx_import_megatron_finish(imp, &sizes));
    if (sources[HX_IMPORT_TORCHTITAN])
        HX_CHECK(hx_import_torchtitan_finish(imp, &sizes));
    if (sources[HX_IMPORT_DEEPSPEED])
        HX_CHECK(hx_import_deepspeed_finish(imp, &sizes));
fail:
    free(text);
    return st;
}

bool hx_import_applies(const hx_import *imp, const hx_import_setting *s)
{
    static const char *const layout[] = {"world", "ep", "order", "framework",
                                         "tp",    "pp", "cp",    "etp"};
    if (hx_import_given(imp, s->arg + 2))
        return false;
    for (size_t i = 0; i < sizeof layout / sizeof layout[0]; i++)
        if (strcmp(s->arg + 2, layout[i]) == 0 && hx_import_given(imp, "layout-file"))
            return false;
    return true;
}

void hx_import_print(const hx_import *imp, FILE *out)
{
    for (int k = 0; k < HX_IMPORT_KINDS; k++) {
        hx_buf sets = {0}, overridden = {0};
        for (size_t i = 0; i < imp->n; i++) {
            const hx_import_setting *s = &imp->settings[i];
            if (s->from != (hx_import_kind)k)
                continue;
            hx_buf *b = hx_import_applies(imp, s) ? &sets : &overridden;
            hx_buf_printf(b, " %s%s%s", s->arg, s->value[0] ? " " : "", s->value);
        }
        if (sets.len)
            fprintf(out, "import (%s): sets%s (explicit options override)\n", kind_names[k],
                    hx_buf_str(&sets));
        if (overridden.len)
            fprintf(out, "import (%s): the command line overrides%s\n", kind_names[k],
                    hx_buf_str(&overridden));
        hx_buf_free(&sets);
        hx_buf_free(&overridden);
    }
    for (size_t i = 0; i < imp->n_lines; i++)
        fprintf(out, "%s\n", imp->lines[i]);
}

void hx_import_free(hx_import *imp)
{
    free(imp->settings);
    for (size_t i = 0; i < imp->n_lines; i++)
        free(imp->lines[i]);
    free(imp->lines);
    *imp = (hx_import){0};
}

void hx_import_leaf_text(const hx_json *v, char *buf, size_t size)
{
    switch (v->type) {
    case HX_JSON_NULL:
        snprintf(buf, size, "null");
        break;
    case HX_JSON_BOOL:
        snprintf(buf, size, "%s", v->boolean ? "true" : "false");
        break;
    case HX_JSON_NUMBER:
        if (v->is_integer)
            snprintf(buf, size, "%lld", (long long)v->integer);
        else
            snprintf(buf, size, "%.17g", v->number);
        break;
    case HX_JSON_STRING: {
        char shown[256];
        snprintf(buf, size, "\"%s\"", hx_printable(v->string, shown, sizeof shown));
        break;
    }
    case HX_JSON_ARRAY:
        snprintf(buf, size, "[%zu values]", v->count);
        break;
    case HX_JSON_OBJECT:
        snprintf(buf, size, "{%zu keys}", v->count);
        break;
    }
}
