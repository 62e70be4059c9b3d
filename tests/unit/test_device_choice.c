/* The harness's GPU choice for one-process-per-rank launches (harness/core/gpu.h): a process
 * takes GPU (local rank % GPUs it sees), so launchers that give every process its own
 * CUDA_VISIBLE_DEVICES put each on cuda:0; NCCL is chosen by `auto` only when the node's
 * processes use pairwise different GPUs, compared by PCI bus id. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "gpu.h"

static void test_local_rank_modulo_visible(void **state)
{
    (void)state;
    /* SLURM / torchrun style: each process sees one GPU, its own */
    for (int local = 0; local < 8; local++)
        assert_int_equal(hx_gpu_for_local_rank(local, 1), 0);
    /* every process sees the node's 4 GPUs */
    for (int local = 0; local < 4; local++)
        assert_int_equal(hx_gpu_for_local_rank(local, 4), local);
    /* more processes than GPUs: they share, round robin */
    assert_int_equal(hx_gpu_for_local_rank(5, 4), 1);
    assert_int_equal(hx_gpu_for_local_rank(2, 0), -1);
    assert_int_equal(hx_gpu_for_local_rank(-1, 4), -1);
}

static hx_gpu_id id(const char *text)
{
    hx_gpu_id g = {{0}};
    snprintf(g.text, sizeof g.text, "%s", text);
    return g;
}

static void test_distinct_by_bus_id(void **state)
{
    (void)state;
    /* one GPU per process, each called cuda:0 by its process, but different devices */
    hx_gpu_id own[4] = {id("0000:1b:00.0"), id("0000:3b:00.0"), id("0000:5b:00.0"),
                        id("0000:9b:00.0")};
    assert_true(hx_gpu_ids_distinct(own, 4));
    /* two processes on the same GPU */
    hx_gpu_id shared[3] = {id("0000:1b:00.0"), id("0000:3b:00.0"), id("0000:1b:00.0")};
    assert_false(hx_gpu_ids_distinct(shared, 3));
    /* a process without a GPU (or whose GPU could not be named) */
    hx_gpu_id unknown[2] = {id("0000:1b:00.0"), id("")};
    assert_false(hx_gpu_ids_distinct(unknown, 2));
    assert_true(hx_gpu_ids_distinct(own, 1));
}

static void test_identity_without_a_gpu(void **state)
{
    (void)state;
    if (hx_gpu_count() > 0)
        skip();
    assert_string_equal(hx_gpu_identity(0).text, "");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_local_rank_modulo_visible),
        cmocka_unit_test(test_distinct_by_bus_id),
        cmocka_unit_test(test_identity_without_a_gpu),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
