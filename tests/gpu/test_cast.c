/* The CUDA element-wise kernels against the host: F16/BF16 -> F32 over all 65,536
 * patterns, F32 -> F16/BF16 over every rounding boundary and a sweep of F32 patterns (bit
 * for bit, NaN payloads included), conversions in place, scaling, and the search for the
 * first non-finite element. Also through the library's dispatch (src/kernels.h), and the
 * fused scale and cast that ends a reduction on the NCCL transport (seldp__cuda_convert_async
 * with a scale) against the two host passes it replaces. Exits 77 without a GPU. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <cuda_runtime_api.h>

#include "cuda/cuda_kernels.h"
#include "gpu_ranks.h"
#include "kernels.h"
#include "seldp/seldp.h"

static const seldp_device dev0 = {SELDP_DEVICE_CUDA, 0};

static uint32_t bits_of(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float float_of(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Device copy of `bytes` host bytes; the caller frees it with gpu_buf_free. */
static void *upload(const void *host, size_t bytes)
{
    void *d = gpu_buf_alloc(dev0, bytes);
    assert_non_null(d);
    assert_int_equal(gpu_upload(dev0, d, host, bytes), SELDP_OK);
    return d;
}

static void download(void *host, const void *d, size_t bytes)
{
    assert_int_equal(gpu_download(dev0, host, d, bytes), SELDP_OK);
}

static void test_half_to_f32_all_patterns(void **state)
{
    (void)state;
    const size_t n = 65536;
    uint16_t *h = malloc(n * sizeof *h);
    float *got = malloc(n * sizeof *got);
    assert_non_null(h);
    assert_non_null(got);
    for (size_t i = 0; i < n; i++)
        h[i] = (uint16_t)i;
    void *dh = upload(h, n * sizeof *h);
    float *df = gpu_buf_alloc(dev0, n * sizeof(float));
    assert_non_null(df);
    for (int k = 0; k < 2; k++) {
        seldp_dtype half = k ? SELDP_BF16 : SELDP_F16;
        assert_int_equal(seldp__cuda_convert(0, df, SELDP_F32, dh, half, n), SELDP_OK);
        download(got, df, n * sizeof(float));
        for (size_t i = 0; i < n; i++) {
            float want = half == SELDP_BF16 ? seldp_bf16_to_f32(h[i]) : seldp_f16_to_f32(h[i]);
            if (bits_of(got[i]) != bits_of(want))
                fail_msg("%s 0x%04x -> 0x%08x on the GPU, host gives 0x%08x",
                         seldp_dtype_name(half), h[i], bits_of(got[i]), bits_of(want));
        }
    }
    gpu_buf_free(dev0, dh);
    gpu_buf_free(dev0, df);
    free(h);
    free(got);
}

/* F32 inputs that exercise rounding: every half value, the midpoints between consecutive
 * halves and their neighbours, special values, then a coprime-stride sweep. */
static size_t f32_probes(uint32_t **out)
{
    const size_t sweep = 1u << 22;
    size_t cap = 65536 * 12 + sweep + 16, n = 0;
    uint32_t *x = malloc(cap * sizeof *x);
    assert_non_null(x);
    for (uint32_t h = 0; h < 65536; h++) {
        uint32_t a16 = bits_of(seldp_f16_to_f32((uint16_t)h));
        uint32_t b16 = bits_of(seldp_f16_to_f32((uint16_t)(h + 1)));
        uint32_t mid16 = (uint32_t)(((uint64_t)a16 + b16) / 2);
        uint32_t a_bf = (uint32_t)h << 16, mid_bf = a_bf + 0x8000u;
        uint32_t p[] = {a16,  a16 - 1,  a16 + 1,  mid16,  mid16 - 1,  mid16 + 1,
                        a_bf, a_bf - 1, a_bf + 1, mid_bf, mid_bf - 1, mid_bf + 1};
        for (size_t i = 0; i < 12; i++)
            x[n++] = p[i];
    }
    uint32_t v = 0x12345678u;
    for (size_t i = 0; i < sweep; i++, v += 0x9e3779b1u)
        x[n++] = v;
    const uint32_t specials[] = {0x7f800000u, 0xff800000u, 0x7f800001u, 0xffc00001u,
                                 0x477ff000u, 0x477fefffu, 0x33000000u, 0x33000001u};
    for (size_t i = 0; i < sizeof specials / sizeof specials[0]; i++)
        x[n++] = specials[i];
    *out = x;
    return n;
}

