/* The bad-input matrix of the model view, the gradient container and tensors (docs/library.md,
 * Model view): one row per malformed call. Each row starts from the same fixture (a model with a
 * tied alias and a frozen parameter, a container with a borrowed and an owned entry), makes one
 * call, and checks the documented status, that the message names the rank, the path and
 * what was expected, and that the view, the container and every tensor's bytes are exactly
 * as before (snapshots). Rows that succeed check what changed instead. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "contract.h"

#define FIXTURE_RANK 3

/* The fixture: "a.weight" F32 [2, 3] (id 1), "b.scale" F16 [4] frozen (id 2), "c.weight"
 * tied to a.weight; gradients of id 1 (borrowed) and id 5 (owned). */
typedef struct fixture {
    test_model m;
    test_grads g;
    /* the view as registered: path, id, descriptor and flag of every occurrence */
    size_t count;
    seldp_param params[8];
    grads_snapshot grads_before;
    seldp_grads *other; /* a second container for merges: id 5 (borrowed) and id 9 */
    float other_bytes[2][4];
    float spare[6]; /* storage the rows register or put */
} fixture;

static void fixture_init(fixture *f)
{
    memset(f, 0, sizeof *f);
    assert_int_equal(ct_init(&f->m, FIXTURE_RANK), SELDP_OK);
    assert_int_equal(ct_add(&f->m, "a.weight", 1, SELDP_F32, false, 1, 2, SHAPE(2, 3)), SELDP_OK);
    assert_int_equal(ct_add(&f->m, "b.scale", 2, SELDP_F16, true, 2, 1, SHAPE(4)), SELDP_OK);
    assert_int_equal(ct_tie(&f->m, "c.weight", "a.weight"), SELDP_OK);
    ct_snapshot(&f->m);
    f->count = seldp_model_count(f->m.model);
    for (size_t i = 0; i < f->count; i++)
        f->params[i] = *seldp_model_at(f->m.model, i);
    assert_int_equal(tg_init(&f->g), SELDP_OK);
    assert_int_equal(tg_put(&f->g, 1, SELDP_F32, false, 3, 2, SHAPE(2, 3), NULL), SELDP_OK);
    assert_int_equal(tg_put(&f->g, 5, SELDP_F32, true, 4, 1, SHAPE(4), NULL), SELDP_OK);
    gs_take(&f->grads_before, f->g.grads);
    assert_int_equal(seldp_grads_create(&f->other), SELDP_OK);
    seldp_tensor t =
        seldp_tensor_view(SELDP_F32, SELDP_HOST_DEVICE, f->other_bytes[0], 1, SHAPE(4));
    assert_int_equal(seldp_grads_put(f->other, 5, &t, SELDP_BORROWED), SELDP_OK);
    t.data = f->other_bytes[1];
    assert_int_equal(seldp_grads_put(f->other, 9, &t, SELDP_BORROWED), SELDP_OK);
}

static void fixture_free(fixture *f)
{
    gs_free(&f->grads_before);
    seldp_grads_destroy(f->other);
    tg_free(&f->g);
    ct_free(&f->m);
}

/* The view lists the same occurrences (path, id, descriptor, flag) and every tensor and
 * gradient holds the same bytes. */
static bool fixture_unchanged(const fixture *f, char *why, size_t size)
{
    if (seldp_model_count(f->m.model) != f->count) {
        snprintf(why, size, "the view holds %zu paths, expected %zu", seldp_model_count(f->m.model),
                 f->count);
        return false;
    }
    for (size_t i = 0; i < f->count; i++) {
        const seldp_param *p = seldp_model_at(f->m.model, i);
        const seldp_param *q = &f->params[i];
        if (strcmp(p->path, q->path) != 0 || p->id != q->id || p->frozen != q->frozen ||
            memcmp(&p->tensor, &q->tensor, sizeof p->tensor) != 0) {
            snprintf(why, size, "occurrence %zu ('%s') changed", i, q->path);
            return false;
        }
    }
    return ct_unchanged(&f->m, why, size) && gs_same(&f->grads_before, f->g.grads, why, size);
}

/* --- the calls -------------------------------------------------------------------------- */

