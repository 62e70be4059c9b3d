/* The sharded and pipelined tiny-moe (docs/model.md, Sharded and pipelined grid): training with
 * tensor, expert-tensor, context and pipeline parallelism under every framework preset. Every run
 * must pass every check (each shard's reduced gradient against its slice of the logical reference,
 * replicas per replica set); a layout-independent run trains the same logical model under every
 * layout, and a sweep finds the same final logical weights assembled from the shards; the dumps
 * hold shards under the logical paths with their metadata; the sizes the model cannot split
 * are usage errors. Worlds of 16 and 32 ranks are test_sharded_slow.c's (label slow). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cli.h"
#include "harness_test.h"
#include "safetensors.h"

static const hx_st_tensor *tensor(const hx_st_file *f, const char *name);
static hx_st_file *dump_file(const char *dir, int rank);

/* Stage A: tensor and context parallelism (pp = etp = 1). */
static void tensor_and_context(void **state)
{
    (void)state;
    hx_test_run_passes("--framework megatron --world 4 --tp 2 --etp 1 --ep 2 --dtype f32");
    hx_test_run_passes("--framework megatron --world 8 --tp 2 --etp 1 --ep 4 --dtype bf16 "
                       "--shared-expert-ff 32 --expert-reduce mean");
    hx_test_run_passes("--framework megatron --world 8 --cp 2 --ep 2 --dtype f16");
    hx_test_run_passes("--framework megatron --world 8 --tp 2 --cp 2 --etp 1 --ep 2 --dtype f32 "
                       "--shared-expert-ff 16 --aux-loss-coeff 0.01 --z-loss-coeff 0.001");
    hx_test_run_passes("--framework deepspeed --world 4 --tp 2 --ep 2 --dtype bf16 --quant nf4");
    /* a data shard over its TP x CP ranks: capacity and the local load-balancing loss */
    hx_test_run_passes("--framework megatron --world 8 --tp 2 --cp 2 --etp 1 --ep 2 --dtype f32 "
                       "--capacity-factor 1.0 --aux-loss-coeff 0.01 --aux-loss-scope local");
    hx_test_run_passes("--framework megatron --world 8 --tp 2 --pp 2 --ep 2 --dtype f32 "
                       "--capacity-factor 0.8 --shared-expert-ff 16");
    hx_test_run_passes("--framework torchtitan --world 8 --tp 2 --ep 2 --dtype f32 --quant awq "
                       "--policy zero");
}

/* Stage B: expert tensor parallelism. */
static void expert_tensor(void **state)
{
    (void)state;
    hx_test_run_passes("--framework megatron --world 4 --tp 2 --ep 2 --dtype f32");
    hx_test_run_passes("--framework megatron --world 8 --tp 2 --ep 4 --dtype bf16 "
                       "--shared-expert-ff 32 --expert-reduce mean --fp32-master");
    hx_test_run_passes("--framework megatron-0.9 --world 8 --tp 2 --ep 2 --dtype f16");
    hx_test_run_passes("--framework megatron --world 8 --tp 2 --ep 2 --etp 2 --dtype f32 "
                       "--order tp-cp-dp-ep-pp --policy zero");
}

/* Stage B with quantized experts: bases split on whole NF4 blocks and AWQ words, w1's lora_b
 * by rows and w2's lora_a by columns, the other adapters replicated over expert-TP. */
