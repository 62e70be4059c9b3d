/* The exit statuses of seldp-harness (docs/harness.md): what hx_main returns and the
 * commands that exit early (--print-layout, --compare-groups, --sweep) report. */
#ifndef HX_EXIT_H
#define HX_EXIT_H

/* Exit status of the program. */
enum {
    HX_EXIT_PASS = 0, /* every check passed */
    HX_EXIT_FAIL = 1, /* a check failed, or the run stopped on an error */
    HX_EXIT_USAGE = 2 /* a bad option or layout: nothing ran */
};

#endif
