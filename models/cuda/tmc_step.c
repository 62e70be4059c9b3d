/* tiny-moe's step on one CUDA device: the forward/backward pieces of models/forward.c with
 * each cblas_sgemm replaced by the same row-major product on cuBLAS and each loop by a kernel
 * of tmc_kernels.cu. Every public function synchronizes the model's stream before it returns. */
#include "cuda/tmc_internal.h"

/* ---- the step ---------------------------------------------------------------------------- */

seldp_status tmc_embed_forward(tmc_model *m, const int32_t *tokens, size_t T, float *h)
{
    seldp_status st = SELDP_OK;
    const int D = m->cfg.d_model;
    for (size_t t = 0; t < T; t++)
        if (tokens[t] < 0 || tokens[t] >= m->cfg.vocab)
            return tm__fail(SELDP_ERR_INVALID_ARGUMENT,
                            "rank %d: token %zu is %d, expected an id in [0, %d)", m->rank, t,
                            (int)tokens[t], m->cfg.vocab);
    TM_CHECK(tmc__use_device(m));
    TM_CHECK(tmc__ensure_layers(m, T));
    m->T = T;
    m->embedded = true;
    for (int l = 0; l < m->cfg.layers; l++)
        m->layers[l].routed = m->layers[l].combined = m->layers[l].combined_back = false;
    if (T == 0)
        return SELDP_OK;
    memcpy(m->host_tokens, tokens, T * sizeof *tokens);
    CUDA_TRY(cudaMemcpyAsync(m->tokens, m->host_tokens, T * sizeof *tokens, cudaMemcpyHostToDevice,
                             m->stream),
             "token upload");
    CUDA_TRY(tmc_k_embed_forward(m->stream, m->work[m->embed], m->tokens, T, D, h), "embed");
    TM_CHECK(tmc__finish(m, "tmc_embed_forward"));
fail:
    return st;
}

seldp_status tmc_embed_backward(tmc_model *m, const float *dh)
{
    seldp_status st = SELDP_OK;
    if (!m->embedded)
        return tm__fail(SELDP_ERR_INVALID_ARGUMENT,
                        "rank %d: tmc_embed_backward before tmc_embed_forward", m->rank);
    TM_CHECK(tmc__use_device(m));
    CUDA_TRY(tmc_k_embed_backward(m->stream, dh, m->tokens, m->T, m->cfg.vocab, m->cfg.d_model,
                                  m->grad[m->embed]),
             "embed backward");
    TM_CHECK(tmc__finish(m, "tmc_embed_backward"));
fail:
    return st;
}

static void fill_route(const tmc_model *m, int l, tmc_route *route)
{
    const tmc_layer *c = &m->layers[l];
    route->T = m->T;
    route->K = m->cfg.top_k;
    route->expert = c->host_expert;
    route->gate = c->host_gate;
    route->x = c->u;
}

seldp_status tmc_route_forward(tmc_model *m, int l, const float *h, tmc_route *route)
{
    seldp_status st = tmc__check_layer(m, l, "tmc_route_forward");
    if (st != SELDP_OK)
        return st;
    const size_t T = m->T;
    const int D = m->cfg.d_model, E = m->cfg.experts, K = m->cfg.top_k;
    tmc_layer *c = &m->layers[l];
    TM_CHECK(tmc__use_device(m));
    if (T) {
        CUDA_TRY(cudaMemcpyAsync(c->h_in, h, T * (size_t)D * sizeof(float),
                                 cudaMemcpyDeviceToDevice, m->stream),
                 "layer input copy");
        CUDA_TRY(tmc_k_rmsnorm_forward(m->stream, c->h_in, m->work[m->norm[l]], T, D,
                                       (float)m->cfg.eps, c->u, c->rstd),
                 "rmsnorm");
        // u (T,D) . W_r^T (D,E) -> probs (T,E)
        TM_CHECK(tmc__gemm(m, false, true, (int)T, E, D, 1.0f, c->u, D, m->work[m->router[l]], D,
                           0.0f, c->probs, E));
        CUDA_TRY(tmc_k_route(m->stream, c->probs, T, E, K, c->expert, c->gate), "route");
        CUDA_TRY(cudaMemcpyAsync(c->host_expert, c->expert, T * (size_t)K * sizeof(int),
                                 cudaMemcpyDeviceToHost, m->stream),
                 "route download");
        CUDA_TRY(cudaMemcpyAsync(c->host_gate, c->gate, T * (size_t)K * sizeof(float),
                                 cudaMemcpyDeviceToHost, m->stream),
                 "route download");
        TM_CHECK(tmc__finish(m, "tmc_route_forward"));
    }
    c->routed = true;
    c->combined = c->combined_back = false;
    fill_route(m, l, route);
fail:
    return st;
}

