/* The tolerance model of the checks (docs/tolerances.md): error bounds derived from the
 * computation instead of fixed relative limits.
 *
 * Three numbers describe a run's arithmetic: u_c, the unit roundoff of the FP32 the model
 * computes in; u_r, that of the dtype the reduced gradients come back in (bf16 2^-8, f16
 * 2^-11, f32 2^-24), with eta_r, half its smallest subnormal (the absolute error of a rounding
 * near zero); and the FP64 reference's magnitude m of every gradient element
 * (tm_reference_magnitude): the standard deviation, in units of u_c, of the FP32 model's
 * rounding error, propagated through the computation that produced the element. An FP32
 * gradient is then within c u_c ||m|| of the exact one, c = HX_TOLERANCE_SIGMAS standard
 * deviations. */
#ifndef HX_BOUNDS_H
#define HX_BOUNDS_H

#include <stddef.h>

#include "seldp/dtype.h"
#include "tinymoe.h"

typedef struct hx_tolerance {
    seldp_dtype result; /* the reduced gradients' dtype */
    double u_c;         /* FP32 unit roundoff, 2^-24 */
    double u_r;         /* the result dtype's unit roundoff */
    double eta_r;       /* half the result dtype's smallest subnormal */
    double c;           /* standard deviations of the model's error a bound allows */
} hx_tolerance;

/* Six standard deviations: a tensor's error norm sums the errors of its elements, each the sum
 * of thousands of roundings, so its distribution is close to normal; six leaves a false alarm
 * less likely than 1e-8 per tensor, while the magnitude model itself is conservative (its
 * own-rounding terms take every partial sum at its largest). */
#define HX_TOLERANCE_SIGMAS 6.0

/* The tolerance of a model config whose reductions return `result`. */
hx_tolerance hx_tolerance_of(const tm_config *m, seldp_dtype result);

/* The unit roundoff of a float dtype (F32, F16, BF16; F64 2^-53). */
double hx_unit_roundoff(seldp_dtype dtype);

/* v rounded to `dtype` (through FP32 for the halves: at most one ulp from a direct rounding),
 * and the spacing of `dtype`'s values at the value v rounds to. */
double hx_round_to(seldp_dtype dtype, double v);
double hx_ulp(seldp_dtype dtype, double v);

/* The statistics of one tensor's comparison with its reference, in FP64:
 *   got  the tensor being checked (n elements, read through `read`)
 *   want the reference value, mag its magnitude (sum of |terms|), abs the sum of the absolute
 *        inputs of the reduction that produced got (NULL: none) */
typedef struct hx_fit {
    size_t n;
    double err2;    /* ||got - want||^2 */
    double want2;   /* ||want||^2 */
    double got2;    /* ||got||^2 */
    double cross;   /* <got, want> */
    double mag2;    /* ||mag||^2 */
    double abs2;    /* ||abs||^2 */
    double mag_dot; /* sum |want_i| mag_i */
    double round2;  /* sum want_i^2 (abs_i + |got_i|)^2, the rounding statistic's variance scale */
    double round1;  /* sum want_i^2 (abs_i + |got_i|) */
    /* sum |want_i| over the elements whose abs_i + |got_i| is below F16's smallest normal
     * (2^-14) and below FP32's and BF16's (2^-126): there a rounding errs by up to the
     * dtype's subnormal spacing whatever the value, and all in one direction (values far
     * below it round to 0), so their part of the best-fit scale is a bias, not noise */
    double sub_half1, sub_single1;
} hx_fit;

void hx_fit_add(hx_fit *f, double got, double want, double mag, double abs);

/* The bound of ||got - want|| for a tensor the model computed in FP32 and the reduction
 * rounded (export of every contribution, the sum, the result) to t->result over `contributors`
 * ranks: c u_c ||mag|| + (u_r + (contributors + 1) u_c) ||abs|| + u_r ||got|| + the subnormal
 * terms. rounded = false: the model's part alone (an FP32 gradient before its export). */
double hx_fit_bound(const hx_tolerance *t, const hx_fit *f, int contributors, bool rounded);

/* The best-fit scale <got, want> / <want, want> (1 when want is 0) and the bound of its
 * distance from 1 under the tolerance model: the model's error taken whole, the roundings
 * (independent, zero-mean, each bounded by u_r (abs_i + |got_i|) + (contributors + 1) eta_r: a
 * subnormal's error is absolute) by Hoeffding's inequality at six of their scales, plus the
 * worst case of the elements in the result dtype's subnormal range, whose roundings need not
 * be zero-mean (a value far below the smallest subnormal always rounds to 0). */
double hx_fit_scale(const hx_fit *f);
double hx_fit_scale_bound(const hx_tolerance *t, const hx_fit *f, int contributors, bool rounded);

#endif