static seldp_tensor spare(fixture *f, seldp_dtype dtype, int ndim, const int64_t *shape)
{
    return seldp_tensor_view(dtype, SELDP_HOST_DEVICE, f->spare, ndim, shape);
}

/* the tensor already registered as a.weight, changed by the row */
static seldp_tensor a_weight(fixture *f)
{
    return ct_find(&f->m, "a.weight")->tensor;
}

static seldp_status add_model_null(fixture *f)
{
    seldp_tensor t = spare(f, SELDP_F32, 1, SHAPE(4));
    return seldp_model_add(NULL, "x", 7, &t, false, NULL);
}
static seldp_status add_path_null(fixture *f)
{
    seldp_tensor t = spare(f, SELDP_F32, 1, SHAPE(4));
    return seldp_model_add(f->m.model, NULL, 7, &t, false, NULL);
}
static seldp_status add_path_empty(fixture *f)
{
    seldp_tensor t = spare(f, SELDP_F32, 1, SHAPE(4));
    return seldp_model_add(f->m.model, "", 7, &t, false, NULL);
}
static seldp_status add_tensor_null(fixture *f)
{
    return seldp_model_add(f->m.model, "x.weight", 7, NULL, false, NULL);
}
static seldp_status add_path_twice(fixture *f)
{
    seldp_tensor t = spare(f, SELDP_F32, 1, SHAPE(4));
    return seldp_model_add(f->m.model, "b.scale", 7, &t, false, NULL);
}
static seldp_status tie_other_storage(fixture *f)
{
    seldp_tensor t = a_weight(f);
    t.data = f->spare;
    return seldp_model_add(f->m.model, "d.weight", 1, &t, false, NULL);
}
static seldp_status tie_other_shape(fixture *f)
{
    seldp_tensor t = a_weight(f);
    t.shape[0] = 3;
    t.shape[1] = 2;
    return seldp_model_add(f->m.model, "d.weight", 1, &t, false, NULL);
}
static seldp_status tie_other_dtype(fixture *f)
{
    seldp_tensor t = a_weight(f);
    t.dtype = SELDP_I32;
    return seldp_model_add(f->m.model, "d.weight", 1, &t, false, NULL);
}
static seldp_status tie_other_frozen(fixture *f)
{
    seldp_tensor t = a_weight(f);
    return seldp_model_add(f->m.model, "d.weight", 1, &t, true, NULL);
}
static seldp_status tie_other_device(fixture *f)
{
    seldp_tensor t = a_weight(f);
    t.device = (seldp_device){SELDP_DEVICE_CUDA, 1};
    return seldp_model_add(f->m.model, "d.weight", 1, &t, false, NULL);
}
static seldp_status add_ndim_9(fixture *f)
{
    seldp_tensor t = spare(f, SELDP_F32, 1, SHAPE(4));
    t.ndim = 9;
    return seldp_model_add(f->m.model, "x.weight", 7, &t, false, NULL);
}
static seldp_status add_ndim_negative(fixture *f)
{
    seldp_tensor t = spare(f, SELDP_F32, 1, SHAPE(4));
    t.ndim = -1;
    return seldp_model_add(f->m.model, "x.weight", 7, &t, false, NULL);
}
static seldp_status add_extent_negative(fixture *f)
{
    seldp_tensor t = spare(f, SELDP_F32, 2, SHAPE(2, -2));
    return seldp_model_add(f->m.model, "x.weight", 7, &t, false, NULL);
}
static seldp_status add_data_null(fixture *f)
{
    seldp_tensor t = spare(f, SELDP_F32, 2, SHAPE(2, 3));
    t.data = NULL;
    return seldp_model_add(f->m.model, "x.weight", 7, &t, false, NULL);
}
static seldp_status add_dtype_invalid(fixture *f)
{
    seldp_tensor t = spare(f, SELDP_F32, 1, SHAPE(4));
    t.dtype = SELDP_DTYPE_COUNT;
    return seldp_model_add(f->m.model, "x.weight", 7, &t, false, NULL);
}
static seldp_status add_bytes_overflow(fixture *f)
{
    seldp_tensor t = spare(f, SELDP_F64, 3, SHAPE(INT64_C(1) << 30, INT64_C(1) << 30, 16));
    return seldp_model_add(f->m.model, "x.weight", 7, &t, false, NULL);
}
static seldp_status add_device_invalid(fixture *f)
{
    seldp_tensor t = spare(f, SELDP_F32, 1, SHAPE(4));
    t.device.kind = (seldp_device_kind)7;
    return seldp_model_add(f->m.model, "x.weight", 7, &t, false, NULL);
}
static seldp_status add_ordinal_negative(fixture *f)
{
    seldp_tensor t = spare(f, SELDP_F32, 1, SHAPE(4));
    t.device = (seldp_device){SELDP_DEVICE_CUDA, -1};
    return seldp_model_add(f->m.model, "x.weight", 7, &t, false, NULL);
}
static seldp_status add_zero_elements(fixture *f)
{
    seldp_tensor t = spare(f, SELDP_F32, 2, SHAPE(0, 5));
    t.data = NULL;
    return seldp_model_add(f->m.model, "e.weight", 7, &t, false, NULL);
}
static seldp_status add_scalar(fixture *f)
{
    seldp_tensor t = spare(f, SELDP_F32, 0, NULL);
    return seldp_model_add(f->m.model, "s.scalar", 8, &t, false, NULL);
}
static seldp_status create_out_null(fixture *f)
{
    (void)f;
    return seldp_model_create(0, NULL);
}

