/* The command line: --help lists every option with its default; bad options and bad layouts
 * fail before anything runs with a one-line error naming them and exit status 2. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "seldp/version.h"

#include "cli.h"
#include "gpu.h"
#include "harness_test.h"
#include "options.h"

static void test_help_lists_every_option(void **state)
{
    (void)state;
    hx_test_run run;
    hx_test_harness(&run, "--help");
    assert_int_equal(run.status, HX_EXIT_PASS);
    const char *options[] = {"--world N",
                             "--ep N",
                             "--order ep-dp|dp-ep",
                             "--layout-file FILE",
                             "--roots",
                             "--dtype",
                             "--quant none|nf4|awq",
                             "--expert-reduce sum|mean",
                             "--fp32-master",
                             "--policy",
                             "--steps N",
                             "--tokens N",
                             "--token-spread",
                             "--lr",
                             "--seed N",
                             "--backend auto|host|nccl|mpi",
                             "--out DIR",
                             "--dump DIR",
                             "--quiet",
                             "--timeout",
                             "--inject",
                             "--vocab N",
                             "--d-model N",
                             "--d-ff N",
                             "--experts N",
                             "--top-k N",
                             "--layers N",
                             "--lora-rank N",
                             "--lora-alpha X",
                             "--help",
                             "--version"};
    for (size_t i = 0; i < sizeof options / sizeof options[0]; i++)
        if (!strstr(run.out, options[i]))
            fail_msg("--help lacks %s", options[i]);
    const char *defaults[] = {"[default: 8]",
                              "[default: 4]",
                              "[default: megatron tp-cp-ep-dp-pp,",
                              "[default: bf16]",
                              "[default: none]",
                              "[default: sum]",
                              "[default: error]",
                              "[default: 3]",
                              "[default: 64]",
                              "[default: auto]",
                              "[default: results/latest]"};
    for (size_t i = 0; i < sizeof defaults / sizeof defaults[0]; i++)
        if (!strstr(run.out, defaults[i]))
            fail_msg("--help lacks %s", defaults[i]);
    /* every option but --help and --version shows its default (on its line or the wrapped
     * continuation before the next option) */
    int without = 0;
    const char *entry = strstr(run.out, "\n  --");
    while (entry) {
        const char *next = strstr(entry + 1, "\n  --");
        size_t n = next ? (size_t)(next - entry) : strlen(entry);
        char text[512];
        snprintf(text, sizeof text, "%.*s", (int)n, entry);
        if (!strstr(text, "[default:") && !strstr(text, "--help") && !strstr(text, "--version")) {
            print_error("no default: %s\n", text);
            without++;
        }
        entry = next;
    }
    assert_int_equal(without, 0);
}

/* --help in sections, in order, every option listed exactly once under one of them */
static void test_help_in_sections(void **state)
{
    (void)state;
    hx_test_run run;
    hx_test_harness(&run, "--help");
    assert_int_equal(run.status, HX_EXIT_PASS);
    static const char *const sections[] = {
        "\nlayout (", "\nmodel (",      "\ntraining (",   "\nexperiments (",
        "\noutput:",  "\ncheckpoints:", "\nself-tests (", "\nprogram:"};
    const char *at = run.out;
    for (size_t i = 0; i < sizeof sections / sizeof sections[0]; i++) {
        const char *found = strstr(at, sections[i]);
        if (!found)
            fail_msg("--help lacks the section '%s' after the ones before it", sections[i] + 1);
        at = found + 1;
    }
    /* options land in their sections and appear once */
    const char *model = strstr(run.out, "\nmodel ("), *training = strstr(run.out, "\ntraining (");
    const char *d_model = strstr(run.out, "--d-model N");
    assert_true(model && training && d_model && d_model > model && d_model < training);
    const char *inject = strstr(run.out, "\n  --inject FAULT");
    const char *self = strstr(run.out, "\nself-tests (");
    assert_true(inject && self && inject > self);
    assert_null(strstr(inject + 1, "\n  --inject FAULT"));
    assert_null(strstr(strstr(run.out, "\n  --world") + 1, "\n  --world "));
}

static void expect_usage_error(const char *args, const char *why)
{
    hx_test_usage_error(why, "%s", args);
}