static void quantized_expert_tensor(void **state)
{
    (void)state;
    hx_test_run_passes("--framework megatron --world 4 --tp 2 --ep 2 --quant nf4 --d-ff 128 "
                       "--dtype f32");
    hx_test_run_passes("--framework megatron --world 8 --tp 2 --pp 2 --ep 2 --quant nf4 "
                       "--d-ff 128 --dtype f16 --expert-reduce mean");
    hx_test_run_passes("--framework megatron --world 4 --tp 2 --ep 2 --quant awq --d-ff 512 "
                       "--dtype bf16 --policy zero");

    const char *dir = hx_test_dir("sharded-nf4-dump");
    char dump[600];
    snprintf(dump, sizeof dump, "%s/dump", dir);
    hx_test_run run;
    hx_test_harness(
        &run,
        "--framework megatron --world 2 --tp 2 --ep 1 --quant nf4 --d-ff 128 --dtype f32 "
        "--steps 1 --tokens 16 --quiet --out none --dump %s",
        dump);
    if (run.status != HX_EXIT_PASS)
        fail_msg("exit %d\n%s%s", run.status, run.err, run.out);
    hx_st_file *r0 = dump_file(dump, 0), *r1 = dump_file(dump, 1);
    const char *shards = hx_st_metadata(r1, "shards");
    assert_non_null(shards);
    /* D = 32, F = 128: w1's base is a byte range, w2's a column range of its [D, F/2] view */
    if (!strstr(shards, "\"layers.0.experts.0.w1.qweight\": {\"shape\": [2048], \"dim\": 0, "
                        "\"offset\": 1024}") ||
        !strstr(shards, "\"layers.0.experts.0.w2.qweight\": {\"shape\": [32, 64], \"dim\": 1, "
                        "\"offset\": 32}") ||
        !strstr(shards, "\"layers.0.experts.0.w2.absmax\": {\"shape\": [32, 2], \"dim\": 1, "
                        "\"offset\": 1}") ||
        !strstr(shards, "\"layers.0.experts.0.w1.lora_b.weight\": {\"shape\": [128, 4], "
                        "\"dim\": 0, \"offset\": 64}") ||
        strstr(shards, "w1.lora_a"))
        fail_msg("rank 1's shards: %s", shards);
    /* the replicated adapter: one value and one reduced gradient on both ETP ranks */
    const hx_st_tensor *a0 = tensor(r0, "param/layers.0.experts.0.w1.lora_a.weight");
    const hx_st_tensor *a1 = tensor(r1, "param/layers.0.experts.0.w1.lora_a.weight");
    assert_memory_equal(a0->data, a1->data, a0->nbytes);
    const hx_st_tensor *g0 = tensor(r0, "grad/layers.0.experts.0.w1.lora_a.weight");
    const hx_st_tensor *g1 = tensor(r1, "grad/layers.0.experts.0.w1.lora_a.weight");
    assert_memory_equal(g0->data, g1->data, g0->nbytes);
    hx_st_file_free(r0);
    hx_st_file_free(r1);
}

/* Stage C: pipeline parallelism, alone and with the others. */
static void pipeline(void **state)
{
    (void)state;
    hx_test_run_passes("--framework megatron --world 2 --pp 2 --ep 1 --dtype f32");
    hx_test_run_passes("--framework megatron --world 8 --pp 2 --ep 2 --dtype bf16 --layers 4 "
                       "--shared-expert-ff 32");
    hx_test_run_passes("--framework megatron --world 8 --tp 2 --pp 2 --ep 2 --dtype f32 "
                       "--shared-expert-ff 32 --expert-reduce mean");
    hx_test_run_passes("--framework deepspeed --world 8 --tp 2 --pp 2 --ep 2 --dtype bf16");
    hx_test_run_passes("--framework torchtitan --world 8 --pp 2 --cp 2 --ep 2 --dtype f32 "
                       "--aux-loss-coeff 0.01");
    hx_test_run_passes("--framework megatron-0.9 --world 8 --tp 2 --pp 2 --ep 2 --dtype f16 "
                       "--expert-reduce mean --policy zero");
    /* the global norm over the sets: every replica set and every shard once */
    hx_test_run_passes("--framework megatron --world 8 --tp 2 --pp 2 --ep 2 --dtype f32 "
                       "--shared-expert-ff 16 --clip-grad 0.5");
}

/* The per-step losses of report.json's steps. */
static void step_losses(const char *dir, double *loss, int n)
{
    hx_json *report = hx_test_report(dir);
    const hx_json *steps = hx_json_get(report, "steps");
    assert_non_null(steps);
    assert_int_equal(steps->count, n);
    for (int s = 0; s < n; s++) {
        const hx_json *l = hx_json_get(&steps->items[s], "loss");
        assert_non_null(l);
        loss[s] = l->number;
    }
    hx_json_free(report);
}