static void test_f32_to_half_rounding(void **state)
{
    (void)state;
    uint32_t *x = NULL;
    size_t n = f32_probes(&x);
    uint16_t *got = malloc(n * sizeof *got);
    assert_non_null(got);
    void *dx = upload(x, n * sizeof *x);
    uint16_t *dh = gpu_buf_alloc(dev0, n * sizeof *dh);
    assert_non_null(dh);
    for (int k = 0; k < 2; k++) {
        seldp_dtype half = k ? SELDP_BF16 : SELDP_F16;
        assert_int_equal(seldp__cuda_convert(0, dh, half, dx, SELDP_F32, n), SELDP_OK);
        download(got, dh, n * sizeof *got);
        for (size_t i = 0; i < n; i++) {
            float f = float_of(x[i]);
            uint16_t want = half == SELDP_BF16 ? seldp_f32_to_bf16(f) : seldp_f32_to_f16(f);
            if (got[i] != want)
                fail_msg("f32 0x%08x -> %s 0x%04x on the GPU, host gives 0x%04x", x[i],
                         seldp_dtype_name(half), got[i], want);
        }
    }
    gpu_buf_free(dev0, dx);
    gpu_buf_free(dev0, dh);
    free(x);
    free(got);
}

/* Converting into the source buffer (the halves overwrite the F32 they came from) and a
 * shifted same-dtype copy: the results must match the out-of-place host conversion. */
static void test_overlapping_buffers(void **state)
{
    (void)state;
    const size_t n = 100003;
    float *x = malloc(n * sizeof *x);
    uint16_t *got = malloc(n * sizeof *got);
    float *back = malloc(n * sizeof *back);
    assert_non_null(x);
    assert_non_null(got);
    assert_non_null(back);
    tr_fill_f32(x, n, 42);
    void *d = upload(x, n * sizeof *x);
    assert_int_equal(seldp__cuda_convert(0, d, SELDP_F16, d, SELDP_F32, n), SELDP_OK);
    download(got, d, n * sizeof *got);
    for (size_t i = 0; i < n; i++)
        if (got[i] != seldp_f32_to_f16(x[i]))
            fail_msg("in place f32 -> f16: element %zu is 0x%04x, expected 0x%04x", i, got[i],
                     seldp_f32_to_f16(x[i]));
    /* and back in place: the halves grow into the F32 they now occupy */
    assert_int_equal(seldp__cuda_convert(0, d, SELDP_F32, d, SELDP_F16, n), SELDP_OK);
    download(back, d, n * sizeof *back);
    for (size_t i = 0; i < n; i++)
        if (bits_of(back[i]) != bits_of(seldp_f16_to_f32(got[i])))
            fail_msg("in place f16 -> f32: element %zu differs", i);
    /* a copy shifted by one element within the same buffer (memmove semantics) */
    assert_int_equal(seldp__cuda_convert(0, (float *)d + 1, SELDP_F32, d, SELDP_F32, n - 1),
                     SELDP_OK);
    download(x, d, n * sizeof *x);
    for (size_t i = 1; i < n; i++)
        if (bits_of(x[i]) != bits_of(back[i - 1]))
            fail_msg("shifted copy: element %zu differs", i);
    gpu_buf_free(dev0, d);
    free(x);
    free(got);
    free(back);
}