static void test_bad_options(void **state)
{
    (void)state;
    expect_usage_error("--world 0", "--world '0': expected an integer in 1..4096");
    expect_usage_error("--world eight", "--world 'eight'");
    expect_usage_error("--ep 3", "--ep 3: must be >= 1 and divide --world 8");
    expect_usage_error("--experts 6", "--experts 6: must be a positive multiple of --ep 4");
    expect_usage_error("--order ep-tq", "--order 'ep-tq': expected ep-dp or dp-ep");
    expect_usage_error("--order tp-dp-tp", "--order 'tp-dp-tp': expected ep-dp or dp-ep");
    expect_usage_error("--dtype f64", "--dtype 'f64': expected f32, bf16 or f16");
    expect_usage_error("--quant gptq", "--quant 'gptq': expected none, nf4 or awq");
    expect_usage_error("--expert-reduce max", "--expert-reduce 'max': expected sum or mean");
    expect_usage_error("--policy ignore", "--policy 'ignore': expected error or zero");
    expect_usage_error("--backend gloo", "--backend 'gloo': expected auto, host, nccl or mpi");
    expect_usage_error("--steps", "option '--steps' needs a value");
    expect_usage_error("--wrld 4", "unknown option '--wrld'");
    expect_usage_error("-w 4", "unknown option '-w'");
    expect_usage_error("stray", "unexpected argument 'stray'");
    expect_usage_error("--top-k 9", "top_k = 9 exceeds experts = 8");
    expect_usage_error("--quant awq --d-model 48", "d_model");
    expect_usage_error("--token-spread 65", "--token-spread 65: must not exceed --tokens 64");
    expect_usage_error("--lr -1", "--lr '-1'");
    expect_usage_error("--steps 0 --dump /tmp/x", "--dump /tmp/x: needs at least one step");
    expect_usage_error("--layout-file /nonexistent/layout.json",
                       "--layout-file /nonexistent/layout.json: cannot open");
}

static void test_backends(void **state)
{
    (void)state;
    /* transports this build or machine cannot drive fail clearly, before anything runs;
     * runs under mpirun are the mpi label's (tests/mpi) */
    if (!seldp_has_feature("nccl"))
        expect_usage_error("--backend nccl", "--backend nccl: not available");
    else if (hx_gpu_count() < 8)
        expect_usage_error("--backend nccl", "--backend nccl: needs a GPU per rank");
    if (!seldp_has_feature("mpi"))
        expect_usage_error("--backend mpi", "--backend mpi: not available");
    hx_test_run run;
    hx_test_harness(&run, "--backend host --world 2 --ep 2 --steps 1 --quiet --out none");
    assert_int_equal(run.status, HX_EXIT_PASS);
    hx_test_harness(&run, "--backend auto --world 2 --ep 2 --steps 1 --quiet --out none");
    assert_int_equal(run.status, HX_EXIT_PASS);
}

static void write_text(const char *path, const char *text)
{
    assert_int_equal(hx_write_file(path, text, strlen(text)), SELDP_OK);
}

static void test_broken_layout_files(void **state)
{
    (void)state;
    const char *dir = hx_test_dir("broken");
    char path[1200], args[1400];
    snprintf(path, sizeof path, "%s/root-outside.json", dir);
    write_text(path, "{\"ep_groups\": [[0, 1], [2, 3]],\n"
                     " \"experts\": [{\"owners\": [0, 2], \"root\": 1}, {\"owners\": [1, 3]}]}\n");
    snprintf(args, sizeof args, "--layout-file %s --experts 2", path);
    expect_usage_error(args, "root-outside.json:2:41: experts[0].root: root 1 is not in its group: "
                             "the owners are [0,2]");

    snprintf(path, sizeof path, "%s/inconsistent.json", dir);
    write_text(path, "{\"ep_groups\": [[0, 1], [2, 3]],\n"
                     " \"experts\": [{\"owners\": [0, 2]}, {\"owners\": [1]}]}\n");
    snprintf(args, sizeof args, "--layout-file %s --experts 2", path);
    expect_usage_error(args, "expert 1 (owners [1]) has no owner in expert-parallel group 1 [2,3]");

    snprintf(path, sizeof path, "%s/overlap.json", dir);
    write_text(path, "{\"ep_groups\": [[0, 1], [1, 2]], \"experts\": [{\"owners\": [0, 1]}]}");
    snprintf(args, sizeof args, "--layout-file %s", path);
    expect_usage_error(args, "rank 1 is already in ep_groups[0]");

    snprintf(path, sizeof path, "%s/syntax.json", dir);
    write_text(path, "{\"ep_groups\": [[0, 1]]\n \"experts\": []}");
    snprintf(args, sizeof args, "--layout-file %s", path);
    expect_usage_error(args, "syntax.json:2:2: expected ',' or '}' in an object");

    snprintf(args, sizeof args, "--layout-file %s --ep 2", hx_test_layout("hot-expert.json"));
    expect_usage_error(args, "--ep and --layout-file exclude each other");

    /* the file decides world and experts unless they are given and disagree */
    snprintf(args, sizeof args, "--layout-file %s --world 8", hx_test_layout("hot-expert.json"));
    expect_usage_error(args, "the layout is for a world of 4 ranks but --world is 8");
    snprintf(args, sizeof args, "--layout-file %s --experts 8", hx_test_layout("hot-expert.json"));
    expect_usage_error(args, "lists 4 experts but the model has 8 (--experts)");
}

static void test_version(void **state)
{
    (void)state;
    hx_test_run run;
    hx_test_harness(&run, "--version");
    assert_int_equal(run.status, HX_EXIT_PASS);
    assert_non_null(strstr(run.out, "seldp-harness "));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_help_lists_every_option),
        cmocka_unit_test(test_help_in_sections),
        cmocka_unit_test(test_bad_options),
        cmocka_unit_test(test_backends),
        cmocka_unit_test(test_broken_layout_files),
        cmocka_unit_test(test_version),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
