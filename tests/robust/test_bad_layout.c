/* The bad-input matrix of layouts (docs/formats.md, Layout files): malformed and inconsistent
 * layout files, and generated layouts with impossible sizes, one row per case. Each row must fail
 * with the documented status and a one-line message naming the file, the line:column and what was
 * expected; produce no layout (the output stays NULL); and leak nothing (the asan preset
 * runs this too). The layout's own JSON round-trips for the rows that are valid. */
#define _POSIX_C_SOURCE 200809L

#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cli.h"
#include "json.h"
#include "layout.h"

#define FILE_NAME "bad.json"

/* A two-group layout of four ranks and four experts that the rows spoil. */
#define GOOD_GROUPS  "\"ep_groups\": [[0, 1], [2, 3]]"
#define GOOD_EXPERTS "\"experts\": [{\"owners\": [0, 2]}, {\"owners\": [1, 3], \"root\": 3}]"

/* A grid of four ranks at tp 2 (its groups, report.json's form) that the grid rows spoil. */
#define GRID_TP "\"tp\": [[0, 1], [2, 3]]"
#define GRID_REST                                                                                  \
    "\"pp\": [[0], [1], [2], [3]], \"cp\": [[0], [1], [2], [3]], \"dp\": [[0, 2], [1, 3]], "       \
    "\"ep\": [[0, 2], [1, 3]], \"expert_dp\": [[0, 1], [2, 3]], "                                  \
    "\"expert_tp\": [[0], [1], [2], [3]]"
#define GRID_GOOD "{\"tp\": 2, \"experts\": [{}, {}], \"groups\": {" GRID_TP ", " GRID_REST "}}"

typedef struct lrow {
    const char *name;
    const char *text;
    size_t len;  /* 0: strlen(text) */
    int world;   /* required --world, or 0 */
    int experts; /* required --experts, or 0 */
    seldp_status expected;
    const char *needles[3];
} lrow;

/* 70 nested arrays: deeper than the parser's limit of 64 */
#define DEEP                                                                                       \
    "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["                       \
    "]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]"

