/* --print-layout, --print-layout --json and --compare-groups (layout_show.h, compare.h):
 *
 *  - the text shows every group kind, the replica sets a run of the same options reduces over
 *    with their roots (--roots honoured on every layout kind), Megatron's dp and dp-cp both when
 *    cp > 1, and a per-rank table whose columns stay aligned at world 32 and beyond;
 *  - --json is report.json's layout (every kind, owners, the roots rule) and reads back through
 *    --layout-file into the same JSON, for every framework preset and for layout files;
 *  - --print-layout refuses the options it would ignore;
 *  - --compare-groups passes on the groups a framework builds (the configs/ groups files) and fails
 *    naming the first rank and group kind when one rank is moved; a malformed file is exit 2. */
#define _POSIX_C_SOURCE 200809L

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cli.h"
#include "harness_test.h"
#include "interop_test.h"
#include "util.h"

static void write_file(const char *path, const char *text)
{
    assert_int_equal(hx_write_file(path, text, strlen(text)), SELDP_OK);
}

/* The layout of `args` as JSON, loaded back, printed again: the same bytes. */
static void round_trip(const char *args)
{
    it_run a, b;
    it_main(&a, "--print-layout --json %s", args);
    it_expect(&a, HX_EXIT_PASS, NULL);
    char path[1200];
    snprintf(path, sizeof path, "%s/layout.json", hx_test_dir("round-trip"));
    write_file(path, a.out);
    it_main(&b, "--print-layout --json --layout-file %s", path);
    it_expect(&b, HX_EXIT_PASS, NULL);
    if (strcmp(a.out, b.out) != 0)
        fail_msg("%s: the JSON read back differs:\n%s\n%s", args, a.out, b.out);
    it_has(a.out, "\"groups\": {\"tp\": ", "stdout");
    it_has(a.out, "\"embedding\": ", "stdout");
    it_has(a.out, "\"owners\": ", "stdout");
    it_free(&a);
    it_free(&b);
}

static void json_round_trips(void **state)
{
    (void)state;
    round_trip("--framework megatron --world 16 --tp 2 --pp 2 --cp 2 --ep 2");
    round_trip("--framework megatron --world 16 --tp 2 --pp 2 --ep 2 --roots spread");
    round_trip("--framework megatron-0.9 --world 8 --tp 2 --ep 2");
    round_trip("--framework deepspeed --world 16 --tp 2 --ep 4 --etp 2 --roots last");
    round_trip("--framework deepspeed --world 8 --ep 2 --order dp-ep");
    round_trip("--framework torchtitan --world 16 --tp 2 --cp 2 --ep 4");
    round_trip("--world 8 --ep 4");
    round_trip("--world 32 --ep 4 --order dp-ep --roots last");
    char file[1200];
    snprintf(file, sizeof file, "--layout-file %s", hx_test_layout("hot-expert.json"));
    round_trip(file);
    snprintf(file, sizeof file, "--layout-file %s", hx_test_layout("megatron-tp2-pp2.json"));
    round_trip(file);
}

/* The roots a run uses, on every layout kind: --roots last moves every set's root. */
static void roots_shown(void **state)
{
    (void)state;
    it_run run;
    it_main(&run, "--print-layout --framework megatron --world 16 --tp 2 --pp 2 --cp 2 --ep 2");
    it_expect(&run, HX_EXIT_PASS, NULL);
    it_has(run.out, "roots: each group's rank 0, the framework's own", "stdout");
    /* Megatron's two data-parallel groups: dp-cp reduces the dense gradients, dp holds one
     * context position */
    it_has(run.out, "  dp-cp       4 x 4  [0,2,4,6] [1,3,5,7] [8,10,12,14] [9,11,13,15]\n",
           "stdout");
    it_has(run.out, "  dp          8 x 2  [0,4] [1,5] [2,6] [3,7] [8,12] [9,13] [10,14] [11,15]\n",
           "stdout");
    it_has(run.out, "  dp-cp       4 x 4  [0,2,4,6]@0 [1,3,5,7]@1 [8,10,12,14]@8 [9,11,13,15]@9",
           "stdout");
    it_has(run.out, "  edp         8 x 2  [0,4]@0 [1,5]@1", "stdout");
    it_free(&run);
    it_main(&run, "--print-layout --framework megatron --world 16 --tp 2 --pp 2 --cp 2 --ep 2 "
                  "--roots last");
    it_expect(&run, HX_EXIT_PASS, NULL);
    it_has(run.out, "roots: last of each group (--roots last)", "stdout");
    it_has(run.out, "[0,2,4,6]@6 [1,3,5,7]@7 [8,10,12,14]@14 [9,11,13,15]@15", "stdout");
    it_has(run.out, "  edp         8 x 2  [0,4]@4 [1,5]@5", "stdout");
    it_free(&run);
    /* a layout file without the grid: its own roots, and --roots for the unnamed ones */
    it_main(&run, "--print-layout --layout-file %s", hx_test_layout("hot-expert.json"));
    it_expect(&run, HX_EXIT_PASS, NULL);
    it_has(run.out, "replica sets the run reduces over (@ its root)", "stdout");
    it_has(run.out, "  shared       1 x 4  [0-3]@1", "stdout");
    it_free(&run);
    /* a file's roots rule against a different --roots: refused */
    char path[1200];
    snprintf(path, sizeof path, "%s/last.json", hx_test_dir("roots"));
    it_main(&run, "--print-layout --json --world 8 --ep 2 --roots last");
    write_file(path, run.out);
    it_free(&run);
    it_main(&run, "--print-layout --layout-file %s --roots first", path);
    it_expect(&run, HX_EXIT_USAGE,
              "--roots first: the layout last.json names its roots rule "
              "\"last\"");
    it_free(&run);
    it_main(&run, "--print-layout --layout-file %s", path);
    it_expect(&run, HX_EXIT_PASS, NULL);
    it_has(run.out, "roots: last of each group", "stdout");
    it_free(&run);
}

