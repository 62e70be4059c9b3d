/* dtype: sizes, names, classes, and F16/BF16 <-> F32 conversion over every bit pattern. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

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

static bool f16_is_nan(uint16_t h)
{
    return (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0;
}

static bool bf16_is_nan(uint16_t h)
{
    return (h & 0x7f80u) == 0x7f80u && (h & 0x7fu) != 0;
}

/* The value of an F16 pattern computed independently, in double. */
static double f16_value(uint16_t h)
{
    int sign = h >> 15, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
    double v;
    if (exp == 0x1f)
        v = mant ? NAN : INFINITY;
    else if (exp == 0)
        v = ldexp(mant, -24);
    else
        v = ldexp(1024 + mant, exp - 25);
    return sign ? -v : v;
}

static void test_sizes_names_classes(void **state)
{
    (void)state;
    static const struct {
        seldp_dtype d;
        size_t size;
        const char *name;
        bool is_float, is_half;
    } table[] = {
        {SELDP_F32, 4, "f32", true, false},    {SELDP_F64, 8, "f64", true, false},
        {SELDP_F16, 2, "f16", true, true},     {SELDP_BF16, 2, "bf16", true, true},
        {SELDP_I8, 1, "i8", false, false},     {SELDP_U8, 1, "u8", false, false},
        {SELDP_I16, 2, "i16", false, false},   {SELDP_U16, 2, "u16", false, false},
        {SELDP_I32, 4, "i32", false, false},   {SELDP_U32, 4, "u32", false, false},
        {SELDP_I64, 8, "i64", false, false},   {SELDP_U64, 8, "u64", false, false},
        {SELDP_BOOL, 1, "bool", false, false},
    };
    assert_int_equal(sizeof table / sizeof table[0], SELDP_DTYPE_COUNT);
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
        seldp_dtype d = table[i].d;
        assert_true(seldp_dtype_valid(d));
        assert_int_equal(seldp_dtype_size(d), table[i].size);
        assert_string_equal(seldp_dtype_name(d), table[i].name);
        assert_int_equal(seldp_dtype_is_float(d), table[i].is_float);
        assert_int_equal(seldp_dtype_is_int(d), !table[i].is_float);
        assert_int_equal(seldp_dtype_is_half(d), table[i].is_half);
        seldp_dtype parsed = SELDP_DTYPE_COUNT;
        assert_true(seldp_dtype_parse(table[i].name, &parsed));
        assert_int_equal(parsed, d);
    }
    seldp_dtype bad[] = {(seldp_dtype)-1, SELDP_DTYPE_COUNT, (seldp_dtype)99};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_false(seldp_dtype_valid(bad[i]));
        assert_int_equal(seldp_dtype_size(bad[i]), 0);
        assert_string_equal(seldp_dtype_name(bad[i]), "invalid");
        assert_false(seldp_dtype_is_float(bad[i]));
        assert_false(seldp_dtype_is_int(bad[i]));
        assert_false(seldp_dtype_is_half(bad[i]));
    }
}

static void test_parse(void **state)
{
    (void)state;
    seldp_dtype d = SELDP_U8;
    assert_true(seldp_dtype_parse("BF16", &d));
    assert_int_equal(d, SELDP_BF16);
    assert_true(seldp_dtype_parse("Bool", &d));
    assert_int_equal(d, SELDP_BOOL);
    const char *unknown[] = {"", "f8", "float32", "f16 ", "bf", "invalid"};
    for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; i++) {
        d = SELDP_U8;
        assert_false(seldp_dtype_parse(unknown[i], &d));
        assert_int_equal(d, SELDP_U8); /* untouched */
    }
    assert_false(seldp_dtype_parse(NULL, &d));
}

/* Every F16 pattern: the F32 value is exact, and converting back gives the pattern
 * again (NaN stays a NaN of the same sign). */