static seldp_status put_grads_null(fixture *f)
{
    seldp_tensor t = spare(f, SELDP_F32, 1, SHAPE(4));
    return seldp_grads_put(NULL, 7, &t, SELDP_BORROWED);
}
static seldp_status put_id_twice(fixture *f)
{
    seldp_tensor t = spare(f, SELDP_F32, 1, SHAPE(4));
    return seldp_grads_put(f->g.grads, 5, &t, SELDP_OWNED);
}
static seldp_status put_tensor_null(fixture *f)
{
    return seldp_grads_put(f->g.grads, 7, NULL, SELDP_BORROWED);
}
static seldp_status put_ndim_9(fixture *f)
{
    seldp_tensor t = spare(f, SELDP_F32, 1, SHAPE(4));
    t.ndim = 9;
    return seldp_grads_put(f->g.grads, 7, &t, SELDP_BORROWED);
}
static seldp_status put_ownership_invalid(fixture *f)
{
    seldp_tensor t = spare(f, SELDP_F32, 1, SHAPE(4));
    return seldp_grads_put(f->g.grads, 7, &t, (seldp_ownership)3);
}
static seldp_status put_zero_elements(fixture *f)
{
    seldp_tensor t = spare(f, SELDP_BF16, 1, SHAPE(0));
    t.data = NULL;
    return seldp_grads_put(f->g.grads, 7, &t, SELDP_BORROWED);
}
static seldp_status merge_overlap(fixture *f)
{
    return seldp_grads_merge(f->g.grads, f->other);
}
static seldp_status merge_into_itself(fixture *f)
{
    return seldp_grads_merge(f->g.grads, f->g.grads);
}
static seldp_status merge_null(fixture *f)
{
    return seldp_grads_merge(f->g.grads, NULL);
}
static seldp_status partition_ids_null(fixture *f)
{
    seldp_grads *sel = NULL, *rest = NULL;
    return seldp_grads_partition(f->g.grads, NULL, 3, &sel, &rest);
}
static seldp_status partition_out_null(fixture *f)
{
    seldp_param_id ids[1] = {1};
    seldp_grads *sel = NULL;
    return seldp_grads_partition(f->g.grads, ids, 1, &sel, NULL);
}
static seldp_status copy_layout_differs(fixture *f)
{
    seldp_tensor dst = spare(f, SELDP_F32, 1, SHAPE(6));
    seldp_tensor src = a_weight(f);
    return seldp_tensor_copy(&dst, &src);
}
static seldp_status alloc_ndim_9(fixture *f)
{
    seldp_tensor t = spare(f, SELDP_F32, 1, SHAPE(4));
    t.ndim = 9;
    t.data = NULL;
    return seldp_tensor_alloc(&t);
}

