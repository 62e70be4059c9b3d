/* --from-megatron: Megatron-LM and Megatron-DeepSpeed command lines taken from the frameworks'
 * own example scripts (tests/harness/configs/, each file names its script and commit):
 *
 *   megatron/mixtral_8x7b.args        NVIDIA/Megatron-LM examples/mixtral/
 *                                     train_mixtral_8x7b_distributed.sh (d98e8a64)
 *   megatron/gptoss_20b.args          NVIDIA/Megatron-LM examples/gptoss/02_train.sh (d98e8a64)
 *   megatron/deepseek_v3_fsdp.args    NVIDIA/Megatron-LM examples/megatron_fsdp/
 *                                     sbatch_mfsdp_deepseek_v3.sh (d98e8a64)
 *   megatron-deepspeed/gpt_125M_MoE64.args and ds_config_gpt_125M_MoE64.json
 *                                     deepspeedai/Megatron-DeepSpeed examples_deepspeed/MoE/
 *                                     ds_pretrain_gpt_125M_MoE64.sh (4efb479d)
 *
 * The imported layout's groups equal the ones the framework's own code builds for the same
 * sizes (the *-groups.json files, written by configs/framework_groups.py from Megatron-LM's
 * parallel_state.py and DeepSpeed's groups.py), every key the import does not apply is listed,
 * one line each, explicit options override the import, and a malformed or contradictory
 * command line is one line naming the key, exit 2. */
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

/* The keys an import applies (its "sets" line, or a recognised line of its own wording). */
static const char *const applied[] = {"--tensor-model-parallel-size",
                                      "--pipeline-model-parallel-size",
                                      "--context-parallel-size",
                                      "--expert-model-parallel-size",
                                      "--expert-tensor-parallel-size",
                                      "--num-experts",
                                      "--moe-router-topk",
                                      "--num-layers",
                                      "--moe-router-load-balancing-type",
                                      "--moe-aux-loss-coeff",
                                      "--moe-z-loss-coeff",
                                      "--moe-expert-capacity-factor",
                                      "--moe-shared-expert-intermediate-size",
                                      "--micro-batch-size",
                                      "--global-batch-size",
                                      "--use-distributed-optimizer",
                                      "--bf16",
                                      "--fp16",
                                      "--accumulate-allreduce-grads-in-fp32",
                                      "--clip-grad",
                                      "--sequence-parallel",
                                      "--moe-expert-parallel-size",
                                      "--topk",
                                      "--moe-loss-coeff",
                                      "--moe-train-capacity-factor",
                                      "--deepspeed",
                                      NULL};

static bool is_applied(const char *key)
{
    for (const char *const *a = applied; *a; a++)
        if (strcmp(*a, key) == 0)
            return true;
    return false;
}

/* Every key of the command line in `file` that the import does not apply is on exactly one
 * "ignored" line of the output (the words after the training script only). */
static void every_ignored_key_listed(const char *file, const char *out)
{
    char *text = NULL;
    assert_int_equal(hx_read_file(file, &text, NULL), SELDP_OK);
    bool after_script = false;
    int keys = 0;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        if (strchr(line, '#') && strspn(line, " \t") == (size_t)(strchr(line, '#') - line))
            continue;
        char words[4096];
        snprintf(words, sizeof words, "%s", line);
        for (char *save = NULL, *w = strtok_r(words, " \t\\", &save); w;
             w = strtok_r(NULL, " \t\\", &save)) {
            if (strstr(w, ".py")) {
                after_script = true;
                continue;
            }
            if (!after_script || strncmp(w, "--", 2) != 0 || is_applied(w))
                continue;
            char with_value[256], flag[256];
            snprintf(with_value, sizeof with_value, "ignored %s ", w);
            snprintf(flag, sizeof flag, "ignored %s:", w);
            int n = it_lines_with(out, with_value) + it_lines_with(out, flag);
            if (n != 1)
                fail_msg("%s: %s is on %d ignored lines, expected one", file, w, n);
            keys++;
        }
    }
    free(text);
    assert_true(keys > 10);
}

static void mixtral(void **state)
{
    (void)state;
    const char *args = it_config("megatron/mixtral_8x7b.args");
    it_run run;
    it_main(&run, "--print-layout --from-megatron @%s --compare-groups %s", args,
            it_config("megatron/mixtral_8x7b-groups.json"));
    it_expect(&run, HX_EXIT_PASS, NULL);
    it_has(run.out,
           "import (megatron): sets --world 32 --framework megatron --tp 1 --pp 4 --ep 8 --layers "
           "32 --experts 8 --top-k 2 --aux-loss-coeff 0.01 --aux-loss-scope local --dtype bf16 "
           "--fp32-master --clip-grad 1 --zero 1 --micro-batches 32 (explicit options override)",
           "stdout");
    it_has(run.out, "compare-groups: PASS: 256 groups of 32 ranks", "stdout");
    it_has(run.out, "layout: megatron tp-cp-ep-dp-pp, world 32, tp 1, pp 4, cp 1, ep 8, etp 1",
           "stdout");
    /* --use-distributed-optimizer: the --zero 1 of the line above */
    /* --micro-batch-size 1 --global-batch-size 256 at data-parallel size 8: the --micro-batches
     * 32 of the line above */
    every_ignored_key_listed(args, run.out);
    it_free(&run);
}

