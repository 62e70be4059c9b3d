/* --dump as docs/formats.md (Dumps) describes it: rank{r}.safetensors with param/{path} as the
 * step's forward used them, grad/{path} as reduced, tokens and targets (I32), __metadata__ config
 * and layout (JSON strings); manifest.json with world, layout, token counts and global weights.
 * Read back with the harness's own safetensors reader. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cli.h"
#include "harness_test.h"
#include "layout.h"
#include "safetensors.h"

static void run_ok(const char *fmt, ...)
{
    char args[1400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    hx_test_run run;
    hx_test_harness(&run, "%s", args);
    if (run.status != HX_EXIT_PASS)
        fail_msg("seldp-harness %s\nexit %d\n%s%s", args, run.status, run.err, run.out);
}

static hx_st_file *read_rank(const char *dir, int r)
{
    char path[1300];
    snprintf(path, sizeof path, "%s/rank%d.safetensors", dir, r);
    hx_st_file *f = NULL;
    if (hx_st_read(path, &f) != SELDP_OK)
        fail_msg("%s", hx_last_error());
    return f;
}

static hx_json *parse(const char *text, const char *what)
{
    hx_json *v = NULL;
    assert_non_null(text);
    if (hx_json_parse(text, strlen(text), what, &v) != SELDP_OK)
        fail_msg("%s", hx_last_error());
    return v;
}

static void test_contents(void **state)
{
    (void)state;
    char dir[1200];
    snprintf(dir, sizeof dir, "%s", hx_test_dir("contents"));
    run_ok("--steps 2 --quiet --out none --dump %s", dir);

    char path[1300], *text = NULL;
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    assert_int_equal(hx_read_file(path, &text, NULL), SELDP_OK);
    hx_json *manifest = parse(text, "manifest.json");
    free(text);
    assert_int_equal(hx_test_int(manifest, "world"), 8);
    assert_int_equal(hx_test_int(manifest, "step"), 2);
    const hx_json *counts = hx_json_get(manifest, "token_counts");
    assert_int_equal(counts->count, 8);
    int64_t total = 0;
    for (int r = 0; r < 8; r++)
        total += counts->items[r].integer;
    assert_int_equal(hx_test_int(manifest, "global_tokens"), total);
    const hx_json *weights = hx_json_get(manifest, "global_weights");
    assert_int_equal(hx_test_int(hx_json_get(weights, "shared"), "global_weight"), total);
    assert_int_equal(hx_json_get(weights, "expert_data_groups")->count, 4);
    assert_non_null(hx_json_get(hx_json_get(manifest, "layout"), "ep_groups"));

    hx_st_file *files[8];
    for (int r = 0; r < 8; r++)
        files[r] = read_rank(dir, r);
    for (int r = 0; r < 8; r++) {
        hx_st_file *f = files[r];
        /* config: the keys of docs/formats.md, Config JSON */
        hx_json *config = parse(hx_st_metadata(f, "config"), "config");
        const char *keys[] = {"vocab", "d_model", "d_ff",  "experts",   "top_k",      "layers",
                              "eps",   "dtype",   "quant", "lora_rank", "lora_alpha", "seed"};
        for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++)
            if (!hx_json_get(config, keys[k]))
                fail_msg("config lacks \"%s\": %s", keys[k], hx_st_metadata(f, "config"));
        assert_int_equal(hx_test_int(config, "vocab"), 64);
        assert_int_equal(hx_test_int(config, "experts"), 8);
        assert_string_equal(hx_json_get(config, "dtype")->string, "bf16");
        hx_json_free(config);
        /* layout: a layout file that reproduces the run's groups */
        const char *layout_text = hx_st_metadata(f, "layout");
        assert_non_null(layout_text);
        hx_layout *l = NULL;
        if (hx_layout_parse(layout_text, strlen(layout_text), "layout", 8, 8, HX_ROOTS_FIRST, &l) !=
            SELDP_OK)
            fail_msg("%s", hx_last_error());
        assert_int_equal(l->n_ep, 2);
        assert_int_equal(l->ep[1].ranks[0], 4);
        assert_int_equal(l->data[1].ranks[1], 5);
        hx_layout_destroy(l);
        /* tokens and targets */
        const hx_st_tensor *tokens = hx_st_find(f, "tokens");
        const hx_st_tensor *targets = hx_st_find(f, "targets");
        assert_non_null(tokens);
        assert_non_null(targets);
        assert_int_equal(tokens->dtype, SELDP_I32);
        assert_int_equal(targets->dtype, SELDP_I32);
        assert_int_equal(tokens->shape[0], counts->items[r].integer);
        for (int64_t t = 0; t < tokens->shape[0]; t++) {
            int32_t id = ((const int32_t *)tokens->data)[t];
            assert_true(id >= 0 && id < 64);
            assert_int_equal(((const int32_t *)targets->data)[t], (id + 1) % 64);
        }
        /* parameters, the tied head included; gradients in the parameter dtype */
        const hx_st_tensor *embed = hx_st_find(f, "param/embed.weight");
        const hx_st_tensor *head = hx_st_find(f, "param/lm_head.weight");
        assert_non_null(embed);
        assert_non_null(head);
        assert_memory_equal(embed->data, head->data, embed->nbytes);
        assert_int_equal(embed->dtype, SELDP_BF16);
        assert_non_null(hx_st_find(f, "grad/embed.weight"));
        assert_null(hx_st_find(f, "grad/lm_head.weight"));
        int owned = 0;
        for (size_t i = 0; i < hx_st_count(f); i++) {
            const hx_st_tensor *t = hx_st_at(f, i);
            if (strncmp(t->name, "grad/", 5) != 0)
                continue;
            char param[256];
            snprintf(param, sizeof param, "param/%s", t->name + 5);
            const hx_st_tensor *p = hx_st_find(f, param);
            if (!p)
                fail_msg("rank %d: %s without %s", r, t->name, param);
            assert_int_equal(t->dtype, SELDP_BF16);
            assert_int_equal(t->nbytes, p->nbytes);
            owned += strstr(t->name, ".experts.") != NULL;
        }
        /* two local experts, two weights each, two layers */
        assert_int_equal(owned, 2 * 2 * 2);
        /* replicas: the shared parameters and gradients are the same bytes on every rank */
        if (r > 0) {
            const char *names[] = {"param/embed.weight", "grad/embed.weight",
                                   "grad/layers.1.router.weight", "grad/final_norm.weight"};
            for (size_t k = 0; k < 4; k++) {
                const hx_st_tensor *a = hx_st_find(files[0], names[k]);
                const hx_st_tensor *b = hx_st_find(f, names[k]);
                assert_non_null(a);
                assert_non_null(b);
                assert_memory_equal(a->data, b->data, a->nbytes);
            }
        }
    }
    /* expert 2 lives on ranks 1 and 5 (expert-data group d1) */
    const char *e2 = "grad/layers.0.experts.2.w2.weight";
    assert_non_null(hx_st_find(files[1], e2));
    assert_memory_equal(hx_st_find(files[1], e2)->data, hx_st_find(files[5], e2)->data,
                        hx_st_find(files[1], e2)->nbytes);
    assert_null(hx_st_find(files[0], e2));
    for (int r = 0; r < 8; r++)
        hx_st_file_free(files[r]);
    hx_json_free(manifest);
}

