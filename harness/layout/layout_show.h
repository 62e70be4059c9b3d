/* --print-layout, --print-layout --json and --compare-groups: the layout a run of the same
 * options would build, with the replica sets it would reduce over (sets.h) and their roots,
 * shown or compared without training. docs/harness-interop.md describes the outputs and the
 * groups file. */
#ifndef HX_LAYOUT_SHOW_H
#define HX_LAYOUT_SHOW_H

#include <stdio.h>

#include "options.h"

/* Build the layout of `opts` as hx_run_create does (a layout file, or the framework preset;
 * the roots settled with hx_layout_roots_merge), print it (text, or JSON with print_json) when
 * print_layout, and compare it with opts->compare_groups when given. Returns the exit status:
 * 0 (printed; equal), 1 (the groups file differs: the first difference on `out`), 2 (a bad
 * layout or groups file: one line on `err`). */
int hx_layout_show_main(const hx_options *opts, FILE *out, FILE *err);

#endif
