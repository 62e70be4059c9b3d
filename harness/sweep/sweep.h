/* Sweeps (--sweep, docs/harness.md, Planted bugs and Sweeps): a list of layouts run one after
 * another with the same seed and global batch, each compared with the first run (per-step loss,
 * final logical weights) within the dtype's tolerance; sweep.md, sweep.json and a gnuplot plot in
 * --out. */
#ifndef HX_SWEEP_H
#define HX_SWEEP_H

#include <stdio.h>

#include "options.h"

/* Run the sweep named by opts->sweep: a JSON file (a list of objects of harness options) or
 * a preset (ep, worlds, worlds-32). argv is the whole command line: its options other than
 * --sweep and --out apply to every run, each entry's options on top. Returns the exit
 * status: 0 every run passed its checks and agrees with the first, 1 otherwise, 2 a bad
 * sweep (one line on `err`, nothing run and nothing written). */
int hx_sweep_main(int argc, char **argv, const hx_options *opts, FILE *out, FILE *err);

#endif