/* --global-batch: the same logical model on the same tokens under every layout, so the losses
 * of a sharded and pipelined run follow the one-rank run's within FP32 rounding (the training
 * moves the loss far more than that: a wrong gradient of any shard shows after one step). */
static void same_logical_model(void **state)
{
    (void)state;
    static const char *const layouts[] = {
        "--world 1 --ep 1",
        "--framework megatron --world 8 --tp 2 --pp 2 --ep 2 --shared-expert-ff 32",
        "--framework megatron --world 8 --tp 2 --cp 2 --etp 1 --ep 4 --shared-expert-ff 32",
        "--framework deepspeed --world 8 --tp 2 --pp 2 --ep 2 --shared-expert-ff 32",
    };
    enum { STEPS = 3 };
    double first[STEPS], loss[STEPS];
    for (size_t i = 0; i < sizeof layouts / sizeof *layouts; i++) {
        const char *dir = hx_test_dir("same-model");
        hx_test_run run;
        const char *extra = i == 0 ? " --shared-expert-ff 32" : "";
        hx_test_harness(&run, "%s%s --global-batch 240 --dtype f32 --steps %d --quiet --out %s",
                        layouts[i], extra, STEPS, dir);
        if (run.status != HX_EXIT_PASS)
            fail_msg("%s: exit %d\n%s%s", layouts[i], run.status, run.err, run.out);
        step_losses(dir, i == 0 ? first : loss, STEPS);
        if (i == 0) {
            assert_true(first[STEPS - 1] < first[0] - 0.1); /* it trains */
            continue;
        }
        for (int s = 0; s < STEPS; s++)
            if (!(fabs(loss[s] - first[s]) <= 1e-5 * fabs(first[s])))
                fail_msg("%s: step %d loss %.9g, the one-rank run's %.9g", layouts[i], s + 1,
                         loss[s], first[s]);
    }
}

/* A sweep over sharded layouts compares the final logical weights too: assembled from the
 * shards, they must agree with the one-rank run's. */
static void sweep_of_sharded_layouts(void **state)
{
    (void)state;
    const char *dir = hx_test_dir("sharded-sweep");
    char out[600], file[700];
    snprintf(out, sizeof out, "%s", dir);
    snprintf(file, sizeof file, "%s/layouts.json", out);
    static const char text[] =
        "[{\"world\": 1, \"ep\": 1},\n"
        " {\"framework\": \"megatron\", \"world\": 8, \"tp\": 2, \"pp\": 2, \"ep\": 2},\n"
        " {\"framework\": \"deepspeed\", \"world\": 8, \"tp\": 2, \"pp\": 2, \"ep\": 2}]\n";
    assert_int_equal(hx_write_file(file, text, sizeof text - 1), SELDP_OK);
    hx_test_run run;
    hx_test_harness(&run,
                    "--sweep %s --global-batch 120 --dtype f32 --steps 2 --shared-expert-ff 16 "
                    "--out %s",
                    file, out);
    if (run.status != HX_EXIT_PASS || !strstr(run.out, "sweep result: PASS (3 of 3 runs"))
        fail_msg("exit %d\n%s%s", run.status, run.err, run.out);
}

/* Checkpoints (docs/harness.md, Checkpoints) of a sharded run hold whole logical tensors: resumed
 * under the same layout the run continues bit for bit, under another (one rank; other sizes) within
 * FP32 rounding, and a one-rank checkpoint resumes sharded. */
