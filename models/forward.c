/* tiny-moe forward and backward on the CPU in FP32 (cblas_sgemm), one function pair per
 * piece so that the harness can run the experts of a layer on the ranks that own them and
 * move the routed rows with an all-to-all in between. Gradients accumulate into the
 * model's FP32 block and are derivatives of this rank's loss SUM. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cblas.h>

#include "blas_gate.h"

#include "tm_internal.h"

void tm_blas_single_thread(void)
{
    openblas_set_num_threads(1);
}

const char *tm_blas_core(void)
{
    return openblas_get_corename();
}

static seldp_status check_layer(const tm_model *m, int l, const char *fn)
{
    if (l < m->part.first_layer || l >= m->part.end_layer)
        return tm__fail(SELDP_ERR_INVALID_ARGUMENT, "rank %d: %s: layer %d outside [%d, %d)",
                        m->rank, fn, l, m->part.first_layer, m->part.end_layer);
    if (!m->embedded)
        return tm__fail(SELDP_ERR_INVALID_ARGUMENT,
                        "rank %d: %s: layer %d called before tm_embed_forward", m->rank, fn, l);
    return SELDP_OK;
}

static tm_expert_slot *held_expert(tm_model *m, int l, int e, const char *fn, seldp_status *st)
{
    *st = SELDP_OK;
    if (l < m->part.first_layer || l >= m->part.end_layer) {
        *st = tm__fail(SELDP_ERR_INVALID_ARGUMENT, "rank %d: %s: layer %d outside [%d, %d)",
                       m->rank, fn, l, m->part.first_layer, m->part.end_layer);
        return NULL;
    }
    if (e < 0 || e >= m->cfg.experts || !m->owns[e]) {
        *st = tm__fail(SELDP_ERR_NOT_FOUND,
                       "rank %d: %s: layers.%d.experts.%d is not held by this rank", m->rank, fn, l,
                       e);
        return NULL;
    }
    return &m->experts[(size_t)l * (size_t)m->cfg.experts + (size_t)e];
}

/* ---- RMSNorm ------------------------------------------------------------------------- */

// inp (T,D), weight (D), out (T,D), rstd (T)
void tm__rmsnorm_forward(const float *inp, const float *weight, size_t T, int D, double eps,
                         float *out, float *rstd)
{
    for (size_t t = 0; t < T; t++) {
        const float *x = inp + t * (size_t)D;
        float ss = 0.0f;
        for (int i = 0; i < D; i++)
            ss += x[i] * x[i];
        float r = 1.0f / sqrtf(ss / (float)D + (float)eps);
        rstd[t] = r;
        for (int i = 0; i < D; i++)
            out[t * (size_t)D + (size_t)i] = x[i] * r * weight[i];
    }
}

// dout (T,D), inp (T,D), weight (D), rstd (T); dinp (T,D) +=, dweight (D) +=
void tm__rmsnorm_backward(const float *dout, const float *inp, const float *weight,
                          const float *rstd, size_t T, int D, float *dinp, float *dweight)
{
    for (size_t t = 0; t < T; t++) {
        const float *x = inp + t * (size_t)D;
        const float *dy = dout + t * (size_t)D;
        const float r = rstd[t];
        float dot = 0.0f; /* sum_i dy_i g_i x_i */
        for (int i = 0; i < D; i++) {
            dot += dy[i] * weight[i] * x[i];
            dweight[i] += dy[i] * x[i] * r;
        }
        const float c = r * r * r * dot / (float)D;
        for (int i = 0; i < D; i++)
            dinp[t * (size_t)D + (size_t)i] += r * dy[i] * weight[i] - c * x[i];
    }
}

/* ---- embedding ----------------------------------------------------------------------- */

