/* The bad-input matrix of seldp_session_initialize and seldp_session_initialize_with_buffers
 * (docs/library.md): null arguments, roots outside the group or differing between ranks,
 * selections with duplicate, absent, integer, f64 or zero-element parameters, parameters on
 * another device, schemas (dtype, shape, frozen flag, aliases, paths) differing from the
 * root's, bad or differing cfg.bucket_bytes, and ranks calling different functions. One row
 * per case, run and checked by bs_run_matrix (bad_session_common.h). */

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "bad_session_common.h"

static const std_change dtype_change = {"layers.0.norm.weight", SELDP_F16, 0, -1, false};
static const std_change shape_change = {"final_norm.weight", SELDP_DTYPE_COUNT, 5, -1, false};
static const std_change frozen_change = {"frozen.scale", SELDP_DTYPE_COUNT, 0, 0, false};
static const std_change device_change = {"final_norm.weight", SELDP_DTYPE_COUNT, 0, -1, true};

/* --- the rows' spoilers ------------------------------------------------------------ */

static void null_comm(plan *p)
{
    p->null_comm = true;
}

static void null_out(plan *p)
{
    p->null_out = true;
}

static void null_model(plan *p)
{
    p->null_model = p->bad;
}

static void null_ids(plan *p)
{
    p->null_ids = p->bad;
}

static void root_outside(plan *p)
{
    p->root = p->size;
}

static void root_negative(plan *p)
{
    p->root = -1;
}

static void root_differs(plan *p)
{
    p->root = p->bad ? p->size - 1 : 0;
}

static void duplicate_id(plan *p)
{
    if (p->bad)
        p->ids[3] = p->ids[1];
}

static void absent_id(plan *p)
{
    if (p->bad)
        p->ids[2] = 9999;
}

static void select_qweight(plan *p)
{
    if (p->bad || p->init_call == INIT_BUFFERS)
        p->ids[p->n_ids++] = ID_QWEIGHT;
}

static void select_table(plan *p)
{
    if (p->bad)
        p->ids[p->n_ids++] = ID_TABLE;
}

static void select_heads(plan *p)
{
    p->tie_heads = p->bad;
    p->ids[p->n_ids++] = ID_HEAD_A;
    if (!p->bad)
        p->ids[p->n_ids++] = ID_HEAD_B;
}

static void untie_lm_head(plan *p)
{
    p->untie_head = p->bad;
    if (p->bad)
        p->ids[p->n_ids++] = 50;
}

static void extra_path(plan *p)
{
    if (p->bad)
        p->ids[p->n_ids++] = ID_HEAD_A;
}

static void bucket_zero(plan *p)
{
    p->cfg.bucket_bytes = 0;
}

static void bucket_differs(plan *p)
{
    if (p->bad)
        p->cfg.bucket_bytes = 128;
}

static void select_empty_shape_differs(plan *p)
{
    select_empty(p);
    p->empty_ndim = p->bad ? 2 : 1;
}

static void dtype_differs(plan *p)
{
    p->change = &dtype_change;
}

static void shape_differs(plan *p)
{
    p->change = &shape_change;
}

static void frozen_differs(plan *p)
{
    p->change = &frozen_change;
}

static void on_another_device(plan *p)
{
    p->change = &device_change;
}

/* --- checks of rows that succeed ---------------------------------------------------- */

static bool nothing_selected(plan *p, seldp_session *s, uint64_t w, const grads_snapshot *before,
                             char *why, size_t size)
{
    (void)before;
    size_t n = 99;
    (void)w;
    seldp_session_selected(s, &n);
    if (s && n != 0) {
        snprintf(why, size, "%zu ids selected, expected none", n);
        return false;
    }
    return ct_unchanged(&p->m, why, size);
}

/* After initialize, every selected parameter holds the root's values. */
static bool holds_root(plan *p, seldp_session *s, uint64_t w, const grads_snapshot *before,
                       char *why, size_t size)
{
    (void)before;
    (void)s;
    (void)w;
    for (size_t k = 0; k < STD_N; k++)
        if (!std_holds_root(&p->m, k, p->root, why, size))
            return false;
    return true;
}

/* --- the matrix ------------------------------------------------------------------------ */

