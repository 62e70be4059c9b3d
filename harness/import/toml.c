/* The strict TOML reader (see toml.h). The text is read into a flat list of entries (a key's
 * full path and its value, or a table header), the list is checked against TOML's rules on
 * redefinition, and only then is the tree built, so that no rule depends on the order in
 * which the tree happened to grow. */
#include "toml.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "toml_impl.h"
#include "util.h"

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
        HX_CHECK(hx_toml_skip_space_lines(r));
        if (r->pos >= r->len)
            break;
        e.line = r->line;
        e.column = (int)(r->pos - r->line_start) + 1;
        if (hx_toml_peek(r) == '[') {
            if (r->pos + 1 < r->len && r->text[r->pos + 1] == '[')
                HX_CHECK(hx_toml_fail_at(r, r->pos,
                                         "arrays of tables ([[...]]) are outside the TOML "
                                         "subset this reader takes"));
            r->pos++;
            hx_toml_path_free(&table);
            HX_CHECK(hx_toml_read_key(r, &table));
            if (hx_toml_peek(r) != ']')
                HX_CHECK(hx_toml_fail_at(r, r->pos, "expected ']' after the table name"));
            r->pos++;
            HX_CHECK(hx_toml_end_of_line(r));
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
        HX_CHECK(hx_toml_read_key(r, &e.path));
        if (hx_toml_peek(r) != '=')
            HX_CHECK(hx_toml_fail_at(r, r->pos, "expected '=' after the key"));
        r->pos++;
        hx_toml_skip_blank(r);
        HX_CHECK(hx_toml_read_value(r, &e.value, 0));
        HX_CHECK(hx_toml_end_of_line(r));
        HX_CHECK(push_entry(r, &e));
    }
fail:
    hx_toml_path_free(&table);
    hx_toml_path_free(&e.path);
    hx_toml_value_free(&e.value);
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
        hx_toml_path_text(&b->path, b->path.n, name, sizeof name);
        if (a->header && b->header)
            return hx_toml_fail_entry(r, b, "table [%s] defined twice (first at line %d)", name,
                                      a->line);
        if (!a->header && !b->header)
            return hx_toml_fail_entry(r, b, "key %s defined twice (first at line %d)", name,
                                      a->line);
        return hx_toml_fail_entry(r, b, "%s is a table and a value (line %d)", name, a->line);
    }
    if (a->path.n < b->path.n && is_prefix(&a->path, a->path.n, &b->path)) {
        hx_toml_path_text(&a->path, a->path.n, name, sizeof name);
        if (!a->header)
            return hx_toml_fail_entry(r, b, "%s is a value (line %d), not a table", name, a->line);
        if (!b->header && b->table_len < a->path.n)
            return hx_toml_fail_entry(r, b, "a dotted key reopens table [%s] (line %d)", name,
                                      a->line);
        return SELDP_OK;
    }
    if (b->path.n < a->path.n && is_prefix(&b->path, b->path.n, &a->path)) {
        hx_toml_path_text(&b->path, b->path.n, name, sizeof name);
        if (!b->header)
            return hx_toml_fail_entry(r, b, "key %s is already a table (line %d)", name, a->line);
        if (!a->header && a->table_len < b->path.n)
            return hx_toml_fail_entry(r, b, "table [%s] was made by a dotted key (line %d)", name,
                                      a->line);
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
    if (!copy || hx_toml_node_push(r, node, &table, copy) != SELDP_OK) {
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
        seldp_status st = hx_toml_node_push(r, node, &e->value, e->path.parts[e->path.n - 1]);
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
        hx_toml_path_free(&r.entries[i].path);
        hx_toml_value_free(&r.entries[i].value);
    }
    free(r.entries);
    hx_json_free(root);
    return st;
}
