// The public API from C++17: <seldp/seldp.h> included from a .cpp file, the configuration
// initializers used as aggregates, and a one-rank host world driven through a session's
// initialize and reduce, with C linkage resolved against the C library.
#include <csetjmp>
#include <cstdarg>
#include <cstddef>
#include <cstdint>
#include <cstring>

extern "C" {
#include <cmocka.h>
}

#include <seldp/seldp.h>

namespace
{

seldp_device host_device()
{
    seldp_device device{};
    device.kind = SELDP_DEVICE_HOST;
    device.ordinal = 0;
    return device;
}

void value_helpers_work_from_cxx(void **)
{
    assert_int_equal(seldp_dtype_size(SELDP_BF16), 2);
    assert_string_equal(seldp_dtype_name(SELDP_F16), "f16");
    seldp_dtype parsed = SELDP_F32;
    assert_true(seldp_dtype_parse("bf16", &parsed));
    assert_int_equal(parsed, SELDP_BF16);
    assert_string_equal(seldp_status_name(SELDP_ERR_TIMEOUT), "SELDP_ERR_TIMEOUT");
    assert_int_equal(seldp_f32_to_bf16(1.0f), 0x3f80);
    assert_true(seldp_f16_to_f32(0x3c00) == 1.0f);
    assert_non_null(std::strstr(seldp_version(), "(transports: host"));

    const seldp_session_config session_cfg = SELDP_SESSION_CONFIG_INIT;
    const seldp_comm_config comm_cfg = SELDP_COMM_CONFIG_INIT;
    assert_true(session_cfg.bucket_bytes > 0);
    assert_true(comm_cfg.timeout_s > 0.0);

    float data[6] = {0};
    const int64_t shape[2] = {2, 3};
    seldp_tensor t = seldp_tensor_view(SELDP_F32, host_device(), data, 2, shape);
    assert_int_equal(seldp_tensor_numel(&t), 6);
    assert_int_equal(seldp_tensor_nbytes(&t), 24);
    char buf[32];
    assert_string_equal(seldp_shape_str(&t, buf, sizeof buf), "[2, 3]");
}

void session_reduce_from_cxx(void **)
{
    seldp_host_world *world = nullptr;
    seldp_comm *comm = nullptr;
    seldp_model *model = nullptr;
    seldp_session *session = nullptr;
    seldp_grads *grads = nullptr;
    float weight[4] = {1.0f, 2.0f, 3.0f, 4.0f};
    float grad[4] = {4.0f, -8.0f, 2.0f, 0.0f};
    const int64_t shape[1] = {4};
    const seldp_param_id ids[1] = {7};
    uint64_t global_weight = 0;

    assert_int_equal(seldp_host_world_create(1, nullptr, &world), SELDP_OK);
    assert_int_equal(seldp_host_comm_init(world, 0, host_device(), &comm), SELDP_OK);
    assert_int_equal(seldp_comm_size(comm), 1);
    assert_string_equal(seldp_comm_transport(comm), "host");

    assert_int_equal(seldp_model_create(0, &model), SELDP_OK);
    seldp_tensor t = seldp_tensor_view(SELDP_F32, host_device(), weight, 1, shape);
    assert_int_equal(seldp_model_add(model, "layer.weight", 7, &t, false, nullptr), SELDP_OK);
    assert_int_equal(seldp_session_initialize(comm, model, 0, ids, 1, nullptr, &session), SELDP_OK);

    assert_int_equal(seldp_grads_create(&grads), SELDP_OK);
    seldp_tensor g = seldp_tensor_view(SELDP_F32, host_device(), grad, 1, shape);
    assert_int_equal(seldp_grads_put(grads, 7, &g, SELDP_BORROWED), SELDP_OK);
    assert_int_equal(seldp_session_reduce(session, grads, 4, SELDP_MISSING_ERROR, &global_weight),
                     SELDP_OK);
    assert_int_equal(global_weight, 4);
    const seldp_tensor *reduced = seldp_grads_get(grads, 7);
    assert_non_null(reduced);
    const float *r = static_cast<const float *>(reduced->data);
    // One rank: the weighted mean is the loss-sum gradient divided by the token count.
    assert_true(r[0] == 1.0f && r[1] == -2.0f && r[2] == 0.5f && r[3] == 0.0f);
    // The parameter itself was broadcast from the only rank: unchanged.
    assert_true(weight[0] == 1.0f && weight[3] == 4.0f);

    seldp_grads_destroy(grads);
    seldp_session_destroy(session);
    seldp_model_destroy(model);
    seldp_comm_destroy(comm);
    seldp_host_world_destroy(world);
}

} // namespace

int main()
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(value_helpers_work_from_cxx),
        cmocka_unit_test(session_reduce_from_cxx),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
