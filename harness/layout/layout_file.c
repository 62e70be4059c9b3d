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
        if (!ok) {
            char shown[128];
            return at(c, &obj->items[i], "%s: unknown member \"%s\" (allowed: %s)", where,
                      hx_printable(obj->keys[i], shown, sizeof shown), allowed_text);
        }
    }
    return SELDP_OK;
}

/* "roots": the rule for the roots no member names ("first", "last", "spread"; null or absent:
 * the caller's). */
static seldp_status read_roots(const file_ctx *c, const hx_json *doc, hx_roots *roots, bool *named)
{
    static const char *const words[] = {"first", "last", "spread"};
    static const hx_roots rules[] = {HX_ROOTS_FIRST, HX_ROOTS_LAST, HX_ROOTS_SPREAD};
    const hx_json *v = hx_json_get(doc, "roots");
    *named = false;
    if (!v || v->type == HX_JSON_NULL)
        return SELDP_OK;
    for (int i = 0; i < 3 && v->type == HX_JSON_STRING; i++) {
        if (strcmp(v->string, words[i]) == 0) {
            *roots = rules[i];
            *named = true;
            return SELDP_OK;
        }
    }
    return at(c, v, "roots: expected \"first\", \"last\", \"spread\" or null");
}

/* ---- the full grid ----------------------------------------------------------------------- */

/* The size member `key` of the document, 1 where absent. */
static seldp_status read_size(const file_ctx *c, const hx_json *doc, const char *key, int *out)
{
    const hx_json *v = hx_json_get(doc, key);
    *out = 1;
    if (!v)
        return SELDP_OK;
    if (v->type != HX_JSON_NUMBER || !v->is_integer || v->integer < 1 || v->integer > 1 << 20)
        return at(c, v, "%s: expected a positive integer (a parallel size)", key);
    *out = (int)v->integer;
    return SELDP_OK;
}

/* "framework" and "order": labels the layout carries (null or absent: none). */
static seldp_status read_label(const file_ctx *c, const hx_json *doc, seldp_layout_groups *g)
{
    const hx_json *f = hx_json_get(doc, "framework"), *o = hx_json_get(doc, "order");
    if (f && f->type != HX_JSON_NULL &&
        (f->type != HX_JSON_STRING ||
         (strcmp(f->string, "none") != 0 && seldp_framework_parse(f->string, &g->framework))))
        return at(c, f,
                  "framework: expected null, \"none\", \"megatron\", \"megatron-0.9\", "
                  "\"deepspeed\" or \"torchtitan\"");
    if (o && o->type != HX_JSON_NULL && o->type != HX_JSON_STRING)
        return at(c, o, "order: expected a string or null, found a %s", hx_json_type_name(o->type));
    g->order = o && o->type == HX_JSON_STRING ? o->string : NULL;
    return SELDP_OK;
}

/* groups.<kind>: a non-empty array of rank arrays of one size, into *flat (NULL for an absent
 * embedding: derived from the pipeline groups). */
static seldp_status read_kind(const file_ctx *c, const hx_json *groups, seldp_group_kind kind,
                              seldp_layout_groups *g, int **flat)
{
    seldp_status st = SELDP_OK;
    const char *name = seldp_group_kind_name(kind);
    const hx_json *v = hx_json_get(groups, name);
    hx_group one = {0};
    char field[64];
    if (!v && kind == SELDP_GROUP_EMBEDDING)
        return SELDP_OK;
    if (!v)
        return at(c, groups, "groups: missing \"%s\" (a list of rank lists)", name);
    if (v->type != HX_JSON_ARRAY || v->count == 0)
        return at(c, v, "groups.%s: expected a non-empty array of rank arrays, found a%s %s", name,
                  v->type == HX_JSON_ARRAY ? "n empty" : "", hx_json_type_name(v->type));
    for (size_t i = 0; i < v->count; i++) {
        snprintf(field, sizeof field, "groups.%s[%zu]", name, i);
        HX_CHECK(read_rank_list(c, &v->items[i], field, &one));
        if (i == 0) {
            g->size[kind] = one.size;
            *flat = hx_calloc(v->count * (size_t)one.size, sizeof **flat);
            if (!*flat)
                HX_FAIL(SELDP_ERR_NOMEM, "out of memory");
        } else if (one.size != g->size[kind]) {
            HX_CHECK(at(c, &v->items[i],
                        "%s: %d ranks where groups.%s[0] has %d: the groups of a kind have one "
                        "size",
                        field, one.size, name, g->size[kind]));
        }
        memcpy(*flat + i * (size_t)one.size, one.ranks, (size_t)one.size * sizeof *one.ranks);
        hx_group_free(&one);
    }
    g->count[kind] = (int)v->count;
    g->groups[kind] = *flat;
    return SELDP_OK;
fail:
    hx_group_free(&one);
    return st;
}