static void test_unsupported_pair(void **state)
{
    (void)state;
    void *d = gpu_buf_alloc(dev0, 64);
    assert_non_null(d);
    assert_int_equal(seldp__cuda_convert(0, d, SELDP_F16, d, SELDP_BF16, 8), SELDP_ERR_DTYPE);
    assert_int_equal(seldp__cuda_convert(0, d, SELDP_I32, d, SELDP_F32, 8), SELDP_ERR_DTYPE);
    assert_int_equal(seldp__cuda_find_nonfinite(0, d, SELDP_I32, 8, &(size_t){0}), SELDP_ERR_DTYPE);
    gpu_buf_free(dev0, d);
}

/* The kernel against the host's seldp__scale_f32, bit for bit: numbers, Inf, the smallest
 * subnormal and NaNs with payloads, quiet and signalling, of both signs (both sides keep a
 * NaN's sign and payload and set its quiet bit; a GPU's arithmetic alone would return the
 * canonical 0x7fffffff). */
static void test_scale_matches_host(void **state)
{
    (void)state;
    const size_t n = 300001;
    float *x = malloc(n * sizeof *x), *got = malloc(n * sizeof *got),
          *want = malloc(n * sizeof *want);
    assert_non_null(x);
    assert_non_null(got);
    assert_non_null(want);
    tr_fill_f32(x, n, 7);
    const uint32_t specials[] = {0x7f800000u, 0x00000001u, 0x7fc12345u, 0x7f800001u,
                                 0xffa00005u, 0xffffffffu, 0x7fbfffffu};
    for (size_t i = 0; i < sizeof specials / sizeof specials[0]; i++)
        x[i] = float_of(specials[i]);
    const double factors[] = {1.0 / 3.0, 1.0 / 7.0, 1e-30, 3.0e30};
    for (size_t k = 0; k < sizeof factors / sizeof factors[0]; k++) {
        float *d = upload(x, n * sizeof *x);
        assert_int_equal(seldp__cuda_scale_f32(0, d, n, factors[k]), SELDP_OK);
        download(got, d, n * sizeof *got);
        memcpy(want, x, n * sizeof *want);
        assert_int_equal(seldp__scale_f32(SELDP_HOST_DEVICE, want, n, factors[k]), SELDP_OK);
        for (size_t i = 0; i < n; i++) {
            if (bits_of(got[i]) != bits_of(want[i]))
                fail_msg("scale by %g: element %zu (0x%08x) is 0x%08x, host gives 0x%08x",
                         factors[k], i, bits_of(x[i]), bits_of(got[i]), bits_of(want[i]));
        }
        gpu_buf_free(dev0, d);
    }
    free(x);
    free(got);
    free(want);
}

/* A non-finite value planted at `at` (and a later one) in n elements of `dtype`. */
static void check_nonfinite(seldp_dtype dtype, size_t n, size_t at, bool inf)
{
    size_t esize = seldp_dtype_size(dtype);
    unsigned char *buf = calloc(n, esize);
    assert_non_null(buf);
    for (size_t i = 0; i < n; i++) {
        double v = (double)(i % 97) - 48.0;
        switch (dtype) {
        case SELDP_F32:
            ((float *)buf)[i] = (float)v;
            break;
        case SELDP_F64:
            ((double *)buf)[i] = v;
            break;
        case SELDP_F16:
            ((uint16_t *)buf)[i] = seldp_f32_to_f16((float)v);
            break;
        default:
            ((uint16_t *)buf)[i] = seldp_f32_to_bf16((float)v);
            break;
        }
    }
    size_t plant[2] = {at, at + (n - at) / 2};
    for (int k = 0; k < 2; k++) {
        size_t i = plant[k];
        if (i >= n)
            continue;
        float f = inf ? -INFINITY : NAN;
        switch (dtype) {
        case SELDP_F32:
            ((float *)buf)[i] = f;
            break;
        case SELDP_F64:
            ((double *)buf)[i] = (double)f;
            break;
        case SELDP_F16:
            ((uint16_t *)buf)[i] = seldp_f32_to_f16(f);
            break;
        default:
            ((uint16_t *)buf)[i] = seldp_f32_to_bf16(f);
            break;
        }
    }
    void *d = upload(buf, n * esize);
    size_t first = 12345;
    assert_int_equal(seldp__cuda_find_nonfinite(0, d, dtype, n, &first), SELDP_OK);
    if (first != (at < n ? at : n))
        fail_msg("%s, n = %zu: first non-finite at %zu, expected %zu", seldp_dtype_name(dtype), n,
                 first, at < n ? at : n);
    /* the same through the library's dispatch */
    first = 12345;
    assert_int_equal(seldp__find_nonfinite(dev0, d, dtype, n, &first), SELDP_OK);
    assert_int_equal(first, at < n ? at : n);
    gpu_buf_free(dev0, d);
    free(buf);
}

