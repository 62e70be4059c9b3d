/* Tensor parallelism of tiny-moe (docs/model.md, Sharded and pipelined grid), as Megatron's
 * tensor-parallel layers with sequence parallelism compute it (tinymoe.h, tm_tp). A TP rank holds
 * rows [r*V/tp, (r+1)*V/tp) of the embedding, rows of the shared expert's w1 and columns of its w2,
 * and its own T of the TP group's S tokens (rank r's begin at S_offset, in TP order):
 *
 *   embedding   ids (S) gathered; partial (S,D) from its rows, zero elsewhere; summed over
 *               TP and scattered: h (T,D) its tokens' rows
 *   shared      u (T,D) gathered to U (S,D); pre (S,Fs/tp) = U W1^T; partial (S,D) =
 *   expert      silu(pre) W2^T summed over TP and scattered into h (T,D)
 *   head        z (T,D) = rmsnorm(h) g_f gathered to Z (S,D); logits (S,V/tp) = Z E^T; the
 *               max, the sum of exp and the target logit of each token combined over TP;
 *               dZ (S,D) = dlogits E summed over TP and scattered
 *
 * The gradients of the split tensors cover the S tokens; the loss sum counts this rank's T.
 * Scatter: a sum over TP of the (S,width) partials, then this rank's rows (the reduce-scatter
 * of Megatron's sequence-parallel regions, written as the TP group's allreduce). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cblas.h>

#include "blas_gate.h"

#include "tm_internal.h"

int tm__vocab(const tm_model *m)
{
    return m->cfg.vocab * (m->tp.size > 1 ? m->tp.size : 1);
}

seldp_status tm_model_set_tp(tm_model *m, const tm_tp *tp)
{
    if (!m || !tp || tp->size < 1 || tp->rank < 0 || tp->rank >= tp->size ||
        (tp->size > 1 && (!tp->gather || !tp->sum)))
        return tm__fail(SELDP_ERR_INVALID_ARGUMENT, "rank %d: tm_model_set_tp: TP rank %d of %d%s",
                        m ? m->rank : -1, tp ? tp->rank : -1, tp ? tp->size : 0,
                        tp && tp->size > 1 && (!tp->gather || !tp->sum) ? " without callbacks"
                                                                        : "");
    size_t *counts = calloc((size_t)tp->size, sizeof *counts);
    if (!counts)
        return tm__fail(SELDP_ERR_NOMEM, "rank %d: out of memory", m->rank);
    free(m->tp_counts);
    m->tp_counts = counts;
    m->tp_counts_n = tp->size;
    m->tp = *tp;
    return SELDP_OK;
}

seldp_status tm__tp_begin(tm_model *m)
{
    m->S = m->T;
    m->S_offset = 0;
    if (m->tp.size <= 1)
        return SELDP_OK;
    uint64_t mine = m->T, *all = calloc((size_t)m->tp.size, sizeof *all);
    if (!all)
        return tm__fail(SELDP_ERR_NOMEM, "rank %d: out of memory", m->rank);
    seldp_status st = m->tp.gather(m->tp.user, &mine, sizeof mine, all);
    if (st != SELDP_OK) {
        free(all);
        return tm__fail(st, "rank %d: gathering the token counts of its TP group", m->rank);
    }
    m->S = 0;
    for (int r = 0; r < m->tp.size; r++) {
        m->tp_counts[r] = (size_t)all[r];
        if (r < m->tp.rank)
            m->S_offset += (size_t)all[r];
        m->S += (size_t)all[r];
    }
    free(all);
    return SELDP_OK;
}

/* mine (T,width) of every TP rank into all (S,width). */
static seldp_status gather_rows(tm_model *m, const void *mine, size_t elem, size_t width, void *all,
                                const char *what)
{
    seldp_status st = m->tp.gather(m->tp.user, mine, m->T * width * elem, all);
    if (st != SELDP_OK)
        return tm__fail(st, "rank %d: gathering %s over its TP group", m->rank, what);
    return SELDP_OK;
}

/* Sum all (S,width) over TP, then this rank's rows into out (T,width): added when `add`. */
static seldp_status scatter_rows(tm_model *m, float *all, size_t width, float *out, bool add,
                                 const char *what)
{
    seldp_status st = m->tp.sum(m->tp.user, all, m->S * width, SELDP_F32);
    if (st != SELDP_OK)
        return tm__fail(st, "rank %d: summing %s over its TP group", m->rank, what);
    const float *rows = all + m->S_offset * width;
    for (size_t i = 0; i < m->T * width; i++)
        out[i] = add ? out[i] + rows[i] : rows[i];
    return SELDP_OK;
}

