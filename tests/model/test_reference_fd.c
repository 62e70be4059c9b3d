/* The FP64 reference's gradient against central finite differences of its own loss, for
 * every parameter kind: tied embedding (through both paths), norms, routers, dense experts,
 * LoRA adapters over NF4 and AWQ bases, and the routing extensions (shared expert, router
 * losses, capacity dropping). Sampled elements per tensor; the relative error
 * over the sample must be <= 1e-6. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "model_util.h"

#define N_RANKS 2
#define SAMPLES 12
#define FD_STEP 1e-5

typedef struct fd_case {
    tm_config cfg;
    tm_model *global;
    int32_t tokens[N_RANKS][16];
    int32_t targets[N_RANKS][16];
    size_t counts[N_RANKS];
} fd_case;

static double loss_at(fd_case *c, const char *path, size_t index, double delta)
{
    const int32_t *tok[N_RANKS] = {c->tokens[0], c->tokens[1]};
    const int32_t *tgt[N_RANKS] = {c->targets[0], c->targets[1]};
    tm_ref_perturb p = {path, index, delta};
    tm_reference *ref = NULL;
    seldp_status st = tm_reference_compute(&c->cfg, tm_model_view(c->global), tok, tgt, c->counts,
                                           N_RANKS, &p, &ref);
    if (st != SELDP_OK)
        fail_msg("reference (%s[%zu] %+g): %s", path, index, delta, tm_last_error());
    double loss = tm_reference_loss(ref);
    tm_reference_destroy(ref);
    return loss;
}

/* Check every trainable path of the model whose role is in `roles`; returns the number of
 * assignments the capacity dropped (over every layer). */
static size_t check_fd_config(const tm_config *cfg, unsigned roles)
{
    fd_case c = {.cfg = *cfg, .counts = {5, 7}};
    c.global = model_all_experts(&c.cfg, 3);
    assert_non_null(c.global);
    for (int r = 0; r < N_RANKS; r++)
        draw_tokens(100 + (uint64_t)r, c.counts[r], c.cfg.vocab, c.tokens[r], c.targets[r]);
    const int32_t *tok[N_RANKS] = {c.tokens[0], c.tokens[1]};
    const int32_t *tgt[N_RANKS] = {c.targets[0], c.targets[1]};
    tm_reference *ref = NULL;
    assert_int_equal(tm_reference_compute(&c.cfg, tm_model_view(c.global), tok, tgt, c.counts,
                                          N_RANKS, NULL, &ref),
                     SELDP_OK);
    assert_int_equal(tm_reference_tokens(ref), 12);
    double base = loss_at(&c, "embed.weight", 0, 0.0);
    assert_true(fabs(base - tm_reference_loss(ref)) < 1e-15);

    int checked = 0;
    for (size_t i = 0; i < tm_param_count(c.global); i++) {
        const tm_param_info *p = tm_param_at(c.global, i);
        if (p->frozen || !(p->role & roles))
            continue;
        size_t n = 0;
        const double *g = tm_reference_grad(ref, p->path, &n);
        if (!g) {
            /* Only an expert that no token reached may lack a gradient. */
            assert_true(p->expert >= 0);
            assert_int_equal(tm_reference_routed(ref, p->layer, p->expert), 0);
            continue;
        }
        assert_int_equal(n, seldp_tensor_numel(&p->tensor));
        double num = 0.0, den = 0.0;
        uint64_t pick = tm_hash_path(p->path);
        for (int s = 0; s < SAMPLES; s++) {
            size_t k = (size_t)(tm_splitmix64(&pick) % n);
            double fd = (loss_at(&c, p->path, k, FD_STEP) - loss_at(&c, p->path, k, -FD_STEP)) /
                        (2.0 * FD_STEP);
            num += (fd - g[k]) * (fd - g[k]);
            den += g[k] * g[k];
        }
        double rel = sqrt(num / (den > 0 ? den : 1.0));
        printf("  %-36s fd rel %.2e (|g| %.2e)\n", p->path, rel, sqrt(den));
        assert_true(den > 0.0); /* a sample of zeros would prove nothing */
        assert_true(rel <= 1e-6);
        checked++;
    }
    assert_true(checked > 0);
    size_t kept = 0;
    for (int l = 0; l < c.cfg.layers; l++)
        for (int e = 0; e < c.cfg.experts; e++)
            kept += tm_reference_routed(ref, l, e);
    tm_reference_destroy(ref);
    tm_model_destroy(c.global);
    return 12 * (size_t)c.cfg.top_k * (size_t)c.cfg.layers - kept;
}

static void check_fd(tm_quant quant, unsigned roles)
{
    tm_config cfg = small_config(quant, SELDP_F32);
    assert_int_equal(check_fd_config(&cfg, roles), 0);
}

/* The routing extensions (docs/model.md), every term at once: the shared expert's weights,
 * the router through the load-balancing loss (either scope) and the z-loss, and the experts
 * and gates under a capacity that drops assignments (C = 2 and 3 on the two shards). */