static void test_find_nonfinite(void **state)
{
    (void)state;
    const seldp_dtype dtypes[] = {SELDP_F32, SELDP_F64, SELDP_F16, SELDP_BF16};
    for (size_t k = 0; k < 4; k++) {
        check_nonfinite(dtypes[k], 1000, 777, false);
        check_nonfinite(dtypes[k], 1000, 0, true);
        check_nonfinite(dtypes[k], 1000, 1000, false); /* all finite: n */
        check_nonfinite(dtypes[k], (size_t)1 << 22, ((size_t)1 << 22) - 3, true);
        check_nonfinite(dtypes[k], 1, 0, false);
    }
    size_t first = 99;
    assert_int_equal(seldp__cuda_find_nonfinite(0, NULL, SELDP_F32, 0, &first), SELDP_OK);
    assert_int_equal(first, 0);
}

/* seldp__convert and seldp__scale_f32 on a CUDA device reach these kernels. */
static void test_dispatch(void **state)
{
    (void)state;
    const size_t n = 4099;
    float *x = malloc(n * sizeof *x), *got = malloc(n * sizeof *got);
    uint16_t *h = malloc(n * sizeof *h);
    assert_non_null(x);
    assert_non_null(got);
    assert_non_null(h);
    tr_fill_f32(x, n, 3);
    float *dx = upload(x, n * sizeof *x);
    uint16_t *dh = gpu_buf_alloc(dev0, n * sizeof *dh);
    assert_non_null(dh);
    assert_int_equal(seldp__convert(dev0, dh, SELDP_BF16, dx, SELDP_F32, n), SELDP_OK);
    download(h, dh, n * sizeof *h);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(h[i], seldp_f32_to_bf16(x[i]));
    assert_int_equal(seldp__scale_f32(dev0, dx, n, 0.25), SELDP_OK);
    download(got, dx, n * sizeof *got);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(bits_of(got[i]), bits_of(x[i] * 0.25f));
    gpu_buf_free(dev0, dx);
    gpu_buf_free(dev0, dh);
    free(x);
    free(got);
    free(h);
}

/* seldp__convert_batch on the device: 2,000 small segments of every kind (F16/BF16 -> F32,
 * F32 -> F16/BF16, copies of 1/2/4/8-byte words, zeros) in one call give exactly what the
 * host batch gives. */
