/* The FP64 reference on a pool of threads (tm_reference_set_threads): its loss, every gradient
 * and every magnitude are the same bits on 1, 2, 3 and 5 threads, for dense and quantized
 * experts, with the shared expert, the router losses in both scopes and the capacity, over
 * several data shards; with token counts that are not a multiple of the token block
 * (TM_REF_TOKEN_BLOCK), fewer tokens than one block, exactly two blocks, more threads than
 * blocks, and the model's routing choices followed at near ties. The pool's block loop itself:
 * every item once, commits in block order, whatever the workers. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "model_util.h"
#include "ref_pool.h"

enum { MAX_SHARDS = 3, MAX_PER_SHARD = 1024 };

/* The token layout of a case: shards of counts[r] tokens, and whether the model's choices
 * (an arbitrary valid top-K per token, followed only at near ties) go with them. */
typedef struct layout {
    int shards;
    size_t counts[MAX_SHARDS];
    bool choices;
} layout;

static const layout uneven = {3, {700, 650, 600}, false}; /* 1950 tokens: 2 blocks, uneven */

static tm_reference *reference_of(const tm_config *cfg, tm_model *m, int threads, const layout *lo)
{
    static int32_t tokens[MAX_SHARDS][MAX_PER_SHARD], targets[MAX_SHARDS][MAX_PER_SHARD];
    static int choice[MAX_SHARDS][2 * MAX_PER_SHARD * 4];
    const int32_t *tok[MAX_SHARDS], *tgt[MAX_SHARDS];
    const int *ch[MAX_SHARDS];
    assert_true(cfg->layers <= 2 && cfg->top_k <= 4);
    for (int r = 0; r < lo->shards; r++) {
        draw_tokens(100 + (uint64_t)r, lo->counts[r], cfg->vocab, tokens[r], targets[r]);
        tok[r] = tokens[r];
        tgt[r] = targets[r];
        for (size_t i = 0; i < (size_t)cfg->layers * lo->counts[r]; i++)
            for (int k = 0; k < cfg->top_k; k++)
                choice[r][i * cfg->top_k + k] = (int)((i + (size_t)k) % (size_t)cfg->experts);
        ch[r] = choice[r];
    }
    tm_reference_set_threads(threads);
    assert_int_equal(tm_reference_threads(), threads);
    tm_reference *ref = NULL;
    assert_int_equal(tm_reference_compute_routed(cfg, tm_model_view(m), tok, tgt, lo->counts,
                                                 lo->shards, NULL, lo->choices ? ch : NULL, &ref),
                     SELDP_OK);
    tm_reference_set_threads(0);
    return ref;
}

static tm_reference *reference(const tm_config *cfg, tm_model *m, int threads)
{
    return reference_of(cfg, m, threads, &uneven);
}

static void assert_same_bits(const tm_model *m, const tm_reference *a, const tm_reference *b,
                             int threads)
{
    double la = tm_reference_loss(a), lb = tm_reference_loss(b);
    double ma = tm_reference_loss_magnitude(a), mb = tm_reference_loss_magnitude(b);
    if (memcmp(&la, &lb, sizeof la) || memcmp(&ma, &mb, sizeof ma))
        fail_msg("%d threads: loss %.17g (magnitude %.17g) against %.17g (%.17g) on one", threads,
                 lb, mb, la, ma);
    assert_int_equal(tm_reference_ties_followed(a), tm_reference_ties_followed(b));
    assert_int_equal(tm_reference_dropped(a), tm_reference_dropped(b));
    double ba = tm_reference_largest(a), bb = tm_reference_largest(b);
    assert_memory_equal(&ba, &bb, sizeof ba);
    int compared = 0;
    for (size_t i = 0; i < tm_param_count(m); i++) {
        const tm_param_info *p = tm_param_at(m, i);
        size_t na = 0, nb = 0;
        const double *ga = tm_reference_grad(a, p->path, &na);
        const double *gb = tm_reference_grad(b, p->path, &nb);
        if (!ga)
            continue;
        assert_non_null(gb);
        assert_int_equal(na, nb);
        const double *xa = tm_reference_magnitude(a, p->path, &na);
        const double *xb = tm_reference_magnitude(b, p->path, &nb);
        if (memcmp(ga, gb, na * sizeof *ga) || memcmp(xa, xb, na * sizeof *xa))
            fail_msg("%d threads: %s differs from one thread's", threads, p->path);
        compared++;
    }
    assert_true(compared > 10);
}

static void check_config(const tm_config *cfg)
{
    tm_model *m = model_all_experts(cfg, 0);
    assert_non_null(m);
    tm_reference *one = reference(cfg, m, 1);
    static const int counts[] = {2, 3, 5};
    for (size_t i = 0; i < sizeof counts / sizeof counts[0]; i++) {
        tm_reference *many = reference(cfg, m, counts[i]);
        assert_same_bits(m, one, many, counts[i]);
        tm_reference_destroy(many);
    }
    tm_reference_destroy(one);
    tm_model_destroy(m);
}

