/* Sharded sessions (seldp/shard.h) and the communicator's reduce_scatter and
 * allgather_counts on device memory: NCCL with one rank per GPU (ncclReduceScatter and
 * ncclAllGather for equal blocks, grouped ncclReduce and ncclBroadcast for uneven ones), and
 * the host-staged transport with three ranks sharing the GPUs (device buffers staged through
 * pinned memory). Gradients are small integers, exact in any summation order, so every range
 * is compared bit for bit with the same elements of seldp_session_reduce_fp32 of the same
 * device gradients, and every all-gathered parameter with its expected value on every rank.
 * Exits 77 without a GPU; `--host` runs the same checks on host memory (host-staged). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "gpu_ranks.h"

#define MAX_RANKS 8
#define N_A       1000 /* a.weight, F32 */
#define N_B       777  /* b.weight, BF16 */

static gpu_world_kind kind = GPU_WORLD_NCCL;
static int world_size = 1, gpus = 1;

/* Exact values: small integers, any sum of up to 8 of them exact in F32 (and in BF16). */
static float value(int rank, size_t i)
{
    return (float)((int)((i * 7 + (size_t)rank * 3) % 13) - 6);
}

static int rank_collectives(tr_rank_ctx *ctx)
{
    seldp_device dev = seldp_comm_device(ctx->world);
    int n = ctx->size, me = ctx->rank;
    for (int uneven = 0; uneven <= 1; uneven++) {
        size_t counts[MAX_RANKS], total = 0, at = 0;
        for (int r = 0; r < n; r++) {
            counts[r] = uneven ? 1000 + 37 * (size_t)r : 1024;
            if (r == me)
                at = total;
            total += counts[r];
        }
        float *host = malloc(total * sizeof *host), *sum = malloc(total * sizeof *sum);
        float *d = gpu_buf_alloc(dev, total * sizeof *d), *ds = gpu_buf_alloc(dev, total * 4);
        float *dr = gpu_buf_alloc(dev, counts[me] * 4);
        RANK_CHECK(ctx, host && sum && d && ds && dr, "out of memory");
        for (size_t i = 0; i < total; i++)
            host[i] = value(me, i);
        RANK_CHECK_OK(ctx, gpu_upload(dev, d, host, total * 4));
        RANK_CHECK_OK(ctx, seldp_comm_allreduce(ctx->world, d, ds, total, SELDP_F32, dev));
        RANK_CHECK_OK(ctx, seldp_comm_reduce_scatter(ctx->world, d, dr, counts, SELDP_F32, dev));
        RANK_CHECK_OK(ctx, gpu_download(dev, sum, ds, total * 4));
        RANK_CHECK_OK(ctx, gpu_download(dev, host, dr, counts[me] * 4));
        RANK_CHECK(ctx, memcmp(host, sum + at, counts[me] * 4) == 0,
                   "reduce_scatter (%s blocks): block %d differs from the allreduce's",
                   uneven ? "uneven" : "equal", me);
        /* all-gather the blocks back: every rank gets the whole sum */
        RANK_CHECK_OK(ctx, seldp_comm_allgather_counts(ctx->world, dr, d, counts, SELDP_F32, dev));
        RANK_CHECK_OK(ctx, gpu_download(dev, host, d, total * 4));
        RANK_CHECK(ctx, memcmp(host, sum, total * 4) == 0,
                   "allgather_counts (%s blocks): the gathered blocks differ from the sum",
                   uneven ? "uneven" : "equal");
        gpu_buf_free(dev, d);
        gpu_buf_free(dev, ds);
        gpu_buf_free(dev, dr);
        free(host);
        free(sum);
    }
    return 0;
}

static void test_collectives(void **state)
{
    (void)state;
    gpu_run_ranks_or_fail(kind, world_size, gpus, 120.0, rank_collectives, NULL);
}

