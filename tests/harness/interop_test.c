/* Helpers of the interop tests (see interop_test.h). */
#define _POSIX_C_SOURCE 200809L

#include "interop_test.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cli.h"

static char *slurp(FILE *f)
{
    fflush(f);
    long size = ftell(f);
    char *text = calloc((size_t)size + 1, 1);
    assert_non_null(text);
    rewind(f);
    size_t n = fread(text, 1, (size_t)size, f);
    text[n] = '\0';
    return text;
}

void it_main(it_run *run, const char *fmt, ...)
{
    char line[8192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    char *argv[256];
    int argc = 0;
    argv[argc++] = "seldp-harness";
    for (char *tok = strtok(line, " "); tok && argc < 255; tok = strtok(NULL, " ")) {
        for (char *c = tok; *c; c++)
            if (*c == '\x1f')
                *c = ' ';
        argv[argc++] = tok;
    }
    argv[argc] = NULL;
    FILE *out = tmpfile(), *err = tmpfile();
    assert_non_null(out);
    assert_non_null(err);
    run->status = hx_main(argc, argv, out, err);
    run->out = slurp(out);
    run->err = slurp(err);
    fclose(out);
    fclose(err);
}

void it_free(it_run *run)
{
    free(run->out);
    free(run->err);
    run->out = run->err = NULL;
}

const char *it_config(const char *rel)
{
    static char paths[8][1024];
    static int next;
    char *p = paths[next++ % 8];
    snprintf(p, sizeof paths[0], "%s/%s", HX_TEST_CONFIGS, rel);
    return p;
}

int it_lines_with(const char *text, const char *needle)
{
    int n = 0;
    for (const char *line = text; *line;) {
        const char *end = strchr(line, '\n');
        size_t len = end ? (size_t)(end - line) : strlen(line);
        char *copy = strndup(line, len);
        assert_non_null(copy);
        n += strstr(copy, needle) != NULL;
        free(copy);
        line += len + (end != NULL);
    }
    return n;
}

void it_expect(const it_run *run, int status, const char *why)
{
    if (run->status != status)
        fail_msg("exit %d, expected %d\nstderr: %s\nstdout (end): %.2000s", run->status, status,
                 run->err, run->out + (strlen(run->out) > 2000 ? strlen(run->out) - 2000 : 0));
    if (status != HX_EXIT_USAGE)
        return;
    const char *nl = strchr(run->err, '\n');
    if (!nl || nl[1] != '\0')
        fail_msg("stderr is not one line: '%s'", run->err);
    if (why && !strstr(run->err, why))
        fail_msg("stderr '%s' lacks '%s'", run->err, why);
    if (strstr(run->out, "result:"))
        fail_msg("trained after a usage error:\n%s", run->out);
}

void it_has(const char *text, const char *needle, const char *what)
{
    if (!strstr(text, needle))
        fail_msg("%s lacks '%s':\n%.6000s", what, needle, text);
}
