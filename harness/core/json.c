/* Strict recursive-descent JSON parser with line/column errors (see json.h). */
#include "json.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

#define JSON_MAX_DEPTH 64

typedef struct parser {
    const char *text;
    size_t len;
    size_t pos;
    int line;
    size_t line_start;
    const char *what;
} parser;

static int column_of(const parser *p, size_t pos)
{
    return (int)(pos - p->line_start) + 1;
}

HX_PRINTF(3, 4) static seldp_status parse_error(const parser *p, size_t pos, const char *fmt, ...)
{
    char why[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    return hx_fail(SELDP_ERR_PARSE, "%s:%d:%d: %s", p->what, p->line, column_of(p, pos), why);
}

static void skip_whitespace(parser *p)
{
    while (p->pos < p->len) {
        char c = p->text[p->pos];
        if (c == '\n') {
            p->line++;
            p->line_start = p->pos + 1;
        } else if (c != ' ' && c != '\t' && c != '\r') {
            return;
        }
        p->pos++;
    }
}

static int peek(const parser *p)
{
    return p->pos < p->len ? (unsigned char)p->text[p->pos] : -1;
}

static const char *describe(int c, char *buf, size_t size)
{
    if (c < 0)
        return "end of input";
    if (c >= 0x20 && c < 0x7f)
        snprintf(buf, size, "'%c'", c);
    else
        snprintf(buf, size, "byte 0x%02x", (unsigned)c);
    return buf;
}

static seldp_status parse_value(parser *p, hx_json *out, int depth);

static void free_children(hx_json *v)
{
    for (size_t i = 0; i < v->count; i++) {
        free_children(&v->items[i]);
        if (v->keys)
            free(v->keys[i]);
    }
    free(v->items);
    free(v->keys);
    free(v->string);
}

void hx_json_free(hx_json *value)
{
    if (!value)
        return;
    free_children(value);
    free(value);
}

static seldp_status expect_literal(parser *p, const char *word)
{
    size_t n = strlen(word);
    if (p->len - p->pos < n || memcmp(p->text + p->pos, word, n) != 0)
        return parse_error(p, p->pos, "invalid literal (expected '%s')", word);
    p->pos += n;
    return SELDP_OK;
}

static int hex_value(int c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

static seldp_status read_hex4(parser *p, unsigned *out)
{
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        int h = hex_value(peek(p));
        if (h < 0)
            return parse_error(p, p->pos, "\\u escape needs four hex digits");
        v = v * 16 + (unsigned)h;
        p->pos++;
    }
    *out = v;
    return SELDP_OK;
}

void hx_buf_put_utf8(hx_buf *b, unsigned cp)
{
    char u[4];
    size_t n;
    if (cp < 0x80) {
        u[0] = (char)cp;
        n = 1;
    } else if (cp < 0x800) {
        u[0] = (char)(0xc0 | (cp >> 6));
        u[1] = (char)(0x80 | (cp & 0x3f));
        n = 2;
    } else if (cp < 0x10000) {
        u[0] = (char)(0xe0 | (cp >> 12));
        u[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
        u[2] = (char)(0x80 | (cp & 0x3f));
        n = 3;
    } else {
        u[0] = (char)(0xf0 | (cp >> 18));
        u[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
        u[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
        u[3] = (char)(0x80 | (cp & 0x3f));
        n = 4;
    }
    hx_buf_append(b, u, n);
}

size_t hx_utf8_length(const unsigned char *s, size_t avail)
{
    size_t n;
    unsigned cp;
    if (s[0] < 0x80)
        return 1;
    if ((s[0] & 0xe0) == 0xc0) {
        n = 2;
        cp = s[0] & 0x1f;
    } else if ((s[0] & 0xf0) == 0xe0) {
        n = 3;
        cp = s[0] & 0x0f;
    } else if ((s[0] & 0xf8) == 0xf0) {
        n = 4;
        cp = s[0] & 0x07;
    } else {
        return 0;
    }
    if (avail < n)
        return 0;
    for (size_t i = 1; i < n; i++) {
        if ((s[i] & 0xc0) != 0x80)
            return 0;
        cp = (cp << 6) | (s[i] & 0x3f);
    }
    static const unsigned min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min_cp[n] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
        return 0;
    return n;
}

static seldp_status parse_string(parser *p, char **out)
{
    seldp_status st = SELDP_OK;
    hx_buf b = {0};
    p->pos++; /* opening quote */
    hx_buf_append(&b, "", 0);
    for (;;) {
        int c = peek(p);
        if (c < 0)
            HX_CHECK(parse_error(p, p->pos, "unterminated string"));
        if (c == '"') {
            p->pos++;
            break;
        }
        if (c < 0x20)
            HX_CHECK(parse_error(p, p->pos, "control character 0x%02x in a string (escape it)",
                                 (unsigned)c));
        if (c != '\\') {
            size_t n = hx_utf8_length((const unsigned char *)p->text + p->pos, p->len - p->pos);
            if (n == 0)
                HX_CHECK(parse_error(p, p->pos, "invalid UTF-8 in a string"));
            hx_buf_append(&b, p->text + p->pos, n);
            p->pos += n;
            continue;
        }
        size_t escape_pos = p->pos;
        p->pos++;
        c = peek(p);
        p->pos++;
        switch (c) {
        case '"':
            hx_buf_puts(&b, "\"");
            break;
        case '\\':
            hx_buf_puts(&b, "\\");
            break;
        case '/':
            hx_buf_puts(&b, "/");
            break;
        case 'b':
            hx_buf_puts(&b, "\b");
            break;
        case 'f':
            hx_buf_puts(&b, "\f");
            break;
        case 'n':
            hx_buf_puts(&b, "\n");
            break;
        case 'r':
            hx_buf_puts(&b, "\r");
            break;
        case 't':
            hx_buf_puts(&b, "\t");
            break;
        case 'u': {
            unsigned cp = 0;
            HX_CHECK(read_hex4(p, &cp));
            if (cp >= 0xdc00 && cp <= 0xdfff)
                HX_CHECK(parse_error(p, escape_pos, "lone low surrogate \\u%04x", cp));
            if (cp >= 0xd800 && cp <= 0xdbff) {
                unsigned low = 0;
                if (p->len - p->pos < 2 || p->text[p->pos] != '\\' || p->text[p->pos + 1] != 'u')
                    HX_CHECK(
                        parse_error(p, escape_pos, "high surrogate \\u%04x without a low one", cp));
                p->pos += 2;
                HX_CHECK(read_hex4(p, &low));
                if (low < 0xdc00 || low > 0xdfff)
                    HX_CHECK(
                        parse_error(p, escape_pos, "high surrogate \\u%04x without a low one", cp));
                cp = 0x10000 + ((cp - 0xd800) << 10) + (low - 0xdc00);
            }
            if (cp == 0)
                HX_CHECK(parse_error(p, escape_pos, "\\u0000 is not allowed in a string"));
            hx_buf_put_utf8(&b, cp);
            break;
        }
        default: {
            char d[24];
            HX_CHECK(parse_error(p, escape_pos, "invalid escape \\%s in a string",
                                 c < 0 ? "" : describe(c, d, sizeof d)));
        }
        }
    }
    if (!hx_buf_ok(&b))
        HX_FAIL(SELDP_ERR_NOMEM, "%s: out of memory reading a string", p->what);
    *out = b.data;
    return SELDP_OK;
fail:
    hx_buf_free(&b);
    return st;
}

static bool is_digit(int c)
{
    return c >= '0' && c <= '9';
}

static seldp_status parse_number(parser *p, hx_json *out)
{
    size_t start = p->pos;
    bool integer = true;
    if (peek(p) == '-')
        p->pos++;
    if (peek(p) == '0') {
        p->pos++;
        if (is_digit(peek(p)))
            return parse_error(p, start, "number with a leading zero");
    } else if (is_digit(peek(p))) {
        while (is_digit(peek(p)))
            p->pos++;
    } else {
        return parse_error(p, start, "invalid number");
    }
    if (peek(p) == '.') {
        integer = false;
        p->pos++;
        if (!is_digit(peek(p)))
            return parse_error(p, p->pos, "digit expected after the decimal point");
        while (is_digit(peek(p)))
            p->pos++;
    }
    if (peek(p) == 'e' || peek(p) == 'E') {
        integer = false;
        p->pos++;
        if (peek(p) == '+' || peek(p) == '-')
            p->pos++;
        if (!is_digit(peek(p)))
            return parse_error(p, p->pos, "digit expected in the exponent");
        while (is_digit(peek(p)))
            p->pos++;
    }
    char literal[64];
    size_t n = p->pos - start;
    if (n >= sizeof literal)
        return parse_error(p, start, "number literal longer than %zu characters",
                           sizeof literal - 1);
    memcpy(literal, p->text + start, n);
    literal[n] = '\0';
    out->type = HX_JSON_NUMBER;
    out->number = strtod(literal, NULL);
    if (!isfinite(out->number))
        return parse_error(p, start, "number %s is out of range", literal);
    if (integer) {
        errno = 0;
        long long v = strtoll(literal, NULL, 10);
        if (errno == 0) {
            out->is_integer = true;
            out->integer = v;
        }
    }
    return SELDP_OK;
}

static seldp_status parse_array(parser *p, hx_json *out, int depth)
{
    seldp_status st = SELDP_OK;
    size_t cap = 0;
    out->type = HX_JSON_ARRAY;
    p->pos++;
    skip_whitespace(p);
    if (peek(p) == ']') {
        p->pos++;
        return SELDP_OK;
    }
    for (;;) {
        if (out->count == cap) {
            size_t ncap = cap ? cap * 2 : 4;
            hx_json *items = realloc(out->items, ncap * sizeof *items);
            if (!items)
                HX_FAIL(SELDP_ERR_NOMEM, "%s: out of memory", p->what);
            out->items = items;
            cap = ncap;
        }
        /* counted before it is parsed, so a failure frees what it holds */
        hx_json *item = &out->items[out->count++];
        *item = (hx_json){0};
        skip_whitespace(p);
        HX_CHECK(parse_value(p, item, depth + 1));
        skip_whitespace(p);
        int c = peek(p);
        if (c == ',') {
            p->pos++;
            skip_whitespace(p);
            if (peek(p) == ']')
                HX_CHECK(parse_error(p, p->pos, "trailing comma in an array"));
            continue;
        }
        if (c == ']') {
            p->pos++;
            return SELDP_OK;
        }
        char d[24];
        HX_CHECK(parse_error(p, p->pos, "expected ',' or ']' in an array, found %s",
                             describe(c, d, sizeof d)));
    }
fail:
    return st;
}

/* The member names of one object, hashed (open addressing, slots hold index + 1), so that
 * a duplicate is found in constant time: a safetensors header may name 10^5 tensors, and
 * comparing each name with every earlier one took minutes. */
typedef struct key_set {
    size_t *slots;
    size_t cap; /* a power of two, at least twice the keys held */
} key_set;

/* Where keys[n] goes in the set: an empty slot, or the slot of an equal earlier key. */
static size_t key_slot(const key_set *set, char *const *keys, size_t n)
{
    size_t mask = set->cap - 1;
    size_t at = (size_t)hx_checksum(keys[n], strlen(keys[n])) & mask;
    while (set->slots[at] && strcmp(keys[set->slots[at] - 1], keys[n]) != 0)
        at = (at + 1) & mask;
    return at;
}

/* Add keys[n] (keys[0..n-1] are in the set). Returns false when out of memory; otherwise
 * *dup is the index of an earlier equal key, or n when keys[n] is new (and now held). */
static bool key_set_add(key_set *set, char *const *keys, size_t n, size_t *dup)
{
    if (2 * (n + 1) > set->cap) {
        key_set bigger = {NULL, set->cap ? 2 * set->cap : 16};
        bigger.slots = calloc(bigger.cap, sizeof *bigger.slots);
        if (!bigger.slots)
            return false;
        for (size_t i = 0; i < n; i++)
            bigger.slots[key_slot(&bigger, keys, i)] = i + 1;
        free(set->slots);
        *set = bigger;
    }
    size_t at = key_slot(set, keys, n);
    *dup = set->slots[at] ? set->slots[at] - 1 : n;
    if (!set->slots[at])
        set->slots[at] = n + 1;
    return true;
}

static seldp_status parse_object(parser *p, hx_json *out, int depth)
{
    seldp_status st = SELDP_OK;
    size_t cap = 0;
    key_set seen = {NULL, 0};
    out->type = HX_JSON_OBJECT;
    p->pos++;
    skip_whitespace(p);
    if (peek(p) == '}') {
        p->pos++;
        return SELDP_OK;
    }
    for (;;) {
        char d[24];
        skip_whitespace(p);
        if (peek(p) != '"')
            HX_CHECK(parse_error(p, p->pos, "expected a member name in quotes, found %s",
                                 describe(peek(p), d, sizeof d)));
        if (out->count == cap) {
            size_t ncap = cap ? cap * 2 : 4;
            hx_json *items = realloc(out->items, ncap * sizeof *items);
            if (!items)
                HX_FAIL(SELDP_ERR_NOMEM, "%s: out of memory", p->what);
            out->items = items;
            char **keys = realloc(out->keys, ncap * sizeof *keys);
            if (!keys)
                HX_FAIL(SELDP_ERR_NOMEM, "%s: out of memory", p->what);
            out->keys = keys;
            cap = ncap;
        }
        size_t key_pos = p->pos, dup;
        char *key = NULL;
        HX_CHECK(parse_string(p, &key));
        /* in place but not yet counted: a failure here frees the key alone */
        out->keys[out->count] = key;
        if (!key_set_add(&seen, out->keys, out->count, &dup)) {
            free(key);
            HX_FAIL(SELDP_ERR_NOMEM, "%s: out of memory", p->what);
        }
        if (dup != out->count) {
            char shown[128];
            st = parse_error(p, key_pos, "duplicate member \"%s\"",
                             hx_printable(key, shown, sizeof shown));
            free(key);
            goto fail;
        }
        /* counted before its value is parsed, so a failure frees the key and the value */
        hx_json *item = &out->items[out->count++];
        *item = (hx_json){0};
        skip_whitespace(p);
        if (peek(p) != ':') {
            char shown[128];
            HX_CHECK(parse_error(p, p->pos, "expected ':' after member \"%s\"",
                                 hx_printable(key, shown, sizeof shown)));
        }
        p->pos++;
        skip_whitespace(p);
        HX_CHECK(parse_value(p, item, depth + 1));
        skip_whitespace(p);
        int c = peek(p);
        if (c == ',') {
            p->pos++;
            skip_whitespace(p);
            if (peek(p) == '}')
                HX_CHECK(parse_error(p, p->pos, "trailing comma in an object"));
            continue;
        }
        if (c == '}') {
            p->pos++;
            free(seen.slots);
            return SELDP_OK;
        }
        HX_CHECK(parse_error(p, p->pos, "expected ',' or '}' in an object, found %s",
                             describe(c, d, sizeof d)));
    }
fail:
    free(seen.slots);
    return st;
}

static seldp_status parse_value(parser *p, hx_json *out, int depth)
{
    if (depth > JSON_MAX_DEPTH)
        return parse_error(p, p->pos, "nesting deeper than %d levels", JSON_MAX_DEPTH);
    out->line = p->line;
    out->column = column_of(p, p->pos);
    int c = peek(p);
    char d[24];
    switch (c) {
    case '{':
        return parse_object(p, out, depth);
    case '[':
        return parse_array(p, out, depth);
    case '"':
        out->type = HX_JSON_STRING;
        return parse_string(p, &out->string);
    case 't':
        out->type = HX_JSON_BOOL;
        out->boolean = true;
        return expect_literal(p, "true");
    case 'f':
        out->type = HX_JSON_BOOL;
        return expect_literal(p, "false");
    case 'n':
        out->type = HX_JSON_NULL;
        return expect_literal(p, "null");
    default:
        if (c == '-' || is_digit(c))
            return parse_number(p, out);
        return parse_error(p, p->pos, "unexpected %s", describe(c, d, sizeof d));
    }
}

seldp_status hx_json_parse(const char *text, size_t len, const char *what, hx_json **out)
{
    seldp_status st = SELDP_OK;
    parser p = {text, len, 0, 1, 0, what ? what : "JSON"};
    hx_json *root = hx_calloc(1, sizeof *root);
    if (!root)
        return SELDP_ERR_NOMEM;
    skip_whitespace(&p);
    if (peek(&p) < 0)
        HX_CHECK(parse_error(&p, p.pos, "empty document"));
    HX_CHECK(parse_value(&p, root, 0));
    skip_whitespace(&p);
    if (p.pos < p.len) {
        char d[24];
        HX_CHECK(parse_error(&p, p.pos, "unexpected %s after the end of the document",
                             describe(peek(&p), d, sizeof d)));
    }
    *out = root;
    return SELDP_OK;
fail:
    hx_json_free(root);
    return st;
}

const char *hx_printable(const char *s, char *buf, size_t size)
{
    size_t at = 0;
    for (; *s && at + 5 < size; s++) {
        unsigned char c = (unsigned char)*s;
        if (c >= 0x20 && c != 0x7f) {
            buf[at++] = (char)c;
            continue;
        }
        at += (size_t)snprintf(buf + at, size - at, "%s",
                               c == '\n'   ? "\\n"
                               : c == '\t' ? "\\t"
                               : c == '\r' ? "\\r"
                                           : "");
        if (c != '\n' && c != '\t' && c != '\r')
            at += (size_t)snprintf(buf + at, size - at, "\\x%02x", c);
    }
    buf[at < size ? at : size - 1] = '\0';
    return buf;
}

const hx_json *hx_json_get(const hx_json *object, const char *key)
{
    if (!object || object->type != HX_JSON_OBJECT)
        return NULL;
    for (size_t i = 0; i < object->count; i++)
        if (strcmp(object->keys[i], key) == 0)
            return &object->items[i];
    return NULL;
}

const char *hx_json_type_name(hx_json_type type)
{
    static const char *const names[] = {"null", "boolean", "number", "string", "array", "object"};
    return (unsigned)type < sizeof names / sizeof names[0] ? names[type] : "invalid";
}
