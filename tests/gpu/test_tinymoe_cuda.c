/* tiny-moe on the GPU (models/cuda) against the CPU model and the FP64 reference: the loss,
 * every FP32 gradient accumulator (within 1e-5 of the reference, as the CPU model) and the
 * exported device gradients in FP32 and in the storage dtype (the fixed per-dtype limits: 2e-3 F16,
 * 1e-2 BF16), for every quant variant; identical bits on a second run; a device view whose storage
 * round trips to the host model. Exits 77 without a GPU. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cuda/tinymoe_cuda.h"
#include "gpu_ranks.h"
#include "tinymoe.h"

#define T_TOKENS 45

static const seldp_device dev0 = {SELDP_DEVICE_CUDA, 0};

static tm_config config_for(tm_quant quant, seldp_dtype dtype)
{
    tm_config cfg = TM_CONFIG_INIT;
    cfg.vocab = 48;
    cfg.d_model = 64;
    cfg.d_ff = 64;
    cfg.experts = 4;
    cfg.top_k = 2;
    cfg.layers = 3;
    cfg.dtype = dtype;
    cfg.quant = quant;
    cfg.lora_rank = 4;
    cfg.lora_alpha = 8.0;
    cfg.seed = 11;
    return cfg;
}

static void draw_tokens(uint64_t seed, size_t n, int V, int32_t *tokens, int32_t *targets)
{
    for (size_t i = 0; i < n; i++) {
        tokens[i] = (int32_t)(tm_splitmix64(&seed) % (uint64_t)V);
        targets[i] = (int32_t)(tm_splitmix64(&seed) % (uint64_t)V);
    }
}

static tm_model *model_all_experts(const tm_config *cfg)
{
    int ids[16];
    for (int e = 0; e < cfg->experts; e++)
        ids[e] = e;
    tm_model *m = NULL;
    if (tm_model_create(cfg, 0, ids, cfg->experts, NULL, NULL, &m) != SELDP_OK)
        fail_msg("tm_model_create: %s", seldp_last_error());
    return m;
}

/* Host copy of n floats at a device pointer; the caller frees it. */
static float *fetch(const float *d, size_t n)
{
    float *h = malloc((n ? n : 1) * sizeof *h);
    assert_non_null(h);
    assert_int_equal(gpu_download(dev0, h, d, n * sizeof *h), SELDP_OK);
    return h;
}

/* ||scale * got - want|| / ||want||, printing the worst element. */
static double rel_err(const char *what, const float *got, double scale, const double *want,
                      size_t n)
{
    double num = 0.0, den = 0.0, worst = -1.0;
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        double d = scale * (double)got[i] - want[i];
        num += d * d;
        den += want[i] * want[i];
        if (fabs(d) > worst) {
            worst = fabs(d);
            at = i;
        }
    }
    double rel = den > 0.0 ? sqrt(num / den) : sqrt(num);
    if (n)
        printf("  %-36s rel %.3e  worst [%zu] got %.9g want %.9g\n", what, rel, at,
               scale * (double)got[at], want[at]);
    return rel;
}

