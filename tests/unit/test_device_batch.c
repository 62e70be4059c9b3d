/* Batched conversions (seldp__convert_batch, src/kernels.h) and the bucket copies built on
 * them (src/bucket.h), on the host: every segment gets what seldp__convert (or zeroing)
 * would give it, a bad dtype pair anywhere writes nothing, and buckets cut across more
 * tensors than one batch takes round-trip exactly. The same batches on a GPU are checked
 * against these results by tests/gpu (gpu_cast). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "bucket.h"
#include "kernels.h"
#include "ranks.h"
#include "seldp/seldp.h"

#define N 300

static void test_batch_matches_one_by_one(void **state)
{
    (void)state;
    const seldp_device host = SELDP_HOST_DEVICE;
    float f[N], to_f32[N], want_f32[N], zeros[N], copy[N];
    uint16_t h[N], bf[N], want_bf[N];
    tr_fill_f32(f, N, 3);
    f[0] = NAN;
    f[1] = 1e30f;
    for (int i = 0; i < N; i++) {
        h[i] = seldp_f32_to_f16(f[i] * 0.5f);
        zeros[i] = 7.0f;
    }
    seldp__convert_seg segs[] = {
        {to_f32, h, SELDP_F32, SELDP_F16, N},   /* F16 -> F32 */
        {bf, f, SELDP_BF16, SELDP_F32, N},      /* F32 -> BF16 */
        {zeros, NULL, SELDP_F32, SELDP_F32, N}, /* zeros */
        {copy, f, SELDP_F32, SELDP_F32, N},     /* a copy */
        {NULL, NULL, SELDP_F32, SELDP_F32, 0},  /* empty */
    };
    assert_int_equal(seldp__convert_batch(host, segs, 5), SELDP_OK);
    assert_int_equal(seldp__convert(host, want_f32, SELDP_F32, h, SELDP_F16, N), SELDP_OK);
    assert_int_equal(seldp__convert(host, want_bf, SELDP_BF16, f, SELDP_F32, N), SELDP_OK);
    assert_memory_equal(to_f32, want_f32, sizeof to_f32);
    assert_memory_equal(bf, want_bf, sizeof bf);
    assert_memory_equal(copy, f, sizeof copy);
    for (int i = 0; i < N; i++)
        if (zeros[i] != 0.0f)
            fail_msg("zeroed segment, element %d: %g", i, (double)zeros[i]);
}

static void test_bad_pair_writes_nothing(void **state)
{
    (void)state;
    float a[4] = {1, 2, 3, 4}, b[4] = {9, 9, 9, 9};
    double d[4] = {0};
    seldp__convert_seg segs[] = {
        {b, a, SELDP_F32, SELDP_F32, 4},
        {d, a, SELDP_F64, SELDP_F32, 4}, /* F32 -> F64 is not a conversion seldp makes */
    };
    assert_int_equal(seldp__convert_batch(SELDP_HOST_DEVICE, segs, 2), SELDP_ERR_DTYPE);
    assert_non_null(strstr(seldp_last_error(), "segment 1 of 2"));
    for (int i = 0; i < 4; i++)
        assert_true(b[i] == 9.0f); /* the valid segment before it was not written either */
    assert_int_equal(seldp__convert_batch(SELDP_HOST_DEVICE, NULL, 0), SELDP_OK);
}

static void test_batch_on_gpu_without_cuda(void **state)
{
    (void)state;
    if (seldp_has_feature("cuda"))
        skip();
    float a[1] = {0};
    seldp__convert_seg seg = {a, NULL, SELDP_F32, SELDP_F32, 1};
    assert_int_equal(seldp__convert_batch((seldp_device){SELDP_DEVICE_CUDA, 0}, &seg, 1),
                     SELDP_ERR_UNSUPPORTED);
}

/* 1,500 tensors of 1 to 7 F32 elements (odd sizes, so pieces straddle buckets and the copies
 * fall back to narrower words), cut into buckets holding several hundred tensors each and
 * one bucket spanning them all: pack then unpack into zeroed tensors restores every byte. */
static void test_buckets_across_batches(void **state)
{
    (void)state;
    enum { T = 1500 };
    float *tensors[T], *restored[T];
    size_t sizes[T];
    for (int t = 0; t < T; t++) {
        sizes[t] = (size_t)(1 + t % 7);
        tensors[t] = malloc(sizes[t] * sizeof(float));
        restored[t] = calloc(sizes[t], sizeof(float));
        assert_non_null(tensors[t]);
        assert_non_null(restored[t]);
        tr_fill_f32(tensors[t], sizes[t], (uint64_t)t + 1);
    }
    const size_t capacities[] = {4 * 1000 + 2, 4 * 100000};
    for (int c = 0; c < 2; c++) {
        seldp__bucket_stream src, dst;
        assert_int_equal(seldp__bucket_stream_init(&src, SELDP_HOST_DEVICE, capacities[c], T),
                         SELDP_OK);
        assert_int_equal(seldp__bucket_stream_init(&dst, SELDP_HOST_DEVICE, capacities[c], T),
                         SELDP_OK);
        for (int t = 0; t < T; t++) {
            seldp__bucket_stream_add(&src, tensors[t], sizes[t] * sizeof(float));
            seldp__bucket_stream_add(&dst, restored[t], sizes[t] * sizeof(float));
        }
        char *bucket = malloc(capacities[c]);
        assert_non_null(bucket);
        size_t total = seldp__bucket_stream_bytes(&src);
        size_t buckets = seldp__bucket_count(total, capacities[c]);
        for (size_t b = 0; b < buckets; b++) {
            size_t bytes = 0;
            assert_int_equal(seldp__bucket_pack(&src, b, bucket, &bytes), SELDP_OK);
            assert_int_equal(seldp__bucket_unpack(&dst, b, bucket), SELDP_OK);
        }
        for (int t = 0; t < T; t++) {
            if (memcmp(tensors[t], restored[t], sizes[t] * sizeof(float)) != 0)
                fail_msg("capacity %zu: tensor %d differs after pack and unpack", capacities[c], t);
            memset(restored[t], 0, sizes[t] * sizeof(float));
        }
        free(bucket);
        seldp__bucket_stream_free(&src);
        seldp__bucket_stream_free(&dst);
    }
    for (int t = 0; t < T; t++) {
        free(tensors[t]);
        free(restored[t]);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_batch_matches_one_by_one),
        cmocka_unit_test(test_bad_pair_writes_nothing),
        cmocka_unit_test(test_batch_on_gpu_without_cuda),
        cmocka_unit_test(test_buckets_across_batches),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