seldp_status tm_embed_forward(tm_model *m, const int32_t *tokens, size_t T, float *h)
{
    const int D = m->cfg.d_model;
    for (size_t t = 0; t < T; t++) {
        if (tokens[t] < 0 || tokens[t] >= tm__vocab(m))
            return tm__fail(SELDP_ERR_INVALID_ARGUMENT,
                            "rank %d: token %zu is %d, expected an id in [0, %d)", m->rank, t,
                            (int)tokens[t], tm__vocab(m));
    }
    seldp_status st = tm__ensure_caches(m, T);
    if (st != SELDP_OK)
        return st;
    if (T)
        memcpy(m->tokens, tokens, T * sizeof *tokens);
    m->T = T;
    m->embedded = true;
    for (int l = 0; l < m->cfg.layers; l++)
        m->cache[l].routed = m->cache[l].combined = m->cache[l].combined_back = false;
    st = tm__tp_begin(m);
    if (st != SELDP_OK || !m->part.embed)
        return st; /* a later pipeline stage: h is the previous stage's output */
    if (m->tp.size > 1)
        return tm__tp_embed_forward(m, tokens, h);
    const float *E = m->work[m->embed];
    for (size_t t = 0; t < T; t++)
        memcpy(h + t * (size_t)D, E + (size_t)tokens[t] * (size_t)D, (size_t)D * sizeof(float));
    return SELDP_OK;
}

seldp_status tm_embed_backward(tm_model *m, const float *dh)
{
    if (!m->embedded)
        return tm__fail(SELDP_ERR_INVALID_ARGUMENT,
                        "rank %d: tm_embed_backward before tm_embed_forward", m->rank);
    if (!m->part.embed)
        return SELDP_OK; /* dh goes to the previous pipeline stage */
    if (m->tp.size > 1)
        return tm__tp_embed_backward(m, dh);
    const int D = m->cfg.d_model;
    float *dE = m->grad[m->embed];
    for (size_t t = 0; t < m->T; t++) {
        float *row = dE + (size_t)m->tokens[t] * (size_t)D;
        for (int i = 0; i < D; i++)
            row[i] += dh[t * (size_t)D + (size_t)i];
    }
    return SELDP_OK;
}

/* ---- router -------------------------------------------------------------------------- */

/* The K largest of p (E) into sel, largest first: the k-th is the first expert of the largest
 * probability not yet taken (strict >: among equal probabilities the lower index wins; a NaN
 * is taken only where it comes first). scan_top_k says so directly, one pass over E a slot,
 * marking the experts taken in a bitmap (or, beyond TOP_K_MARKS experts, looking them up among
 * the slots before it). */
#define TOP_K_MARKS 4096

static void scan_top_k(const float *p, int E, int K, int *sel)
{
    uint64_t marks[TOP_K_MARKS / 64];
    const bool marked = E <= TOP_K_MARKS;
    if (marked)
        memset(marks, 0, ((size_t)E + 63) / 64 * sizeof marks[0]);
    for (int k = 0; k < K; k++) {
        int best = -1;
        for (int e = 0; e < E; e++) {
            bool taken = false;
            if (marked)
                taken = (marks[e >> 6] >> (e & 63)) & 1u;
            else
                for (int j = 0; j < k; j++)
                    taken = taken || sel[j] == e;
            if (!taken && (best < 0 || p[e] > p[best]))
                best = e;
        }
        sel[k] = best;
        if (marked)
            marks[best >> 6] |= (uint64_t)1 << (best & 63);
    }
}

/* The same choice in one pass over E: the K best so far, kept in order (a later expert moves
 * ahead of a kept one only when strictly larger, so equal probabilities stay in index order).
 * Without NaN this is scan_top_k's order; a NaN, whose comparisons all fail, hands the whole
 * choice to scan_top_k. */
#define TOP_K_KEPT 64

void tm__top_k(const float *p, int E, int K, int *sel)
{
    float kept[TOP_K_KEPT];
    if (K > TOP_K_KEPT) {
        scan_top_k(p, E, K, sel);
        return;
    }
    int n = 0;
    for (int e = 0; e < E; e++) {
        const float x = p[e];
        if (x != x) {
            scan_top_k(p, E, K, sel);
            return;
        }
        if (n == K && !(x > kept[K - 1]))
            continue;
        int j = n < K ? n++ : K - 1;
        for (; j > 0 && x > kept[j - 1]; j--) {
            kept[j] = kept[j - 1];
            sel[j] = sel[j - 1];
        }
        kept[j] = x;
        sel[j] = e;
    }
}

