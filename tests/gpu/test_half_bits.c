/* The bit-level conversion code the CUDA kernels run (src/cuda/half/seldp_half_bits.cuh), compiled
 * for the host and compared with the library's host conversion: every F16 and BF16 pattern, every
 * rounding boundary between consecutive halves, and a sweep of F32 patterns. Needs no GPU, so a
 * GPU-less CI still proves that both sides share one set of rules. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "seldp_half_bits.cuh"
#include "seldp/dtype.h"

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

static void test_half_to_f32_every_pattern(void **state)
{
    (void)state;
    for (uint32_t h = 0; h < 65536; h++) {
        uint32_t want16 = bits_of(seldp_f16_to_f32((uint16_t)h));
        uint32_t want_bf = bits_of(seldp_bf16_to_f32((uint16_t)h));
        if (seldp__f16_to_f32_bits((uint16_t)h) != want16)
            fail_msg("f16 0x%04x -> 0x%08x, host gives 0x%08x", h,
                     seldp__f16_to_f32_bits((uint16_t)h), want16);
        if (seldp__bf16_to_f32_bits((uint16_t)h) != want_bf)
            fail_msg("bf16 0x%04x -> 0x%08x, host gives 0x%08x", h,
                     seldp__bf16_to_f32_bits((uint16_t)h), want_bf);
    }
}

/* One F32 pattern through both F32 -> half conversions. */
static void check_f32(uint32_t x)
{
    uint16_t want16 = seldp_f32_to_f16(float_of(x));
    uint16_t want_bf = seldp_f32_to_bf16(float_of(x));
    if (seldp__f32_bits_to_f16(x) != want16)
        fail_msg("f32 0x%08x -> f16 0x%04x, host gives 0x%04x", x, seldp__f32_bits_to_f16(x),
                 want16);
    if (seldp__f32_bits_to_bf16(x) != want_bf)
        fail_msg("f32 0x%08x -> bf16 0x%04x, host gives 0x%04x", x, seldp__f32_bits_to_bf16(x),
                 want_bf);
}

/* Around every value of each half format: the value itself, the midpoint to the next one
 * (where round-to-nearest-even decides) and the F32 neighbours of both. */
static void test_rounding_boundaries(void **state)
{
    (void)state;
    for (uint32_t h = 0; h < 65536; h++) {
        uint32_t a16 = seldp__f16_to_f32_bits((uint16_t)h);
        uint32_t a_bf = seldp__bf16_to_f32_bits((uint16_t)h);
        uint32_t mid16 =
            (uint32_t)(((uint64_t)a16 + seldp__f16_to_f32_bits((uint16_t)(h + 1))) / 2);
        uint32_t mid_bf = a_bf + 0x8000u; /* bf16 keeps the top 16 bits */
        uint32_t probes[] = {a16,  a16 - 1,  a16 + 1,  mid16,  mid16 - 1,  mid16 + 1,
                             a_bf, a_bf - 1, a_bf + 1, mid_bf, mid_bf - 1, mid_bf + 1};
        for (size_t i = 0; i < sizeof probes / sizeof probes[0]; i++)
            check_f32(probes[i]);
    }
}

/* A stride coprime with 2^32 visits 2^24 patterns spread over every exponent, sign and NaN
 * payload. */
static void test_f32_sweep(void **state)
{
    (void)state;
    uint32_t x = 0;
    for (uint32_t i = 0; i < (1u << 24); i++, x += 0x9e3779b1u)
        check_f32(x);
    check_f32(0x7f800000u); /* +Inf */
    check_f32(0xff800000u); /* -Inf */
    check_f32(0x7f800001u); /* signalling NaN with the smallest payload */
    check_f32(0x7fc00000u); /* quiet NaN */
    check_f32(0x477ff000u); /* 65520: rounds to F16 Inf */
    check_f32(0x477fefffu); /* just below: rounds to 65504 */
    check_f32(0x33000000u); /* 2^-25: half the smallest F16 subnormal, ties to 0 */
    check_f32(0x33000001u); /* just above: rounds up to the smallest subnormal */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_half_to_f32_every_pattern),
        cmocka_unit_test(test_rounding_boundaries),
        cmocka_unit_test(test_f32_sweep),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
