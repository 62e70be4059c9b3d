/* The reports of a run under mpirun equal those of the in-process run of the same layout:
 * every process runs one rank (--backend mpi), then rank 0 runs the same command with
 * every rank as a thread (--backend host) and compares report.json member by member
 * (timings, the backend and the transport aside), report.md line by line (the same
 * aside), and the --dump files byte for byte. Layouts: a generated one and a layout file
 * with a replicated hot expert. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cli.h"
#include "harness_mpi.h"

/* Members that differ between the two runs by design. */
static bool ignored(const char *parent, const char *key)
{
    if (strcmp(key, "time_s") == 0)
        return true;
    return strcmp(parent, "options") == 0 &&
           (strcmp(key, "backend") == 0 || strcmp(key, "transport") == 0);
}

/* Count the differences between a (MPI run) and b (in-process run); print the first few. */
static int json_diff(const hx_json *a, const hx_json *b, const char *where, const char *key)
{
    char path[512];
    if (a->type != b->type) {
        print_error("%s: %s here, %s in-process\n", where, hx_json_type_name(a->type),
                    hx_json_type_name(b->type));
        return 1;
    }
    switch (a->type) {
    case HX_JSON_NULL:
        return 0;
    case HX_JSON_BOOL:
        return a->boolean != b->boolean;
    case HX_JSON_NUMBER:
        if (a->number != b->number)
            print_error("%s: %.17g here, %.17g in-process\n", where, a->number, b->number);
        return a->number != b->number;
    case HX_JSON_STRING:
        if (strcmp(a->string, b->string) != 0)
            print_error("%s: \"%s\" here, \"%s\" in-process\n", where, a->string, b->string);
        return strcmp(a->string, b->string) != 0;
    case HX_JSON_ARRAY: {
        if (a->count != b->count) {
            print_error("%s: %zu items here, %zu in-process\n", where, a->count, b->count);
            return 1;
        }
        int n = 0;
        for (size_t i = 0; i < a->count; i++) {
            snprintf(path, sizeof path, "%s[%zu]", where, i);
            n += json_diff(&a->items[i], &b->items[i], path, key);
        }
        return n;
    }
    case HX_JSON_OBJECT: {
        int n = 0;
        for (size_t i = 0; i < a->count; i++) {
            if (ignored(key, a->keys[i]))
                continue;
            snprintf(path, sizeof path, "%s.%s", where, a->keys[i]);
            const hx_json *other = hx_json_get(b, a->keys[i]);
            if (!other) {
                print_error("%s: absent in-process\n", path);
                n++;
                continue;
            }
            n += json_diff(&a->items[i], other, path, a->keys[i]);
        }
        for (size_t i = 0; i < b->count; i++) {
            if (!ignored(key, b->keys[i]) && !hx_json_get(a, b->keys[i])) {
                print_error("%s.%s: absent here\n", where, b->keys[i]);
                n++;
            }
        }
        return n;
    }
    }
    return 1;
}

static char *read_text(const char *dir, const char *file, size_t *len)
{
    char path[1200];
    char *text = NULL;
    snprintf(path, sizeof path, "%s/%s", dir, file);
    if (hx_read_file(path, &text, len) != SELDP_OK) {
        print_error("%s\n", hx_last_error());
        return NULL;
    }
    return text;
}

/* report.md without what may differ: the transport line, the timing columns of the steps
 * table and the total time. */
static void normalize_md(char *text)
{
    char *out = text;
    bool steps = false;
    for (char *line = text; *line;) {
        char *end = strchr(line, '\n');
        size_t n = end ? (size_t)(end - line) + 1 : strlen(line);
        bool keep = strncmp(line, "| world |", 9) != 0 && strncmp(line, "Total time", 10) != 0;
        if (strncmp(line, "## ", 3) == 0)
            steps = strncmp(line, "## Steps", 8) == 0;
        if (keep && steps && line[0] == '|') {
            /* step, tokens, loss, reference loss, worst, failures, absent: 7 columns */
            size_t bars = 0, cut = n;
            for (size_t i = 0; i < n; i++)
                if (line[i] == '|' && ++bars == 8)
                    cut = i + 1;
            memmove(out, line, cut);
            out += cut;
            *out++ = '\n';
        } else if (keep) {
            memmove(out, line, n);
            out += n;
        }
        line += n;
    }
    *out = '\0';
}

