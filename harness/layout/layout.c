/* Layouts: generation (ep-dp, dp-ep), the layout file, validation, printing and splitting
 * the world into the groups (see layout.h). */
#include "layout.h"

#include <stdlib.h>
#include <string.h>

#include "json.h"
#include "layout_impl.h"

void hx_group_free(hx_group *g)
{
    free(g->ranks);
    g->ranks = NULL;
    g->size = 0;
}

void hx_layout_destroy(hx_layout *layout)
{
    if (!layout)
        return;
    hx_group_free(&layout->shared);
    for (int i = 0; i < layout->n_ep; i++)
        hx_group_free(&layout->ep[i]);
    for (int e = 0; e < layout->experts && layout->owners; e++)
        hx_group_free(&layout->owners[e]);
    for (int i = 0; i < layout->n_data; i++)
        hx_group_free(&layout->data[i]);
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

seldp_status hx_group_alloc(hx_group *g, int size)
{
    g->ranks = hx_calloc((size_t)(size > 0 ? size : 1), sizeof *g->ranks);
    g->size = size;
    g->root = -1;
    return g->ranks ? SELDP_OK : SELDP_ERR_NOMEM;
}

int hx_group_root_of(const hx_group *g, hx_roots roots, int index)
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

seldp_status hx_layout_new(int world, int experts, int n_ep, hx_layout **out)
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
    if (!l->ep || !l->ep_of || !l->owners || hx_group_alloc(&l->shared, world) != SELDP_OK) {
        hx_layout_destroy(l);
        return SELDP_ERR_NOMEM;
    }
    for (int r = 0; r < world; r++)
        l->shared.ranks[r] = r;
    *out = l;
    return SELDP_OK;
}

const char *hx_layout_roots_word(hx_roots roots)
{
    return roots == HX_ROOTS_LAST ? "last" : roots == HX_ROOTS_SPREAD ? "spread" : "first";
}

seldp_status hx_layout_roots_merge(hx_layout *l, hx_roots *roots, bool *given)
{
    if (l->roots_named && *given && *roots != l->roots)
        return hx_fail(SELDP_ERR_INVALID_ARGUMENT,
                       "--roots %s: the layout %s names its roots rule \"%s\" (drop --roots, or "
                       "change the file's \"roots\")",
                       hx_layout_roots_word(*roots), l->name, hx_layout_roots_word(l->roots));
    if (l->roots_named) {
        *roots = l->roots;
        *given = true;
    } else if (*given) {
        l->roots = *roots;
        l->roots_named = true;
    }
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

seldp_status hx_layout_from_grid(seldp_layout *sl, hx_roots roots, hx_layout **out)
{
    seldp_status st = SELDP_OK;
    hx_layout *l = NULL;
    seldp_layout_config c = seldp_layout_get_config(sl);
    int world = c.world, ep = c.ep, experts = c.experts;
    int n_ep = seldp_layout_group_count(sl, SELDP_GROUP_EP);
    int local = experts / ep;
    HX_CHECK(hx_layout_new(world, experts, n_ep, &l));
    for (int g = 0; g < n_ep; g++) {
        const int *ranks = NULL;
        int size = seldp_layout_group(sl, SELDP_GROUP_EP, g, &ranks);
        HX_CHECK(hx_group_alloc(&l->ep[g], size));
        memcpy(l->ep[g].ranks, ranks, (size_t)size * sizeof *ranks);
    }
    /* EP position j holds experts j * E / ep ..: its ranks (ascending) own them, and form
     * their expert-data group (at TP = PP = 1 there is one per position; a sharded run
     * reduces over the grid's expert-data groups of each stage and ETP rank, grid.h) */
    for (int j = 0; j < ep; j++) {
        hx_group slot = {0};
        HX_CHECK(hx_group_alloc(&slot, world / ep));
        int n = 0;
        for (int r = 0; r < world; r++)
            if (seldp_layout_position(sl, SELDP_GROUP_EP, r) == j && n < slot.size)
                slot.ranks[n++] = r;
        int root = hx_group_root_of(&slot, roots, j);
        for (int k = 0; k < local && st == SELDP_OK; k++) {
            hx_group *o = &l->owners[j * local + k];
            st = hx_group_alloc(o, slot.size);
            if (st == SELDP_OK) {
                memcpy(o->ranks, slot.ranks, (size_t)slot.size * sizeof *o->ranks);
                o->root = root;
            }
        }
        hx_group_free(&slot);
        if (st != SELDP_OK)
            goto fail;
    }
    l->shared.root = hx_group_root_of(&l->shared, roots, 0);
    l->grid = sl;
    l->roots = roots;
    *out = l;
    return SELDP_OK;
fail:
    seldp_layout_destroy(sl);
    hx_layout_destroy(l);
    return st;
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
    HX_CHECK(hx_layout_from_grid(sl, roots, &l));
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
    HX_CHECK(hx_layout_validate(l, "layout"));
    *out = l;
    return SELDP_OK;
fail:
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
        hx_group_free(&l->data[i]);
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
            if (hx_group_alloc(&l->data[d], l->owners[e].size) != SELDP_OK)
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

/* ---- communicators ----------------------------------------------------------------------- */

void hx_rank_comms_destroy(hx_rank_comms *c)
{
    seldp_comm_destroy(c->ep);
    *c = (hx_rank_comms){0};
}

seldp_status hx_layout_split(const hx_layout *l, seldp_comm *world, hx_rank_comms *out)
{
    int r = seldp_comm_world_rank(world);
    *out = (hx_rank_comms){0};
    seldp_status st =
        seldp_comm_split(world, l->ep_of[r], hx_group_rank(&l->ep[l->ep_of[r]], r), &out->ep);
    if (st != SELDP_OK)
        return hx_fail_lib(st, "rank %d: splitting expert-parallel group %d", r, l->ep_of[r]);
    return SELDP_OK;
}
