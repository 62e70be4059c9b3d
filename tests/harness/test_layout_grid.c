/* Layout files of the full grid (tp, pp, cp, etp above 1 with "groups" of every kind): the
 * example file loads to Megatron's groups; report.json's layout of a sharded run, fed back
 * as a layout file, reproduces the run (groups, losses, gradient errors); a relabelled grid
 * no preset builds trains and passes; bad grid files fail in one line naming the place. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "harness_test.h"
#include "layout.h"

/* A JSON value written back as text (the test's own writer: numbers are integers or %.17g). */
static void json_write(const hx_json *v, hx_buf *b)
{
    switch (v->type) {
    case HX_JSON_NULL:
        hx_buf_puts(b, "null");
        break;
    case HX_JSON_BOOL:
        hx_buf_puts(b, v->boolean ? "true" : "false");
        break;
    case HX_JSON_NUMBER:
        if (v->is_integer)
            hx_buf_printf(b, "%lld", (long long)v->integer);
        else
            hx_buf_printf(b, "%.17g", v->number);
        break;
    case HX_JSON_STRING:
        hx_buf_json_string(b, v->string);
        break;
    case HX_JSON_ARRAY:
    case HX_JSON_OBJECT:
        hx_buf_puts(b, v->type == HX_JSON_ARRAY ? "[" : "{");
        for (size_t i = 0; i < v->count; i++) {
            hx_buf_puts(b, i ? ", " : "");
            if (v->type == HX_JSON_OBJECT) {
                hx_buf_json_string(b, v->keys[i]);
                hx_buf_puts(b, ": ");
            }
            json_write(&v->items[i], b);
        }
        hx_buf_puts(b, v->type == HX_JSON_ARRAY ? "]" : "}");
        break;
    }
}

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static const hx_json *member(const hx_json *object, const char *key)
{
    const hx_json *v = hx_json_get(object, key);
    if (!v)
        fail_msg("no member \"%s\"", key);
    return v;
}

/* Run `args` and the model options `model` with --out, feed its report's layout back through
 * --layout-file, and require the same layout (groups, sizes, owners, roots) and the same steps
 * (loss, reference loss, worst gradient error and where, tokens). */
static void expect_round_trip(const char *args, const char *model)
{
    char first[512], second[512], file[600];
    hx_test_run run;
    snprintf(first, sizeof first, "%s", hx_test_dir("first"));
    hx_test_harness(&run, "%s %s --steps 2 --tokens 24 --quiet --out %s", args, model, first);
    if (run.status != 0)
        fail_msg("%s: status %d: %s", args, run.status, run.err);
    hx_json *a = hx_test_report(first);
    hx_buf text = {0};
    json_write(member(a, "layout"), &text);
    snprintf(second, sizeof second, "%s", hx_test_dir("second"));
    snprintf(file, sizeof file, "%s/layout.json", second);
    write_file(file, hx_buf_str(&text));
    hx_test_harness(&run, "--layout-file %s %s --steps 2 --tokens 24 --quiet --out %s", file, model,
                    second);
    if (run.status != 0)
        fail_msg("%s fed back: status %d: %s", args, run.status, run.err);
    hx_json *b = hx_test_report(second);
    hx_buf again = {0};
    json_write(member(b, "layout"), &again);
    if (strcmp(hx_buf_str(&text), hx_buf_str(&again)) != 0)
        fail_msg("%s: the layout fed back differs:\n%s\n%s", args, hx_buf_str(&text),
                 hx_buf_str(&again));
    const hx_json *sa = member(a, "steps"), *sb = member(b, "steps");
    assert_int_equal(sa->count, 2);
    assert_int_equal(sb->count, sa->count);
    static const char *const keys[] = {"tokens", "loss",       "reference_loss",
                                       "worst",  "worst_path", "worst_rank"};
    for (size_t s = 0; s < sa->count; s++)
        for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++) {
            hx_buf x = {0}, y = {0};
            json_write(member(&sa->items[s], keys[k]), &x);
            json_write(member(&sb->items[s], keys[k]), &y);
            if (strcmp(hx_buf_str(&x), hx_buf_str(&y)) != 0)
                fail_msg("%s: step %zu: %s %s fed back, %s before", args, s + 1, keys[k],
                         hx_buf_str(&y), hx_buf_str(&x));
            hx_buf_free(&x);
            hx_buf_free(&y);
        }
    hx_buf_free(&text);
    hx_buf_free(&again);
    hx_json_free(a);
    hx_json_free(b);
}

