/* --loss-scale dynamic|X (F16): the gradients of S times the loss; an overflow anywhere skips the
 * step on every rank (one found_inf over the world), the scale backs off and grows as
 * docs/harness.md (Loss scaling) says, and the post-step check requires the skip.
 *   - --inject-overflow 3 skips step 3 on every rank and no other: the console names step 3
 *     alone, the dump of step 3 says skipped on every rank with param_next equal to param, the
 *     dump of step 4 shows the halved scale and an update;
 *   - growth after --loss-scale-window clean steps; a fixed X never changes;
 *   - every check passes, on an expert-parallel layout and a Megatron grid with AdamW and
 *     micro-batches;
 *   - bad input: one line, exit 2. */
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

#define COMMON "--dtype f16 --timeout 60 --out none"

static void run_ok(hx_test_run *run, const char *args, const char *dump)
{
    if (dump)
        hx_test_harness(run, "%s %s --dump %s", COMMON, args, dump);
    else
        hx_test_harness(run, "%s %s", COMMON, args);
    if (run->status != HX_EXIT_PASS)
        fail_msg("seldp-harness %s\nexit %d\n%s%s", args, run->status, run->err, run->out);
}

/* Rank r's dump: whether its update was skipped, its step's scale, and whether every
 * param_next equals its param. */
static void read_dump(const char *dir, int r, bool *skipped, double *scale, bool *unchanged)
{
    char path[1300];
    snprintf(path, sizeof path, "%s/rank%d.safetensors", dir, r);
    hx_st_file *f = NULL;
    if (hx_st_read(path, &f) != SELDP_OK)
        fail_msg("%s", hx_last_error());
    const char *meta = hx_st_metadata(f, "optimizer");
    assert_non_null(meta);
    hx_json *o = NULL;
    assert_int_equal(hx_json_parse(meta, strlen(meta), "optimizer", &o), SELDP_OK);
    const hx_json *s = hx_json_get(o, "skipped"), *ls = hx_json_get(o, "loss_scale");
    assert_non_null(s);
    assert_non_null(ls);
    *skipped = s->boolean;
    *scale = ls->number;
    *unchanged = true;
    for (size_t i = 0; i < hx_st_count(f); i++) {
        const hx_st_tensor *t = hx_st_at(f, i);
        if (strncmp(t->name, "param_next/", 11) != 0)
            continue;
        char name[400];
        snprintf(name, sizeof name, "param/%s", t->name + 11);
        const hx_st_tensor *before = hx_st_find(f, name);
        assert_non_null(before);
        if (memcmp(before->data, t->data, t->nbytes) != 0)
            *unchanged = false;
    }
    hx_json_free(o);
    hx_st_file_free(f);
}

static int count(const char *text, const char *needle)
{
    int n = 0;
    for (const char *p = strstr(text, needle); p; p = strstr(p + 1, needle))
        n++;
    return n;
}

static void injected_overflow_skips_its_step(void **state)
{
    (void)state;
    hx_test_run run;
    const char *base = "--world 8 --ep 4 --loss-scale dynamic --inject-overflow 3";
    char args[512];
    snprintf(args, sizeof args, "%s --steps 6", base);
    run_ok(&run, args, NULL);
    if (count(run.out, "overflowed") != 1 || !strstr(run.out, "loss scale: step 3 overflowed"))
        fail_msg("expected step 3 alone to overflow:\n%s", run.out);
    char dir[1200];
    snprintf(dir, sizeof dir, "%s", hx_test_dir("step3"));
    snprintf(args, sizeof args, "%s --steps 3 --quiet", base);
    run_ok(&run, args, dir);
    for (int r = 0; r < 8; r++) {
        bool skipped, unchanged;
        double scale;
        read_dump(dir, r, &skipped, &scale, &unchanged);
        if (!skipped || !unchanged || scale != 1024)
            fail_msg("step 3, rank %d: skipped %d, unchanged %d, scale %g", r, skipped, unchanged,
                     scale);
    }
    snprintf(dir, sizeof dir, "%s", hx_test_dir("step4"));
    snprintf(args, sizeof args, "%s --steps 4 --quiet", base);
    run_ok(&run, args, dir);
    for (int r = 0; r < 8; r++) {
        bool skipped, unchanged;
        double scale;
        read_dump(dir, r, &skipped, &scale, &unchanged);
        if (skipped || unchanged || scale != 512)
            fail_msg("step 4, rank %d: skipped %d, unchanged %d, scale %g (expected 512)", r,
                     skipped, unchanged, scale);
    }
}