static const lrow MATRIX[] = {
    /* name                                text len world experts expected             needles */
    {"empty file", "", 0, 0, 0, SELDP_ERR_PARSE, {FILE_NAME ":1:1", "empty document"}},
    {"only whitespace", " \n\t ", 0, 0, 0, SELDP_ERR_PARSE, {FILE_NAME ":2:3", "empty document"}},
    {"truncated object",
     "{" GOOD_GROUPS ",",
     0,
     0,
     0,
     SELDP_ERR_PARSE,
     {FILE_NAME ":1:32", "expected a member name"}},
    {"NUL byte inside",
     "{\"ep_groups\"\0: []}",
     18,
     0,
     0,
     SELDP_ERR_PARSE,
     {FILE_NAME ":1:13", "expected ':' after member \"ep_groups\""}},
    {"invalid UTF-8 in a string",
     "{\"description\": \"\xff\"}",
     0,
     0,
     0,
     SELDP_ERR_PARSE,
     {FILE_NAME ":1:18", "invalid UTF-8"}},
    {"nesting deeper than 64",
     "{\"description\": " DEEP "}",
     0,
     0,
     0,
     SELDP_ERR_PARSE,
     {FILE_NAME ":1:", "nesting deeper than 64 levels"}},
    {"duplicate member",
     "{" GOOD_GROUPS ", " GOOD_GROUPS "}",
     0,
     0,
     0,
     SELDP_ERR_PARSE,
     {FILE_NAME ":1:33", "duplicate member \"ep_groups\""}},
    {"trailing comma",
     "{" GOOD_GROUPS ", " GOOD_EXPERTS ",}",
     0,
     0,
     0,
     SELDP_ERR_PARSE,
     {FILE_NAME ":1:", "trailing comma in an object"}},
    {"text after the document",
     "{" GOOD_GROUPS ", " GOOD_EXPERTS "} {}",
     0,
     0,
     0,
     SELDP_ERR_PARSE,
     {FILE_NAME ":1:", "after the end of the document"}},
    {"number with 70 digits",
     "{\"world\": 1234567890123456789012345678901234567890123456789012345678901234567890}",
     0,
     0,
     0,
     SELDP_ERR_PARSE,
     {FILE_NAME ":1:11", "longer than 63 characters"}},
    {"number out of range",
     "{\"world\": 1e999}",
     0,
     0,
     0,
     SELDP_ERR_PARSE,
     {FILE_NAME ":1:11", "out of range"}},
    {"lone surrogate escape",
     "{\"description\": \"\\udc00\"}",
     0,
     0,
     0,
     SELDP_ERR_PARSE,
     {FILE_NAME ":1:18", "lone low surrogate"}},
    {"\\u0000 in a string",
     "{\"description\": \"a\\u0000\"}",
     0,
     0,
     0,
     SELDP_ERR_PARSE,
     {FILE_NAME ":1:19", "\\u0000 is not allowed"}},
    {"top level is an array",
     "[]",
     0,
     0,
     0,
     SELDP_ERR_INVALID_ARGUMENT,
     {FILE_NAME ":1:1", "expected an object with ep_groups and experts, found a array"}},
    {"unknown member",
     "{\"grups\": []}",
     0,
     0,
     0,
     SELDP_ERR_INVALID_ARGUMENT,
     {FILE_NAME ":1:11", "unknown member \"grups\""}},
    {"ep_groups missing",
     "{" GOOD_EXPERTS "}",
     0,
     0,
     0,
     SELDP_ERR_INVALID_ARGUMENT,
     {FILE_NAME ":1:1", "missing \"ep_groups\""}},
    {"experts missing",
     "{" GOOD_GROUPS "}",
     0,
     0,
     0,
     SELDP_ERR_INVALID_ARGUMENT,
     {FILE_NAME ":1:1", "missing \"experts\""}},
    {"ep_groups empty",
     "{\"ep_groups\": [], " GOOD_EXPERTS "}",
     0,
     0,
     0,
     SELDP_ERR_INVALID_ARGUMENT,
     {FILE_NAME ":1:15", "ep_groups: expected a non-empty array"}},
    {"ep_groups an object",
     "{\"ep_groups\": {}, " GOOD_EXPERTS "}",
     0,
     0,
     0,
     SELDP_ERR_INVALID_ARGUMENT,
     {FILE_NAME ":1:15", "ep_groups: expected a non-empty array"}},
    {"experts empty",
     "{" GOOD_GROUPS ", \"experts\": []}",
     0,
     0,
     0,
     SELDP_ERR_INVALID_ARGUMENT,
     {FILE_NAME ":1:44", "experts: expected a non-empty array"}},
    {"a group is a number",
     "{\"ep_groups\": [[0, 1], 2], " GOOD_EXPERTS "}",
     0,
     0,
     0,
     SELDP_ERR_INVALID_ARGUMENT,
     {FILE_NAME ":1:24", "ep_groups[1]: expected an array of ranks, found a number"}},
    {"a group is empty",
     "{\"ep_groups\": [[0, 1], []], " GOOD_EXPERTS "}",
     0,
     0,
     0,
     SELDP_ERR_INVALID_ARGUMENT,
     {FILE_NAME ":1:24", "ep_groups[1]: is empty"}},
    {"rank in two groups",
     "{\"ep_groups\": [[0, 1], [1, 2]], " GOOD_EXPERTS "}",
     0,
     0,
     0,
     SELDP_ERR_INVALID_ARGUMENT,
     {FILE_NAME ":1:24", "rank 1 is already in ep_groups[0]", "partition the world"}},
    {"rank listed twice",
     "{\"ep_groups\": [[0, 0], [2, 3]], " GOOD_EXPERTS "}",
     0,
     0,
     0,
     SELDP_ERR_INVALID_ARGUMENT,
     {FILE_NAME ":1:20", "ep_groups[0]: rank 0 is listed twice"}},
    {"rank outside the world",
     "{\"world\": 4, \"ep_groups\": [[0, 1], [2, 7]], " GOOD_EXPERTS "}",
     0,
     0,
     0,
     SELDP_ERR_INVALID_ARGUMENT,
     {FILE_NAME ":1:40", "ep_groups[1]: rank 7 is outside the world (0..3)"}},
    {"negative rank",
     "{\"ep_groups\": [[0, -1], [2, 3]], " GOOD_EXPERTS "}",
     0,
     0,
     0,
     SELDP_ERR_INVALID_ARGUMENT,
     {FILE_NAME ":1:20", "rank -1 is outside the world"}},
    {"rank with a fraction",
     "{\"ep_groups\": [[0, 1.5], [2, 3]], " GOOD_EXPERTS "}",
     0,
     0,
     0,
     SELDP_ERR_INVALID_ARGUMENT,
     {FILE_NAME ":1:20", "expected a rank (an integer), found a number"}},
    {"rank as a string",
     "{\"ep_groups\": [[0, \"1\"], [2, 3]], " GOOD_EXPERTS "}",
     0,
     0,
     0,
     SELDP_ERR_INVALID_ARGUMENT,
     {FILE_NAME ":1:20", "expected a rank (an integer), found a string"}},
    {"rank beyond 64 bits",
     "{\"ep_groups\": [[0, 99999999999999999999], [2, 3]], " GOOD_EXPERTS "}",
     0,
     0,
     0,
     SELDP_ERR_INVALID_ARGUMENT,
     {FILE_NAME ":1:20", "expected a rank (an integer)"}},
    {"world 0",
     "{\"world\": 0, " GOOD_GROUPS ", " GOOD_EXPERTS "}",
     0,
     0,
     0,
     SELDP_ERR_INVALID_ARGUMENT,
     {FILE_NAME ":1:11", "world: expected a positive integer"}},
    {"world 2^40",
     "{\"world\": 1099511627776, " GOOD_GROUPS ", " GOOD_EXPERTS "}",
     0,
     0,
     0,
     SELDP_ERR_INVALID_ARGUMENT,
     {FILE_NAME ":1:11", "world: expected a positive integer"}},
    {"rank in no group",
     "{\"world\": 5, " GOOD_GROUPS ", " GOOD_EXPERTS "}",
     0,
     0,
     0,
     SELDP_ERR_INVALID_ARGUMENT,
     {FILE_NAME ": rank 4 is in no expert-parallel group", "must cover the world (0..4)"}},
    {"world differs from --world",
     "{" GOOD_GROUPS ", " GOOD_EXPERTS "}",
     0,
     8,
     0,
     SELDP_ERR_INVALID_ARGUMENT,
     {FILE_NAME ":1:15", "for a world of 4 ranks but --world is 8"}},
    {"experts differ from --experts",
     "{" GOOD_GROUPS ", " GOOD_EXPERTS "}",
     0,
     0,
     3,
     SELDP_ERR_INVALID_ARGUMENT,
     {FILE_NAME ":1:44", "lists 2 experts but the model has 3 (--experts)"}},
    {"expert not an object",
     "{" GOOD_GROUPS ", \"experts\": [[0, 2]]}",
     0,
     0,
     0,
     SELDP_ERR_INVALID_ARGUMENT,
     {FILE_NAME ":1:45", "experts[0]: expected {\"owners\": [...], \"root\": r}, found a array"}},
    {"expert without owners",
     "{" GOOD_GROUPS ", \"experts\": [{\"root\": 0}]}",
     0,
     0,
     0,
     SELDP_ERR_INVALID_ARGUMENT,
     {FILE_NAME ":1:45", "experts[0]: missing \"owners\""}},
    {"expert with empty owners",
     "{" GOOD_GROUPS ", \"experts\": [{\"owners\": []}]}",
     0,
     0,
     0,
     SELDP_ERR_INVALID_ARGUMENT,
     {FILE_NAME ":1:56", "experts[0].owners: is empty"}},
    {"expert with an unknown member",
     "{" GOOD_GROUPS ", \"experts\": [{\"owners\": [0, 2], \"hot\": true}]}",
     0,
     0,
     0,
     SELDP_ERR_INVALID_ARGUMENT,
     {FILE_NAME ":1:71", "experts[0]: unknown member \"hot\""}},
    {"expert with no owner in a group",
     "{" GOOD_GROUPS ", \"experts\": [{\"owners\": [0, 1]}]}",
     0,
     0,
     0,
     SELDP_ERR_INVALID_ARGUMENT,
     {FILE_NAME ": expert 0 (owners [0,1]) has no owner in expert-parallel group 1 [2,3]"}},
    {"expert root not an owner",
     "{" GOOD_GROUPS ", \"experts\": [{\"owners\": [0, 2], \"root\": 1}]}",
     0,
     0,
     0,
     SELDP_ERR_INVALID_ARGUMENT,
     {FILE_NAME ":1:72", "experts[0].root: root 1 is not in its group: the owners are [0,2]"}},
    {"shared_root outside the world",
     "{\"shared_root\": 4, " GOOD_GROUPS ", " GOOD_EXPERTS "}",
     0,
     0,
     0,
     SELDP_ERR_INVALID_ARGUMENT,
     {FILE_NAME ":1:17", "shared_root: rank 4 is outside the world (0..3)"}},
    {"grid without groups",
     "{\"tp\": 2, " GOOD_GROUPS ", " GOOD_EXPERTS "}",
     0,
     0,
     0,
     SELDP_ERR_INVALID_ARGUMENT,
     {FILE_NAME ":1:1", "missing \"groups\"", "lists the groups of every kind"}},
    {"grid size not an integer",
     "{\"pp\": \"2\", " GOOD_GROUPS ", " GOOD_EXPERTS "}",
     0,
     0,
     0,
     SELDP_ERR_INVALID_ARGUMENT,
     {FILE_NAME ":1:8", "pp: expected a positive integer"}},
    {"grid groups not an object",
     "{\"cp\": 2, \"experts\": [{}], \"groups\": [[0]]}",
     0,
     0,
     0,
     SELDP_ERR_INVALID_ARGUMENT,
     {FILE_NAME ":1:38", "groups: expected an object of rank-list arrays, found a array"}},
    {"grid kind missing",
     "{\"tp\": 2, \"experts\": [{}, {}], \"groups\": {" GRID_TP "}}",
     0,
     0,
     0,
     SELDP_ERR_INVALID_ARGUMENT,
     {FILE_NAME ":1:42", "groups: missing \"pp\""}},
    {"grid kind empty",
     "{\"tp\": 2, \"world\": 4, \"experts\": [{}, {}], \"groups\": {\"tp\": [], " GRID_REST "}}",
     0,
     0,
     0,
     SELDP_ERR_INVALID_ARGUMENT,
     {FILE_NAME ":1:", "groups.tp: expected a non-empty array of rank arrays"}},
    {"grid groups of two sizes",
     "{\"tp\": 2, \"experts\": [{}, {}], \"groups\": {\"tp\": [[0, 1], [2]], " GRID_REST "}}",
     0,
     0,
     0,
     SELDP_ERR_INVALID_ARGUMENT,
     {FILE_NAME ":1:58", "groups.tp[1]: 1 ranks where groups.tp[0] has 2"}},
    {"grid rank outside the world",
     "{\"tp\": 2, \"world\": 4, \"experts\": [{}, {}], \"groups\": {\"tp\": [[0, 1], [2, "
     "4]], " GRID_REST "}}",
     0,
     0,
     0,
     SELDP_ERR_INVALID_ARGUMENT,
     {FILE_NAME ":1:", "groups.tp[1]: rank 4 is outside the world (0..3)"}},
    {"grid rank in two groups",
     "{\"tp\": 2, \"world\": 4, \"experts\": [{}, {}], \"groups\": {\"tp\": [[0, 1], [1, "
     "3]], " GRID_REST "}}",
     0,
     0,
     0,
     SELDP_ERR_INVALID_ARGUMENT,
     {FILE_NAME ":1:", "rank 1 is listed twice in the tp groups"}},
    {"grid tp group across stages",
     "{\"tp\": 2, \"pp\": 2, \"etp\": 1, \"experts\": [{}], \"groups\": {\"tp\": [[0, 1], [2, 3]], "
     "\"pp\": [[0, 1], [2, 3]], \"cp\": [[0], [1], [2], [3]], \"dp\": [[0], [1], [2], [3]], "
     "\"ep\": [[0], [1], [2], [3]], \"expert_dp\": [[0, 1], [2, 3]], "
     "\"expert_tp\": [[0], [1], [2], [3]]}}",
     0,
     0,
     0,
     SELDP_ERR_INVALID_ARGUMENT,
     {FILE_NAME ":1:", "tp group 0 holds rank 0 (stage 0) and rank 1 (stage 1)",
      "inside one stage"}},
    {"grid of the wrong world",
     GRID_GOOD,
     0,
     8,
     0,
     SELDP_ERR_INVALID_ARGUMENT,
     {FILE_NAME ":1:", "for a world of 4 ranks but --world is 8"}},
    {"grid uneven owners",
     "{\"tp\": 2, \"experts\": [{\"owners\": [0, 1, 3]}, {}], \"groups\": {" GRID_TP ", " GRID_REST
     "}}",
     0,
     0,
     0,
     SELDP_ERR_INVALID_ARGUMENT,
     {FILE_NAME ":1:", "experts[0].owners: [0,1,3]", "need tp = pp = cp = etp = 1"}},
    {"grid framework unknown",
     "{\"etp\": 2, \"framework\": 3, \"experts\": [{}], \"groups\": {}}",
     0,
     0,
     0,
     SELDP_ERR_INVALID_ARGUMENT,
     {FILE_NAME ":1:", "framework: expected null"}},
    {"description not a string",
     "{\"description\": 7, " GOOD_GROUPS ", " GOOD_EXPERTS "}",
     0,
     0,
     0,
     SELDP_ERR_INVALID_ARGUMENT,
     {FILE_NAME ":1:17", "description: expected a string"}},
};

