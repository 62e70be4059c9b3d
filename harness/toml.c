/* The strict TOML reader (see toml.h). The text is read into a flat list of entries (a key's
 * full path and its value, or a table header), the list is checked against TOML's rules on
 * redefinition, and only then is the tree built, so that no rule depends on the order in
 * which the tree happened to grow. */
#include "toml.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

#define TOML_MAX_DEPTH 32 /* arrays and inline tables inside each other */
#define TOML_MAX_PATH  32 /* parts of one dotted key or header */

typedef struct toml_path {
    int n;
    char *parts[TOML_MAX_PATH];
} toml_path;

typedef struct toml_entry {
    toml_path path; /* the table's path + the key's parts */
    bool header;    /* a [table] header (value unused) */
    int table_len;  /* a key: how many parts of path are the table it was written in */
    hx_json value;  /* a key's value, owned until the tree takes it */
    int line, column;
} toml_entry;

typedef struct reader {
    const char *text;
    size_t len, pos;
    int line;
    size_t line_start;
    const char *what;
    toml_entry *entries;
    size_t n, cap;
} reader;

HX_PRINTF(3, 4) static seldp_status fail_at(const reader *r, size_t pos, const char *fmt, ...)
{
    char why[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    return hx_fail(SELDP_ERR_PARSE, "%s:%d:%d: %s", r->what, r->line,
                   (int)(pos - r->line_start) + 1, why);
}

HX_PRINTF(3, 4)
static seldp_status fail_entry(const reader *r, const toml_entry *e, const char *fmt, ...)
{
    char why[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    return hx_fail(SELDP_ERR_PARSE, "%s:%d:%d: %s", r->what, e->line, e->column, why);
}

static int peek(const reader *r)
{
    return r->pos < r->len ? (unsigned char)r->text[r->pos] : -1;
}

static void path_free(toml_path *p)
{
    for (int i = 0; i < p->n; i++)
        free(p->parts[i]);
    p->n = 0;
}

static void value_free(hx_json *v)
{
    for (size_t i = 0; i < v->count; i++) {
        value_free(&v->items[i]);
        if (v->keys)
            free(v->keys[i]);
    }
    free(v->items);
    free(v->keys);
    free(v->string);
    memset(v, 0, sizeof *v);
}

/* "a.b.c" for messages (quoted parts are shown bare). */
static void path_text(const toml_path *p, int n, char *buf, size_t size)
{
    size_t at = 0;
    buf[0] = '\0';
    for (int i = 0; i < n && at < size; i++)
        at += (size_t)snprintf(buf + at, size - at, "%s%s", i ? "." : "", p->parts[i]);
}

/* ---- lexical pieces ---------------------------------------------------------------------- */

static void skip_blank(reader *r)
{
    while (peek(r) == ' ' || peek(r) == '\t')
        r->pos++;
}

/* A comment to the end of the line: tabs and printable characters, valid UTF-8. */
static seldp_status skip_comment(reader *r)
{
    if (peek(r) != '#')
        return SELDP_OK;
    while (r->pos < r->len && r->text[r->pos] != '\n') {
        unsigned char c = (unsigned char)r->text[r->pos];
        if (c == '\r' && r->pos + 1 < r->len && r->text[r->pos + 1] == '\n')
            break;
        if ((c < 0x20 && c != '\t') || c == 0x7f)
            return fail_at(r, r->pos, "control character 0x%02x in a comment", c);
        size_t n = hx_utf8_length((const unsigned char *)r->text + r->pos, r->len - r->pos);
        if (n == 0)
            return fail_at(r, r->pos, "invalid UTF-8 in a comment");
        r->pos += n;
    }
    return SELDP_OK;
}

/* A newline (LF or CRLF); false when there is none here. */
static bool take_newline(reader *r)
{
    if (peek(r) == '\n') {
        r->pos++;
    } else if (peek(r) == '\r' && r->pos + 1 < r->len && r->text[r->pos + 1] == '\n') {
        r->pos += 2;
    } else {
        return false;
    }
    r->line++;
    r->line_start = r->pos;
    return true;
}

/* Blanks, comments and newlines (between the values of an array). */
static seldp_status skip_space_lines(reader *r)
{
    for (;;) {
        skip_blank(r);
        seldp_status st = skip_comment(r);
        if (st != SELDP_OK)
            return st;
        if (!take_newline(r))
            return SELDP_OK;
    }
}

/* After a value or a header: blanks, a comment, then the end of the line or of the text. */
static seldp_status end_of_line(reader *r)
{
    skip_blank(r);
    seldp_status st = skip_comment(r);
    if (st != SELDP_OK)
        return st;
    if (r->pos >= r->len || take_newline(r))
        return SELDP_OK;
    return fail_at(r, r->pos, "expected the end of the line after the value");
}

static int hex_digit(int c)
{
    return c >= '0' && c <= '9'   ? c - '0'
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                  : -1;
}

/* A basic ("...") or literal ('...') string on one line into *out (malloc'd). */
static seldp_status read_string(reader *r, char **out)
{
    seldp_status st = SELDP_OK;
    hx_buf b = {0};
    char quote = r->text[r->pos];
    size_t start = r->pos;
    if (r->len - r->pos >= 3 && r->text[r->pos + 1] == quote && r->text[r->pos + 2] == quote)
        return fail_at(r, r->pos,
                       "multi-line strings are outside the TOML subset this reader "
                       "takes; write the string on one line");
    r->pos++;
    hx_buf_append(&b, "", 0);
    for (;;) {
        int c = peek(r);
        if (c < 0 || c == '\n' || c == '\r')
            HX_CHECK(fail_at(r, start, "unterminated string"));
        if (c == quote) {
            r->pos++;
            break;
        }
        if ((c < 0x20 && c != '\t') || c == 0x7f)
            HX_CHECK(fail_at(r, r->pos, "control character 0x%02x in a string", (unsigned)c));
        if (c == '\\' && quote == '"') {
            r->pos++;
            int e = peek(r);
            const char *simple = strchr("btnfr\"\\", e > 0 ? e : 'x');
            if (e > 0 && simple) {
                static const char map[] = "\b\t\n\f\r\"\\";
                hx_buf_append(&b, &map[simple - "btnfr\"\\"], 1);
                r->pos++;
                continue;
            }
            if (e != 'u' && e != 'U')
                HX_CHECK(fail_at(r, r->pos - 1, "invalid escape in a string"));
            int digits = e == 'u' ? 4 : 8;
            unsigned cp = 0;
            r->pos++;
            for (int i = 0; i < digits; i++) {
                int h = hex_digit(peek(r));
                if (h < 0)
                    HX_CHECK(fail_at(r, r->pos, "\\%c needs %d hex digits", e, digits));
                cp = cp * 16 + (unsigned)h;
                r->pos++;
            }
            if (cp == 0 || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
                HX_CHECK(fail_at(r, r->pos - (size_t)digits - 2,
                                 "\\%c%0*X is not a character a string may hold", e, digits, cp));
            hx_buf_put_utf8(&b, cp);
            continue;
        }
        size_t n = hx_utf8_length((const unsigned char *)r->text + r->pos, r->len - r->pos);
        if (n == 0)
            HX_CHECK(fail_at(r, r->pos, "invalid UTF-8 in a string"));
        hx_buf_append(&b, r->text + r->pos, n);
        r->pos += n;
    }
    if (!hx_buf_ok(&b))
        HX_FAIL(SELDP_ERR_NOMEM, "%s: out of memory", r->what);
    *out = b.data;
    return SELDP_OK;
fail:
    hx_buf_free(&b);
    return st;
}

static bool bare_key_char(int c)
{
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '-';
}

/* A key: one or more bare or quoted parts joined by dots, appended to *path. */
static seldp_status read_key(reader *r, toml_path *path)
{
    for (;;) {
        skip_blank(r);
        if (path->n >= TOML_MAX_PATH)
            return fail_at(r, r->pos, "a key of more than %d parts", TOML_MAX_PATH);
        int c = peek(r);
        char *part = NULL;
        if (c == '"' || c == '\'') {
            seldp_status st = read_string(r, &part);
            if (st != SELDP_OK)
                return st;
        } else {
            size_t start = r->pos;
            while (bare_key_char(peek(r)))
                r->pos++;
            if (r->pos == start)
                return fail_at(r, start,
                               "expected a key (letters, digits, _ and -, or a quoted "
                               "string)");
            part = malloc(r->pos - start + 1);
            if (!part)
                return hx_fail(SELDP_ERR_NOMEM, "%s: out of memory", r->what);
            memcpy(part, r->text + start, r->pos - start);
            part[r->pos - start] = '\0';
        }
        path->parts[path->n++] = part;
        skip_blank(r);
        if (peek(r) != '.')
            return SELDP_OK;
        r->pos++;
    }
}

/* Digits with single underscores between them (TOML's rule), of base `base`, into buf. */
static bool read_digits(reader *r, int base, char *buf, size_t size, size_t *n)
{
    bool any = false, last_underscore = false;
    while (r->pos < r->len) {
        int c = peek(r);
        if (c == '_') {
            if (!any || last_underscore)
                return false;
            last_underscore = true;
            r->pos++;
            continue;
        }
        int d = hex_digit(c);
        if (d < 0 || d >= base)
            break;
        if (*n + 1 >= size)
            return false;
        buf[(*n)++] = (char)c;
        any = true;
        last_underscore = false;
        r->pos++;
    }
    buf[*n] = '\0';
    return any && !last_underscore;
}

static seldp_status read_number(reader *r, hx_json *v)
{
    size_t start = r->pos;
    char buf[400];
    size_t n = 0;
    v->type = HX_JSON_NUMBER;
    int sign = peek(r);
    if (sign == '+' || sign == '-') {
        buf[n++] = (char)sign;
        r->pos++;
    }
    if (r->len - r->pos >= 3 &&
        (memcmp(r->text + r->pos, "inf", 3) == 0 || memcmp(r->text + r->pos, "nan", 3) == 0)) {
        v->number = r->text[r->pos] == 'i' ? INFINITY : NAN;
        if (sign == '-')
            v->number = -v->number;
        r->pos += 3;
        return SELDP_OK;
    }
    if (peek(r) == '0' && r->pos + 1 < r->len && strchr("xob", r->text[r->pos + 1])) {
        if (n)
            return fail_at(r, start, "a hexadecimal, octal or binary integer takes no sign");
        int base = r->text[r->pos + 1] == 'x' ? 16 : r->text[r->pos + 1] == 'o' ? 8 : 2;
        r->pos += 2;
        if (!read_digits(r, base, buf, sizeof buf, &n))
            return fail_at(r, start, "malformed base-%d integer", base);
        errno = 0;
        unsigned long long x = strtoull(buf, NULL, base);
        if (errno != 0 || x > (unsigned long long)INT64_MAX)
            return fail_at(r, start, "integer out of the 64-bit range");
        v->is_integer = true;
        v->integer = (int64_t)x;
        v->number = (double)x;
        return SELDP_OK;
    }
    size_t int_start = n;
    if (!read_digits(r, 10, buf, sizeof buf, &n))
        return fail_at(r, start, "malformed number");
    if (n - int_start > 1 && buf[int_start] == '0')
        return fail_at(r, start, "a number must not have leading zeros");
    bool is_float = false;
    if (peek(r) == '.') {
        is_float = true;
        buf[n++] = '.';
        r->pos++;
        if (!read_digits(r, 10, buf, sizeof buf, &n))
            return fail_at(r, start, "a decimal point needs digits on both sides");
    }
    if (peek(r) == 'e' || peek(r) == 'E') {
        is_float = true;
        buf[n++] = 'e';
        r->pos++;
        if (peek(r) == '+' || peek(r) == '-')
            buf[n++] = r->text[r->pos++];
        if (!read_digits(r, 10, buf, sizeof buf, &n))
            return fail_at(r, start, "an exponent needs digits");
    }
    if (peek(r) == '-' || peek(r) == ':')
        return fail_at(r, start,
                       "dates and times are outside the TOML subset this reader "
                       "takes");
    errno = 0;
    if (is_float) {
        v->number = strtod(buf, NULL);
        if (errno == ERANGE && isinf(v->number))
            return fail_at(r, start, "float out of range");
        return SELDP_OK;
    }
    long long x = strtoll(buf, NULL, 10);
    if (errno != 0)
        return fail_at(r, start, "integer out of the 64-bit range");
    v->is_integer = true;
    v->integer = x;
    v->number = (double)x;
    return SELDP_OK;
}

static seldp_status read_value(reader *r, hx_json *v, int depth);

/* Append a value to an array or an object node (keys: the object's, or NULL). */
static seldp_status node_push(reader *r, hx_json *node, hx_json *item, char *key)
{
    hx_json *items = realloc(node->items, (node->count + 1) * sizeof *items);
    if (!items)
        return hx_fail(SELDP_ERR_NOMEM, "%s: out of memory", r->what);
    node->items = items;
    if (node->type == HX_JSON_OBJECT) {
        char **keys = realloc(node->keys, (node->count + 1) * sizeof *keys);
        if (!keys)
            return hx_fail(SELDP_ERR_NOMEM, "%s: out of memory", r->what);
        node->keys = keys;
        keys[node->count] = key;
    }
    items[node->count++] = *item;
    memset(item, 0, sizeof *item);
    return SELDP_OK;
}

static seldp_status read_array(reader *r, hx_json *v, int depth)
{
    seldp_status st = SELDP_OK;
    hx_json item = {0};
    v->type = HX_JSON_ARRAY;
    r->pos++; /* [ */
    for (;;) {
        HX_CHECK(skip_space_lines(r));
        if (peek(r) == ']') {
            r->pos++;
            return SELDP_OK;
        }
        HX_CHECK(read_value(r, &item, depth + 1));
        HX_CHECK(node_push(r, v, &item, NULL));
        HX_CHECK(skip_space_lines(r));
        if (peek(r) == ',') {
            r->pos++;
            continue;
        }
        if (peek(r) != ']')
            HX_CHECK(fail_at(r, r->pos, "expected ',' or ']' in an array"));
    }
fail:
    value_free(&item);
    return st;
}

/* { a = 1, b.c = "x" } on one line: its keys may not repeat, and nothing outside extends it. */
static seldp_status read_inline_table(reader *r, hx_json *v, int depth)
{
    seldp_status st = SELDP_OK;
    hx_json item = {0};
    toml_path key = {0};
    v->type = HX_JSON_OBJECT;
    r->pos++; /* { */
    skip_blank(r);
    if (peek(r) == '}') {
        r->pos++;
        return SELDP_OK;
    }
    for (;;) {
        int line = r->line;
        size_t at = r->pos;
        HX_CHECK(read_key(r, &key));
        if (peek(r) != '=')
            HX_CHECK(fail_at(r, r->pos, "expected '=' after the key"));
        r->pos++;
        skip_blank(r);
        HX_CHECK(read_value(r, &item, depth + 1));
        /* walk the dotted parts, creating tables; none may be a value already */
        hx_json *node = v;
        for (int i = 0; i < key.n; i++) {
            hx_json *next = NULL;
            for (size_t k = 0; k < node->count; k++)
                if (strcmp(node->keys[k], key.parts[i]) == 0)
                    next = &node->items[k];
            bool last = i == key.n - 1;
            if (next &&
                (last || next->type != HX_JSON_OBJECT || next->line != line || next->column != 0)) {
                r->pos = at;
                HX_CHECK(fail_at(r, at, "key %s defined twice in an inline table", key.parts[i]));
            }
            if (!next) {
                hx_json table = {.type = HX_JSON_OBJECT, .line = line, .column = 0};
                hx_json *fresh = last ? &item : &table;
                HX_CHECK(node_push(r, node, fresh, key.parts[i]));
                key.parts[i] = NULL;
                next = &node->items[node->count - 1];
            }
            node = next;
        }
        for (int i = 0; i < key.n; i++)
            free(key.parts[i]);
        key.n = 0;
        skip_blank(r);
        if (peek(r) == ',') {
            r->pos++;
            skip_blank(r);
            continue;
        }
        if (peek(r) == '}') {
            r->pos++;
            return SELDP_OK;
        }
        HX_CHECK(fail_at(r, r->pos, "expected ',' or '}' in an inline table (on one line)"));
    }
fail:
    path_free(&key);
    value_free(&item);
    return st;
}

static seldp_status read_value(reader *r, hx_json *v, int depth)
{
    memset(v, 0, sizeof *v);
    v->line = r->line;
    v->column = (int)(r->pos - r->line_start) + 1;
    if (depth > TOML_MAX_DEPTH)
        return fail_at(r, r->pos, "arrays and inline tables nested more than %d deep",
                       TOML_MAX_DEPTH);
    int c = peek(r);
    if (c == '"' || c == '\'') {
        v->type = HX_JSON_STRING;
        return read_string(r, &v->string);
    }
    if (c == '[')
        return read_array(r, v, depth);
    if (c == '{') {
        seldp_status st = read_inline_table(r, v, depth);
        /* the marks of dotted tables inside it are no longer needed */
        return st;
    }
    if (r->len - r->pos >= 4 && memcmp(r->text + r->pos, "true", 4) == 0 &&
        !bare_key_char(r->pos + 4 < r->len ? (unsigned char)r->text[r->pos + 4] : ' ')) {
        v->type = HX_JSON_BOOL;
        v->boolean = true;
        r->pos += 4;
        return SELDP_OK;
    }
    if (r->len - r->pos >= 5 && memcmp(r->text + r->pos, "false", 5) == 0 &&
        !bare_key_char(r->pos + 5 < r->len ? (unsigned char)r->text[r->pos + 5] : ' ')) {
        v->type = HX_JSON_BOOL;
        r->pos += 5;
        return SELDP_OK;
    }
    if ((c >= '0' && c <= '9') || c == '+' || c == '-' || c == 'i' || c == 'n') {
        seldp_status st = read_number(r, v);
        if (st == SELDP_OK && bare_key_char(peek(r)))
            return fail_at(r, r->pos, "unexpected '%c' after a number", r->text[r->pos]);
        return st;
    }
    if (c < 0 || c == '\n' || c == '\r' || c == '#')
        return fail_at(r, r->pos, "expected a value after '='");
    return fail_at(r, r->pos,
                   "expected a value (a string, number, boolean, array or inline "
                   "table)");
}

/* ---- lines ------------------------------------------------------------------------------- */

static seldp_status push_entry(reader *r, toml_entry *e)
{
    if (r->n == r->cap) {
        size_t cap = r->cap ? 2 * r->cap : 16;
        toml_entry *grown = realloc(r->entries, cap * sizeof *grown);
        if (!grown)
            return hx_fail(SELDP_ERR_NOMEM, "%s: out of memory", r->what);
        r->entries = grown;
        r->cap = cap;
    }
    r->entries[r->n++] = *e;
    memset(e, 0, sizeof *e);
    return SELDP_OK;
}

static seldp_status copy_path(const reader *r, const toml_path *from, toml_path *to)
{
    for (int i = 0; i < from->n; i++) {
        to->parts[i] = hx_strdup(from->parts[i]);
        if (!to->parts[i])
            return hx_fail(SELDP_ERR_NOMEM, "%s: out of memory", r->what);
        to->n = i + 1;
    }
    return SELDP_OK;
}

static seldp_status read_lines(reader *r)
{
    seldp_status st = SELDP_OK;
    toml_path table = {0};
    toml_entry e = {0};
    while (r->pos < r->len) {
        HX_CHECK(skip_space_lines(r));
        if (r->pos >= r->len)
            break;
        e.line = r->line;
        e.column = (int)(r->pos - r->line_start) + 1;
        if (peek(r) == '[') {
            if (r->pos + 1 < r->len && r->text[r->pos + 1] == '[')
                HX_CHECK(fail_at(r, r->pos,
                                 "arrays of tables ([[...]]) are outside the TOML "
                                 "subset this reader takes"));
            r->pos++;
            path_free(&table);
            HX_CHECK(read_key(r, &table));
            if (peek(r) != ']')
                HX_CHECK(fail_at(r, r->pos, "expected ']' after the table name"));
            r->pos++;
            HX_CHECK(end_of_line(r));
            e.header = true;
            HX_CHECK(copy_path(r, &table, &e.path));
            e.value.type = HX_JSON_OBJECT;
            e.value.line = e.line;
            e.value.column = e.column;
            HX_CHECK(push_entry(r, &e));
            continue;
        }
        HX_CHECK(copy_path(r, &table, &e.path));
        e.table_len = table.n;
        HX_CHECK(read_key(r, &e.path));
        if (peek(r) != '=')
            HX_CHECK(fail_at(r, r->pos, "expected '=' after the key"));
        r->pos++;
        skip_blank(r);
        HX_CHECK(read_value(r, &e.value, 0));
        HX_CHECK(end_of_line(r));
        HX_CHECK(push_entry(r, &e));
    }
fail:
    path_free(&table);
    path_free(&e.path);
    value_free(&e.value);
    return st;
}

/* ---- TOML's rules on redefinition, then the tree ----------------------------------------- */

static bool is_prefix(const toml_path *a, int n, const toml_path *b)
{
    if (n > b->n)
        return false;
    for (int i = 0; i < n; i++)
        if (strcmp(a->parts[i], b->parts[i]) != 0)
            return false;
    return true;
}

/* Entry b (later) against entry a (earlier). */
static seldp_status check_pair(const reader *r, const toml_entry *a, const toml_entry *b)
{
    char name[512];
    if (a->path.n == b->path.n && is_prefix(&a->path, a->path.n, &b->path)) {
        path_text(&b->path, b->path.n, name, sizeof name);
        if (a->header && b->header)
            return fail_entry(r, b, "table [%s] defined twice (first at line %d)", name, a->line);
        if (!a->header && !b->header)
            return fail_entry(r, b, "key %s defined twice (first at line %d)", name, a->line);
        return fail_entry(r, b, "%s is a table and a value (line %d)", name, a->line);
    }
    if (a->path.n < b->path.n && is_prefix(&a->path, a->path.n, &b->path)) {
        path_text(&a->path, a->path.n, name, sizeof name);
        if (!a->header)
            return fail_entry(r, b, "%s is a value (line %d), not a table", name, a->line);
        if (!b->header && b->table_len < a->path.n)
            return fail_entry(r, b, "a dotted key reopens table [%s] (line %d)", name, a->line);
        return SELDP_OK;
    }
    if (b->path.n < a->path.n && is_prefix(&b->path, b->path.n, &a->path)) {
        path_text(&b->path, b->path.n, name, sizeof name);
        if (!b->header)
            return fail_entry(r, b, "key %s is already a table (line %d)", name, a->line);
        if (!a->header && a->table_len < b->path.n)
            return fail_entry(r, b, "table [%s] was made by a dotted key (line %d)", name, a->line);
    }
    return SELDP_OK;
}

/* The child of object `node` named `key`, created empty (an object) when missing. */
static hx_json *child(reader *r, hx_json *node, const char *key, const toml_entry *e)
{
    for (size_t k = 0; k < node->count; k++)
        if (strcmp(node->keys[k], key) == 0)
            return &node->items[k];
    hx_json table = {.type = HX_JSON_OBJECT, .line = e->line, .column = e->column};
    char *copy = hx_strdup(key);
    if (!copy || node_push(r, node, &table, copy) != SELDP_OK) {
        free(copy);
        return NULL;
    }
    return &node->items[node->count - 1];
}

static seldp_status build_tree(reader *r, hx_json *root)
{
    for (size_t i = 0; i < r->n; i++) {
        toml_entry *e = &r->entries[i];
        int walk = e->header ? e->path.n : e->path.n - 1;
        hx_json *node = root;
        for (int k = 0; k < walk && node; k++)
            node = child(r, node, e->path.parts[k], e);
        if (!node)
            return hx_fail(SELDP_ERR_NOMEM, "%s: out of memory", r->what);
        if (e->header)
            continue;
        seldp_status st = node_push(r, node, &e->value, e->path.parts[e->path.n - 1]);
        if (st != SELDP_OK)
            return st;
        e->path.parts[--e->path.n] = NULL; /* the key now belongs to the tree */
    }
    return SELDP_OK;
}

seldp_status hx_toml_parse(const char *text, size_t len, const char *what, hx_json **out)
{
    seldp_status st = SELDP_OK;
    reader r = {.text = text, .len = len, .line = 1, .what = what};
    hx_json *root = NULL;
    *out = NULL;
    HX_CHECK(read_lines(&r));
    for (size_t j = 0; j < r.n; j++)
        for (size_t i = 0; i < j; i++)
            HX_CHECK(check_pair(&r, &r.entries[i], &r.entries[j]));
    root = hx_calloc(1, sizeof *root);
    if (!root)
        HX_FAIL(SELDP_ERR_NOMEM, "%s: out of memory", what);
    root->type = HX_JSON_OBJECT;
    root->line = root->column = 1;
    HX_CHECK(build_tree(&r, root));
    *out = root;
    root = NULL;
fail:
    for (size_t i = 0; i < r.n; i++) {
        path_free(&r.entries[i].path);
        value_free(&r.entries[i].value);
    }
    free(r.entries);
    hx_json_free(root);
    return st;
}