static void test_report_round_trip(void **state)
{
    (void)state;
    expect_round_trip("--framework megatron --world 8 --tp 2 --pp 2 --ep 2",
                      "--shared-expert-ff 64");
    expect_round_trip("--framework deepspeed --world 8 --tp 2 --ep 2 --etp 2", "--dtype f32");
    expect_round_trip("--framework megatron-0.9 --world 8 --pp 2 --ep 2 --etp 1", "");
    expect_round_trip("--framework megatron --world 4 --cp 2 --ep 2", "--capacity-factor 1.25");
}

/* The shipped example: Megatron's tp 2, pp 2, ep 2 grid of 8 ranks, as the preset builds it. */
static void test_example_file(void **state)
{
    (void)state;
    hx_layout *file = NULL, *preset = NULL;
    if (hx_layout_load(hx_test_layout("megatron-tp2-pp2.json"), 0, 0, HX_ROOTS_FIRST, &file) !=
        SELDP_OK)
        fail_msg("%s", hx_last_error());
    hx_grid grid = HX_GRID_INIT;
    grid.tp = grid.pp = 2;
    assert_int_equal(hx_layout_generate_grid(8, 2, 8, &grid, HX_ROOTS_FIRST, &preset), SELDP_OK);
    assert_non_null(file->grid);
    seldp_layout_config c = seldp_layout_get_config(file->grid);
    assert_int_equal(c.framework, SELDP_FRAMEWORK_MEGATRON);
    assert_int_equal(c.tp, 2);
    assert_int_equal(c.pp, 2);
    assert_int_equal(c.etp, 2);
    for (int k = 0; k < SELDP_GROUP_KINDS; k++) {
        int n = seldp_layout_group_count(preset->grid, (seldp_group_kind)k);
        assert_int_equal(seldp_layout_group_count(file->grid, (seldp_group_kind)k), n);
        for (int g = 0; g < n; g++) {
            const int *x = NULL, *y = NULL;
            int size = seldp_layout_group(preset->grid, (seldp_group_kind)k, g, &x);
            assert_int_equal(seldp_layout_group(file->grid, (seldp_group_kind)k, g, &y), size);
            assert_memory_equal(x, y, (size_t)size * sizeof *x);
        }
    }
    hx_buf a = {0}, b = {0};
    hx_layout_json(file, &a);
    hx_layout_json(preset, &b);
    /* the same JSON but for the description */
    assert_non_null(strstr(hx_buf_str(&a), "\"world\": 8"));
    assert_string_equal(strstr(hx_buf_str(&a), "\"world\""), strstr(hx_buf_str(&b), "\"world\""));
    hx_buf_free(&a);
    hx_buf_free(&b);
    hx_layout_destroy(file);
    hx_layout_destroy(preset);
    /* --print-layout prints every kind of the file's grid, as for --framework */
    hx_test_run run;
    hx_test_harness(&run, "--print-layout --layout-file %s",
                    hx_test_layout("megatron-tp2-pp2.json"));
    assert_int_equal(run.status, 0);
    if (!strstr(run.out, "  pp          4 x 2  [0,4] [1,5] [2,6] [3,7]\n") ||
        !strstr(run.out, "  expert_tp   4 x 2  [0,1] [2,3] [4,5] [6,7]\n"))
        fail_msg("--print-layout of the example:\n%s", run.out);
}

