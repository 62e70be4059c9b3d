/* The option table of seldp-harness (harness/cli/options_table.c, rows of opt_table.h): every
 * row is complete (section, help, a default inside its own range), a bad value of each row
 * fails with the row's expectation, a sweep file's key fails with the command line's words,
 * --help shows every section and option, and report.json's "options" parse back to the same
 * options. */
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
#include "options.h"
#include "options_impl.h"

static void test_every_row_is_complete(void **state)
{
    (void)state;
    hx_options d;
    hx_options_default(&d);
    int per_section[HX_SEC_COUNT] = {0};
    for (size_t i = 0; i < hx_option_docs_n; i++) {
        const hx_opt_row *r = &hx_option_docs[i];
        assert_non_null(r->opt.name);
        if (r->section < 0 || r->section >= HX_SEC_COUNT)
            fail_msg("--%s: no section", r->opt.name);
        per_section[r->section]++;
        if (!r->help || strlen(r->help) < 8)
            fail_msg("--%s: no help line", r->opt.name);
        /* only --help and --version are the program's */
        assert_int_equal(r->kind == HX_OPT_ACTION, r->section == HX_SEC_PROGRAM);
        assert_int_equal(r->opt.has_arg == no_argument,
                         r->kind == HX_OPT_FLAG || r->kind == HX_OPT_ACTION);
        if (r->kind == HX_OPT_CUSTOM)
            assert_non_null(r->parse);
        for (size_t k = 0; k < i; k++)
            if (strcmp(hx_option_docs[k].opt.name, r->opt.name) == 0 ||
                hx_option_docs[k].opt.val == r->opt.val)
                fail_msg("--%s: two rows", r->opt.name);
        char def[256];
        hx_opt_default_text(r, def, sizeof def);
        if (r->kind != HX_OPT_ACTION && !def[0])
            fail_msg("--%s: --help shows no default", r->opt.name);
        if (r->unset || r->kind == HX_OPT_ACTION || r->kind == HX_OPT_FLAG)
            continue;
        /* the default is a value of the row: its text parses back through the row */
        char text[512], again[512], msg[640];
        hx_opt_value_text(r, &d, text, sizeof text);
        bool unset_string = (r->kind == HX_OPT_PATH || r->kind == HX_OPT_STRING) && !text[0];
        if (unset_string)
            continue;
        hx_options o;
        hx_options_default(&o);
        if (!hx_opt_parse_value(r, text, &o, msg, sizeof msg))
            fail_msg("--%s: its default '%s' is outside its own range: %s", r->opt.name, text, msg);
        hx_opt_value_text(r, &o, again, sizeof again);
        assert_string_equal(text, again);
        if (r->kind == HX_OPT_INT && (r->def < r->min || r->def > r->max))
            fail_msg("--%s: default %lld outside %lld..%lld", r->opt.name, r->def, r->min, r->max);
        if (r->kind == HX_OPT_ENUM)
            assert_non_null(hx_opt_enum_name(r, (int)r->def));
    }
    for (int s = 0; s < HX_SEC_COUNT; s++)
        if (per_section[s] == 0)
            fail_msg("section %d has no option", s);
    /* the table is the defaults' one source */
    assert_int_equal(d.world, 8);
    assert_int_equal(d.ep, 4);
    assert_int_equal(d.model.experts, 8);
    assert_int_equal(d.model.dtype, SELDP_BF16);
    assert_string_equal(d.out_dir, "results/latest");
    assert_true(d.adam_beta2 == 0.999 && d.loss_scale_init == 1024.0);
}

/* A value no row of its kind takes, or NULL where every value is one (strings, flags). */
static const char *bad_value(const hx_opt_row *r, char *buf, size_t size)
{
    switch (r->kind) {
    case HX_OPT_INT:
        snprintf(buf, size, "%lld", r->max + 1);
        return buf;
    case HX_OPT_DOUBLE:
        return "1e400";
    case HX_OPT_ENUM:
    case HX_OPT_CUSTOM:
        return "no-such-value";
    case HX_OPT_PATH:
        return "";
    case HX_OPT_SEED:
        return "-1";
    default:
        return NULL;
    }
}