/* --- checks of rows that succeed ------------------------------------------------------------ */

static bool one_more_path(fixture *f, const char *path, char *why, size_t size)
{
    const seldp_param *p = seldp_model_find_path(f->m.model, path);
    if (seldp_model_count(f->m.model) != f->count + 1 || !p) {
        snprintf(why, size, "'%s' is not registered, or the count is not %zu", path, f->count + 1);
        return false;
    }
    return ct_unchanged(&f->m, why, size);
}

static bool zero_elements_registered(fixture *f, char *why, size_t size)
{
    const seldp_param *p = seldp_model_find_path(f->m.model, "e.weight");
    if (!one_more_path(f, "e.weight", why, size))
        return false;
    if (seldp_tensor_numel(&p->tensor) != 0 || seldp_tensor_nbytes(&p->tensor) != 0) {
        snprintf(why, size, "e.weight has %zu elements", seldp_tensor_numel(&p->tensor));
        return false;
    }
    return true;
}

static bool scalar_registered(fixture *f, char *why, size_t size)
{
    const seldp_param *p = seldp_model_find_path(f->m.model, "s.scalar");
    if (!one_more_path(f, "s.scalar", why, size))
        return false;
    if (seldp_tensor_numel(&p->tensor) != 1) {
        snprintf(why, size, "a scalar has %zu elements", seldp_tensor_numel(&p->tensor));
        return false;
    }
    return true;
}

static bool zero_element_gradient_put(fixture *f, char *why, size_t size)
{
    const seldp_tensor *t = seldp_grads_get(f->g.grads, 7);
    if (!t || seldp_grads_count(f->g.grads) != 3 || seldp_tensor_nbytes(t) != 0) {
        snprintf(why, size, "the zero-element gradient is not in the container");
        return false;
    }
    seldp_grads_remove(f->g.grads, 7);
    return gs_same(&f->grads_before, f->g.grads, why, size);
}

/* --- the matrix ------------------------------------------------------------------------------ */

typedef struct mrow {
    const char *name;
    seldp_status (*call)(fixture *f);
    seldp_status expected;
    const char *needles[3];
    bool (*after)(fixture *f, char *why, size_t size); /* NULL: everything unchanged */
} mrow;

