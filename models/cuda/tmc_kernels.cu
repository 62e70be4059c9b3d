/* The small kernels of tiny-moe on the GPU: upcasts, dequantization, embedding, RMSNorm,
 * routing, combine, SiLU, cross-entropy and row copies. The GEMMs are cuBLAS calls in
 * tinymoe_cuda.c. Every reduction has a fixed order (a thread loop or a fixed shuffle tree),
 * so results are the same bits on every run; the formulas follow models/forward.c. */
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "seldp_half_bits.cuh"
#include "cuda/tmc_kernels.h"

namespace
{

const int kThreads = 256;

unsigned grid_for(size_t n)
{
    size_t blocks = (n + kThreads - 1) / kThreads;
    if (blocks == 0)
        blocks = 1;
    return (unsigned)(blocks < 65535 ? blocks : 65535);
}

#define GRID_STRIDE(i, n)                                                                          \
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);                        \
         i += (size_t)gridDim.x * blockDim.x)

__device__ __forceinline__ float sigmoidf_(float x)
{
    return 1.0f / (1.0f + expf(-x));
}

/* Sum over a warp with a fixed butterfly: every lane ends with the same total. */
__device__ __forceinline__ float warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* Block-wide sum or max over kThreads threads (all threads receive the result). */
__device__ float block_reduce(float v, bool is_max)
{
    __shared__ float part[kThreads / 32];
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    v = is_max ? warp_max(v) : warp_sum(v);
    __syncthreads();
    if (lane == 0)
        part[warp] = v;
    __syncthreads();
    float r = part[0];
    for (int w = 1; w < kThreads / 32; w++)
        r = is_max ? fmaxf(r, part[w]) : r + part[w];
    return r;
}

__global__ void to_f32_kernel(const void *src, float *dst, size_t n, int kind)
{
    GRID_STRIDE(i, n)
    {
        if (kind == 0)
            dst[i] = ((const float *)src)[i];
        else if (kind == 1)
            dst[i] = __uint_as_float(seldp__f16_to_f32_bits(((const uint16_t *)src)[i]));
        else
            dst[i] = __uint_as_float(seldp__bf16_to_f32_bits(((const uint16_t *)src)[i]));
    }
}

__global__ void export_kernel(const float *acc, size_t n, double scale, int kind, void *out)
{
    GRID_STRIDE(i, n)
    {
        float v = (float)(scale * (double)acc[i]);
        if (kind == 0)
            ((float *)out)[i] = v;
        else if (kind == 1)
            ((uint16_t *)out)[i] = seldp__f32_bits_to_f16(__float_as_uint(v));
        else
            ((uint16_t *)out)[i] = seldp__f32_bits_to_bf16(__float_as_uint(v));
    }
}

__global__ void nf4_kernel(const uint8_t *qweight, const float *absmax, const float *codebook,
                           size_t n, float *w)
{
    GRID_STRIDE(i, n)
    {
        uint8_t byte = qweight[i / 2];
        unsigned q = (i % 2 == 0) ? (unsigned)(byte >> 4) : (unsigned)(byte & 0x0f);
        w[i] = codebook[q] * absmax[i / 64];
    }
}

__global__ void awq_kernel(const int32_t *qweight, const uint16_t *scales, const int32_t *qzeros,
                           int out, int in, float *w)
{
    const int groups = in / 32, zero_words = (groups + 7) / 8;
    GRID_STRIDE(k, (size_t)out * (size_t)in)
    {
        int o = (int)(k / (size_t)in), i = (int)(k % (size_t)in), g = i / 32;
        uint32_t word = (uint32_t)qweight[(size_t)o * (size_t)(in / 8) + (size_t)(i / 8)];
        uint32_t zword = (uint32_t)qzeros[(size_t)o * (size_t)zero_words + (size_t)(g / 8)];
        int q = (int)(word >> (4 * (i % 8)) & 0xfu);
        int z = (int)(zword >> (4 * (g % 8)) & 0xfu);
        float s =
            __uint_as_float(seldp__f16_to_f32_bits(scales[(size_t)o * (size_t)groups + (size_t)g]));
        w[k] = (float)(q - z) * s;
    }
}

