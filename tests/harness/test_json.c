/* The harness's strict JSON parser: values, escapes, and errors that name line and column. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>

#include "json.h"
#include "util.h"

static hx_json *parse_ok(const char *text)
{
    hx_json *v = NULL;
    seldp_status st = hx_json_parse(text, strlen(text), "test", &v);
    if (st != SELDP_OK)
        fail_msg("'%s' did not parse: %s", text, hx_last_error());
    return v;
}

static void expect_error(const char *text, const char *where, const char *why)
{
    hx_json *v = NULL;
    seldp_status st = hx_json_parse(text, strlen(text), "doc.json", &v);
    if (st != SELDP_ERR_PARSE)
        fail_msg("'%s' parsed (status %d)", text, (int)st);
    assert_null(v);
    if (!strstr(hx_last_error(), where) || !strstr(hx_last_error(), why))
        fail_msg("'%s': message '%s' lacks '%s' or '%s'", text, hx_last_error(), where, why);
}

static void test_values(void **state)
{
    (void)state;
    hx_json *v = parse_ok(" {\"a\": [1, -2.5e3, true, false, null], \"b\": {\"c\": \"x\"},\n"
                          "  \"big\": 9007199254740993, \"zero\": -0} ");
    assert_int_equal(v->type, HX_JSON_OBJECT);
    assert_int_equal(v->count, 4);
    const hx_json *a = hx_json_get(v, "a");
    assert_non_null(a);
    assert_int_equal(a->count, 5);
    assert_true(a->items[0].is_integer);
    assert_int_equal(a->items[0].integer, 1);
    assert_false(a->items[1].is_integer);
    assert_true(a->items[1].number == -2500.0);
    assert_true(a->items[2].boolean);
    assert_int_equal(a->items[3].type, HX_JSON_BOOL);
    assert_false(a->items[3].boolean);
    assert_int_equal(a->items[4].type, HX_JSON_NULL);
    assert_string_equal(hx_json_get(hx_json_get(v, "b"), "c")->string, "x");
    /* integers keep their exact value beyond double precision */
    assert_true(hx_json_get(v, "big")->integer == 9007199254740993ll);
    /* positions of values */
    assert_int_equal(hx_json_get(v, "big")->line, 2);
    assert_int_equal(hx_json_get(v, "big")->column, 10);
    assert_null(hx_json_get(v, "missing"));
    hx_json_free(v);
}

static void test_strings(void **state)
{
    (void)state;
    hx_json *v = parse_ok("[\"q\\\"b\\\\s\\/n\\n\", \"\\u00e9\\u20ac\", \"\\ud83d\\ude00\", "
                          "\"caf\xc3\xa9\"]");
    assert_string_equal(v->items[0].string, "q\"b\\s/n\n");
    assert_string_equal(v->items[1].string, "\xc3\xa9\xe2\x82\xac");
    assert_string_equal(v->items[2].string, "\xf0\x9f\x98\x80");
    assert_string_equal(v->items[3].string, "caf\xc3\xa9");
    hx_json_free(v);
    /* the writer's escapes parse back to the same text */
    hx_buf b = {0};
    hx_buf_json_string(&b, "tab\there \"quoted\" back\\slash \x01");
    v = parse_ok(hx_buf_str(&b));
    assert_string_equal(v->string, "tab\there \"quoted\" back\\slash \x01");
    hx_json_free(v);
    hx_buf_free(&b);
}

static void test_numbers_round_trip(void **state)
{
    (void)state;
    const double values[] = {0.1, 1e-5, 2.0 / 3.0, 1e300, -123456.789, 5e-324};
    for (size_t i = 0; i < sizeof values / sizeof values[0]; i++) {
        hx_buf b = {0};
        hx_buf_json_number(&b, values[i]);
        hx_json *v = parse_ok(hx_buf_str(&b));
        assert_true(v->number == values[i]);
        hx_json_free(v);
        hx_buf_free(&b);
    }
}

static void test_errors(void **state)
{
    (void)state;
    expect_error("", "doc.json:1:1:", "empty document");
    expect_error("{\"a\": 1,}", "doc.json:1:9:", "trailing comma");
    expect_error("[1, 2,]", "doc.json:1:7:", "trailing comma");
    expect_error("{\"a\": 1, \"a\": 2}", "doc.json:1:10:", "duplicate member \"a\"");
    expect_error("{\n  \"a\": 01\n}", "doc.json:2:8:", "leading zero");
    expect_error("{\n  // comment\n}", "doc.json:2:3:", "member name");
    expect_error("[1 2]", "doc.json:1:4:", "expected ',' or ']'");
    expect_error("{\"a\" 1}", "doc.json:1:6:", "expected ':'");
    expect_error("\"abc", "doc.json:1:5:", "unterminated string");
    expect_error("\"a\tb\"", "doc.json:1:3:", "control character");
    expect_error("\"\\x\"", "doc.json:1:2:", "invalid escape");
    expect_error("\"\\ud800\"", "doc.json:1:2:", "surrogate");
    expect_error("\"\\u0000\"", "doc.json:1:2:", "\\u0000");
    expect_error("\"\xff\"", "doc.json:1:2:", "UTF-8");
    expect_error("tru", "doc.json:1:1:", "literal");
    expect_error("1.", "doc.json:1:3:", "decimal point");
    expect_error("1e", "doc.json:1:3:", "exponent");
    expect_error("{} x", "doc.json:1:4:", "after the end");
    expect_error("NaN", "doc.json:1:1:", "unexpected");
    expect_error("1e999", "doc.json:1:1:", "out of range");
    char deep[200];
    memset(deep, '[', 100);
    deep[100] = '\0';
    expect_error(deep, "doc.json:1:66:", "nesting deeper");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_values),
        cmocka_unit_test(test_strings),
        cmocka_unit_test(test_numbers_round_trip),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