/* The parameters dumped at step 2 are step 1's minus lr times step 1's reduced gradients:
 * the dump shows what the forward used, and the update used the reduced gradients. */
static void test_sgd_between_steps(void **state)
{
    (void)state;
    char one[1200], two[1200];
    snprintf(one, sizeof one, "%s", hx_test_dir("step1"));
    snprintf(two, sizeof two, "%s", hx_test_dir("step2"));
    const char *common = "--world 4 --ep 2 --dtype f32 --lr 0.25 --quiet --out none";
    run_ok("%s --steps 1 --dump %s", common, one);
    run_ok("%s --steps 2 --dump %s", common, two);
    size_t checked = 0;
    for (int r = 0; r < 4; r++) {
        hx_st_file *a = read_rank(one, r), *b = read_rank(two, r);
        for (size_t i = 0; i < hx_st_count(a); i++) {
            const hx_st_tensor *g = hx_st_at(a, i);
            if (strncmp(g->name, "grad/", 5) != 0)
                continue;
            char name[256];
            snprintf(name, sizeof name, "param/%s", g->name + 5);
            const float *w1 = hx_st_find(a, name)->data;
            const float *w2 = hx_st_find(b, name)->data;
            const float *gv = g->data;
            for (size_t k = 0; k < g->nbytes / sizeof(float); k++) {
                float want = w1[k] - 0.25f * gv[k];
                if (w2[k] != want)
                    fail_msg("rank %d: %s[%zu] is %.9g at step 2, expected %.9g", r, name, k, w2[k],
                             want);
            }
            checked++;
        }
        hx_st_file_free(a);
        hx_st_file_free(b);
    }
    assert_true(checked > 10);
}

static void test_quantized_dump(void **state)
{
    (void)state;
    char dir[1200];
    snprintf(dir, sizeof dir, "%s", hx_test_dir("nf4"));
    run_ok("--world 2 --ep 2 --quant nf4 --fp32-master --steps 1 --quiet --out none --dump %s",
           dir);
    hx_st_file *f = read_rank(dir, 0);
    const hx_st_tensor *q = hx_st_find(f, "param/layers.0.experts.0.w1.qweight");
    assert_non_null(q);
    assert_int_equal(q->dtype, SELDP_U8);
    assert_non_null(hx_st_find(f, "param/nf4.codebook"));
    /* frozen bases are never reduced; adapters are, in FP32 */
    assert_null(hx_st_find(f, "grad/layers.0.experts.0.w1.qweight"));
    const hx_st_tensor *a = hx_st_find(f, "grad/layers.0.experts.0.w1.lora_a.weight");
    assert_non_null(a);
    assert_int_equal(a->dtype, SELDP_F32);
    hx_json *config = parse(hx_st_metadata(f, "config"), "config");
    assert_string_equal(hx_json_get(config, "quant")->string, "nf4");
    hx_json_free(config);
    hx_st_file_free(f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_contents),
        cmocka_unit_test(test_sgd_between_steps),
        cmocka_unit_test(test_quantized_dump),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