static void checkpoints(void **state)
{
    (void)state;
    const char *common = "--global-batch 160 --dtype f32 --shared-expert-ff 16 --quiet";
    const char *sharded = "--framework megatron --world 8 --tp 2 --pp 2 --ep 2";
    static const char *const others[] = {
        "--world 1 --ep 1",
        "--framework deepspeed --world 8 --tp 2 --ep 4",
        "--framework megatron --world 8 --tp 2 --pp 2 --ep 2",
    };
    char base[600], full[700], ckpt[700], out[700], one_ckpt[700];
    snprintf(base, sizeof base, "%s", hx_test_dir("sharded-ckpt"));
    snprintf(full, sizeof full, "%s/full", base);
    snprintf(ckpt, sizeof ckpt, "%s/ckpt", base);
    snprintf(out, sizeof out, "%s/resumed", base);
    snprintf(one_ckpt, sizeof one_ckpt, "%s/one-ckpt", base);
    hx_test_run run;
    double want[4], got[2];
    hx_test_harness(&run, "%s %s --steps 4 --out %s", sharded, common, full);
    assert_int_equal(run.status, HX_EXIT_PASS);
    step_losses(full, want, 4);
    hx_test_harness(&run, "%s %s --steps 2 --save %s --out none", sharded, common, ckpt);
    if (run.status != HX_EXIT_PASS)
        fail_msg("save: exit %d\n%s%s", run.status, run.err, run.out);
    for (size_t i = 0; i < sizeof others / sizeof *others; i++) {
        hx_test_harness(&run, "%s %s --steps 4 --resume %s --out %s", others[i], common, ckpt, out);
        if (run.status != HX_EXIT_PASS)
            fail_msg("%s --resume: exit %d\n%s%s", others[i], run.status, run.err, run.out);
        step_losses(out, got, 2);
        bool same_layout = strcmp(others[i], sharded) == 0;
        for (int k = 0; k < 2; k++)
            if (same_layout ? memcmp(&got[k], &want[2 + k], sizeof got[k]) != 0
                            : !(fabs(got[k] - want[2 + k]) <= 1e-5 * want[2 + k]))
                fail_msg("%s resumed: step %d loss %.17g, uninterrupted %.17g", others[i], 3 + k,
                         got[k], want[2 + k]);
        if (same_layout) {
            hx_json *report = hx_test_report(out);
            int64_t tested, failed;
            hx_test_check(report, "replicas bit-identical after --resume", &tested, &failed);
            assert_true(tested > 0);
            assert_int_equal(failed, 0);
            hx_json_free(report);
        }
    }
    /* the other way: a one-rank checkpoint, resumed sharded */
    hx_test_harness(&run, "--world 1 --ep 1 %s --steps 2 --save %s --out none", common, one_ckpt);
    assert_int_equal(run.status, HX_EXIT_PASS);
    hx_test_harness(&run, "%s %s --steps 4 --resume %s --out %s", sharded, common, one_ckpt, out);
    if (run.status != HX_EXIT_PASS)
        fail_msg("sharded resume of a one-rank checkpoint: exit %d\n%s%s", run.status, run.err,
                 run.out);
    step_losses(out, got, 2);
    for (int k = 0; k < 2; k++)
        if (!(fabs(got[k] - want[2 + k]) <= 1e-5 * want[2 + k]))
            fail_msg("one-rank checkpoint resumed sharded: step %d loss %.17g, %.17g", 3 + k,
                     got[k], want[2 + k]);
}

static const hx_st_tensor *tensor(const hx_st_file *f, const char *name)
{
    const hx_st_tensor *t = hx_st_find(f, name);
    if (!t)
        fail_msg("the dump lacks %s", name);
    return t;
}

static hx_st_file *dump_file(const char *dir, int rank)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/rank%d.safetensors", dir, rank);
    hx_st_file *f = NULL;
    assert_int_equal(hx_st_read(path, &f), SELDP_OK);
    return f;
}

/* The dump of megatron, world 8, tp 2, pp 2, ep 2 (etp 2): ranks 0-3 are stage 0, 4-7 stage 1;
 * TP pairs [0,1] [2,3] ...; each holds half the vocabulary and half of every expert's d_ff. */