/* ep_groups, when given, repeat the grid's EP groups. */
static seldp_status check_ep_groups(const file_ctx *c, const hx_json *v, const hx_layout *l)
{
    seldp_status st = SELDP_OK;
    hx_group one = {0};
    char field[48], text[256];
    if (v->type != HX_JSON_ARRAY || (int)v->count != l->n_ep)
        return at(c, v, "ep_groups: expected the %d groups of groups.ep (or no ep_groups)",
                  l->n_ep);
    for (size_t i = 0; i < v->count; i++) {
        snprintf(field, sizeof field, "ep_groups[%zu]", i);
        HX_CHECK(read_rank_list(c, &v->items[i], field, &one));
        const hx_group *want = &l->ep[seldp_layout_group_of(l->grid, SELDP_GROUP_EP, one.ranks[0])];
        if (want->size != one.size ||
            memcmp(want->ranks, one.ranks, (size_t)one.size * sizeof *one.ranks) != 0) {
            hx_group_str(want, text, sizeof text);
            HX_CHECK(at(c, &v->items[i], "%s: not an EP group of groups.ep (rank %d's is %s)",
                        field, one.ranks[0], text));
        }
        hx_group_free(&one);
    }
fail:
    hx_group_free(&one);
    return st;
}

/* experts[e]: owners, when given, are the ranks of the expert's EP position; a root among
 * them. */
static seldp_status read_grid_experts(const file_ctx *c, const hx_json *v, hx_layout *l)
{
    seldp_status st = SELDP_OK;
    hx_group one = {0};
    static const char *const expert_keys[] = {"owners", "root", NULL};
    for (size_t e = 0; e < v->count; e++) {
        const hx_json *x = &v->items[e];
        char field[48], sub[64], text[256], mine[256];
        snprintf(field, sizeof field, "experts[%zu]", e);
        if (x->type != HX_JSON_OBJECT)
            return at(c, x, "%s: expected {\"owners\": [...], \"root\": r}, found a %s", field,
                      hx_json_type_name(x->type));
        HX_CHECK(check_keys(c, x, field, expert_keys, "owners, root"));
        hx_group *o = &l->owners[e];
        const hx_json *owners = hx_json_get(x, "owners"), *root = hx_json_get(x, "root");
        if (owners) {
            snprintf(sub, sizeof sub, "%s.owners", field);
            HX_CHECK(read_rank_list(c, owners, sub, &one));
            if (one.size != o->size ||
                memcmp(one.ranks, o->ranks, (size_t)o->size * sizeof *o->ranks) != 0) {
                hx_group_str(&one, mine, sizeof mine);
                hx_group_str(o, text, sizeof text);
                HX_CHECK(at(c, owners,
                            "%s: %s, but on a grid of tp, pp, cp or etp above 1 expert %zu is "
                            "owned by the ranks of EP position %zu, %s (uneven or redundant "
                            "owners need tp = pp = cp = etp = 1)",
                            sub, mine, e,
                            e / (size_t)(l->experts / seldp_layout_get_config(l->grid).ep), text));
            }
            hx_group_free(&one);
        }
        if (root) {
            snprintf(sub, sizeof sub, "%s.root", field);
            HX_CHECK(read_rank(c, root, sub, &o->root));
            if (hx_group_rank(o, o->root) < 0) {
                hx_group_str(o, text, sizeof text);
                return at(c, root, "%s: root %d is not in its group: the owners are %s", sub,
                          o->root, text);
            }
        }
    }
fail:
    hx_group_free(&one);
    return st;
}