static void test_f16_all_patterns(void **state)
{
    (void)state;
    for (uint32_t h = 0; h <= 0xffffu; h++) {
        float f = seldp_f16_to_f32((uint16_t)h);
        uint16_t back = seldp_f32_to_f16(f);
        if (f16_is_nan((uint16_t)h)) {
            if (!isnan(f) || !f16_is_nan(back) || (back & 0x8000u) != (h & 0x8000u))
                fail_msg("f16 NaN 0x%04x -> %g -> 0x%04x", h, (double)f, back);
            continue;
        }
        if ((double)f != f16_value((uint16_t)h) || !!signbit(f) != !!(h & 0x8000u))
            fail_msg("f16 0x%04x -> %a, expected %a", h, (double)f, f16_value((uint16_t)h));
        if (back != h)
            fail_msg("f16 0x%04x -> %a -> 0x%04x, expected identity", h, (double)f, back);
    }
}

static void test_bf16_all_patterns(void **state)
{
    (void)state;
    for (uint32_t h = 0; h <= 0xffffu; h++) {
        float f = seldp_bf16_to_f32((uint16_t)h);
        uint16_t back = seldp_f32_to_bf16(f);
        if (bf16_is_nan((uint16_t)h)) {
            if (!isnan(f) || !bf16_is_nan(back) || (back & 0x8000u) != (h & 0x8000u) ||
                !(back & 0x40u))
                fail_msg("bf16 NaN 0x%04x -> %g -> 0x%04x, expected a quiet NaN", h, (double)f,
                         back);
            continue;
        }
        if (bits_of(f) != h << 16)
            fail_msg("bf16 0x%04x -> 0x%08x, expected the top half", h, bits_of(f));
        if (back != h)
            fail_msg("bf16 0x%04x -> %a -> 0x%04x, expected identity", h, (double)f, back);
    }
}

/* Between every two adjacent finite non-negative F16 values a < b: the midpoint rounds to
 * the even one, and one F32 ulp either side of it to the nearer one. Above 65504 the next
 * value is Inf (the midpoint 65520 rounds to Inf, the even pattern 0x7c00). */
static void test_f16_round_to_nearest_even(void **state)
{
    (void)state;
    for (uint32_t a = 0; a < 0x7c00u; a++) {
        uint32_t b = a + 1;
        double lo = f16_value((uint16_t)a);
        double hi = b == 0x7c00u ? 65536.0 : f16_value((uint16_t)b);
        float mid = (float)((lo + hi) / 2); /* exact: F16 midpoints fit in F32 */
        assert_true((double)mid == (lo + hi) / 2);
        uint32_t even = (a & 1u) ? b : a;
        for (int sign = 0; sign < 2; sign++) {
            float s = sign ? -1.0f : 1.0f;
            uint16_t sbit = sign ? 0x8000u : 0;
            uint16_t got = seldp_f32_to_f16(s * mid);
            if (got != (even | sbit))
                fail_msg("f32 %a (tie between 0x%04x and 0x%04x) -> 0x%04x, expected 0x%04x",
                         (double)(s * mid), a, b, got, even | sbit);
            float below = float_of(bits_of(mid) - 1), above = float_of(bits_of(mid) + 1);
            got = seldp_f32_to_f16(s * below);
            if (got != (a | sbit))
                fail_msg("f32 %a -> 0x%04x, expected 0x%04x", (double)(s * below), got, a | sbit);
            got = seldp_f32_to_f16(s * above);
            if (got != (b | sbit))
                fail_msg("f32 %a -> 0x%04x, expected 0x%04x", (double)(s * above), got, b | sbit);
        }
    }
}

static void test_bf16_round_to_nearest_even(void **state)
{
    (void)state;
    for (uint32_t a = 0; a < 0x7f80u; a++) {
        uint32_t b = a + 1; /* 0x7f80 is Inf: FLT_MAX and above round to it */
        uint32_t mid = (a << 16) | 0x8000u;
        uint32_t even = (a & 1u) ? b : a;
        for (int neg = 0; neg < 2; neg++) {
            uint32_t sign = neg ? 0x80000000u : 0;
            uint16_t sbit = (uint16_t)(sign >> 16);
            uint16_t got = seldp_f32_to_bf16(float_of(sign | mid));
            if (got != (even | sbit))
                fail_msg("f32 0x%08x (tie) -> 0x%04x, expected 0x%04x", sign | mid, got,
                         even | sbit);
            got = seldp_f32_to_bf16(float_of(sign | (mid - 1)));
            if (got != (a | sbit))
                fail_msg("f32 0x%08x -> 0x%04x, expected 0x%04x", sign | (mid - 1), got, a | sbit);
            got = seldp_f32_to_bf16(float_of(sign | (mid + 1)));
            if (got != (b | sbit))
                fail_msg("f32 0x%08x -> 0x%04x, expected 0x%04x", sign | (mid + 1), got, b | sbit);
        }
    }
}

