/* The strict TOML reader's parts (toml.c, toml_value.c): the reader over the text, the flat
 * list of entries it fills, and what the two files share. Internal to the harness. */
#ifndef HX_TOML_IMPL_H
#define HX_TOML_IMPL_H

#include <stdbool.h>
#include <stddef.h>

#include "json.h"
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

static inline int hx_toml_peek(const reader *r)
{
    return r->pos < r->len ? (unsigned char)r->text[r->pos] : -1;
}

/* "what:line:column: why" at byte `pos` of the current line, or at entry e (SELDP_ERR_PARSE). */
HX_PRINTF(3, 4) seldp_status hx_toml_fail_at(const reader *r, size_t pos, const char *fmt, ...);
HX_PRINTF(3, 4)
seldp_status hx_toml_fail_entry(const reader *r, const toml_entry *e, const char *fmt, ...);
void hx_toml_path_free(toml_path *p);
void hx_toml_value_free(hx_json *v);
/* "a.b.c" of the first n parts, for messages (quoted parts are shown bare). */
void hx_toml_path_text(const toml_path *p, int n, char *buf, size_t size);

/* toml_value.c: blanks and comments, the end of a line, a dotted key, a value (strings,
 * numbers, booleans, arrays, inline tables; nested at most TOML_MAX_DEPTH deep), and a
 * key-value pair pushed into an object node. */
void hx_toml_skip_blank(reader *r);
seldp_status hx_toml_skip_space_lines(reader *r);
seldp_status hx_toml_end_of_line(reader *r);
seldp_status hx_toml_read_key(reader *r, toml_path *path);
seldp_status hx_toml_read_value(reader *r, hx_json *v, int depth);
seldp_status hx_toml_node_push(reader *r, hx_json *node, hx_json *item, char *key);

#endif
