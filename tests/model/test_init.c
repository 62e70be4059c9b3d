/* Construction of a rank's model: the paths (docs/model.md, Parameters), shapes, dtypes, roles and
 * frozen flags for every quant variant; the embed/lm_head tie; one contiguous block per dtype;
 * deterministic rank-dependent initialization (golden bytes pin it across machines);
 * ParamIds from the default scheme or a caller's function; config checks, names and JSON. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "model_util.h"

typedef struct expected {
    const char *path;
    seldp_dtype dtype;
    int ndim;
    int64_t shape[2];
    unsigned role;
    int expert;
} expected;

/* V 16, D 32, F 64, E 4, L 1, r 4, experts {3, 1} held. */
static tm_config layout_config(tm_quant quant)
{
    tm_config cfg = small_config(quant, SELDP_BF16);
    cfg.d_ff = 64;
    cfg.layers = 1;
    return cfg;
}

#define SH TM_ROLE_SHARED
#define EX TM_ROLE_EXPERT
#define BA TM_ROLE_EXPERT_BASE
#define AD TM_ROLE_ADAPTER
#define BF SELDP_BF16

static const expected dense_paths[] = {
    {"embed.weight", BF, 2, {16, 32}, SH, -1},
    {"lm_head.weight", BF, 2, {16, 32}, SH, -1},
    {"layers.0.norm.weight", BF, 1, {32}, SH, -1},
    {"layers.0.router.weight", BF, 2, {4, 32}, SH, -1},
    {"layers.0.experts.1.w1.weight", BF, 2, {64, 32}, EX, 1},
    {"layers.0.experts.1.w2.weight", BF, 2, {32, 64}, EX, 1},
    {"layers.0.experts.3.w1.weight", BF, 2, {64, 32}, EX, 3},
    {"layers.0.experts.3.w2.weight", BF, 2, {32, 64}, EX, 3},
    {"final_norm.weight", BF, 1, {32}, SH, -1},
};

static const expected nf4_paths[] = {
    {"embed.weight", BF, 2, {16, 32}, SH, -1},
    {"lm_head.weight", BF, 2, {16, 32}, SH, -1},
    {"layers.0.norm.weight", BF, 1, {32}, SH, -1},
    {"layers.0.router.weight", BF, 2, {4, 32}, SH, -1},
    {"layers.0.experts.1.w1.qweight", SELDP_U8, 1, {1024}, BA, 1},
    {"layers.0.experts.1.w1.absmax", SELDP_F32, 1, {32}, BA, 1},
    {"layers.0.experts.1.w1.lora_a.weight", BF, 2, {4, 32}, AD, 1},
    {"layers.0.experts.1.w1.lora_b.weight", BF, 2, {64, 4}, AD, 1},
    {"layers.0.experts.1.w2.qweight", SELDP_U8, 1, {1024}, BA, 1},
    {"layers.0.experts.1.w2.absmax", SELDP_F32, 1, {32}, BA, 1},
    {"layers.0.experts.1.w2.lora_a.weight", BF, 2, {4, 64}, AD, 1},
    {"layers.0.experts.1.w2.lora_b.weight", BF, 2, {32, 4}, AD, 1},
    {"layers.0.experts.3.w1.qweight", SELDP_U8, 1, {1024}, BA, 3},
    {"layers.0.experts.3.w1.absmax", SELDP_F32, 1, {32}, BA, 3},
    {"layers.0.experts.3.w1.lora_a.weight", BF, 2, {4, 32}, AD, 3},
    {"layers.0.experts.3.w1.lora_b.weight", BF, 2, {64, 4}, AD, 3},
    {"layers.0.experts.3.w2.qweight", SELDP_U8, 1, {1024}, BA, 3},
    {"layers.0.experts.3.w2.absmax", SELDP_F32, 1, {32}, BA, 3},
    {"layers.0.experts.3.w2.lora_a.weight", BF, 2, {4, 64}, AD, 3},
    {"layers.0.experts.3.w2.lora_b.weight", BF, 2, {32, 4}, AD, 3},
    {"final_norm.weight", BF, 1, {32}, SH, -1},
    {"nf4.codebook", SELDP_F32, 1, {16}, TM_ROLE_SHARED_BUFFER, -1},
};