/* A layout file of the whole grid: the sizes, "groups" of every kind (the form of
 * report.json's layout), experts owned by EP position. */
static seldp_status parse_grid(file_ctx *c, const hx_json *doc, int world, int experts,
                               hx_roots roots, hx_layout **out)
{
    seldp_status st = SELDP_OK;
    hx_layout *l = NULL;
    seldp_layout *sl = NULL;
    int *flat[SELDP_GROUP_KINDS] = {0};
    seldp_layout_groups g = SELDP_LAYOUT_GROUPS_INIT;
    const hx_json *j_groups = hx_json_get(doc, "groups"), *j_world = hx_json_get(doc, "world");
    const hx_json *j_experts = hx_json_get(doc, "experts"),
                  *j_desc = hx_json_get(doc, "description");
    const hx_json *j_root = hx_json_get(doc, "shared_root"), *j_ep = hx_json_get(doc, "ep");
    const hx_json *j_ep_groups = hx_json_get(doc, "ep_groups");
    if (!j_groups)
        HX_CHECK(at(c, doc,
                    "missing \"groups\": with tp, pp, cp or etp above 1 the file lists the groups "
                    "of every kind (tp, pp, cp, dp, ep, expert_dp, expert_tp, embedding)"));
    if (j_groups->type != HX_JSON_OBJECT)
        HX_CHECK(at(c, j_groups, "groups: expected an object of rank-list arrays, found a %s",
                    hx_json_type_name(j_groups->type)));
    static const char *const kinds[] = {"tp",        "pp",        "cp",        "dp", "ep",
                                        "expert_dp", "expert_tp", "embedding", NULL};
    HX_CHECK(check_keys(c, j_groups, "groups", kinds,
                        "tp, pp, cp, dp, ep, expert_dp, expert_tp, embedding"));
    if (!j_experts)
        HX_CHECK(at(c, doc, "missing \"experts\" (one entry per expert)"));
    if (j_experts->type != HX_JSON_ARRAY || j_experts->count == 0)
        HX_CHECK(at(c, j_experts, "experts: expected a non-empty array of {\"owners\": [...]}"));
    if (j_desc && j_desc->type != HX_JSON_STRING)
        HX_CHECK(at(c, j_desc, "description: expected a string"));
    HX_CHECK(read_size(c, doc, "tp", &g.tp));
    HX_CHECK(read_size(c, doc, "pp", &g.pp));
    HX_CHECK(read_size(c, doc, "cp", &g.cp));
    HX_CHECK(read_size(c, doc, "etp", &g.etp));
    HX_CHECK(read_label(c, doc, &g));

    /* the world: given, or the ranks of the TP groups */
    const hx_json *j_tp = hx_json_get(j_groups, "tp");
    int file_world = 0;
    for (size_t i = 0; j_tp && j_tp->type == HX_JSON_ARRAY && i < j_tp->count; i++)
        if (j_tp->items[i].type == HX_JSON_ARRAY)
            file_world += (int)j_tp->items[i].count;
    if (j_world) {
        if (j_world->type != HX_JSON_NUMBER || !j_world->is_integer || j_world->integer < 1 ||
            j_world->integer > 1 << 20)
            HX_CHECK(at(c, j_world, "world: expected a positive integer"));
        file_world = (int)j_world->integer;
    }
    if (file_world < 1)
        HX_CHECK(at(c, j_groups, "groups.tp: expected the TP groups, which give the world"));
    if (world > 0 && file_world != world)
        HX_CHECK(at(c, j_world ? j_world : j_groups,
                    "the layout is for a world of %d ranks but --world is %d", file_world, world));
    if (experts > 0 && (int)j_experts->count != experts)
        HX_CHECK(at(c, j_experts, "experts: lists %zu experts but the model has %d (--experts)",
                    j_experts->count, experts));
    c->world = g.world = file_world;
    g.experts = (int)j_experts->count;
    for (int k = 0; k < SELDP_GROUP_KINDS; k++)
        HX_CHECK(read_kind(c, j_groups, (seldp_group_kind)k, &g, &flat[k]));
    g.ep = g.size[SELDP_GROUP_EP];
    if (j_ep && j_ep->type != HX_JSON_NULL) {
        HX_CHECK(read_size(c, doc, "ep", &g.ep));
        if (g.ep != g.size[SELDP_GROUP_EP])
            HX_CHECK(at(c, j_ep, "ep: %d, but the groups of groups.ep have %d ranks", g.ep,
                        g.size[SELDP_GROUP_EP]));
    }
    if (g.experts % g.ep != 0)
        HX_CHECK(at(c, j_experts,
                    "experts: lists %d experts, expected a multiple of ep %d (each EP position "
                    "owns experts / ep)",
                    g.experts, g.ep));
    if (seldp_layout_create_from_groups(&g, &sl) != SELDP_OK) {
        char why[512];
        snprintf(why, sizeof why, "%s", seldp_last_error());
        HX_CHECK(at(c, j_groups, "groups: %s", why));
    }
    st = hx_layout_from_grid(sl, roots, &l);
    sl = NULL;
    if (st != SELDP_OK)
        goto fail;
    if (j_ep_groups)
        HX_CHECK(check_ep_groups(c, j_ep_groups, l));
    HX_CHECK(read_grid_experts(c, j_experts, l));
    if (j_root)
        HX_CHECK(read_rank(c, j_root, "shared_root", &l->shared.root));
    const char *base = strrchr(c->what, '/');
    l->name = hx_strdup(base ? base + 1 : c->what);
    l->description = hx_strdup(j_desc ? j_desc->string : "");
    if (!l->name || !l->description)
        HX_FAIL(SELDP_ERR_NOMEM, "out of memory");
    HX_CHECK(hx_layout_validate(l, c->what));
    *out = l;
    l = NULL;
fail:
    for (int k = 0; k < SELDP_GROUP_KINDS; k++)
        free(flat[k]);
    hx_layout_destroy(l);
    return st;
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
        "description", "world", "shared_root", "ep_groups", "experts", "framework", "order", "tp",
        "pp",          "cp",    "ep",          "etp",       "groups",  "roots",     NULL};
    HX_CHECK(check_keys(&c, doc, "layout", top_keys,
                        "description, world, shared_root, ep_groups, experts, framework, order, "
                        "tp, pp, cp, ep, etp, groups, roots"));
    bool named = false;
    HX_CHECK(read_roots(&c, doc, &roots, &named));
    /* the sizes report.json records: beyond 1, the groups of every kind describe the grid; so
     * they do for a framework's layout (--print-layout --json) of any sizes, whose labels and
     * group names then read back as they were written */
    static const char *const grid_sizes[] = {"tp", "pp", "cp", "etp"};
    const hx_json *label = hx_json_get(doc, "framework");
    bool grid = label && label->type == HX_JSON_STRING && strcmp(label->string, "none") != 0 &&
                hx_json_get(doc, "groups");
    for (size_t i = 0; i < sizeof grid_sizes / sizeof grid_sizes[0]; i++) {
        int size = 1;
        HX_CHECK(read_size(&c, doc, grid_sizes[i], &size));
        grid = grid || size > 1;
    }
    if (grid) {
        HX_CHECK(parse_grid(&c, doc, world, experts, roots, &l));
        l->roots = roots;
        l->roots_named = named;
        hx_json_free(doc);
        *out = l;
        return SELDP_OK;
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
    l->roots = roots;
    l->roots_named = named;
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