seldp_status tmc_route_get(const tmc_model *m, int l, tmc_route *route)
{
    if (l < 0 || l >= m->cfg.layers || !m->embedded || !m->layers[l].routed)
        return tm__fail(SELDP_ERR_INVALID_ARGUMENT,
                        "rank %d: tmc_route_get: layer %d was not routed in this step", m->rank, l);
    fill_route(m, l, route);
    return SELDP_OK;
}

seldp_status tmc_route_backward(tmc_model *m, int l, const float *dx, float *dh)
{
    seldp_status st = tmc__check_layer(m, l, "tmc_route_backward");
    if (st != SELDP_OK)
        return st;
    tmc_layer *c = &m->layers[l];
    if (!c->combined_back)
        return tm__fail(SELDP_ERR_INVALID_ARGUMENT,
                        "rank %d: tmc_route_backward: layer %d before tmc_combine_backward",
                        m->rank, l);
    const size_t T = m->T;
    const int D = m->cfg.d_model, E = m->cfg.experts, K = m->cfg.top_k;
    if (T == 0)
        return SELDP_OK;
    float *dlogits = NULL;
    TM_CHECK(tmc__use_device(m));
    TM_CHECK(tmc__scratch(m, T * (size_t)(E + D) * sizeof(float), (void **)&dlogits));
    float *du = dlogits + T * (size_t)E;
    CUDA_TRY(
        tmc_k_route_backward(m->stream, c->probs, c->expert, c->gate, c->dgate, T, E, K, dlogits),
        "router backward");
    // dW_r (E,D) += dlogits^T (E,T) . u (T,D)
    TM_CHECK(tmc__gemm(m, true, false, E, D, (int)T, 1.0f, dlogits, E, c->u, D, 1.0f,
                       m->grad[m->router[l]], D));
    // du (T,D) = dlogits (T,E) . W_r (E,D) + sum_k dx[t,k]
    TM_CHECK(tmc__gemm(m, false, false, (int)T, D, E, 1.0f, dlogits, E, m->work[m->router[l]], D,
                       0.0f, du, D));
    CUDA_TRY(tmc_k_add_slots(m->stream, dx, T, K, D, du), "slot gradients");
    CUDA_TRY(tmc_k_rmsnorm_backward(m->stream, du, c->h_in, m->work[m->norm[l]], c->rstd, T, D, dh,
                                    m->grad[m->norm[l]]),
             "rmsnorm backward");
    TM_CHECK(tmc__finish(m, "tmc_route_backward"));
fail:
    return st;
}

seldp_status tmc_combine_forward(tmc_model *m, int l, const float *y, float *h)
{
    seldp_status st = tmc__check_layer(m, l, "tmc_combine_forward");
    if (st != SELDP_OK)
        return st;
    tmc_layer *c = &m->layers[l];
    if (!c->routed)
        return tm__fail(SELDP_ERR_INVALID_ARGUMENT,
                        "rank %d: tmc_combine_forward: layer %d before tmc_route_forward", m->rank,
                        l);
    const size_t T = m->T;
    const int D = m->cfg.d_model, K = m->cfg.top_k;
    TM_CHECK(tmc__use_device(m));
    if (T) {
        CUDA_TRY(cudaMemcpyAsync(c->y, y, T * (size_t)K * (size_t)D * sizeof(float),
                                 cudaMemcpyDeviceToDevice, m->stream),
                 "expert output copy");
        CUDA_TRY(tmc_k_combine_forward(m->stream, c->h_in, c->gate, c->y, T, K, D, h), "combine");
        TM_CHECK(tmc__finish(m, "tmc_combine_forward"));
    }
    c->combined = true;
fail:
    return st;
}