#define N_ROWS (sizeof MATRIX / sizeof MATRIX[0])

static void bad_layout_files(void **state)
{
    (void)state;
    int failures = 0;
    for (size_t i = 0; i < N_ROWS; i++) {
        const lrow *r = &MATRIX[i];
        size_t len = r->len ? r->len : strlen(r->text);
        hx_layout *l = NULL;
        /* the text as a file holds it: no terminating NUL to lean on */
        char *text = malloc(len ? len : 1);
        assert_non_null(text);
        memcpy(text, r->text, len);
        seldp_status st =
            hx_layout_parse(text, len, FILE_NAME, r->world, r->experts, HX_ROOTS_FIRST, &l);
        free(text);
        const char *msg = hx_last_error();
        if (getenv("SELDP_TEST_VERBOSE"))
            printf("  %-34s %-27s %s\n", r->name, seldp_status_name(st), msg);
        /* every row is checked, then the test fails with the count */
        if (st != r->expected) {
            print_error("%s: returned %s, expected %s (message: %s)\n", r->name,
                        seldp_status_name(st), seldp_status_name(r->expected), msg);
            failures++;
        }
        if (l) {
            print_error("%s: a layout came back with the error\n", r->name);
            hx_layout_destroy(l);
            failures++;
        }
        if (strchr(msg, '\n')) {
            print_error("%s: the message is not one line: %s\n", r->name, msg);
            failures++;
        }
        for (int n = 0; n < 3; n++) {
            if (r->needles[n] && !strstr(msg, r->needles[n])) {
                print_error("%s: the message lacks \"%s\": %s\n", r->name, r->needles[n], msg);
                failures++;
            }
        }
    }
    printf("  %zu rows\n", N_ROWS);
    assert_int_equal(failures, 0);
}