/* The command line's options win over the import's, and a moved group is named. */
static void explicit_options_override(void **state)
{
    (void)state;
    it_run run;
    it_main(&run, "--print-layout --json --from-megatron @%s --pp 2 --tp 2",
            it_config("megatron/mixtral_8x7b.args"));
    it_expect(&run, HX_EXIT_PASS, NULL);
    it_has(run.out, "\"tp\": 2, \"pp\": 2", "stdout");
    it_has(run.err, "import (megatron): the command line overrides --tp 1 --pp 4", "stderr");
    it_free(&run);
    /* what --print-layout does not read stays refused, imported or not */
    it_main(&run, "--print-layout --from-megatron @%s --layers 4",
            it_config("megatron/mixtral_8x7b.args"));
    it_expect(&run, HX_EXIT_USAGE, "it would ignore --layers");
    it_free(&run);
    it_main(&run, "--compare-groups %s --from-megatron @%s --pp 2",
            it_config("megatron/mixtral_8x7b-groups.json"),
            it_config("megatron/mixtral_8x7b.args"));
    it_expect(&run, HX_EXIT_FAIL, NULL);
    it_has(run.out, "compare-groups: FAIL", "stdout");
    it_has(run.out, "rank 0, pp: the run built [0, 8, 16, 24], the layout has [0, 16]", "stdout");
    it_free(&run);
}

/* gpt-oss's script: python -m torch.distributed.run, pp = the world; tiny-moe needs pp to
 * divide its layers, so the run is refused until --layers says otherwise. */
static void gptoss_trains(void **state)
{
    (void)state;
    const char *args = it_config("megatron/gptoss_20b.args");
    it_run run;
    it_main(&run, "--print-layout --from-megatron @%s --compare-groups %s", args,
            it_config("megatron/gptoss_20b-groups.json"));
    it_expect(&run, HX_EXIT_PASS, NULL);
    it_has(run.out, "--world 8 --framework megatron --tp 1 --pp 8 --cp 1 --ep 1 --layers 12",
           "stdout");
    it_has(run.out, "--z-loss-coeff 0.001 --aux-loss-coeff 0.001 --aux-loss-scope local", "stdout");
    every_ignored_key_listed(args, run.out);
    it_free(&run);
    it_main(&run, "--from-megatron @%s --steps 1 --out none", args);
    it_expect(&run, HX_EXIT_USAGE, "--pp 8: must divide the layers (--layers 12)");
    it_free(&run);
    it_main(&run, "--from-megatron @%s --layers 8 --steps 1 --out none", args);
    it_expect(&run, HX_EXIT_PASS, NULL);
    it_has(run.out, "result: PASS", "stdout");
    it_free(&run);
}

/* DeepSeek-V3 under Megatron-FSDP: 256 experts of top-8, a shared expert as wide as a routed
 * one, a per-sequence aux loss tiny-moe does not have. */
static void deepseek_v3(void **state)
{
    (void)state;
    const char *args = it_config("megatron/deepseek_v3_fsdp.args");
    it_run run;
    it_main(&run, "--print-layout --from-megatron @%s --world 64 --compare-groups %s", args,
            it_config("megatron/deepseek_v3_fsdp-groups.json"));
    it_expect(&run, HX_EXIT_PASS, NULL);
    it_has(run.out, "--ep 8 --etp 1 --layers 61 --experts 256 --top-k 8", "stdout");
    it_has(run.out, "--shared-expert-ff 64", "stdout");
    it_has(run.out,
           "ignored --moe-router-load-balancing-type seq_aux_loss with --moe-aux-loss-coeff "
           "0.0001",
           "stdout");
    if (strstr(run.out, "--aux-loss-coeff"))
        fail_msg("a seq_aux_loss became tiny-moe's aux loss:\n%s", run.out);
    it_has(run.out, "compare-groups: PASS: 512 groups of 64 ranks", "stdout");
    it_free(&run);
}

/* Megatron-DeepSpeed's MoE example with its ds_config: DeepSpeed's groups, its defaults
 * (top-1, capacity 1.0 with dropping), the two batch descriptions agreeing. */
