/* The rules between seldp-harness's options (harness/cli/options_check.c, hx_options_rules):
 * each broken rule is a usage error of one line naming the options, the same options with the
 * rule kept parse, the rules hold on every path into a run (the command line, a sweep's runs,
 * hx_run_create called directly, --print-layout), and the defaults keep every rule. */
#define _POSIX_C_SOURCE 200809L

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "harness_test.h"
#include "options.h"
#include "run.h"
#include "run_create.h"

/* A rule: a command line that breaks it, what its error says, and the same line kept. */
typedef struct rule_case {
    const char *broken;
    const char *needle;
    const char *kept;
} rule_case;

static const rule_case rules[] = {
    {"--json", "--json: needs --print-layout", "--json --print-layout"},
    {"--print-layout --steps 3", "would ignore --steps", "--print-layout --world 4"},
    {"--layout-file L --tp 2", "--layout-file and --framework/--tp/--pp/--cp/--etp exclude",
     "--layout-file L"},
    {"--layout-file L --ep 2", "--ep and --layout-file exclude each other", "--layout-file L"},
    {"--layout-file L --order dp-ep", "--order and --layout-file exclude each other",
     "--layout-file L"},
    {"--ranks-per-process 2 --backend host", "--ranks-per-process 2: with --backend host",
     "--ranks-per-process 2 --backend mpi"},
    {"--overlap --backend nccl", "--overlap: not with --backend nccl", "--overlap --backend host"},
    {"--global-batch 64 --tokens 32", "--global-batch 64 and --tokens/--token-spread exclude",
     "--global-batch 64"},
    {"--tokens 8 --token-spread 9", "--token-spread 9: must not exceed --tokens 8",
     "--tokens 8 --token-spread 8"},
    {"--micro-batches 3 --global-batch 64", "--micro-batches 3: must divide --global-batch 64",
     "--micro-batches 4 --global-batch 64"},
    {"--adam-beta1 0.8", "need --optimizer adamw (the run trains with sgd)",
     "--adam-beta1 0.8 --optimizer adamw"},
    {"--optimizer adamw --lr 2 --weight-decay 0.6", "lr * weight decay must be below 1",
     "--optimizer adamw --lr 1 --weight-decay 0.6"},
    {"--zero 1 --inject grad", "--zero 1 cannot run here: --inject grad",
     "--zero 1 --inject ep-scale"},
    {"--zero 1 --inject tied-twice", "--zero 1 cannot run here: --inject tied-twice",
     "--zero 1 --inject tied-zero"},
    {"--zero 1 --inject norm-per-group --clip-grad 1", "--zero 1 cannot run here",
     "--inject norm-per-group --clip-grad 1"},
    {"--inject-overflow 2 --dtype f16", "--inject-overflow 2: needs --loss-scale",
     "--inject-overflow 2 --dtype f16 --loss-scale dynamic"},
    {"--loss-scale dynamic", "--loss-scale dynamic: needs --dtype f16",
     "--loss-scale dynamic --dtype f16"},
    {"--loss-scale 1024 --dtype bf16", "--loss-scale X: needs --dtype f16",
     "--loss-scale 1024 --dtype f16"},
    {"--dtype f16 --loss-scale dynamic --inject-overflow 9 --steps 3",
     "--inject-overflow 9: beyond the run's 3 steps",
     "--dtype f16 --loss-scale dynamic --inject-overflow 3 --steps 3"},
    {"--inject local-aux", "--inject local-aux: expected --aux-loss-coeff > 0",
     "--inject local-aux --aux-loss-coeff 0.01 --aux-loss-scope global"},
    {"--sweep ep --dump D", "--sweep and --dump exclude each other", "--sweep ep"},
    {"--sweep ep --save D", "--sweep and --save exclude each other", "--sweep ep"},
    {"--sweep ep --summary S", "--sweep and --summary exclude each other", "--sweep ep"},
    {"--sweep ep --out=", "--sweep needs --out DIR", "--sweep ep --out D"},
    {"--dump D --steps 0", "--dump D: needs at least one step (--steps 0)", "--dump D --steps 1"},
    {"--save-every 2", "--save-every 2: needs --save DIR", "--save-every 2 --save D"},
};

/* Parse `args` (split at spaces) from the defaults: the result and the error line. */
static hx_parse_result parse_line(const char *args, hx_options *o, char *storage, size_t size,
                                  char *err, size_t err_size)
{
    char *argv[64] = {"seldp-harness"};
    int argc = 1;
    snprintf(storage, size, "%s", args);
    for (char *save = NULL, *tok = strtok_r(storage, " ", &save); tok && argc < 63;
         tok = strtok_r(NULL, " ", &save))
        argv[argc++] = tok;
    argv[argc] = NULL;
    return hx_test_parse(argv, o, err, err_size);
}