typedef struct grow {
    const char *name;
    int world, ep, experts;
    const char *needle;
} grow;

static void bad_generated_layouts(void **state)
{
    (void)state;
    static const grow rows[] = {
        {"world 0", 0, 1, 4, "--world 0: needs at least one rank"},
        {"world -8", -8, 1, 4, "--world -8: needs at least one rank"},
        {"ep 0", 8, 0, 4, "--ep 0: must be >= 1 and divide --world 8"},
        {"ep not dividing the world", 8, 3, 6, "--ep 3: must be >= 1 and divide --world 8"},
        {"ep above the world", 4, 8, 8, "--ep 8: must be >= 1 and divide --world 4"},
        {"experts not a multiple of ep", 8, 4, 6,
         "--experts 6: must be a positive multiple of --ep 4"},
        {"experts 0", 8, 4, 0, "--experts 0: must be a positive multiple"},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        hx_layout *l = NULL;
        seldp_status st = hx_layout_generate(rows[i].world, rows[i].ep, rows[i].experts,
                                             HX_ORDER_EP_DP, HX_ROOTS_FIRST, &l);
        if (st != SELDP_ERR_INVALID_ARGUMENT || l)
            fail_msg("%s: returned %s, expected SELDP_ERR_INVALID_ARGUMENT and no layout",
                     rows[i].name, seldp_status_name(st));
        if (!strstr(hx_last_error(), rows[i].needle))
            fail_msg("%s: the message lacks \"%s\": %s", rows[i].name, rows[i].needle,
                     hx_last_error());
    }
}