static const row MATRIX[] = {
    /* name                                       ranks call  bad   apply             expected
       needles */
    /* --- initialize: arguments ---------------------------------------------------------------- */
    ROW("initialize: comm NULL", 3, INIT, ALL, null_comm, SELDP_ERR_INVALID_ARGUMENT,
        "seldp_session_initialize", "comm and out must not be NULL", NULL),
    ROW("initialize: out NULL", 3, INIT, ALL, null_out, SELDP_ERR_INVALID_ARGUMENT,
        "seldp_session_initialize", "comm and out must not be NULL", NULL),
    ROW("initialize: model NULL on one rank", 3, INIT, 2, null_model, SELDP_ERR_INVALID_ARGUMENT,
        "group rank 2 (world rank 2)", "model and ids must not be NULL", NULL),
    ROW("initialize: ids NULL with a count", 3, INIT, 1, null_ids, SELDP_ERR_INVALID_ARGUMENT,
        "group rank 1 (world rank 1)", "model and ids must not be NULL", NULL),
    ROW_OK("initialize: zero-length selection (ids NULL)", 3, INIT, ALL, empty_selection,
           nothing_selected),
    ROW("initialize: root = group size", 3, INIT, ALL, root_outside, SELDP_ERR_INVALID_ARGUMENT,
        "group rank 0", "root 3 is outside the group of 3 ranks", NULL),
    ROW("initialize: root -1", 3, INIT, ALL, root_negative, SELDP_ERR_INVALID_ARGUMENT,
        "group rank 0", "root -1 is outside the group", NULL),
    ROW("initialize: root differs on one rank", 3, INIT, 1, root_differs, SELDP_ERR_DISAGREE,
        "group rank 1 (world rank 1) passed 2", "disagree on the root", NULL),
    ROW_OK("initialize: group of one", 1, INIT, NONE, nothing, holds_root),
    ROW("initialize: group of one, root 1", 1, INIT, ALL, root_outside, SELDP_ERR_INVALID_ARGUMENT,
        "group rank 0 (world rank 0)", "root 1 is outside the group of 1 ranks", NULL),
    ROW("initialize: id selected twice", 3, INIT, 2, duplicate_id, SELDP_ERR_DUPLICATE,
        "group rank 2", "is selected twice", NULL),
    ROW("initialize: id absent from the model", 3, INIT, 1, absent_id, SELDP_ERR_NOT_FOUND,
        "group rank 1", "ParamId 9999 is not registered", NULL),
    ROW("initialize: integer buffer selected", 3, INIT, 2, select_qweight, SELDP_ERR_DTYPE,
        "group rank 2", "'aaa.qweight'", "selects F32, F16 and BF16"),
    ROW("initialize: f64 selected", 3, INIT, 0, select_table, SELDP_ERR_DTYPE, "group rank 0",
        "'aaa.table' is f64", "F32, F16 and BF16"),
    ROW("initialize: parameter on another device", 3, INIT, 1, on_another_device, SELDP_ERR_DEVICE,
        "group rank 1", "'final_norm.weight' is on cuda:0", "computes on host"),
    ROW("initialize: dtype differs on one rank", 3, INIT, 2, dtype_differs, SELDP_ERR_SCHEMA,
        "group rank 2", "'layers.0.norm.weight'",
        "dtype f16, root (group rank 0, world rank 0) has dtype bf16"),
    ROW("initialize: shape differs on one rank", 3, INIT, 1, shape_differs, SELDP_ERR_SCHEMA,
        "group rank 1", "'final_norm.weight'",
        "shape [5], root (group rank 0, world rank 0) has shape [4]"),
    ROW("initialize: frozen flag differs on one rank", 3, INIT, 2, frozen_differs, SELDP_ERR_SCHEMA,
        "group rank 2", "'frozen.scale'",
        "it trainable, root (group rank 0, world rank 0) has it frozen"),
    ROW("initialize: alias untied on one rank", 3, INIT, 2, untie_lm_head, SELDP_ERR_SCHEMA,
        "at 'embed.weight': group rank 2", "{'embed.weight', 'lm_head.weight'}",
        "alias set {'embed.weight'} (untied: its own ParamId)"),
    ROW("initialize: alias tied on one rank only", 3, INIT, 1, select_heads, SELDP_ERR_SCHEMA,
        "at 'head.a': group rank 1", "has alias set {'head.a', 'head.b'}, root",
        "has alias set {'head.a'} (untied"),
    ROW("initialize: extra path on one rank", 3, INIT, 2, extra_path, SELDP_ERR_SCHEMA,
        "group rank 2", "'head.a'", "selected on group rank 2 (world rank 2) but not on root"),
    ROW("initialize: bucket_bytes 0", 3, INIT, ALL, bucket_zero, SELDP_ERR_INVALID_ARGUMENT,
        "group rank 0", "cfg.bucket_bytes must be positive", NULL),
    ROW("initialize: bucket_bytes differs on one rank", 3, INIT, 1, bucket_differs,
        SELDP_ERR_DISAGREE, "group rank 1 (world rank 1) passed 128", "cfg.bucket_bytes", NULL),
    {"initialize: one rank calls initialize_with_buffers",
     3,
     INIT,
     INIT_BUFFERS,
     2,
     nothing,
     SELDP_ERR_DISAGREE,
     {"group rank 2 (world rank 2) called seldp_session_initialize_with_buffers",
      "ranks called different functions", NULL},
     true,
     NULL},
    ROW_OK("initialize: zero-element parameter selected", 3, INIT, ALL, select_empty, holds_root),
    ROW("initialize: zero-length shape differs", 3, INIT, 2, select_empty_shape_differs,
        SELDP_ERR_SCHEMA, "group rank 2", "'empty.weight'",
        "shape [0, 4], root (group rank 0, world rank 0) has shape [0]"),
};

#define N_ROWS (sizeof MATRIX / sizeof MATRIX[0])

static void initialize_matrix(void **state)
{
    (void)state;
    bs_run_matrix(MATRIX, N_ROWS);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(initialize_matrix),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