/* Megatron's world 8, tp 2, pp 2, ep 2 groups with every rank r renamed 7 - r: the stages
 * swap and no preset builds it; the harness trains it and every check passes. */
static void test_relabelled_grid(void **state)
{
    (void)state;
    hx_layout *preset = NULL;
    hx_grid grid = HX_GRID_INIT;
    grid.tp = grid.pp = 2;
    assert_int_equal(hx_layout_generate_grid(8, 2, 8, &grid, HX_ROOTS_FIRST, &preset), SELDP_OK);
    hx_buf b = {0};
    hx_buf_puts(&b, "{\"tp\": 2, \"pp\": 2, \"etp\": 2, \"experts\": [{}, {}, {}, {}, {}, {}, {}, "
                    "{}], \"groups\": {");
    for (int k = 0; k < SELDP_GROUP_KINDS; k++) {
        hx_buf_printf(&b, "%s\"%s\": [", k ? ", " : "", seldp_group_kind_name((seldp_group_kind)k));
        for (int g = 0; g < seldp_layout_group_count(preset->grid, (seldp_group_kind)k); g++) {
            const int *ranks = NULL;
            int n = seldp_layout_group(preset->grid, (seldp_group_kind)k, g, &ranks);
            hx_buf_puts(&b, g ? ", [" : "[");
            for (int i = 0; i < n; i++)
                hx_buf_printf(&b, "%s%d", i ? ", " : "", 7 - ranks[i]);
            hx_buf_puts(&b, "]");
        }
        hx_buf_puts(&b, "]");
    }
    hx_buf_puts(&b, "}}");
    char file[600];
    snprintf(file, sizeof file, "%s/relabelled.json", hx_test_dir("relabelled"));
    write_file(file, hx_buf_str(&b));
    hx_layout *l = NULL;
    if (hx_layout_load(file, 0, 0, HX_ROOTS_FIRST, &l) != SELDP_OK)
        fail_msg("%s", hx_last_error());
    /* the order of every group is reversed: positions and stages flip */
    assert_int_equal(seldp_layout_get_config(l->grid).framework, SELDP_FRAMEWORK_NONE);
    for (int r = 0; r < 8; r++) {
        assert_int_equal(seldp_layout_position(l->grid, SELDP_GROUP_TP, r),
                         1 - seldp_layout_position(preset->grid, SELDP_GROUP_TP, 7 - r));
        assert_int_equal(seldp_layout_stage(l->grid, r),
                         1 - seldp_layout_stage(preset->grid, 7 - r));
    }
    hx_layout_destroy(l);
    char args[700];
    snprintf(args, sizeof args, "--layout-file %s", file);
    hx_test_run_passes(args);
    hx_buf_free(&b);
    hx_layout_destroy(preset);
}

static void expect_file_error(const char *text, const char *why)
{
    hx_layout *l = NULL;
    seldp_status st = hx_layout_parse(text, strlen(text), "bad.json", 0, 0, HX_ROOTS_FIRST, &l);
    if (st == SELDP_OK) {
        hx_layout_destroy(l);
        fail_msg("accepted: %s", text);
    }
    assert_null(l);
    if (!strstr(hx_last_error(), why) || strncmp(hx_last_error(), "bad.json:", 9) != 0 ||
        strchr(hx_last_error(), '\n'))
        fail_msg("%s\nmessage '%s' lacks '%s'", text, hx_last_error(), why);
}

/* world 4, tp 2: tp [0,1] [2,3]; dp [0,2] [1,3]; ep, expert_dp, expert_tp as at etp 1 */
#define G_TP "\"tp\": [[0, 1], [2, 3]]"
#define G_REST                                                                                     \
    "\"pp\": [[0], [1], [2], [3]], \"cp\": [[0], [1], [2], [3]], \"dp\": [[0, 2], [1, 3]], "       \
    "\"ep\": [[0, 2], [1, 3]], \"expert_dp\": [[0, 1], [2, 3]], "                                  \
    "\"expert_tp\": [[0], [1], [2], [3]]"