static tm_config routing_config(tm_aux_scope scope)
{
    tm_config cfg = small_config(TM_QUANT_NONE, SELDP_F32);
    cfg.d_ff_shared = 16;
    cfg.aux_loss_coeff = 0.3;
    cfg.aux_loss_scope = scope;
    cfg.z_loss_coeff = 0.05;
    cfg.capacity_factor = 0.75;
    return cfg;
}

static void test_fd_routing_global(void **state)
{
    (void)state;
    tm_config cfg = routing_config(TM_AUX_GLOBAL);
    assert_true(check_fd_config(&cfg, TM_ROLE_SHARED | TM_ROLE_EXPERT) > 0);
}

static void test_fd_routing_local(void **state)
{
    (void)state;
    tm_config cfg = routing_config(TM_AUX_LOCAL);
    assert_true(check_fd_config(&cfg, TM_ROLE_SHARED) > 0);
}

/* Each router loss on its own moves the loss by its formula in docs/model.md (so the FD checks
 * above are not checking a term that is absent). */
static void test_router_losses_present(void **state)
{
    (void)state;
    tm_config off = small_config(TM_QUANT_NONE, SELDP_F32), aux = off, z = off;
    aux.aux_loss_coeff = 0.3;
    z.z_loss_coeff = 0.05;
    double loss[3];
    const tm_config *cfgs[3] = {&off, &aux, &z};
    fd_case c = {.cfg = off, .counts = {5, 7}};
    c.global = model_all_experts(&off, 3);
    assert_non_null(c.global);
    for (int r = 0; r < N_RANKS; r++)
        draw_tokens(100 + (uint64_t)r, c.counts[r], off.vocab, c.tokens[r], c.targets[r]);
    for (int i = 0; i < 3; i++) {
        c.cfg = *cfgs[i];
        loss[i] = loss_at(&c, "embed.weight", 0, 0.0);
    }
    /* both terms are sums of positive numbers: each must raise the loss */
    printf("  loss %.9f, with aux %.9f, with z %.9f\n", loss[0], loss[1], loss[2]);
    assert_true(loss[1] > loss[0] + 1e-3);
    assert_true(loss[2] > loss[0] + 1e-3);
    tm_model_destroy(c.global);
}

static void test_fd_shared(void **state)
{
    (void)state;
    check_fd(TM_QUANT_NONE, TM_ROLE_SHARED); /* embed, lm_head, norms, routers, final norm */
}

static void test_fd_dense_experts(void **state)
{
    (void)state;
    check_fd(TM_QUANT_NONE, TM_ROLE_EXPERT);
}

static void test_fd_nf4_adapters(void **state)
{
    (void)state;
    check_fd(TM_QUANT_NF4, TM_ROLE_ADAPTER | TM_ROLE_SHARED);
}

static void test_fd_awq_adapters(void **state)
{
    (void)state;
    check_fd(TM_QUANT_AWQ, TM_ROLE_ADAPTER);
}

/* The tie: both paths give the one gradient (lookup + head), and perturbing either path
 * moves the one storage. */
static void test_tied_paths_share_gradient(void **state)
{
    (void)state;
    fd_case c = {.cfg = small_config(TM_QUANT_NONE, SELDP_F32), .counts = {4, 3}};
    c.global = model_all_experts(&c.cfg, 0);
    assert_non_null(c.global);
    for (int r = 0; r < N_RANKS; r++)
        draw_tokens(7 + (uint64_t)r, c.counts[r], c.cfg.vocab, c.tokens[r], c.targets[r]);
    const int32_t *tok[N_RANKS] = {c.tokens[0], c.tokens[1]};
    const int32_t *tgt[N_RANKS] = {c.targets[0], c.targets[1]};
    tm_reference *ref = NULL;
    assert_int_equal(tm_reference_compute(&c.cfg, tm_model_view(c.global), tok, tgt, c.counts,
                                          N_RANKS, NULL, &ref),
                     SELDP_OK);
    assert_ptr_equal(tm_reference_grad(ref, "embed.weight", NULL),
                     tm_reference_grad(ref, "lm_head.weight", NULL));
    /* Row of a token that is both looked up and predicted: FD must include both uses. */
    size_t k = (size_t)c.tokens[0][0] * (size_t)c.cfg.d_model + 3;
    double up = loss_at(&c, "lm_head.weight", k, FD_STEP);
    double down = loss_at(&c, "embed.weight", k, -FD_STEP);
    double fd = (up - down) / (2.0 * FD_STEP);
    double g = tm_reference_grad(ref, "embed.weight", NULL)[k];
    assert_true(fabs(fd - g) <= 1e-6 * fabs(g));
    /* Frozen and unknown paths have no gradient. */
    assert_null(tm_reference_grad(ref, "nf4.codebook", NULL));
    assert_null(tm_reference_grad(ref, "layers.0.experts.0.w1.qweight", NULL));
    tm_reference_destroy(ref);
    tm_model_destroy(c.global);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fd_shared),
        cmocka_unit_test(test_fd_dense_experts),
        cmocka_unit_test(test_fd_nf4_adapters),
        cmocka_unit_test(test_fd_awq_adapters),
        cmocka_unit_test(test_tied_paths_share_gradient),
        cmocka_unit_test(test_fd_routing_global),
        cmocka_unit_test(test_fd_routing_local),
        cmocka_unit_test(test_router_losses_present),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
