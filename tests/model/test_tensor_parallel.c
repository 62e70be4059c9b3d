/* tiny-moe's tensor parallelism (tm_tp; docs/model.md, Sharded and pipelined grid): two TP ranks,
 * each a model of the shard sizes (vocab V/2, d_ff_shared Fs/2) holding its rows of the embedding
 * and of the shared expert's w1 and its columns of w2, run their own tokens through tm_step_local
 * on two threads, communicating through a gather and a sum over the pair. Together they must give
 * the one-model step on the concatenated tokens: the loss sums add up to its loss, each split
 * tensor's gradient equals its slice of the full gradient, and the replicated norms' and
 * routers' gradients add up to the full ones. Also with a TP rank that has no token. */
#define _POSIX_C_SOURCE 200809L /* pthread_barrier_t */

#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "model_util.h"

enum { TP = 2, MAX_BYTES = 1 << 20 };

/* The pair's rendezvous: each rank posts its bytes, both read them in TP order. */
typedef struct pair {
    pthread_barrier_t barrier;
    const void *data[TP];
    size_t bytes[TP];
} pair;

typedef struct rank_ctx {
    pair *pair;
    int rank;
    tm_model *model;
    const int32_t *tokens, *targets;
    size_t T;
    double loss;
    seldp_status st;
} rank_ctx;

static seldp_status pair_gather(void *user, const void *mine, size_t bytes, void *all)
{
    rank_ctx *c = user;
    c->pair->data[c->rank] = mine;
    c->pair->bytes[c->rank] = bytes;
    pthread_barrier_wait(&c->pair->barrier);
    size_t at = 0;
    for (int r = 0; r < TP; r++) {
        memcpy((char *)all + at, c->pair->data[r], c->pair->bytes[r]);
        at += c->pair->bytes[r];
    }
    pthread_barrier_wait(&c->pair->barrier);
    return SELDP_OK;
}

static seldp_status pair_sum(void *user, void *buf, size_t count, seldp_dtype dtype)
{
    rank_ctx *c = user;
    size_t es = dtype == SELDP_F64 ? sizeof(double) : sizeof(float);
    void *sum = calloc(count ? count : 1, es);
    if (!sum)
        return SELDP_ERR_NOMEM;
    c->pair->data[c->rank] = buf;
    pthread_barrier_wait(&c->pair->barrier);
    for (size_t i = 0; i < count; i++)
        for (int r = 0; r < TP; r++) { /* rank order on both: the same bits */
            if (dtype == SELDP_F64)
                ((double *)sum)[i] += ((const double *)c->pair->data[r])[i];
            else
                ((float *)sum)[i] += ((const float *)c->pair->data[r])[i];
        }
    pthread_barrier_wait(&c->pair->barrier);
    memcpy(buf, sum, count * es);
    free(sum);
    return SELDP_OK;
}

static void *rank_main(void *arg)
{
    rank_ctx *c = arg;
    c->st = tm_step_local(c->model, c->tokens, c->targets, c->T, &c->loss);
    return NULL;
}

/* Copy rows [index*n/parts ...) (dim 0) or columns (dim 1) of the full F32 tensor into the
 * shard's storage, or compare the shard's gradient with the full one's slice. */
static void slice_f32(const float *full, int rows, int cols, int dim, int index, float *out)
{
    int r0 = dim == 0 ? index * rows / TP : 0, r1 = dim == 0 ? r0 + rows / TP : rows;
    int c0 = dim == 1 ? index * cols / TP : 0, c1 = dim == 1 ? c0 + cols / TP : cols;
    size_t k = 0;
    for (int r = r0; r < r1; r++)
        for (int col = c0; col < c1; col++)
            out[k++] = full[(size_t)r * (size_t)cols + (size_t)col];
}

static void set_param(tm_model *shard, const tm_model *full, const char *path, int dim, int index)
{
    const tm_param_info *f = tm_param_find(full, path), *s = tm_param_find(shard, path);
    assert_non_null(f);
    assert_non_null(s);
    int rows = (int)f->tensor.shape[0], cols = f->tensor.ndim == 2 ? (int)f->tensor.shape[1] : 1;
    if (dim < 0)
        memcpy(s->tensor.data, f->tensor.data, seldp_tensor_nbytes(&f->tensor));
    else
        slice_f32(f->tensor.data, rows, cols, dim, index, s->tensor.data);
}

/* The split tensors of the shard config: path -> dim (-1: replicated). */
static int split_dim(const char *path)
{
    if (strcmp(path, "embed.weight") == 0 || strcmp(path, "lm_head.weight") == 0 ||
        strstr(path, "shared_expert.w1."))
        return 0;
    if (strstr(path, "shared_expert.w2."))
        return 1;
    return -1;
}