seldp_status tm_route_forward(tm_model *m, int l, const float *h, tm_route *route)
{
    seldp_status st = check_layer(m, l, "tm_route_forward");
    if (st != SELDP_OK)
        return st;
    const size_t T = m->T;
    const int D = m->cfg.d_model, E = m->cfg.experts, K = m->cfg.top_k;
    tm_layer_cache *c = &m->cache[l];
    if (T) {
        memcpy(c->h_in, h, T * (size_t)D * sizeof(float));
        tm__rmsnorm_forward(c->h_in, m->work[m->norm[l]], T, D, m->cfg.eps, c->u, c->rstd);
        // u (T,D) . W_r^T (D,E) -> probs (T,E)
        tm__sgemm(CblasNoTrans, CblasTrans, (int)T, E, D, 1.0f, c->u, D, m->work[m->router[l]], D,
                  0.0f, c->probs, E);
    }
    for (size_t t = 0; t < T; t++) {
        float *p = c->probs + t * (size_t)E;
        float mx = p[0];
        for (int e = 1; e < E; e++)
            mx = fmaxf(mx, p[e]);
        float sum = 0.0f;
        for (int e = 0; e < E; e++) {
            p[e] = expf(p[e] - mx);
            sum += p[e];
        }
        for (int e = 0; e < E; e++)
            p[e] /= sum;
        c->lse[t] = mx + logf(sum);
        int *sel = c->choice + t * (size_t)K;
        float *gate = c->gate + t * (size_t)K;
        float kept = 0.0f;
        tm__top_k(p, E, K, sel);
        for (int k = 0; k < K; k++)
            kept += p[sel[k]];
        for (int k = 0; k < K; k++)
            gate[k] = p[sel[k]] / kept;
    }
    tm__capacity_drop(m, c);
    c->routed = true;
    c->combined = c->combined_back = false;
    route->T = T;
    route->K = K;
    route->expert = c->expert;
    route->gate = c->gate;
    route->x = c->u;
    route->choice = c->choice;
    return SELDP_OK;
}

seldp_status tm_route_get(const tm_model *m, int l, tm_route *route)
{
    if (l < 0 || l >= m->cfg.layers || !m->embedded || !m->cache[l].routed)
        return tm__fail(SELDP_ERR_INVALID_ARGUMENT,
                        "rank %d: tm_route_get: layer %d was not routed in this step", m->rank, l);
    const tm_layer_cache *c = &m->cache[l];
    route->T = m->T;
    route->K = m->cfg.top_k;
    route->expert = c->expert;
    route->gate = c->gate;
    route->x = c->u;
    return SELDP_OK;
}

seldp_status tm_route_backward(tm_model *m, int l, const float *dx, float *dh)
{
    seldp_status st = check_layer(m, l, "tm_route_backward");
    float *dlogits = NULL, *du = NULL;
    if (st != SELDP_OK)
        return st;
    tm_layer_cache *c = &m->cache[l];
    if (!c->combined_back)
        return tm__fail(SELDP_ERR_INVALID_ARGUMENT,
                        "rank %d: tm_route_backward: layer %d before tm_combine_backward", m->rank,
                        l);
    const size_t T = m->T;
    const int D = m->cfg.d_model, E = m->cfg.experts, K = m->cfg.top_k;
    if (T == 0)
        return SELDP_OK;
    dlogits = calloc(T * (size_t)E, sizeof *dlogits);
    du = malloc(T * (size_t)D * sizeof *du);
    if (!dlogits || !du)
        TM_FAIL(SELDP_ERR_NOMEM, "rank %d: out of memory in layer %d's router backward", m->rank,
                l);
    for (size_t t = 0; t < T; t++) {
        const float *p = c->probs + t * (size_t)E;
        const int *sel = c->choice + t * (size_t)K;
        const float *gate = c->gate + t * (size_t)K;
        const float *dgate = c->dgate + t * (size_t)K;
        float *dl = dlogits + t * (size_t)E;
        /* gate_k = p_k / S over the selected set: dp_k = (dgate_k - sum_j gate_j dgate_j) / S
         * (a dropped slot has dgate 0 but still counts in S: gates are not renormalized) */
        float kept = 0.0f, gdg = 0.0f;
        for (int k = 0; k < K; k++) {
            kept += p[sel[k]];
            gdg += gate[k] * dgate[k];
        }
        for (int k = 0; k < K; k++)
            dl[sel[k]] = (dgate[k] - gdg) / kept;
        /* the router losses' dp, then softmax: dlogit_e = p_e (dp_e - sum_j p_j dp_j) */
        tm__router_loss_backward(m, c, t, dl);
    }
    // dW_r (E,D) += dlogits^T (E,T) . u (T,D)
    tm__sgemm(CblasTrans, CblasNoTrans, E, D, (int)T, 1.0f, dlogits, E, c->u, D, 1.0f,
              m->grad[m->router[l]], D);
    // du (T,D) = dlogits (T,E) . W_r (E,D) + sum_k dx[t,k]
    tm__sgemm(CblasNoTrans, CblasNoTrans, (int)T, D, E, 1.0f, dlogits, E, m->work[m->router[l]], D,
              0.0f, du, D);
    for (size_t t = 0; t < T; t++) {
        for (int k = 0; k < K; k++) {
            if (c->expert[t * (size_t)K + (size_t)k] < 0)
                continue; /* dropped: the slot reached no expert */
            const float *row = dx + (t * (size_t)K + (size_t)k) * (size_t)D;
            for (int i = 0; i < D; i++)
                du[t * (size_t)D + (size_t)i] += row[i];
        }
    }
    if (c->s_du) {
        for (size_t i = 0; i < T * (size_t)D; i++)
            du[i] += c->s_du[i];
    }
    tm__rmsnorm_backward(du, c->h_in, m->work[m->norm[l]], c->rstd, T, D, dh, m->grad[m->norm[l]]);
fail:
    free(dlogits);
    free(du);
    return st;
}

