/* The error scales' SiLU rule (tm__mag_silu_var, models/reference_magnitude_silu.c): every
 * build this CPU can run (AVX-512, AVX2, the baseline) gives the same bits, at every length
 * (the vector loops' tails included) and for zeros, signed zeros, the ends of the exponential's
 * range, infinities and NaN; the values and variances agree with the rule computed here with
 * libm's exp (docs/tolerances.md) to 1e-12 of their size; and the entry point runs the widest
 * build. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "reference_magnitude.h"

enum { N_MAX = 4099 };

typedef struct silu_out {
    double y[N_MAX], vy[N_MAX], sl[N_MAX], vsl[N_MAX];
} silu_out;

static double a[N_MAX], va[N_MAX];

/* a deterministic stream of doubles in [0, 1) */
static double uniform(uint64_t *state)
{
    *state = *state * 6364136223846793005u + 1442695040888963407u;
    return (double)(*state >> 11) * 0x1p-53;
}

/* pre-activations of every kind: ordinary ones, large ones, and the special values */
static void fill_inputs(void)
{
    static const double special[] = {0.0,    -0.0,   1e-300, -1e-300,  5e-324,    -5e-324, 1.0,
                                     -1.0,   -1.278, 707.9,  -707.9,   708.1,     -708.1,  745.2,
                                     -745.2, 1e300,  -1e300, INFINITY, -INFINITY, NAN};
    const size_t n_special = sizeof special / sizeof special[0];
    uint64_t state = 12345;
    for (size_t i = 0; i < N_MAX; i++) {
        const double u = uniform(&state);
        if (i < n_special)
            a[i] = special[i];
        else if (i % 7 == 0)
            a[i] = (u - 0.5) * 1400.0; /* the whole range of the exponential */
        else
            a[i] = (u - 0.5) * 24.0;
        va[i] = uniform(&state) * (i % 3 == 0 ? 1e6 : 1.0);
    }
}

static void run_build(int build, size_t n, silu_out *o)
{
    tm__mag_silu_var_on(build, a, va, n, o->y, o->vy, o->sl, o->vsl);
}

static bool same_bits(const double *x, const double *y, size_t n, size_t *where)
{
    for (size_t i = 0; i < n; i++) {
        if (isnan(x[i]) && isnan(y[i]))
            continue;
        if (memcmp(&x[i], &y[i], sizeof x[i]) != 0) {
            *where = i;
            return false;
        }
    }
    return true;
}

static int widest_build(void)
{
    return tm__mag_silu_widest();
}

static void builds_agree(void **state)
{
    (void)state;
    fill_inputs();
    silu_out *base = calloc(1, sizeof *base), *other = calloc(1, sizeof *other);
    assert_non_null(base);
    assert_non_null(other);
    const int widest = widest_build();
    print_message("widest build on this CPU: %s\n", widest == TM_MAG_SILU_AVX512 ? "avx512"
                                                    : widest == TM_MAG_SILU_AVX2 ? "avx2"
                                                                                 : "base");
    static const size_t lengths[] = {1, 2, 3, 5, 7, 8, 9, 15, 16, 17, 31, 33, 1000, N_MAX};
    for (int build = TM_MAG_SILU_BASE + 1; build <= widest; build++)
        for (size_t k = 0; k < sizeof lengths / sizeof lengths[0]; k++) {
            const size_t n = lengths[k];
            memset(base, 0, sizeof *base);
            memset(other, 0, sizeof *other);
            run_build(TM_MAG_SILU_BASE, n, base);
            run_build(build, n, other);
            const double *b[] = {base->y, base->vy, base->sl, base->vsl};
            const double *o[] = {other->y, other->vy, other->sl, other->vsl};
            for (int j = 0; j < 4; j++) {
                size_t where = 0;
                if (!same_bits(b[j], o[j], n, &where))
                    fail_msg("build %d, n %zu, output %d, element %zu (a = %.17g): %.17g, "
                             "base build %.17g",
                             build, n, j, where, a[where], o[j][where], b[j][where]);
            }
            /* nothing beyond n is written */
            assert_true(n == N_MAX || (other->y[n] == 0.0 && other->vsl[n] == 0.0));
        }
    free(base);
    free(other);
}

static void entry_runs_widest(void **state)
{
    (void)state;
    fill_inputs();
    silu_out *want = calloc(1, sizeof *want), *got = calloc(1, sizeof *got);
    assert_non_null(want);
    assert_non_null(got);
    run_build(widest_build(), N_MAX, want);
    tm__mag_silu_var(a, va, N_MAX, got->y, got->vy, got->sl, got->vsl);
    size_t where = 0;
    assert_true(same_bits(want->vsl, got->vsl, N_MAX, &where));
    assert_true(same_bits(want->y, got->y, N_MAX, &where));
    free(want);
    free(got);
}

/* the rule with libm's exp, as docs/tolerances.md writes it */
static void rule(double x, double v, double out[4])
{
    const double s = 1.0 / (1.0 + exp(-x)), y = x * s, slope = s + x * s * (1.0 - s);
    const double curve = s * (1.0 - s) * (2.0 + x * (1.0 - 2.0 * s));
    out[0] = y;
    out[1] = slope * slope * v + 3.0 * y * y;
    out[2] = slope;
    out[3] = curve * curve * v + 3.0 * slope * slope;
}

static void close_to_the_rule(void **state)
{
    (void)state;
    fill_inputs();
    silu_out *o = calloc(1, sizeof *o);
    assert_non_null(o);
    tm__mag_silu_var(a, va, N_MAX, o->y, o->vy, o->sl, o->vsl);
    double worst = 0.0;
    for (size_t i = 0; i < N_MAX; i++) {
        double want[4];
        rule(a[i], va[i], want);
        const double got[4] = {o->y[i], o->vy[i], o->sl[i], o->vsl[i]};
        for (int j = 0; j < 4; j++) {
            if (isnan(want[j])) {
                if (!isnan(got[j]))
                    fail_msg("a = %.17g, output %d: %.17g, want NaN", a[i], j, got[j]);
                continue;
            }
            if (isinf(want[j])) {
                assert_true(got[j] == want[j]);
                continue;
            }
            /* the size of what the element is made of: its value, and for the variances the
             * slope-squared part (the curve's term cancels at its zero); below e^-700 the
             * rule's sigmoid underflows where ours stops at e^-708 */
            const double size = fabs(want[j]) + (j == 3 ? fabs(want[2] * want[2]) : 0.0);
            const double slack = fabs(a[i]) > 700.0 ? 1e-290 : 0.0;
            const double err = fabs(got[j] - want[j]);
            if (err > 1e-12 * size + slack)
                fail_msg("a = %.17g, va = %.17g, output %d: %.17g, rule %.17g (relative %.3g)",
                         a[i], va[i], j, got[j], want[j], err / size);
            if (slack == 0.0 && size > 0.0 && err / size > worst)
                worst = err / size;
        }
    }
    print_message("largest relative difference from libm's rule: %.3g\n", worst);
    free(o);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(builds_agree),
        cmocka_unit_test(entry_runs_widest),
        cmocka_unit_test(close_to_the_rule),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
