/* Helpers of the harness tests: run seldp-harness in-process with a command line, read its
 * report.json, and find the working directory of a test. */
#ifndef HARNESS_TEST_H
#define HARNESS_TEST_H

#include <stddef.h>
#include <stdint.h>

#include "json.h"
#include "options.h"
#include "util.h"

/* Output of one run. */
typedef struct hx_test_run {
    int status;      /* exit status of hx_main */
    char err[4096];  /* what it wrote to stderr */
    char out[16384]; /* the end of what it wrote to stdout */
} hx_test_run;

/* Run `seldp-harness <args>` (args split at spaces; printf-style) in-process. */
#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
void hx_test_harness(hx_test_run *run, const char *fmt, ...);

/* A fresh directory for `name` under this test's working directory (emptied of files). The
 * returned path is static storage, valid until the next call. */
const char *hx_test_dir(const char *name);

/* Run `seldp-harness <args>` (printf-style) and require a usage error: exit 2, one line on
 * stderr that contains `needle`. */
#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
void hx_test_usage_error(const char *needle, const char *fmt, ...);

/* Parse `argv` (NULL-terminated, the program first) from the defaults with hx_options_parse,
 * in-process: the result, and the first line it wrote (an error, without the newline) in err. */
hx_parse_result hx_test_parse(char **argv, hx_options *o, char *err, size_t size);

/* Parse dir/report.json; fails the test when it cannot. Free with hx_json_free. */
hx_json *hx_test_report(const char *dir);
/* dir/file parsed as JSON (sweep.json, manifest.json, ...); a failure fails the test. */
hx_json *hx_test_json(const char *dir, const char *file);

/* The check `name` of a report: its "tested" and "failed" counts (fails the test if absent). */
void hx_test_check(const hx_json *report, const char *name, int64_t *tested, int64_t *failed);

/* An integer member of an object (fails the test when absent or not an integer). */
int64_t hx_test_int(const hx_json *object, const char *key);
/* A number member (fails the test when absent or not a number). */
double hx_test_number(const hx_json *object, const char *key);

/* Run `seldp-harness <args> --steps 2 --tokens 24` and require that it passes and that the
 * gradient, initialize, replica and routing checks tested something and found nothing. */
void hx_test_run_passes(const char *args);

/* Path of a layout file shipped with the tests. */
const char *hx_test_layout(const char *file);

#endif