static const expected awq_paths[] = {
    {"embed.weight", BF, 2, {16, 32}, SH, -1},
    {"lm_head.weight", BF, 2, {16, 32}, SH, -1},
    {"layers.0.norm.weight", BF, 1, {32}, SH, -1},
    {"layers.0.router.weight", BF, 2, {4, 32}, SH, -1},
    {"layers.0.experts.1.w1.qweight", SELDP_I32, 2, {64, 4}, BA, 1},
    {"layers.0.experts.1.w1.scales", SELDP_F16, 2, {64, 1}, BA, 1},
    {"layers.0.experts.1.w1.qzeros", SELDP_I32, 2, {64, 1}, BA, 1},
    {"layers.0.experts.1.w1.lora_a.weight", BF, 2, {4, 32}, AD, 1},
    {"layers.0.experts.1.w1.lora_b.weight", BF, 2, {64, 4}, AD, 1},
    {"layers.0.experts.1.w2.qweight", SELDP_I32, 2, {32, 8}, BA, 1},
    {"layers.0.experts.1.w2.scales", SELDP_F16, 2, {32, 2}, BA, 1},
    {"layers.0.experts.1.w2.qzeros", SELDP_I32, 2, {32, 1}, BA, 1},
    {"layers.0.experts.1.w2.lora_a.weight", BF, 2, {4, 64}, AD, 1},
    {"layers.0.experts.1.w2.lora_b.weight", BF, 2, {32, 4}, AD, 1},
    {"layers.0.experts.3.w1.qweight", SELDP_I32, 2, {64, 4}, BA, 3},
    {"layers.0.experts.3.w1.scales", SELDP_F16, 2, {64, 1}, BA, 3},
    {"layers.0.experts.3.w1.qzeros", SELDP_I32, 2, {64, 1}, BA, 3},
    {"layers.0.experts.3.w1.lora_a.weight", BF, 2, {4, 32}, AD, 3},
    {"layers.0.experts.3.w1.lora_b.weight", BF, 2, {64, 4}, AD, 3},
    {"layers.0.experts.3.w2.qweight", SELDP_I32, 2, {32, 8}, BA, 3},
    {"layers.0.experts.3.w2.scales", SELDP_F16, 2, {32, 2}, BA, 3},
    {"layers.0.experts.3.w2.qzeros", SELDP_I32, 2, {32, 1}, BA, 3},
    {"layers.0.experts.3.w2.lora_a.weight", BF, 2, {4, 64}, AD, 3},
    {"layers.0.experts.3.w2.lora_b.weight", BF, 2, {32, 4}, AD, 3},
    {"final_norm.weight", BF, 1, {32}, SH, -1},
};

static void check_paths(tm_quant quant, const expected *want, size_t n_want)
{
    tm_config cfg = layout_config(quant);
    const int held[2] = {3, 1};
    tm_model *m = NULL;
    assert_int_equal(tm_model_create(&cfg, 5, held, 2, NULL, NULL, &m), SELDP_OK);
    assert_int_equal(tm_param_count(m), n_want);
    seldp_model *view = tm_model_view(m);
    assert_int_equal(seldp_model_count(view), n_want);
    assert_int_equal(seldp_model_rank(view), 5);
    for (size_t i = 0; i < n_want; i++) {
        const tm_param_info *p = tm_param_at(m, i);
        assert_string_equal(p->path, want[i].path);
        assert_int_equal(p->tensor.dtype, want[i].dtype);
        assert_int_equal(p->tensor.ndim, want[i].ndim);
        for (int d = 0; d < want[i].ndim; d++)
            assert_int_equal(p->tensor.shape[d], want[i].shape[d]);
        assert_int_equal(p->role, want[i].role);
        assert_int_equal(p->expert, want[i].expert);
        const bool frozen = want[i].role == BA || want[i].role == TM_ROLE_SHARED_BUFFER;
        assert_int_equal(p->frozen, frozen);
        assert_int_equal(tm_param_grad(m, p->path) == NULL, frozen);
        /* The view holds the same occurrence, tagged with its info. */
        const seldp_param *v = seldp_model_find_path(view, p->path);
        assert_non_null(v);
        assert_true(v->id == p->id && v->frozen == p->frozen && v->tag == p);
        assert_ptr_equal(v->tensor.data, p->tensor.data);
        assert_ptr_equal(tm_param_find(m, p->path), p);
        if (p->expert >= 0)
            assert_int_equal(p->layer, 0);
    }
    /* The tie: one id at two paths, one storage. */
    const tm_param_info *emb = tm_param_find(m, "embed.weight");
    const tm_param_info *head = tm_param_find(m, "lm_head.weight");
    assert_true(emb->id == head->id && head->alias && !emb->alias);
    assert_ptr_equal(emb->tensor.data, head->tensor.data);
    const seldp_param *aliases[4];
    assert_int_equal(seldp_model_aliases(view, emb->id, aliases, 4), 2);
    assert_string_equal(aliases[0]->path, "embed.weight");
    assert_string_equal(aliases[1]->path, "lm_head.weight");
    assert_true(tm_model_owns(m, 1) && tm_model_owns(m, 3) && !tm_model_owns(m, 0));
    assert_null(tm_param_find(m, "layers.0.experts.0.w1.weight"));
    tm_model_destroy(m);
}