/* True when `file` has the same content in both directories (report.md normalized). */
static bool same_file(const char *mpi_dir, const char *host_dir, const char *file, bool md)
{
    size_t a_len = 0, b_len = 0;
    char *a = read_text(mpi_dir, file, &a_len);
    char *b = read_text(host_dir, file, &b_len);
    bool same = a && b;
    if (same && md) {
        normalize_md(a);
        normalize_md(b);
        a_len = strlen(a);
        b_len = strlen(b);
    }
    if (same && (a_len != b_len || memcmp(a, b, a_len) != 0)) {
        if (md)
            print_error("--- under mpirun\n%s\n--- in-process\n%s\n", a, b);
        print_error("%s differs between %s and %s\n", file, mpi_dir, host_dir);
        same = false;
    }
    free(a);
    free(b);
    return same;
}

/* Rank 0: run `args` in-process and compare; the number of differences (printed). */
static int compare_in_process(const char *args, const char *mpi_dir, const char *mpi_dump,
                              const char *host_dir, const char *host_dump)
{
    hx_test_run run;
    hx_test_harness(&run, "--backend host %s --quiet --out %s --dump %s", args, host_dir,
                    host_dump);
    if (run.status != HX_EXIT_PASS) {
        print_error("in-process %s: exit %d\n%s\n", args, run.status, run.err);
        return 1;
    }
    hx_json *a = hx_test_report(mpi_dir);
    hx_json *b = hx_test_report(host_dir);
    int differences = json_diff(a, b, "report.json", "");
    hx_json_free(a);
    hx_json_free(b);
    differences += !same_file(mpi_dir, host_dir, "report.md", true);
    differences += !same_file(mpi_dump, host_dump, "manifest.json", false);
    for (int r = 0; r < mt_size; r++) {
        char file[64];
        snprintf(file, sizeof file, "rank%d.safetensors", r);
        differences += !same_file(mpi_dump, host_dump, file, false);
    }
    return differences;
}

static void compare_runs(const char *args)
{
    char mpi_dir[1024], mpi_dump[1024], host_dir[1024], host_dump[1024];
    snprintf(mpi_dir, sizeof mpi_dir, "%s", hm_dir("mpi"));
    snprintf(mpi_dump, sizeof mpi_dump, "%s", hm_dir("mpi-dump"));
    snprintf(host_dir, sizeof host_dir, "%s", hm_dir("host"));
    snprintf(host_dump, sizeof host_dump, "%s", hm_dir("host-dump"));
    hx_test_run run;
    hx_test_harness(&run, "--backend mpi %s --timeout 20 --quiet --out %s --dump %s", args, mpi_dir,
                    mpi_dump);
    hm_expect_status(&run, HX_EXIT_PASS, args);
    int differences =
        mt_rank == 0 ? compare_in_process(args, mpi_dir, mpi_dump, host_dir, host_dump) : 0;
    if (differences)
        print_error("%s: %d difference(s) from the in-process run\n", args, differences);
    hm_expect_everywhere(differences == 0, "reports and dumps equal the in-process run's");
}

static void test_generated_layout(void **state)
{
    (void)state;
    char args[256];
    snprintf(args, sizeof args,
             "--world %d --ep %d --order dp-ep --dtype bf16 --quant nf4 --expert-reduce mean "
             "--steps 2 --tokens 20 --seed 81",
             mt_size, mt_size / 2 ? mt_size / 2 : 1);
    compare_runs(args);
}

/* A hot expert replicated in every EP group, roots away from rank 0. */
static void test_layout_file(void **state)
{
    (void)state;
    char args[1400];
    const char *file = hx_test_layout("hot-expert.json");
    if (mt_size != 4) {
        static char path[1100];
        snprintf(path, sizeof path, "%s/hot-expert-2.json", hm_dir("layout"));
        if (mt_rank == 0) {
            const char *text =
                "{\"description\": \"two ranks, expert 0 on both, the others on one\",\n"
                " \"shared_root\": 1, \"ep_groups\": [[0, 1]],\n"
                " \"experts\": [{\"owners\": [0, 1], \"root\": 1}, {\"owners\": [0]},\n"
                "               {\"owners\": [1]}, {\"owners\": [1]}]}\n";
            assert_int_equal(hx_write_file(path, text, strlen(text)), SELDP_OK);
        }
        mt_sync();
        file = path;
    }
    snprintf(args, sizeof args,
             "--layout-file %s --dtype f32 --expert-reduce sum --policy zero --steps 2 --tokens "
             "20 --seed 82",
             file);
    compare_runs(args);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        MT_TEST(test_generated_layout),
        MT_TEST(test_layout_file),
    };
    return mt_main(argc, argv, "mpi_harness_report", tests, sizeof tests / sizeof tests[0]);
}