static double rel(const float *got, const float *want, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        num += ((double)got[i] - want[i]) * ((double)got[i] - want[i]);
        den += (double)want[i] * want[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static void run_pair(size_t T0, size_t T1)
{
    tm_config cfg = small_config(TM_QUANT_NONE, SELDP_F32);
    cfg.d_ff_shared = 16;
    tm_config shard_cfg = cfg;
    shard_cfg.vocab /= TP;
    shard_cfg.d_ff_shared /= TP;
    size_t N = T0 + T1;
    int32_t *tokens = calloc(N + 1, sizeof *tokens), *targets = calloc(N + 1, sizeof *targets);
    assert_non_null(tokens);
    assert_non_null(targets);
    draw_tokens(99 + N, N, cfg.vocab, tokens, targets);

    tm_model *full = model_all_experts(&cfg, 0);
    assert_non_null(full);
    double full_loss = 0;
    assert_int_equal(tm_step_local(full, tokens, targets, N, &full_loss), SELDP_OK);

    pair p;
    pthread_barrier_init(&p.barrier, NULL, TP);
    rank_ctx ctx[TP];
    pthread_t threads[TP];
    int experts[16];
    for (int e = 0; e < cfg.experts; e++)
        experts[e] = e;
    tm_part whole = {0, cfg.layers, true, true};
    for (int r = 0; r < TP; r++) {
        ctx[r] = (rank_ctx){
            &p,          r, NULL,    r ? tokens + T0 : tokens, r ? targets + T0 : targets,
            r ? T1 : T0, 0, SELDP_OK};
        assert_int_equal(tm_model_create_part(&shard_cfg, &whole, 1 + r, experts, cfg.experts, NULL,
                                              NULL, &ctx[r].model),
                         SELDP_OK);
        for (size_t i = 0; i < tm_param_count(ctx[r].model); i++) {
            const tm_param_info *q = tm_param_at(ctx[r].model, i);
            if (!q->alias)
                set_param(ctx[r].model, full, q->path, split_dim(q->path), r);
        }
        tm_tp tp = {TP, r, &ctx[r], pair_gather, pair_sum};
        assert_int_equal(tm_model_set_tp(ctx[r].model, &tp), SELDP_OK);
    }
    for (int r = 0; r < TP; r++)
        assert_int_equal(pthread_create(&threads[r], NULL, rank_main, &ctx[r]), 0);
    for (int r = 0; r < TP; r++)
        pthread_join(threads[r], NULL);
    for (int r = 0; r < TP; r++)
        if (ctx[r].st != SELDP_OK)
            fail_msg("TP rank %d: %s", r, tm_last_error());

    assert_true(fabs(ctx[0].loss + ctx[1].loss - full_loss) <= 1e-5 * fabs(full_loss));
    for (size_t i = 0; i < tm_param_count(full); i++) {
        const tm_param_info *f = tm_param_at(full, i);
        if (f->alias || f->frozen)
            continue;
        size_t n = seldp_tensor_numel(&f->tensor);
        const float *want = tm_param_grad(full, f->path);
        int dim = split_dim(f->path);
        float *got = calloc(n, sizeof *got), *slice = calloc(n, sizeof *slice);
        assert_non_null(got);
        assert_non_null(slice);
        if (dim < 0) { /* replicated: each TP rank's own tokens; the sum is the whole */
            for (int r = 0; r < TP; r++) {
                const float *g = tm_param_grad(ctx[r].model, f->path);
                for (size_t k = 0; k < n; k++)
                    got[k] += g[k];
            }
            double err = rel(got, want, n);
            if (!(err <= 1e-5))
                fail_msg("T %zu + %zu: %s: the TP ranks' gradients sum to %.3e from the full one",
                         T0, T1, f->path, err);
        } else { /* split: every token of the pair, this rank's slice */
            int rows = (int)f->tensor.shape[0], cols = (int)f->tensor.shape[1];
            for (int r = 0; r < TP; r++) {
                slice_f32(want, rows, cols, dim, r, slice);
                double err = rel(tm_param_grad(ctx[r].model, f->path), slice, n / TP);
                if (!(err <= 1e-5))
                    fail_msg("T %zu + %zu: %s: TP rank %d's shard is %.3e from its slice", T0, T1,
                             f->path, r, err);
            }
        }
        free(got);
        free(slice);
    }
    for (int r = 0; r < TP; r++)
        tm_model_destroy(ctx[r].model);
    pthread_barrier_destroy(&p.barrier);
    tm_model_destroy(full);
    free(tokens);
    free(targets);
}

static void pair_of_ranks(void **state)
{
    (void)state;
    run_pair(13, 9);
}

static void rank_without_tokens(void **state)
{
    (void)state;
    run_pair(0, 11);
    run_pair(7, 0);
}

static void bad_tp(void **state)
{
    (void)state;
    tm_config cfg = small_config(TM_QUANT_NONE, SELDP_F32);
    tm_model *m = model_all_experts(&cfg, 0);
    assert_non_null(m);
    tm_tp tp = {2, 2, NULL, pair_gather, pair_sum};
    assert_int_equal(tm_model_set_tp(m, &tp), SELDP_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(tm_last_error(), "TP rank 2 of 2"));
    tp = (tm_tp){2, 0, NULL, NULL, pair_sum};
    assert_int_equal(tm_model_set_tp(m, &tp), SELDP_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(tm_last_error(), "without callbacks"));
    tm_model_destroy(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(pair_of_ranks),
        cmocka_unit_test(rank_without_tokens),
        cmocka_unit_test(bad_tp),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
