/* Helpers of the harness tests (see harness_test.h). */
#define _POSIX_C_SOURCE 200809L

#include "harness_test.h"

#include <dirent.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "cli.h"

void hx_test_harness(hx_test_run *run, const char *fmt, ...)
{
    char line[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    char *argv[128];
    int argc = 0;
    argv[argc++] = "seldp-harness";
    for (char *tok = strtok(line, " "); tok && argc < 127; tok = strtok(NULL, " "))
        argv[argc++] = tok;
    argv[argc] = NULL;
    FILE *out = tmpfile();
    FILE *err = tmpfile();
    assert_non_null(out);
    assert_non_null(err);
    memset(run, 0, sizeof *run);
    run->status = hx_main(argc, argv, out, err);
    fflush(out);
    fflush(err);
    rewind(err);
    size_t n = fread(run->err, 1, sizeof run->err - 1, err);
    run->err[n] = '\0';
    long size = ftell(out);
    fseek(out, size > (long)sizeof run->out - 1 ? size - (long)sizeof run->out + 1 : 0, SEEK_SET);
    n = fread(run->out, 1, sizeof run->out - 1, out);
    run->out[n] = '\0';
    fclose(out);
    fclose(err);
}

const char *hx_test_dir(const char *name)
{
    static char path[1024];
    snprintf(path, sizeof path, "%s/%s", HX_TEST_WORKDIR, name);
    assert_int_equal(hx_mkdir_p(path), SELDP_OK);
    DIR *dir = opendir(path);
    assert_non_null(dir);
    for (struct dirent *e; (e = readdir(dir));) {
        if (e->d_name[0] == '.')
            continue;
        char file[2048];
        snprintf(file, sizeof file, "%s/%s", path, e->d_name);
        unlink(file);
    }
    closedir(dir);
    return path;
}

hx_json *hx_test_json(const char *dir, const char *file)
{
    char path[1400];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    char *text = NULL;
    size_t len = 0;
    if (hx_read_file(path, &text, &len) != SELDP_OK)
        fail_msg("%s", hx_last_error());
    hx_json *doc = NULL;
    if (hx_json_parse(text, len, path, &doc) != SELDP_OK)
        fail_msg("%s", hx_last_error());
    free(text);
    return doc;
}

hx_json *hx_test_report(const char *dir)
{
    return hx_test_json(dir, "report.json");
}

void hx_test_check(const hx_json *report, const char *name, int64_t *tested, int64_t *failed)
{
    const hx_json *checks = hx_json_get(report, "checks");
    assert_non_null(checks);
    for (size_t i = 0; i < checks->count; i++) {
        const hx_json *c = &checks->items[i];
        const hx_json *n = hx_json_get(c, "name");
        if (n && n->type == HX_JSON_STRING && strcmp(n->string, name) == 0) {
            *tested = hx_test_int(c, "tested");
            *failed = hx_test_int(c, "failed");
            return;
        }
    }
    fail_msg("report.json has no check \"%s\"", name);
}

double hx_test_number(const hx_json *object, const char *key)
{
    const hx_json *v = hx_json_get(object, key);
    if (!v || v->type != HX_JSON_NUMBER)
        fail_msg("\"%s\" is not a number member", key);
    return v->number;
}

int64_t hx_test_int(const hx_json *object, const char *key)
{
    const hx_json *v = hx_json_get(object, key);
    if (!v || v->type != HX_JSON_NUMBER || !v->is_integer)
        fail_msg("\"%s\" is not an integer member", key);
    return v->integer;
}

const char *hx_test_layout(const char *file)
{
    static char path[1024];
    snprintf(path, sizeof path, "%s/%s", HX_TEST_LAYOUTS, file);
    return path;
}

void hx_test_run_passes(const char *args)
{
    const char *dir = hx_test_dir("passes");
    hx_test_run run;
    hx_test_harness(&run, "%s --steps 2 --tokens 24 --quiet --out %s", args, dir);
    if (run.status != HX_EXIT_PASS)
        fail_msg("seldp-harness %s\nexit %d\n%s%s", args, run.status, run.err, run.out);
    hx_json *report = hx_test_report(dir);
    int64_t tested, failed;
    hx_test_check(report, "reduced gradients vs the FP64 reference", &tested, &failed);
    assert_true(tested > 0);
    assert_int_equal(failed, 0);
    hx_test_check(report, "replicas equal their root after initialize", &tested, &failed);
    assert_true(tested > 0);
    assert_int_equal(failed, 0);
    hx_test_check(report, "reduced gradients bit-identical in each group", &tested, &failed);
    assert_true(tested > 0);
    assert_int_equal(failed, 0);
    hx_test_check(report, "tokens per expert equal the reference's", &tested, &failed);
    assert_true(tested > 0);
    assert_int_equal(failed, 0);
    hx_json_free(report);
}

void hx_test_usage_error(const char *needle, const char *fmt, ...)
{
    char args[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    hx_test_run run;
    hx_test_harness(&run, "%s", args);
    if (run.status != HX_EXIT_USAGE)
        fail_msg("'%s' exited %d, expected %d; stderr: %s", args, run.status, HX_EXIT_USAGE,
                 run.err);
    if (!strstr(run.err, needle))
        fail_msg("'%s': stderr lacks \"%s\": %s", args, needle, run.err);
    const char *newline = strchr(run.err, '\n');
    if (!newline || newline[1] != '\0')
        fail_msg("'%s': not one line: %s", args, run.err);
}

hx_parse_result hx_test_parse(char **argv, hx_options *o, char *err, size_t size)
{
    int argc = 0;
    while (argv[argc])
        argc++;
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    assert_non_null(f);
    hx_options_default(o);
    hx_parse_result r = hx_options_parse(argc, argv, o, f, f);
    fclose(f);
    snprintf(err, size, "%.*s", (int)strcspn(text ? text : "", "\n"), text ? text : "");
    free(text);
    return r;
}
