/* The layout file: JSON listing groups and expert ownership (see layout.h). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json.h"
#include "layout_impl.h"

static int compare_int(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

/* ---- the layout file --------------------------------------------------------------------- */

typedef struct file_ctx {
    const char *what;
    int world; /* 0 until known */
} file_ctx;

HX_PRINTF(3, 4) static seldp_status at(const file_ctx *c, const hx_json *v, const char *fmt, ...)
{
    char why[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    return hx_fail(SELDP_ERR_INVALID_ARGUMENT, "%s:%d:%d: %s", c->what, v->line, v->column, why);
}

static seldp_status read_rank(const file_ctx *c, const hx_json *v, const char *field, int *out)
{
    if (v->type != HX_JSON_NUMBER || !v->is_integer)
        return at(c, v, "%s: expected a rank (an integer), found a %s", field,
                  hx_json_type_name(v->type));
    if (v->integer < 0 || v->integer >= c->world)
        return at(c, v, "%s: rank %lld is outside the world (0..%d)", field, (long long)v->integer,
                  c->world - 1);
    *out = (int)v->integer;
    return SELDP_OK;
}

/* A non-empty array of distinct ranks into g (sorted ascending). */
static seldp_status read_rank_list(const file_ctx *c, const hx_json *v, const char *field,
                                   hx_group *g)
{
    seldp_status st = SELDP_OK;
    if (v->type != HX_JSON_ARRAY)
        return at(c, v, "%s: expected an array of ranks, found a %s", field,
                  hx_json_type_name(v->type));
    if (v->count == 0)
        return at(c, v, "%s: is empty", field);
    HX_CHECK(hx_group_alloc(g, (int)v->count));
    for (size_t i = 0; i < v->count; i++) {
        HX_CHECK(read_rank(c, &v->items[i], field, &g->ranks[i]));
        for (size_t j = 0; j < i; j++)
            if (g->ranks[j] == g->ranks[i])
                HX_CHECK(at(c, &v->items[i], "%s: rank %d is listed twice", field, g->ranks[i]));
    }
    qsort(g->ranks, v->count, sizeof *g->ranks, compare_int);
    return SELDP_OK;
fail:
    hx_group_free(g);
    return st;
}

static seldp_status check_keys(const file_ctx *c, const hx_json *obj, const char *where,
                               const char *const *allowed, const char *allowed_text)
{
    for (size_t i = 0; i < obj->count; i++) {
        bool ok = false;
        for (const char *const *a = allowed; *a; a++)
            ok = ok || strcmp(*a, obj->keys[i]) == 0;
        if (!ok)
            return at(c, &obj->items[i], "%s: unknown member \"%s\" (allowed: %s)", where,
                      obj->keys[i], allowed_text);
    }
    return SELDP_OK;
}

seldp_status hx_layout_parse(const char *text, size_t len, const char *what, int world, int experts,
                             hx_roots roots, hx_layout **out)
{
    seldp_status st = SELDP_OK;
    hx_json *doc = NULL;
    hx_layout *l = NULL;
    file_ctx c = {what, 0};
    HX_CHECK(hx_json_parse(text, len, what, &doc));
    if (doc->type != HX_JSON_OBJECT)
        HX_CHECK(at(&c, doc, "expected an object with ep_groups and experts, found a %s",
                    hx_json_type_name(doc->type)));
    static const char *const top_keys[] = {
        "description", "world", "shared_root", "ep_groups", "experts", "framework", "order",
        "tp",          "pp",    "cp",          "ep",        "etp",     "groups",    NULL};
    HX_CHECK(check_keys(&c, doc, "layout", top_keys,
                        "description, world, shared_root, ep_groups, experts, framework, order, "
                        "tp, pp, cp, ep, etp, groups"));
    /* the sizes report.json records: a layout file trains at TP = PP = CP = expert-TP = 1 */
    static const char *const unit_sizes[] = {"tp", "pp", "cp", "etp"};
    for (size_t i = 0; i < sizeof unit_sizes / sizeof unit_sizes[0]; i++) {
        const hx_json *v = hx_json_get(doc, unit_sizes[i]);
        if (v && (v->type != HX_JSON_NUMBER || !v->is_integer || v->integer != 1))
            HX_CHECK(at(&c, v,
                        "%s: a layout file describes groups at tp = pp = cp = etp = 1 (a larger "
                        "grid trains from --framework and its sizes)",
                        unit_sizes[i]));
    }
    const hx_json *j_desc = hx_json_get(doc, "description");
    const hx_json *j_world = hx_json_get(doc, "world");
    const hx_json *j_root = hx_json_get(doc, "shared_root");
    const hx_json *j_ep = hx_json_get(doc, "ep_groups");
    const hx_json *j_experts = hx_json_get(doc, "experts");
    if (!j_ep)
        HX_CHECK(at(&c, doc, "missing \"ep_groups\" (the expert-parallel groups)"));
    if (!j_experts)
        HX_CHECK(at(&c, doc, "missing \"experts\" (the owners of each expert)"));
    if (j_desc && j_desc->type != HX_JSON_STRING)
        HX_CHECK(at(&c, j_desc, "description: expected a string"));
    if (j_ep->type != HX_JSON_ARRAY || j_ep->count == 0)
        HX_CHECK(at(&c, j_ep, "ep_groups: expected a non-empty array of rank arrays"));
    if (j_experts->type != HX_JSON_ARRAY || j_experts->count == 0)
        HX_CHECK(at(&c, j_experts, "experts: expected a non-empty array of {\"owners\": [...]}"));

    /* the world: given, or the number of ranks the EP groups list */
    int file_world = 0;
    for (size_t g = 0; g < j_ep->count; g++)
        if (j_ep->items[g].type == HX_JSON_ARRAY)
            file_world += (int)j_ep->items[g].count;
    if (j_world) {
        if (j_world->type != HX_JSON_NUMBER || !j_world->is_integer || j_world->integer < 1 ||
            j_world->integer > 1 << 20)
            HX_CHECK(at(&c, j_world, "world: expected a positive integer"));
        file_world = (int)j_world->integer;
    }
    if (world > 0 && file_world != world)
        HX_CHECK(at(&c, j_world ? j_world : j_ep,
                    "the layout is for a world of %d ranks but --world is %d", file_world, world));
    if (experts > 0 && (int)j_experts->count != experts)
        HX_CHECK(at(&c, j_experts, "experts: lists %zu experts but the model has %d (--experts)",
                    j_experts->count, experts));
    c.world = file_world;
    HX_CHECK(hx_layout_new(file_world, (int)j_experts->count, (int)j_ep->count, &l));
    for (int r = 0; r < l->world; r++)
        l->ep_of[r] = -1;

    for (size_t g = 0; g < j_ep->count; g++) {
        char field[48];
        snprintf(field, sizeof field, "ep_groups[%zu]", g);
        HX_CHECK(read_rank_list(&c, &j_ep->items[g], field, &l->ep[g]));
        for (int i = 0; i < l->ep[g].size; i++) {
            int r = l->ep[g].ranks[i];
            if (l->ep_of[r] >= 0)
                HX_CHECK(at(&c, &j_ep->items[g],
                            "%s: rank %d is already in ep_groups[%d]; the expert-parallel "
                            "groups must partition the world",
                            field, r, l->ep_of[r]));
            l->ep_of[r] = (int)g;
        }
    }

    static const char *const expert_keys[] = {"owners", "root", NULL};
    for (size_t e = 0; e < j_experts->count; e++) {
        const hx_json *x = &j_experts->items[e];
        char field[48];
        snprintf(field, sizeof field, "experts[%zu]", e);
        if (x->type != HX_JSON_OBJECT)
            HX_CHECK(at(&c, x, "%s: expected {\"owners\": [...], \"root\": r}, found a %s", field,
                        hx_json_type_name(x->type)));
        HX_CHECK(check_keys(&c, x, field, expert_keys, "owners, root"));
        const hx_json *owners = hx_json_get(x, "owners");
        if (!owners)
            HX_CHECK(at(&c, x, "%s: missing \"owners\" (every expert needs at least one)", field));
        char owners_field[64];
        snprintf(owners_field, sizeof owners_field, "%s.owners", field);
        HX_CHECK(read_rank_list(&c, owners, owners_field, &l->owners[e]));
        hx_group *o = &l->owners[e];
        const hx_json *root = hx_json_get(x, "root");
        if (root) {
            char root_field[64];
            snprintf(root_field, sizeof root_field, "%s.root", field);
            HX_CHECK(read_rank(&c, root, root_field, &o->root));
            if (hx_group_rank(o, o->root) < 0) {
                char ranks[256];
                hx_group_str(o, ranks, sizeof ranks);
                HX_CHECK(at(&c, root, "%s: root %d is not in its group: the owners are %s",
                            root_field, o->root, ranks));
            }
        } else {
            o->root = hx_group_root_of(o, roots, (int)e);
        }
    }
    if (j_root) {
        HX_CHECK(read_rank(&c, j_root, "shared_root", &l->shared.root));
    } else {
        l->shared.root = hx_group_root_of(&l->shared, roots, 0);
    }
    const char *base = strrchr(what, '/');
    l->name = hx_strdup(base ? base + 1 : what);
    l->description = hx_strdup(j_desc ? j_desc->string : "");
    if (!l->name || !l->description)
        HX_FAIL(SELDP_ERR_NOMEM, "out of memory");
    HX_CHECK(hx_layout_validate(l, what));
    hx_json_free(doc);
    *out = l;
    return SELDP_OK;
fail:
    hx_json_free(doc);
    hx_layout_destroy(l);
    return st;
}

seldp_status hx_layout_load(const char *path, int world, int experts, hx_roots roots,
                            hx_layout **out)
{
    char *text = NULL;
    size_t len = 0;
    seldp_status st = hx_read_file(path, &text, &len);
    if (st != SELDP_OK) {
        char why[512];
        snprintf(why, sizeof why, "%s", hx_last_error());
        return hx_fail(SELDP_ERR_INVALID_ARGUMENT, "--layout-file %s", why);
    }
    st = hx_layout_parse(text, len, path, world, experts, roots, out);
    free(text);
    return st;
}