__global__ void embed_forward_kernel(const float *embed, const int32_t *tokens, size_t T, int D,
                                     float *h)
{
    GRID_STRIDE(k, T * (size_t)D)
    {
        size_t t = k / (size_t)D;
        h[k] = embed[(size_t)tokens[t] * (size_t)D + k % (size_t)D];
    }
}

/* One thread per element of the table, tokens visited in order: no atomics. */
__global__ void embed_backward_kernel(const float *dh, const int32_t *tokens, size_t T, int V,
                                      int D, float *dembed)
{
    GRID_STRIDE(k, (size_t)V * (size_t)D)
    {
        int v = (int)(k / (size_t)D), i = (int)(k % (size_t)D);
        float acc = 0.0f;
        bool any = false;
        for (size_t t = 0; t < T; t++) {
            if (tokens[t] == v) {
                acc += dh[t * (size_t)D + (size_t)i];
                any = true;
            }
        }
        if (any)
            dembed[k] += acc;
    }
}

/* One warp per row. */
__global__ void rmsnorm_forward_kernel(const float *inp, const float *weight, size_t T, int D,
                                       float eps, float *out, float *rstd)
{
    size_t t = (size_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (t >= T)
        return;
    const float *x = inp + t * (size_t)D;
    float ss = 0.0f;
    for (int i = lane; i < D; i += 32)
        ss += x[i] * x[i];
    ss = warp_sum(ss);
    float r = 1.0f / sqrtf(ss / (float)D + eps);
    if (lane == 0)
        rstd[t] = r;
    for (int i = lane; i < D; i += 32)
        out[t * (size_t)D + (size_t)i] = x[i] * r * weight[i];
}

__global__ void rmsnorm_backward_rows(const float *dout, const float *inp, const float *weight,
                                      const float *rstd, size_t T, int D, float *dinp)
{
    size_t t = (size_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (t >= T)
        return;
    const float *x = inp + t * (size_t)D, *dy = dout + t * (size_t)D;
    const float r = rstd[t];
    float dot = 0.0f;
    for (int i = lane; i < D; i += 32)
        dot += dy[i] * weight[i] * x[i];
    dot = warp_sum(dot);
    const float c = r * r * r * dot / (float)D;
    for (int i = lane; i < D; i += 32)
        dinp[t * (size_t)D + (size_t)i] += r * dy[i] * weight[i] - c * x[i];
}

/* One thread per column, rows in order. */
__global__ void rmsnorm_backward_weight(const float *dout, const float *inp, const float *rstd,
                                        size_t T, int D, float *dweight)
{
    GRID_STRIDE(i, (size_t)D)
    {
        float acc = 0.0f;
        for (size_t t = 0; t < T; t++)
            acc += dout[t * (size_t)D + i] * inp[t * (size_t)D + i] * rstd[t];
        dweight[i] += acc;
    }
}

/* One thread per token: E and K are small. */
__global__ void route_kernel(float *probs, size_t T, int E, int K, int *expert, float *gate)
{
    GRID_STRIDE(t, T)
    {
        float *p = probs + t * (size_t)E;
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
        int *sel = expert + t * (size_t)K;
        float *g = gate + t * (size_t)K;
        float kept = 0.0f;
        for (int k = 0; k < K; k++) {
            int best = -1;
            for (int e = 0; e < E; e++) {
                bool taken = false;
                for (int j = 0; j < k; j++)
                    taken = taken || sel[j] == e;
                if (!taken && (best < 0 || p[e] > p[best]))
                    best = e;
            }
            sel[k] = best;
            kept += p[best];
        }
        for (int k = 0; k < K; k++)
            g[k] = p[sel[k]] / kept;
    }
}

__global__ void route_backward_kernel(const float *probs, const int *expert, const float *gate,
                                      const float *dgate, size_t T, int E, int K, float *dlogits)
{
    GRID_STRIDE(t, T)
    {
        const float *p = probs + t * (size_t)E;
        const int *sel = expert + t * (size_t)K;
        const float *g = gate + t * (size_t)K, *dg = dgate + t * (size_t)K;
        float *dl = dlogits + t * (size_t)E;
        float kept = 0.0f, gdg = 0.0f;
        for (int k = 0; k < K; k++) {
            kept += p[sel[k]];
            gdg += g[k] * dg[k];
        }
        for (int e = 0; e < E; e++)
            dl[e] = 0.0f;
        float pdp = 0.0f;
        for (int k = 0; k < K; k++) {
            float dp = (dg[k] - gdg) / kept;
            dl[sel[k]] = dp;
            pdp += p[sel[k]] * dp;
        }
        for (int e = 0; e < E; e++)
            dl[e] = p[e] * (dl[e] - pdp);
    }
}

__global__ void add_slots_kernel(const float *dx, size_t T, int K, int D, float *du)
{
    GRID_STRIDE(k, T * (size_t)D)
    {
        size_t t = k / (size_t)D, i = k % (size_t)D;
        float acc = du[k];
        for (int s = 0; s < K; s++)
            acc += dx[(t * (size_t)K + (size_t)s) * (size_t)D + i];
        du[k] = acc;
    }
}

__global__ void combine_forward_kernel(const float *h_in, const float *gate, const float *y,
                                       size_t T, int K, int D, float *h)
{
    GRID_STRIDE(k, T * (size_t)D)
    {
        size_t t = k / (size_t)D, i = k % (size_t)D;
        float acc = h_in[k];
        for (int s = 0; s < K; s++)
            acc += gate[t * (size_t)K + (size_t)s] * y[(t * (size_t)K + (size_t)s) * (size_t)D + i];
        h[k] = acc;
    }
}

/* One warp per slot. */
__global__ void combine_backward_kernel(const float *dh, const float *gate, const float *y,
                                        size_t T, int K, int D, float *dy, float *dgate)
{
    size_t slot = (size_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (slot >= T * (size_t)K)
        return;
    size_t t = slot / (size_t)K;
    const float g = gate[slot];
    const float *d = dh + t * (size_t)D, *row = y + slot * (size_t)D;
    float dot = 0.0f;
    for (int i = lane; i < D; i += 32) {
        dy[slot * (size_t)D + (size_t)i] = g * d[i];
        dot += d[i] * row[i];
    }
    dot = warp_sum(dot);
    if (lane == 0)
        dgate[slot] = dot;
}

__global__ void silu_forward_kernel(const float *pre, float *act, size_t n)
{
    GRID_STRIDE(i, n)
    {
        act[i] = pre[i] * sigmoidf_(pre[i]);
    }
}

__global__ void silu_backward_kernel(const float *pre, float *dact, size_t n)
{
    GRID_STRIDE(i, n)
    {
        const float sg = sigmoidf_(pre[i]);
        dact[i] *= sg * (1.0f + pre[i] * (1.0f - sg));
    }
}

/* One block per token. */
__global__ void cross_entropy_kernel(float *logits, const int32_t *targets, size_t T, int V,
                                     float *loss)
{
    size_t t = blockIdx.x;
    if (t >= T)
        return;
    float *row = logits + t * (size_t)V;
    float mx = -INFINITY;
    for (int v = threadIdx.x; v < V; v += blockDim.x)
        mx = fmaxf(mx, row[v]);
    mx = block_reduce(mx, true);
    float sum = 0.0f;
    for (int v = threadIdx.x; v < V; v += blockDim.x)
        sum += expf(row[v] - mx);
    sum = block_reduce(sum, false);
    const int y = targets[t];
    const float target_logit = row[y];
    __syncthreads(); /* everyone has read row[y] before it is overwritten */
    if (threadIdx.x == 0)
        loss[t] = logf(sum) + mx - target_logit;
    for (int v = threadIdx.x; v < V; v += blockDim.x)
        row[v] = expf(row[v] - mx) / sum - (v == y ? 1.0f : 0.0f);
}

__global__ void copy_rows_kernel(float *dst, const int64_t *dst_rows, const float *src,
                                 const int64_t *src_rows, size_t n, int D)
{
    GRID_STRIDE(k, n * (size_t)D)
    {
        size_t j = k / (size_t)D, i = k % (size_t)D;
        size_t d = dst_rows ? (size_t)dst_rows[j] : j;
        size_t s = src_rows ? (size_t)src_rows[j] : j;
        dst[d * (size_t)D + i] = src[s * (size_t)D + i];
    }
}

int half_kind(seldp_dtype dtype)
{
    return dtype == SELDP_F16 ? 1 : dtype == SELDP_BF16 ? 2 : 0;
}

unsigned warps_grid(size_t rows)
{
    size_t per_block = kThreads / 32;
    size_t blocks = (rows + per_block - 1) / per_block;
    return (unsigned)(blocks ? blocks : 1);
}

} // namespace

extern "C" {

cudaError_t tmc_k_to_f32(cudaStream_t stream, seldp_dtype dtype, const void *src, float *dst,
                         size_t n)
{
    if (n == 0)
        return cudaSuccess;
    to_f32_kernel<<<grid_for(n), kThreads, 0, stream>>>(src, dst, n, half_kind(dtype));
    return cudaGetLastError();
}

cudaError_t tmc_k_export(cudaStream_t stream, const float *acc, size_t n, double scale,
                         seldp_dtype dtype, void *out)
{
    if (n == 0)
        return cudaSuccess;
    export_kernel<<<grid_for(n), kThreads, 0, stream>>>(acc, n, scale, half_kind(dtype), out);
    return cudaGetLastError();
}

cudaError_t tmc_k_nf4_dequant(cudaStream_t stream, const uint8_t *qweight, const float *absmax,
                              const float *codebook, size_t n, float *w)
{
    if (n == 0)
        return cudaSuccess;
    nf4_kernel<<<grid_for(n), kThreads, 0, stream>>>(qweight, absmax, codebook, n, w);
    return cudaGetLastError();
}

cudaError_t tmc_k_awq_dequant(cudaStream_t stream, const int32_t *qweight, const uint16_t *scales,
                              const int32_t *qzeros, int out, int in, float *w)
{
    size_t n = (size_t)out * (size_t)in;
    if (n == 0)
        return cudaSuccess;
    awq_kernel<<<grid_for(n), kThreads, 0, stream>>>(qweight, scales, qzeros, out, in, w);
    return cudaGetLastError();
}

cudaError_t tmc_k_embed_forward(cudaStream_t stream, const float *embed, const int32_t *tokens,
                                size_t T, int D, float *h)
{
    if (T == 0)
        return cudaSuccess;
    embed_forward_kernel<<<grid_for(T * (size_t)D), kThreads, 0, stream>>>(embed, tokens, T, D, h);
    return cudaGetLastError();
}

cudaError_t tmc_k_embed_backward(cudaStream_t stream, const float *dh, const int32_t *tokens,
                                 size_t T, int V, int D, float *dembed)
{
    if (T == 0)
        return cudaSuccess;
    embed_backward_kernel<<<grid_for((size_t)V * (size_t)D), kThreads, 0, stream>>>(dh, tokens, T,
                                                                                    V, D, dembed);
    return cudaGetLastError();
}

cudaError_t tmc_k_rmsnorm_forward(cudaStream_t stream, const float *inp, const float *weight,
                                  size_t T, int D, float eps, float *out, float *rstd)
{
    if (T == 0)
        return cudaSuccess;
    rmsnorm_forward_kernel<<<warps_grid(T), kThreads, 0, stream>>>(inp, weight, T, D, eps, out,
                                                                   rstd);
    return cudaGetLastError();
}

cudaError_t tmc_k_rmsnorm_backward(cudaStream_t stream, const float *dout, const float *inp,
                                   const float *weight, const float *rstd, size_t T, int D,
                                   float *dinp, float *dweight)
{
    if (T == 0)
        return cudaSuccess;
    rmsnorm_backward_rows<<<warps_grid(T), kThreads, 0, stream>>>(dout, inp, weight, rstd, T, D,
                                                                  dinp);
    rmsnorm_backward_weight<<<grid_for((size_t)D), kThreads, 0, stream>>>(dout, inp, rstd, T, D,
                                                                          dweight);
    return cudaGetLastError();
}

cudaError_t tmc_k_route(cudaStream_t stream, float *probs, size_t T, int E, int K, int *expert,
                        float *gate)
{
    if (T == 0)
        return cudaSuccess;
    route_kernel<<<grid_for(T), kThreads, 0, stream>>>(probs, T, E, K, expert, gate);
    return cudaGetLastError();
}

cudaError_t tmc_k_route_backward(cudaStream_t stream, const float *probs, const int *expert,
                                 const float *gate, const float *dgate, size_t T, int E, int K,
                                 float *dlogits)
{
    if (T == 0)
        return cudaSuccess;
    route_backward_kernel<<<grid_for(T), kThreads, 0, stream>>>(probs, expert, gate, dgate, T, E, K,
                                                                dlogits);
    return cudaGetLastError();
}

cudaError_t tmc_k_add_slots(cudaStream_t stream, const float *dx, size_t T, int K, int D, float *du)
{
    if (T == 0)
        return cudaSuccess;
    add_slots_kernel<<<grid_for(T * (size_t)D), kThreads, 0, stream>>>(dx, T, K, D, du);
    return cudaGetLastError();
}

cudaError_t tmc_k_combine_forward(cudaStream_t stream, const float *h_in, const float *gate,
                                  const float *y, size_t T, int K, int D, float *h)
{
    if (T == 0)
        return cudaSuccess;
    combine_forward_kernel<<<grid_for(T * (size_t)D), kThreads, 0, stream>>>(h_in, gate, y, T, K, D,
                                                                             h);
    return cudaGetLastError();
}

cudaError_t tmc_k_combine_backward(cudaStream_t stream, const float *dh, const float *gate,
                                   const float *y, size_t T, int K, int D, float *dy, float *dgate)
{
    if (T == 0)
        return cudaSuccess;
    combine_backward_kernel<<<warps_grid(T * (size_t)K), kThreads, 0, stream>>>(dh, gate, y, T, K,
                                                                                D, dy, dgate);
    return cudaGetLastError();
}

cudaError_t tmc_k_silu_forward(cudaStream_t stream, const float *pre, float *act, size_t n)
{
    if (n == 0)
        return cudaSuccess;
    silu_forward_kernel<<<grid_for(n), kThreads, 0, stream>>>(pre, act, n);
    return cudaGetLastError();
}

cudaError_t tmc_k_silu_backward(cudaStream_t stream, const float *pre, float *dact, size_t n)
{
    if (n == 0)
        return cudaSuccess;
    silu_backward_kernel<<<grid_for(n), kThreads, 0, stream>>>(pre, dact, n);
    return cudaGetLastError();
}

cudaError_t tmc_k_cross_entropy(cudaStream_t stream, float *logits, const int32_t *targets,
                                size_t T, int V, float *loss)
{
    if (T == 0)
        return cudaSuccess;
    for (size_t first = 0; first < T; first += 65535) {
        size_t rows = T - first < 65535 ? T - first : 65535;
        cross_entropy_kernel<<<(unsigned)rows, kThreads, 0, stream>>>(
            logits + first * (size_t)V, targets + first, rows, V, loss + first);
    }
    return cudaGetLastError();
}

cudaError_t tmc_k_copy_rows(cudaStream_t stream, float *dst, const int64_t *dst_rows,
                            const float *src, const int64_t *src_rows, size_t n, int D)
{
    if (n == 0)
        return cudaSuccess;
    copy_rows_kernel<<<grid_for(n * (size_t)D), kThreads, 0, stream>>>(dst, dst_rows, src, src_rows,
                                                                       n, D);
    return cudaGetLastError();
}

} // extern "C"