seldp_status tmc_combine_backward(tmc_model *m, int l, const float *dh, float *dy)
{
    seldp_status st = tmc__check_layer(m, l, "tmc_combine_backward");
    if (st != SELDP_OK)
        return st;
    tmc_layer *c = &m->layers[l];
    if (!c->combined)
        return tm__fail(SELDP_ERR_INVALID_ARGUMENT,
                        "rank %d: tmc_combine_backward: layer %d before tmc_combine_forward",
                        m->rank, l);
    TM_CHECK(tmc__use_device(m));
    if (m->T) {
        CUDA_TRY(tmc_k_combine_backward(m->stream, dh, c->gate, c->y, m->T, m->cfg.top_k,
                                        m->cfg.d_model, dy, c->dgate),
                 "combine backward");
        TM_CHECK(tmc__finish(m, "tmc_combine_backward"));
    }
    c->combined_back = true;
fail:
    return st;
}

// x (n,D), w1 (F,D), w2 (D,F); pre (n,F), act (n,F), y (n,D) (y may be NULL)
static seldp_status expert_ffn(tmc_model *m, const tmc_expert *s, const float *x, size_t n,
                               float *pre, float *act, float *y)
{
    seldp_status st = SELDP_OK;
    const int D = m->cfg.d_model, F = m->cfg.d_ff;
    TM_CHECK(tmc__gemm(m, false, true, (int)n, F, D, 1.0f, x, D, s->w1.eff, D, 0.0f, pre, F));
    CUDA_TRY(tmc_k_silu_forward(m->stream, pre, act, n * (size_t)F), "silu");
    if (y)
        TM_CHECK(tmc__gemm(m, false, true, (int)n, D, F, 1.0f, act, F, s->w2.eff, F, 0.0f, y, D));
fail:
    return st;
}

seldp_status tmc_expert_forward(tmc_model *m, int l, int e, const float *x, size_t n, float *y)
{
    seldp_status st;
    const tmc_expert *s = tmc__held_expert(m, l, e, "tmc_expert_forward", &st);
    float *pre = NULL;
    if (!s)
        return st;
    if (n == 0)
        return SELDP_OK;
    const size_t nF = n * (size_t)m->cfg.d_ff;
    TM_CHECK(tmc__use_device(m));
    TM_CHECK(tmc__scratch(m, 2 * nF * sizeof(float), (void **)&pre));
    TM_CHECK(expert_ffn(m, s, x, n, pre, pre + nF, y));
    TM_CHECK(tmc__finish(m, "tmc_expert_forward"));
fail:
    return st;
}

/* LoRA: W_eff = W + c B A, so dB += c dW A^T and dA += c B^T dW. dW (out,in). */
static seldp_status lora_backward(tmc_model *m, const tmc_linear *lin, const float *dW)
{
    seldp_status st = SELDP_OK;
    const int r = m->cfg.lora_rank;
    const float c = (float)(m->cfg.lora_alpha / r);
    // dB (out,r) += c dW (out,in) . A^T (in,r)
    TM_CHECK(tmc__gemm(m, false, true, lin->out, r, lin->in, c, dW, lin->in, m->work[lin->lora_a],
                       lin->in, 1.0f, m->grad[lin->lora_b], r));
    // dA (r,in) += c B^T (r,out) . dW (out,in)
    TM_CHECK(tmc__gemm(m, true, false, r, lin->in, lin->out, c, m->work[lin->lora_b], r, dW,
                       lin->in, 1.0f, m->grad[lin->lora_a], lin->in));
fail:
    return st;
}