/* A layout file that cannot be read names itself and says why. */
static void unreadable_layout_files(void **state)
{
    (void)state;
    hx_layout *l = NULL;
    assert_int_equal(hx_layout_load("/nonexistent/layout.json", 0, 0, HX_ROOTS_FIRST, &l),
                     SELDP_ERR_INVALID_ARGUMENT);
    assert_null(l);
    assert_non_null(strstr(hx_last_error(), "--layout-file"));
    assert_non_null(strstr(hx_last_error(), "/nonexistent/layout.json"));
}

/* The smallest valid layouts load, and their JSON reproduces them. */
static void edge_layouts_round_trip(void **state)
{
    (void)state;
    static const char *const texts[] = {
        "{\"ep_groups\": [[0]], \"experts\": [{\"owners\": [0]}]}",
        "{\"world\": 3, \"ep_groups\": [[2], [0], [1]], \"experts\": [{\"owners\": [0, 1, 2], "
        "\"root\": 1}]}",
        "{" GOOD_GROUPS ", " GOOD_EXPERTS ", \"description\": \"\\u00e9\\ud83d\\ude00\"}",
        GRID_GOOD,
    };
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
        hx_layout *a = NULL, *b = NULL;
        hx_buf ja = {0}, jb = {0};
        assert_int_equal(
            hx_layout_parse(texts[i], strlen(texts[i]), "edge.json", 0, 0, HX_ROOTS_SPREAD, &a),
            SELDP_OK);
        hx_layout_json(a, &ja);
        assert_int_equal(
            hx_layout_parse(hx_buf_str(&ja), ja.len, "again.json", 0, 0, HX_ROOTS_FIRST, &b),
            SELDP_OK);
        hx_layout_json(b, &jb);
        assert_string_equal(hx_buf_str(&ja), hx_buf_str(&jb));
        hx_buf_free(&ja);
        hx_buf_free(&jb);
        hx_layout_destroy(a);
        hx_layout_destroy(b);
    }
}