static void test_known_values(void **state)
{
    (void)state;
    /* F16 -> F32 */
    assert_true(seldp_f16_to_f32(0x3c00) == 1.0f);
    assert_true(seldp_f16_to_f32(0xc000) == -2.0f);
    assert_true(seldp_f16_to_f32(0x7bff) == 65504.0f);
    assert_true(seldp_f16_to_f32(0x0001) == ldexpf(1.0f, -24));
    assert_true(seldp_f16_to_f32(0x03ff) == ldexpf(1023.0f, -24));
    assert_true(seldp_f16_to_f32(0x0400) == ldexpf(1.0f, -14));
    assert_true(seldp_f16_to_f32(0x3555) == 0x1.554p-2f);
    assert_true(isinf(seldp_f16_to_f32(0x7c00)) && seldp_f16_to_f32(0x7c00) > 0);
    assert_true(isinf(seldp_f16_to_f32(0xfc00)) && seldp_f16_to_f32(0xfc00) < 0);
    assert_true(seldp_f16_to_f32(0x8000) == 0.0f && signbit(seldp_f16_to_f32(0x8000)));
    assert_true(isnan(seldp_f16_to_f32(0x7e00)));
    /* F32 -> F16 */
    assert_int_equal(seldp_f32_to_f16(1.0f), 0x3c00);
    assert_int_equal(seldp_f32_to_f16(-0.0f), 0x8000);
    assert_int_equal(seldp_f32_to_f16(0.1f), 0x2e66);
    assert_int_equal(seldp_f32_to_f16(65504.0f), 0x7bff);
    assert_int_equal(seldp_f32_to_f16(65519.99f), 0x7bff);
    assert_int_equal(seldp_f32_to_f16(65520.0f), 0x7c00); /* tie with the next step: even is Inf */
    assert_int_equal(seldp_f32_to_f16(1e6f), 0x7c00);
    assert_int_equal(seldp_f32_to_f16(-1e6f), 0xfc00);
    assert_int_equal(seldp_f32_to_f16(INFINITY), 0x7c00);
    assert_int_equal(seldp_f32_to_f16(-INFINITY), 0xfc00);
    assert_int_equal(seldp_f32_to_f16(ldexpf(1.0f, -25)), 0x0000); /* tie: even is 0 */
    assert_int_equal(seldp_f32_to_f16(ldexpf(1.0f, -25) * 1.0000001f), 0x0001);
    assert_int_equal(seldp_f32_to_f16(ldexpf(3.0f, -25)), 0x0002); /* tie 1|2: even is 2 */
    assert_int_equal(seldp_f32_to_f16(ldexpf(1.0f, -26)), 0x0000);
    assert_int_equal(seldp_f32_to_f16(-ldexpf(1.0f, -30)), 0x8000);
    assert_int_equal(seldp_f32_to_f16(ldexpf(1.0f, -14)), 0x0400);
    assert_int_equal(seldp_f32_to_f16(ldexpf(2047.0f, -25)), 0x0400); /* rounds up to a normal */
    assert_int_equal(seldp_f32_to_f16(1.0f + ldexpf(1.0f, -11)), 0x3c00); /* tie: even */
    assert_int_equal(seldp_f32_to_f16(1.0f + ldexpf(3.0f, -11)), 0x3c02); /* tie: even */
    assert_int_equal(seldp_f32_to_f16(1.0f + ldexpf(1.0f, -11) + ldexpf(1.0f, -20)), 0x3c01);
    assert_int_equal(seldp_f32_to_f16(float_of(0x00000001u)), 0x0000); /* F32 subnormal */
    uint16_t nan16 = seldp_f32_to_f16(NAN);
    assert_true(f16_is_nan(nan16) && (nan16 & 0x0200u));
    uint16_t snan16 = seldp_f32_to_f16(float_of(0x7f800001u)); /* payload below F16's bits */
    assert_true(f16_is_nan(snan16) && (snan16 & 0x0200u));
    assert_true(f16_is_nan(seldp_f32_to_f16(float_of(0xffc00000u))));
    assert_true(seldp_f32_to_f16(float_of(0xffc00000u)) & 0x8000u);
    /* BF16 */
    assert_true(seldp_bf16_to_f32(0x3f80) == 1.0f);
    assert_true(seldp_bf16_to_f32(0xc040) == -3.0f);
    assert_int_equal(seldp_f32_to_bf16(1.0f), 0x3f80);
    assert_int_equal(seldp_f32_to_bf16(3.14159265f), 0x4049);
    assert_int_equal(seldp_f32_to_bf16(1.0f + ldexpf(1.0f, -8)), 0x3f80); /* tie: even */
    assert_int_equal(seldp_f32_to_bf16(1.0f + ldexpf(3.0f, -8)), 0x3f82); /* tie: even */
    assert_int_equal(seldp_f32_to_bf16(1.0f + ldexpf(1.0f, -8) + ldexpf(1.0f, -20)), 0x3f81);
    assert_int_equal(seldp_f32_to_bf16(float_of(0x7f7fffffu)), 0x7f80); /* FLT_MAX -> Inf */
    assert_int_equal(seldp_f32_to_bf16(INFINITY), 0x7f80);
    assert_int_equal(seldp_f32_to_bf16(-INFINITY), 0xff80);
    assert_int_equal(seldp_f32_to_bf16(float_of(0x00000001u)),
                     0x0000); /* exact subnormal rounding */
    assert_int_equal(seldp_f32_to_bf16(float_of(0x00018000u)), 0x0002); /* subnormal tie: even */
    assert_int_equal(seldp_f32_to_bf16(float_of(0x7f800001u)), 0x7fc0); /* sNaN -> quiet NaN */
    assert_int_equal(seldp_f32_to_bf16(float_of(0xff800001u)), 0xffc0);
    assert_int_equal(seldp_f32_to_bf16(NAN) & 0x7fc0u, 0x7fc0);
}

