/* Contract of seldp_session_initialize_with_buffers (docs/library.md, Initialize): native integer
 * and bool buffers (NF4 bytes with absmax and codebook, AWQ words with scales and zeros) broadcast
 * bit-exactly in their own width beside the adapters, rejected by plain initialize, kept
 * frozen and never reduced. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "contract.h"

typedef struct buf_spec {
    const char *path;
    seldp_dtype dtype;
    int64_t numel;
    bool frozen;
    bool raw; /* filled with raw bytes even if a float: NaN payloads, signalling NaNs */
} buf_spec;

/* In path order. */
static const buf_spec BUFS[] = {
    {"layers.0.experts.0.w1.absmax", SELDP_F32, 2, true, false},
    {"layers.0.experts.0.w1.lora_a.weight", SELDP_F32, 16, false, false},
    {"layers.0.experts.0.w1.lora_b.weight", SELDP_BF16, 8, false, false},
    {"layers.0.experts.0.w1.qweight", SELDP_U8, 64, true, false},
    {"layers.0.experts.0.w2.qweight", SELDP_I32, 8, true, false},
    {"layers.0.experts.0.w2.qzeros", SELDP_I32, 1, true, false},
    {"layers.0.experts.0.w2.scales", SELDP_F16, 2, true, false},
    {"misc.flags", SELDP_BOOL, 5, true, false},
    {"misc.i16", SELDP_I16, 3, false, false},
    {"misc.i64", SELDP_I64, 2, true, false},
    {"misc.i8", SELDP_I8, 7, false, false},
    {"misc.nan_payloads", SELDP_F32, 6, true, true},
    {"misc.u16", SELDP_U16, 3, true, false},
    {"misc.u32", SELDP_U32, 3, true, false},
    {"misc.u64", SELDP_U64, 1, true, false},
    {"nf4.codebook", SELDP_F32, 16, true, false},
};
#define N_BUFS    (sizeof BUFS / sizeof BUFS[0])
#define FIRST_INT 3 /* layers.0.experts.0.w1.qweight: the first non-float in path order */
#define LORA_A    1
#define LORA_B    2
#define MISC_I8   10

static seldp_param_id buf_id(int rank, size_t k)
{
    return 1000u * (seldp_param_id)(rank + 1) + k;
}

static uint64_t buf_seed(int rank, size_t k)
{
    return 31u * (uint64_t)(rank + 1) + k;
}

static void expected_bytes(size_t k, int rank, void *out)
{
    if (BUFS[k].raw)
        tr_fill_bytes(out, (size_t)BUFS[k].numel * seldp_dtype_size(BUFS[k].dtype),
                      buf_seed(rank, k));
    else
        ct_fill(BUFS[k].dtype, out, (size_t)BUFS[k].numel, buf_seed(rank, k));
}

/* The quantized-base layout beside an unselected parameter; ids given in reverse. */
static int build(tr_rank_ctx *ctx, test_model *m, seldp_param_id *ids)
{
    RANK_CHECK_OK(ctx, ct_init(m, ctx->rank));
    for (size_t k = 0; k < N_BUFS; k++) {
        RANK_CHECK_OK(ctx, ct_add(m, BUFS[k].path, buf_id(ctx->rank, k), BUFS[k].dtype,
                                  BUFS[k].frozen, buf_seed(ctx->rank, k), 1, SHAPE(BUFS[k].numel)));
        if (BUFS[k].raw)
            expected_bytes(k, ctx->rank, m->p[m->n - 1].tensor.data);
        ids[N_BUFS - 1 - k] = buf_id(ctx->rank, k);
    }
    RANK_CHECK_OK(ctx, ct_add(m, "other.expert", 5, SELDP_U8, true, 90 + (uint64_t)ctx->rank, 1,
                              SHAPE(ctx->rank + 3)));
    ct_snapshot(m);
    return 0;
}

typedef struct buf_arg {
    int root;
    size_t bucket_bytes;
    outcome o;
} buf_arg;