/* ---- combine ------------------------------------------------------------------------- */

seldp_status tm_combine_forward(tm_model *m, int l, const float *y, float *h)
{
    seldp_status st = check_layer(m, l, "tm_combine_forward");
    if (st != SELDP_OK)
        return st;
    tm_layer_cache *c = &m->cache[l];
    if (!c->routed)
        return tm__fail(SELDP_ERR_INVALID_ARGUMENT,
                        "rank %d: tm_combine_forward: layer %d before tm_route_forward", m->rank,
                        l);
    const size_t T = m->T;
    const int D = m->cfg.d_model, K = m->cfg.top_k;
    if (T)
        memcpy(c->y, y, T * (size_t)K * (size_t)D * sizeof(float));
    for (size_t t = 0; t < T; t++) {
        float *out = h + t * (size_t)D;
        memcpy(out, c->h_in + t * (size_t)D, (size_t)D * sizeof(float));
        for (int k = 0; k < K; k++) {
            if (c->expert[t * (size_t)K + (size_t)k] < 0)
                continue; /* dropped: the token keeps its residual */
            const float g = c->gate[t * (size_t)K + (size_t)k];
            const float *row = c->y + (t * (size_t)K + (size_t)k) * (size_t)D;
            for (int i = 0; i < D; i++)
                out[i] += g * row[i];
        }
    }
    if (m->shared_w1[l] >= 0)
        TM_CHECK(tm__shared_forward(m, l, h));
    c->combined = true;
fail:
    return st;
}

seldp_status tm_combine_backward(tm_model *m, int l, const float *dh, float *dy)
{
    seldp_status st = check_layer(m, l, "tm_combine_backward");
    if (st != SELDP_OK)
        return st;
    tm_layer_cache *c = &m->cache[l];
    if (!c->combined)
        return tm__fail(SELDP_ERR_INVALID_ARGUMENT,
                        "rank %d: tm_combine_backward: layer %d before tm_combine_forward", m->rank,
                        l);
    const int D = m->cfg.d_model, K = m->cfg.top_k;
    if (m->shared_w1[l] >= 0)
        TM_CHECK(tm__shared_backward(m, l, dh));
    for (size_t t = 0; t < m->T; t++) {
        const float *d = dh + t * (size_t)D;
        for (int k = 0; k < K; k++) {
            const size_t slot = t * (size_t)K + (size_t)k;
            if (c->expert[slot] < 0) {
                memset(dy + slot * (size_t)D, 0, (size_t)D * sizeof *dy);
                c->dgate[slot] = 0.0f;
                continue;
            }
            const float g = c->gate[slot];
            const float *row = c->y + slot * (size_t)D;
            float dot = 0.0f;
            for (int i = 0; i < D; i++) {
                dy[slot * (size_t)D + (size_t)i] = g * d[i];
                dot += d[i] * row[i];
            }
            c->dgate[slot] = dot;
        }
    }
    c->combined_back = true;
fail:
    return st;
}