static void *alloc_floats(size_t n)
{
    return calloc(n ? n : 1, sizeof(float));
}

seldp_status tm__tp_embed_forward(tm_model *m, const int32_t *tokens, float *h)
{
    seldp_status st = SELDP_OK;
    const size_t D = (size_t)m->cfg.d_model, Vl = (size_t)m->cfg.vocab;
    const int64_t v0 = (int64_t)m->tp.rank * (int64_t)Vl;
    float *partial = alloc_floats(m->S * D);
    int32_t *ids = realloc(m->tp_tokens, (m->S ? m->S : 1) * sizeof *ids);
    if (!partial || !ids)
        TM_FAIL(SELDP_ERR_NOMEM, "rank %d: out of memory in the embedding", m->rank);
    m->tp_tokens = ids;
    TM_CHECK(gather_rows(m, tokens, sizeof *tokens, 1, ids, "the token ids"));
    const float *E = m->work[m->embed];
    for (size_t s = 0; s < m->S; s++) {
        int64_t v = (int64_t)ids[s] - v0;
        if (v >= 0 && v < (int64_t)Vl)
            memcpy(partial + s * D, E + (size_t)v * D, D * sizeof *partial);
    }
    TM_CHECK(scatter_rows(m, partial, D, h, false, "the embedding rows"));
fail:
    free(partial);
    return st;
}

seldp_status tm__tp_embed_backward(tm_model *m, const float *dh)
{
    seldp_status st = SELDP_OK;
    const size_t D = (size_t)m->cfg.d_model, Vl = (size_t)m->cfg.vocab;
    const int64_t v0 = (int64_t)m->tp.rank * (int64_t)Vl;
    float *all = alloc_floats(m->S * D);
    if (!all)
        TM_FAIL(SELDP_ERR_NOMEM, "rank %d: out of memory in the embedding backward", m->rank);
    TM_CHECK(gather_rows(m, dh, sizeof *dh, D, all, "the embedding's output gradients"));
    float *dE = m->grad[m->embed];
    for (size_t s = 0; s < m->S; s++) {
        int64_t v = (int64_t)m->tp_tokens[s] - v0;
        if (v < 0 || v >= (int64_t)Vl)
            continue;
        for (size_t i = 0; i < D; i++)
            dE[(size_t)v * D + i] += all[s * D + i];
    }
fail:
    free(all);
    return st;
}