/* Every rule: the broken line exits 2 with one line naming it; the kept line parses. */
static void test_each_rule_refuses_and_its_kept_form_parses(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof rules / sizeof rules[0]; i++) {
        const rule_case *c = &rules[i];
        char line[512];
        snprintf(line, sizeof line, "%s --quiet", c->broken);
        hx_test_usage_error(c->needle, "%s", line);
        hx_options o;
        char storage[512], err[1024];
        if (parse_line(c->kept, &o, storage, sizeof storage, err, sizeof err) != HX_PARSE_RUN)
            fail_msg("'%s' (the rule of '%s' kept) does not parse: %s", c->kept, c->broken, err);
        assert_int_equal(hx_options_rules(&o, NULL), SELDP_OK);
    }
}

/* hx_options_rules itself, on options set without the parser: the first broken rule's
 * message, nothing printed; the rules on what --print-layout ignores need `given`. */
static void test_rules_on_options_built_in_code(void **state)
{
    (void)state;
    hx_options o;
    hx_options_default(&o);
    assert_int_equal(hx_options_rules(&o, NULL), SELDP_OK);
    o.model.dtype = SELDP_BF16;
    o.loss_scale_given = true;
    assert_int_equal(hx_options_rules(&o, NULL), SELDP_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(hx_last_error(), "--loss-scale dynamic: needs --dtype f16"));
    o.model.dtype = SELDP_F16;
    assert_int_equal(hx_options_rules(&o, NULL), SELDP_OK);
    /* two broken rules: the first in the table's order (the batch before the outputs) */
    o.global_batch = 64;
    o.tokens_given = true;
    o.save_every = 2;
    assert_int_equal(hx_options_rules(&o, NULL), SELDP_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(hx_last_error(), "--global-batch 64 and --tokens"));
    o.tokens_given = false;
    assert_int_equal(hx_options_rules(&o, NULL), SELDP_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(hx_last_error(), "--save-every 2: needs --save DIR"));
    /* hx_options_check prints the same message as one line */
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    assert_non_null(f);
    assert_false(hx_options_check(&o, NULL, f));
    fclose(f);
    assert_string_equal(text, "seldp-harness: --save-every 2: needs --save DIR\n");
    free(text);
}

/* A run created in code, past the parser, is held to the same rules and creates nothing. */
static void test_run_create_keeps_the_rules(void **state)
{
    (void)state;
    hx_options o;
    hx_options_default(&o);
    o.world = 2;
    o.ep = 2;
    o.steps = 0;
    o.out_dir = "";
    o.dump_dir = "unused-dump";
    hx_run *run = NULL;
    assert_int_equal(hx_run_create(&o, &run), SELDP_ERR_INVALID_ARGUMENT);
    assert_null(run);
    assert_non_null(strstr(hx_last_error(), "--dump unused-dump: needs at least one step"));
    o.dump_dir = NULL;
    o.optimizer = HX_OPT_SGD;
    o.adam_given = true;
    assert_int_equal(hx_run_create(&o, &run), SELDP_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(hx_last_error(), "need --optimizer adamw"));
    o.adam_given = false;
    assert_int_equal(hx_run_create(&o, &run), SELDP_OK);
    assert_non_null(run);
    hx_run_destroy(run);
}

/* A sweep's run is held to the rules with its own options on top of the command line's: the
 * error names the file's place of that run. */
static void test_a_sweep_run_breaking_a_rule_names_its_place(void **state)
{
    (void)state;
    const char *base = hx_test_dir("sweep");
    char file[1200], out[1200];
    snprintf(file, sizeof file, "%s/sweep.json", base);
    snprintf(out, sizeof out, "%s/out", base);
    const char *text =
        "[\n  {\"world\": 2, \"ep\": 2},\n  {\"world\": 2, \"ep\": 2, \"zero\": 1}\n]\n";
    assert_int_equal(hx_write_file(file, text, strlen(text)), SELDP_OK);
    hx_test_usage_error("sweep.json:3:3: --zero 1 cannot run here: --inject grad",
                        "--sweep %s --inject grad --steps 1 --out %s --quiet", file, out);
}

/* The rule an AdamW sweep once had is gone: a lockstep sweep records AdamW's state with the
 * weights, so the options are accepted. */
static void test_adamw_sweeps_are_accepted(void **state)
{
    (void)state;
    hx_options o;
    char storage[256], err[1024];
    assert_int_equal(parse_line("--sweep ep --optimizer adamw --out D", &o, storage, sizeof storage,
                                err, sizeof err),
                     HX_PARSE_RUN);
    assert_int_equal(hx_options_rules(&o, NULL), SELDP_OK);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_each_rule_refuses_and_its_kept_form_parses),
        cmocka_unit_test(test_rules_on_options_built_in_code),
        cmocka_unit_test(test_run_create_keeps_the_rules),
        cmocka_unit_test(test_a_sweep_run_breaking_a_rule_names_its_place),
        cmocka_unit_test(test_adamw_sweeps_are_accepted),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
