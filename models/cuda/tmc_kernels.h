/* The small CUDA kernels of tiny-moe on the GPU (tmc_kernels.cu), callable from C. Each
 * launches on `stream` and returns the launch status; shapes are written llm.c style, all
 * pointers are device pointers on the current device. Reductions run in a fixed order, so
 * the same inputs give the same bits on every run. */
#ifndef TMC_KERNELS_H
#define TMC_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "seldp/dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

/* dst (n) F32 = src (n) of dtype F32, F16 or BF16 (exact). */
cudaError_t tmc_k_to_f32(cudaStream_t stream, seldp_dtype dtype, const void *src, float *dst,
                         size_t n);

/* out (n) of dtype F32/F16/BF16 = (float)(scale * (double)acc[i]), halves rounded to nearest
 * even exactly as the host does. */
cudaError_t tmc_k_export(cudaStream_t stream, const float *acc, size_t n, double scale,
                         seldp_dtype dtype, void *out);

/* w (n) = codebook[q_i] * absmax[i / 64]; qweight (n/2) bytes, high nibble first. */
cudaError_t tmc_k_nf4_dequant(cudaStream_t stream, const uint8_t *qweight, const float *absmax,
                              const float *codebook, size_t n, float *w);

/* w (out,in) = (q - z) * s with AWQ-style packing (docs/model.md, Quantized variants),
 * group size 32. */
cudaError_t tmc_k_awq_dequant(cudaStream_t stream, const int32_t *qweight, const uint16_t *scales,
                              const int32_t *qzeros, int out, int in, float *w);

/* h (T,D) = embed[tokens[t]] with embed (V,D). */
cudaError_t tmc_k_embed_forward(cudaStream_t stream, const float *embed, const int32_t *tokens,
                                size_t T, int D, float *h);

/* dembed (V,D) += sum over t with tokens[t] == v of dh[t] (tokens in order). */
cudaError_t tmc_k_embed_backward(cudaStream_t stream, const float *dh, const int32_t *tokens,
                                 size_t T, int V, int D, float *dembed);

/* out (T,D) = inp * rstd * weight, rstd (T) = 1 / sqrt(mean(inp^2) + eps). */
cudaError_t tmc_k_rmsnorm_forward(cudaStream_t stream, const float *inp, const float *weight,
                                  size_t T, int D, float eps, float *out, float *rstd);

/* dinp (T,D) += rstd * dout * weight - rstd^3 * (sum_i dout_i weight_i inp_i) / D * inp,
 * dweight (D) += sum_t dout * inp * rstd. */
cudaError_t tmc_k_rmsnorm_backward(cudaStream_t stream, const float *dout, const float *inp,
                                   const float *weight, const float *rstd, size_t T, int D,
                                   float *dinp, float *dweight);

/* probs (T,E): logits in, softmax out; expert (T,K) the K largest (ties: lower index),
 * gate (T,K) their probabilities over their sum. */
cudaError_t tmc_k_route(cudaStream_t stream, float *probs, size_t T, int E, int K, int *expert,
                        float *gate);

/* dlogits (T,E) of the router from dgate (T,K), through the renormalized top-K and softmax. */
cudaError_t tmc_k_route_backward(cudaStream_t stream, const float *probs, const int *expert,
                                 const float *gate, const float *dgate, size_t T, int E, int K,
                                 float *dlogits);

/* du (T,D) += sum_k dx (T,K,D). */
cudaError_t tmc_k_add_slots(cudaStream_t stream, const float *dx, size_t T, int K, int D,
                            float *du);

/* h (T,D) = h_in + sum_k gate (T,K) * y (T,K,D). */
cudaError_t tmc_k_combine_forward(cudaStream_t stream, const float *h_in, const float *gate,
                                  const float *y, size_t T, int K, int D, float *h);

/* dy (T,K,D) = gate * dh, dgate (T,K) = dh . y. */
cudaError_t tmc_k_combine_backward(cudaStream_t stream, const float *dh, const float *gate,
                                   const float *y, size_t T, int K, int D, float *dy, float *dgate);

/* act (n) = pre * sigmoid(pre). */
cudaError_t tmc_k_silu_forward(cudaStream_t stream, const float *pre, float *act, size_t n);

/* dact (n) *= silu'(pre). */
cudaError_t tmc_k_silu_backward(cudaStream_t stream, const float *pre, float *dact, size_t n);

/* logits (T,V) in, softmax - onehot(target) out; loss (T) = logsumexp - logits[target]. */
cudaError_t tmc_k_cross_entropy(cudaStream_t stream, float *logits, const int32_t *targets,
                                size_t T, int V, float *loss);

/* dst[dst_rows[j]] = src[src_rows[j]] for j < n, rows of D floats; a NULL index array means
 * rows 0..n-1. */
cudaError_t tmc_k_copy_rows(cudaStream_t stream, float *dst, const int64_t *dst_rows,
                            const float *src, const int64_t *src_rows, size_t n, int D);

#ifdef __cplusplus
}
#endif
#endif