seldp_status tm__tp_head(tm_model *m, const float *h, const int32_t *targets, double *loss_sum,
                         float *dh)
{
    seldp_status st = SELDP_OK;
    const size_t T = m->T, S = m->S, D = (size_t)m->cfg.d_model, Vl = (size_t)m->cfg.vocab;
    const int P = m->tp.size;
    const int64_t v0 = (int64_t)m->tp.rank * (int64_t)Vl;
    for (size_t t = 0; t < T; t++)
        if (targets[t] < 0 || targets[t] >= tm__vocab(m))
            return tm__fail(SELDP_ERR_INVALID_ARGUMENT,
                            "rank %d: target %zu is %d, expected an id in [0, %d)", m->rank, t,
                            (int)targets[t], tm__vocab(m));
    float *z = alloc_floats(T * D), *rstd = alloc_floats(T), *dz = alloc_floats(T * D);
    float *Z = alloc_floats(S * D), *dZ = alloc_floats(S * D), *logits = alloc_floats(S * Vl);
    int32_t *tgt = calloc(S ? S : 1, sizeof *tgt);
    double *maxima = calloc((size_t)P * (S ? S : 1), sizeof *maxima);
    double *comb = calloc(2 * (S ? S : 1), sizeof *comb); /* sum of exp, then target logit */
    double *mx = calloc(S ? S : 1, sizeof *mx);
    double loss = 0.0;
    if (!z || !rstd || !dz || !Z || !dZ || !logits || !tgt || !maxima || !comb || !mx)
        TM_FAIL(SELDP_ERR_NOMEM, "rank %d: out of memory in the head", m->rank);
    const float *gf = m->work[m->final_norm], *E = m->work[m->embed];
    tm__rmsnorm_forward(h, gf, T, (int)D, m->cfg.eps, z, rstd);
    TM_CHECK(gather_rows(m, z, sizeof *z, D, Z, "the final norm's output"));
    TM_CHECK(gather_rows(m, targets, sizeof *targets, 1, tgt, "the targets"));
    // logits (S,V/tp) = Z (S,D) . E^T (D,V/tp)
    if (S)
        tm__sgemm(CblasNoTrans, CblasTrans, (int)S, (int)Vl, (int)D, 1.0f, Z, (int)D, E, (int)D,
                  0.0f, logits, (int)Vl);
    /* the maximum of each token's logits over the whole vocabulary */
    for (size_t s = 0; s < S; s++) {
        float best = logits[s * Vl];
        for (size_t v = 1; v < Vl; v++)
            best = fmaxf(best, logits[s * Vl + v]);
        mx[s] = best;
    }
    st = m->tp.gather(m->tp.user, mx, S * sizeof *mx, maxima);
    if (st != SELDP_OK)
        TM_FAIL(st, "rank %d: gathering the logits' maxima over its TP group", m->rank);
    for (size_t s = 0; s < S; s++) {
        mx[s] = maxima[s];
        for (int r = 1; r < P; r++)
            mx[s] = fmax(mx[s], maxima[(size_t)r * S + s]);
        for (size_t v = 0; v < Vl; v++)
            comb[s] += exp((double)logits[s * Vl + v] - mx[s]);
        int64_t y = (int64_t)tgt[s] - v0;
        if (y >= 0 && y < (int64_t)Vl)
            comb[S + s] = logits[s * Vl + (size_t)y];
    }
    st = m->tp.sum(m->tp.user, comb, 2 * S, SELDP_F64);
    if (st != SELDP_OK)
        TM_FAIL(st, "rank %d: summing the softmax terms over its TP group", m->rank);
    for (size_t s = 0; s < S; s++) {
        if (s >= m->S_offset && s < m->S_offset + T)
            loss += log(comb[s]) + mx[s] - comb[S + s];
        /* dlogits = softmax - onehot(target), in place, this rank's columns */
        for (size_t v = 0; v < Vl; v++)
            logits[s * Vl + v] = (float)(exp((double)logits[s * Vl + v] - mx[s]) / comb[s]);
        int64_t y = (int64_t)tgt[s] - v0;
        if (y >= 0 && y < (int64_t)Vl)
            logits[s * Vl + (size_t)y] -= 1.0f;
    }
    if (S) {
        // dZ (S,D) = dlogits (S,V/tp) . E (V/tp,D), a partial sum over the vocabulary
        tm__sgemm(CblasNoTrans, CblasNoTrans, (int)S, (int)D, (int)Vl, 1.0f, logits, (int)Vl, E,
                  (int)D, 0.0f, dZ, (int)D);
        // dE (V/tp,D) += dlogits^T (V/tp,S) . Z (S,D)
        tm__sgemm(CblasTrans, CblasNoTrans, (int)Vl, (int)D, (int)S, 1.0f, logits, (int)Vl, Z,
                  (int)D, 1.0f, m->grad[m->embed], (int)D);
    }
    TM_CHECK(scatter_rows(m, dZ, D, dz, false, "the head's input gradients"));
    memset(dh, 0, T * D * sizeof *dh);
    tm__rmsnorm_backward(dz, h, gf, rstd, T, (int)D, dh, m->grad[m->final_norm]);
    if (loss_sum)
        *loss_sum = loss;
fail:
    free(z);
    free(rstd);
    free(dz);
    free(Z);
    free(dZ);
    free(logits);
    free(tgt);
    free(maxima);
    free(comb);
    free(mx);
    return st;
}

/* The layer's gathered input and pre-activation, kept for the backward. */
static seldp_status shared_cache(tm_model *m, tm_layer_cache *c)
{
    const size_t D = (size_t)m->cfg.d_model, Fl = (size_t)m->cfg.d_ff_shared;
    float *u = realloc(c->tp_u, (m->S ? m->S : 1) * D * sizeof *u);
    if (u)
        c->tp_u = u;
    float *pre = realloc(c->tp_pre, (m->S ? m->S : 1) * Fl * sizeof *pre);
    if (pre)
        c->tp_pre = pre;
    if (!u || !pre)
        return tm__fail(SELDP_ERR_NOMEM, "rank %d: out of memory in the shared expert", m->rank);
    return SELDP_OK;
}