static void check_variant(tm_quant quant, seldp_dtype dtype)
{
    tm_config cfg = config_for(quant, dtype);
    printf(" quant %s dtype %s\n", tm_quant_name(quant), tm_dtype_name(dtype));
    tm_model *host = model_all_experts(&cfg);
    tmc_model *gpu = NULL;
    assert_int_equal(tmc_model_create(host, 0, &gpu), SELDP_OK);
    int32_t tokens[T_TOKENS], targets[T_TOKENS];
    draw_tokens(42, T_TOKENS, cfg.vocab, tokens, targets);

    double cpu_loss = 0.0, gpu_loss = 0.0, again = 0.0;
    assert_int_equal(tm_step_local(host, tokens, targets, T_TOKENS, &cpu_loss), SELDP_OK);
    if (tmc_step_local(gpu, tokens, targets, T_TOKENS, &gpu_loss) != SELDP_OK)
        fail_msg("tmc_step_local: %s", seldp_last_error());

    const int32_t *tok[1] = {tokens}, *tgt[1] = {targets};
    const size_t counts[1] = {T_TOKENS};
    tm_reference *ref = NULL;
    assert_int_equal(
        tm_reference_compute(&cfg, tm_model_view(host), tok, tgt, counts, 1, NULL, &ref), SELDP_OK);
    double loss_ref = tm_reference_loss(ref);
    printf("  loss/T gpu %.9f cpu %.9f reference %.9f\n", gpu_loss / T_TOKENS, cpu_loss / T_TOKENS,
           loss_ref);
    assert_true(fabs(gpu_loss / T_TOKENS - loss_ref) <= 1e-6 * fabs(loss_ref));

    seldp_grads *fp32 = NULL, *native = NULL;
    assert_int_equal(seldp_grads_create(&fp32), SELDP_OK);
    assert_int_equal(seldp_grads_create(&native), SELDP_OK);
    assert_int_equal(tmc_export_grads(gpu, TM_ROLES_ALL, 1.0 / T_TOKENS, true, fp32), SELDP_OK);
    assert_int_equal(tmc_export_grads(gpu, TM_ROLES_ALL, 1.0 / T_TOKENS, false, native), SELDP_OK);
    const double native_tol = dtype == SELDP_F32 ? 1e-5 : (dtype == SELDP_F16 ? 2e-3 : 1e-2);

    size_t expected = 0;
    float **first_run = calloc(tm_param_count(host), sizeof *first_run);
    assert_non_null(first_run);
    for (size_t i = 0; i < tm_param_count(host); i++) {
        const tm_param_info *p = tm_param_at(host, i);
        size_t n = 0;
        const double *g = tm_reference_grad(ref, p->path, &n);
        const float *acc = tmc_param_grad(gpu, p->path);
        if (p->frozen) {
            assert_null(g);
            assert_null(acc);
            assert_null(seldp_grads_get(fp32, p->id));
            continue;
        }
        assert_non_null(acc);
        if (p->expert >= 0)
            assert_int_equal(tmc_expert_seen(gpu, p->layer, p->expert),
                             tm_expert_seen(host, p->layer, p->expert));
        if (!p->alias && (p->expert < 0 || tm_expert_seen(host, p->layer, p->expert)))
            expected++;
        const seldp_tensor *a = seldp_grads_get(fp32, p->id);
        const seldp_tensor *b = seldp_grads_get(native, p->id);
        if (!g) {
            assert_null(a);
            continue;
        }
        assert_non_null(a);
        assert_non_null(b);
        assert_int_equal(a->device.kind, SELDP_DEVICE_CUDA);
        assert_int_equal(seldp_grads_ownership(fp32, p->id), SELDP_OWNED);
        assert_int_equal(a->dtype, SELDP_F32);
        assert_int_equal(b->dtype, dtype);
        assert_true(seldp_tensor_numel(a) == n);

        /* the accumulator: the loss-sum gradient, 1/T of it is the mean's */
        float *h = fetch(acc, n);
        assert_true(rel_err(p->path, h, 1.0 / T_TOKENS, g, n) <= 1e-5);
        /* and the CPU model's accumulator */
        const float *cpu = tm_param_grad(host, p->path);
        double *cpu_d = malloc(n * sizeof *cpu_d);
        assert_non_null(cpu_d);
        for (size_t k = 0; k < n; k++)
            cpu_d[k] = cpu[k];
        assert_true(rel_err("  vs the CPU model", h, 1.0, cpu_d, n) <= 2e-5);
        free(cpu_d);
        first_run[i] = h;

        /* the exported device tensors, read back */
        size_t nb = seldp_tensor_nbytes(b);
        void *hb = malloc(nb);
        float *ha = fetch(a->data, n);
        assert_non_null(hb);
        assert_int_equal(gpu_download(dev0, hb, b->data, nb), SELDP_OK);
        seldp_tensor va = seldp_tensor_view(SELDP_F32, SELDP_HOST_DEVICE, ha, a->ndim, a->shape);
        seldp_tensor vb = seldp_tensor_view(dtype, SELDP_HOST_DEVICE, hb, b->ndim, b->shape);
        double e32 = tm_rel_error(&va, 1.0, g, n), enat = tm_rel_error(&vb, 1.0, g, n);
        assert_true(e32 >= 0.0 && e32 <= 1e-5);
        assert_true(enat >= 0.0 && enat <= native_tol);
        free(ha);
        free(hb);
    }
    assert_int_equal(seldp_grads_count(fp32), expected);
    assert_int_equal(seldp_grads_count(native), expected);

    /* a second step gives the same bits: fixed-order reductions, zeroed accumulators */
    assert_int_equal(tmc_step_local(gpu, tokens, targets, T_TOKENS, &again), SELDP_OK);
    assert_true(again == gpu_loss);
    for (size_t i = 0; i < tm_param_count(host); i++) {
        if (!first_run[i])
            continue;
        const tm_param_info *p = tm_param_at(host, i);
        size_t n = seldp_tensor_numel(&p->tensor);
        float *h = fetch(tmc_param_grad(gpu, p->path), n);
        if (memcmp(h, first_run[i], n * sizeof *h) != 0)
            fail_msg("%s: a second identical step gave other bits", p->path);
        free(h);
        free(first_run[i]);
    }
    free(first_run);
    seldp_grads_destroy(fp32);
    seldp_grads_destroy(native);
    tm_reference_destroy(ref);
    tmc_model_destroy(gpu);
    tm_model_destroy(host);
}