static void megatron_deepspeed(void **state)
{
    (void)state;
    const char *args = it_config("megatron-deepspeed/gpt_125M_MoE64.args");
    it_run run;
    it_main(&run,
            "--print-layout --from-megatron @%s --from-deepspeed %s --world 8 "
            "--compare-groups %s",
            args, it_config("megatron-deepspeed/ds_config_gpt_125M_MoE64.json"),
            it_config("megatron-deepspeed/gpt_125M_MoE64-groups.json"));
    it_expect(&run, HX_EXIT_PASS, NULL);
    it_has(run.out,
           "sets --tp 1 --pp 1 --layers 12 --experts 64 --framework deepspeed --ep 8 --etp 1 "
           "--top-k 1 --aux-loss-coeff 0.01 --aux-loss-scope local --capacity-factor 1 --dtype f16 "
           "--clip-grad 1",
           "stdout");
    /* train_batch_size 256 = micro 4 x gradient_accumulation_steps 8 x data-parallel 8 */
    it_has(run.out, "--clip-grad 1 --micro-batches 8 (explicit options override)", "stdout");
    it_has(run.out, "ignored --deepspeed_config ds_config_gpt_125M_MoE64.json", "stdout");
    it_has(run.out, "compare-groups: PASS", "stdout");
    it_free(&run);
    /* a ds_config that contradicts the command line: both keys named */
    const char *dir = hx_test_dir("mds");
    char bad[1200];
    snprintf(bad, sizeof bad, "%s/ds_bf16.json", dir);
    assert_int_equal(hx_write_file(bad, "{\"bf16\": {\"enabled\": true}}", 27), SELDP_OK);
    it_main(&run, "--print-layout --from-megatron @%s --from-deepspeed %s --world 8", args, bad);
    it_expect(&run, HX_EXIT_USAGE,
              "--from-megatron --fp16 and --from-deepspeed bf16.enabled: true contradict each "
              "other (--dtype f16 against --dtype bf16)");
    it_free(&run);
}

static void refusals(void **state)
{
    (void)state;
    static const struct {
        const char *args, *why;
    } cases[] = {
        {"--tensor-model-parallel-size" SP "${TP}",
         "--from-megatron: --tensor-model-parallel-size '${TP}': expected a positive integer (a "
         "script's shell variables are not expanded here"},
        {"--tensor-model-parallel-size" SP "0",
         "--tensor-model-parallel-size '0': expected a positive integer"},
        {"--bf16" SP "--fp16", "--bf16 and --fp16 contradict each other"},
        {"--num-experts" SP "8" SP "--data-path" SP "'/data/x", "unterminated single quote"},
        {"--expert-model-parallel-size" SP "2" SP "--moe-expert-parallel-size" SP "2",
         "which framework's command line is it?"},
        {"--num-experts" SP "8" SP "--micro-batch-size" SP "3" SP "--global-batch-size" SP "256",
         "global batch size (256) is not divisible by micro batch size (3) times data parallel "
         "size (8)"},
        {"--num-experts" SP "8" SP "--moe-router-load-balancing-type" SP "aux_loss" SP
         "seq_aux_loss" SP "--moe-aux-loss-coeff" SP "0.01",
         "moe_aux_loss_coeff must be a list of the same length as moe_router_load_balancing_type"},
        {"--moe-router-load-balancing-type" SP "switch",
         "--moe-router-load-balancing-type 'switch': expected aux_loss, seq_aux_loss"},
        {"torchrun" SP "--nnodes" SP "1:4" SP "--nproc_per_node" SP "8" SP "pretrain_gpt.py",
         "--nnodes 1:4: expected a positive integer (an elastic range"},
        {"--bf16" SP "--bf16=1", "--bf16=1 takes no value"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        it_run run;
        it_main(&run, "--print-layout --from-megatron %s", cases[i].args);
        it_expect(&run, HX_EXIT_USAGE, cases[i].why);
        it_free(&run);
    }
    /* a launcher gives the world; the command line's --world overrides it */
    it_run run;
    it_main(&run, "--print-layout --json --from-megatron "
                  "torchrun" SP "--nproc-per-node=4" SP "--nnodes=2" SP "pretrain_gpt.py" SP
                  "--num-experts" SP "8" SP "--expert-model-parallel-size" SP "4");
    it_expect(&run, HX_EXIT_PASS, NULL);
    it_has(run.out, "\"world\": 8", "stdout");
    it_has(run.err, "--world 8 --framework megatron --ep 4", "stderr");
    it_free(&run);
    /* a partial Megatron order Megatron's docstring names, from --use-tp-pp-dp-mapping */
    it_main(&run, "--print-layout --from-megatron "
                  "--use-tp-pp-dp-mapping" SP "--tensor-model-parallel-size" SP "2" SP
                  "--pipeline-model-parallel-size" SP "2" SP "--expert-tensor-parallel-size" SP
                  "1" SP "--num-experts" SP "4 --world 8 --ep 2");
    it_expect(&run, HX_EXIT_PASS, NULL);
    it_has(run.out, "layout: megatron tp-cp-ep-pp-dp, world 8", "stdout");
    it_free(&run);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(mixtral),
        cmocka_unit_test(explicit_options_override),
        cmocka_unit_test(gptoss_trains),
        cmocka_unit_test(deepseek_v3),
        cmocka_unit_test(megatron_deepspeed),
        cmocka_unit_test(refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
