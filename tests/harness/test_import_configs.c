/* --from-torchtitan and --from-deepspeed: train configs copied from the frameworks
 * (tests/harness/configs/, each names its source):
 *
 *   torchtitan/deepseek_v3_16b.toml, llama4_17bx128e.toml, deepseek_v3_671b.toml
 *       pytorch/torchtitan torchtitan/models/{deepseek_v3,llama4}/train_configs/ (238fa995, the
 *       last release with TOML configs)
 *   deepspeed/autoep_zero2_bf16.json
 *       deepspeedai/DeepSpeed docs/_pages/config-json.md (the "Expert Parallel (AutoEP)"
 *       example: enabled, autoep_size 4, preset_model mixtral) with the training configuration
 *       of blogs/muon-optimizer/README.md (ZeRO stage 2, bf16, batch 16 over 4 GPUs with
 *       gradient accumulation 2, gradient clipping 1.0), at edaa7221
 *
 * The imported groups equal those torchtitan's ParallelDims.build_mesh and DeepSpeed's
 * groups.py build (the *-groups.json files, from configs/framework_groups.py); AutoEP with
 * AutoTP builds the classic MoE layer's groups (its folding tables); every key not applied is
 * listed; malformed and contradictory configs are one line naming the key, exit 2. */
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
#include "toml.h"
#include "util.h"

/* Every leaf key of a TOML file the import does not apply is on exactly one ignored line. */
static int leaves_listed(const hx_json *node, char *key, size_t at, const char *out,
                         const char *const *applied)
{
    int n = 0;
    for (size_t i = 0; i < node->count; i++) {
        size_t len =
            at + (size_t)snprintf(key + at, 512 - at, "%s%s", at ? "." : "", node->keys[i]);
        if (node->items[i].type == HX_JSON_OBJECT) {
            n += leaves_listed(&node->items[i], key, len, out, applied);
            key[at] = '\0';
            continue;
        }
        bool used = false;
        for (const char *const *a = applied; *a; a++)
            used = used || strcmp(*a, key) == 0;
        char needle[600];
        snprintf(needle, sizeof needle, "ignored %s = ", key);
        int lines = it_lines_with(out, needle);
        if (lines != (used ? 0 : 1))
            fail_msg("%s is on %d ignored lines, expected %d", key, lines, used ? 0 : 1);
        n++;
        key[at] = '\0';
    }
    return n;
}

static const char *const torchtitan_applied[] = {"model.name",
                                                 "model.flavor",
                                                 "training.local_batch_size",
                                                 "training.global_batch_size",
                                                 "training.max_norm",
                                                 "training.dtype",
                                                 "training.mixed_precision_param",
                                                 "training.mixed_precision_reduce",
                                                 "parallelism.data_parallel_replicate_degree",
                                                 "parallelism.data_parallel_shard_degree",
                                                 "parallelism.tensor_parallel_degree",
                                                 "parallelism.pipeline_parallel_degree",
                                                 "parallelism.context_parallel_degree",
                                                 "parallelism.expert_parallel_degree",
                                                 "parallelism.expert_tensor_parallel_degree",
                                                 "parallelism.pipeline_parallel_microbatch_size",
                                                 NULL};

static void every_toml_key_listed(const char *path, const char *out)
{
    char *text = NULL, key[512] = "";
    size_t len = 0;
    hx_json *root = NULL;
    assert_int_equal(hx_read_file(path, &text, &len), SELDP_OK);
    if (hx_toml_parse(text, len, path, &root) != SELDP_OK)
        fail_msg("%s", hx_last_error());
    assert_true(leaves_listed(root, key, 0, out, torchtitan_applied) > 20);
    hx_json_free(root);
    free(text);
}

static void deepseek_v3_16b(void **state)
{
    (void)state;
    const char *toml = it_config("torchtitan/deepseek_v3_16b.toml");
    it_run run;
    it_main(&run, "--print-layout --from-torchtitan %s --compare-groups %s", toml,
            it_config("torchtitan/deepseek_v3_16b-groups.json"));
    it_expect(&run, HX_EXIT_PASS, NULL);
    it_has(run.out,
           "import (torchtitan): sets --framework torchtitan --tp 1 --pp 1 --ep 8 --etp 1 "
           "--experts 64 --top-k 6 --layers 27 --dtype bf16 --fp32-master --clip-grad 1 "
           "--shared-expert-ff 128 (explicit options override)",
           "stdout");
    it_has(run.out, "compare-groups: PASS: 56 groups of 8 ranks", "stdout");
    every_toml_key_listed(toml, run.out);
    it_free(&run);
    /* it trains, the command line shrinking the flavor */
    it_main(&run, "--from-torchtitan %s --layers 2 --experts 16 --top-k 2 --steps 1 --out none",
            toml);
    it_expect(&run, HX_EXIT_PASS, NULL);
    it_has(run.out, "result: PASS", "stdout");
    it_free(&run);
}

