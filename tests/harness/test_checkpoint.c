/* --save / --resume (docs/harness.md, Checkpoints): resuming at step k and training to n gives the
 * logical weights of an uninterrupted run to n, bit for bit under the same layout (several layouts,
 * dtypes, quantized experts, FP32 master weights) and within the dtype's tolerance under another
 * layout or world; the format of index.json; refusals of checkpoints that do not fit the run. */
#define _POSIX_C_SOURCE 200809L

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "ckpt_test.h"
#include "cli.h"
#include "harness_test.h"

static void run_ok(const char *fmt, ...) HX_PRINTF(1, 2);

static void run_ok(const char *fmt, ...)
{
    char args[1600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    hx_test_run run;
    hx_test_harness(&run, "%s", args);
    if (run.status != HX_EXIT_PASS)
        fail_msg("seldp-harness %s\nexit %d\n%s%s", args, run.status, run.err, run.out);
}

/* A directory path of its own for `name` (hx_test_dir's buffer is static). */
static char *dir_of(const char *name)
{
    char *d = strdup(hx_test_dir(name));
    assert_non_null(d);
    return d;
}

/* Resume at step 2 and train to 4 == train to 4, bit for bit, under one layout. */
static void resume_same_layout(const char *tag, const char *args)
{
    char name[128];
    snprintf(name, sizeof name, "%s-full", tag);
    char *full = dir_of(name);
    snprintf(name, sizeof name, "%s-k", tag);
    char *k = dir_of(name);
    snprintf(name, sizeof name, "%s-resumed", tag);
    char *resumed = dir_of(name);
    snprintf(name, sizeof name, "%s-report", tag);
    char *report = dir_of(name);
    run_ok("%s --steps 4 --quiet --out none --save %s", args, full);
    run_ok("%s --steps 2 --quiet --out none --save %s", args, k);
    run_ok("%s --steps 4 --quiet --out %s --resume %s --save %s", args, report, k, resumed);
    ckpt_test a, b;
    ckpt_test_read(full, &a);
    ckpt_test_read(resumed, &b);
    assert_int_equal(a.step, 4);
    ckpt_test_same(&a, &b, tag);
    /* the replicas were checked after loading, and all agreed */
    hx_json *rep = hx_test_report(report);
    int64_t tested = 0, failed = 0;
    hx_test_check(rep, "replicas bit-identical after --resume", &tested, &failed);
    assert_true(tested > 0);
    assert_int_equal(failed, 0);
    hx_json_free(rep);
    ckpt_test_free(&a);
    ckpt_test_free(&b);
    free(full);
    free(k);
    free(resumed);
    free(report);
}

static void test_resume_same_layout(void **state)
{
    (void)state;
    resume_same_layout("f32-w4ep2", "--world 4 --ep 2 --dtype f32");
    resume_same_layout("bf16-w8ep4-global", "--dtype bf16 --global-batch 192");
    resume_same_layout("f16-w4ep4-dpep-master",
                       "--world 4 --ep 4 --order dp-ep --dtype f16 --fp32-master");
    resume_same_layout("nf4-w4ep2", "--world 4 --ep 2 --quant nf4 --dtype bf16");
    resume_same_layout("awq-w2ep2-mean", "--world 2 --ep 2 --quant awq --dtype f32 "
                                         "--expert-reduce mean --global-batch 100");
}

/* Saved at world 8 ep 4, resumed under other layouts and worlds: the logical weights at step
 * 4 agree with the uninterrupted run within the dtype's tolerance. */
static void resume_other_layouts(const char *tag, const char *args, double tolerance)
{
    static const char *const layouts[] = {
        "--world 4 --ep 2",
        "--world 2 --ep 1 --order dp-ep",
        "--world 8 --ep 8",
        "--world 6 --ep 2 --order dp-ep",
    };
    char name[128];
    snprintf(name, sizeof name, "%s-full", tag);
    char *full = dir_of(name);
    snprintf(name, sizeof name, "%s-k", tag);
    char *k = dir_of(name);
    run_ok("%s --world 8 --ep 4 --steps 4 --quiet --out none --save %s", args, full);
    run_ok("%s --world 8 --ep 4 --steps 2 --quiet --out none --save %s", args, k);
    ckpt_test a;
    ckpt_test_read(full, &a);
    for (size_t i = 0; i < sizeof layouts / sizeof layouts[0]; i++) {
        snprintf(name, sizeof name, "%s-resumed%zu", tag, i);
        char *resumed = dir_of(name);
        run_ok("%s %s --steps 4 --quiet --out none --resume %s --save %s", args, layouts[i], k,
               resumed);
        ckpt_test b;
        ckpt_test_read(resumed, &b);
        char worst[160] = "";
        double d = ckpt_test_distance(&b, &a, worst, sizeof worst);
        if (!(d <= tolerance))
            fail_msg("%s resumed under %s: %s differs by %.3e > %.0e", tag, layouts[i], worst, d,
                     tolerance);
        /* the same tokens: the stream's state is the uninterrupted run's */
        assert_string_equal(a.token_state, b.token_state);
        ckpt_test_free(&b);
        free(resumed);
    }
    ckpt_test_free(&a);
    free(full);
    free(k);
}

static void test_resume_other_layout(void **state)
{
    (void)state;
    resume_other_layouts("f32", "--dtype f32 --global-batch 240", 1e-5);
    resume_other_layouts("bf16", "--dtype bf16 --global-batch 240", 1e-2);
    resume_other_layouts("nf4", "--dtype f32 --quant nf4 --global-batch 240", 1e-5);
}

/* index.json as checkpoint.h describes it, and one writer per replica set. */
static void test_index_format(void **state)
{
    (void)state;
    char *dir = dir_of("format");
    run_ok("--world 4 --ep 2 --dtype f32 --fp32-master --steps 3 --save-every 1 --quiet --out "
           "none --save %s",
           dir);
    char path[1300], *text = NULL;
    size_t len = 0;
    snprintf(path, sizeof path, "%s/index.json", dir);
    assert_int_equal(hx_read_file(path, &text, &len), SELDP_OK);
    hx_json *index = NULL;
    if (hx_json_parse(text, len, path, &index) != SELDP_OK)
        fail_msg("%s", hx_last_error());
    assert_string_equal(hx_json_get(index, "format")->string, "seldp-checkpoint");
    assert_int_equal(hx_test_int(index, "step"), 3);
    assert_int_equal(hx_test_int(hx_json_get(index, "config"), "d_model"), 32);
    const hx_json *tensors = hx_json_get(index, "tensors");
    const hx_json *embed = hx_json_get(tensors, "embed.weight");
    assert_non_null(embed);
    assert_string_equal(hx_json_get(embed, "dtype")->string, "F32");
    assert_int_equal(hx_json_get(embed, "slice")->count, 2);
    assert_int_equal(hx_json_get(embed, "slice")->items[0].items[1].integer, 64);
    assert_non_null(hx_json_get(tensors, "master/embed.weight"));
    /* no tied copy, no replicas: 1 embed, 2 x (norm, router), final norm, 8 experts x 2 x 2
     * weights, each trainable one with its master copy */
    assert_null(hx_json_get(tensors, "lm_head.weight"));
    assert_int_equal(tensors->count, 2 * (1 + 2 * 2 + 1 + 2 * 8 * 2));
    /* world 4, ep 2: rank 0 roots the shared group and experts 0-3, rank 1 experts 4-7 */
    assert_int_equal(hx_json_get(index, "files")->count, 2);
    /* the older saves are gone: two shards and the index */
    int entries = 0;
    for (int g = 0; g < 3; g++)
        for (int r = 0; r < 4; r++) {
            char shard[1400];
            snprintf(shard, sizeof shard, "%s/step%06d-g%d-rank%05d.safetensors", dir, g + 1, g, r);
            entries += access(shard, F_OK) == 0;
        }
    assert_int_equal(entries, 2);
    hx_json_free(index);
    free(text);
    free(dir);
}

/* --global-batch: the logical initial weights and the tokens depend only on the seed. Without
 * it (docs/harness.md) two worlds start from different weights. */
static void test_global_batch_initial_weights(void **state)
{
    (void)state;
    static const char *const layouts[] = {
        "--world 8 --ep 4",
        "--world 1 --ep 1",
        "--world 2 --ep 2 --order dp-ep",
        "--world 8 --ep 2 --order dp-ep",
        "--world 5 --ep 1",
    };
    ckpt_test first = {0};
    for (size_t i = 0; i < sizeof layouts / sizeof layouts[0]; i++) {
        char name[32];
        snprintf(name, sizeof name, "init%zu", i);
        char *dir = dir_of(name);
        /* lr 0: the checkpoint after one step holds the initial weights */
        run_ok("%s --quant nf4 --global-batch 100 --lr 0 --steps 1 --quiet --out none --save %s",
               layouts[i], dir);
        ckpt_test c;
        ckpt_test_read(dir, &c);
        if (i == 0)
            first = c;
        else {
            ckpt_test_same(&c, &first, layouts[i]);
            ckpt_test_free(&c);
        }
        free(dir);
    }
    char *a = dir_of("rank-dependent-a"), *b = dir_of("rank-dependent-b");
    run_ok("--world 8 --ep 4 --lr 0 --steps 1 --quiet --out none --save %s", a);
    run_ok("--world 4 --ep 2 --lr 0 --steps 1 --quiet --out none --save %s", b);
    ckpt_test x, y;
    ckpt_test_read(a, &x);
    ckpt_test_read(b, &y);
    assert_true(ckpt_test_differ(&x, &y));
    ckpt_test_free(&x);
    ckpt_test_free(&y);
    ckpt_test_free(&first);
    free(a);
    free(b);
}

/* Every layout of every world trains the same logical model on the same tokens: per-step loss
 * and final logical weights within the dtype's tolerance of the first layout's. */
static void global_batch_invariance(const char *tag, const char *dtype, double loss_tolerance,
                                    double tolerance)
{
    static const char *const layouts[] = {
        "--world 8 --ep 4", "--world 8 --ep 4 --order dp-ep",
        "--world 8 --ep 8", "--world 4 --ep 2",
        "--world 3 --ep 1", "--world 1 --ep 1",
    };
    enum { STEPS = 4 };
    double loss0[STEPS];
    ckpt_test first = {0};
    for (size_t i = 0; i < sizeof layouts / sizeof layouts[0]; i++) {
        char name[64];
        snprintf(name, sizeof name, "inv-%s-%zu", tag, i);
        char *dir = dir_of(name);
        snprintf(name, sizeof name, "inv-%s-%zu-report", tag, i);
        char *report = dir_of(name);
        run_ok("%s %s --global-batch 300 --steps %d --quiet --out %s --save %s", layouts[i], dtype,
               STEPS, report, dir);
        hx_json *rep = hx_test_report(report);
        const hx_json *steps = hx_json_get(rep, "steps");
        assert_int_equal(steps->count, STEPS);
        for (int s = 0; s < STEPS; s++) {
            double loss = hx_json_get(&steps->items[s], "loss")->number;
            assert_int_equal(hx_test_int(&steps->items[s], "tokens"), 300);
            if (i == 0)
                loss0[s] = loss;
            else if (!(fabs(loss - loss0[s]) <= loss_tolerance * fabs(loss0[s])))
                fail_msg("%s %s: step %d loss %.9g vs %.9g", tag, layouts[i], s + 1, loss,
                         loss0[s]);
        }
        hx_json_free(rep);
        ckpt_test c;
        ckpt_test_read(dir, &c);
        if (i == 0) {
            first = c;
        } else {
            char worst[160] = "";
            double d = ckpt_test_distance(&c, &first, worst, sizeof worst);
            if (!(d <= tolerance))
                fail_msg("%s %s: %s differs by %.3e > %.0e", tag, layouts[i], worst, d, tolerance);
            /* the token stream is the same stream, to the bit */
            assert_string_equal(c.token_state, first.token_state);
            ckpt_test_free(&c);
        }
        free(dir);
        free(report);
    }
    ckpt_test_free(&first);
}

static void test_global_batch_invariance(void **state)
{
    (void)state;
    global_batch_invariance("f32", "--dtype f32", 1e-5, 1e-5);
    /* FP32 gradients and master weights: the loss agrees as FP32 results do; the stored
     * parameters are BF16 roundings of masters that agree to FP32 precision */
    global_batch_invariance("bf16-master", "--dtype bf16 --fp32-master", 1e-5, 1e-2);
    /* BF16 gradients reduced over groups of different sizes round differently; at a smaller
     * step the runs stay within BF16's tolerance */
    global_batch_invariance("bf16", "--dtype bf16 --lr 0.1", 1e-2, 1e-2);
}

/* The same layout twice: the same bits (nothing depends on thread timing). */
static void test_global_batch_repeatable(void **state)
{
    (void)state;
    char *a = dir_of("repeat-a"), *b = dir_of("repeat-b");
    run_ok(
        "--world 6 --ep 3 --experts 6 --dtype bf16 --global-batch 77 --steps 3 --quiet --out none "
        "--save %s",
        a);
    run_ok(
        "--world 6 --ep 3 --experts 6 --dtype bf16 --global-batch 77 --steps 3 --quiet --out none "
        "--save %s",
        b);
    ckpt_test x, y;
    ckpt_test_read(a, &x);
    ckpt_test_read(b, &y);
    ckpt_test_same(&x, &y, "the same layout twice");
    ckpt_test_free(&x);
    ckpt_test_free(&y);
    free(a);
    free(b);
}

/* A layout file with a hot (redundant) expert and roots on non-first ranks, resumed on a
 * generated layout of another world and back; files of others in the folder are left alone. */
static void test_layout_file_reshard(void **state)
{
    (void)state;
    const char *hot = hx_test_layout("hot-expert.json");
    char *full = dir_of("hot-full"), *k = dir_of("hot-k"), *resumed = dir_of("hot-resumed");
    char *back = dir_of("hot-back");
    char mine[1400], notes[1400];
    snprintf(mine, sizeof mine, "%s/mine.txt", k);
    snprintf(notes, sizeof notes, "%s/notes.tmp", k);
    assert_int_equal(hx_write_file(mine, "x", 1), SELDP_OK);
    assert_int_equal(hx_write_file(notes, "y", 1), SELDP_OK);
    const char *args = "--dtype f32 --global-batch 120 --quiet --out none";
    run_ok("%s --layout-file %s --steps 4 --save %s", args, hot, full);
    run_ok("%s --layout-file %s --steps 2 --save %s", args, hot, k);
    run_ok("%s --world 2 --ep 2 --experts 4 --steps 3 --resume %s --save %s", args, k, resumed);
    run_ok("%s --layout-file %s --steps 4 --resume %s --save %s", args, hot, resumed, back);
    assert_int_equal(access(mine, F_OK), 0);
    assert_int_equal(access(notes, F_OK), 0);
    ckpt_test a, b;
    ckpt_test_read(full, &a);
    ckpt_test_read(back, &b);
    char worst[160] = "";
    double d = ckpt_test_distance(&b, &a, worst, sizeof worst);
    if (!(d <= 1e-5))
        fail_msg("hot-expert layout -> world 2 -> back: %s differs by %.3e", worst, d);
    ckpt_test_free(&a);
    ckpt_test_free(&b);
    free(full);
    free(k);
    free(resumed);
    free(back);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_index_format),
        cmocka_unit_test(test_resume_same_layout),
        cmocka_unit_test(test_resume_other_layout),
        cmocka_unit_test(test_global_batch_initial_weights),
        cmocka_unit_test(test_global_batch_invariance),
        cmocka_unit_test(test_global_batch_repeatable),
        cmocka_unit_test(test_layout_file_reshard),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
