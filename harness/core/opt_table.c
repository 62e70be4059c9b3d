/* The machinery of the option tables (opt_table.h): values parsed and stored through a row,
 * the defaults, the getopt_long loop, and --help's lines. */
#define _POSIX_C_SOURCE 200809L

#include "opt_table.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static void *field(const hx_opt_row *r, void *base)
{
    return (char *)base + r->offset;
}

static const void *cfield(const hx_opt_row *r, const void *base)
{
    return (const char *)base + r->offset;
}

/* An integer field: int, or size_t where the field has 8 bytes (--bucket-bytes). */
static void store_int(const hx_opt_row *r, void *base, long long v)
{
    if (r->size == sizeof(int)) {
        int x = (int)v;
        memcpy(field(r, base), &x, sizeof x);
    } else {
        size_t x = (size_t)v;
        memcpy(field(r, base), &x, sizeof x);
    }
}

static long long load_int(const hx_opt_row *r, const void *base)
{
    if (r->size == sizeof(int)) {
        int x;
        memcpy(&x, cfield(r, base), sizeof x);
        return x;
    }
    size_t x;
    memcpy(&x, cfield(r, base), sizeof x);
    return (long long)x;
}

static void store_double(const hx_opt_row *r, void *base, double v)
{
    memcpy(field(r, base), &v, sizeof v);
}

static void store_string(const hx_opt_row *r, void *base, const char *s)
{
    memcpy(field(r, base), &s, sizeof s);
}

static const char *load_string(const hx_opt_row *r, const void *base)
{
    const char *s;
    memcpy(&s, cfield(r, base), sizeof s);
    return s;
}

static void store_bool(const hx_opt_row *r, void *base, bool v)
{
    memcpy(field(r, base), &v, sizeof v);
}

void hx_opt_defaults(const hx_opt_table *t, void *base)
{
    for (size_t i = 0; i < t->n; i++) {
        const hx_opt_row *r = &t->rows[i];
        hx_opt_kind k = r->kind == HX_OPT_CUSTOM ? r->store : r->kind;
        if (r->kind == HX_OPT_ACTION || (r->kind == HX_OPT_CUSTOM && k == HX_OPT_FLAG))
            continue;
        if (k == HX_OPT_CUSTOM) {
            /* a default only the row's parser can store (a list): its text parsed */
            if (r->def_string)
                (void)r->parse(r, r->def_string, base);
            continue;
        }
        switch (k) {
        case HX_OPT_FLAG:
            store_bool(r, base, r->def != 0);
            break;
        case HX_OPT_INT:
        case HX_OPT_ENUM:
            store_int(r, base, r->def);
            break;
        case HX_OPT_DOUBLE:
            store_double(r, base, r->def_double);
            break;
        case HX_OPT_STRING:
        case HX_OPT_PATH:
            store_string(r, base, r->def_string);
            break;
        case HX_OPT_SEED: {
            uint64_t v = (uint64_t)r->def;
            memcpy(field(r, base), &v, sizeof v);
            break;
        }
        case HX_OPT_SIZE: {
            size_t v = (size_t)r->def;
            memcpy(field(r, base), &v, sizeof v);
            break;
        }
        default:
            break;
        }
    }
}

