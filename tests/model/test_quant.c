/* Quantized bases: the exact bit layouts of docs/model.md on hand-made weights (NF4 nibble order
 * and absmax blocks; AWQ word packing, F16 scales and qzeros words), and round trips of
 * random weights within each format's bound. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "model_util.h"

static double uniform_pm1(uint64_t *state)
{
    return (double)(tm_splitmix64(state) >> 11) * 0x1.0p-53 * 2.0 - 1.0;
}

/* ---- NF4 ----------------------------------------------------------------------------- */

static void test_nf4_codebook_is_standard(void **state)
{
    (void)state;
    assert_true(tm_nf4_codebook[0] == -1.0f);
    assert_true(tm_nf4_codebook[7] == 0.0f);
    assert_true(tm_nf4_codebook[15] == 1.0f);
    assert_true(tm_nf4_codebook[8] == 0.07958029955625534f);
    assert_true(tm_nf4_codebook[1] == -0.6961928009986877f);
    for (int i = 1; i < 16; i++)
        assert_true(tm_nf4_codebook[i] > tm_nf4_codebook[i - 1]);
}

/* Block 0 holds 2 * codebook[i % 16], block 1 holds 0.5 * codebook[15 - i % 16]: each
 * element is exactly a code times its block's absmax. */
static void test_nf4_layout(void **state)
{
    (void)state;
    float w[128], back[128];
    uint8_t q[64];
    float absmax[2];
    for (int i = 0; i < 64; i++) {
        w[i] = 2.0f * tm_nf4_codebook[i % 16];
        w[64 + i] = 0.5f * tm_nf4_codebook[15 - i % 16];
    }
    assert_int_equal(tm_nf4_quantize(w, 128, q, absmax), SELDP_OK);
    assert_true(absmax[0] == 2.0f && absmax[1] == 0.5f);
    /* element 2j in the high nibble, 2j+1 in the low nibble */
    const uint8_t first[8] = {0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef};
    const uint8_t second[8] = {0xfe, 0xdc, 0xba, 0x98, 0x76, 0x54, 0x32, 0x10};
    assert_memory_equal(q, first, 8);
    assert_memory_equal(q + 8, first, 8);
    assert_memory_equal(q + 32, second, 8);
    assert_memory_equal(q + 56, second, 8);
    tm_nf4_dequantize(q, absmax, tm_nf4_codebook, 128, back);
    assert_memory_equal(back, w, sizeof w);
}

static void test_nf4_decode_hand_made(void **state)
{
    (void)state;
    uint8_t q[32];
    memset(q, 0x77, sizeof q); /* code 7 is 0.0 */
    q[0] = 0xf0;
    q[1] = 0x7f;
    float absmax[1] = {3.0f}, w[64];
    tm_nf4_dequantize(q, absmax, tm_nf4_codebook, 64, w);
    assert_true(w[0] == 3.0f && w[1] == -3.0f && w[2] == 0.0f && w[3] == 3.0f);
    for (int i = 4; i < 64; i++)
        assert_true(w[i] == 0.0f);
}

static void test_nf4_zero_block(void **state)
{
    (void)state;
    float w[64] = {0}, back[64];
    uint8_t q[32];
    float absmax[1] = {-1.0f};
    assert_int_equal(tm_nf4_quantize(w, 64, q, absmax), SELDP_OK);
    assert_true(absmax[0] == 0.0f);
    for (int i = 0; i < 32; i++)
        assert_int_equal(q[i], 0x77);
    tm_nf4_dequantize(q, absmax, tm_nf4_codebook, 64, back);
    assert_memory_equal(back, w, sizeof w);
}

/* Random weights: every code is a nearest codebook entry of w / absmax, so the error is
 * at most absmax times half the largest gap of the table. */
static void test_nf4_round_trip(void **state)
{
    (void)state;
    enum { N = 64 * 40 };
    static float w[N], back[N];
    static uint8_t q[N / 2];
    static float absmax[N / 64];
    uint64_t s = 11;
    for (int i = 0; i < N; i++)
        w[i] = (float)(uniform_pm1(&s) * (0.1 + (i / 64) % 7));
    assert_int_equal(tm_nf4_quantize(w, N, q, absmax), SELDP_OK);
    tm_nf4_dequantize(q, absmax, tm_nf4_codebook, N, back);
    float max_gap = 0.0f;
    for (int i = 1; i < 16; i++)
        max_gap = fmaxf(max_gap, tm_nf4_codebook[i] - tm_nf4_codebook[i - 1]);
    for (int i = 0; i < N; i++) {
        const float a = absmax[i / 64];
        const unsigned code = (i % 2 == 0) ? q[i / 2] >> 4 : q[i / 2] & 0xf;
        const float x = w[i] / a;
        for (int j = 0; j < 16; j++)
            assert_true(fabsf(x - tm_nf4_codebook[code]) <= fabsf(x - tm_nf4_codebook[j]));
        assert_true(fabsf(w[i] - back[i]) <= a * (0.5f * max_gap + 1e-6f));
    }
    for (int b = 0; b < N / 64; b++) {
        float m = 0.0f;
        for (int i = 0; i < 64; i++)
            m = fmaxf(m, fabsf(w[b * 64 + i]));
        assert_true(absmax[b] == m);
    }
}

static void test_nf4_rejects_partial_block(void **state)
{
    (void)state;
    float w[96] = {0};
    uint8_t q[48];
    float absmax[2];
    assert_int_equal(tm_nf4_quantize(w, 96, q, absmax), SELDP_ERR_INVALID_ARGUMENT);
}

