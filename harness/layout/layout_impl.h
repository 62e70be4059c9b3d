/* What the files of the harness's layouts share (layout.c: generation, validation, queries
 * and splitting; layout_file.c: the layout file; layout_print.c: tables and JSON). */
#ifndef HX_LAYOUT_IMPL_H
#define HX_LAYOUT_IMPL_H

#include "layout.h"

/* Free a group's ranks (the group itself is not freed). */
void hx_group_free(hx_group *g);

/* Allocate a group of `size` ranks (at least one slot), its root unset (-1). */
seldp_status hx_group_alloc(hx_group *g, int size);

/* The root of group g under a roots policy; `index` spreads the roots of many groups. */
int hx_group_root_of(const hx_group *g, hx_roots roots, int index);

/* An empty layout of `world` ranks, `experts` experts and `n_ep` EP groups, the shared
 * group being every rank. */
seldp_status hx_layout_new(int world, int experts, int n_ep, hx_layout **out);

/* The layout of a framework grid `grid` (with experts): its EP groups, each expert owned by the
 * ranks of its EP position (roots by `roots`), the shared group the world. Takes `grid`,
 * destroyed on failure; name and description are the caller's to set, then validate. */
seldp_status hx_layout_from_grid(seldp_layout *grid, hx_roots roots, hx_layout **out);

/* An aligned text table: cells added row by row, each column as wide as its widest cell (and
 * at least its minimum), numbers right-aligned. */
typedef struct hx_table {
    int cols;
    const int *min_width; /* [cols] or NULL */
    unsigned right;       /* bit c: column c right-aligned */
    int n;                /* cells added */
    char **cells;
    bool failed;
} hx_table;

HX_PRINTF(2, 3) void hx_table_cell(hx_table *t, const char *fmt, ...);
/* Print every row, each line starting with `indent`; then free the cells. */
void hx_table_print(hx_table *t, const char *indent, FILE *out);

#endif