static void test_paths_dense(void **state)
{
    (void)state;
    check_paths(TM_QUANT_NONE, dense_paths, sizeof dense_paths / sizeof dense_paths[0]);
}

static void test_paths_nf4(void **state)
{
    (void)state;
    check_paths(TM_QUANT_NF4, nf4_paths, sizeof nf4_paths / sizeof nf4_paths[0]);
}

static void test_paths_awq(void **state)
{
    (void)state;
    check_paths(TM_QUANT_AWQ, awq_paths, sizeof awq_paths / sizeof awq_paths[0]);
}

/* Every tensor of one dtype lies in one allocation: the span from the lowest start to the
 * highest end is no more than the sum of the 64-byte-rounded sizes. */
static void test_one_block_per_dtype(void **state)
{
    (void)state;
    tm_config cfg = layout_config(TM_QUANT_AWQ);
    tm_model *m = model_all_experts(&cfg, 0);
    assert_non_null(m);
    for (int d = 0; d < SELDP_DTYPE_COUNT; d++) {
        uintptr_t lo = UINTPTR_MAX, hi = 0;
        size_t total = 0;
        for (size_t i = 0; i < tm_param_count(m); i++) {
            const tm_param_info *p = tm_param_at(m, i);
            if ((int)p->tensor.dtype != d || p->alias)
                continue;
            const uintptr_t at = (uintptr_t)p->tensor.data;
            const size_t bytes = seldp_tensor_nbytes(&p->tensor);
            lo = at < lo ? at : lo;
            hi = at + bytes > hi ? at + bytes : hi;
            total += (bytes + 63) / 64 * 64;
        }
        if (total)
            assert_true(hi - lo <= total);
    }
    tm_model_destroy(m);
}

static bool bytes_equal(const tm_model *a, const tm_model *b, const char *path)
{
    const tm_param_info *p = tm_param_find(a, path), *q = tm_param_find(b, path);
    assert_non_null(p);
    assert_non_null(q);
    return memcmp(p->tensor.data, q->tensor.data, seldp_tensor_nbytes(&p->tensor)) == 0;
}

