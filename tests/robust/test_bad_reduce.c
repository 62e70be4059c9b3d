/* The bad-input matrix of the four reductions (seldp_session_reduce, _reduce_fp32, _sum,
 * _sum_fp32; docs/library.md): null arguments, invalid or differing missing-gradient
 * policies, ranks calling different reductions (or initialize against a reduction), bad
 * gradients (missing, of a frozen parameter or an integer buffer, wrong dtype, shape or
 * device), and the weights (u64 overflow, exactly UINT64_MAX, zero), a group of one, empty
 * selections and zero-element gradients. One row per case, run and checked by bs_run_matrix
 * (bad_session_common.h). */

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "bad_session_common.h"

/* Replace the gradient of `id` by one of another dtype, shape or device. */
static seldp_status regrad(plan *p, seldp_param_id id, seldp_dtype dtype, int ndim,
                           const int64_t *shape, bool cuda)
{
    seldp_grads_remove(p->g.grads, id);
    if (cuda) {
        static float bytes[MAX_RANKS][8]; /* never read: rejected by the descriptor */
        seldp_tensor t = seldp_tensor_view(SELDP_F32, (seldp_device){SELDP_DEVICE_CUDA, 0},
                                           bytes[p->rank], ndim, shape);
        return seldp_grads_put(p->g.grads, id, &t, SELDP_BORROWED);
    }
    return tg_put(&p->g, id, dtype, false, 77 + (uint64_t)p->rank, ndim, shape, NULL);
}

/* --- the rows' spoilers ------------------------------------------------------------ */

/* reductions: the session is initialized with what these set, then reduces these gradients */
static void null_session(plan *p)
{
    p->null_session = true;
}

static void null_grads(plan *p)
{
    p->null_grads = p->bad;
}

static void policy_invalid(plan *p)
{
    p->policy = 7;
}

static void policy_differs(plan *p)
{
    if (p->bad)
        p->policy = SELDP_MISSING_ZERO;
}

static void missing_grad(plan *p)
{
    if (p->bad)
        seldp_grads_remove(p->g.grads, std_id(p->rank, 1));
}

static void frozen_grad(plan *p)
{
    if (p->bad)
        tg_put(&p->g, std_id(p->rank, 2), SELDP_F32, false, 5, 1, SHAPE(3), NULL);
}

static void wrong_dtype(plan *p)
{
    if (p->bad)
        regrad(p, std_id(p->rank, 3), SELDP_F32, 1, SHAPE(4), false);
}

static void wrong_shape(plan *p)
{
    if (p->bad)
        regrad(p, std_id(p->rank, 1), SELDP_F32, 1, SHAPE(5), false);
}

static void wrong_device(plan *p)
{
    if (p->bad)
        regrad(p, std_id(p->rank, 1), SELDP_F32, 1, SHAPE(4), true);
}

static void buffer_grad(plan *p)
{
    p->init_call = INIT_BUFFERS;
    p->ids[p->n_ids++] = ID_QWEIGHT;
    if (p->bad)
        tg_put(&p->g, ID_QWEIGHT, SELDP_U8, false, 5, 1, SHAPE(16), NULL);
}

static void weight_overflow(plan *p)
{
    p->weight = p->bad ? UINT64_MAX : 1;
}

static void weight_at_max(plan *p)
{
    /* the ranks' weights add up to exactly UINT64_MAX */
    p->weight = p->rank == 0 ? UINT64_MAX - (uint64_t)(p->size - 1) : 1;
}

static void weight_zero_everywhere(plan *p)
{
    p->weight = 0;
}

static void reduce_empty_selection(plan *p)
{
    empty_selection(p);
}

static void grad_of_empty_param(plan *p)
{
    seldp_tensor t = seldp_tensor_view(SELDP_F32, SELDP_HOST_DEVICE, NULL, 1, SHAPE(0));
    select_empty(p);
    seldp_grads_put(p->g.grads, ID_EMPTY, &t, SELDP_BORROWED);
    /* the contract tests' snapshot copies every entry's bytes, NULL ones too */
    p->no_snapshot = true;
}

