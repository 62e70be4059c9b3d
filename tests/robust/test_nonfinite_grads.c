/* Non-finite gradients in the four reductions (docs/library.md), one row per case, run and
 * checked by bs_run_matrix (bad_session_common.h).
 *
 * Without seldp_session_config.check_finite they are not detected and propagate (NaN stays
 * NaN, Inf stays Inf, Inf - Inf gives NaN) into every rank's result; with it, the reduction
 * fails with SELDP_ERR_NONFINITE naming the first non-finite path of the lowest failing rank.
 * Inactive ranks' and unselected gradients are never inspected. */

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "bad_session_common.h"

static void set_grad(plan *p, size_t k, size_t i, double value)
{
    const seldp_tensor *t = seldp_grads_get(p->g.grads, std_id(p->rank, k));
    if (t)
        ct_set(t->dtype, t->data, i, value);
}

/* --- the rows' spoilers ------------------------------------------------------------ */

static void nan_grad(plan *p)
{
    if (p->bad)
        set_grad(p, 1, 2, NAN);
}

static void inf_grad(plan *p)
{
    if (p->bad)
        set_grad(p, 1, 2, INFINITY);
}

static void opposite_infs(plan *p)
{
    if (p->rank == 0 || p->rank == 1)
        set_grad(p, 1, 2, p->rank == 0 ? INFINITY : -INFINITY);
}

static void nan_checked(plan *p)
{
    p->cfg.check_finite = true;
    if (p->bad)
        set_grad(p, 4, 5, NAN); /* layers.0.router.weight, F16 */
}

static void inf_checked(plan *p)
{
    p->cfg.check_finite = true;
    if (p->bad)
        set_grad(p, 3, 1, -INFINITY); /* layers.0.norm.weight, BF16 */
}

static void nan_checked_two_paths(plan *p)
{
    p->cfg.check_finite = true;
    if (p->bad) {
        set_grad(p, 4, 0, NAN);
        set_grad(p, 1, 3, INFINITY); /* final_norm.weight comes first in path order */
    }
}

static void nan_checked_two_ranks(plan *p)
{
    p->cfg.check_finite = true;
    if (p->rank >= 1)
        set_grad(p, p->rank == 1 ? 4 : 0, 0, NAN);
}

static void nan_checked_inactive(plan *p)
{
    p->cfg.check_finite = true;
    if (p->bad) {
        p->weight = 0;
        set_grad(p, 0, 0, NAN);
    }
}

static void nan_checked_unselected(plan *p)
{
    const seldp_tensor *t = seldp_grads_get(p->g.grads, ID_UNSELECTED);
    p->cfg.check_finite = true;
    if (p->bad && t)
        ((float *)t->data)[1] = NAN;
}

static void nan_checked_all_inactive(plan *p)
{
    nan_checked(p);
    p->weight = 0;
}

/* --- checks of rows that succeed ---------------------------------------------------- */

/* Element (k, i) of every rank's result is `want` (NaN: any NaN). */
static bool result_is(plan *p, size_t k, size_t i, double want, char *why, size_t size)
{
    double got = grad_at(p, k, i);
    bool ok = isnan(want) ? isnan(got) : got == want;
    if (!ok)
        snprintf(why, size, "'%s'[%zu] is %g, expected %g", STD[k].path, i, got, want);
    for (size_t j = 0; ok && j < std_numel(k); j++) {
        if (j != i && !isfinite(grad_at(p, k, j))) {
            snprintf(why, size, "'%s'[%zu] is %g: the non-finite value spread", STD[k].path, j,
                     grad_at(p, k, j));
            ok = false;
        }
    }
    return ok;
}

static bool nan_propagated(plan *p, seldp_session *s, uint64_t w, const grads_snapshot *before,
                           char *why, size_t size)
{
    (void)before;
    (void)s;
    (void)w;
    return result_is(p, 1, 2, NAN, why, size);
}

static bool inf_propagated(plan *p, seldp_session *s, uint64_t w, const grads_snapshot *before,
                           char *why, size_t size)
{
    (void)before;
    (void)s;
    (void)w;
    return result_is(p, 1, 2, INFINITY, why, size);
}

/* --- the matrix ------------------------------------------------------------------------ */

static const row MATRIX[] = {
    /* name                                       ranks call  bad   apply             expected
       needles */
    /* --- reductions: non-finite gradients ---------------------------------------------------- */
    ROW_OK("reduce: NaN propagates (check_finite off)", 3, REDUCE, 1, nan_grad, nan_propagated),
    ROW_OK("sum: +Inf propagates (check_finite off)", 3, SUM, 2, inf_grad, inf_propagated),
    ROW_OK("sum_fp32: +Inf and -Inf give NaN (check_finite off)", 3, SUM_FP32, NONE, opposite_infs,
           nan_propagated),
    ROW("reduce: NaN detected (check_finite)", 3, REDUCE, 2, nan_checked, SELDP_ERR_NONFINITE,
        "group rank 2 (world rank 2)",
        "'layers.0.router.weight': the gradient of group rank 2 (world rank 2) is not finite at "
        "element 5 of 8",
        NULL),
    ROW("reduce_fp32: -Inf detected (check_finite)", 3, REDUCE_FP32, 0, inf_checked,
        SELDP_ERR_NONFINITE, "group rank 0 (world rank 0)",
        "'layers.0.norm.weight': the gradient of group rank 0 (world rank 0) is not finite at "
        "element 1 of 4",
        NULL),
    ROW("sum: first non-finite path named (check_finite)", 3, SUM, 1, nan_checked_two_paths,
        SELDP_ERR_NONFINITE, "group rank 1 (world rank 1)",
        "'final_norm.weight': the gradient of group rank 1 (world rank 1) is not finite at element "
        "3 "
        "of 4",
        NULL),
    /* path order before rank order: rank 2's 'embed.weight' before rank 1's router */
    ROW("sum_fp32: first non-finite path named, then its lowest rank (check_finite)", 3, SUM_FP32,
        NONE, nan_checked_two_ranks, SELDP_ERR_NONFINITE, "group rank 2 (world rank 2)",
        "'embed.weight': the gradient of group rank 2 (world rank 2) is not finite at element 0 "
        "of 32",
        NULL),
    ROW("reduce: group of one, NaN detected (check_finite)", 1, REDUCE, 0, nan_checked,
        SELDP_ERR_NONFINITE, "group rank 0 (world rank 0)", "'layers.0.router.weight'",
        "not finite"),
    ROW_OK("reduce: NaN of an inactive rank ignored (check_finite)", 3, REDUCE, 1,
           nan_checked_inactive, all_finite),
    ROW_OK("reduce: NaN of an unselected gradient ignored (check_finite)", 3, REDUCE, 2,
           nan_checked_unselected, all_finite),
    ROW_OK("sum: NaN with no active rank ignored (check_finite)", 3, SUM, ALL,
           nan_checked_all_inactive, only_unselected),
};

#define N_ROWS (sizeof MATRIX / sizeof MATRIX[0])

static void nonfinite_matrix(void **state)
{
    (void)state;
    bs_run_matrix(MATRIX, N_ROWS);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(nonfinite_matrix),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