seldp_status tmc_expert_backward(tmc_model *m, int l, int e, const float *x, const float *dy,
                                 size_t n, float *dx)
{
    seldp_status st;
    const tmc_expert *s = tmc__held_expert(m, l, e, "tmc_expert_backward", &st);
    float *buf = NULL;
    if (!s)
        return st;
    if (n == 0)
        return SELDP_OK;
    const int D = m->cfg.d_model, F = m->cfg.d_ff;
    const bool dense = s->w1.dense >= 0;
    const size_t nF = n * (size_t)F;
    TM_CHECK(tmc__use_device(m));
    TM_CHECK(tmc__scratch(m, (3 * nF + (dense ? 0 : (size_t)D * (size_t)F)) * sizeof(float),
                          (void **)&buf));
    float *pre = buf, *act = buf + nF, *dact = buf + 2 * nF;
    float *dW = dense ? NULL : buf + 3 * nF; /* (D,F) or (F,D): both D*F floats */
    TM_CHECK(expert_ffn(m, s, x, n, pre, act, NULL));
    // dact (n,F) = dy (n,D) . w2 (D,F)
    TM_CHECK(tmc__gemm(m, false, false, (int)n, F, D, 1.0f, dy, D, s->w2.eff, F, 0.0f, dact, F));
    // dw2 (D,F) = dy^T (D,n) . act (n,F)
    TM_CHECK(tmc__gemm(m, true, false, D, F, (int)n, 1.0f, dy, D, act, F, dense ? 1.0f : 0.0f,
                       dense ? m->grad[s->w2.dense] : dW, F));
    if (!dense)
        TM_CHECK(lora_backward(m, &s->w2, dW));
    CUDA_TRY(tmc_k_silu_backward(m->stream, pre, dact, nF), "silu backward");
    // dw1 (F,D) = dpre^T (F,n) . x (n,D)
    TM_CHECK(tmc__gemm(m, true, false, F, D, (int)n, 1.0f, dact, F, x, D, dense ? 1.0f : 0.0f,
                       dense ? m->grad[s->w1.dense] : dW, D));
    if (!dense)
        TM_CHECK(lora_backward(m, &s->w1, dW));
    // dx (n,D) = dpre (n,F) . w1 (F,D)
    if (dx)
        TM_CHECK(
            tmc__gemm(m, false, false, (int)n, D, F, 1.0f, dact, F, s->w1.eff, D, 0.0f, dx, D));
    TM_CHECK(tmc__finish(m, "tmc_expert_backward"));
    m->seen[(size_t)l * (size_t)m->cfg.experts + (size_t)e] = true;
fail:
    return st;
}

