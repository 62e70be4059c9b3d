/* tensor: descriptors, sizes, validation, allocation and copies on the host. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "seldp/seldp.h"

static void test_view_and_sizes(void **state)
{
    (void)state;
    float data[24];
    const int64_t shape[3] = {2, 3, 4};
    seldp_tensor t = seldp_tensor_view(SELDP_F32, SELDP_HOST_DEVICE, data, 3, shape);
    assert_int_equal(t.dtype, SELDP_F32);
    assert_int_equal(t.ndim, 3);
    assert_ptr_equal(t.data, data);
    assert_int_equal(t.device.kind, SELDP_DEVICE_HOST);
    assert_int_equal(t.shape[0], 2);
    assert_int_equal(t.shape[2], 4);
    assert_int_equal(t.shape[3], 0); /* unused extents are cleared */
    assert_int_equal(seldp_tensor_numel(&t), 24);
    assert_int_equal(seldp_tensor_nbytes(&t), 96);
    assert_int_equal(seldp_tensor_check(&t, "t"), SELDP_OK);

    seldp_tensor scalar = seldp_tensor_view(SELDP_F64, SELDP_HOST_DEVICE, data, 0, NULL);
    assert_int_equal(seldp_tensor_numel(&scalar), 1);
    assert_int_equal(seldp_tensor_nbytes(&scalar), 8);

    const int64_t empty_shape[2] = {5, 0};
    seldp_tensor empty = seldp_tensor_view(SELDP_BF16, SELDP_HOST_DEVICE, NULL, 2, empty_shape);
    assert_int_equal(seldp_tensor_numel(&empty), 0);
    assert_int_equal(seldp_tensor_nbytes(&empty), 0);
    assert_int_equal(seldp_tensor_check(&empty, "empty"), SELDP_OK); /* NULL data is fine */

    char buf[64];
    assert_string_equal(seldp_shape_str(&t, buf, sizeof buf), "[2, 3, 4]");
    assert_string_equal(seldp_shape_str(&scalar, buf, sizeof buf), "[]");
    char tiny[5];
    seldp_shape_str(&t, tiny, sizeof tiny);
    assert_int_equal(strlen(tiny), 4); /* truncated, NUL-terminated */
    assert_memory_equal(tiny, "[2, ", 4);
}

static void test_same_layout(void **state)
{
    (void)state;
    const int64_t s1[2] = {3, 4}, s2[2] = {4, 3};
    float a[12], b[12];
    seldp_tensor x = seldp_tensor_view(SELDP_F32, SELDP_HOST_DEVICE, a, 2, s1);
    seldp_tensor y = seldp_tensor_view(SELDP_F32, (seldp_device){SELDP_DEVICE_CUDA, 1}, b, 2, s1);
    assert_true(seldp_tensor_same_layout(&x, &y)); /* devices and data may differ */
    y.shape[0] = 4;
    y.shape[1] = 3;
    assert_false(seldp_tensor_same_layout(&x, &y));
    seldp_tensor z = seldp_tensor_view(SELDP_I32, SELDP_HOST_DEVICE, b, 2, s1);
    assert_false(seldp_tensor_same_layout(&x, &z));
    seldp_tensor w = seldp_tensor_view(SELDP_F32, SELDP_HOST_DEVICE, b, 1, s2);
    w.shape[0] = 12;
    assert_false(seldp_tensor_same_layout(&x, &w));
}

static void expect_invalid(seldp_tensor t, const char *needle)
{
    seldp_clear_error();
    assert_int_equal(seldp_tensor_check(&t, "layers.0.w"), SELDP_ERR_INVALID_ARGUMENT);
    const char *msg = seldp_last_error();
    if (!strstr(msg, "layers.0.w") || !strstr(msg, needle))
        fail_msg("message '%s' should name the tensor and say '%s'", msg, needle);
}