static void test_bad_values_state_the_rows_expectation(void **state)
{
    (void)state;
    int tested = 0;
    for (size_t i = 0; i < hx_option_docs_n; i++) {
        const hx_opt_row *r = &hx_option_docs[i];
        char buf[64], opt[64], err[1024], want[1024], expect[512];
        const char *bad = bad_value(r, buf, sizeof buf);
        if (!bad)
            continue;
        hx_options scratch;
        hx_options_default(&scratch);
        char msg[640];
        if (r->kind == HX_OPT_CUSTOM && hx_opt_parse_value(r, bad, &scratch, msg, sizeof msg))
            continue; /* --out takes any directory */
        snprintf(opt, sizeof opt, "--%s", r->opt.name);
        char *argv[] = {"seldp-harness", opt, (char *)bad, NULL};
        hx_options o;
        assert_int_equal(hx_test_parse(argv, &o, err, sizeof err), HX_PARSE_ERROR);
        hx_opt_expect(r, expect, sizeof expect);
        snprintf(want, sizeof want, "seldp-harness: --%s '%s': expected %s", r->opt.name, bad,
                 expect);
        assert_string_equal(err, want);
        tested++;
    }
    assert_true(tested > 50);
    /* the expectations of the kinds, as the errors state them */
    hx_options o;
    char err[1024];
    char *steps[] = {"seldp-harness", "--steps", "x", NULL};
    assert_int_equal(hx_test_parse(steps, &o, err, sizeof err), HX_PARSE_ERROR);
    assert_string_equal(err, "seldp-harness: --steps 'x': expected an integer in 0..100000");
    char *roots[] = {"seldp-harness", "--roots", "middle", NULL};
    assert_int_equal(hx_test_parse(roots, &o, err, sizeof err), HX_PARSE_ERROR);
    assert_string_equal(err, "seldp-harness: --roots 'middle': expected first, last or spread");
    char *beta[] = {"seldp-harness", "--adam-beta1", "1", NULL};
    assert_int_equal(hx_test_parse(beta, &o, err, sizeof err), HX_PARSE_ERROR);
    assert_string_equal(err, "seldp-harness: --adam-beta1 '1': expected a number in [0, 1)");
}

/* A value with control bytes (a sweep file's "me\n", a pasted tab): the refusal shows them
 * escaped and stays one line. */
static void test_control_bytes_in_a_value_stay_one_line(void **state)
{
    (void)state;
    hx_options o;
    char err[1024];
    char *flow[] = {"seldp-harness", "--expert-reduce", "me\n", NULL};
    assert_int_equal(hx_test_parse(flow, &o, err, sizeof err), HX_PARSE_ERROR);
    assert_string_equal(err, "seldp-harness: --expert-reduce 'me\\n': expected sum or mean");
    char *steps[] = {"seldp-harness", "--steps", "4\t\x01", NULL};
    assert_int_equal(hx_test_parse(steps, &o, err, sizeof err), HX_PARSE_ERROR);
    assert_string_equal(err,
                        "seldp-harness: --steps '4\\t\\x01': expected an integer in 0..100000");
    char *stray[] = {"seldp-harness", "a\nb", NULL};
    assert_int_equal(hx_test_parse(stray, &o, err, sizeof err), HX_PARSE_ERROR);
    assert_non_null(strstr(err, "unexpected argument 'a\\nb'"));
    const hx_opt_row *r = hx_opt_find(&hx_options_table, "roots", false);
    assert_non_null(r);
    char msg[640];
    assert_false(hx_opt_parse_value(r, "x\ny", &o, msg, sizeof msg));
    assert_null(strchr(msg, '\n'));
    assert_non_null(strstr(msg, "'x\\ny'"));
}

/* The same value of the same option: the sweep file's error is the command line's, after the
 * file's position, and names the run. */
static void test_sweep_key_error_is_the_command_lines(void **state)
{
    (void)state;
    static const struct {
        const char *json, *option, *value;
    } cases[] = {{"[{\"ep\": 2}, {\"name\": \"b\", \"tp\": 0}]", "--tp", "0"},
                 {"[{\"lora-alpha\": -1.5}]", "--lora-alpha", "-1.5"},
                 {"[{\"flow\": \"max\"}]", "--expert-reduce", "max"},
                 {"[{\"roots\": \"middle\"}]", "--roots", "middle"}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char cli[1024];
        hx_options o;
        char *argv[] = {"seldp-harness", (char *)cases[i].option, (char *)cases[i].value, NULL};
        assert_int_equal(hx_test_parse(argv, &o, cli, sizeof cli), HX_PARSE_ERROR);
        const char *why = cli + strlen("seldp-harness: ");
        const char *dir = hx_test_dir("sweep");
        char file[1200];
        snprintf(file, sizeof file, "%s/sweep.json", dir);
        FILE *f = fopen(file, "w");
        assert_non_null(f);
        fputs(cases[i].json, f);
        fclose(f);
        hx_test_run run;
        hx_test_harness(&run, "--sweep %s --global-batch 64 --out %s/out", file, dir);
        assert_int_equal(run.status, HX_EXIT_USAGE);
        const char *at = strstr(run.err, why);
        if (!at)
            fail_msg("sweep error '%s' lacks the command line's '%s'", run.err, why);
        assert_true(strncmp(run.err, "seldp-harness: ", 15) == 0);
        assert_true(strncmp(run.err + 15, file, strlen(file)) == 0);
        assert_non_null(strstr(at, i == 0 ? "(run 2, \"b\")" : "(run 1)"));
    }
}