static const mrow MATRIX[] = {
    /* name                                   call                  expected needles */
    {"model_add: model NULL",
     add_model_null,
     SELDP_ERR_INVALID_ARGUMENT,
     {"model_add", "model is NULL"},
     NULL},
    {"model_add: path NULL",
     add_path_null,
     SELDP_ERR_INVALID_ARGUMENT,
     {"rank 3", "empty parameter path", "id 7"},
     NULL},
    {"model_add: path empty",
     add_path_empty,
     SELDP_ERR_INVALID_ARGUMENT,
     {"rank 3", "empty parameter path", "id 7"},
     NULL},
    {"model_add: tensor NULL",
     add_tensor_null,
     SELDP_ERR_INVALID_ARGUMENT,
     {"rank 3", "'x.weight'", "tensor is NULL"},
     NULL},
    {"model_add: path registered twice",
     add_path_twice,
     SELDP_ERR_DUPLICATE,
     {"rank 3", "'b.scale' is already registered (id 2)", "paths must be unique"},
     NULL},
    {"model_add: tie to other storage",
     tie_other_storage,
     SELDP_ERR_ALIAS,
     {"rank 3", "'d.weight' ties id 1 to 'a.weight'", "storage (data pointer) differs"},
     NULL},
    {"model_add: tie with another shape",
     tie_other_shape,
     SELDP_ERR_ALIAS,
     {"rank 3", "'d.weight' ties id 1 to 'a.weight'", "shape differs (f32 [3, 2] vs f32 [2, 3])"},
     NULL},
    {"model_add: tie with another dtype",
     tie_other_dtype,
     SELDP_ERR_ALIAS,
     {"rank 3", "'d.weight'", "dtype differs (i32 [2, 3] vs f32 [2, 3])"},
     NULL},
    {"model_add: tie with another frozen flag",
     tie_other_frozen,
     SELDP_ERR_ALIAS,
     {"rank 3", "'d.weight'", "frozen flag differs"},
     NULL},
    {"model_add: tie on another device",
     tie_other_device,
     SELDP_ERR_ALIAS,
     {"rank 3", "'d.weight'", "device differs"},
     NULL},
    {"model_add: ndim 9",
     add_ndim_9,
     SELDP_ERR_INVALID_ARGUMENT,
     {"rank 3", "'x.weight'", "ndim 9 outside 0..8"},
     NULL},
    {"model_add: ndim -1",
     add_ndim_negative,
     SELDP_ERR_INVALID_ARGUMENT,
     {"rank 3", "'x.weight'", "ndim -1 outside 0..8"},
     NULL},
    {"model_add: negative extent",
     add_extent_negative,
     SELDP_ERR_INVALID_ARGUMENT,
     {"rank 3", "'x.weight'", "extent 1 is -2, expected >= 0"},
     NULL},
    {"model_add: data NULL for 24 bytes",
     add_data_null,
     SELDP_ERR_INVALID_ARGUMENT,
     {"rank 3", "'x.weight'", "data is NULL for 24 bytes"},
     NULL},
    {"model_add: dtype outside the enum",
     add_dtype_invalid,
     SELDP_ERR_INVALID_ARGUMENT,
     {"rank 3", "'x.weight'", "invalid dtype 13"},
     NULL},
    {"model_add: byte size overflows size_t",
     add_bytes_overflow,
     SELDP_ERR_INVALID_ARGUMENT,
     {"rank 3", "'x.weight'", "overflows size_t"},
     NULL},
    {"model_add: device kind 7",
     add_device_invalid,
     SELDP_ERR_INVALID_ARGUMENT,
     {"rank 3", "'x.weight'", "invalid device kind 7"},
     NULL},
    {"model_add: CUDA ordinal -1",
     add_ordinal_negative,
     SELDP_ERR_INVALID_ARGUMENT,
     {"rank 3", "'x.weight'", "negative CUDA ordinal -1"},
     NULL},
    {"model_add: zero elements, data NULL",
     add_zero_elements,
     SELDP_OK,
     {NULL},
     zero_elements_registered},
    {"model_add: scalar (ndim 0)", add_scalar, SELDP_OK, {NULL}, scalar_registered},
    {"model_create: out NULL", create_out_null, SELDP_ERR_INVALID_ARGUMENT, {"model_create"}, NULL},
    {"grads_put: container NULL",
     put_grads_null,
     SELDP_ERR_INVALID_ARGUMENT,
     {"grads_put", "container is NULL"},
     NULL},
    {"grads_put: id already present",
     put_id_twice,
     SELDP_ERR_DUPLICATE,
     {"gradient of id 5", "already in the container", "one per id"},
     NULL},
    {"grads_put: tensor NULL",
     put_tensor_null,
     SELDP_ERR_INVALID_ARGUMENT,
     {"gradient of id 7", "descriptor is NULL"},
     NULL},
    {"grads_put: ndim 9",
     put_ndim_9,
     SELDP_ERR_INVALID_ARGUMENT,
     {"gradient of id 7", "ndim 9 outside 0..8"},
     NULL},
    {"grads_put: ownership 3",
     put_ownership_invalid,
     SELDP_ERR_INVALID_ARGUMENT,
     {"gradient of id 7", "invalid ownership 3"},
     NULL},
    {"grads_put: zero elements, data NULL",
     put_zero_elements,
     SELDP_OK,
     {NULL},
     zero_element_gradient_put},
    {"grads_merge: an id in both",
     merge_overlap,
     SELDP_ERR_DUPLICATE,
     {"gradient of id 5 is in both containers", "disjoint ids"},
     NULL},
    {"grads_merge: into itself",
     merge_into_itself,
     SELDP_ERR_DUPLICATE,
     {"cannot merge into itself"},
     NULL},
    {"grads_merge: from NULL",
     merge_null,
     SELDP_ERR_INVALID_ARGUMENT,
     {"grads_merge", "NULL container"},
     NULL},
    {"grads_partition: ids NULL with a count",
     partition_ids_null,
     SELDP_ERR_INVALID_ARGUMENT,
     {"grads_partition", "NULL argument"},
     NULL},
    {"grads_partition: untouched NULL",
     partition_out_null,
     SELDP_ERR_INVALID_ARGUMENT,
     {"grads_partition", "NULL argument"},
     NULL},
    {"tensor_copy: layouts differ",
     copy_layout_differs,
     SELDP_ERR_SHAPE,
     {"tensor_copy", "f32 [6] but source is f32 [2, 3]", "same layout"},
     NULL},
    {"tensor_alloc: ndim 9",
     alloc_ndim_9,
     SELDP_ERR_INVALID_ARGUMENT,
     {"tensor_alloc", "ndim 9 outside 0..8"},
     NULL},
};