/* ---- experts ------------------------------------------------------------------------- */

// x (n,D), w1 (F,D), w2 (D,F); pre (n,F), act (n,F), y (n,D) (y may be NULL)
static void expert_ffn(const tm_expert_slot *s, const float *x, size_t n, int D, int F, float *pre,
                       float *act, float *y)
{
    tm__sgemm(CblasNoTrans, CblasTrans, (int)n, F, D, 1.0f, x, D, s->w1.eff, D, 0.0f, pre, F);
    for (size_t i = 0; i < n * (size_t)F; i++)
        act[i] = pre[i] * tm__sigmoid(pre[i]);
    if (y)
        tm__sgemm(CblasNoTrans, CblasTrans, (int)n, D, F, 1.0f, act, F, s->w2.eff, F, 0.0f, y, D);
}

seldp_status tm_expert_forward(tm_model *m, int l, int e, const float *x, size_t n, float *y)
{
    seldp_status st;
    const tm_expert_slot *s = held_expert(m, l, e, "tm_expert_forward", &st);
    float *pre = NULL;
    if (!s)
        return st;
    if (n == 0)
        return SELDP_OK;
    const int D = m->cfg.d_model, F = m->cfg.d_ff;
    pre = malloc(2 * n * (size_t)F * sizeof *pre);
    if (!pre)
        TM_FAIL(SELDP_ERR_NOMEM, "rank %d: out of memory for %zu rows of layers.%d.experts.%d",
                m->rank, n, l, e);
    expert_ffn(s, x, n, D, F, pre, pre + n * (size_t)F, y);
fail:
    free(pre);
    return st;
}

/* LoRA: W_eff = W + c B A, so dB += c dW A^T and dA += c B^T dW. dW (out,in). */
static void lora_backward(tm_model *m, const tm_linear *lin, const float *dW)
{
    const int r = m->cfg.lora_rank;
    const float c = (float)(m->cfg.lora_alpha / r);
    // dB (out,r) += c dW (out,in) . A^T (in,r)
    tm__sgemm(CblasNoTrans, CblasTrans, lin->out, r, lin->in, c, dW, lin->in, m->work[lin->lora_a],
              lin->in, 1.0f, m->grad[lin->lora_b], r);
    // dA (r,in) += c B^T (r,out) . dW (out,in)
    tm__sgemm(CblasTrans, CblasNoTrans, r, lin->in, lin->out, c, m->work[lin->lora_b], r, dW,
              lin->in, 1.0f, m->grad[lin->lora_a], lin->in);
}

seldp_status tm_expert_backward(tm_model *m, int l, int e, const float *x, const float *dy,
                                size_t n, float *dx)
{
    seldp_status st;
    const tm_expert_slot *s = held_expert(m, l, e, "tm_expert_backward", &st);
    float *buf = NULL;
    if (!s)
        return st;
    if (n == 0)
        return SELDP_OK;
    const int D = m->cfg.d_model, F = m->cfg.d_ff;
    const bool dense = s->w1.dense >= 0;
    const size_t nF = n * (size_t)F;
    buf = malloc((3 * nF + (dense ? 0 : (size_t)D * (size_t)F)) * sizeof *buf);
    if (!buf)
        TM_FAIL(SELDP_ERR_NOMEM, "rank %d: out of memory for %zu rows of layers.%d.experts.%d",
                m->rank, n, l, e);
    float *pre = buf, *act = buf + nF, *dact = buf + 2 * nF;
    float *dW = dense ? NULL : buf + 3 * nF; /* (D,F) or (F,D): both D*F floats */
    expert_ffn(s, x, n, D, F, pre, act, NULL);
    // dact (n,F) = dy (n,D) . w2 (D,F)
    tm__sgemm(CblasNoTrans, CblasNoTrans, (int)n, F, D, 1.0f, dy, D, s->w2.eff, F, 0.0f, dact, F);
    // dw2 (D,F) = dy^T (D,n) . act (n,F)
    tm__sgemm(CblasTrans, CblasNoTrans, D, F, (int)n, 1.0f, dy, D, act, F, dense ? 1.0f : 0.0f,
              dense ? m->grad[s->w2.dense] : dW, F);
    if (!dense)
        lora_backward(m, &s->w2, dW);
    for (size_t i = 0; i < nF; i++) {
        const float sg = tm__sigmoid(pre[i]);
        dact[i] *= sg * (1.0f + pre[i] * (1.0f - sg)); /* silu'(a) */
    }
    // dw1 (F,D) = dpre^T (F,n) . x (n,D)
    tm__sgemm(CblasTrans, CblasNoTrans, F, D, (int)n, 1.0f, dact, F, x, D, dense ? 1.0f : 0.0f,
              dense ? m->grad[s->w1.dense] : dW, D);
    if (!dense)
        lora_backward(m, &s->w1, dW);
    // dx (n,D) = dpre (n,F) . w1 (F,D)
    if (dx)
        tm__sgemm(CblasNoTrans, CblasNoTrans, (int)n, D, F, 1.0f, dact, F, s->w1.eff, D, 0.0f, dx,
                  D);
    m->seen[(size_t)l * (size_t)m->cfg.experts + (size_t)e] = true;
fail:
    free(buf);
    return st;
}