/* At world 64 every row of the per-rank table starts its columns where the header does. */
static void columns_aligned(void **state)
{
    (void)state;
    it_run run;
    it_main(&run, "--print-layout --framework megatron --world 64 --tp 2 --pp 2 --cp 2 --ep 4");
    it_expect(&run, HX_EXIT_PASS, NULL);
    const char *head = strstr(run.out, "  rank  stage");
    assert_non_null(head);
    const char *cols[] = {"stage",    "tp",          "cp",        "etp",    "dense",
                          "EP group", "expert-data", "expert-TP", "experts"};
    size_t at[9];
    const char *end = strchr(head, '\n');
    for (int c = 0; c < 9; c++) {
        const char *p = strstr(head + 6, cols[c]);
        assert_true(p && p < end);
        at[c] = (size_t)(p - head);
    }
    int rows = 0;
    for (const char *line = end + 1; *line == ' ' && line[2] == ' '; rows++) {
        const char *next = strchr(line, '\n');
        for (int c = 4; c < 9; c++) /* the left-aligned columns start at the header's */
            if (line[at[c] - 1] != ' ' || line[at[c]] == ' ')
                fail_msg("row %d, column %s misaligned:\n%.*s\n%.*s", rows, cols[c],
                         (int)(end - head), head, (int)(next - line), line);
        line = next + 1;
    }
    assert_int_equal(rows, 64);
    it_free(&run);
}

static void refuses_what_it_would_ignore(void **state)
{
    (void)state;
    static const char *const ignored[] = {"--steps 5",  "--sweep ep",    "--dtype f32",
                                          "--out none", "--lr 0.1",      "--resume /tmp/x",
                                          "--layers 4", "--inject grad", "--global-batch 64"};
    for (size_t i = 0; i < sizeof ignored / sizeof ignored[0]; i++) {
        it_run run;
        it_main(&run, "--print-layout %s", ignored[i]);
        char why[200];
        snprintf(why, sizeof why,
                 "--print-layout prints the layout and exits without training: "
                 "it would ignore --%.*s",
                 (int)strcspn(ignored[i] + 2, " "), ignored[i] + 2);
        it_expect(&run, HX_EXIT_USAGE, why);
        it_free(&run);
    }
    it_run run;
    it_main(&run, "--json --world 8");
    it_expect(&run, HX_EXIT_USAGE, "--json: needs --print-layout");
    it_free(&run);
    it_main(&run, "--compare-groups x.json --steps 2");
    it_expect(&run, HX_EXIT_USAGE,
              "--compare-groups prints the layout and exits without "
              "training: it would ignore --steps");
    it_free(&run);
    /* what it reads is taken: the layout's sizes, roots, experts, quantization */
    it_main(&run, "--print-layout --world 8 --ep 2 --tp 2 --experts 4 --quant nf4 --roots spread");
    it_expect(&run, HX_EXIT_PASS, NULL);
    it_free(&run);
}