#define EXPERTS2 "\"experts\": [{}, {}]"

static void test_grid_file_errors(void **state)
{
    (void)state;
    /* the good one first */
    const char *good = "{\"tp\": 2, " EXPERTS2 ", \"groups\": {" G_TP ", " G_REST "}}";
    hx_layout *l = NULL;
    if (hx_layout_parse(good, strlen(good), "good.json", 0, 0, HX_ROOTS_FIRST, &l) != SELDP_OK)
        fail_msg("%s", hx_last_error());
    assert_int_equal(l->world, 4);
    assert_int_equal(seldp_layout_get_config(l->grid).ep, 2);
    hx_layout_destroy(l);
    expect_file_error("{\"tp\": 2, " EXPERTS2 "}", "bad.json:1:1: missing \"groups\"");
    expect_file_error("{\"tp\": 0, " EXPERTS2 "}", "bad.json:1:8: tp: expected a positive integer");
    expect_file_error("{\"tp\": 2, " EXPERTS2 ", \"groups\": []}",
                      "bad.json:1:42: groups: expected an object");
    expect_file_error("{\"tp\": 2, " EXPERTS2 ", \"groups\": {\"tq\": []}}",
                      "groups: unknown member \"tq\"");
    expect_file_error("{\"tp\": 2, " EXPERTS2 ", \"groups\": {" G_TP "}}",
                      "groups: missing \"pp\" (a list of rank lists)");
    expect_file_error("{\"tp\": 2, " EXPERTS2 ", \"groups\": {\"tp\": [[0, 1], [2]], " G_REST "}}",
                      "groups.tp[1]: 1 ranks where groups.tp[0] has 2");
    expect_file_error("{\"tp\": 2, " EXPERTS2 ", \"groups\": {\"tp\": [[0, 2], [1, 3]], " G_REST
                      "}}",
                      "a dp group is the ranks of one stage and TP position");
    expect_file_error("{\"tp\": 2, \"world\": 5, " EXPERTS2 ", \"groups\": {" G_TP ", " G_REST "}}",
                      "tp * pp * cp (2) must divide the world");
    expect_file_error("{\"tp\": 2, \"experts\": [{}, {}, {}], \"groups\": {" G_TP ", " G_REST "}}",
                      "experts: lists 3 experts, expected a multiple of ep 2");
    expect_file_error("{\"tp\": 2, \"ep\": 4, " EXPERTS2 ", \"groups\": {" G_TP ", " G_REST "}}",
                      "ep: 4, but the groups of groups.ep have 2 ranks");
    expect_file_error("{\"tp\": 2, \"experts\": [{\"owners\": [0, 2]}, {}], \"groups\": {" G_TP
                      ", " G_REST "}}",
                      "experts[0].owners: [0,2], but on a grid of tp, pp, cp or etp above 1 "
                      "expert 0 is owned by the ranks of EP position 0, [0,1]");
    expect_file_error("{\"tp\": 2, \"experts\": [{\"root\": 2}, {}], \"groups\": {" G_TP ", " G_REST
                      "}}",
                      "experts[0].root: root 2 is not in its group: the owners are [0,1]");
    expect_file_error("{\"tp\": 2, \"ep_groups\": [[0, 1], [2, 3]], " EXPERTS2
                      ", \"groups\": {" G_TP ", " G_REST "}}",
                      "ep_groups[0]: not an EP group of groups.ep (rank 0's is [0,2])");
    expect_file_error("{\"tp\": 2, \"framework\": \"megatrom\", " EXPERTS2 ", \"groups\": {" G_TP
                      ", " G_REST "}}",
                      "framework: expected null, \"none\", \"megatron\"");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_example_file),
        cmocka_unit_test(test_grid_file_errors),
        cmocka_unit_test(test_relabelled_grid),
        cmocka_unit_test(test_report_round_trip),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