// u (T,D) of this rank; U (S,D), pre (S,Fs/tp) cached; h (T,D) += its rows of the TP sum
seldp_status tm__tp_shared_forward(tm_model *m, int l, float *h)
{
    seldp_status st = SELDP_OK;
    tm_layer_cache *c = &m->cache[l];
    const size_t S = m->S, D = (size_t)m->cfg.d_model, Fl = (size_t)m->cfg.d_ff_shared;
    float *act = alloc_floats(S * Fl), *partial = alloc_floats(S * D);
    if (!act || !partial)
        TM_FAIL(SELDP_ERR_NOMEM, "rank %d: out of memory in layers.%d.shared_expert", m->rank, l);
    TM_CHECK(shared_cache(m, c));
    TM_CHECK(gather_rows(m, c->u, sizeof *c->u, D, c->tp_u, "the shared expert's input"));
    if (S) {
        // pre (S,Fs/tp) = U (S,D) . w1s^T (D,Fs/tp): the column-parallel w1
        tm__sgemm(CblasNoTrans, CblasTrans, (int)S, (int)Fl, (int)D, 1.0f, c->tp_u, (int)D,
                  m->work[m->shared_w1[l]], (int)D, 0.0f, c->tp_pre, (int)Fl);
        for (size_t i = 0; i < S * Fl; i++)
            act[i] = c->tp_pre[i] * tm__sigmoid(c->tp_pre[i]);
        // partial (S,D) = act (S,Fs/tp) . w2s^T (Fs/tp,D): the row-parallel w2
        tm__sgemm(CblasNoTrans, CblasTrans, (int)S, (int)D, (int)Fl, 1.0f, act, (int)Fl,
                  m->work[m->shared_w2[l]], (int)Fl, 0.0f, partial, (int)D);
    }
    TM_CHECK(scatter_rows(m, partial, D, h, true, "the shared expert's output"));
fail:
    free(act);
    free(partial);
    return st;
}

// dh (T,D) of this rank; dw1s, dw2s += over the S tokens; s_du (T,D) its rows of the TP sum
seldp_status tm__tp_shared_backward(tm_model *m, int l, const float *dh)
{
    seldp_status st = SELDP_OK;
    tm_layer_cache *c = &m->cache[l];
    const size_t S = m->S, D = (size_t)m->cfg.d_model, Fl = (size_t)m->cfg.d_ff_shared;
    float *dH = alloc_floats(S * D), *act = alloc_floats(S * Fl), *dpre = alloc_floats(S * Fl);
    float *dU = alloc_floats(S * D);
    if (!dH || !act || !dpre || !dU)
        TM_FAIL(SELDP_ERR_NOMEM, "rank %d: out of memory in layers.%d.shared_expert's backward",
                m->rank, l);
    TM_CHECK(gather_rows(m, dh, sizeof *dh, D, dH, "the shared expert's output gradients"));
    if (S) {
        for (size_t i = 0; i < S * Fl; i++)
            act[i] = c->tp_pre[i] * tm__sigmoid(c->tp_pre[i]);
        // dw2s (D,Fs/tp) += dH^T (D,S) . act (S,Fs/tp)
        tm__sgemm(CblasTrans, CblasNoTrans, (int)D, (int)Fl, (int)S, 1.0f, dH, (int)D, act, (int)Fl,
                  1.0f, m->grad[m->shared_w2[l]], (int)Fl);
        // dact (S,Fs/tp) = dH (S,D) . w2s (D,Fs/tp), then through silu
        tm__sgemm(CblasNoTrans, CblasNoTrans, (int)S, (int)Fl, (int)D, 1.0f, dH, (int)D,
                  m->work[m->shared_w2[l]], (int)Fl, 0.0f, dpre, (int)Fl);
        for (size_t i = 0; i < S * Fl; i++) {
            const float a = c->tp_pre[i], sg = tm__sigmoid(a);
            dpre[i] *= sg * (1.0f + a * (1.0f - sg));
        }
        // dw1s (Fs/tp,D) += dpre^T (Fs/tp,S) . U (S,D)
        tm__sgemm(CblasTrans, CblasNoTrans, (int)Fl, (int)D, (int)S, 1.0f, dpre, (int)Fl, c->tp_u,
                  (int)D, 1.0f, m->grad[m->shared_w1[l]], (int)D);
        // dU (S,D) = dpre (S,Fs/tp) . w1s (Fs/tp,D), a partial sum over Fs
        tm__sgemm(CblasNoTrans, CblasNoTrans, (int)S, (int)D, (int)Fl, 1.0f, dpre, (int)Fl,
                  m->work[m->shared_w1[l]], (int)D, 0.0f, dU, (int)D);
    }
    TM_CHECK(scatter_rows(m, dU, D, c->s_du, false, "the shared expert's input gradients"));
fail:
    free(dH);
    free(act);
    free(dpre);
    free(dU);
    return st;
}