static int rank_bit_exact(tr_rank_ctx *ctx)
{
    buf_arg *a = ctx->arg;
    seldp_session_config cfg = SELDP_SESSION_CONFIG_INIT;
    test_model m;
    seldp_session *s = NULL;
    seldp_param_id ids[N_BUFS];
    seldp_comm_stats s0, s1;
    uint64_t expected = 0;
    unsigned char want[512];

    cfg.bucket_bytes = a->bucket_bytes;
    if (build(ctx, &m, ids))
        return 1;
    /* ceil(bytes / bucket) per dtype, in the dtype's own width */
    for (int d = 0; d < SELDP_DTYPE_COUNT; d++) {
        size_t bytes = 0, esize = seldp_dtype_size((seldp_dtype)d);
        size_t cap = cfg.bucket_bytes / esize * esize;
        for (size_t k = 0; k < N_BUFS; k++)
            if (BUFS[k].dtype == (seldp_dtype)d)
                bytes += (size_t)BUFS[k].numel * esize;
        expected += (bytes + cap - 1) / cap;
    }
    s0 = seldp_comm_get_stats(ctx->world);
    RANK_CHECK_OK(ctx, seldp_session_initialize_with_buffers(ctx->world, m.model, a->root, ids,
                                                             N_BUFS, &cfg, &s));
    s1 = seldp_comm_get_stats(ctx->world);
    RANK_CHECK(ctx, s1.broadcasts - s0.broadcasts == expected,
               "bucket %zu: %llu broadcasts, expected %llu", cfg.bucket_bytes,
               (unsigned long long)(s1.broadcasts - s0.broadcasts), (unsigned long long)expected);
    for (size_t k = 0; k < N_BUFS; k++) {
        ct_param *p = ct_find(&m, BUFS[k].path);
        size_t bytes = seldp_tensor_nbytes(&p->tensor);
        expected_bytes(k, a->root, want);
        const seldp_param *view = seldp_model_find_path(m.model, BUFS[k].path);
        RANK_CHECK(ctx,
                   view && view->tensor.dtype == BUFS[k].dtype && view->frozen == BUFS[k].frozen,
                   "'%s' changed dtype or frozen flag", p->path);
        RANK_CHECK(ctx, tr_first_diff(want, p->tensor.data, bytes) == bytes,
                   "'%s' is not root's bytes (first difference at byte %zu)", p->path,
                   tr_first_diff(want, p->tensor.data, bytes));
    }
    {
        ct_param *p = ct_find(&m, "other.expert");
        RANK_CHECK(ctx, memcmp(p->snapshot, p->tensor.data, seldp_tensor_nbytes(&p->tensor)) == 0,
                   "unselected quantized base changed");
    }
    seldp_session_destroy(s);
    ct_free(&m);
    return 0;
}

static void buffers_broadcast_bit_exactly(void **state)
{
    (void)state;
    static const size_t buckets[] = {(size_t)25 << 20, 8, 13, 64};
    for (int n = 1; n <= 4; n++) {
        for (size_t i = 0; i < sizeof buckets / sizeof buckets[0]; i++) {
            buf_arg a;
            memset(&a, 0, sizeof a);
            a.root = n - 1;
            a.bucket_bytes = buckets[i];
            tr_run_ranks(n, TEST_TIMEOUT_S, rank_bit_exact, &a);
        }
    }
}

static int rank_rejected(tr_rank_ctx *ctx)
{
    buf_arg *a = ctx->arg;
    test_model m;
    seldp_session *s = NULL;
    seldp_param_id ids[N_BUFS];
    seldp_status st;

    if (build(ctx, &m, ids))
        return 1;
    st = seldp_session_initialize(ctx->world, m.model, a->root, ids, N_BUFS, NULL, &s);
    outcome_record(&a->o, ctx->rank, st);
    a->o.unchanged[ctx->rank] = ct_unchanged(&m, a->o.why[ctx->rank], sizeof a->o.why[0]);
    RANK_CHECK(ctx, s == NULL, "a session came back from a failed initialize");
    ct_free(&m);
    return 0;
}

static void buffers_rejected_by_initialize(void **state)
{
    (void)state;
    for (int n = 1; n <= 4; n++) {
        buf_arg a;
        memset(&a, 0, sizeof a);
        tr_run_ranks(n, TEST_TIMEOUT_S, rank_rejected, &a);
        expect_same_failure(&a.o, n, SELDP_ERR_DTYPE, "'layers.0.experts.0.w1.qweight'",
                            "group rank 0");
    }
}

/* Frozen buffers are never reduced; adapters are. A gradient for a frozen buffer, or for
 * a trainable integer buffer, is an error. */
typedef struct reduce_arg {
    int bad; /* -1: none; 0: gradient for a frozen buffer; 1: for the trainable i8 */
    outcome o;
} reduce_arg;