/* A device tensor of n elements of dtype filled with value(rank + salt, i). */
static void *device_values(seldp_device dev, seldp_dtype dtype, size_t n, int salt)
{
    size_t bytes = n * seldp_dtype_size(dtype);
    void *host = malloc(bytes), *d = gpu_buf_alloc(dev, bytes);
    if (!host || !d) {
        free(host);
        gpu_buf_free(dev, d);
        return NULL;
    }
    for (size_t i = 0; i < n; i++) {
        if (dtype == SELDP_F32)
            ((float *)host)[i] = value(salt, i);
        else
            ((uint16_t *)host)[i] = seldp_f32_to_bf16(value(salt, i));
    }
    if (gpu_upload(dev, d, host, bytes) != SELDP_OK) {
        gpu_buf_free(dev, d);
        d = NULL;
    }
    free(host);
    return d;
}

static int rank_session(tr_rank_ctx *ctx)
{
    seldp_device dev = seldp_comm_device(ctx->world);
    int me = ctx->rank;
    int64_t sa[1] = {N_A}, sb[1] = {N_B};
    void *pa = device_values(dev, SELDP_F32, N_A, 100 + me);
    void *pb = device_values(dev, SELDP_BF16, N_B, 200 + me);
    void *ga = device_values(dev, SELDP_F32, N_A, me),
         *gb = device_values(dev, SELDP_BF16, N_B, 50 + me);
    void *ga2 = device_values(dev, SELDP_F32, N_A, me),
         *gb2 = device_values(dev, SELDP_BF16, N_B, 50 + me);
    RANK_CHECK(ctx, pa && pb && ga && gb && ga2 && gb2, "out of device memory");
    seldp_model *model = NULL;
    seldp_grads *g1 = NULL, *g2 = NULL;
    seldp_session *s = NULL;
    seldp_shard_map *map = NULL;
    seldp_tensor ta = seldp_tensor_view(SELDP_F32, dev, pa, 1, sa);
    seldp_tensor tb = seldp_tensor_view(SELDP_BF16, dev, pb, 1, sb);
    RANK_CHECK_OK(ctx, seldp_model_create(me, &model));
    RANK_CHECK_OK(ctx, seldp_model_add(model, "a.weight", 1, &ta, false, NULL));
    RANK_CHECK_OK(ctx, seldp_model_add(model, "b.weight", 2, &tb, false, NULL));
    RANK_CHECK_OK(
        ctx, seldp_session_initialize(ctx->world, model, 0, (seldp_param_id[]){1, 2}, 2, NULL, &s));
    RANK_CHECK_OK(ctx, seldp_shard_map_create(s, &map));
    size_t begin, count;
    RANK_CHECK_OK(ctx, seldp_shard_map_range(map, me, &begin, &count));
    float *drange = gpu_buf_alloc(dev, (count + 1) * 4), *range = malloc((count + 1) * 4);
    bool present[4] = {false, false, false, false};
    RANK_CHECK(ctx, drange && range, "out of memory");
    RANK_CHECK_OK(ctx, seldp_grads_create(&g1));
    RANK_CHECK_OK(ctx, seldp_grads_create(&g2));
    seldp_tensor gta = seldp_tensor_view(SELDP_F32, dev, ga, 1, sa);
    seldp_tensor gtb = seldp_tensor_view(SELDP_BF16, dev, gb, 1, sb);
    seldp_tensor gta2 = seldp_tensor_view(SELDP_F32, dev, ga2, 1, sa);
    seldp_tensor gtb2 = seldp_tensor_view(SELDP_BF16, dev, gb2, 1, sb);
    RANK_CHECK_OK(ctx, seldp_grads_put(g1, 1, &gta, SELDP_BORROWED));
    RANK_CHECK_OK(ctx, seldp_grads_put(g1, 2, &gtb, SELDP_BORROWED));
    RANK_CHECK_OK(ctx, seldp_grads_put(g2, 1, &gta2, SELDP_BORROWED));
    RANK_CHECK_OK(ctx, seldp_grads_put(g2, 2, &gtb2, SELDP_BORROWED));

    RANK_CHECK_OK(ctx, seldp_shard_reduce_scatter_sum(s, map, g1, true, SELDP_MISSING_ERROR, drange,
                                                      count, present, NULL));
    RANK_CHECK_OK(ctx, seldp_session_sum_fp32(s, g2, true, SELDP_MISSING_ERROR, NULL));
    RANK_CHECK_OK(ctx, gpu_download(dev, range, drange, count * 4));
    for (size_t i = 0; i < seldp_shard_map_pieces(map, me); i++) {
        seldp_shard_piece p;
        RANK_CHECK_OK(ctx, seldp_shard_map_piece(map, me, i, &p));
        const seldp_tensor *t = seldp_grads_get(g2, p.id);
        RANK_CHECK(ctx, present[i] && t && t->dtype == SELDP_F32, "'%s' has no FP32 result",
                   p.path);
        float *want = malloc(p.count * 4);
        RANK_CHECK(ctx, want, "out of memory");
        RANK_CHECK_OK(
            ctx, gpu_download(dev, want, (const float *)t->data + p.param_offset, p.count * 4));
        RANK_CHECK(ctx, memcmp(want, range + p.range_offset, p.count * 4) == 0,
                   "'%s': the range differs from the all-reduce's result", p.path);
        free(want);
    }
    /* all-gather FP32 "master" values into the parameters */
    for (size_t i = 0; i < count; i++)
        range[i] = value(7, begin + i) * 0.5f;
    RANK_CHECK_OK(ctx, gpu_upload(dev, drange, range, count * 4));
    RANK_CHECK_OK(ctx, seldp_shard_allgather_params(s, map, drange, SELDP_F32, count));
    float *a = malloc(N_A * 4);
    uint16_t *b = malloc(N_B * 2);
    RANK_CHECK(ctx, a && b, "out of memory");
    RANK_CHECK_OK(ctx, gpu_download(dev, a, pa, N_A * 4));
    RANK_CHECK_OK(ctx, gpu_download(dev, b, pb, N_B * 2));
    for (size_t i = 0; i < N_A; i++)
        RANK_CHECK(ctx, a[i] == value(7, i) * 0.5f, "a.weight[%zu] = %g", i, (double)a[i]);
    for (size_t i = 0; i < N_B; i++)
        RANK_CHECK(ctx, b[i] == seldp_f32_to_bf16(value(7, N_A + i) * 0.5f), "b.weight[%zu]", i);
    free(a);
    free(b);
    free(range);
    gpu_buf_free(dev, drange);
    seldp_grads_destroy(g1);
    seldp_grads_destroy(g2);
    seldp_shard_map_destroy(map);
    seldp_session_destroy(s);
    seldp_model_destroy(model);
    void *bufs[6] = {pa, pb, ga, gb, ga2, gb2};
    for (int i = 0; i < 6; i++)
        gpu_buf_free(dev, bufs[i]);
    return 0;
}

