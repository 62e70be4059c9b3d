/* Layouts: generation (ep-dp, dp-ep), the layout file, validation, printing and splitting
 * the world into the groups (see layout.h). */
#include "layout.h"

#include <stdlib.h>
#include <string.h>

#include "json.h"

static void group_free(hx_group *g)
{
    free(g->ranks);
    g->ranks = NULL;
    g->size = 0;
}

void hx_layout_destroy(hx_layout *layout)
{
    if (!layout)
        return;
    group_free(&layout->shared);
    for (int i = 0; i < layout->n_ep; i++)
        group_free(&layout->ep[i]);
    for (int e = 0; e < layout->experts && layout->owners; e++)
        group_free(&layout->owners[e]);
    for (int i = 0; i < layout->n_data; i++)
        group_free(&layout->data[i]);
    free(layout->ep);
    free(layout->ep_of);
    free(layout->owners);
    free(layout->data);
    free(layout->data_of);
    free(layout->name);
    free(layout->description);
    seldp_layout_destroy(layout->grid);
    free(layout);
}

static seldp_status group_alloc(hx_group *g, int size)
{
    g->ranks = hx_calloc((size_t)(size > 0 ? size : 1), sizeof *g->ranks);
    g->size = size;
    g->root = -1;
    return g->ranks ? SELDP_OK : SELDP_ERR_NOMEM;
}

static int root_of(const hx_group *g, hx_roots roots, int index)
{
    switch (roots) {
    case HX_ROOTS_LAST:
        return g->ranks[g->size - 1];
    case HX_ROOTS_SPREAD:
        return g->ranks[index % g->size];
    case HX_ROOTS_FIRST:
    default:
        return g->ranks[0];
    }
}