static int rank_reduce(tr_rank_ctx *ctx)
{
    reduce_arg *a = ctx->arg;
    test_model m;
    test_grads g;
    grads_snapshot before;
    seldp_session *s = NULL;
    seldp_param_id ids[N_BUFS];
    uint64_t total = 0;
    seldp_status st;
    char why[256];

    if (build(ctx, &m, ids))
        return 1;
    RANK_CHECK_OK(
        ctx, seldp_session_initialize_with_buffers(ctx->world, m.model, 0, ids, N_BUFS, NULL, &s));
    ct_snapshot(&m);
    RANK_CHECK_OK(ctx, tg_init(&g));
    RANK_CHECK_OK(ctx, tg_put(&g, buf_id(ctx->rank, LORA_A), SELDP_F32, false,
                              400 + (uint64_t)ctx->rank, 1, SHAPE(16), NULL));
    RANK_CHECK_OK(ctx, tg_put(&g, buf_id(ctx->rank, LORA_B), SELDP_BF16, true,
                              500 + (uint64_t)ctx->rank, 1, SHAPE(8), NULL));
    if (a->bad == 0 && ctx->rank == ctx->size - 1)
        RANK_CHECK_OK(
            ctx, tg_put(&g, buf_id(ctx->rank, FIRST_INT), SELDP_U8, false, 1, 1, SHAPE(64), NULL));
    if (a->bad == 1 && ctx->rank == ctx->size - 1)
        RANK_CHECK_OK(
            ctx, tg_put(&g, buf_id(ctx->rank, MISC_I8), SELDP_I8, false, 1, 1, SHAPE(7), NULL));
    gs_take(&before, g.grads);
    st = seldp_session_reduce(s, g.grads, 4, SELDP_MISSING_ERROR, &total);
    RANK_CHECK(ctx, ct_unchanged(&m, why, sizeof why), "a reduction wrote a parameter: %s", why);
    if (a->bad >= 0) {
        outcome_record(&a->o, ctx->rank, st);
        a->o.unchanged[ctx->rank] =
            gs_same(&before, g.grads, a->o.why[ctx->rank], sizeof a->o.why[0]);
    } else {
        double ref[16];
        float tmp[16];
        RANK_CHECK(ctx, st == SELDP_OK, "reduce: %s", seldp_last_error());
        RANK_CHECK(ctx, seldp_grads_count(g.grads) == 2, "%zu gradients",
                   seldp_grads_count(g.grads));
        for (int j = 0; j < 2; j++) {
            size_t k = j == 0 ? LORA_A : LORA_B;
            seldp_dtype dt = BUFS[k].dtype;
            const seldp_tensor *t = seldp_grads_get(g.grads, buf_id(ctx->rank, k));
            size_t n = (size_t)BUFS[k].numel;
            for (size_t i = 0; i < n; i++)
                ref[i] = 0.0;
            for (int r = 0; r < ctx->size; r++) {
                ct_fill(dt, tmp, n, (j == 0 ? 400u : 500u) + (uint64_t)r);
                for (size_t i = 0; i < n; i++)
                    ref[i] += ct_get(dt, tmp, i) / (4.0 * ctx->size);
            }
            RANK_CHECK(ctx, t && close_to(dt, t->data, ref, n, 2e-6, why, sizeof why), "'%s': %s",
                       BUFS[k].path, why);
        }
    }
    gs_free(&before);
    tg_free(&g);
    seldp_session_destroy(s);
    ct_free(&m);
    return 0;
}

static void adapters_reduced_buffers_never(void **state)
{
    (void)state;
    for (int n = 1; n <= 4; n++) {
        reduce_arg a;
        memset(&a, 0, sizeof a);
        a.bad = -1;
        tr_run_ranks(n, TEST_TIMEOUT_S, rank_reduce, &a);
    }
}

static void gradient_for_a_buffer_is_an_error(void **state)
{
    (void)state;
    for (int n = 1; n <= 4; n++) {
        reduce_arg a;
        char who[32];
        snprintf(who, sizeof who, "group rank %d", n - 1);
        memset(&a, 0, sizeof a);
        a.bad = 0;
        tr_run_ranks(n, TEST_TIMEOUT_S, rank_reduce, &a);
        expect_same_failure(&a.o, n, SELDP_ERR_FROZEN, "'layers.0.experts.0.w1.qweight'", who);
        memset(&a, 0, sizeof a);
        a.bad = 1;
        tr_run_ranks(n, TEST_TIMEOUT_S, rank_reduce, &a);
        expect_same_failure(&a.o, n, SELDP_ERR_DTYPE, "'misc.i8'", who);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(buffers_broadcast_bit_exactly),
        cmocka_unit_test(buffers_rejected_by_initialize),
        cmocka_unit_test(adapters_reduced_buffers_never),
        cmocka_unit_test(gradient_for_a_buffer_is_an_error),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
