/* The error-scale pass's SiLU rule (reference_magnitude.h): for every expert pre-activation
 * a with variance va, silu(a), silu'(a) and their variances. It runs three times a step over
 * every routed row (the forward, and the backward's recomputation), so it is written for the
 * vector units: one sigmoid of an exponential polynomial instead of a libm call per element,
 * compiled for AVX-512, AVX2 and the baseline, chosen at run time.
 *
 * Only the error scales use it. The reference's values keep libm's exp (tm__ref_sigmoid):
 * their bits are what the ranks are compared with, while a bound's last bits do not matter.
 * The exponential here is within 1e-13 of libm's (relative), the sigmoid within 2e-14; the
 * three builds give the same bits (IEEE operations only, no contraction into FMA), so an
 * error scale does not depend on the machine's vector width nor on --reference-threads. */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "reference_magnitude.h"

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF /* GCC contracts nothing in ISO C mode (-std=c11) */
#endif

/* e^x for x <= 0: x = k ln 2 + r with |r| <= ln 2 / 2, e^r by its Taylor series to degree 11
 * (truncation under r^12 / 12! = 6e-15), times 2^k built from its bits; 0 below -708 (e^x
 * is under 3.4e-308 there, where 2^k would leave the normal range). A NaN stays NaN. */
static inline double mag_exp_nonpositive(double x)
{
    const bool below = x < -708.0;
    x = below ? -708.0 : x;
    const double shift = 0x1.8p52; /* adding it rounds x log2(e) to an integer k */
    const double t = x * 0x1.71547652b82fep0 + shift;
    uint64_t bits;
    memcpy(&bits, &t, sizeof bits);
    const double k = t - shift;
    double r = x - k * 0x1.62e42fefa39efp-1; /* ln 2 in two parts: k ln2_hi is exact */
    r = r - k * 0x1.abc9e3b39803fp-56;
    double p = 1.0 / 39916800.0;
    p = p * r + 1.0 / 3628800.0;
    p = p * r + 1.0 / 362880.0;
    p = p * r + 1.0 / 40320.0;
    p = p * r + 1.0 / 5040.0;
    p = p * r + 1.0 / 720.0;
    p = p * r + 1.0 / 120.0;
    p = p * r + 1.0 / 24.0;
    p = p * r + 1.0 / 6.0;
    p = p * r + 0.5;
    p = p * r + 1.0;
    p = p * r + 1.0;
    const uint64_t scale_bits = (bits + 1023u) << 52; /* k's low bits, biased: 2^k */
    double scale;
    memcpy(&scale, &scale_bits, sizeof scale);
    const double e = p * scale;
    return below ? 0.0 : e;
}

/* 1 / (1 + e^-a) from e = e^-|a| <= 1, which cannot overflow */
static inline double mag_sigmoid(double a)
{
    const double e = mag_exp_nonpositive(-fabs(a)), q = 1.0 / (1.0 + e);
    return a < 0.0 ? e * q : q;
}

/* silu''(a), s its sigmoid */
static inline double silu_curve(double a, double s)
{
    return s * (1.0 - s) * (2.0 + a * (1.0 - 2.0 * s));
}

/* silu(a) = a s, silu'(a) = s + a s (1 - s): the rule of tm__mag_silu_var. Inlined into
 * each build below, and vectorized there for its instruction set. */
static inline __attribute__((always_inline)) void
silu_var_loop(const double *restrict a, const double *restrict va, size_t n, double *restrict y,
              double *restrict vy, double *restrict sl, double *restrict vsl)
{
    for (size_t i = 0; i < n; i++) {
        const double x = a[i], s = mag_sigmoid(x);
        const double v = x * s, slope = s + x * s * (1.0 - s), curve = silu_curve(x, s);
        y[i] = v;
        vy[i] = slope * slope * va[i] + 3.0 * v * v; /* a / (1 + exp(-a)): three roundings */
        sl[i] = slope;
        vsl[i] = curve * curve * va[i] + 3.0 * slope * slope;
    }
}

static void silu_var_base(const double *a, const double *va, size_t n, double *y, double *vy,
                          double *sl, double *vsl)
{
    silu_var_loop(a, va, n, y, vy, sl, vsl);
}

#if (defined(__GNUC__) || defined(__clang__)) && (defined(__x86_64__) || defined(__i386__))
#define MAG_X86 1
__attribute__((target("avx2"))) static void silu_var_avx2(const double *a, const double *va,
                                                          size_t n, double *y, double *vy,
                                                          double *sl, double *vsl)
{
    silu_var_loop(a, va, n, y, vy, sl, vsl);
}

__attribute__((target("avx512f"))) static void silu_var_avx512(const double *a, const double *va,
                                                               size_t n, double *y, double *vy,
                                                               double *sl, double *vsl)
{
    silu_var_loop(a, va, n, y, vy, sl, vsl);
}
#endif

int tm__mag_silu_widest(void)
{
#ifdef MAG_X86
    if (__builtin_cpu_supports("avx512f"))
        return TM_MAG_SILU_AVX512;
    if (__builtin_cpu_supports("avx2"))
        return TM_MAG_SILU_AVX2;
#endif
    return TM_MAG_SILU_BASE;
}

void tm__mag_silu_var_on(int build, const double *a, const double *va, size_t n, double *y,
                         double *vy, double *sl, double *vsl)
{
    switch (build) {
#ifdef MAG_X86
    case TM_MAG_SILU_AVX512:
        silu_var_avx512(a, va, n, y, vy, sl, vsl);
        return;
    case TM_MAG_SILU_AVX2:
        silu_var_avx2(a, va, n, y, vy, sl, vsl);
        return;
#endif
    default:
        silu_var_base(a, va, n, y, vy, sl, vsl);
    }
}

/* silu of n pre-activations a (variances va): values into y, their variances into vy, silu'
 * into sl and its variance into vsl; the arrays do not overlap. */
void tm__mag_silu_var(const double *a, const double *va, size_t n, double *y, double *vy,
                      double *sl, double *vsl)
{
    tm__mag_silu_var_on(tm__mag_silu_widest(), a, va, n, y, vy, sl, vsl);
}