static bool parse_ll(const char *text, long long min, long long max, long long *out)
{
    char *end = NULL;
    errno = 0;
    long long v = strtoll(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0' || v < min || v > max)
        return false;
    *out = v;
    return true;
}

static bool parse_real(const hx_opt_row *r, const char *text, double *out)
{
    char *end = NULL;
    errno = 0;
    double v = strtod(text, &end);
    if (errno != 0 || end == text || *end != '\0' || !isfinite(v) || v < r->dmin || v > r->dmax ||
        (r->open_min && v == r->dmin) || (r->open_max && v == r->dmax))
        return false;
    *out = v;
    return true;
}

/* "256M" -> 268435456: K, M, G (powers of 1024), an optional B; at most 1e15 bytes. */
bool hx_opt_parse_size(const char *text, size_t *out)
{
    char *end = NULL;
    double v = strtod(text, &end);
    if (end == text || !(v >= 0))
        return false;
    double scale = 1;
    switch (*end) {
    case 'k':
    case 'K':
        scale = 1024.0;
        end++;
        break;
    case 'm':
    case 'M':
        scale = 1024.0 * 1024.0;
        end++;
        break;
    case 'g':
    case 'G':
        scale = 1024.0 * 1024.0 * 1024.0;
        end++;
        break;
    default:
        break;
    }
    if (*end == 'b' || *end == 'B')
        end++;
    if (*end != '\0' || v * scale > 1e15)
        return false;
    *out = (size_t)(v * scale);
    return true;
}

/* arg into the row's field; false when it is not a value of the row. */
static bool store_value(const hx_opt_row *r, const char *arg, void *base)
{
    switch (r->kind) {
    case HX_OPT_FLAG:
        store_bool(r, base, r->def == 0);
        return true;
    case HX_OPT_INT: {
        long long v = 0;
        if (!parse_ll(arg, r->min, r->max, &v))
            return false;
        store_int(r, base, v);
        return true;
    }
    case HX_OPT_DOUBLE: {
        double v = 0;
        if (!parse_real(r, arg, &v))
            return false;
        store_double(r, base, v);
        return true;
    }
    case HX_OPT_ENUM:
        for (const hx_opt_name *n = r->names; n && n->name; n++) {
            if (strcasecmp(arg, n->name) == 0) {
                store_int(r, base, n->value);
                return true;
            }
        }
        return false;
    case HX_OPT_STRING:
        store_string(r, base, arg);
        return true;
    case HX_OPT_PATH:
        store_string(r, base, arg);
        return arg[0] != '\0';
    case HX_OPT_SEED: {
        char *end = NULL;
        errno = 0;
        if (arg[0] == '-')
            return false;
        unsigned long long v = strtoull(arg, &end, 0);
        if (errno != 0 || end == arg || *end != '\0')
            return false;
        uint64_t x = v;
        memcpy(field(r, base), &x, sizeof x);
        return true;
    }
    case HX_OPT_SIZE: {
        size_t v = 0;
        if (!hx_opt_parse_size(arg, &v) ||
            (r->max > r->min && ((long long)v < r->min || (long long)v > r->max)))
            return false;
        memcpy(field(r, base), &v, sizeof v);
        return true;
    }
    case HX_OPT_CUSTOM:
        return r->parse(r, arg, base);
    case HX_OPT_ACTION:
        return true;
    }
    return false;
}

static void mark(const hx_opt_row *r, void *base)
{
    for (int k = 0; k < 2; k++) {
        if (r->mark[k]) {
            bool yes = true;
            memcpy((char *)base + r->mark[k] - 1, &yes, sizeof yes);
        }
    }
}

void hx_opt_expect(const hx_opt_row *r, char *buf, size_t size)
{
    if (r->expect || r->expect_fn) {
        snprintf(buf, size, "%s", r->expect_fn ? r->expect_fn() : r->expect);
        return;
    }
    switch (r->kind) {
    case HX_OPT_INT:
        snprintf(buf, size, "an integer in %lld..%lld", r->min, r->max);
        break;
    case HX_OPT_DOUBLE:
        snprintf(buf, size, "a number in %c%g, %g%c", r->open_min ? '(' : '[', r->dmin, r->dmax,
                 r->open_max ? ')' : ']');
        break;
    case HX_OPT_ENUM: {
        size_t at = 0, n = 0;
        buf[0] = '\0';
        while (r->names && r->names[n].name)
            n++;
        for (size_t i = 0; i < n && at < size; i++)
            at += (size_t)snprintf(buf + at, size - at, "%s%s",
                                   i == 0       ? ""
                                   : i + 1 == n ? " or "
                                                : ", ",
                                   r->names[i].name);
        break;
    }
    case HX_OPT_PATH:
        snprintf(buf, size, "a file name");
        break;
    case HX_OPT_SEED:
        snprintf(buf, size, "an unsigned 64-bit integer");
        break;
    case HX_OPT_SIZE:
        snprintf(buf, size, "a size such as 8, 64K or 256M");
        break;
    default:
        snprintf(buf, size, "a value");
    }
}

/* `text` as a message shows it: control bytes escaped (\n, \t, \xNN), so that a refusal stays
 * one line whatever a sweep file or an import put in a value, and cut at `size`. */
static const char *shown(const char *text, char *buf, size_t size)
{
    size_t n = 0;
    for (const unsigned char *p = (const unsigned char *)text; *p && n + 5 < size; p++) {
        if (*p == '\n')
            n += (size_t)snprintf(buf + n, size - n, "\\n");
        else if (*p == '\t')
            n += (size_t)snprintf(buf + n, size - n, "\\t");
        else if (*p < 0x20 || *p == 0x7f)
            n += (size_t)snprintf(buf + n, size - n, "\\x%02x", *p);
        else
            buf[n++] = (char)*p;
    }
    buf[n < size ? n : size - 1] = '\0';
    return buf;
}

bool hx_opt_parse_value(const hx_opt_row *r, const char *arg, void *base, char *msg, size_t size)
{
    if (store_value(r, arg, base)) {
        mark(r, base);
        return true;
    }
    char expect[512];
    hx_opt_expect(r, expect, sizeof expect);
    char value[256];
    snprintf(msg, size, "--%s '%s': expected %s", r->opt.name, shown(arg, value, sizeof value),
             expect);
    return false;
}

const hx_opt_row *hx_opt_find(const hx_opt_table *t, const char *name, bool alias)
{
    for (size_t i = 0; i < t->n; i++) {
        const hx_opt_row *r = &t->rows[i];
        if (strcmp(r->opt.name, name) == 0 ||
            (alias && r->sweep_alias && strcmp(r->sweep_alias, name) == 0))
            return r;
    }
    return NULL;
}

hx_opt_result hx_opt_parse(const hx_opt_table *t, int argc, char **argv, void *base, bool *given,
                           const hx_opt_row **action, FILE *err)
{
    struct option longopts[HX_OPT_ROWS_MAX + 1];
    char shorts[2 * HX_OPT_ROWS_MAX + 2] = ":";
    size_t ns = 1;
    for (size_t i = 0; i < t->n && i < HX_OPT_ROWS_MAX; i++) {
        longopts[i] = t->rows[i].opt;
        int c = t->rows[i].opt.val;
        if (c > 0 && c < 128) {
            shorts[ns++] = (char)c;
            if (t->rows[i].opt.has_arg == required_argument)
                shorts[ns++] = ':';
        }
    }
    shorts[ns] = '\0';
    longopts[t->n < HX_OPT_ROWS_MAX ? t->n : HX_OPT_ROWS_MAX] = (struct option){0};
    char word[256]; /* an argument as a message shows it */
    optind = 0;     /* glibc: 0 re-initializes getopt, so the parser may run more than once */
    opterr = 0;
    for (;;) {
        int prev = optind ? optind : 1;
        int c = getopt_long(argc, argv, shorts, longopts, NULL);
        if (c == -1)
            break;
        if (c == ':') {
            fprintf(err, "%s: option '%s' needs a value (see --help)\n", t->prog,
                    shown(argv[prev], word, sizeof word));
            return HX_OPT_BAD;
        }
        size_t i = 0;
        while (i < t->n && t->rows[i].opt.val != c)
            i++;
        if (c == '?' || i == t->n) {
            fprintf(err, "%s: unknown option '%s' (see --help)\n", t->prog,
                    shown(argv[prev], word, sizeof word));
            return HX_OPT_BAD;
        }
        const hx_opt_row *r = &t->rows[i];
        if (given)
            given[i] = true;
        if (r->kind == HX_OPT_ACTION) {
            *action = r;
            return HX_OPT_DONE;
        }
        const char *arg = optarg ? optarg : "";
        if (!store_value(r, arg, base)) {
            char expect[512];
            hx_opt_expect(r, expect, sizeof expect);
            /* the option as typed: a short letter, or the long name */
            bool typed_short = argv[prev][0] == '-' && argv[prev][1] != '-';
            if (typed_short)
                fprintf(err, "%s: -%c '%s': expected %s\n", t->prog, c,
                        shown(arg, word, sizeof word), expect);
            else
                fprintf(err, "%s: --%s '%s': expected %s\n", t->prog, r->opt.name,
                        shown(arg, word, sizeof word), expect);
            return HX_OPT_BAD;
        }
        mark(r, base);
    }
    if (optind < argc) {
        fprintf(err, "%s: unexpected argument '%s' (options start with --; see --help)\n", t->prog,
                shown(argv[optind], word, sizeof word));
        return HX_OPT_BAD;
    }
    return HX_OPT_OK;
}

const char *hx_opt_enum_name(const hx_opt_row *r, int value)
{
    for (const hx_opt_name *n = r->names; n && n->name; n++)
        if (n->value == value)
            return n->name;
    return NULL;
}

void hx_opt_value_text(const hx_opt_row *r, const void *base, char *buf, size_t size)
{
    if (r->value) {
        r->value(r, base, buf, size);
        return;
    }
    hx_opt_kind k = r->kind == HX_OPT_CUSTOM ? r->store : r->kind;
    buf[0] = '\0';
    switch (k) {
    case HX_OPT_FLAG: {
        bool v;
        memcpy(&v, cfield(r, base), sizeof v);
        snprintf(buf, size, "%s", v != (r->def != 0) ? "true" : "false");
        break;
    }
    case HX_OPT_INT:
        snprintf(buf, size, "%lld", load_int(r, base));
        break;
    case HX_OPT_DOUBLE: {
        double v;
        memcpy(&v, cfield(r, base), sizeof v);
        snprintf(buf, size, "%.17g", v);
        break;
    }
    case HX_OPT_ENUM: {
        const char *n = hx_opt_enum_name(r, (int)load_int(r, base));
        snprintf(buf, size, "%s", n ? n : "");
        break;
    }
    case HX_OPT_STRING:
    case HX_OPT_PATH: {
        const char *s = load_string(r, base);
        snprintf(buf, size, "%s", s ? s : "");
        break;
    }
    case HX_OPT_SEED: {
        uint64_t v;
        memcpy(&v, cfield(r, base), sizeof v);
        snprintf(buf, size, "%llu", (unsigned long long)v);
        break;
    }
    case HX_OPT_SIZE: {
        size_t v;
        memcpy(&v, cfield(r, base), sizeof v);
        snprintf(buf, size, "%zu", v);
        break;
    }
    default:
        break;
    }
}

/* 1048576 -> "1M": the largest power of 1024 that divides it. */
static void size_text(long long v, char *buf, size_t size)
{
    static const char units[] = {'G', 'M', 'K'};
    for (int u = 0; u < 3; u++) {
        long long unit = 1LL << (10 * (3 - u));
        if (v >= unit && v % unit == 0) {
            snprintf(buf, size, "%lld%c", v / unit, units[u]);
            return;
        }
    }
    snprintf(buf, size, "%lld", v);
}

void hx_opt_default_text(const hx_opt_row *r, char *buf, size_t size)
{
    if (r->show) {
        r->show(r, NULL, buf, size);
        return;
    }
    hx_opt_kind k = r->kind == HX_OPT_CUSTOM ? r->store : r->kind;
    buf[0] = '\0';
    if (r->kind == HX_OPT_ACTION)
        return;
    switch (k) {
    case HX_OPT_FLAG:
        snprintf(buf, size, r->kind == HX_OPT_FLAG ? "off" : "none");
        break;
    case HX_OPT_INT:
    case HX_OPT_SEED:
        snprintf(buf, size, k == HX_OPT_SEED ? "%llu" : "%lld", r->def);
        break;
    case HX_OPT_DOUBLE:
        snprintf(buf, size, "%g", r->def_double);
        break;
    case HX_OPT_ENUM: {
        const char *n = hx_opt_enum_name(r, (int)r->def);
        snprintf(buf, size, "%s", n ? n : "none");
        break;
    }
    case HX_OPT_STRING:
    case HX_OPT_PATH:
        snprintf(buf, size, "%s", r->def_string ? r->def_string : "none");
        break;
    case HX_OPT_SIZE:
        size_text(r->def, buf, size);
        break;
    case HX_OPT_CUSTOM:
        snprintf(buf, size, "%s", r->def_string ? r->def_string : "none");
        break;
    default:
        break;
    }
}

/* Print `text` from column `indent`, wrapped at 100 columns; the first line continues what is
 * already printed up to column `at`. \x01 is a space the wrapping keeps. */
static void print_wrapped(FILE *out, const char *text, int at, int indent)
{
    int col = at;
    while (*text) {
        const char *space = strchr(text, ' ');
        int word = space ? (int)(space - text) : (int)strlen(text);
        if (col > indent && col + 1 + word > 100) {
            fprintf(out, "\n%*s", indent, "");
            col = indent;
        } else if (col > indent) {
            fputc(' ', out);
            col++;
        } else {
            while (col < indent) {
                fputc(' ', out);
                col++;
            }
        }
        for (int i = 0; i < word; i++)
            fputc(text[i] == '\x01' ? ' ' : text[i], out);
        col += word;
        text += word;
        while (*text == ' ')
            text++;
    }
    fputc('\n', out);
}

void hx_opt_print_row(const hx_opt_row *r, FILE *out, bool shorts, bool show_default)
{
    char left[96], def[256], text[1536];
    const char *mv = r->metavar;
    if (shorts && r->opt.val > 0 && r->opt.val < 128)
        snprintf(left, sizeof left, "-%c, --%s%s%s", r->opt.val, r->opt.name, mv ? " " : "",
                 mv ? mv : "");
    else
        snprintf(left, sizeof left, "%s--%s%s%s", shorts ? "    " : "", r->opt.name, mv ? " " : "",
                 mv ? mv : "");
    def[0] = '\0';
    if (show_default)
        hx_opt_default_text(r, def, sizeof def);
    if (def[0])
        /* "[default: X]" stays on one line */
        snprintf(text, sizeof text, "%s [default:\x01%s]", r->help, def);
    else
        snprintf(text, sizeof text, "%s", r->help);
    int at = fprintf(out, "  %-30s", left);
    print_wrapped(out, text, at, 33);
}

void hx_opt_print_help(const hx_opt_table *t, FILE *out)
{
    for (int sec = 0; sec < t->n_sections; sec++) {
        fprintf(out, "%s%s:\n", sec ? "\n" : "", t->section_titles[sec]);
        for (size_t i = 0; i < t->n; i++)
            if (t->rows[i].section == sec)
                hx_opt_print_row(&t->rows[i], out, false, t->rows[i].kind != HX_OPT_ACTION);
    }
}