/* ---- AWQ ----------------------------------------------------------------------------- */

static uint32_t u32(int32_t v)
{
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    return u;
}

/* Two rows of 288 inputs (9 groups, so qzeros takes two words per row). In row o, group g
 * has zero z = (g + 3 + o) % 14 + 1 and scale 0.25 (1 + g % 3), and element i holds code
 * (i + o) % 16, so that every group spans exactly [-z s, (15 - z) s]. */
static void test_awq_layout(void **state)
{
    (void)state;
    enum { OUT = 2, IN = 288, G = 9 };
    static float w[OUT * IN], back[OUT * IN];
    int32_t qweight[OUT * IN / 8], qzeros[OUT * 2];
    uint16_t scales[OUT * G];
    for (int o = 0; o < OUT; o++) {
        for (int i = 0; i < IN; i++) {
            const int g = i / 32, z = (g + 3 + o) % 14 + 1;
            const float s = 0.25f * (float)(1 + g % 3);
            w[o * IN + i] = (float)((i + o) % 16 - z) * s;
        }
    }
    assert_int_equal(tm_awq_quantize(w, OUT, IN, qweight, scales, qzeros), SELDP_OK);
    /* element 8j+k of a row in bits 4k..4k+3 of word j */
    assert_int_equal(u32(qweight[0]), 0x76543210u);
    assert_int_equal(u32(qweight[1]), 0xfedcba98u);
    assert_int_equal(u32(qweight[IN / 8]), 0x87654321u); /* row 1 starts at code 1 */
    assert_int_equal(u32(qweight[IN / 8 + 1]), 0x0fedcba9u);
    for (int o = 0; o < OUT; o++) {
        for (int j = 0; j < IN / 8; j++) {
            uint32_t want = 0;
            for (int k = 0; k < 8; k++)
                want |= (uint32_t)((8 * j + k + o) % 16) << (4 * k);
            assert_int_equal(u32(qweight[o * IN / 8 + j]), want);
        }
    }
    /* scales: F16 bits of 0.25, 0.5, 0.75 */
    const uint16_t sbits[3] = {0x3400, 0x3800, 0x3a00};
    for (int o = 0; o < OUT; o++)
        for (int g = 0; g < G; g++)
            assert_int_equal(scales[o * G + g], sbits[g % 3]);
    /* group g's zero in word g/8 at bits 4(g%8); unused nibbles stay 0 */
    assert_int_equal(u32(qzeros[0]), 0xba987654u);
    assert_int_equal(u32(qzeros[1]), 0x0000000cu);
    assert_int_equal(u32(qzeros[2]), 0xcba98765u);
    assert_int_equal(u32(qzeros[3]), 0x0000000du);
    tm_awq_dequantize(qweight, scales, qzeros, OUT, IN, back);
    assert_memory_equal(back, w, sizeof w);
}

static void test_awq_decode_hand_made(void **state)
{
    (void)state;
    /* One row of 32: codes 15, 0, then 3s; zero 3; scale 2. */
    int32_t qweight[4] = {0x3333330f, 0x33333333, 0x33333333, 0x33333333};
    int32_t qzeros[1] = {3};
    uint16_t scales[1] = {0x4000}; /* 2.0 */
    float w[32];
    tm_awq_dequantize(qweight, scales, qzeros, 1, 32, w);
    assert_true(w[0] == 24.0f && w[1] == -6.0f);
    for (int i = 2; i < 32; i++)
        assert_true(w[i] == 0.0f);
}

/* Random weights: the range of every group holds 0, so no element is off by more than half
 * a step (plus the F16 rounding of the scale). */
static void test_awq_round_trip(void **state)
{
    (void)state;
    enum { OUT = 24, IN = 96, G = IN / 32 };
    static float w[OUT * IN], back[OUT * IN];
    int32_t qweight[OUT * IN / 8], qzeros[OUT];
    uint16_t scales[OUT * G];
    uint64_t s = 5;
    for (int i = 0; i < OUT * IN; i++)
        w[i] = (float)(uniform_pm1(&s) * (0.05 + (i / 32) % 5) + ((i / 32) % 4 == 1 ? 0.3 : 0));
    assert_int_equal(tm_awq_quantize(w, OUT, IN, qweight, scales, qzeros), SELDP_OK);
    tm_awq_dequantize(qweight, scales, qzeros, OUT, IN, back);
    for (int o = 0; o < OUT; o++) {
        for (int i = 0; i < IN; i++) {
            const float step = seldp_f16_to_f32(scales[o * G + i / 32]);
            assert_true(step > 0.0f);
            assert_true(fabsf(w[o * IN + i] - back[o * IN + i]) <= 0.52f * step);
        }
    }
}

static void test_awq_rejects_partial_group(void **state)
{
    (void)state;
    float w[48] = {0};
    int32_t q[6], z[1];
    uint16_t s[2];
    assert_int_equal(tm_awq_quantize(w, 1, 48, q, s, z), SELDP_ERR_INVALID_ARGUMENT);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_nf4_codebook_is_standard),
        cmocka_unit_test(test_nf4_layout),
        cmocka_unit_test(test_nf4_decode_hand_made),
        cmocka_unit_test(test_nf4_zero_block),
        cmocka_unit_test(test_nf4_round_trip),
        cmocka_unit_test(test_nf4_rejects_partial_block),
        cmocka_unit_test(test_awq_layout),
        cmocka_unit_test(test_awq_decode_hand_made),
        cmocka_unit_test(test_awq_round_trip),
        cmocka_unit_test(test_awq_rejects_partial_group),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
