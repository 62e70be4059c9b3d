/* The NCCL transport's fused reduction (src/comm/nccl/nccl_reduce.c) on GPUs: one rank per GPU
 * (at most two), each passing device segments (F32, BF16 and F16 results, in place and not,
 * rank 0 without a contribution, so that a world of one GPU takes that path too) and host
 * segments in one call, reduced in buckets smaller than, across and larger than the tensors,
 * scaled by 1/W for W not a power of two. Every
 * result must have exactly the bits of the two-pass reference (sum in F32, then
 * seldp__scale_f32 and seldp__convert), which the inputs (multiples of 1/8) make independent
 * of NCCL's summation order; the call says it wrote its outputs; and a second call of the
 * same size reuses the communicator's buffers. Exits 77 without a GPU. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <cuda_runtime_api.h>

#include "comm/comm_impl.h"
#include "gpu_ranks.h"
#include "kernels.h"
#include "seldp/seldp.h"

enum { SEGS = 5 };

static const size_t counts[SEGS] = {1000, 4099, 77, 2048, 513};
/* device: F32 -> F32 in place, BF16 -> BF16 in place, F32 -> F16 elsewhere, none -> BF16;
 * host: F16 -> F16 in place */
static const seldp_dtype in_dtypes[SEGS] = {SELDP_F32, SELDP_BF16, SELDP_F32, SELDP_F32, SELDP_F16};
static const seldp_dtype out_dtypes[SEGS] = {SELDP_F32, SELDP_BF16, SELDP_F16, SELDP_BF16,
                                             SELDP_F16};
static const double scale = 1.0 / 2037.0;

/* Whether rank r passes no contribution (NULL) for segment s: even ranks for segment 3, so
 * that rank 0 of a world of one takes the zeros path. */
static bool no_contribution(int r, int s)
{
    return s == 3 && r % 2 == 0;
}

/* Rank r's contribution to segment s, as F32 (exact in every input dtype); zeros for a
 * segment without one. */
static void contribution(int r, int s, float *x)
{
    tr_fill_f32_exact(x, counts[s], (uint64_t)(100 * s + r + 1));
    if (no_contribution(r, s))
        memset(x, 0, counts[s] * sizeof *x);
}

/* Expected bits of segment s's result on P ranks, into out (out_dtypes[s]). */
static void expected(int P, int s, void *out)
{
    size_t n = counts[s];
    float *sum = calloc(n, sizeof *sum), *x = malloc(n * sizeof *x);
    for (int r = 0; r < P; r++) {
        contribution(r, s, x);
        for (size_t i = 0; i < n; i++)
            sum[i] += x[i];
    }
    seldp__scale_f32(SELDP_HOST_DEVICE, sum, n, scale);
    seldp__convert(SELDP_HOST_DEVICE, out, out_dtypes[s], sum, SELDP_F32, n);
    free(sum);
    free(x);
}

static int reduce_rank(tr_rank_ctx *ctx)
{
    seldp_device dev = {SELDP_DEVICE_CUDA, ctx->rank};
    void *in[SEGS] = {0}, *out[SEGS] = {0}, *host = NULL;
    seldp__reduce_seg segs[SEGS];
    for (int s = 0; s < SEGS; s++) {
        size_t n = counts[s], esize = seldp_dtype_size(in_dtypes[s]);
        float *x = malloc(n * sizeof *x);
        void *typed = malloc(n * esize);
        RANK_CHECK(ctx, x && typed, "out of memory");
        contribution(ctx->rank, s, x);
        seldp__convert(SELDP_HOST_DEVICE, typed, in_dtypes[s], x, SELDP_F32, n);
        if (s == 4) { /* on the host, in place */
            host = typed;
            in[s] = out[s] = host;
        } else {
            in[s] = gpu_buf_alloc(dev, n * esize);
            RANK_CHECK(ctx, in[s], "device allocation");
            RANK_CHECK_OK(ctx, gpu_upload(dev, in[s], typed, n * esize));
            free(typed);
            out[s] = in_dtypes[s] == out_dtypes[s]
                         ? in[s]
                         : gpu_buf_alloc(dev, n * seldp_dtype_size(out_dtypes[s]));
        }
        free(x);
        segs[s] = (seldp__reduce_seg){no_contribution(ctx->rank, s) ? NULL : in[s], in_dtypes[s],
                                      out[s], out_dtypes[s], n};
    }
    static const size_t buckets[] = {0, 333, 1 << 20};
    for (size_t b = 0; b < sizeof buckets / sizeof buckets[0]; b++) {
        bool written = false;
        seldp__reduce_fused_args args = {segs, SEGS, buckets[b], scale, &written, NULL};
        if (b > 0) /* the inputs again: the first call reduced them in place */
            for (int s = 0; s < SEGS; s++) {
                size_t n = counts[s], esize = seldp_dtype_size(in_dtypes[s]);
                float *x = malloc(n * sizeof *x);
                void *typed = s == 4 ? host : malloc(n * esize);
                contribution(ctx->rank, s, x);
                seldp__convert(SELDP_HOST_DEVICE, typed, in_dtypes[s], x, SELDP_F32, n);
                if (s != 4) {
                    RANK_CHECK_OK(ctx, gpu_upload(dev, in[s], typed, n * esize));
                    free(typed);
                }
                free(x);
            }
        RANK_CHECK_OK(ctx, seldp__comm_reduce_fused(ctx->world, &args));
        RANK_CHECK(ctx, written, "the reduction did not say it wrote its outputs");
        for (int s = 0; s < SEGS; s++) {
            size_t bytes = counts[s] * seldp_dtype_size(out_dtypes[s]);
            char *want = malloc(bytes), *got = malloc(bytes);
            expected(ctx->size, s, want);
            if (s == 4)
                memcpy(got, out[s], bytes);
            else
                RANK_CHECK_OK(ctx, gpu_download(dev, got, out[s], bytes));
            size_t at = tr_first_diff(want, got, bytes);
            RANK_CHECK(ctx, at == bytes,
                       "bucket %zu: segment %d (%s -> %s) differs from the reference at byte "
                       "%zu of %zu",
                       buckets[b], s, seldp_dtype_name(in_dtypes[s]),
                       seldp_dtype_name(out_dtypes[s]), at, bytes);
            free(want);
            free(got);
        }
    }
    for (int s = 0; s < 4; s++) {
        if (out[s] != in[s])
            gpu_buf_free(dev, out[s]);
        gpu_buf_free(dev, in[s]);
    }
    free(host);
    return 0;
}

static void test_fused_reduction_matches_two_passes(void **state)
{
    int ranks = *(int *)*state;
    gpu_run_ranks_or_fail(GPU_WORLD_NCCL, ranks, ranks, 120.0, reduce_rank, NULL);
}

int main(void)
{
    int gpus = gpu_require();
    int ranks = gpus >= 2 ? 2 : 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_prestate(test_fused_reduction_matches_two_passes, &ranks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
