/* The runs of a sweep (sweep.h): a sweep file's list of option objects, or a preset's layouts.
 *
 * A sweep file is a JSON array of 1 to 256 objects, each the options one run adds to the
 * command line's ("name" labels the run; the keys are the option table's rows marked
 * HX_SWEEP_KEY, their values parsed through those rows, docs: sweep.c). The
 * presets build their layouts on the command line's grid (--framework, --tp, --pp, --cp,
 * --etp): ep every ep the framework accepts, in both of its orders (Megatron's ep inside and
 * outside dp, DeepSpeed's expert- and data-first; torchtitan's mesh has one); frameworks every
 * framework with its orders; worlds (worlds-32) 1, 2, 4, 8 (16, 32) ranks, ep halved until it
 * fits. A layout the framework refuses is left out, and so is a layout whose groups and
 * expert owners equal an earlier run's of the same framework (one line each on `out`): the
 * frameworks preset compares the frameworks with each other, however alike their groups. */
#ifndef HX_SWEEP_ENTRIES_H
#define HX_SWEEP_ENTRIES_H

#include <stdbool.h>
#include <stdio.h>

#include "sweep_report.h"

/* Fill s->entries (s->n) from s->name: a preset, or else a sweep file read from disk. Returns
 * false after one line on `err` (nothing is run); the entries made so far stay for the
 * caller to free. */
bool hx_sweep_entries(hx_sweep *s, const hx_options *base, FILE *out, FILE *err);

/* The sweep file's text (`len` bytes; s->name names it in messages) into s->entries. */
bool hx_sweep_file_parse(hx_sweep *s, const char *text, size_t len, FILE *err);

/* Parse argv (argv[0] first) into *o from the defaults, the error line (without the program's
 * prefix) into msg. Returns false on a bad option. */
bool hx_sweep_parse_options(int argc, char **argv, hx_options *o, char *msg, size_t size);

#endif
