/* Helpers of the interop tests (imports, --print-layout, --compare-groups, resume rules): run
 * seldp-harness in-process and keep all it printed, and find the framework configurations
 * copied from the frameworks' examples (configs/, each file names its source). */
#ifndef INTEROP_TEST_H
#define INTEROP_TEST_H

#include <stddef.h>

/* A space inside one word of it_main's command line. */
#define SP "\x1f"

typedef struct it_run {
    int status; /* hx_main's exit status */
    char *out;  /* all of stdout */
    char *err;  /* all of stderr */
} it_run;

/* Run seldp-harness with the words of fmt (printf-style) split at spaces; a word may hold a
 * space written as '\x1f'. Free with it_free. */
#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
void it_main(it_run *run, const char *fmt, ...);

void it_free(it_run *run);

/* configs/<rel>: a path in static storage, one of 8 rotating buffers. */
const char *it_config(const char *rel);

/* The number of lines of text that contain needle. */
int it_lines_with(const char *text, const char *needle);

/* Fail unless the run exited with `status`; for 2, unless stderr is one line containing
 * `why` (NULL: any) and nothing trained. */
void it_expect(const it_run *run, int status, const char *why);

/* Fail unless text contains needle (what: "stdout" or "stderr", for the message). */
void it_has(const char *text, const char *needle, const char *what);

#endif