static void llama4_and_671b(void **state)
{
    (void)state;
    const char *toml = it_config("torchtitan/llama4_17bx128e.toml");
    it_run run;
    it_main(&run, "--print-layout --from-torchtitan %s --world 32 --compare-groups %s", toml,
            it_config("torchtitan/llama4_17bx128e-groups.json"));
    it_expect(&run, HX_EXIT_PASS, NULL);
    it_has(run.out, "--tp 8 --pp 4 --cp 1 --ep 1 --etp 8 --experts 128 --top-k 1 --layers 48",
           "stdout");
    it_has(run.out, "puts an MoE layer every 2 layers", "stdout");
    it_has(run.out, "compare-groups: PASS: 224 groups of 32 ranks", "stdout");
    every_toml_key_listed(toml, run.out);
    it_free(&run);
    /* a world the degrees do not divide: torchtitan's own words */
    it_main(&run, "--print-layout --from-torchtitan %s --world 12", toml);
    it_expect(&run, HX_EXIT_USAGE,
              "Invalid parallel dims: dp_replicate(1) * cp(1) * tp(8) * "
              "pp(4) does not divide WORLD_SIZE(12)");
    it_free(&run);
    toml = it_config("torchtitan/deepseek_v3_671b.toml");
    it_main(&run, "--print-layout --from-torchtitan %s", toml);
    it_expect(&run, HX_EXIT_PASS, NULL);
    it_has(run.out, "ignored training.steps = 10000", "stdout"); /* 10_000 in the file */
    it_has(run.out, "--experts 256 --top-k 8 --layers 61", "stdout");
    every_toml_key_listed(toml, run.out);
    it_free(&run);
}

static void write_config(const char *path, const char *text)
{
    assert_int_equal(hx_write_file(path, text, strlen(text)), SELDP_OK);
}

static void torchtitan_refusals(void **state)
{
    (void)state;
    const char *dir = hx_test_dir("torchtitan");
    static const struct {
        const char *text, *args, *why;
    } cases[] = {
        {"[parallelism]\ntensor_parallel_degree = 2\ntensor_parallel_degree = 4\n", "",
         "t.toml:3:1: key parallelism.tensor_parallel_degree defined twice (first at line 2)"},
        {"[parallelism]\ntensor_parallel_degree = \"2\"\n", "",
         "t.toml:2:26: parallelism.tensor_parallel_degree = \"2\": expected a positive integer"},
        {"[parallelism]\nexpert_parallel_degree = 3\n", "--world 8 --experts 6",
         "torchtitan asserts ep % 1 == 0 and (dp_shard * 1) % ep == 0 (dp_shard 8"},
        {"[training]\nlocal_batch_size = 3\nglobal_batch_size = 16\n", "",
         "global batch size must be multiple of local batch size times data-parallel degree (16 "
         "% (3 * 8) != 0)"},
        {"[parallelism]\ndata_parallel_shard_degree = 2\ntensor_parallel_degree = 2\n", "--world 8",
         "Invalid parallel dims: dp_replicate(1) * dp_shard(2) * cp(1) * tp(2) * "
         "pp(1) != WORLD_SIZE(8)"},
        {"[training]\ndtype = \"float16\"\n", "",
         "training.dtype = \"float16\": expected \"bfloat16\" or \"float32\""},
        {"[[parallelism]]\n", "", "arrays of tables ([[...]]) are outside the TOML subset"},
    };
    char path[1200];
    snprintf(path, sizeof path, "%s/t.toml", dir);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        write_config(path, cases[i].text);
        it_run run;
        it_main(&run, "--print-layout --from-torchtitan %s %s", path, cases[i].args);
        it_expect(&run, HX_EXIT_USAGE, cases[i].why);
        it_free(&run);
    }
    it_run run;
    it_main(&run, "--print-layout --from-torchtitan %s --from-megatron --num-experts" SP "8", path);
    it_expect(&run, HX_EXIT_USAGE, "--from-torchtitan and --from-megatron exclude each other");
    it_free(&run);
    /* HSDP: replicate x shard, the same groups as one shard degree */
    write_config(path, "[parallelism]\ndata_parallel_replicate_degree = 2\n"
                       "data_parallel_shard_degree = 4\nexpert_parallel_degree = 4\n");
    it_main(&run, "--print-layout --json --from-torchtitan %s", path);
    it_expect(&run, HX_EXIT_PASS, NULL);
    it_has(run.out, "\"world\": 8", "stdout");
    it_has(run.err, "data_parallel_replicate_degree = 2: HSDP", "stderr");
    it_free(&run);
}