static void dump_of_shards(void **state)
{
    (void)state;
    const char *dir = hx_test_dir("sharded-dump");
    char dump[600];
    snprintf(dump, sizeof dump, "%s/dump", dir);
    hx_test_run run;
    hx_test_harness(&run,
                    "--framework megatron --world 8 --tp 2 --pp 2 --ep 2 --dtype f32 --steps 1 "
                    "--tokens 16 --quiet --out none --dump %s",
                    dump);
    if (run.status != HX_EXIT_PASS)
        fail_msg("exit %d\n%s%s", run.status, run.err, run.out);

    hx_st_file *r0 = dump_file(dump, 0), *r1 = dump_file(dump, 1), *r4 = dump_file(dump, 4);
    /* stage 0: the embedding rows of its TP rank, layer 0 only; the last stage: lm_head */
    const hx_st_tensor *e0 = tensor(r0, "param/embed.weight");
    assert_int_equal(e0->shape[0], 32);
    assert_int_equal(e0->shape[1], 32);
    assert_null(hx_st_find(r0, "param/lm_head.weight"));
    assert_null(hx_st_find(r0, "param/layers.1.norm.weight"));
    assert_null(hx_st_find(r4, "param/embed.weight"));
    assert_null(hx_st_find(r4, "param/layers.0.norm.weight"));
    tensor(r4, "param/lm_head.weight");
    tensor(r4, "param/final_norm.weight");
    const hx_st_tensor *w1 = tensor(r0, "param/layers.0.experts.0.w1.weight");
    const hx_st_tensor *w2 = tensor(r0, "param/layers.0.experts.0.w2.weight");
    assert_int_equal(w1->shape[0], 32); /* F / etp rows */
    assert_int_equal(w2->shape[1], 32); /* F / etp columns */
    assert_string_equal(hx_st_metadata(r0, "stage"), "0");
    assert_string_equal(hx_st_metadata(r4, "stage"), "1");
    const char *shards = hx_st_metadata(r1, "shards");
    assert_non_null(shards);
    if (!strstr(shards, "\"embed.weight\": {\"shape\": [64, 32], \"dim\": 0, \"offset\": 32}") ||
        !strstr(shards, "\"layers.0.experts.0.w2.weight\": {\"shape\": [32, 64], \"dim\": 1, "
                        "\"offset\": 32}"))
        fail_msg("rank 1's shards: %s", shards);

    /* the tied embedding: stage 0's copy and the last stage's hold the same values, and the
     * embedding group reduced one gradient into both */
    const hx_st_tensor *h0 = tensor(r4, "param/lm_head.weight");
    assert_int_equal(h0->nbytes, e0->nbytes);
    assert_memory_equal(h0->data, e0->data, e0->nbytes);
    const hx_st_tensor *g0 = tensor(r0, "grad/embed.weight");
    const hx_st_tensor *g4 = tensor(r4, "grad/lm_head.weight");
    assert_memory_equal(g0->data, g4->data, g0->nbytes);
    /* the two TP ranks hold different rows */
    const hx_st_tensor *e1 = tensor(r1, "param/embed.weight");
    assert_memory_not_equal(e0->data, e1->data, e0->nbytes);
    hx_st_file_free(r0);
    hx_st_file_free(r1);
    hx_st_file_free(r4);

    char path[1024], *text = NULL;
    size_t len = 0;
    snprintf(path, sizeof path, "%s/manifest.json", dump);
    assert_int_equal(hx_read_file(path, &text, &len), SELDP_OK);
    if (!strstr(text, "\"batch_ranks\": [0, 1, 2, 3]") ||
        !strstr(text, "\"data_shards\": [[0, 1], [2, 3]]") ||
        !strstr(text, "\"tp\": 2, \"pp\": 2, \"cp\": 1, \"ep\": 2, \"etp\": 2"))
        fail_msg("manifest.json:\n%s", text);
    /* every rank's dense and sequence-parallel reductions weighed the global batch */
    hx_json *m = NULL;
    assert_int_equal(hx_json_parse(text, len, path, &m), SELDP_OK);
    int64_t tokens = hx_test_int(m, "global_tokens");
    const hx_json *weights = hx_json_get(m, "global_weights");
    assert_non_null(weights);
    assert_int_equal(weights->count, 8);
    for (size_t r = 0; r < weights->count; r++) {
        assert_int_equal(hx_test_int(&weights->items[r], "dense"), tokens);
        assert_int_equal(hx_test_int(&weights->items[r], "sequence_parallel"), tokens);
    }
    hx_json_free(m);
    free(text);
}

