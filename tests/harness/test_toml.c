/* The strict TOML reader (toml.h): what torchtitan's train configs use reads into the JSON tree
 * (tables, dotted keys, quoted keys, strings and their escapes, integers with underscores and
 * bases, floats, booleans, arrays over lines, inline tables); TOML's redefinition rules and the
 * parts outside the subset are refused with the line and column. */
#define _POSIX_C_SOURCE 200809L

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "json.h"
#include "toml.h"
#include "util.h"

static hx_json *parse(const char *text)
{
    hx_json *root = NULL;
    if (hx_toml_parse(text, strlen(text), "t.toml", &root) != SELDP_OK)
        fail_msg("%s", hx_last_error());
    return root;
}

static const hx_json *at(const hx_json *root, const char *path)
{
    char copy[256];
    snprintf(copy, sizeof copy, "%s", path);
    const hx_json *v = root;
    for (char *save = NULL, *k = strtok_r(copy, "/", &save); k && v; k = strtok_r(NULL, "/", &save))
        v = hx_json_get(v, k);
    if (!v)
        fail_msg("no %s", path);
    return v;
}

static void values(void **state)
{
    (void)state;
    hx_json *root = parse("# a comment\n"
                          "title = \"tiny\" # after a value\n"
                          "[parallelism]\n"
                          "tensor_parallel_degree = 2\n"
                          "data_parallel_shard_degree = -1\n"
                          "steps = 10_000\n"
                          "mask = 0xff\n"
                          "bits = 0b101\n"
                          "perm = 0o17\n"
                          "[training]\n"
                          "lr = 2.2e-4\n"
                          "max_norm = 1.0\n"
                          "big = +inf\n"
                          "enable=true\n"
                          "off = false\n"
                          "\"quoted key\" = 'C:\\path' # a literal string\n"
                          "escapes = \"tab\\tquote\\\" \\u00e9 \\U0001F600\"\n"
                          "fqns = [\"output\",\n  \"router.gate\", # a comment\n]\n"
                          "nested = [[1, 2], [3]]\n"
                          "point = { x = 1, y.z = 2 }\n"
                          "[quantize.linear.float8]\n"
                          "filter_fqns = []\n"
                          "a.b.c = 1\n");
    assert_string_equal(at(root, "title")->string, "tiny");
    const hx_json *tp = at(root, "parallelism/tensor_parallel_degree");
    assert_true(tp->type == HX_JSON_NUMBER && tp->is_integer && tp->integer == 2);
    assert_int_equal(tp->line, 4);
    assert_int_equal(tp->column, 26);
    assert_int_equal(at(root, "parallelism/data_parallel_shard_degree")->integer, -1);
    assert_int_equal(at(root, "parallelism/steps")->integer, 10000);
    assert_int_equal(at(root, "parallelism/mask")->integer, 255);
    assert_int_equal(at(root, "parallelism/bits")->integer, 5);
    assert_int_equal(at(root, "parallelism/perm")->integer, 15);
    const hx_json *lr = at(root, "training/lr");
    assert_false(lr->is_integer);
    assert_true(lr->number == 2.2e-4);
    assert_false(at(root, "training/max_norm")->is_integer);
    assert_true(isinf(at(root, "training/big")->number));
    assert_true(at(root, "training/enable")->boolean);
    assert_false(at(root, "training/off")->boolean);
    assert_string_equal(at(root, "training/quoted key")->string, "C:\\path");
    assert_string_equal(at(root, "training/escapes")->string,
                        "tab\tquote\" \xc3\xa9 \xf0\x9f\x98\x80");
    const hx_json *fqns = at(root, "training/fqns");
    assert_int_equal(fqns->count, 2);
    assert_string_equal(fqns->items[1].string, "router.gate");
    assert_int_equal(at(root, "training/nested")->items[0].count, 2);
    assert_int_equal(at(root, "training/point/y/z")->integer, 2);
    assert_int_equal(at(root, "quantize/linear/float8/filter_fqns")->count, 0);
    assert_int_equal(at(root, "quantize/linear/float8/a/b/c")->integer, 1);
    /* tables keep the file's order */
    assert_string_equal(root->keys[0], "title");
    assert_string_equal(root->keys[1], "parallelism");
    assert_string_equal(root->keys[3], "quantize");
    hx_json_free(root);
    /* a table header after its sub-table, an empty file, CRLF lines */
    root = parse("[a.b]\nx = 1\n[a]\ny = 2\n");
    assert_int_equal(at(root, "a/y")->integer, 2);
    assert_int_equal(at(root, "a/b/x")->integer, 1);
    hx_json_free(root);
    root = parse("");
    assert_int_equal(root->count, 0);
    hx_json_free(root);
    root = parse("[t]\r\nk = 1\r\n");
    assert_int_equal(at(root, "t/k")->integer, 1);
    hx_json_free(root);
}