/* one layout on 1 thread against 2, 3, 5 and 8 */
static void check_layout(const tm_config *cfg, const layout *lo)
{
    tm_model *m = model_all_experts(cfg, 0);
    assert_non_null(m);
    tm_reference *one = reference_of(cfg, m, 1, lo);
    static const int counts[] = {2, 3, 5, 8};
    for (size_t i = 0; i < sizeof counts / sizeof counts[0]; i++) {
        tm_reference *many = reference_of(cfg, m, counts[i], lo);
        assert_same_bits(m, one, many, counts[i]);
        tm_reference_destroy(many);
    }
    tm_reference_destroy(one);
    tm_model_destroy(m);
}

static tm_config many_experts(tm_quant quant)
{
    tm_config cfg = small_config(quant, SELDP_F32);
    cfg.experts = 16;
    cfg.top_k = 4;
    return cfg;
}

static void test_dense_experts(void **state)
{
    (void)state;
    tm_config cfg = many_experts(TM_QUANT_NONE);
    check_config(&cfg);
}

static void test_router_losses_and_capacity(void **state)
{
    (void)state;
    tm_config cfg = many_experts(TM_QUANT_NONE);
    cfg.d_ff_shared = 16;
    cfg.aux_loss_coeff = 0.01;
    cfg.z_loss_coeff = 0.001;
    cfg.capacity_factor = 1.25;
    check_config(&cfg);
    cfg.aux_loss_scope = TM_AUX_LOCAL;
    check_config(&cfg);
}

static void test_quantized_experts(void **state)
{
    (void)state;
    tm_config cfg = many_experts(TM_QUANT_NF4);
    check_config(&cfg);
}

/* every token loop with losses, capacity and the shared expert on: fewer tokens than a block
 * (one block, more threads than blocks), exactly two blocks over two shards, and the model's
 * choices followed at near ties */
static void test_token_blocks(void **state)
{
    (void)state;
    tm_config cfg = many_experts(TM_QUANT_NONE);
    cfg.d_ff_shared = 16;
    cfg.aux_loss_coeff = 0.01;
    cfg.z_loss_coeff = 0.001;
    cfg.capacity_factor = 1.25;
    assert_int_equal(TM_REF_TOKEN_BLOCK, 1024);
    const layout small = {1, {300}, true};
    const layout exact = {2, {1024, 1024}, false};
    const layout chosen = {3, {1024, 1, 1000}, true}; /* 2025 tokens: 2 blocks and 1 token */
    check_layout(&cfg, &small);
    check_layout(&cfg, &exact);
    check_layout(&cfg, &chosen);
    cfg = many_experts(TM_QUANT_NONE); /* without losses: the logits a block at a time */
    check_layout(&cfg, &small);
    check_layout(&cfg, &chosen);
}

typedef struct seen {
    size_t n;
    int hits[5000];
    size_t next_commit; /* the first item of the block whose commit is due */
    bool in_order, bounds_ok;
} seen;

static bool mark(void *ctx, int worker, size_t begin, size_t end)
{
    (void)worker;
    seen *s = ctx;
    for (size_t i = begin; i < end && end <= s->n; i++)
        s->hits[i]++; /* each item is one block's, and blocks do not overlap */
    return true;
}

static void commit_mark(void *ctx, int worker, size_t begin, size_t end)
{
    (void)worker;
    seen *s = ctx; /* commits run one at a time */
    s->bounds_ok = s->bounds_ok && begin < end && end <= s->n && begin % TM_REF_TOKEN_BLOCK == 0 &&
                   (end - begin == TM_REF_TOKEN_BLOCK || end == s->n);
    s->in_order = s->in_order && begin == s->next_commit;
    s->next_commit = end;
}

/* tm__ref_blocks_for: block b is [b * 1024, min(n, (b + 1) * 1024)), computed once and committed
 * in block order, on 1 to 8 workers, for n below one block, a multiple and not one */
static void test_blocks_for(void **state)
{
    (void)state;
    static seen s;
    static const size_t sizes[] = {1, 1023, 1024, 2048, 2049, 5000};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        for (int workers = 1; workers <= 8; workers++) {
            memset(&s, 0, sizeof s);
            s.n = sizes[i];
            s.in_order = s.bounds_ok = true;
            assert_true(
                tm__ref_blocks_for(s.n, TM_REF_TOKEN_BLOCK, workers, mark, commit_mark, &s));
            assert_true(s.bounds_ok);
            assert_true(s.in_order);
            assert_int_equal(s.next_commit, s.n);
            for (size_t t = 0; t < s.n; t++)
                assert_int_equal(s.hits[t], 1);
        }
    }
}

static void test_thread_count(void **state)
{
    (void)state;
    tm_reference_set_threads(0);
    assert_true(tm_reference_threads() >= 1 && tm_reference_threads() <= 64);
    tm_reference_set_threads(1000);
    assert_int_equal(tm_reference_threads(), 64);
    tm_reference_set_threads(0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dense_experts),     cmocka_unit_test(test_router_losses_and_capacity),
        cmocka_unit_test(test_quantized_experts), cmocka_unit_test(test_token_blocks),
        cmocka_unit_test(test_blocks_for),        cmocka_unit_test(test_thread_count),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