static uint64_t fnv_bytes(const tm_param_info *p)
{
    uint64_t h = 0xcbf29ce484222325ull;
    const unsigned char *b = p->tensor.data;
    for (size_t i = 0; i < seldp_tensor_nbytes(&p->tensor); i++) {
        h ^= b[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

static void test_determinism(void **state)
{
    (void)state;
    const tm_quant quants[3] = {TM_QUANT_NONE, TM_QUANT_NF4, TM_QUANT_AWQ};
    for (int qi = 0; qi < 3; qi++) {
        tm_config cfg = small_config(quants[qi], SELDP_F16);
        tm_model *a = model_all_experts(&cfg, 2), *b = model_all_experts(&cfg, 2);
        tm_model *c = model_all_experts(&cfg, 3);
        cfg.seed++;
        tm_model *d = model_all_experts(&cfg, 2);
        assert_true(a && b && c && d);
        for (size_t i = 0; i < tm_param_count(a); i++) {
            const tm_param_info *p = tm_param_at(a, i);
            assert_true(bytes_equal(a, b, p->path)); /* same seed and rank */
            if (p->role == TM_ROLE_SHARED_BUFFER) {
                assert_true(bytes_equal(a, c, p->path)); /* the codebook is a constant */
                continue;
            }
            assert_false(bytes_equal(a, c, p->path)); /* another rank */
            assert_false(bytes_equal(a, d, p->path)); /* another seed */
        }
        /* An expert's values do not depend on which other experts the rank holds. */
        const int only = 2;
        tm_model *e = NULL;
        cfg.seed--;
        assert_int_equal(tm_model_create(&cfg, 2, &only, 1, NULL, NULL, &e), SELDP_OK);
        for (size_t i = 0; i < tm_param_count(e); i++)
            assert_true(bytes_equal(a, e, tm_param_at(e, i)->path));
        tm_model_destroy(a);
        tm_model_destroy(b);
        tm_model_destroy(c);
        tm_model_destroy(d);
        tm_model_destroy(e);
    }
}

/* Golden values: the same bytes on any machine. Changing the initialization changes them. */
static void test_golden_bytes(void **state)
{
    (void)state;
    tm_config cfg = TM_CONFIG_INIT;
    const int held = 2;
    tm_model *m = NULL;
    assert_int_equal(tm_model_create(&cfg, 0, &held, 1, NULL, NULL, &m), SELDP_OK);
    const tm_param_info *emb = tm_param_find(m, "embed.weight");
    assert_true(((const float *)emb->tensor.data)[0] == 0.0503636822f);
    assert_true(fnv_bytes(emb) == 0x67f214511bc67781ull);
    assert_true(fnv_bytes(tm_param_find(m, "layers.1.experts.2.w1.weight")) ==
                0x90f49d4ea2e1280full);
    assert_true(emb->id == 0x5b9c4df76626a37cull);
    assert_true(tm_default_param_id("embed.weight", 0, NULL) == 0x5b9c4df76626a37cull);
    tm_model_destroy(m);
}

static seldp_param_id counting_ids(const char *path, int rank, void *user)
{
    int *calls = user;
    (*calls)++;
    return tm_hash_path(path) ^ (uint64_t)rank;
}

static seldp_param_id constant_id(const char *path, int rank, void *user)
{
    (void)path;
    (void)rank;
    (void)user;
    return 42;
}

static void test_param_ids(void **state)
{
    (void)state;
    tm_config cfg = small_config(TM_QUANT_NF4, SELDP_F32);
    tm_model *r0 = model_all_experts(&cfg, 0), *r1 = model_all_experts(&cfg, 1);
    assert_true(r0 && r1);
    /* The default scheme: ids of one path differ between ranks, and are unique per rank. */
    for (size_t i = 0; i < tm_param_count(r0); i++) {
        const tm_param_info *p = tm_param_at(r0, i), *q = tm_param_at(r1, i);
        assert_string_equal(p->path, q->path);
        assert_true(p->id != q->id);
        assert_true(p->id == (p->alias ? tm_param_find(r0, "embed.weight")->id
                                       : tm_default_param_id(p->path, 0, NULL)));
    }
    tm_model_destroy(r0);
    tm_model_destroy(r1);

    int calls = 0;
    tm_model *m = NULL;
    const int held = 1;
    assert_int_equal(tm_model_create(&cfg, 9, &held, 1, counting_ids, &calls, &m), SELDP_OK);
    assert_int_equal(calls, (int)tm_param_count(m) - 1); /* not called for lm_head */
    for (size_t i = 0; i < tm_param_count(m); i++) {
        const tm_param_info *p = tm_param_at(m, i);
        const char *owner = p->alias ? "embed.weight" : p->path;
        assert_true(p->id == (tm_hash_path(owner) ^ 9u));
    }
    tm_model_destroy(m);

    /* Colliding ids are refused by the view and nothing leaks. */
    m = NULL;
    assert_int_equal(tm_model_create(&cfg, 0, &held, 1, constant_id, NULL, &m), SELDP_ERR_ALIAS);
    assert_null(m);
}

static void test_config(void **state)
{
    (void)state;
    tm_config cfg = TM_CONFIG_INIT;
    assert_int_equal(tm_config_check(&cfg), SELDP_OK);
    char buf[512];
    size_t n = tm_config_json(&cfg, buf, sizeof buf);
    assert_string_equal(buf, "{\"vocab\":64,\"d_model\":32,\"d_ff\":64,\"experts\":4,\"top_k\":2,"
                             "\"layers\":2,\"eps\":1e-06,\"dtype\":\"f32\",\"quant\":\"none\","
                             "\"lora_rank\":4,\"lora_alpha\":8,\"seed\":1234,\"d_ff_shared\":0,"
                             "\"aux_loss_coeff\":0,\"aux_loss_scope\":\"global\","
                             "\"z_loss_coeff\":0,\"capacity_factor\":0}");
    assert_int_equal(n, strlen(buf));
    char tiny[8];
    assert_int_equal(tm_config_json(&cfg, tiny, sizeof tiny), n); /* truncated, like snprintf */
    assert_int_equal(strlen(tiny), 7);
    cfg.lora_alpha = 0.1;
    cfg.quant = TM_QUANT_AWQ;
    cfg.dtype = SELDP_BF16;
    tm_config_json(&cfg, buf, sizeof buf);
    assert_non_null(strstr(buf, "\"lora_alpha\":0.1,"));
    assert_non_null(strstr(buf, "\"dtype\":\"bf16\",\"quant\":\"awq\""));

    tm_quant q;
    seldp_dtype d;
    assert_true(tm_quant_parse("NF4", &q) && q == TM_QUANT_NF4);
    assert_true(tm_quant_parse("awq", &q) && q == TM_QUANT_AWQ);
    assert_false(tm_quant_parse("int8", &q));
    assert_string_equal(tm_quant_name(TM_QUANT_NONE), "none");
    assert_true(tm_dtype_parse("bf16", &d) && d == SELDP_BF16);
    assert_true(tm_dtype_parse("F16", &d) && d == SELDP_F16);
    assert_false(tm_dtype_parse("i32", &d));
    assert_string_equal(tm_dtype_name(SELDP_F32), "f32");
    assert_string_equal(tm_dtype_name(SELDP_U8), "invalid");

    tm_config c = TM_CONFIG_INIT;
    c.top_k = 5;
    assert_int_equal(tm_config_check(&c), SELDP_ERR_INVALID_ARGUMENT);
    c = (tm_config)TM_CONFIG_INIT;
    c.quant = TM_QUANT_AWQ;
    c.d_model = 48;
    assert_int_equal(tm_config_check(&c), SELDP_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(tm_last_error(), "d_model"));
    c = (tm_config)TM_CONFIG_INIT;
    c.quant = TM_QUANT_NF4;
    c.d_model = 3;
    c.d_ff = 5;
    assert_int_equal(tm_config_check(&c), SELDP_ERR_INVALID_ARGUMENT);
    c = (tm_config)TM_CONFIG_INIT;
    c.dtype = SELDP_I32;
    assert_int_equal(tm_config_check(&c), SELDP_ERR_INVALID_ARGUMENT);
    c = (tm_config)TM_CONFIG_INIT;
    c.layers = 0;
    assert_int_equal(tm_config_check(&c), SELDP_ERR_INVALID_ARGUMENT);

    tm_model *m = NULL;
    c = (tm_config)TM_CONFIG_INIT;
    const int dup[2] = {1, 1}, out_of_range[1] = {4};
    assert_int_equal(tm_model_create(&c, 0, dup, 2, NULL, NULL, &m), SELDP_ERR_INVALID_ARGUMENT);
    assert_int_equal(tm_model_create(&c, 0, out_of_range, 1, NULL, NULL, &m),
                     SELDP_ERR_INVALID_ARGUMENT);
    assert_null(m);
    /* No expert at all is a valid rank (shared parameters only). */
    assert_int_equal(tm_model_create(&c, 0, NULL, 0, NULL, NULL, &m), SELDP_OK);
    assert_int_equal(tm_param_count(m), 2 + 2 * 2 + 1);
    tm_model_destroy(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_paths_dense), cmocka_unit_test(test_paths_nf4),
        cmocka_unit_test(test_paths_awq),   cmocka_unit_test(test_one_block_per_dtype),
        cmocka_unit_test(test_determinism), cmocka_unit_test(test_golden_bytes),
        cmocka_unit_test(test_param_ids),   cmocka_unit_test(test_config),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
