/* tiny-moe's shared expert on the CPU in FP32 (docs/model.md; DeepSeek/Megatron SharedExpertMLP):
 * every token of layer l adds silu(u W1s^T) W2s^T, ungated, next to its routed experts. Its
 * weights are shared (non-expert) parameters, replicated over the shared group; with tensor
 * parallelism its w1 is column- and its w2 row-parallel (tensor_parallel.c). */
#include <stdlib.h>
#include <string.h>

#include <cblas.h>

#include "blas_gate.h"

#include "tm_internal.h"

// u (T,D), w1s (Fs,D), w2s (D,Fs); pre (T,Fs) cached; h (T,D) +=
seldp_status tm__shared_forward(tm_model *m, int l, float *h)
{
    if (m->tp.size > 1)
        return tm__tp_shared_forward(m, l, h);
    tm_layer_cache *c = &m->cache[l];
    const size_t T = m->T;
    const int D = m->cfg.d_model, Fs = m->cfg.d_ff_shared;
    if (T == 0)
        return SELDP_OK;
    float *act = malloc(T * (size_t)Fs * sizeof *act);
    if (!act)
        return tm__fail(SELDP_ERR_NOMEM,
                        "rank %d: out of memory for layers.%d.shared_expert on %zu tokens", m->rank,
                        l, T);
    tm__sgemm(CblasNoTrans, CblasTrans, (int)T, Fs, D, 1.0f, c->u, D, m->work[m->shared_w1[l]], D,
              0.0f, c->s_pre, Fs);
    for (size_t i = 0; i < T * (size_t)Fs; i++)
        act[i] = c->s_pre[i] * tm__sigmoid(c->s_pre[i]);
    // h (T,D) += act (T,Fs) . w2s^T (Fs,D)
    tm__sgemm(CblasNoTrans, CblasTrans, (int)T, D, Fs, 1.0f, act, Fs, m->work[m->shared_w2[l]], Fs,
              1.0f, h, D);
    free(act);
    return SELDP_OK;
}

// dh (T,D); dw1s (Fs,D) +=, dw2s (D,Fs) +=; s_du (T,D) out
seldp_status tm__shared_backward(tm_model *m, int l, const float *dh)
{
    if (m->tp.size > 1)
        return tm__tp_shared_backward(m, l, dh);
    tm_layer_cache *c = &m->cache[l];
    const size_t T = m->T;
    const int D = m->cfg.d_model, Fs = m->cfg.d_ff_shared;
    if (T == 0)
        return SELDP_OK;
    const size_t n = T * (size_t)Fs;
    float *act = malloc(2 * n * sizeof *act);
    if (!act)
        return tm__fail(SELDP_ERR_NOMEM,
                        "rank %d: out of memory for the backward of layers.%d.shared_expert",
                        m->rank, l);
    float *dpre = act + n;
    for (size_t i = 0; i < n; i++)
        act[i] = c->s_pre[i] * tm__sigmoid(c->s_pre[i]);
    // dw2s (D,Fs) += dh^T (D,T) . act (T,Fs)
    tm__sgemm(CblasTrans, CblasNoTrans, D, Fs, (int)T, 1.0f, dh, D, act, Fs, 1.0f,
              m->grad[m->shared_w2[l]], Fs);
    // dact (T,Fs) = dh (T,D) . w2s (D,Fs), then through silu
    tm__sgemm(CblasNoTrans, CblasNoTrans, (int)T, Fs, D, 1.0f, dh, D, m->work[m->shared_w2[l]], Fs,
              0.0f, dpre, Fs);
    for (size_t i = 0; i < n; i++) {
        const float a = c->s_pre[i], sg = tm__sigmoid(a);
        dpre[i] *= sg * (1.0f + a * (1.0f - sg));
    }
    // dw1s (Fs,D) += dpre^T (Fs,T) . u (T,D)
    tm__sgemm(CblasTrans, CblasNoTrans, Fs, D, (int)T, 1.0f, dpre, Fs, c->u, D, 1.0f,
              m->grad[m->shared_w1[l]], D);
    // s_du (T,D) = dpre (T,Fs) . w1s (Fs,D)
    tm__sgemm(CblasNoTrans, CblasNoTrans, (int)T, D, Fs, 1.0f, dpre, Fs, m->work[m->shared_w1[l]],
              D, 0.0f, c->s_du, D);
    free(act);
    return SELDP_OK;
}
