/* The strict TOML reader's lexical pieces and values (toml_impl.h): blanks, comments and line
 * ends, strings with their escapes, bare and quoted keys, numbers, booleans, arrays and inline
 * tables, and the errors at a line and column. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "toml_impl.h"

HX_PRINTF(3, 4) seldp_status hx_toml_fail_at(const reader *r, size_t pos, const char *fmt, ...)
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
seldp_status hx_toml_fail_entry(const reader *r, const toml_entry *e, const char *fmt, ...)
{
    char why[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    return hx_fail(SELDP_ERR_PARSE, "%s:%d:%d: %s", r->what, e->line, e->column, why);
}

void hx_toml_path_free(toml_path *p)
{
    for (int i = 0; i < p->n; i++)
        free(p->parts[i]);
    p->n = 0;
}

void hx_toml_value_free(hx_json *v)
{
    for (size_t i = 0; i < v->count; i++) {
        hx_toml_value_free(&v->items[i]);
        if (v->keys)
            free(v->keys[i]);
    }
    free(v->items);
    free(v->keys);
    free(v->string);
    memset(v, 0, sizeof *v);
}

/* "a.b.c" for messages (quoted parts are shown bare). */
void hx_toml_path_text(const toml_path *p, int n, char *buf, size_t size)
{
    size_t at = 0;
    buf[0] = '\0';
    for (int i = 0; i < n && at < size; i++)
        at += (size_t)snprintf(buf + at, size - at, "%s%s", i ? "." : "", p->parts[i]);
}

/* ---- lexical pieces ---------------------------------------------------------------------- */

void hx_toml_skip_blank(reader *r)
{
    while (hx_toml_peek(r) == ' ' || hx_toml_peek(r) == '\t')
        r->pos++;
}

/* A comment to the end of the line: tabs and printable characters, valid UTF-8. */
static seldp_status skip_comment(reader *r)
{
    if (hx_toml_peek(r) != '#')
        return SELDP_OK;
    while (r->pos < r->len && r->text[r->pos] != '\n') {
        unsigned char c = (unsigned char)r->text[r->pos];
        if (c == '\r' && r->pos + 1 < r->len && r->text[r->pos + 1] == '\n')
            break;
        if ((c < 0x20 && c != '\t') || c == 0x7f)
            return hx_toml_fail_at(r, r->pos, "control character 0x%02x in a comment", c);
        size_t n = hx_utf8_length((const unsigned char *)r->text + r->pos, r->len - r->pos);
        if (n == 0)
            return hx_toml_fail_at(r, r->pos, "invalid UTF-8 in a comment");
        r->pos += n;
    }
    return SELDP_OK;
}

/* A newline (LF or CRLF); false when there is none here. */
static bool take_newline(reader *r)
{
    if (hx_toml_peek(r) == '\n') {
        r->pos++;
    } else if (hx_toml_peek(r) == '\r' && r->pos + 1 < r->len && r->text[r->pos + 1] == '\n') {
        r->pos += 2;
    } else {
        return false;
    }
    r->line++;
    r->line_start = r->pos;
    return true;
}

/* Blanks, comments and newlines (between the values of an array). */
seldp_status hx_toml_skip_space_lines(reader *r)
{
    for (;;) {
        hx_toml_skip_blank(r);
        seldp_status st = skip_comment(r);
        if (st != SELDP_OK)
            return st;
        if (!take_newline(r))
            return SELDP_OK;
    }
}