static void deepspeed_autoep(void **state)
{
    (void)state;
    const char *config = it_config("deepspeed/autoep_zero2_bf16.json");
    it_run run;
    it_main(&run, "--print-layout --from-deepspeed %s --world 4 --compare-groups %s", config,
            it_config("deepspeed/autoep_zero2_bf16-groups.json"));
    it_expect(&run, HX_EXIT_PASS, NULL);
    it_has(run.out,
           "import (deepspeed): sets --framework deepspeed --zero 1 --dtype bf16 --fp32-master "
           "--clip-grad 1 --ep 4 --etp 1 --micro-batches 2 (explicit options override)",
           "stdout");
    /* zero_optimization.stage 2: the --zero 1 of the line above */
    /* train_batch_size 16 = micro 2 x gradient_accumulation_steps 2 x data-parallel 4 */
    it_has(run.out, "ignored expert_parallel.preset_model: \"mixtral\"", "stdout");
    it_has(run.out, "compare-groups: PASS: 8 groups of 4 ranks", "stdout");
    it_free(&run);
    /* AutoEP with AutoTP: the engine's folding tables are the classic MoE layer's groups */
    const char *dir = hx_test_dir("deepspeed");
    char path[1200];
    snprintf(path, sizeof path, "%s/autotp.json", dir);
    write_config(path, "{\"tensor_parallel\": {\"autotp_size\": 2},\n"
                       " \"expert_parallel\": {\"enabled\": true, \"autoep_size\": 4}}\n");
    it_main(&run, "--print-layout --from-deepspeed %s --world 8 --compare-groups %s", path,
            it_config("deepspeed/autoep_autotp2-groups.json"));
    it_expect(&run, HX_EXIT_PASS, NULL);
    it_has(run.out, "compare-groups: PASS: 32 groups of 8 ranks", "stdout");
    it_free(&run);
}

static void deepspeed_refusals(void **state)
{
    (void)state;
    const char *dir = hx_test_dir("deepspeed-bad");
    static const struct {
        const char *text, *args, *why;
    } cases[] = {
        {"{\"fp16\": {\"enabled\": true}, \"bf16\": {\"enabled\": true}}", "",
         "bfloat16 and fp16 modes cannot be simultaneously enabled"},
        {"{\"train_batch_size\": 32, \"train_micro_batch_size_per_gpu\": 2, "
         "\"gradient_accumulation_steps\": 4}",
         "",
         "train_batch_size is not equal to micro_batch_per_gpu * gradient_acc_step * "
         "world_size 32 != 2 * 4 * 8"},
        {"{\"gradient_clipping\": \"1\"}", "",
         "d.json:1:23: gradient_clipping: \"1\": expected a number >= 0"},
        {"{\"tensor_parallel\": {\"autotp_size\": 2}, \"expert_parallel\": {\"enabled\": true, "
         "\"autoep_size\": 2}}",
         "--pp 2", "AutoEP+AutoTP folding currently supports pp_size=1 only; got pp_size=2"},
        {"{\"expert_parallel\": {\"enabled\": true, \"autoep_size\": 2, "
         "\"expert_tensor_parallel_size\": 2}}",
         "", "expert_parallel.expert_tensor_parallel_size=2 is reserved"},
        {"{\"zero_optimization\": {\"stage\": 4}}", "", "zero_optimization.stage: 4: expected 0"},
        {"[1, 2]", "", "expected an object of ds_config keys, found an array"},
        {"{\"fp16\": {\"enabled\": tru}}", "", "d.json:1:22"},
        /* a key holding a newline is shown escaped: the refusal stays one line */
        {"{\"a\\nb\" 1}", "", "d.json:1:9: expected ':' after member \"a\\nb\""},
    };
    char path[1200];
    snprintf(path, sizeof path, "%s/d.json", dir);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        write_config(path, cases[i].text);
        it_run run;
        it_main(&run, "--print-layout --from-deepspeed %s %s", path, cases[i].args);
        it_expect(&run, HX_EXIT_USAGE, cases[i].why);
        it_free(&run);
    }
    /* "auto" (the HF Trainer's placeholder) is listed, not read */
    write_config(path, "{\"train_batch_size\": \"auto\", \"bf16\": {\"enabled\": \"auto\"}}");
    it_run run;
    it_main(&run, "--print-layout --from-deepspeed %s", path);
    it_expect(&run, HX_EXIT_PASS, NULL);
    it_has(run.out, "ignored train_batch_size: \"auto\": the HF Trainer fills it in", "stdout");
    it_free(&run);
    write_config(path, "{\"a\\nb\": \"x\\ny\"}");
    it_main(&run, "--print-layout --from-deepspeed %s", path);
    it_expect(&run, HX_EXIT_PASS, NULL);
    it_has(run.out, "ignored a\\nb: \"x\\ny\": no tiny-moe setting\n", "stdout");
    it_has(run.out, "--dtype f32", "stdout");
    it_free(&run);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(deepseek_v3_16b),     cmocka_unit_test(llama4_and_671b),
        cmocka_unit_test(torchtitan_refusals), cmocka_unit_test(deepspeed_autoep),
        cmocka_unit_test(deepspeed_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