seldp_status tmc_head_forward_backward(tmc_model *m, const float *h, const int32_t *targets,
                                       double *loss_sum, float *dh)
{
    seldp_status st = SELDP_OK;
    float *host_loss = NULL;
    if (!m->embedded)
        return tm__fail(SELDP_ERR_INVALID_ARGUMENT,
                        "rank %d: tmc_head_forward_backward before tmc_embed_forward", m->rank);
    const size_t T = m->T;
    const int D = m->cfg.d_model, V = m->cfg.vocab;
    for (size_t t = 0; t < T; t++)
        if (targets[t] < 0 || targets[t] >= V)
            return tm__fail(SELDP_ERR_INVALID_ARGUMENT,
                            "rank %d: target %zu is %d, expected an id in [0, %d)", m->rank, t,
                            (int)targets[t], V);
    double loss = 0.0;
    if (T == 0)
        goto done;
    TM_CHECK(tmc__use_device(m));
    const size_t TD = T * (size_t)D;
    float *buf = NULL;
    TM_CHECK(tmc__scratch(m, (2 * TD + 2 * T + T * (size_t)V) * sizeof(float) + T * sizeof(int32_t),
                          (void **)&buf));
    float *z = buf, *dz = buf + TD, *rstd = buf + 2 * TD, *tok_loss = rstd + T;
    float *logits = tok_loss + T;
    int32_t *dtargets = (int32_t *)(logits + T * (size_t)V);
    const float *gf = m->work[m->final_norm], *emb = m->work[m->embed];
    host_loss = malloc(T * sizeof *host_loss);
    if (!host_loss)
        TM_FAIL(SELDP_ERR_NOMEM, "rank %d: out of memory for %zu token losses", m->rank, T);
    CUDA_TRY(
        cudaMemcpyAsync(dtargets, targets, T * sizeof *targets, cudaMemcpyHostToDevice, m->stream),
        "target upload");
    CUDA_TRY(tmc_k_rmsnorm_forward(m->stream, h, gf, T, D, (float)m->cfg.eps, z, rstd),
             "final rmsnorm");
    // logits (T,V) = z (T,D) . embed^T (D,V)
    TM_CHECK(tmc__gemm(m, false, true, (int)T, V, D, 1.0f, z, D, emb, D, 0.0f, logits, V));
    CUDA_TRY(tmc_k_cross_entropy(m->stream, logits, dtargets, T, V, tok_loss), "cross-entropy");
    // dz (T,D) = dlogits (T,V) . embed (V,D)
    TM_CHECK(tmc__gemm(m, false, false, (int)T, D, V, 1.0f, logits, V, emb, D, 0.0f, dz, D));
    // d embed (V,D) += dlogits^T (V,T) . z (T,D)   (the tied lm_head)
    TM_CHECK(
        tmc__gemm(m, true, false, V, D, (int)T, 1.0f, logits, V, z, D, 1.0f, m->grad[m->embed], D));
    CUDA_TRY(cudaMemsetAsync(dh, 0, TD * sizeof *dh, m->stream), "cudaMemset");
    CUDA_TRY(tmc_k_rmsnorm_backward(m->stream, dz, h, gf, rstd, T, D, dh, m->grad[m->final_norm]),
             "final rmsnorm backward");
    CUDA_TRY(cudaMemcpyAsync(host_loss, tok_loss, T * sizeof *host_loss, cudaMemcpyDeviceToHost,
                             m->stream),
             "loss download");
    TM_CHECK(tmc__finish(m, "tmc_head_forward_backward"));
    for (size_t t = 0; t < T; t++)
        loss += (double)host_loss[t];
done:
    if (loss_sum)
        *loss_sum = loss;
fail:
    free(host_loss);
    return st;
}

seldp_status tmc_copy_rows(tmc_model *m, float *dst, const int64_t *dst_rows, const float *src,
                           const int64_t *src_rows, size_t n, int D)
{
    seldp_status st = SELDP_OK;
    if (n == 0)
        return SELDP_OK;
    TM_CHECK(tmc__use_device(m));
    if (2 * n > m->rows_capacity) {
        cudaFree(m->rows);
        m->rows = NULL;
        m->rows_capacity = 0;
        TM_CHECK(tmc__device_alloc(m, 2 * n * sizeof(int64_t), (void **)&m->rows));
        m->rows_capacity = 2 * n;
    }
    int64_t *d_dst = NULL, *d_src = NULL;
    if (dst_rows) {
        d_dst = m->rows;
        CUDA_TRY(cudaMemcpyAsync(d_dst, dst_rows, n * sizeof *dst_rows, cudaMemcpyHostToDevice,
                                 m->stream),
                 "row index upload");
    }
    if (src_rows) {
        d_src = m->rows + n;
        CUDA_TRY(cudaMemcpyAsync(d_src, src_rows, n * sizeof *src_rows, cudaMemcpyHostToDevice,
                                 m->stream),
                 "row index upload");
    }
    CUDA_TRY(tmc_k_copy_rows(m->stream, dst, d_dst, src, d_src, n, D), "row copy");
    TM_CHECK(tmc__finish(m, "tmc_copy_rows"));
fail:
    return st;
}

