/* The layouts printed: group strings, the layout table and report.json's layout (see layout.h). */
#include <stdarg.h>
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
    if (l->roots_named)
        hx_buf_printf(b, ", \"roots\": \"%s\"", hx_layout_roots_word(l->roots));
    else
        hx_buf_puts(b, ", \"roots\": null");
    hx_buf_puts(b, "}");
}

void hx_table_cell(hx_table *t, const char *fmt, ...)
{
    char **grown = realloc(t->cells, (size_t)(t->n + 1) * sizeof *grown);
    hx_buf b = {0};
    va_list ap;
    va_start(ap, fmt);
    hx_buf_vprintf(&b, fmt, ap);
    va_end(ap);
    if (!grown || !hx_buf_ok(&b)) {
        if (grown)
            t->cells = grown;
        t->failed = true;
        hx_buf_free(&b);
        return;
    }
    t->cells = grown;
    t->cells[t->n++] = b.data ? b.data : hx_strdup("");
}

void hx_table_print(hx_table *t, const char *indent, FILE *out)
{
    int *width = hx_calloc((size_t)t->cols, sizeof *width);
    for (int c = 0; width && c < t->cols; c++)
        width[c] = t->min_width ? t->min_width[c] : 0;
    for (int i = 0; width && i < t->n; i++) {
        int len = t->cells[i] ? (int)strlen(t->cells[i]) : 0;
        if (len > width[i % t->cols])
            width[i % t->cols] = len;
    }
    for (int i = 0; width && !t->failed && i < t->n; i++) {
        int c = i % t->cols;
        bool last = c == t->cols - 1 || i == t->n - 1;
        const char *cell = t->cells[i] ? t->cells[i] : "";
        if (c == 0)
            fputs(indent, out);
        if (t->right & (1u << c))
            fprintf(out, "%*s", width[c], cell);
        else
            fprintf(out, "%-*s", last ? 0 : width[c], cell);
        fputs(last ? "\n" : "  ", out);
    }
    for (int i = 0; i < t->n; i++)
        free(t->cells[i]);
    free(t->cells);
    free(width);
    t->cells = NULL;
    t->n = 0;
}

void hx_layout_print(const hx_layout *l, const char *const *device_names, FILE *out)
{
    char text[256];
    int *owned = hx_calloc((size_t)l->experts, sizeof *owned);
    if (!owned)
        return;
    fprintf(out, "layout: %s%s%s; %d EP groups, %d expert-data groups, * marks a root\n", l->name,
            strcmp(l->name, l->description) && l->description[0] ? ": " : "",
            strcmp(l->name, l->description) ? l->description : "", l->n_ep, l->n_data);
    static const int min_width[8] = {4, 7, 5, 2, 10, 14, 30, 0};
    hx_table t = {.cols = 8, .min_width = min_width, .right = 1u | 4u | 8u};
    static const char *const head[8] = {
        "rank", "device", "stage", "tp", "shared", "EP group", "expert-data groups", "experts"};
    for (int c = 0; c < 8; c++)
        hx_table_cell(&t, "%s", head[c]);
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
        hx_table_cell(&t, "%d", r);
        hx_table_cell(&t, "%s", device_names && device_names[r] ? device_names[r] : "host");
        hx_table_cell(&t, "%d", l->grid ? seldp_layout_stage(l->grid, r) : 0);
        hx_table_cell(&t, "%d", l->grid ? seldp_layout_position(l->grid, SELDP_GROUP_TP, r) : 0);
        hx_group_str(&l->shared, text, sizeof text);
        hx_table_cell(&t, "%s%s", text, l->shared.root == r ? "*" : "");
        hx_group_str(&l->ep[l->ep_of[r]], text, sizeof text);
        hx_table_cell(&t, "e%d %s", l->ep_of[r], text);
        hx_table_cell(&t, "%s", data.len ? hx_buf_str(&data) : "-");
        hx_table_cell(&t, "%s", n ? hx_buf_str(&experts) : "-");
        hx_buf_free(&data);
        hx_buf_free(&experts);
    }
    hx_table_print(&t, "  ", out);
    free(owned);
}