static void test_help_shows_every_section_and_option(void **state)
{
    (void)state;
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    assert_non_null(f);
    hx_options_usage(f);
    fclose(f);
    static const char *const headings[] = {
        "\nlayout (", "\nmodel (",      "\ntraining (",   "\nexperiments (",
        "\noutput:",  "\ncheckpoints:", "\nself-tests (", "\nprogram:"};
    for (size_t i = 0; i < sizeof headings / sizeof headings[0]; i++)
        if (!strstr(text, headings[i]))
            fail_msg("--help lacks the heading '%s'", headings[i] + 1);
    for (size_t i = 0; i < hx_option_docs_n; i++) {
        char entry[96];
        snprintf(entry, sizeof entry, "\n  --%s%s", hx_option_docs[i].opt.name,
                 hx_option_docs[i].metavar ? " " : "");
        const char *at = strstr(text, entry);
        if (!at)
            fail_msg("--help lacks %s", entry + 3);
        assert_null(strstr(at + 1, entry));
    }
    assert_non_null(strstr(text, "--steps N                      training steps [default: 3]"));
    free(text);
}

/* report.json's "options", parsed back through the rows, equal the options it came from */
static void test_report_options_round_trip(void **state)
{
    (void)state;
    char err[1024];
    hx_options o, back;
    char *argv[] = {"seldp-harness",
                    "--world",
                    "4",
                    "--ep",
                    "2",
                    "--order",
                    "dp-ep",
                    "--roots",
                    "spread",
                    "--expert-reduce",
                    "mean",
                    "--policy",
                    "zero",
                    "--fp32-master",
                    "--steps",
                    "2",
                    "--tokens",
                    "40",
                    "--lr",
                    "0.125",
                    "--backend",
                    "host",
                    "--overlap",
                    "--bucket-bytes",
                    "4096",
                    "--micro-batches",
                    "2",
                    "--token-spread",
                    "3",
                    NULL};
    assert_int_equal(hx_test_parse(argv, &o, err, sizeof err), HX_PARSE_RUN);
    hx_buf a = {0}, b = {0};
    hx_options_json(&o, &a, NULL, NULL);
    assert_true(hx_buf_ok(&a));
    hx_json *doc = NULL;
    assert_int_equal(hx_json_parse(a.data, a.len, "options", &doc), SELDP_OK);
    hx_options_default(&back);
    char msg[640] = "";
    if (!hx_options_from_json(doc, &back, msg, sizeof msg))
        fail_msg("%s", msg);
    hx_options_json(&back, &b, NULL, NULL);
    assert_string_equal(a.data, b.data);
    /* every row in the object: the same value on both sides */
    int rows = 0;
    for (size_t i = 0; i < hx_option_docs_n; i++) {
        const hx_opt_row *r = &hx_option_docs[i];
        if (!r->json)
            continue;
        char x[512], y[512];
        hx_opt_value_text(r, &o, x, sizeof x);
        hx_opt_value_text(r, &back, y, sizeof y);
        assert_string_equal(x, y);
        assert_non_null(hx_json_get(doc, r->json));
        rows++;
    }
    assert_int_equal(rows, 17);
    assert_int_equal(back.world, 4);
    assert_int_equal(back.order, HX_ORDER_DP_EP);
    assert_int_equal(back.flow, HX_FLOW_MEAN);
    assert_true(back.fp32_master && back.overlap && back.lr == 0.125);
    assert_int_equal(back.bucket_bytes, 4096);
    assert_null(hx_json_get(doc, "transport")); /* the run's, not an option's */
    hx_json_free(doc);
    hx_buf_free(&a);
    hx_buf_free(&b);
    /* and the run's report.json holds the same object, with its transport */
    const char *dir = hx_test_dir("report");
    hx_test_run run;
    hx_test_harness(&run, "--world 2 --ep 2 --steps 1 --quiet --out %s", dir);
    assert_int_equal(run.status, HX_EXIT_PASS);
    hx_json *report = hx_test_report(dir);
    const hx_json *opts = hx_json_get(report, "options");
    assert_non_null(opts);
    assert_string_equal(hx_json_get(opts, "transport")->string, "host");
    hx_options_default(&back);
    if (!hx_options_from_json(opts, &back, msg, sizeof msg))
        fail_msg("%s", msg);
    assert_int_equal(back.world, 2);
    assert_int_equal(back.steps, 1);
    hx_json_free(report);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_row_is_complete),
        cmocka_unit_test(test_bad_values_state_the_rows_expectation),
        cmocka_unit_test(test_sweep_key_error_is_the_command_lines),
        cmocka_unit_test(test_control_bytes_in_a_value_stay_one_line),
        cmocka_unit_test(test_help_shows_every_section_and_option),
        cmocka_unit_test(test_report_options_round_trip),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