#define N_ROWS (sizeof MATRIX / sizeof MATRIX[0])

static void bad_input_matrix(void **state)
{
    (void)state;
    for (size_t i = 0; i < N_ROWS; i++) {
        const mrow *r = &MATRIX[i];
        fixture *f = calloc(1, sizeof *f);
        char why[512] = "";
        assert_non_null(f);
        fixture_init(f);
        seldp_clear_error();
        seldp_status st = r->call(f);
        const char *msg = seldp_last_error();
        if (getenv("SELDP_TEST_VERBOSE"))
            printf("  %-42s %-27s %s\n", r->name, seldp_status_name(st), msg);
        if (st != r->expected)
            fail_msg("%s: returned %s, expected %s (message: %s)", r->name, seldp_status_name(st),
                     seldp_status_name(r->expected), msg);
        for (int n = 0; n < 3 && st != SELDP_OK; n++)
            if (r->needles[n] && !strstr(msg, r->needles[n]))
                fail_msg("%s: the message lacks \"%s\": %s", r->name, r->needles[n], msg);
        if (r->after ? !r->after(f, why, sizeof why) : !fixture_unchanged(f, why, sizeof why))
            fail_msg("%s: %s", r->name, why);
        fixture_free(f);
        free(f);
    }
    printf("  %zu rows\n", N_ROWS);
}

/* The read-only queries answer NULL, 0 or false outside their domain instead of crashing. */
static void queries_outside_their_domain(void **state)
{
    (void)state;
    fixture f;
    fixture_init(&f);
    assert_null(seldp_model_at(f.m.model, f.count));
    assert_null(seldp_model_at(NULL, 0));
    assert_null(seldp_model_find_path(f.m.model, NULL));
    assert_null(seldp_model_find_path(f.m.model, ""));
    assert_null(seldp_model_find_id(f.m.model, 42));
    assert_int_equal(seldp_model_aliases(f.m.model, 42, NULL, 0), 0);
    assert_int_equal(seldp_model_aliases(f.m.model, 1, NULL, 0), 2); /* counts without out */
    assert_int_equal(seldp_model_count(NULL), 0);
    assert_int_equal(seldp_model_rank(NULL), -1);
    assert_null(seldp_grads_get(f.g.grads, 42));
    assert_null(seldp_grads_get(NULL, 1));
    assert_false(seldp_grads_remove(f.g.grads, 42));
    assert_false(seldp_grads_take(f.g.grads, 42, NULL, NULL));
    assert_int_equal(seldp_grads_count(NULL), 0);
    seldp_param_id id;
    const seldp_tensor *t;
    assert_false(seldp_grads_at(f.g.grads, 2, &id, &t));
    assert_non_null(seldp_status_name((seldp_status)999)); /* never NULL */
    assert_string_equal(seldp_dtype_name((seldp_dtype)-1), "invalid");
    assert_int_equal(seldp_dtype_size(SELDP_DTYPE_COUNT), 0);
    char why[256];
    assert_true(fixture_unchanged(&f, why, sizeof why));
    fixture_free(&f);
    /* every NULL-tolerant destructor */
    seldp_model_destroy(NULL);
    seldp_grads_destroy(NULL);
    seldp_tensor_free(NULL);
    seldp_session_destroy(NULL);
    seldp_comm_destroy(NULL);
    seldp_host_world_destroy(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(bad_input_matrix),
        cmocka_unit_test(queries_outside_their_domain),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
