/* What the import targets share (fuzz_megatron.c, fuzz_toml.c, fuzz_deepspeed.c): a command
 * line of defaults to import onto, and the properties every import keeps whatever its input:
 * a refusal is one line; every setting names an option of the harness's table with a value
 * that fits a line; what it prints is lines. */
#ifndef FUZZ_IMPORT_H
#define FUZZ_IMPORT_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "import.h"
#include "options_impl.h"
#include "util.h"

/* The harness's defaults as the import reads them (options.c's hx_options_default holds the
 * same values; the targets do not link the option parser's transports). */
static inline void fuzz_cmdline(hx_options *o)
{
    memset(o, 0, sizeof *o);
    o->world = 8;
    o->ep = 4;
    o->model.experts = 8;
    o->model.d_ff = 64;
    o->grid = (hx_grid)HX_GRID_INIT;
}

static inline void fuzz_check_refusal(seldp_status st)
{
    if (st == SELDP_OK)
        return;
    const char *why = hx_last_error();
    if (!why[0] || strchr(why, '\n')) {
        fprintf(stderr, "refusal not one line: '%s'\n", why);
        abort(); /* a refusal says why, on one line */
    }
}

static inline void fuzz_check_import(const hx_import *imp, FILE *sink)
{
    for (size_t i = 0; i < imp->n; i++) {
        const hx_import_setting *s = &imp->settings[i];
        bool known = false;
        for (size_t k = 0; k < hx_option_docs_n; k++)
            known = known || strcmp(hx_option_docs[k].opt.name, s->arg + 2) == 0;
        if (!known || strncmp(s->arg, "--", 2) != 0 || strchr(s->value, '\n'))
            abort(); /* a setting is an option the harness has */
    }
    for (size_t i = 0; i < imp->n_lines; i++)
        if (strncmp(imp->lines[i], "import (", 8) != 0)
            abort();
    if (sink)
        hx_import_print(imp, sink);
}

#endif
