/* --zero 1: the distributed optimizer (docs/harness.md, The distributed optimizer). Every replica
 * set reduce-scatters its gradients (seldp_shard_reduce_scatter, _sum), each rank updates its
 * range of the FP32 masters and state, and the set all-gathers the parameters
 * (seldp_shard_allgather_params). Each range is the FP32 all-reduce's elements bit for bit and
 * the update is elementwise, so a --zero 1 run equals the --zero 0 run with FP32 masters (the
 * distributed optimizer's) bit for bit: the dumps' gradients, parameters after the update and the
 * manifest agree, on an expert-parallel layout and a Megatron grid, under SGD and AdamW, with
 * clipping (the norm over the ranges) and micro-batches. Every check passes, the post-step check
 * on each rank's own range. The dump records each rank's shard map. Where it cannot run: one
 * line, exit 2. */
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

#define COMMON "--steps 3 --quiet --out none --timeout 60"

static void run_dump(const char *args, const char *extra, const char *dir)
{
    hx_test_run run;
    hx_test_harness(&run, "%s %s %s --dump %s", COMMON, args, extra, dir);
    if (run.status != HX_EXIT_PASS)
        fail_msg("seldp-harness %s %s\nexit %d\n%s%s", args, extra, run.status, run.err, run.out);
}

static hx_st_file *read_rank(const char *dir, int r)
{
    char path[1300];
    snprintf(path, sizeof path, "%s/rank%d.safetensors", dir, r);
    hx_st_file *f = NULL;
    if (hx_st_read(path, &f) != SELDP_OK)
        fail_msg("%s", hx_last_error());
    return f;
}

/* The gradients and the parameters after the update of rank r: the same bytes. */
static int compare_rank(const char *args, const char *z0, const char *z1, int r)
{
    hx_st_file *a = read_rank(z0, r), *b = read_rank(z1, r);
    int compared = 0;
    for (size_t i = 0; i < hx_st_count(a); i++) {
        const hx_st_tensor *x = hx_st_at(a, i);
        if (strncmp(x->name, "grad/", 5) != 0 && strncmp(x->name, "param_next/", 11) != 0 &&
            strncmp(x->name, "param/", 6) != 0)
            continue;
        const hx_st_tensor *y = hx_st_find(b, x->name);
        if (!y)
            fail_msg("%s: rank %d: %s missing under --zero 1", args, r, x->name);
        if (x->dtype != y->dtype || x->nbytes != y->nbytes ||
            memcmp(x->data, y->data, x->nbytes) != 0)
            fail_msg("%s: rank %d: %s differs between --zero 0 and --zero 1", args, r, x->name);
        compared++;
    }
    const char *map = hx_st_metadata(b, "shard_map");
    if (!map || !strstr(map, "\"pieces\""))
        fail_msg("%s: rank %d: no shard map in the --zero 1 dump", args, r);
    hx_st_file_free(a);
    hx_st_file_free(b);
    return compared;
}

static void equals_zero0(const char *args, int world)
{
    char z0[1200], z1[1200];
    snprintf(z0, sizeof z0, "%s", hx_test_dir("zero0"));
    run_dump(args, "--fp32-master", z0);
    snprintf(z1, sizeof z1, "%s", hx_test_dir("zero1"));
    run_dump(args, "--zero 1", z1);
    for (int r = 0; r < world; r++)
        if (compare_rank(args, z0, z1, r) == 0)
            fail_msg("%s: rank %d: nothing compared", args, r);
}

static void expert_parallel(void **state)
{
    (void)state;
    equals_zero0("--world 8 --ep 4", 8);
    equals_zero0("--world 8 --ep 4 --optimizer adamw --lr 0.01 --weight-decay 0.01", 8);
    equals_zero0("--world 8 --ep 4 --optimizer adamw --lr 0.01 --expert-reduce mean --clip-grad "
                 "0.3 --micro-batches 2",
                 8);
    equals_zero0("--world 4 --ep 2 --optimizer adamw --lr 0.01 --dtype f16 --global-batch 256", 4);
    /* loss scaling: the ranges' found_inf, the skip of step 2 and the scale's growth */
    equals_zero0("--world 8 --ep 4 --optimizer adamw --lr 0.01 --dtype f16 --loss-scale dynamic "
                 "--loss-scale-window 1 --inject-overflow 2 --clip-grad 0.5",
                 8);
}

static void grids(void **state)
{
    (void)state;
    equals_zero0("--framework megatron --world 16 --tp 2 --pp 2 --ep 2 --optimizer adamw --lr "
                 "0.01 --tokens 16",
                 16);
    equals_zero0("--framework megatron --world 8 --cp 2 --ep 2 --tokens 16", 8);
}

static void usage_error(const char *args, const char *needle)
{
    hx_test_usage_error(needle, "%s%s", strstr(args, "--out") ? "" : "--out none ", args);
}

static void refusals(void **state)
{
    (void)state;
    usage_error("--zero 2", "--zero '2': expected 0 or 1");
    usage_error("--zero 1 --inject grad", "--zero 1 cannot run here: --inject grad");
    usage_error("--zero 1 --inject half-accum --world 4 --ep 2",
                "--zero 1 cannot run here: --inject half-accum");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(expert_parallel),
        cmocka_unit_test(grids),
        cmocka_unit_test(refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
