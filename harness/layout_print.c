/* The layouts printed: group strings, the layout table and report.json's layout (see layout.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json.h"
#include "layout_impl.h"

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

/* The sizes and the groups of every kind (docs/harness.md, Framework presets). A layout file of tp
 * = pp = cp = etp = 1 has no grid: its groups are those of TP = PP = CP = 1, its EP and expert-data
 * groups its own. */
static void layout_grid_json(const hx_layout *l, hx_buf *b)
{
    if (l->grid) {
        seldp_layout_config c = seldp_layout_get_config(l->grid);
        if (c.framework == SELDP_FRAMEWORK_NONE)
            hx_buf_puts(b, ", \"framework\": null, \"order\": ");
        else
            hx_buf_printf(
                b, ", \"framework\": \"%s\", \"order\": ", seldp_framework_name(c.framework));
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
            c.framework == SELDP_FRAMEWORK_NONE ? "explicit groups"
                                                : seldp_framework_name(c.framework),
            c.order ? " " : "", c.order ? c.order : "", c.world, c.tp, c.pp, c.cp, c.ep, c.etp,
            seldp_layout_dp(grid));
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