static int compare_int(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

static seldp_status layout_new(int world, int experts, int n_ep, hx_layout **out)
{
    hx_layout *l = hx_calloc(1, sizeof *l);
    if (!l)
        return SELDP_ERR_NOMEM;
    l->world = world;
    l->experts = experts;
    l->n_ep = n_ep;
    l->ep = hx_calloc((size_t)n_ep, sizeof *l->ep);
    l->ep_of = hx_calloc((size_t)world, sizeof *l->ep_of);
    l->owners = hx_calloc((size_t)experts, sizeof *l->owners);
    if (!l->ep || !l->ep_of || !l->owners || group_alloc(&l->shared, world) != SELDP_OK) {
        hx_layout_destroy(l);
        return SELDP_ERR_NOMEM;
    }
    for (int r = 0; r < world; r++)
        l->shared.ranks[r] = r;
    *out = l;
    return SELDP_OK;
}

seldp_status hx_grid_build(const hx_grid *grid, int world, int ep, int experts, seldp_layout **out)
{
    seldp_layout_config cfg = SELDP_LAYOUT_CONFIG_INIT;
    cfg.framework = grid->framework;
    cfg.world = world;
    cfg.tp = grid->tp;
    cfg.pp = grid->pp;
    cfg.cp = grid->cp;
    cfg.ep = ep;
    cfg.etp = grid->etp;
    cfg.experts = experts;
    cfg.order = grid->order;
    if (seldp_layout_create(&cfg, out) != SELDP_OK) {
        char why[512];
        snprintf(why, sizeof why, "%s", seldp_last_error());
        return hx_fail(SELDP_ERR_INVALID_ARGUMENT, "layout %s", why);
    }
    return SELDP_OK;
}

static bool order_is_ep_dp(const char *order)
{
    return !order || strcmp(order, "ep-dp") == 0 || strcmp(order, "dp-ep") == 0;
}

seldp_status hx_layout_generate_grid(int world, int ep, int experts, const hx_grid *grid,
                                     hx_roots roots, hx_layout **out)
{
    seldp_status st = SELDP_OK;
    hx_layout *l = NULL;
    seldp_layout *sl = NULL;
    if (world < 1)
        return hx_fail(SELDP_ERR_INVALID_ARGUMENT, "--world %d: needs at least one rank", world);
    if (ep < 1 || world % ep != 0)
        return hx_fail(SELDP_ERR_INVALID_ARGUMENT, "--ep %d: must be >= 1 and divide --world %d",
                       ep, world);
    if (experts < 1 || experts % ep != 0)
        return hx_fail(SELDP_ERR_INVALID_ARGUMENT,
                       "--experts %d: must be a positive multiple of --ep %d", experts, ep);
    HX_CHECK(hx_grid_build(grid, world, ep, experts, &sl));
    seldp_layout_config c = seldp_layout_get_config(sl);
    int n_ep = seldp_layout_group_count(sl, SELDP_GROUP_EP);
    int local = experts / ep;
    HX_CHECK(layout_new(world, experts, n_ep, &l));
    for (int g = 0; g < n_ep; g++) {
        const int *ranks = NULL;
        int size = seldp_layout_group(sl, SELDP_GROUP_EP, g, &ranks);
        HX_CHECK(group_alloc(&l->ep[g], size));
        memcpy(l->ep[g].ranks, ranks, (size_t)size * sizeof *ranks);
    }
    /* EP position j holds experts j * E / ep ..: its ranks (ascending) own them, and form
     * their expert-data group (at TP = PP = 1 there is one per position; a sharded run
     * reduces over the grid's expert-data groups of each stage and ETP rank, grid.h) */
    for (int j = 0; j < ep; j++) {
        hx_group slot = {0};
        HX_CHECK(group_alloc(&slot, world / ep));
        int n = 0;
        for (int r = 0; r < world; r++)
            if (seldp_layout_position(sl, SELDP_GROUP_EP, r) == j && n < slot.size)
                slot.ranks[n++] = r;
        int root = root_of(&slot, roots, j);
        for (int k = 0; k < local && st == SELDP_OK; k++) {
            hx_group *o = &l->owners[j * local + k];
            st = group_alloc(o, slot.size);
            if (st == SELDP_OK) {
                memcpy(o->ranks, slot.ranks, (size_t)slot.size * sizeof *o->ranks);
                o->root = root;
            }
        }
        group_free(&slot);
        if (st != SELDP_OK)
            goto fail;
    }
    l->shared.root = root_of(&l->shared, roots, 0);
    char text[160];
    if (!grid->framework_given && order_is_ep_dp(grid->order))
        snprintf(text, sizeof text, "%s, world %d, ep %d", grid->order ? grid->order : "ep-dp",
                 world, ep);
    else
        snprintf(text, sizeof text, "%s %s, world %d, ep %d", seldp_framework_name(c.framework),
                 c.order ? c.order : "mesh", world, ep);
    /* the sizes beyond 1, as a reader of the table needs them */
    const int sizes[4] = {c.tp, c.pp, c.cp, c.etp};
    static const char *const names[4] = {"tp", "pp", "cp", "etp"};
    for (int k = 0; k < 4; k++)
        if (sizes[k] > 1 && strlen(text) + 16 < sizeof text)
            snprintf(text + strlen(text), sizeof text - strlen(text), ", %s %d", names[k],
                     sizes[k]);
    l->name = hx_strdup(text);
    l->description = hx_strdup(text);
    if (!l->name || !l->description)
        HX_FAIL(SELDP_ERR_NOMEM, "out of memory");
    l->grid = sl;
    sl = NULL;
    HX_CHECK(hx_layout_validate(l, "layout"));
    *out = l;
    return SELDP_OK;
fail:
    seldp_layout_destroy(sl);
    hx_layout_destroy(l);
    return st;
}

seldp_status hx_layout_generate(int world, int ep, int experts, hx_order order, hx_roots roots,
                                hx_layout **out)
{
    hx_grid grid = HX_GRID_INIT;
    grid.order = order == HX_ORDER_EP_DP ? "ep-dp" : "dp-ep";
    return hx_layout_generate_grid(world, ep, experts, &grid, roots, out);
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
    HX_CHECK(group_alloc(g, (int)v->count));
    for (size_t i = 0; i < v->count; i++) {
        HX_CHECK(read_rank(c, &v->items[i], field, &g->ranks[i]));
        for (size_t j = 0; j < i; j++)
            if (g->ranks[j] == g->ranks[i])
                HX_CHECK(at(c, &v->items[i], "%s: rank %d is listed twice", field, g->ranks[i]));
    }
    qsort(g->ranks, v->count, sizeof *g->ranks, compare_int);
    return SELDP_OK;
fail:
    group_free(g);
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
    HX_CHECK(layout_new(file_world, (int)j_experts->count, (int)j_ep->count, &l));
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
            o->root = root_of(o, roots, (int)e);
        }
    }
    if (j_root) {
        HX_CHECK(read_rank(&c, j_root, "shared_root", &l->shared.root));
    } else {
        l->shared.root = root_of(&l->shared, roots, 0);
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

/* ---- validation -------------------------------------------------------------------------- */

static bool same_group(const hx_group *a, const hx_group *b)
{
    return a->size == b->size && a->root == b->root &&
           memcmp(a->ranks, b->ranks, (size_t)a->size * sizeof *a->ranks) == 0;
}

seldp_status hx_layout_validate(hx_layout *l, const char *what)
{
    char ranks[256];
    if (l->world < 1 || l->experts < 1 || l->n_ep < 1)
        return hx_fail(SELDP_ERR_INVALID_ARGUMENT,
                       "%s: needs at least one rank, expert and "
                       "expert-parallel group",
                       what);
    if (l->shared.size != l->world)
        return hx_fail(SELDP_ERR_INVALID_ARGUMENT,
                       "%s: the shared group must hold the whole "
                       "world (the reference checks the gradient of the global loss)",
                       what);
    if (hx_group_rank(&l->shared, l->shared.root) < 0)
        return hx_fail(SELDP_ERR_INVALID_ARGUMENT,
                       "%s: shared root %d is not in the shared "
                       "group (0..%d)",
                       what, l->shared.root, l->world - 1);
    /* EP groups partition the world */
    int *seen = hx_calloc((size_t)l->world, sizeof *seen);
    if (!seen)
        return SELDP_ERR_NOMEM;
    for (int g = 0; g < l->n_ep; g++) {
        for (int i = 0; i < l->ep[g].size; i++) {
            int r = l->ep[g].ranks[i];
            if (r < 0 || r >= l->world) {
                free(seen);
                return hx_fail(SELDP_ERR_INVALID_ARGUMENT,
                               "%s: expert-parallel group %d: rank "
                               "%d is outside the world (0..%d)",
                               what, g, r, l->world - 1);
            }
            if (seen[r]++) {
                free(seen);
                return hx_fail(SELDP_ERR_INVALID_ARGUMENT,
                               "%s: rank %d is in two "
                               "expert-parallel groups",
                               what, r);
            }
            l->ep_of[r] = g;
        }
    }
    for (int r = 0; r < l->world; r++) {
        if (!seen[r]) {
            free(seen);
            return hx_fail(SELDP_ERR_INVALID_ARGUMENT,
                           "%s: rank %d is in no expert-parallel "
                           "group; the groups must cover the world (0..%d)",
                           what, r, l->world - 1);
        }
    }
    free(seen);
    /* every expert owned, in every EP group, root among its owners */
    for (int e = 0; e < l->experts; e++) {
        const hx_group *o = &l->owners[e];
        if (o->size < 1)
            return hx_fail(SELDP_ERR_INVALID_ARGUMENT, "%s: expert %d has no owner", what, e);
        for (int i = 0; i < o->size; i++)
            if (o->ranks[i] < 0 || o->ranks[i] >= l->world || (i && o->ranks[i] <= o->ranks[i - 1]))
                return hx_fail(SELDP_ERR_INVALID_ARGUMENT,
                               "%s: expert %d: owners must be "
                               "distinct ranks of the world",
                               what, e);
        hx_group_str(o, ranks, sizeof ranks);
        if (hx_group_rank(o, o->root) < 0)
            return hx_fail(SELDP_ERR_INVALID_ARGUMENT,
                           "%s: expert %d: root %d is not in its "
                           "group: the owners are %s",
                           what, e, o->root, ranks);
        for (int g = 0; g < l->n_ep; g++) {
            if (hx_layout_owners_in(l, e, g, NULL) == 0) {
                char ep[256];
                hx_group_str(&l->ep[g], ep, sizeof ep);
                return hx_fail(SELDP_ERR_INVALID_ARGUMENT,
                               "%s: expert %d (owners %s) has no "
                               "owner in expert-parallel group %d %s, whose tokens it could "
                               "not serve",
                               what, e, ranks, g, ep);
            }
        }
    }
    /* derived: distinct (owners, root) become the expert-data groups */
    for (int i = 0; i < l->n_data; i++)
        group_free(&l->data[i]);
    free(l->data);
    free(l->data_of);
    l->n_data = 0;
    l->data = hx_calloc((size_t)l->experts, sizeof *l->data);
    l->data_of = hx_calloc((size_t)l->experts, sizeof *l->data_of);
    if (!l->data || !l->data_of)
        return SELDP_ERR_NOMEM;
    for (int e = 0; e < l->experts; e++) {
        int d = 0;
        while (d < l->n_data && !same_group(&l->data[d], &l->owners[e]))
            d++;
        if (d == l->n_data) {
            if (group_alloc(&l->data[d], l->owners[e].size) != SELDP_OK)
                return SELDP_ERR_NOMEM;
            memcpy(l->data[d].ranks, l->owners[e].ranks, (size_t)l->owners[e].size * sizeof(int));
            l->data[d].root = l->owners[e].root;
            l->n_data++;
        }
        l->data_of[e] = d;
    }
    return SELDP_OK;
}

/* ---- queries ----------------------------------------------------------------------------- */

int hx_group_rank(const hx_group *group, int r)
{
    for (int i = 0; i < group->size; i++)
        if (group->ranks[i] == r)
            return i;
    return -1;
}

int hx_layout_owners_in(const hx_layout *l, int e, int g, int *out)
{
    int n = 0;
    const hx_group *o = &l->owners[e];
    for (int i = 0; i < o->size; i++) {
        if (l->ep_of[o->ranks[i]] == g) {
            if (out)
                out[n] = o->ranks[i];
            n++;
        }
    }
    return n;
}

bool hx_layout_owns(const hx_layout *l, int r, int e)
{
    return hx_group_rank(&l->owners[e], r) >= 0;
}

int hx_layout_owned(const hx_layout *l, int r, int *out)
{
    int n = 0;
    for (int e = 0; e < l->experts; e++)
        if (hx_layout_owns(l, r, e))
            out[n++] = e;
    return n;
}

/* ---- output ------------------------------------------------------------------------------ */

void hx_group_str(const hx_group *g, char *buf, size_t size)
{
    hx_buf b = {0};
    bool consecutive = g->size > 2;
    for (int i = 1; i < g->size && consecutive; i++)
        consecutive = g->ranks[i] == g->ranks[i - 1] + 1;
    if (consecutive) {
        hx_buf_printf(&b, "[%d-%d]", g->ranks[0], g->ranks[g->size - 1]);
    } else {
        hx_buf_puts(&b, "[");
        for (int i = 0; i < g->size; i++)
            hx_buf_printf(&b, "%s%d", i ? "," : "", g->ranks[i]);
        hx_buf_puts(&b, "]");
    }
    snprintf(buf, size, "%s", hx_buf_str(&b));
    hx_buf_free(&b);
}

static void json_ranks(hx_buf *b, const hx_group *g)
{
    hx_buf_puts(b, "[");
    for (int i = 0; i < g->size; i++)
        hx_buf_printf(b, "%s%d", i ? ", " : "", g->ranks[i]);
    hx_buf_puts(b, "]");
}

/* One kind's groups as a list of rank lists, from the grid. */
static void grid_kind_json(const seldp_layout *grid, seldp_group_kind kind, hx_buf *b)
{
    hx_buf_puts(b, "[");
    for (int g = 0; g < seldp_layout_group_count(grid, kind); g++) {
        const int *ranks = NULL;
        int size = seldp_layout_group(grid, kind, g, &ranks);
        hx_buf_puts(b, g ? ", [" : "[");
        for (int i = 0; i < size; i++)
            hx_buf_printf(b, "%s%d", i ? ", " : "", ranks[i]);
        hx_buf_puts(b, "]");
    }
    hx_buf_puts(b, "]");
}

/* Every rank alone: a parallelism of size 1. */
static void singletons_json(int world, hx_buf *b)
{
    hx_buf_puts(b, "[");
    for (int r = 0; r < world; r++)
        hx_buf_printf(b, "%s[%d]", r ? ", " : "", r);
    hx_buf_puts(b, "]");
}

/* The sizes and the groups of every kind (SPEC section 5.1). A layout file has no grid:
 * its groups are those of TP = PP = CP = 1, its EP and expert-data groups its own. */
static void layout_grid_json(const hx_layout *l, hx_buf *b)
{
    if (l->grid) {
        seldp_layout_config c = seldp_layout_get_config(l->grid);
        hx_buf_printf(b, ", \"framework\": \"%s\", \"order\": ", seldp_framework_name(c.framework));
        if (c.order)
            hx_buf_json_string(b, c.order);
        else
            hx_buf_puts(b, "null");
        hx_buf_printf(
            b, ", \"tp\": %d, \"pp\": %d, \"cp\": %d, \"ep\": %d, \"etp\": %d, \"groups\": {", c.tp,
            c.pp, c.cp, c.ep, c.etp);
        for (int k = 0; k < SELDP_GROUP_KINDS; k++) {
            hx_buf_printf(b, "%s\"%s\": ", k ? ", " : "",
                          seldp_group_kind_name((seldp_group_kind)k));
            grid_kind_json(l->grid, (seldp_group_kind)k, b);
        }
        hx_buf_puts(b, "}");
        return;
    }
    bool even = true;
    for (int g = 1; g < l->n_ep; g++)
        even = even && l->ep[g].size == l->ep[0].size;
    hx_buf_puts(
        b, ", \"framework\": null, \"order\": null, \"tp\": 1, \"pp\": 1, \"cp\": 1, \"ep\": ");
    if (even)
        hx_buf_printf(b, "%d", l->ep[0].size);
    else
        hx_buf_puts(b, "null");
    hx_buf_puts(b, ", \"etp\": 1, \"groups\": {\"tp\": ");
    singletons_json(l->world, b);
    hx_buf_puts(b, ", \"pp\": ");
    singletons_json(l->world, b);
    hx_buf_puts(b, ", \"cp\": ");
    singletons_json(l->world, b);
    hx_buf_puts(b, ", \"dp\": [");
    json_ranks(b, &l->shared);
    hx_buf_puts(b, "], \"ep\": [");
    for (int g = 0; g < l->n_ep; g++) {
        hx_buf_puts(b, g ? ", " : "");
        json_ranks(b, &l->ep[g]);
    }
    hx_buf_puts(b, "], \"expert_dp\": [");
    for (int d = 0; d < l->n_data; d++) {
        hx_buf_puts(b, d ? ", " : "");
        json_ranks(b, &l->data[d]);
    }
    hx_buf_puts(b, "], \"expert_tp\": ");
    singletons_json(l->world, b);
    hx_buf_puts(b, ", \"embedding\": ");
    singletons_json(l->world, b);
    hx_buf_puts(b, "}");
}

void hx_layout_json(const hx_layout *l, hx_buf *b)
{
    hx_buf_puts(b, "{\"description\": ");
    hx_buf_json_string(b, l->description ? l->description : "");
    hx_buf_printf(b, ", \"world\": %d, \"shared_root\": %d, \"ep_groups\": [", l->world,
                  l->shared.root);
    for (int g = 0; g < l->n_ep; g++) {
        hx_buf_puts(b, g ? ", " : "");
        json_ranks(b, &l->ep[g]);
    }
    hx_buf_puts(b, "], \"experts\": [");
    for (int e = 0; e < l->experts; e++) {
        hx_buf_puts(b, e ? ", " : "");
        hx_buf_puts(b, "{\"owners\": ");
        json_ranks(b, &l->owners[e]);
        hx_buf_printf(b, ", \"root\": %d}", l->owners[e].root);
    }
    hx_buf_puts(b, "]");
    layout_grid_json(l, b);
    hx_buf_puts(b, "}");
}

void hx_layout_print(const hx_layout *l, const char *const *device_names, FILE *out)
{
    char text[256], col[300];
    int *owned = hx_calloc((size_t)l->experts, sizeof *owned);
    if (!owned)
        return;
    fprintf(out, "layout: %s%s%s; %d EP groups, %d expert-data groups, * marks a root\n", l->name,
            strcmp(l->name, l->description) && l->description[0] ? ": " : "",
            strcmp(l->name, l->description) ? l->description : "", l->n_ep, l->n_data);
    fprintf(out, "  %4s  %-7s  %5s  %2s  %-10s  %-14s  %-30s  %s\n", "rank", "device", "stage",
            "tp", "shared", "EP group", "expert-data groups", "experts");
    for (int r = 0; r < l->world; r++) {
        hx_buf data = {0};
        for (int d = 0; d < l->n_data; d++) {
            if (hx_group_rank(&l->data[d], r) < 0)
                continue;
            hx_group_str(&l->data[d], text, sizeof text);
            hx_buf_printf(&data, "%sd%d %s%s", data.len ? "  " : "", d, text,
                          l->data[d].root == r ? "*" : "");
        }
        hx_buf experts = {0};
        int n = hx_layout_owned(l, r, owned);
        for (int i = 0; i < n; i++)
            hx_buf_printf(&experts, "%s%d", i ? "," : "", owned[i]);
        hx_group_str(&l->shared, text, sizeof text);
        char shared[300];
        snprintf(shared, sizeof shared, "%s%s", text, l->shared.root == r ? "*" : "");
        hx_group_str(&l->ep[l->ep_of[r]], text, sizeof text);
        snprintf(col, sizeof col, "e%d %s", l->ep_of[r], text);
        int stage = l->grid ? seldp_layout_stage(l->grid, r) : 0;
        int tp_rank = l->grid ? seldp_layout_position(l->grid, SELDP_GROUP_TP, r) : 0;
        fprintf(out, "  %4d  %-7s  %5d  %2d  %-10s  %-14s  %-30s  %s\n", r,
                device_names && device_names[r] ? device_names[r] : "host", stage, tp_rank, shared,
                col, data.len ? hx_buf_str(&data) : "-", n ? hx_buf_str(&experts) : "-");
        hx_buf_free(&data);
        hx_buf_free(&experts);
    }
    free(owned);
}

/* Group `g` of `kind` as "[0,4]" or "[0-7]", with "*" where `mark` is its root. */
static void grid_group_str(const seldp_layout *grid, seldp_group_kind kind, int g, int mark,
                           char *buf, size_t size)
{
    const int *ranks = NULL;
    int n = seldp_layout_group(grid, kind, g, &ranks);
    if (n == 0) {
        snprintf(buf, size, "-");
        return;
    }
    hx_group group = {n, (int *)ranks, ranks[0]};
    char text[256];
    hx_group_str(&group, text, sizeof text);
    snprintf(buf, size, "%s%s", text, mark == ranks[0] ? "*" : "");
}

void hx_grid_print(const seldp_layout *grid, FILE *out)
{
    seldp_layout_config c = seldp_layout_get_config(grid);
    fprintf(out,
            "layout: %s%s%s, world %d, tp %d, pp %d, cp %d, ep %d, etp %d (dp %d); each group "
            "broadcasts from its first rank (* in the table)\n",
            seldp_framework_name(c.framework), c.order ? " " : "", c.order ? c.order : "", c.world,
            c.tp, c.pp, c.cp, c.ep, c.etp, seldp_layout_dp(grid));
    char text[300];
    for (int k = 0; k < SELDP_GROUP_KINDS; k++) {
        seldp_group_kind kind = (seldp_group_kind)k;
        int n = seldp_layout_group_count(grid, kind);
        fprintf(out, "  %-10s %2d x %-2d", seldp_group_kind_name(kind), n,
                seldp_layout_group(grid, kind, 0, NULL));
        for (int g = 0; g < n; g++) {
            grid_group_str(grid, kind, g, -1, text, sizeof text);
            fprintf(out, " %s", text);
        }
        fputc('\n', out);
    }
    fprintf(out, "  %4s  %5s  %2s  %-14s  %-14s  %-14s  %-12s  %s\n", "rank", "stage", "tp",
            "dense (dp)", "EP group", "expert-data", "expert-TP", "experts");
    for (int r = 0; r < c.world; r++) {
        char dense[300], ep[300], edp[300], etp[300], experts[32] = "-";
        grid_group_str(grid, SELDP_GROUP_DP, seldp_layout_group_of(grid, SELDP_GROUP_DP, r), r,
                       dense, sizeof dense);
        grid_group_str(grid, SELDP_GROUP_EP, seldp_layout_group_of(grid, SELDP_GROUP_EP, r), -1, ep,
                       sizeof ep);
        grid_group_str(grid, SELDP_GROUP_EXPERT_DP,
                       seldp_layout_group_of(grid, SELDP_GROUP_EXPERT_DP, r), r, edp, sizeof edp);
        grid_group_str(grid, SELDP_GROUP_EXPERT_TP,
                       seldp_layout_group_of(grid, SELDP_GROUP_EXPERT_TP, r), -1, etp, sizeof etp);
        int first = 0, count = seldp_layout_local_experts(grid, r, &first);
        if (count == 1)
            snprintf(experts, sizeof experts, "%d", first);
        else if (count > 1)
            snprintf(experts, sizeof experts, "%d-%d", first, first + count - 1);
        fprintf(out, "  %4d  %5d  %2d  %-14s  %-14s  %-14s  %-12s  %s\n", r,
                seldp_layout_stage(grid, r), seldp_layout_position(grid, SELDP_GROUP_TP, r), dense,
                ep, edp, etp, experts);
    }
}

/* ---- communicators ----------------------------------------------------------------------- */

void hx_rank_comms_destroy(hx_rank_comms *c)
{
    for (int d = 0; d < c->n_data && c->data; d++)
        seldp_comm_destroy(c->data[d]);
    free(c->data);
    seldp_comm_destroy(c->ep);
    seldp_comm_destroy(c->shared);
    *c = (hx_rank_comms){0};
}

seldp_status hx_layout_split(const hx_layout *l, seldp_comm *world, hx_rank_comms *out)
{
    seldp_status st = SELDP_OK;
    hx_rank_comms c = {0};
    int r = seldp_comm_world_rank(world);
    c.data = hx_calloc((size_t)(l->n_data > 0 ? l->n_data : 1), sizeof *c.data);
    if (!c.data)
        return SELDP_ERR_NOMEM;
    c.n_data = l->n_data;
    HX_CHECK_LIB(seldp_comm_split(world, 0, hx_group_rank(&l->shared, r), &c.shared),
                 "rank %d: splitting the shared group", r);
    HX_CHECK_LIB(seldp_comm_split(world, l->ep_of[r], hx_group_rank(&l->ep[l->ep_of[r]], r), &c.ep),
                 "rank %d: splitting expert-parallel group %d", r, l->ep_of[r]);
    for (int d = 0; d < l->n_data; d++) {
        int key = hx_group_rank(&l->data[d], r);
        HX_CHECK_LIB(seldp_comm_split(world, key >= 0 ? 0 : SELDP_COMM_NO_GROUP, key, &c.data[d]),
                     "rank %d: splitting expert-data group %d", r, d);
    }
    *out = c;
    return SELDP_OK;
fail:
    hx_rank_comms_destroy(&c);
    return st;
}