static void growth_and_fixed(void **state)
{
    (void)state;
    hx_test_run run;
    char dir[1200];
    bool skipped, unchanged;
    double scale;
    /* 1024, doubled after a clean step: 2048 in step 2 */
    snprintf(dir, sizeof dir, "%s", hx_test_dir("growth"));
    run_ok(&run, "--world 4 --ep 2 --loss-scale dynamic --loss-scale-window 1 --steps 2 --quiet",
           dir);
    read_dump(dir, 0, &skipped, &scale, &unchanged);
    if (skipped || scale != 2048)
        fail_msg("growth: skipped %d, scale %g, expected 2048", skipped, scale);
    /* a fixed scale through an overflow */
    snprintf(dir, sizeof dir, "%s", hx_test_dir("fixed"));
    run_ok(&run, "--world 4 --ep 2 --loss-scale 256 --inject-overflow 2 --steps 3 --quiet", dir);
    read_dump(dir, 3, &skipped, &scale, &unchanged);
    if (skipped || scale != 256)
        fail_msg("fixed: skipped %d, scale %g, expected 256", skipped, scale);
}

static void layouts_pass(void **state)
{
    (void)state;
    hx_test_run run;
    run_ok(&run,
           "--world 8 --ep 4 --loss-scale dynamic --inject-overflow 2 --steps 4 --optimizer "
           "adamw --lr 0.01 --micro-batches 2 --clip-grad 0.5 --quiet",
           NULL);
    run_ok(&run,
           "--framework megatron --world 16 --tp 2 --pp 2 --ep 2 --loss-scale dynamic "
           "--inject-overflow 2 --steps 3 --optimizer adamw --lr 0.01 --micro-batches 4 --tokens "
           "16 --quiet",
           NULL);
    run_ok(&run,
           "--world 8 --ep 4 --loss-scale dynamic --inject-overflow 1 --steps 2 --expert-reduce "
           "mean --fp32-master --quiet",
           NULL);
    /* the distributed optimizer: found_inf from every rank's ranges, one decision */
    run_ok(&run,
           "--framework megatron --world 8 --tp 2 --pp 2 --ep 2 --loss-scale dynamic "
           "--inject-overflow 2 --steps 3 --optimizer adamw --lr 0.01 --zero 1 --clip-grad 0.5 "
           "--micro-batches 2 --quiet",
           NULL);
}

static void usage_error(const char *args, const char *needle)
{
    hx_test_usage_error(needle, "--out none %s", args);
}

static void bad_input(void **state)
{
    (void)state;
    usage_error("--loss-scale dynamic", "needs --dtype f16");
    usage_error("--dtype bf16 --loss-scale 128", "needs --dtype f16");
    usage_error("--dtype f16 --inject-overflow 2", "needs --loss-scale");
    usage_error("--dtype f16 --loss-scale dynamic --inject-overflow 9 --steps 3", "beyond");
    usage_error("--dtype f16 --loss-scale 0", "expected dynamic or a number > 0");
    usage_error("--dtype f16 --loss-scale dynamic --loss-scale-init 0.5", "a number >= 1");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(injected_overflow_skips_its_step),
        cmocka_unit_test(growth_and_fixed),
        cmocka_unit_test(layouts_pass),
        cmocka_unit_test(bad_input),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