static void test_none_f32(void **state)
{
    (void)state;
    check_variant(TM_QUANT_NONE, SELDP_F32);
}

static void test_none_bf16(void **state)
{
    (void)state;
    check_variant(TM_QUANT_NONE, SELDP_BF16);
}

static void test_none_f16(void **state)
{
    (void)state;
    check_variant(TM_QUANT_NONE, SELDP_F16);
}

static void test_nf4_f32(void **state)
{
    (void)state;
    check_variant(TM_QUANT_NF4, SELDP_F32);
}

static void test_awq_bf16(void **state)
{
    (void)state;
    check_variant(TM_QUANT_AWQ, SELDP_BF16);
}

/* The device view names device storage, and tmc_download_params brings it back to the host
 * model; a change made on the device shows up in the next step's working copies. */
static void test_view_and_download(void **state)
{
    (void)state;
    tm_config cfg = config_for(TM_QUANT_NONE, SELDP_F32);
    tm_model *host = model_all_experts(&cfg);
    tmc_model *gpu = NULL;
    assert_int_equal(tmc_model_create(host, 0, &gpu), SELDP_OK);
    seldp_model *view = tmc_model_view(gpu);
    assert_int_equal(seldp_model_count(view), tm_param_count(host));
    const seldp_param *head = seldp_model_find_path(view, "lm_head.weight");
    const seldp_param *embed = seldp_model_find_path(view, "embed.weight");
    assert_non_null(head);
    assert_non_null(embed);
    assert_true(head->id == embed->id && head->tensor.data == embed->tensor.data);
    assert_int_equal(embed->tensor.device.kind, SELDP_DEVICE_CUDA);

    const seldp_tensor *g = tmc_param_tensor(gpu, "final_norm.weight");
    assert_non_null(g);
    float twos[64];
    for (int i = 0; i < cfg.d_model; i++)
        twos[i] = 2.0f;
    assert_int_equal(gpu_upload(dev0, g->data, twos, (size_t)cfg.d_model * sizeof(float)),
                     SELDP_OK);
    assert_int_equal(tmc_download_params(gpu, host), SELDP_OK);
    const tm_param_info *p = tm_param_find(host, "final_norm.weight");
    assert_memory_equal(p->tensor.data, twos, (size_t)cfg.d_model * sizeof(float));
    tmc_model_destroy(gpu);
    tm_model_destroy(host);
}

int main(void)
{
    gpu_require();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_none_f32), cmocka_unit_test(test_none_bf16),
        cmocka_unit_test(test_none_f16), cmocka_unit_test(test_nf4_f32),
        cmocka_unit_test(test_awq_bf16), cmocka_unit_test(test_view_and_download),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