static void refusals(void **state)
{
    (void)state;
    static const struct {
        const char *text, *why;
    } cases[] = {
        {"a = 1\na = 2\n", "t.toml:2:1: key a defined twice (first at line 1)"},
        {"[t]\n[t]\n", "t.toml:2:1: table [t] defined twice (first at line 1)"},
        {"a = 1\n[a]\n", "t.toml:2:1: a is a table and a value (line 1)"},
        {"a = 1\na.b = 2\n", "t.toml:2:1: a is a value (line 1), not a table"},
        {"a.b = 1\n[a]\n", "t.toml:2:1: table [a] was made by a dotted key (line 1)"},
        {"[x.y]\nq = 1\n[x]\ny.z = 2\n", "t.toml:4:1: a dotted key reopens table [x.y] (line 1)"},
        {"p = {x = 1}\np.y = 2\n", "t.toml:2:1: p is a value (line 1), not a table"},
        {"p = {x = 1, x = 2}\n", "key x defined twice in an inline table"},
        {"p = {x = 1,}\n", "t.toml:1:12: expected a key"},
        {"s = \"\"\"long\"\"\"\n", "multi-line strings are outside the TOML subset"},
        {"[[runs]]\n", "t.toml:1:1: arrays of tables ([[...]]) are outside the TOML subset"},
        {"d = 1979-05-27\n", "dates and times are outside the TOML subset"},
        {"n = 012\n", "t.toml:1:5: a number must not have leading zeros"},
        {"n = 1__0\n", "malformed number"},
        {"n = 1.\n", "a decimal point needs digits on both sides"},
        {"n = 9223372036854775808\n", "integer out of the 64-bit range"},
        {"s = \"open\n", "t.toml:1:5: unterminated string"},
        {"s = \"bad \\q\"\n", "invalid escape in a string"},
        {"s = \"\\u0000\"\n", "is not a character a string may hold"},
        {"s = \"\x01\"\n", "control character 0x01 in a string"},
        {"s = \"\xff\"\n", "invalid UTF-8 in a string"},
        {"a = 1 b = 2\n", "t.toml:1:7: expected the end of the line after the value"},
        {"a =\n", "t.toml:1:4: expected a value after '='"},
        {"a = yes\n", "t.toml:1:5: expected a value (a string, number"},
        {"= 1\n", "t.toml:1:1: expected a key"},
        {"a = [1, 2\n", "expected ',' or ']' in an array"},
        {"[t\n", "expected ']' after the table name"},
        {"# \x7f\n", "control character 0x7f in a comment"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        hx_json *root = NULL;
        seldp_status st = hx_toml_parse(cases[i].text, strlen(cases[i].text), "t.toml", &root);
        if (st != SELDP_ERR_PARSE || root)
            fail_msg("'%s' was read (status %d)", cases[i].text, (int)st);
        if (!strstr(hx_last_error(), cases[i].why))
            fail_msg("'%s': '%s' lacks '%s'", cases[i].text, hx_last_error(), cases[i].why);
    }
    /* the text need not end in NUL: only len bytes are read */
    const char text[] = {'a', ' ', '=', ' ', '1', '2', '3'};
    hx_json *root = NULL;
    assert_int_equal(hx_toml_parse(text, 5, "t.toml", &root), SELDP_OK);
    assert_int_equal(hx_json_get(root, "a")->integer, 1);
    hx_json_free(root);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(values),
        cmocka_unit_test(refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