static void test_session(void **state)
{
    (void)state;
    gpu_run_ranks_or_fail(kind, world_size, gpus, 120.0, rank_session, NULL);
}

int main(int argc, char **argv)
{
    bool host = gpu_host_mode(argc, argv);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_collectives),
        cmocka_unit_test(test_session),
    };
    int failed = 0;
    if (host) {
        kind = GPU_WORLD_HOST_ON_HOST;
        world_size = 4;
        printf("world of 4 ranks (host-staged, host memory)\n");
        return cmocka_run_group_tests(tests, NULL, NULL) ? 1 : 0;
    }
    gpus = gpu_require();
#ifdef SELDP_HAVE_NCCL
    kind = GPU_WORLD_NCCL;
    world_size = gpus < MAX_RANKS ? gpus : MAX_RANKS;
    printf("world of %d ranks (NCCL, one per GPU)\n", world_size);
    failed += cmocka_run_group_tests(tests, NULL, NULL);
#endif
    kind = GPU_WORLD_HOST_STAGED;
    world_size = 3;
    printf("world of 3 ranks (host-staged, device buffers on %d GPU%s)\n", gpus,
           gpus == 1 ? "" : "s");
    failed += cmocka_run_group_tests(tests, NULL, NULL);
    return failed ? 1 : 0;
}