/* Host indices of the slots (per_slot) or tokens routed to expert e; returns the count. */
static size_t routed_rows(const tmc_route *r, int e, bool per_slot, int64_t *rows)
{
    size_t n = 0;
    for (size_t slot = 0; slot < r->T * (size_t)r->K; slot++)
        if (r->expert[slot] == e)
            rows[n++] = (int64_t)(per_slot ? slot : slot / (size_t)r->K);
    return n;
}

seldp_status tmc_step_local(tmc_model *m, const int32_t *tokens, const int32_t *targets, size_t T,
                            double *loss_sum)
{
    seldp_status st = SELDP_OK;
    const int D = m->cfg.d_model, E = m->cfg.experts, K = m->cfg.top_k, L = m->cfg.layers;
    float *buf = NULL;
    int64_t *tok_rows = NULL, *slot_rows = NULL;
    for (int e = 0; e < E; e++)
        if (!m->experts[e].held)
            return tm__fail(SELDP_ERR_INVALID_ARGUMENT,
                            "rank %d: tmc_step_local needs every expert; expert %d is not held",
                            m->rank, e);
    const size_t TD = T * (size_t)D, TKD = T * (size_t)K * (size_t)D;
    TM_CHECK(tmc__use_device(m));
    TM_CHECK(tmc__device_alloc(m, (2 * TD + 5 * TKD + 1) * sizeof(float), (void **)&buf));
    tok_rows = malloc((T * (size_t)K + 1) * sizeof *tok_rows);
    slot_rows = malloc((T * (size_t)K + 1) * sizeof *slot_rows);
    if (!tok_rows || !slot_rows)
        TM_FAIL(SELDP_ERR_NOMEM, "rank %d: out of memory for a step of %zu tokens", m->rank, T);
    float *h = buf, *dh = buf + TD, *y = buf + 2 * TD, *dy = y + TKD;
    float *xe = dy + TKD, *ye = xe + TKD, *de = ye + TKD; /* packed rows of one expert */

    TM_CHECK(tmc_begin_step(m));
    TM_CHECK(tmc_embed_forward(m, tokens, T, h));
    for (int l = 0; l < L; l++) {
        tmc_route route;
        TM_CHECK(tmc_route_forward(m, l, h, &route));
        for (int e = 0; e < E; e++) {
            size_t n = routed_rows(&route, e, false, tok_rows);
            routed_rows(&route, e, true, slot_rows);
            TM_CHECK(tmc_copy_rows(m, xe, NULL, route.x, tok_rows, n, D));
            TM_CHECK(tmc_expert_forward(m, l, e, xe, n, ye));
            TM_CHECK(tmc_copy_rows(m, y, slot_rows, ye, NULL, n, D));
        }
        TM_CHECK(tmc_combine_forward(m, l, y, h));
    }
    TM_CHECK(tmc_head_forward_backward(m, h, targets, loss_sum, dh));
    for (int l = L - 1; l >= 0; l--) {
        tmc_route route;
        TM_CHECK(tmc_route_get(m, l, &route));
        TM_CHECK(tmc_combine_backward(m, l, dh, dy));
        for (int e = 0; e < E; e++) {
            size_t n = routed_rows(&route, e, false, tok_rows);
            routed_rows(&route, e, true, slot_rows);
            TM_CHECK(tmc_copy_rows(m, xe, NULL, route.x, tok_rows, n, D));
            TM_CHECK(tmc_copy_rows(m, de, NULL, dy, slot_rows, n, D));
            TM_CHECK(tmc_expert_backward(m, l, e, xe, de, n, ye));
            TM_CHECK(tmc_copy_rows(m, y, slot_rows, ye, NULL, n, D)); /* y: dx per slot */
        }
        TM_CHECK(tmc_route_backward(m, l, y, dh));
    }
    TM_CHECK(tmc_embed_backward(m, dh));
fail:
    cudaFree(buf);
    free(tok_rows);
    free(slot_rows);
    return st;
}