/* --- checks of rows that succeed ---------------------------------------------------- */

/* The zero-element gradient is still there, and the others are finite. */
static bool empty_kept(plan *p, seldp_session *s, uint64_t w, const grads_snapshot *before,
                       char *why, size_t size)
{
    static const size_t trainable[] = {0, 1, 3, 4};
    const seldp_tensor *t = seldp_grads_get(p->g.grads, ID_EMPTY);
    (void)s;
    (void)w;
    (void)before;
    if (!t || seldp_tensor_numel(t) != 0) {
        snprintf(why, size, "the zero-element gradient is gone");
        return false;
    }
    for (size_t j = 0; j < 4; j++) {
        for (size_t i = 0; i < std_numel(trainable[j]); i++) {
            if (!isfinite(grad_at(p, trainable[j], i))) {
                snprintf(why, size, "'%s'[%zu] is not finite", STD[trainable[j]].path, i);
                return false;
            }
        }
    }
    return true;
}

static bool weight_is_max(plan *p, seldp_session *s, uint64_t w, const grads_snapshot *before,
                          char *why, size_t size)
{
    (void)s;
    if (w != UINT64_MAX) {
        snprintf(why, size, "global weight %llu, expected UINT64_MAX", (unsigned long long)w);
        return false;
    }
    return all_finite(p, s, w, before, why, size);
}

/* Nothing selected: every gradient as it was; every rank counted active. */
static bool untouched(plan *p, seldp_session *s, uint64_t w, const grads_snapshot *before,
                      char *why, size_t size)
{
    (void)s;
    if (w != (uint64_t)p->size) {
        snprintf(why, size, "global weight %llu, expected %d active ranks", (unsigned long long)w,
                 p->size);
        return false;
    }
    return gs_same(before, p->g.grads, why, size);
}

/* A group of one: the mean is the rank's own gradient divided by its weight. */
static bool own_mean(plan *p, seldp_session *s, uint64_t w, const grads_snapshot *before, char *why,
                     size_t size)
{
    double ref[64];
    bool include[1] = {true};
    (void)s;
    (void)before;
    if (w != p->weight) {
        snprintf(why, size, "global weight %llu, expected %llu", (unsigned long long)w,
                 (unsigned long long)p->weight);
        return false;
    }
    std_reference(1, SELDP_F32, 1, include, (double)w, ref);
    const seldp_tensor *t = seldp_grads_get(p->g.grads, std_id(0, 1));
    return t && close_to(SELDP_F32, t->data, ref, std_numel(1), 1e-6, why, size);
}

/* --- the matrix ------------------------------------------------------------------------ */