/* After a value or a header: blanks, a comment, then the end of the line or of the text. */
seldp_status hx_toml_end_of_line(reader *r)
{
    hx_toml_skip_blank(r);
    seldp_status st = skip_comment(r);
    if (st != SELDP_OK)
        return st;
    if (r->pos >= r->len || take_newline(r))
        return SELDP_OK;
    return hx_toml_fail_at(r, r->pos, "expected the end of the line after the value");
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
        return hx_toml_fail_at(r, r->pos,
                               "multi-line strings are outside the TOML subset this reader "
                               "takes; write the string on one line");
    r->pos++;
    hx_buf_append(&b, "", 0);
    for (;;) {
        int c = hx_toml_peek(r);
        if (c < 0 || c == '\n' || c == '\r')
            HX_CHECK(hx_toml_fail_at(r, start, "unterminated string"));
        if (c == quote) {
            r->pos++;
            break;
        }
        if ((c < 0x20 && c != '\t') || c == 0x7f)
            HX_CHECK(
                hx_toml_fail_at(r, r->pos, "control character 0x%02x in a string", (unsigned)c));
        if (c == '\\' && quote == '"') {
            r->pos++;
            int e = hx_toml_peek(r);
            const char *simple = strchr("btnfr\"\\", e > 0 ? e : 'x');
            if (e > 0 && simple) {
                static const char map[] = "\b\t\n\f\r\"\\";
                hx_buf_append(&b, &map[simple - "btnfr\"\\"], 1);
                r->pos++;
                continue;
            }
            if (e != 'u' && e != 'U')
                HX_CHECK(hx_toml_fail_at(r, r->pos - 1, "invalid escape in a string"));
            int digits = e == 'u' ? 4 : 8;
            unsigned cp = 0;
            r->pos++;
            for (int i = 0; i < digits; i++) {
                int h = hex_digit(hx_toml_peek(r));
                if (h < 0)
                    HX_CHECK(hx_toml_fail_at(r, r->pos, "\\%c needs %d hex digits", e, digits));
                cp = cp * 16 + (unsigned)h;
                r->pos++;
            }
            if (cp == 0 || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
                HX_CHECK(hx_toml_fail_at(r, r->pos - (size_t)digits - 2,
                                         "\\%c%0*X is not a character a string may hold", e, digits,
                                         cp));
            hx_buf_put_utf8(&b, cp);
            continue;
        }
        size_t n = hx_utf8_length((const unsigned char *)r->text + r->pos, r->len - r->pos);
        if (n == 0)
            HX_CHECK(hx_toml_fail_at(r, r->pos, "invalid UTF-8 in a string"));
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
seldp_status hx_toml_read_key(reader *r, toml_path *path)
{
    for (;;) {
        hx_toml_skip_blank(r);
        if (path->n >= TOML_MAX_PATH)
            return hx_toml_fail_at(r, r->pos, "a key of more than %d parts", TOML_MAX_PATH);
        int c = hx_toml_peek(r);
        char *part = NULL;
        if (c == '"' || c == '\'') {
            seldp_status st = read_string(r, &part);
            if (st != SELDP_OK)
                return st;
        } else {
            size_t start = r->pos;
            while (bare_key_char(hx_toml_peek(r)))
                r->pos++;
            if (r->pos == start)
                return hx_toml_fail_at(r, start,
                                       "expected a key (letters, digits, _ and -, or a quoted "
                                       "string)");
            part = malloc(r->pos - start + 1);
            if (!part)
                return hx_fail(SELDP_ERR_NOMEM, "%s: out of memory", r->what);
            memcpy(part, r->text + start, r->pos - start);
            part[r->pos - start] = '\0';
        }
        path->parts[path->n++] = part;
        hx_toml_skip_blank(r);
        if (hx_toml_peek(r) != '.')
            return SELDP_OK;
        r->pos++;
    }
}

/* Digits with single underscores between them (TOML's rule), of base `base`, into buf. */
static bool read_digits(reader *r, int base, char *buf, size_t size, size_t *n)
{
    bool any = false, last_underscore = false;
    while (r->pos < r->len) {
        int c = hx_toml_peek(r);
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
    int sign = hx_toml_peek(r);
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
    if (hx_toml_peek(r) == '0' && r->pos + 1 < r->len && strchr("xob", r->text[r->pos + 1])) {
        if (n)
            return hx_toml_fail_at(r, start,
                                   "a hexadecimal, octal or binary integer takes no sign");
        int base = r->text[r->pos + 1] == 'x' ? 16 : r->text[r->pos + 1] == 'o' ? 8 : 2;
        r->pos += 2;
        if (!read_digits(r, base, buf, sizeof buf, &n))
            return hx_toml_fail_at(r, start, "malformed base-%d integer", base);
        errno = 0;
        unsigned long long x = strtoull(buf, NULL, base);
        if (errno != 0 || x > (unsigned long long)INT64_MAX)
            return hx_toml_fail_at(r, start, "integer out of the 64-bit range");
        v->is_integer = true;
        v->integer = (int64_t)x;
        v->number = (double)x;
        return SELDP_OK;
    }
    size_t int_start = n;
    if (!read_digits(r, 10, buf, sizeof buf, &n))
        return hx_toml_fail_at(r, start, "malformed number");
    if (n - int_start > 1 && buf[int_start] == '0')
        return hx_toml_fail_at(r, start, "a number must not have leading zeros");
    bool is_float = false;
    if (hx_toml_peek(r) == '.') {
        is_float = true;
        buf[n++] = '.';
        r->pos++;
        if (!read_digits(r, 10, buf, sizeof buf, &n))
            return hx_toml_fail_at(r, start, "a decimal point needs digits on both sides");
    }
    if (hx_toml_peek(r) == 'e' || hx_toml_peek(r) == 'E') {
        is_float = true;
        buf[n++] = 'e';
        r->pos++;
        if (hx_toml_peek(r) == '+' || hx_toml_peek(r) == '-')
            buf[n++] = r->text[r->pos++];
        if (!read_digits(r, 10, buf, sizeof buf, &n))
            return hx_toml_fail_at(r, start, "an exponent needs digits");
    }
    if (hx_toml_peek(r) == '-' || hx_toml_peek(r) == ':')
        return hx_toml_fail_at(r, start,
                               "dates and times are outside the TOML subset this reader "
                               "takes");
    errno = 0;
    if (is_float) {
        v->number = strtod(buf, NULL);
        if (errno == ERANGE && isinf(v->number))
            return hx_toml_fail_at(r, start, "float out of range");
        return SELDP_OK;
    }
    long long x = strtoll(buf, NULL, 10);
    if (errno != 0)
        return hx_toml_fail_at(r, start, "integer out of the 64-bit range");
    v->is_integer = true;
    v->integer = x;
    v->number = (double)x;
    return SELDP_OK;
}

/* Append a value to an array or an object node (keys: the object's, or NULL). */
seldp_status hx_toml_node_push(reader *r, hx_json *node, hx_json *item, char *key)
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
        HX_CHECK(hx_toml_skip_space_lines(r));
        if (hx_toml_peek(r) == ']') {
            r->pos++;
            return SELDP_OK;
        }
        HX_CHECK(hx_toml_read_value(r, &item, depth + 1));
        HX_CHECK(hx_toml_node_push(r, v, &item, NULL));
        HX_CHECK(hx_toml_skip_space_lines(r));
        if (hx_toml_peek(r) == ',') {
            r->pos++;
            continue;
        }
        if (hx_toml_peek(r) != ']')
            HX_CHECK(hx_toml_fail_at(r, r->pos, "expected ',' or ']' in an array"));
    }
fail:
    hx_toml_value_free(&item);
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
    hx_toml_skip_blank(r);
    if (hx_toml_peek(r) == '}') {
        r->pos++;
        return SELDP_OK;
    }
    for (;;) {
        int line = r->line;
        size_t at = r->pos;
        HX_CHECK(hx_toml_read_key(r, &key));
        if (hx_toml_peek(r) != '=')
            HX_CHECK(hx_toml_fail_at(r, r->pos, "expected '=' after the key"));
        r->pos++;
        hx_toml_skip_blank(r);
        HX_CHECK(hx_toml_read_value(r, &item, depth + 1));
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
                HX_CHECK(hx_toml_fail_at(r, at, "key %s defined twice in an inline table",
                                         key.parts[i]));
            }
            if (!next) {
                hx_json table = {.type = HX_JSON_OBJECT, .line = line, .column = 0};
                hx_json *fresh = last ? &item : &table;
                HX_CHECK(hx_toml_node_push(r, node, fresh, key.parts[i]));
                key.parts[i] = NULL;
                next = &node->items[node->count - 1];
            }
            node = next;
        }
        for (int i = 0; i < key.n; i++)
            free(key.parts[i]);
        key.n = 0;
        hx_toml_skip_blank(r);
        if (hx_toml_peek(r) == ',') {
            r->pos++;
            hx_toml_skip_blank(r);
            continue;
        }
        if (hx_toml_peek(r) == '}') {
            r->pos++;
            return SELDP_OK;
        }
        HX_CHECK(
            hx_toml_fail_at(r, r->pos, "expected ',' or '}' in an inline table (on one line)"));
    }
fail:
    hx_toml_path_free(&key);
    hx_toml_value_free(&item);
    return st;
}

seldp_status hx_toml_read_value(reader *r, hx_json *v, int depth)
{
    memset(v, 0, sizeof *v);
    v->line = r->line;
    v->column = (int)(r->pos - r->line_start) + 1;
    if (depth > TOML_MAX_DEPTH)
        return hx_toml_fail_at(r, r->pos, "arrays and inline tables nested more than %d deep",
                               TOML_MAX_DEPTH);
    int c = hx_toml_peek(r);
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
        if (st == SELDP_OK && bare_key_char(hx_toml_peek(r)))
            return hx_toml_fail_at(r, r->pos, "unexpected '%c' after a number", r->text[r->pos]);
        return st;
    }
    if (c < 0 || c == '\n' || c == '\r' || c == '#')
        return hx_toml_fail_at(r, r->pos, "expected a value after '='");
    return hx_toml_fail_at(r, r->pos,
                           "expected a value (a string, number, boolean, array or inline "
                           "table)");
}
