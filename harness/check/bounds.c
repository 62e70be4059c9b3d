/* The tolerance model (bounds.h, docs/tolerances.md). */
#include "bounds.h"

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

double hx_unit_roundoff(seldp_dtype dtype)
{
    switch (dtype) {
    case SELDP_BF16:
        return ldexp(1.0, -8);
    case SELDP_F16:
        return ldexp(1.0, -11);
    case SELDP_F64:
        return ldexp(1.0, -53);
    default:
        return ldexp(1.0, -24);
    }
}

/* Half the smallest subnormal of a dtype: a rounding's absolute error near zero. */
static double half_subnormal(seldp_dtype dtype)
{
    switch (dtype) {
    case SELDP_BF16:
        return ldexp(1.0, -134);
    case SELDP_F16:
        return ldexp(1.0, -25);
    case SELDP_F64:
        return ldexp(1.0, -1075);
    default:
        return ldexp(1.0, -150);
    }
}

hx_tolerance hx_tolerance_of(const tm_config *m, seldp_dtype result)
{
    (void)m; /* the magnitudes carry the model's sizes; the constant does not */
    hx_tolerance t = {result, ldexp(1.0, -24), hx_unit_roundoff(result), half_subnormal(result),
                      HX_TOLERANCE_SIGMAS};
    return t;
}

double hx_round_to(seldp_dtype dtype, double v)
{
    float f = (float)v;
    switch (dtype) {
    case SELDP_BF16:
        return seldp_bf16_to_f32(seldp_f32_to_bf16(f));
    case SELDP_F16:
        return seldp_f16_to_f32(seldp_f32_to_f16(f));
    case SELDP_F64:
        return v;
    default:
        return f;
    }
}

/* 2^k for an integer k >= -1074 (the doubles' smallest subnormal), exactly. */
static double power_of_two(int k)
{
    if (k < -1022)
        return ldexp(1.0, k);
    uint64_t bits = (uint64_t)(k + 1023) << 52;
    double x;
    memcpy(&x, &bits, sizeof x);
    return x;
}

double hx_ulp(seldp_dtype dtype, double v)
{
    int mant = dtype == SELDP_BF16 ? 7 : dtype == SELDP_F16 ? 10 : dtype == SELDP_F64 ? 52 : 23;
    int emin = dtype == SELDP_F16 ? -14 : dtype == SELDP_F64 ? -1022 : -126;
    double r = fabs(hx_round_to(dtype, v));
    int e = emin;
    if (r > 0 && isfinite(r)) {
        /* the binade's exponent: a normal double's exponent field less its bias (frexp's for a
         * subnormal one, whose binade lies below every dtype's emin anyway) */
        uint64_t bits;
        memcpy(&bits, &r, sizeof bits);
        int field = (int)(bits >> 52);
        if (field > 0) {
            e = field - 1023;
        } else {
            frexp(r, &e); /* r = f 2^e, f in [0.5, 1) */
            e -= 1;
        }
        if (e < emin)
            e = emin;
    }
    return power_of_two(e - mant);
}

void hx_fit_add(hx_fit *f, double got, double want, double mag, double abs)
{
    double d = got - want, ra = abs + fabs(got);
    f->n++;
    f->err2 += d * d;
    f->want2 += want * want;
    f->got2 += got * got;
    f->cross += got * want;
    f->mag2 += mag * mag;
    f->abs2 += abs * abs;
    f->mag_dot += fabs(want) * mag;
    f->round2 += want * want * ra * ra;
    f->round1 += want * want * ra;
    if (ra < 0x1p-14)
        f->sub_half1 += fabs(want);
    if (ra < 0x1p-126)
        f->sub_single1 += fabs(want);
}

double hx_fit_bound(const hx_tolerance *t, const hx_fit *f, int contributors, bool rounded)
{
    double model = t->c * t->u_c * sqrt(f->mag2);
    if (!rounded)
        return model;
    double w = contributors > 0 ? (double)contributors : 1.0;
    /* each contribution rounded once at export, summed in FP32, the result rounded once */
    double rounding = (t->u_r + (w + 1.0) * t->u_c) * sqrt(f->abs2) + t->u_r * sqrt(f->got2);
    double subnormal = (w + 1.0) * t->eta_r * sqrt((double)f->n);
    return model + rounding + subnormal;
}

double hx_fit_scale(const hx_fit *f)
{
    return f->want2 > 0 ? f->cross / f->want2 : 1.0;
}

double hx_fit_scale_bound(const hx_tolerance *t, const hx_fit *f, int contributors, bool rounded)
{
    if (!(f->want2 > 0))
        return INFINITY;
    /* FP32's own floor: a value below its subnormals is computed as 0 (all one way) */
    double model = t->c * t->u_c * f->mag_dot + 0x1p-149 * f->sub_single1;
    double rounding = 0.0;
    if (rounded) {
        /* sum want_i^2 b_i^2, b_i = u_r a_i + k eta_r */
        double k = ((contributors > 0 ? contributors : 1) + 1.0) * t->eta_r, u = t->u_r;
        double v = u * u * f->round2 + 2.0 * u * k * f->round1 + k * k * f->want2;
        /* elements in the subnormal range may all err one way: their bias in full */
        double sub = t->result == SELDP_F16 ? f->sub_half1 : f->sub_single1;
        rounding = 6.0 * sqrt(v) + k * sub;
    }
    return (model + rounding) / f->want2;
}
