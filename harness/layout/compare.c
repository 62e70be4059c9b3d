/* --compare-groups: the groups file (see compare.h) and the rank-by-rank comparison. */
#include "compare.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json.h"
#include "util.h"

static const char *const kind_keys[HX_COMPARE_KINDS + 1] = {
    "tp", "pp", "cp", "dp", "ep", "expert_dp", "expert_tp", "embedding", "experts"};

const char *hx_compare_kind_name(int k)
{
    return k >= 0 && k <= HX_COMPARE_KINDS ? kind_keys[k] : "invalid";
}

void hx_groups_file_free(hx_groups_file *f)
{
    if (!f)
        return;
    for (int r = 0; f->ranks && r < f->world; r++)
        for (int k = 0; k <= HX_COMPARE_KINDS; k++)
            free(f->ranks[r].ranks[k]);
    free(f->ranks);
    free(f);
}

HX_PRINTF(3, 4) static seldp_status at(const char *what, const hx_json *v, const char *fmt, ...)
{
    char why[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    return hx_fail(SELDP_ERR_INVALID_ARGUMENT, "%s:%d:%d: %s", what, v->line, v->column, why);
}

static int compare_int(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

/* ranks[r].<kind>: null, or distinct integers in [0, limit). */
static seldp_status read_list(const char *what, const hx_json *v, const char *field, int limit,
                              int *size, int **out)
{
    if (v->type == HX_JSON_NULL) {
        *size = -1;
        return SELDP_OK;
    }
    if (v->type != HX_JSON_ARRAY)
        return at(what, v, "%s: expected an array of integers or null, found a %s", field,
                  hx_json_type_name(v->type));
    int *list = hx_calloc(v->count + 1, sizeof *list);
    if (!list)
        return SELDP_ERR_NOMEM;
    for (size_t i = 0; i < v->count; i++) {
        const hx_json *x = &v->items[i];
        if (x->type != HX_JSON_NUMBER || !x->is_integer || x->integer < 0 || x->integer >= limit) {
            free(list);
            return at(what, x, "%s[%zu]: expected an integer in 0..%d", field, i, limit - 1);
        }
        list[i] = (int)x->integer;
    }
    qsort(list, v->count, sizeof *list, compare_int);
    for (size_t i = 1; i < v->count; i++) {
        if (list[i] == list[i - 1]) {
            int twice = list[i];
            free(list);
            return at(what, v, "%s: %d is listed twice", field, twice);
        }
    }
    *size = (int)v->count;
    *out = list;
    return SELDP_OK;
}

static seldp_status read_rank(const char *what, const hx_json *e, size_t index, hx_groups_file *f,
                              bool *seen)
{
    char field[64];
    if (e->type != HX_JSON_OBJECT)
        return at(what, e,
                  "ranks[%zu]: expected an object {\"rank\": r, \"tp\": [...], ...}, found "
                  "a %s",
                  index, hx_json_type_name(e->type));
    const hx_json *rank = hx_json_get(e, "rank");
    if (!rank)
        return at(what, e, "ranks[%zu]: missing \"rank\"", index);
    if (rank->type != HX_JSON_NUMBER || !rank->is_integer || rank->integer < 0 ||
        rank->integer >= f->world)
        return at(what, rank, "ranks[%zu].rank: expected an integer in 0..%d", index, f->world - 1);
    int r = (int)rank->integer;
    hx_rank_groups *g = &f->ranks[r];
    if (seen[r])
        return at(what, rank, "ranks[%zu]: rank %d has two entries", index, r);
    seen[r] = true;
    for (size_t m = 0; m < e->count; m++) {
        const char *key = e->keys[m];
        if (strcmp(key, "rank") == 0)
            continue;
        int k = 0;
        while (k <= HX_COMPARE_KINDS && strcmp(kind_keys[k], key) != 0)
            k++;
        if (k > HX_COMPARE_KINDS) {
            char shown[128];
            return at(what, &e->items[m],
                      "ranks[%zu]: unknown member \"%s\" (allowed: rank, tp, pp, cp, dp, ep, "
                      "expert_dp, expert_tp, embedding, experts)",
                      index, hx_printable(key, shown, sizeof shown));
        }
        snprintf(field, sizeof field, "ranks[%zu].%s", index, key);
        if (g->listed[k])
            return at(what, &e->items[m], "%s: listed twice", field);
        seldp_status st =
            read_list(what, &e->items[m], field, k == HX_COMPARE_KINDS ? 1 << 20 : f->world,
                      &g->size[k], &g->ranks[k]);
        if (st != SELDP_OK)
            return st;
        g->listed[k] = true;
    }
    return SELDP_OK;
}

seldp_status hx_groups_file_parse(const char *text, size_t len, const char *what,
                                  hx_groups_file **out)
{
    seldp_status st = SELDP_OK;
    hx_json *doc = NULL;
    hx_groups_file *f = NULL;
    bool *seen = NULL;
    *out = NULL;
    HX_CHECK(hx_json_parse(text, len, what, &doc));
    if (doc->type != HX_JSON_OBJECT)
        HX_CHECK(at(what, doc, "expected an object with \"ranks\", found a %s",
                    hx_json_type_name(doc->type)));
    static const char *const top[] = {"format", "framework", "world", "ranks", "description"};
    for (size_t m = 0; m < doc->count; m++) {
        bool ok = false;
        for (size_t i = 0; i < sizeof top / sizeof top[0]; i++)
            ok = ok || strcmp(top[i], doc->keys[m]) == 0;
        if (!ok) {
            char shown[128];
            HX_CHECK(at(what, &doc->items[m],
                        "unknown member \"%s\" (allowed: format, framework, world, ranks, "
                        "description)",
                        hx_printable(doc->keys[m], shown, sizeof shown)));
        }
    }
    const hx_json *format = hx_json_get(doc, "format"), *framework = hx_json_get(doc, "framework");
    const hx_json *world = hx_json_get(doc, "world"), *ranks = hx_json_get(doc, "ranks");
    if (format && (format->type != HX_JSON_STRING || strcmp(format->string, "seldp-groups") != 0))
        HX_CHECK(at(what, format, "format: expected \"seldp-groups\""));
    if (framework && framework->type != HX_JSON_STRING && framework->type != HX_JSON_NULL)
        HX_CHECK(at(what, framework, "framework: expected a string or null"));
    if (!ranks)
        HX_CHECK(at(what, doc, "missing \"ranks\" (one entry per rank)"));
    if (ranks->type != HX_JSON_ARRAY || ranks->count == 0 || ranks->count > 1 << 20)
        HX_CHECK(at(what, ranks, "ranks: expected a non-empty array of per-rank objects"));
    if (world && (world->type != HX_JSON_NUMBER || !world->is_integer ||
                  world->integer != (int64_t)ranks->count))
        HX_CHECK(at(what, world, "world: expected the number of ranks entries, %zu", ranks->count));
    f = hx_calloc(1, sizeof *f);
    if (!f)
        HX_FAIL(SELDP_ERR_NOMEM, "out of memory");
    f->world = (int)ranks->count;
    snprintf(f->framework, sizeof f->framework, "%s",
             framework && framework->type == HX_JSON_STRING ? framework->string : "");
    f->ranks = hx_calloc((size_t)f->world, sizeof *f->ranks);
    if (!f->ranks)
        HX_FAIL(SELDP_ERR_NOMEM, "out of memory");
    seen = hx_calloc((size_t)f->world, sizeof *seen);
    if (!seen)
        HX_FAIL(SELDP_ERR_NOMEM, "out of memory");
    /* every entry has a distinct rank in 0..world-1, so every rank has one */
    for (size_t i = 0; i < ranks->count; i++)
        HX_CHECK(read_rank(what, &ranks->items[i], i, f, seen));
    *out = f;
    f = NULL;
fail:
    free(seen);
    hx_json_free(doc);
    hx_groups_file_free(f);
    return st;
}

/* ---- the comparison ---------------------------------------------------------------------- */

static void list_text(const int *ranks, int n, char *buf, size_t size)
{
    if (n < 0) {
        snprintf(buf, size, "none");
        return;
    }
    size_t at_ = (size_t)snprintf(buf, size, "[");
    for (int i = 0; i < n && at_ < size; i++)
        at_ += (size_t)snprintf(buf + at_, size - at_, "%s%d", i ? ", " : "", ranks[i]);
    if (at_ < size)
        snprintf(buf + at_, size - at_, "]");
}

static bool same(const int *a, int na, const int *b, int nb)
{
    return na == nb && (na <= 0 || memcmp(a, b, (size_t)na * sizeof *a) == 0);
}

/* Does the file's group (want, n) match the layout's group of kind k for rank r? `have` gets
 * the layout's (the first candidate where several could match). */
static bool matches(const hx_layout *l, int r, int k, const int *want, int n, int *have,
                    int *n_have)
{
    const seldp_layout *g = l->grid;
    if (k == HX_COMPARE_KINDS) {
        *n_have = hx_layout_owned(l, r, have);
        return same(have, *n_have, want, n);
    }
    if (g) {
        int index = seldp_layout_group_of(g, (seldp_group_kind)k, r);
        const int *ranks = NULL;
        *n_have = index < 0 ? -1 : seldp_layout_group(g, (seldp_group_kind)k, index, &ranks);
        if (*n_have > 0)
            memcpy(have, ranks, (size_t)*n_have * sizeof *have);
        return same(have, *n_have, want, n);
    }
    /* a layout file without the grid: TP = PP = CP = ETP = 1 */
    const hx_group *group = NULL;
    switch (k) {
    case 3:
        group = &l->shared;
        break;
    case 4:
        group = &l->ep[l->ep_of[r]];
        break;
    case 5: /* uneven layouts: a rank may be in several expert-data groups */
        *n_have = -1;
        for (int d = 0; d < l->n_data; d++) {
            if (hx_group_rank(&l->data[d], r) < 0)
                continue;
            if (*n_have < 0 || same(l->data[d].ranks, l->data[d].size, want, n)) {
                *n_have = l->data[d].size;
                memcpy(have, l->data[d].ranks, (size_t)*n_have * sizeof *have);
            }
        }
        return same(have, *n_have, want, n);
    default:
        *n_have = 1;
        have[0] = r;
        return same(have, 1, want, n);
    }
    *n_have = group->size;
    memcpy(have, group->ranks, (size_t)group->size * sizeof *have);
    return same(have, *n_have, want, n);
}

bool hx_groups_compare(const hx_layout *l, const hx_groups_file *f, char *msg, size_t size)
{
    if (f->world != l->world) {
        snprintf(msg, size, "world: the run had %d ranks, the layout has %d", f->world, l->world);
        return false;
    }
    int n_max = l->world > l->experts ? l->world : l->experts;
    int *have = hx_calloc((size_t)n_max + 1, sizeof *have);
    if (!have) {
        snprintf(msg, size, "out of memory");
        return false;
    }
    bool equal = true;
    for (int r = 0; r < l->world && equal; r++) {
        const hx_rank_groups *g = &f->ranks[r];
        for (int k = 0; k <= HX_COMPARE_KINDS && equal; k++) {
            if (!g->listed[k])
                continue;
            int n_have = 0;
            if (matches(l, r, k, g->ranks[k], g->size[k], have, &n_have))
                continue;
            char built[512], layout[512];
            list_text(g->ranks[k], g->size[k], built, sizeof built);
            list_text(have, n_have, layout, sizeof layout);
            snprintf(msg, size, "rank %d, %s: the run built %s, the layout has %s", r, kind_keys[k],
                     built, layout);
            equal = false;
        }
    }
    free(have);
    return equal;
}