/* The groups file: the frameworks' groups pass; one rank moved fails naming it. */
static void compare_groups(void **state)
{
    (void)state;
    const char *groups = it_config("megatron/mixtral_8x7b-groups.json");
    it_run run;
    it_main(&run, "--compare-groups %s --framework megatron --world 32 --pp 4 --ep 8", groups);
    it_expect(&run, HX_EXIT_PASS, NULL);
    it_has(run.out, "compare-groups: PASS: 256 groups of 32 ranks", "stdout");
    it_free(&run);
    /* rank 9 moved from EP group [8-15] to [0-7] (and 1 the other way) */
    char *text = NULL;
    assert_int_equal(hx_read_file(groups, &text, NULL), SELDP_OK);
    char *r1 = strstr(text, "{\"rank\": 1,"), *ep = r1 ? strstr(r1, "\"ep\": [0, 1, 2,") : NULL;
    assert_non_null(ep);
    memcpy(ep + 10, "9", 1); /* "ep": [0, 9, 2, ... */
    char path[1200];
    snprintf(path, sizeof path, "%s/moved.json", hx_test_dir("compare"));
    write_file(path, text);
    free(text);
    it_main(&run, "--compare-groups %s --framework megatron --world 32 --pp 4 --ep 8", path);
    it_expect(&run, HX_EXIT_FAIL, NULL);
    it_has(run.out, "compare-groups: FAIL: ", "stdout");
    it_has(run.out,
           "rank 1, ep: the run built [0, 2, 3, 4, 5, 6, 7, 9], the layout has [0, 1, 2, 3, 4, 5, "
           "6, 7]",
           "stdout");
    it_free(&run);
    /* the same file against another layout: the first difference is named */
    it_main(&run, "--compare-groups %s --framework megatron --world 32 --pp 4 --ep 4", groups);
    it_expect(&run, HX_EXIT_FAIL, NULL);
    it_has(run.out,
           "rank 0, ep: the run built [0, 1, 2, 3, 4, 5, 6, 7], the layout has [0, 1, 2, "
           "3]",
           "stdout");
    it_free(&run);
    it_main(&run, "--compare-groups %s --world 8 --ep 2", groups);
    it_expect(&run, HX_EXIT_FAIL, NULL);
    it_has(run.out, "world: the run had 32 ranks, the layout has 8", "stdout");
    it_free(&run);
    /* a middle stage has no embedding group: null says so */
    snprintf(path, sizeof path, "%s/pp4.json", hx_test_dir("compare"));
    write_file(path, "{\"ranks\": [{\"rank\": 0, \"embedding\": [0, 3]}, {\"rank\": 1, "
                     "\"embedding\": null}, {\"rank\": 2, \"embedding\": null}, {\"rank\": 3, "
                     "\"embedding\": [3, 0], \"experts\": [0, 1, 2, 3]}]}");
    it_main(&run, "--compare-groups %s --world 4 --pp 4 --ep 1 --experts 4", path);
    it_expect(&run, HX_EXIT_PASS, NULL);
    it_free(&run);
    it_main(&run, "--compare-groups %s --world 4 --pp 2 --ep 1 --experts 4", path);
    it_expect(&run, HX_EXIT_FAIL, NULL);
    it_has(run.out, "rank 0, embedding: the run built [0, 3], the layout has [0, 2]", "stdout");
    it_free(&run);
}

static void malformed_groups_files(void **state)
{
    (void)state;
    static const struct {
        const char *text, *why;
    } cases[] = {
        {"{\"ranks\": [{\"rank\": 0}, {\"rank\": 0}]}", "ranks[1]: rank 0 has two "
                                                        "entries"},
        {"{\"ranks\": [{\"rank\": 0, \"tp\": [0, 0]}, {\"rank\": 1}]}", "ranks[0].tp: 0 is "
                                                                        "listed twice"},
        {"{\"ranks\": [{\"rank\": 0, \"tp\": [2]}, {\"rank\": 1}]}", "ranks[0].tp[0]: expected "
                                                                     "an integer in 0..1"},
        {"{\"ranks\": [{\"rank\": 0, \"dense\": [0]}]}", "unknown member \"dense\""},
        {"{\"ranks\": [{\"rank\": 0}], \"world\": 2}", "world: expected the number of ranks "
                                                       "entries, 1"},
        {"{\"format\": \"groups\", \"ranks\": [{\"rank\": 0}]}", "format: expected "
                                                                 "\"seldp-groups\""},
        {"{\"ranks\": []}", "ranks: expected a non-empty array"},
        {"[]", "expected an object with \"ranks\""},
        {"{\"ranks\": [{\"rank\": 0, \"tp\": \"0\"}]}", "ranks[0].tp: expected an array of "
                                                        "integers or null"},
    };
    char path[1200];
    snprintf(path, sizeof path, "%s/g.json", hx_test_dir("malformed"));
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        write_file(path, cases[i].text);
        it_run run;
        it_main(&run, "--compare-groups %s --world 2 --ep 1", path);
        it_expect(&run, HX_EXIT_USAGE, cases[i].why);
        it_free(&run);
    }
    it_run run;
    it_main(&run, "--compare-groups /nonexistent/g.json");
    it_expect(&run, HX_EXIT_USAGE, "/nonexistent/g.json");
    it_free(&run);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(json_round_trips), cmocka_unit_test(roots_shown),
        cmocka_unit_test(columns_aligned),  cmocka_unit_test(refuses_what_it_would_ignore),
        cmocka_unit_test(compare_groups),   cmocka_unit_test(malformed_groups_files),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