/* ---- head ---------------------------------------------------------------------------- */

seldp_status tm_head_forward_backward(tm_model *m, const float *h, const int32_t *targets,
                                      double *loss_sum, float *dh)
{
    seldp_status st = SELDP_OK;
    float *buf = NULL;
    if (!m->embedded)
        return tm__fail(SELDP_ERR_INVALID_ARGUMENT,
                        "rank %d: tm_head_forward_backward before tm_embed_forward", m->rank);
    if (!m->part.head)
        return tm__fail(SELDP_ERR_INVALID_ARGUMENT,
                        "rank %d: tm_head_forward_backward on a pipeline stage without the head",
                        m->rank);
    if (m->tp.size > 1)
        return tm__tp_head(m, h, targets, loss_sum, dh);
    const size_t T = m->T;
    const int D = m->cfg.d_model, V = m->cfg.vocab;
    for (size_t t = 0; t < T; t++) {
        if (targets[t] < 0 || targets[t] >= V)
            return tm__fail(SELDP_ERR_INVALID_ARGUMENT,
                            "rank %d: target %zu is %d, expected an id in [0, %d)", m->rank, t,
                            (int)targets[t], V);
    }
    double loss = 0.0;
    if (T == 0)
        goto done;
    const size_t TD = T * (size_t)D;
    buf = malloc((2 * TD + T + T * (size_t)V) * sizeof *buf);
    if (!buf)
        TM_FAIL(SELDP_ERR_NOMEM, "rank %d: out of memory in the head for %zu tokens", m->rank, T);
    float *z = buf, *dz = buf + TD, *rstd = buf + 2 * TD, *logits = buf + 2 * TD + T;
    const float *gf = m->work[m->final_norm];
    const float *E = m->work[m->embed];
    tm__rmsnorm_forward(h, gf, T, D, m->cfg.eps, z, rstd);
    // logits (T,V) = z (T,D) . embed^T (D,V)
    tm__sgemm(CblasNoTrans, CblasTrans, (int)T, V, D, 1.0f, z, D, E, D, 0.0f, logits, V);
    for (size_t t = 0; t < T; t++) {
        float *row = logits + t * (size_t)V;
        float mx = row[0];
        for (int v = 1; v < V; v++)
            mx = fmaxf(mx, row[v]);
        float sum = 0.0f;
        for (int v = 0; v < V; v++)
            sum += expf(row[v] - mx);
        loss += (double)(logf(sum) + mx - row[targets[t]]);
        /* dlogits = softmax - onehot(target), in place */
        for (int v = 0; v < V; v++)
            row[v] = expf(row[v] - mx) / sum;
        row[targets[t]] -= 1.0f;
    }
    // dz (T,D) = dlogits (T,V) . embed (V,D)
    tm__sgemm(CblasNoTrans, CblasNoTrans, (int)T, D, V, 1.0f, logits, V, E, D, 0.0f, dz, D);
    // d embed (V,D) += dlogits^T (V,T) . z (T,D)   (the tied lm_head)
    tm__sgemm(CblasTrans, CblasNoTrans, V, D, (int)T, 1.0f, logits, V, z, D, 1.0f,
              m->grad[m->embed], D);
    memset(dh, 0, TD * sizeof *dh);
    tm__rmsnorm_backward(dz, h, gf, rstd, T, D, dh, m->grad[m->final_norm]);
done:
    if (loss_sum)
        *loss_sum = loss;
fail:
    free(buf);
    return st;
}