static const row MATRIX[] = {
    /* name                                       ranks call  bad   apply             expected
       needles */
    /* --- reductions: arguments and agreement ----------------------------------------------- */
    ROW("reduce: session NULL", 3, REDUCE, ALL, null_session, SELDP_ERR_INVALID_ARGUMENT,
        "seldp_session_reduce", "session must not be NULL", NULL),
    ROW("sum: grads NULL on one rank", 3, SUM, 1, null_grads, SELDP_ERR_INVALID_ARGUMENT,
        "group rank 1 (world rank 1)", "seldp_session_sum: grads must not be NULL", NULL),
    ROW("reduce_fp32: missing policy 7", 3, REDUCE_FP32, ALL, policy_invalid,
        SELDP_ERR_INVALID_ARGUMENT, "group rank 0", "missing-gradient policy 7 is invalid", NULL),
    ROW("reduce: policy differs on one rank", 3, REDUCE, 2, policy_differs, SELDP_ERR_DISAGREE,
        "group rank 2 (world rank 2) called seldp_session_reduce with policy zero",
        "disagree on the reduction", NULL),
    {"reduce: one rank calls sum",
     3,
     REDUCE,
     SUM,
     2,
     nothing,
     SELDP_ERR_DISAGREE,
     {"group rank 2 (world rank 2) called seldp_session_sum", "disagree on the reduction", NULL},
     true,
     NULL},
    {"reduce: one rank calls reduce_fp32",
     3,
     REDUCE,
     REDUCE_FP32,
     1,
     nothing,
     SELDP_ERR_DISAGREE,
     {"group rank 1 (world rank 1) called seldp_session_reduce_fp32", "disagree on the reduction",
      NULL},
     true,
     NULL},
    {"sum: one rank calls sum_fp32",
     3,
     SUM,
     SUM_FP32,
     0,
     nothing,
     SELDP_ERR_DISAGREE,
     {"group rank 0 (world rank 0) called seldp_session_sum_fp32",
      "group rank 1 (world rank 1) called seldp_session_sum", NULL},
     true,
     NULL},
    /* the calls' agreement records differ in size: the transport itself refuses */
    {"initialize: one rank calls reduce instead",
     3,
     INIT,
     REDUCE,
     1,
     nothing,
     SELDP_ERR_DISAGREE,
     {"the agreement of the call failed: ", "rank 1", NULL},
     false,
     NULL},
    /* --- reductions: gradients ------------------------------------------------------------ */
    ROW("reduce: gradient missing on one rank", 3, REDUCE, 2, missing_grad,
        SELDP_ERR_MISSING_GRADIENT, "no gradient on active group rank 2 (world rank 2)",
        "'final_norm.weight'", "missing-gradient policy error"),
    ROW("sum: gradient of a frozen parameter", 3, SUM, 1, frozen_grad, SELDP_ERR_FROZEN,
        "group rank 1", "'frozen.scale' is frozen", "but a gradient was supplied"),
    ROW("reduce: gradient dtype differs", 3, REDUCE, 2, wrong_dtype, SELDP_ERR_DTYPE,
        "group rank 2", "'layers.0.norm.weight'", "gradient dtype f32, expected bf16"),
    ROW("sum_fp32: gradient shape differs", 3, SUM_FP32, 0, wrong_shape, SELDP_ERR_SHAPE,
        "group rank 0", "'final_norm.weight'",
        "gradient shape [5] differs from the parameter's [4]"),
    ROW("reduce: gradient on another device", 3, REDUCE, 1, wrong_device, SELDP_ERR_DEVICE,
        "group rank 1", "'final_norm.weight'",
        "gradient on cuda:0, but the session computes on host"),
    ROW("sum: gradient of an integer buffer", 3, SUM, 2, buffer_grad, SELDP_ERR_DTYPE,
        "group rank 2", "'aaa.qweight'", "never reduced"),
    /* --- reductions: weights ----------------------------------------------------------------- */
    ROW("reduce: u64 weight overflow", 3, REDUCE, 1, weight_overflow, SELDP_ERR_OVERFLOW,
        "group rank 1 (world rank 1) adds 18446744073709551615", "overflows 64 bits", NULL),
    ROW_OK("reduce_fp32: weights summing to UINT64_MAX", 3, REDUCE_FP32, NONE, weight_at_max,
           weight_is_max),
    ROW_OK("reduce: zero global weight", 3, REDUCE, ALL, weight_zero_everywhere, only_unselected),
    ROW_OK("sum_fp32: no active rank", 3, SUM_FP32, ALL, weight_zero_everywhere, only_unselected),
    ROW_OK("reduce: group of one", 1, REDUCE, NONE, nothing, own_mean),
    ROW_OK("sum: zero-length selection", 3, SUM, ALL, reduce_empty_selection, untouched),
    ROW_OK("reduce: zero-element gradient, data NULL", 3, REDUCE, ALL, grad_of_empty_param,
           empty_kept),
};

#define N_ROWS (sizeof MATRIX / sizeof MATRIX[0])

static void reduce_matrix(void **state)
{
    (void)state;
    bs_run_matrix(MATRIX, N_ROWS);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(reduce_matrix),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