static void test_convert_batch(void **state)
{
    (void)state;
    enum { SEGS = 2000, MAXN = 9 };
    const size_t slot = MAXN * 8; /* bytes per segment in each arena */
    const size_t arena = SEGS * slot;
    unsigned char *src = malloc(arena), *host_dst = malloc(arena), *dev_out = malloc(arena);
    seldp__convert_seg *host_segs = malloc(SEGS * sizeof *host_segs);
    seldp__convert_seg *dev_segs = malloc(SEGS * sizeof *dev_segs);
    assert_non_null(src);
    assert_non_null(host_dst);
    assert_non_null(dev_out);
    assert_non_null(host_segs);
    assert_non_null(dev_segs);
    tr_fill_f32((float *)src, arena / 4, 11);
    memset(host_dst, 0xab, arena);
    unsigned char *dsrc = upload(src, arena), *ddst = upload(host_dst, arena);
    static const seldp_dtype pairs[][2] = {
        {SELDP_F32, SELDP_F16},  {SELDP_F32, SELDP_BF16}, {SELDP_F16, SELDP_F32},
        {SELDP_BF16, SELDP_F32}, {SELDP_U8, SELDP_U8},    {SELDP_U16, SELDP_U16},
        {SELDP_F32, SELDP_F32},  {SELDP_F64, SELDP_F64},  {SELDP_F32, SELDP_F32}, /* zeros */
    };
    for (size_t i = 0; i < SEGS; i++) {
        size_t k = i % 9;
        size_t n = 1 + (i * 7) % MAXN;
        bool zero = k == 8;
        host_segs[i] = (seldp__convert_seg){host_dst + i * slot, zero ? NULL : src + i * slot,
                                            pairs[k][0], pairs[k][1], n};
        dev_segs[i] = (seldp__convert_seg){ddst + i * slot, zero ? NULL : dsrc + i * slot,
                                           pairs[k][0], pairs[k][1], n};
    }
    assert_int_equal(seldp__convert_batch(SELDP_HOST_DEVICE, host_segs, SEGS), SELDP_OK);
    assert_int_equal(seldp__convert_batch(dev0, dev_segs, SEGS), SELDP_OK);
    download(dev_out, ddst, arena);
    for (size_t i = 0; i < arena; i++)
        if (dev_out[i] != host_dst[i])
            fail_msg("byte %zu (segment %zu): 0x%02x on the device, 0x%02x on the host", i,
                     i / slot, dev_out[i], host_dst[i]);
    gpu_buf_free(dev0, dsrc);
    gpu_buf_free(dev0, ddst);
    free(src);
    free(host_dst);
    free(dev_out);
    free(host_segs);
    free(dev_segs);
}

/* The fused scale and cast: one launch over F32 segments into F32, BF16 and F16 (and a
 * half source at scale 1), bit for bit against seldp__scale_f32 (not at scale 1) followed
 * by seldp__convert on the host; the descriptions go through the caller's pinned and device
 * buffers, reused from one launch to the next. */