/* ---- a whole step on one rank -------------------------------------------------------- */

/* Pack the rows of slots routed to expert e: src is (T,D) per token (stride_k 0) or
 * (T,K,D) per slot. Returns the row count. */
static size_t gather(const tm_route *r, int e, const float *src, bool per_slot, int D, float *dst)
{
    size_t n = 0;
    for (size_t t = 0; t < r->T; t++) {
        for (int k = 0; k < r->K; k++) {
            if (r->expert[t * (size_t)r->K + (size_t)k] != e)
                continue;
            const size_t row = per_slot ? t * (size_t)r->K + (size_t)k : t;
            memcpy(dst + n * (size_t)D, src + row * (size_t)D, (size_t)D * sizeof(float));
            n++;
        }
    }
    return n;
}

static void scatter(const tm_route *r, int e, const float *src, int D, float *dst)
{
    size_t n = 0;
    for (size_t slot = 0; slot < r->T * (size_t)r->K; slot++) {
        if (r->expert[slot] != e)
            continue;
        memcpy(dst + slot * (size_t)D, src + n * (size_t)D, (size_t)D * sizeof(float));
        n++;
    }
}

seldp_status tm_step_local(tm_model *m, const int32_t *tokens, const int32_t *targets, size_t T,
                           double *loss_sum)
{
    seldp_status st = SELDP_OK;
    const int D = m->cfg.d_model, E = m->cfg.experts, K = m->cfg.top_k, L = m->cfg.layers;
    float *buf = NULL;
    for (int e = 0; e < E; e++) {
        if (!m->owns[e])
            return tm__fail(SELDP_ERR_INVALID_ARGUMENT,
                            "rank %d: tm_step_local needs every expert; expert %d is not held",
                            m->rank, e);
    }
    const size_t TD = T * (size_t)D, TKD = T * (size_t)K * (size_t)D;
    buf = malloc((2 * TD + 2 * TKD + 3 * TKD + 1) * sizeof *buf);
    if (!buf)
        TM_FAIL(SELDP_ERR_NOMEM, "rank %d: out of memory for a step of %zu tokens", m->rank, T);
    float *h = buf, *dh = buf + TD, *y = buf + 2 * TD, *dy = y + TKD;
    float *xe = dy + TKD, *ye = xe + TKD, *de = ye + TKD; /* packed rows of one expert */

    tm_begin_step(m);
    TM_CHECK(tm_embed_forward(m, tokens, T, h));
    for (int l = 0; l < L; l++) {
        tm_route route;
        TM_CHECK(tm_route_forward(m, l, h, &route));
        for (int e = 0; e < E; e++) {
            size_t n = gather(&route, e, route.x, false, D, xe);
            TM_CHECK(tm_expert_forward(m, l, e, xe, n, ye));
            scatter(&route, e, ye, D, y);
        }
        TM_CHECK(tm_combine_forward(m, l, y, h));
    }
    TM_CHECK(tm_head_forward_backward(m, h, targets, loss_sum, dh));
    if (loss_sum)
        *loss_sum += tm_router_loss_sum(m);
    for (int l = L - 1; l >= 0; l--) {
        tm_route route;
        TM_CHECK(tm_route_get(m, l, &route));
        TM_CHECK(tm_combine_backward(m, l, dh, dy));
        for (int e = 0; e < E; e++) {
            size_t n = gather(&route, e, route.x, false, D, xe);
            gather(&route, e, dy, true, D, de);
            TM_CHECK(tm_expert_backward(m, l, e, xe, de, n, ye));
            scatter(&route, e, ye, D, y); /* y now holds dx per slot */
        }
        TM_CHECK(tm_route_backward(m, l, y, dh));
    }
    TM_CHECK(tm_embed_backward(m, dh));
fail:
    free(buf);
    return st;
}