static void test_array_conversion(void **state)
{
    (void)state;
    enum { N = 7 };
    const float in[N] = {0.0f, 1.0f, -2.5f, 65504.0f, 1e-7f, 1e30f, -0.0f};
    uint16_t half[N];
    float out[N];
    const seldp_dtype types[] = {SELDP_F16, SELDP_BF16};
    for (size_t t = 0; t < 2; t++) {
        seldp_f32_to_half(types[t], in, half, N);
        seldp_half_to_f32(types[t], half, out, N);
        for (int i = 0; i < N; i++) {
            uint16_t want =
                types[t] == SELDP_F16 ? seldp_f32_to_f16(in[i]) : seldp_f32_to_bf16(in[i]);
            float back = types[t] == SELDP_F16 ? seldp_f16_to_f32(want) : seldp_bf16_to_f32(want);
            assert_int_equal(half[i], want);
            assert_int_equal(bits_of(out[i]), bits_of(back));
        }
    }
    /* A value F16 cannot hold but BF16 can tells the two element paths apart. */
    assert_int_equal(half[5], seldp_f32_to_bf16(1e30f));
    seldp_f32_to_half(SELDP_F16, in, half, N);
    assert_int_equal(half[5], 0x7c00);
}

/* The array conversions (vectorized where the CPU allows) against the element ones, bit
 * for bit: every half bit pattern upcast, and random F32 patterns (with ties, NaN payloads,
 * the F16 overflow edge and subnormals) rounded to either half, at every start offset
 * modulo the vector width and lengths that are not multiples of it. */