static void test_fused_scale_convert(void **state)
{
    (void)state;
    const size_t n = 100003;
    uint32_t *x = malloc(n * sizeof *x);
    float *ref = malloc(n * sizeof *ref);
    char *want = malloc(n * 4), *got = malloc(n * 4);
    assert_non_null(x);
    assert_non_null(ref);
    assert_non_null(want);
    assert_non_null(got);
    for (size_t i = 0; i < n; i++)
        x[i] = (uint32_t)tr_hash(5, i);
    const uint32_t specials[] = {0x7fc12345u, 0x7f800001u, 0xff800000u, 0x00000001u,
                                 0x80000000u, 0x477ff000u, 0x33000000u, 0x3f808000u};
    memcpy(x, specials, sizeof specials);
    float *dx = upload(x, n * sizeof *x);
    void *dout = gpu_buf_alloc(dev0, n * 4);
    uint16_t *dhalf = gpu_buf_alloc(dev0, n * 2);
    assert_non_null(dout);
    assert_non_null(dhalf);
    cudaStream_t stream;
    void *host_desc = NULL, *dev_desc = NULL;
    size_t desc = seldp__cuda_batch_desc_bytes(2);
    assert_int_equal(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
    assert_int_equal(cudaMallocHost(&host_desc, desc), cudaSuccess);
    assert_int_equal(cudaMalloc(&dev_desc, desc), cudaSuccess);

    const double scales[] = {1.0 / 2037.0, 1.0, 0x1p-140, 1e30};
    const seldp_dtype outs[] = {SELDP_F32, SELDP_BF16, SELDP_F16};
    for (size_t k = 0; k < sizeof scales / sizeof scales[0]; k++) {
        for (size_t o = 0; o < 3; o++) {
            size_t esize = seldp_dtype_size(outs[o]), half = n / 2;
            /* two segments: the first half of x into the first half of out, and the rest */
            seldp__convert_seg segs[2] = {
                {dout, dx, outs[o], SELDP_F32, half},
                {(char *)dout + half * esize, dx + half, outs[o], SELDP_F32, n - half},
            };
            assert_int_equal(
                seldp__cuda_convert_async(stream, segs, 2, scales[k], host_desc, dev_desc),
                SELDP_OK);
            assert_int_equal(cudaStreamSynchronize(stream), cudaSuccess);
            download(got, dout, n * esize);
            memcpy(ref, x, n * sizeof *ref);
            if (scales[k] != 1.0)
                assert_int_equal(seldp__scale_f32(SELDP_HOST_DEVICE, ref, n, scales[k]), SELDP_OK);
            assert_int_equal(seldp__convert(SELDP_HOST_DEVICE, want, outs[o], ref, SELDP_F32, n),
                             SELDP_OK);
            size_t at = tr_first_diff(want, got, n * esize);
            if (at != n * esize)
                fail_msg("scale %a into %s: element %zu (input 0x%08x) differs from the two "
                         "host passes",
                         scales[k], seldp_dtype_name(outs[o]), at / esize, x[at / esize]);
        }
    }
    /* a half source (the pack before a reduction): scale 1, an exact widening */
    seldp__convert_seg to_half = {dhalf, dx, SELDP_BF16, SELDP_F32, n};
    assert_int_equal(seldp__cuda_convert_async(stream, &to_half, 1, 1.0, host_desc, dev_desc),
                     SELDP_OK);
    /* the descriptions are the caller's to reuse once the stream has passed the launch */
    assert_int_equal(cudaStreamSynchronize(stream), cudaSuccess);
    seldp__convert_seg widen = {dout, dhalf, SELDP_F32, SELDP_BF16, n};
    assert_int_equal(seldp__cuda_convert_async(stream, &widen, 1, 1.0, host_desc, dev_desc),
                     SELDP_OK);
    assert_int_equal(cudaStreamSynchronize(stream), cudaSuccess);
    download(got, dout, n * 4);
    for (size_t i = 0; i < n; i++) {
        uint32_t w = bits_of(seldp_bf16_to_f32(seldp_f32_to_bf16(float_of(x[i]))));
        uint32_t g;
        memcpy(&g, got + 4 * i, 4);
        if (g != w)
            fail_msg("BF16 round trip of element %zu (0x%08x): 0x%08x, expected 0x%08x", i, x[i], g,
                     w);
    }
    cudaFreeHost(host_desc);
    cudaFree(dev_desc);
    cudaStreamDestroy(stream);
    gpu_buf_free(dev0, dx);
    gpu_buf_free(dev0, dout);
    gpu_buf_free(dev0, dhalf);
    free(x);
    free(ref);
    free(want);
    free(got);
}

int main(void)
{
    gpu_require();
    assert_int_equal(cudaSetDevice(0), cudaSuccess);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_half_to_f32_all_patterns),
        cmocka_unit_test(test_f32_to_half_rounding),
        cmocka_unit_test(test_overlapping_buffers),
        cmocka_unit_test(test_unsupported_pair),
        cmocka_unit_test(test_scale_matches_host),
        cmocka_unit_test(test_find_nonfinite),
        cmocka_unit_test(test_dispatch),
        cmocka_unit_test(test_convert_batch),
        cmocka_unit_test(test_fused_scale_convert),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