/* The program on a bad grid file: exit status 2, one line on stderr naming the file and the
 * line:column, nothing run. */
static void bad_grid_files_exit_2(void **state)
{
    (void)state;
    static const char *const rows[] = {
        "{\"tp\": 2, \"experts\": [{}, {}], \"groups\": {\"tp\": [[0, 1], [2]], " GRID_REST "}}",
        "{\"tp\": 2, \"experts\": [{}, {}], \"groups\": {\"tp\": [[0, 2], [1, 3]], " GRID_REST "}}",
        "{\"tp\": 2, \"experts\": [{}, {}, {}], \"groups\": {" GRID_TP ", " GRID_REST "}}",
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        char path[] = "/tmp/seldp-bad-grid-XXXXXX";
        int fd = mkstemp(path);
        assert_true(fd >= 0);
        FILE *f = fdopen(fd, "w");
        assert_non_null(f);
        fputs(rows[i], f);
        fclose(f);
        FILE *out = tmpfile(), *err = tmpfile();
        assert_non_null(out);
        assert_non_null(err);
        char *argv[] = {"seldp-harness", "--layout-file", path, "--steps", "1",
                        "--out",         "none",          NULL};
        int status = hx_main(7, argv, out, err);
        char text[2048] = "";
        rewind(err);
        size_t n = fread(text, 1, sizeof text - 1, err);
        text[n] = '\0';
        remove(path);
        fclose(out);
        fclose(err);
        if (status != HX_EXIT_USAGE)
            fail_msg("row %zu: exit status %d, expected 2: %s", i, status, text);
        char where[64];
        snprintf(where, sizeof where, "%s:1:", path);
        char *nl = strchr(text, '\n');
        if (!strstr(text, where) || !nl || nl[1] != '\0')
            fail_msg("row %zu: expected one line naming %s: %s", i, where, text);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(bad_layout_files),        cmocka_unit_test(bad_generated_layouts),
        cmocka_unit_test(unreadable_layout_files), cmocka_unit_test(edge_layouts_round_trip),
        cmocka_unit_test(bad_grid_files_exit_2),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
