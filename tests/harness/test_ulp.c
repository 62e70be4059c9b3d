/* hx_ulp (harness/check/bounds.h), the spacing of a dtype's values at v that the checks' bounds
 * and the diagnosis use: equal, bit for bit, to its definition through frexp and ldexp (the
 * binade of v rounded to the dtype, never below the dtype's smallest normal binade) for every
 * dtype, over values from the doubles' subnormals to their largest, both signs, zero,
 * infinities and NaN. */
#include <float.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "bounds.h"

static double ulp_by_definition(seldp_dtype dtype, double v)
{
    int mant = dtype == SELDP_BF16 ? 7 : dtype == SELDP_F16 ? 10 : dtype == SELDP_F64 ? 52 : 23;
    int emin = dtype == SELDP_F16 ? -14 : dtype == SELDP_F64 ? -1022 : -126;
    double r = fabs(hx_round_to(dtype, v));
    int e = emin;
    if (r > 0 && isfinite(r)) {
        frexp(r, &e);
        e -= 1;
        if (e < emin)
            e = emin;
    }
    return ldexp(1.0, e - mant);
}

static void same_bits(seldp_dtype dtype, double v)
{
    double got = hx_ulp(dtype, v), want = ulp_by_definition(dtype, v);
    if (memcmp(&got, &want, sizeof got) != 0)
        fail_msg("hx_ulp(%s, %a) = %a, expected %a", seldp_dtype_name(dtype), v, got, want);
}

static void every_dtype_and_binade(void **state)
{
    (void)state;
    const seldp_dtype dtypes[] = {SELDP_BF16, SELDP_F16, SELDP_F32, SELDP_F64};
    const double specials[] = {0.0,      -0.0,      INFINITY,  -INFINITY,
                               NAN,      0x1p-1074, 0x1p-1022, 0x1.fffffffffffffp-1023,
                               DBL_MAX,  65504.0,   65520.0,   0x1p-149,
                               0x1p-126, 0x1p-24,   0x1p-14,   3.0e38,
                               3.5e38};
    for (size_t d = 0; d < sizeof dtypes / sizeof dtypes[0]; d++) {
        for (size_t i = 0; i < sizeof specials / sizeof specials[0]; i++) {
            same_bits(dtypes[d], specials[i]);
            same_bits(dtypes[d], -specials[i]);
        }
        /* every binade of the doubles, at its bottom, middle and top */
        for (int e = -1074; e <= 1023; e++) {
            double x = ldexp(1.0, e);
            same_bits(dtypes[d], x);
            same_bits(dtypes[d], -1.5 * x);
            same_bits(dtypes[d], nextafter(2.0 * x, 0.0));
        }
        /* values that round up into the next binade in the dtype */
        uint64_t seed = 12345;
        for (int k = 0; k < 20000; k++) {
            seed = seed * 6364136223846793005ull + 1442695040888963407ull;
            double f = 1.0 + (double)(seed >> 11) * 0x1p-53;
            int e = (int)((seed >> 3) % 300) - 150;
            same_bits(dtypes[d], ldexp(f, e));
        }
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(every_dtype_and_binade),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
