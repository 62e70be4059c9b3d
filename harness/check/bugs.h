/* The known framework bugs (docs/harness.md, Planted bugs): one table of the gradient mistakes
 * real MoE frameworks shipped, read by --inject's parsing and refusals, the console header, the
 * diagnosis (diagnose.c), docs/harness.md's --inject table and results/bugs/ (seldp-bugs). */
#ifndef HX_BUGS_H
#define HX_BUGS_H

#include <stdbool.h>
#include <stdio.h>

#include "options.h"
#include "util.h"

typedef struct hx_bug {
    hx_fault fault;
    const char *name;      /* the --inject name */
    const char *mistake;   /* what the framework did, one clause */
    const char *citation;  /* where it shipped: issues and pull requests, "" when none */
    const char *needs;     /* the layout and options on which it shows */
    const char *signature; /* what the checks see of it, as the diagnosis reads it */
    const char *pending;   /* the option it needs that does not exist yet, or NULL */
    const char *demo;      /* a command line on which it shows (results/bugs/) */
} hx_bug;

/* The number of known bugs and the i-th, in the table's order (the first set, then the
 * second). */
int hx_bug_count(void);
const hx_bug *hx_bug_at(int i);

/* The entry of a fault, or NULL for the self-tests (grad, replica, absent, fail) and none. */
const hx_bug *hx_bug_of(hx_fault fault);

/* True for a fault that is a known framework bug. */
bool hx_bug_is_framework(hx_fault fault);

/* What --inject accepts, for its error message. */
const char *hx_bug_expected_names(void);

/* Option-level refusal of o->inject (before any layout exists): a bug whose option does not
 * exist yet is refused naming it (hx_fail, SELDP_ERR_INVALID_ARGUMENT). */
seldp_status hx_bug_refuse_options(const hx_options *o);

/* "known bug NAME (citation): the mistake?": how the diagnosis names bug f, into buf. */
void hx_bug_cite(hx_fault f, char *buf, size_t size);

/* docs/harness.md's --inject table of the framework bugs (name, mistake, shipped in, needs),
 * and results/bugs/'s catalog (with what the checks see and the status). */
void hx_bugs_markdown(hx_buf *b);
void hx_bugs_catalog(hx_buf *b);

const char *hx_fault_name(hx_fault fault);

#endif