static void expect_usage(const char *args, const char *why)
{
    hx_test_run run;
    hx_test_harness(&run, "%s", args);
    if (run.status != HX_EXIT_USAGE || !strstr(run.err, why) ||
        strchr(run.err, '\n') != run.err + strlen(run.err) - 1)
        fail_msg("seldp-harness %s: exit %d, stderr \"%s\"; expected exit 2 and one line with "
                 "\"%s\"",
                 args, run.status, run.err, why);
}

/* What the sharded model cannot split, and what it does not support yet. */
static void refusals(void **state)
{
    (void)state;
    expect_usage("--framework megatron --world 8 --pp 2 --ep 2 --layers 3 --out none",
                 "--pp 2: must divide the layers (--layers 3)");
    expect_usage("--framework megatron --world 8 --tp 2 --ep 2 --vocab 65 --out none",
                 "--tp 2: must divide the vocabulary (--vocab 65)");
    expect_usage("--framework megatron --world 8 --tp 2 --etp 1 --ep 2 --shared-expert-ff 33 "
                 "--out none",
                 "--tp 2: must divide the shared expert's d_ff (--shared-expert-ff 33)");
    expect_usage("--framework megatron --world 8 --tp 4 --ep 2 --d-ff 66 --out none",
                 "--etp 4: must divide the experts' d_ff (--d-ff 66)");
    expect_usage("--framework megatron --world 6 --tp 4 --ep 1 --out none",
                 "world_size (6) is not divisible by 4");
    expect_usage("--framework megatron --world 8 --tp 2 --ep 2 --quant nf4 --out none",
                 "--quant nf4 with --etp 2: each expert-TP shard of w2 needs whole NF4 blocks "
                 "along its rows: d_ff / etp (64 / 2) must be a multiple of 64");
    expect_usage("--framework megatron --world 8 --tp 2 --ep 2 --quant awq --d-ff 128 --out none",
                 "d_ff / etp (128 / 2) must be a multiple of 256");
}

/* Planted bugs on a grid: the sets of a sharded run carry them like an unsharded run's. */
static void planted_bugs(void **state)
{
    (void)state;
    static const struct {
        const char *args, *diagnosis;
    } cases[] = {
        {"--framework megatron --world 8 --tp 2 --pp 2 --ep 2 --inject ep-scale",
         "are 2\xc3\x97 too large (EP size 2) while the shared gradients agree: expert grads "
         "scaled by the EP size? (DeepSpeed #6545)"},
        {"--framework megatron --world 8 --tp 2 --pp 2 --ep 2 --inject world-div",
         "divided by the world size instead of the expert-data size?"},
        {"--framework megatron --world 8 --tp 2 --pp 2 --ep 2 --inject tied-twice",
         "the tied embedding reduced twice?"},
        /* the defect lands on rank 7's first gradient, an expert whose expert-data group is
         * rank 7 alone: no replica to differ, the reduction check names it */
        {"--framework megatron --world 8 --tp 2 --pp 2 --ep 2 --inject grad",
         "do not return the mean or sum of the inputs the ranks passed (result 2\xc3\x97 of it)"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        hx_test_run run;
        hx_test_harness(&run, "%s --dtype f32 --steps 1 --out none", cases[i].args);
        if (run.status != HX_EXIT_FAIL || !strstr(run.out, cases[i].diagnosis))
            fail_msg("seldp-harness %s: exit %d, no diagnosis '%s' in\n%s%s", cases[i].args,
                     run.status, cases[i].diagnosis, run.err, run.out);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(tensor_and_context),
        cmocka_unit_test(expert_tensor),
        cmocka_unit_test(quantized_expert_tensor),
        cmocka_unit_test(pipeline),
        cmocka_unit_test(same_logical_model),
        cmocka_unit_test(sweep_of_sharded_layouts),
        cmocka_unit_test(checkpoints),
        cmocka_unit_test(dump_of_shards),
        cmocka_unit_test(refusals),
        cmocka_unit_test(planted_bugs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