static void test_array_conversion_every_pattern(void **state)
{
    (void)state;
    enum { N = 65536 + 40 };
    uint16_t *h = malloc(N * sizeof *h), *h2 = malloc(N * sizeof *h2);
    float *f = malloc(N * sizeof *f), *fb = malloc(N * sizeof *fb);
    uint32_t *bits = malloc(N * sizeof *bits);
    assert_true(h && h2 && f && fb && bits);
    const seldp_dtype types[] = {SELDP_F16, SELDP_BF16};
    uint64_t x = 0x2545f4914f6cdd1dull;
    for (size_t i = 0; i < N; i++) {
        h[i] = (uint16_t)(i * 40503u); /* every pattern once in the first 65,536 */
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        bits[i] = (uint32_t)(x >> 11);
        if (i % 5 == 1) /* an F16 tie, or one bit either side of it */
            bits[i] = (bits[i] & ~0x1fffu) | (0x1000u + (uint32_t)(i % 3) - 1u);
        if (i % 5 == 2) /* a BF16 tie */
            bits[i] = (bits[i] & ~0xffffu) | 0x8000u;
        if (i % 5 == 3) /* exponents around F16's range: subnormals and overflow */
            bits[i] = (bits[i] & 0x807fffffu) | ((uint32_t)(96 + i % 48) << 23);
    }
    memcpy(fb, bits, N * sizeof *fb);
    for (size_t t = 0; t < 2; t++) {
        for (size_t off = 0; off < 9; off++) {
            size_t n = N - 9 - off * 3;
            seldp_half_to_f32(types[t], h + off, f, n);
            for (size_t i = 0; i < n; i++) {
                uint16_t v = h[off + i];
                float want = types[t] == SELDP_F16 ? seldp_f16_to_f32(v) : seldp_bf16_to_f32(v);
                if (bits_of(f[i]) != bits_of(want))
                    fail_msg("%s 0x%04x -> F32 0x%08x in an array, 0x%08x alone",
                             seldp_dtype_name(types[t]), v, bits_of(f[i]), bits_of(want));
            }
            seldp_f32_to_half(types[t], fb + off, h2, n);
            for (size_t i = 0; i < n; i++) {
                float v = float_of(bits[off + i]);
                uint16_t want = types[t] == SELDP_F16 ? seldp_f32_to_f16(v) : seldp_f32_to_bf16(v);
                if (h2[i] != want)
                    fail_msg("F32 0x%08x -> %s 0x%04x in an array, 0x%04x alone", bits[off + i],
                             seldp_dtype_name(types[t]), h2[i], want);
            }
        }
    }
    free(h);
    free(h2);
    free(f);
    free(fb);
    free(bits);
}

/* A signalling NaN upcasts exactly (its quiet bit stays clear), alone and in an array; it
 * comes back from F32 as the quiet NaN with the same payload. */
static void test_signalling_nan_upcast(void **state)
{
    (void)state;
    uint16_t h[16];
    float f[16];
    for (int i = 0; i < 16; i++)
        h[i] = (uint16_t)(0x7c01u + (unsigned)i * 0x11u); /* sNaN, payloads 0x001..0x100 */
    h[3] = 0xfd05;                                        /* a negative sNaN */
    seldp_half_to_f32(SELDP_F16, h, f, 16);
    for (int i = 0; i < 16; i++) {
        uint32_t want =
            (uint32_t)(h[i] & 0x8000u) << 16 | 0x7f800000u | (uint32_t)(h[i] & 0x3ffu) << 13;
        assert_int_equal(bits_of(seldp_f16_to_f32(h[i])), want);
        assert_int_equal(bits_of(f[i]), want);
        assert_int_equal(seldp_f32_to_f16(f[i]), h[i] | 0x0200u);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sizes_names_classes),
        cmocka_unit_test(test_parse),
        cmocka_unit_test(test_f16_all_patterns),
        cmocka_unit_test(test_bf16_all_patterns),
        cmocka_unit_test(test_f16_round_to_nearest_even),
        cmocka_unit_test(test_bf16_round_to_nearest_even),
        cmocka_unit_test(test_known_values),
        cmocka_unit_test(test_array_conversion),
        cmocka_unit_test(test_array_conversion_every_pattern),
        cmocka_unit_test(test_signalling_nan_upcast),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