static void test_check_rejects(void **state)
{
    (void)state;
    float data[4];
    const int64_t shape[1] = {4};
    seldp_tensor good = seldp_tensor_view(SELDP_F32, SELDP_HOST_DEVICE, data, 1, shape);

    seldp_tensor t = good;
    t.dtype = (seldp_dtype)77;
    expect_invalid(t, "dtype");
    t = good;
    t.ndim = -1;
    expect_invalid(t, "ndim");
    t = good;
    t.ndim = SELDP_MAX_DIMS + 1;
    expect_invalid(t, "ndim");
    t = good;
    t.shape[0] = -3;
    expect_invalid(t, "-3");
    t = good;
    t.data = NULL;
    expect_invalid(t, "NULL");
    t = good;
    t.device.kind = (seldp_device_kind)5;
    expect_invalid(t, "device");
    t = good;
    t.ndim = 3;
    t.shape[0] = INT64_MAX;
    t.shape[1] = INT64_MAX;
    t.shape[2] = 1;
    expect_invalid(t, "overflow");
    /* A zero extent makes any other extent harmless. */
    t.shape[2] = 0;
    t.data = NULL;
    assert_int_equal(seldp_tensor_check(&t, "x"), SELDP_OK);
    assert_int_equal(seldp_tensor_check(NULL, "x"), SELDP_ERR_INVALID_ARGUMENT);
    t = good;
    t.ndim = SELDP_MAX_DIMS;
    for (int i = 0; i < SELDP_MAX_DIMS; i++)
        t.shape[i] = 1;
    assert_int_equal(seldp_tensor_check(&t, "x"), SELDP_OK);
}

static void test_alloc_copy_free(void **state)
{
    (void)state;
    const int64_t shape[2] = {3, 5};
    seldp_tensor a = seldp_tensor_view(SELDP_I16, SELDP_HOST_DEVICE, NULL, 2, shape);
    assert_int_equal(seldp_tensor_alloc(&a), SELDP_OK);
    assert_non_null(a.data);
    const int16_t *za = a.data;
    for (int i = 0; i < 15; i++)
        assert_int_equal(za[i], 0); /* zeroed */

    int16_t src_data[15];
    for (int i = 0; i < 15; i++)
        src_data[i] = (int16_t)(i * 1000 - 7000);
    seldp_tensor src = seldp_tensor_view(SELDP_I16, SELDP_HOST_DEVICE, src_data, 2, shape);
    assert_int_equal(seldp_tensor_copy(&a, &src), SELDP_OK);
    assert_memory_equal(a.data, src_data, sizeof src_data);

    /* Layout mismatch: nothing copied, message names both layouts. */
    const int64_t other[2] = {5, 3};
    int16_t other_data[15] = {0};
    seldp_tensor b = seldp_tensor_view(SELDP_I16, SELDP_HOST_DEVICE, other_data, 2, other);
    assert_int_equal(seldp_tensor_copy(&b, &src), SELDP_ERR_SHAPE);
    assert_non_null(strstr(seldp_last_error(), "[5, 3]"));
    assert_non_null(strstr(seldp_last_error(), "[3, 5]"));
    for (int i = 0; i < 15; i++)
        assert_int_equal(other_data[i], 0);

    seldp_tensor_free(&a);
    assert_null(a.data);
    seldp_tensor_free(&a); /* twice is harmless */
    seldp_tensor_free(NULL);

    /* Zero elements still give a valid pointer to free. */
    const int64_t zero[1] = {0};
    seldp_tensor e = seldp_tensor_view(SELDP_F32, SELDP_HOST_DEVICE, NULL, 1, zero);
    assert_int_equal(seldp_tensor_alloc(&e), SELDP_OK);
    assert_non_null(e.data);
    seldp_tensor_free(&e);

    seldp_tensor bad = seldp_tensor_view((seldp_dtype)99, SELDP_HOST_DEVICE, NULL, 1, shape);
    assert_int_equal(seldp_tensor_alloc(&bad), SELDP_ERR_INVALID_ARGUMENT);
    assert_null(bad.data);
}

static void test_cuda_without_cuda(void **state)
{
    (void)state;
    if (seldp_has_feature("cuda"))
        skip();
    const int64_t shape[1] = {4};
    seldp_tensor t =
        seldp_tensor_view(SELDP_F32, (seldp_device){SELDP_DEVICE_CUDA, 0}, NULL, 1, shape);
    assert_int_equal(seldp_tensor_alloc(&t), SELDP_ERR_UNSUPPORTED);
    assert_null(t.data);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_view_and_sizes),    cmocka_unit_test(test_same_layout),
        cmocka_unit_test(test_check_rejects),     cmocka_unit_test(test_alloc_copy_free),
        cmocka_unit_test(test_cuda_without_cuda),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
