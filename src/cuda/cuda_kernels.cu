/* CUDA versions of the element-wise operations of src/kernels.h: dtype conversion,
 * F32 scaling and the search for a non-finite value.
 *
 * Every call runs on the calling thread's per-thread default stream of device `ordinal`
 * and waits for it, so that rank threads sharing one GPU (the host-staged transport
 * simulating more ranks than GPUs) never serialize on the legacy default stream. The
 * conversions share their bit-level code with a host-side test (src/cuda/half/seldp_half_bits.cuh).
 *
 * The batched conversion and the search for a non-finite value allocate nothing once warm:
 * their descriptions and result word live in grow-only buffers kept per device by a pool
 * (cuda_scratch.c), and they reach the runtime (copies, waits, launches) through
 * seldp__cuda(), so that tests/unit/test_device_batch_scratch.c can count what they do
 * without a GPU.
 */
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdlib.h>

#include "cuda/cuda_kernels.h"
#include "seldp_half_bits.cuh"

extern "C" {
#include "device.h"
#include "internal.h"
}

namespace
{

const int kThreads = 256;

/* Enough blocks to fill the GPU several times over; the kernels stride over the rest. */
unsigned blocks_for(size_t n)
{
    size_t blocks = (n + kThreads - 1) / kThreads;
    const size_t max_blocks = 8192;
    return (unsigned)(blocks < max_blocks ? (blocks ? blocks : 1) : max_blocks);
}

/* The error, cleared from the thread's last error so that the next call does not see it. */
seldp_status cuda_fail(cudaError_t err, const char *what, int ordinal)
{
    seldp__cuda_ignore(err);
    return seldp__fail(SELDP_ERR_TRANSPORT, "%s on cuda:%d failed: %s", what, ordinal,
                       cudaGetErrorString(err));
}

/* Makes `ordinal` the current device for the lifetime of the object and restores the
 * caller's device afterwards, as src/device.c does for copies (through the same table of
 * runtime calls, seldp__cuda()). */
class DeviceScope
{
  public:
    explicit DeviceScope(int ordinal) : prev_(-1), err_(cudaSuccess)
    {
        err_ = seldp__cuda()->get_device(&prev_);
        if (err_ == cudaSuccess && prev_ != ordinal)
            err_ = seldp__cuda()->set_device(ordinal);
        else if (prev_ == ordinal)
            prev_ = -1;
    }
    ~DeviceScope()
    {
        if (prev_ >= 0)
            seldp__cuda_ignore(seldp__cuda()->set_device(prev_));
    }
    cudaError_t error() const
    {
        return err_;
    }

  private:
    int prev_;
    cudaError_t err_;
};

/* Launch status and completion of the work just queued on the per-thread stream. */
seldp_status finish(const char *what, int ordinal)
{
    cudaError_t err = cudaGetLastError();
    if (err == cudaSuccess)
        err = cudaStreamSynchronize(cudaStreamPerThread);
    if (err != cudaSuccess)
        return cuda_fail(err, what, ordinal);
    return SELDP_OK;
}

__global__ void half_to_f32_kernel(float *dst, const uint16_t *src, size_t n, bool bf16)
{
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        uint16_t h = src[i];
        uint32_t bits = bf16 ? seldp__bf16_to_f32_bits(h) : seldp__f16_to_f32_bits(h);
        dst[i] = __uint_as_float(bits);
    }
}

__global__ void f32_to_half_kernel(uint16_t *dst, const float *src, size_t n, bool bf16)
{
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        uint32_t x = __float_as_uint(src[i]);
        dst[i] = bf16 ? seldp__f32_bits_to_bf16(x) : seldp__f32_bits_to_f16(x);
    }
}

/* In double, then rounded once to F32, a NaN kept on its bits: the host loop's own helper. */
__global__ void scale_f32_kernel(uint32_t *x, size_t n, double factor)
{
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        x[i] = seldp__scale_f32_bits(x[i], factor);
}

/* The smallest index whose exponent field is all ones, by atomicMin on *first (which starts
 * at n). Threads skip work past the best index found so far. */
template <typename T>
__global__ void nonfinite_kernel(const T *x, size_t n, T exp_mask, unsigned long long *first)
{
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        if ((unsigned long long)i >= *(volatile unsigned long long *)first)
            return;
        if ((x[i] & exp_mask) == exp_mask)
            atomicMin(first, (unsigned long long)i);
    }
}

/* One launch of nonfinite_kernel<T> over x[0, n) on `stream`, through seldp__cuda(). */
template <typename T>
cudaError_t launch_nonfinite(const void *x, size_t n, T exp_mask, unsigned long long *first,
                             cudaStream_t stream)
{
    const T *arg_x = (const T *)x;
    size_t arg_n = n;
    T arg_mask = exp_mask;
    unsigned long long *arg_first = first;
    void *args[] = {&arg_x, &arg_n, &arg_mask, &arg_first};
    return seldp__cuda()->launch_kernel((const void *)nonfinite_kernel<T>, dim3(blocks_for(n)),
                                        dim3(kThreads), args, 0, stream);
}

/* One segment of a batch as the kernel reads it: elements [start, start + n) of the batch's
 * index space. */
enum BatchOp { kZero, kCopy, kHalfToF32, kBf16ToF32, kF32ToHalf, kF32ToBf16, kScaleF32 };
struct BatchSeg {
    void *dst;
    const void *src;
    unsigned long long start, n;
    int op;
    int size; /* bytes per element of dst for kZero and kCopy */
};

template <typename T>
__device__ __forceinline__ void copy_elem(void *dst, const void *src, size_t j)
{
    ((T *)dst)[j] = ((const T *)src)[j];
}

template <typename T> __device__ __forceinline__ void zero_elem(void *dst, size_t j)
{
    ((T *)dst)[j] = T(0);
}

/* Every element of every segment, grid-stride over the batch's index space; the segment
 * of element i is found by binary search over the starts. F32 sources are multiplied by
 * `scale` first unless it is 1 (seldp__scale_convert_bits: the fused scale and cast). */
__global__ void convert_batch_kernel(const BatchSeg *segs, size_t n_segs, size_t total,
                                     double scale)
{
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += stride) {
        size_t lo = 0, hi = n_segs;
        while (hi - lo > 1) {
            size_t mid = lo + (hi - lo) / 2;
            if (segs[mid].start <= i)
                lo = mid;
            else
                hi = mid;
        }
        const BatchSeg &g = segs[lo];
        size_t j = i - (size_t)g.start;
        switch (g.op) {
        case kZero:
            if (g.size == 8)
                zero_elem<unsigned long long>(g.dst, j);
            else if (g.size == 4)
                zero_elem<uint32_t>(g.dst, j);
            else if (g.size == 2)
                zero_elem<uint16_t>(g.dst, j);
            else
                zero_elem<uint8_t>(g.dst, j);
            break;
        case kCopy:
            if (g.size == 8)
                copy_elem<unsigned long long>(g.dst, g.src, j);
            else if (g.size == 4)
                copy_elem<uint32_t>(g.dst, g.src, j);
            else if (g.size == 2)
                copy_elem<uint16_t>(g.dst, g.src, j);
            else
                copy_elem<uint8_t>(g.dst, g.src, j);
            break;
        case kHalfToF32:
            ((float *)g.dst)[j] =
                __uint_as_float(seldp__f16_to_f32_bits(((const uint16_t *)g.src)[j]));
            break;
        case kBf16ToF32:
            ((float *)g.dst)[j] =
                __uint_as_float(seldp__bf16_to_f32_bits(((const uint16_t *)g.src)[j]));
            break;
        case kScaleF32:
            ((uint32_t *)g.dst)[j] =
                seldp__scale_convert_bits(((const uint32_t *)g.src)[j], scale, SELDP_SCALE_TO_F32);
            break;
        case kF32ToHalf:
            ((uint16_t *)g.dst)[j] = (uint16_t)seldp__scale_convert_bits(
                ((const uint32_t *)g.src)[j], scale, SELDP_SCALE_TO_F16);
            break;
        default:
            ((uint16_t *)g.dst)[j] = (uint16_t)seldp__scale_convert_bits(
                ((const uint32_t *)g.src)[j], scale, SELDP_SCALE_TO_BF16);
            break;
        }
    }
}

int batch_op(const seldp__convert_seg &g, double scale)
{
    if (!g.src)
        return kZero;
    if (g.dst_dtype == SELDP_F32 && g.src_dtype == SELDP_F32 && scale != 1.0)
        return kScaleF32;
    if (g.dst_dtype == g.src_dtype)
        return kCopy;
    if (g.dst_dtype == SELDP_F32)
        return g.src_dtype == SELDP_BF16 ? kBf16ToF32 : kHalfToF32;
    return g.dst_dtype == SELDP_BF16 ? kF32ToBf16 : kF32ToHalf;
}

bool ranges_overlap(const void *a, size_t a_bytes, const void *b, size_t b_bytes)
{
    uintptr_t a0 = (uintptr_t)a, b0 = (uintptr_t)b;
    return a0 < b0 + b_bytes && b0 < a0 + a_bytes;
}

/* Whether a segment moves something (describe() keeps it). */
bool moves(const seldp__convert_seg &g, double scale)
{
    return g.n != 0 && !(batch_op(g, scale) == kCopy && g.dst == g.src);
}

/* The descriptions of the segments that move something, into host[]; returns how many,
 * and the elements they cover in *total. */
size_t describe(const seldp__convert_seg *segs, size_t n_segs, double scale, BatchSeg *host,
                unsigned long long *total)
{
    size_t n = 0;
    *total = 0;
    for (size_t i = 0; i < n_segs; i++) {
        const seldp__convert_seg &g = segs[i];
        int op = batch_op(g, scale);
        if (!moves(g, scale))
            continue;
        host[n].dst = g.dst;
        host[n].src = g.src;
        host[n].start = *total;
        host[n].n = g.n;
        host[n].op = op;
        host[n].size = (int)seldp_dtype_size(g.dst_dtype);
        *total += g.n;
        n++;
    }
    return n;
}

} // namespace

extern "C" seldp_status seldp__cuda_convert(int ordinal, void *dst, seldp_dtype dst_dtype,
                                            const void *src, seldp_dtype src_dtype, size_t n)
{
    bool same = dst_dtype == src_dtype;
    bool to_f32 = dst_dtype == SELDP_F32 && (src_dtype == SELDP_F16 || src_dtype == SELDP_BF16);
    bool from_f32 = src_dtype == SELDP_F32 && (dst_dtype == SELDP_F16 || dst_dtype == SELDP_BF16);
    if (!same && !to_f32 && !from_f32)
        return seldp__fail(SELDP_ERR_DTYPE,
                           "cuda:%d convert: %s -> %s is not supported, expected a copy or F32 "
                           "<-> F16/BF16",
                           ordinal, seldp_dtype_name(src_dtype), seldp_dtype_name(dst_dtype));
    if (n == 0 || (same && dst == src))
        return SELDP_OK;

    DeviceScope scope(ordinal);
    if (scope.error() != cudaSuccess)
        return cuda_fail(scope.error(), "cudaSetDevice", ordinal);
    cudaStream_t stream = cudaStreamPerThread;
    size_t src_bytes = n * seldp_dtype_size(src_dtype);
    size_t dst_bytes = n * seldp_dtype_size(dst_dtype);

    /* Overlapping buffers (a conversion in place, or a shifted copy) go through a temporary:
     * neither cudaMemcpy nor a parallel kernel may read what another thread already wrote. */
    void *out = dst;
    cudaError_t err = cudaSuccess;
    if (ranges_overlap(dst, dst_bytes, src, src_bytes)) {
        err = cudaMallocAsync(&out, dst_bytes, stream);
        if (err != cudaSuccess)
            return cuda_fail(err, "cudaMallocAsync (conversion temporary)", ordinal);
    }
    if (same)
        err = cudaMemcpyAsync(out, src, src_bytes, cudaMemcpyDeviceToDevice, stream);
    else if (to_f32)
        half_to_f32_kernel<<<blocks_for(n), kThreads, 0, stream>>>(
            (float *)out, (const uint16_t *)src, n, src_dtype == SELDP_BF16);
    else
        f32_to_half_kernel<<<blocks_for(n), kThreads, 0, stream>>>(
            (uint16_t *)out, (const float *)src, n, dst_dtype == SELDP_BF16);
    if (err == cudaSuccess)
        err = cudaGetLastError();
    if (out != dst) {
        if (err == cudaSuccess)
            err = cudaMemcpyAsync(dst, out, dst_bytes, cudaMemcpyDeviceToDevice, stream);
        cudaError_t free_err = cudaFreeAsync(out, stream);
        if (err == cudaSuccess)
            err = free_err;
    }
    if (err != cudaSuccess)
        return cuda_fail(err, "convert", ordinal);
    return finish("convert", ordinal);
}

extern "C" seldp_status seldp__cuda_convert_batch(int ordinal, const seldp__convert_seg *segs,
                                                  size_t n_segs)
{
    size_t i = 0;
    while (i < n_segs && !moves(segs[i], 1.0))
        i++;
    if (i == n_segs)
        return SELDP_OK; /* nothing moves: no launch, nothing taken from the pool */
    DeviceScope scope(ordinal);
    if (scope.error() != cudaSuccess)
        return cuda_fail(scope.error(), "cudaSetDevice", ordinal);
    seldp__cuda_scratch *scratch = NULL;
    void *host = NULL, *dev = NULL;
    seldp_status st = seldp__cuda_scratch_take(ordinal, seldp__cuda_batch_desc_bytes(n_segs),
                                               &scratch, &host, &dev);
    if (st != SELDP_OK)
        return st;
    cudaStream_t stream = cudaStreamPerThread;
    st = seldp__cuda_convert_async(stream, segs, n_segs, 1.0, host, dev);
    /* Also after a failed launch: the copy of the descriptions may be in flight, and the
     * scratch goes back to the pool only once the stream has passed it. */
    cudaError_t err = seldp__cuda()->stream_synchronize(stream);
    seldp__cuda_scratch_give(scratch);
    if (st == SELDP_OK && err != cudaSuccess)
        st = cuda_fail(err, "convert_batch", ordinal);
    else
        seldp__cuda_ignore(err); /* the launch's failure is the one reported */
    return st;
}

extern "C" size_t seldp__cuda_batch_desc_bytes(size_t n_segs)
{
    return (n_segs ? n_segs : 1) * sizeof(BatchSeg);
}

extern "C" seldp_status seldp__cuda_convert_async(cudaStream_t stream,
                                                  const seldp__convert_seg *segs, size_t n_segs,
                                                  double scale, void *host_desc, void *dev_desc)
{
    unsigned long long total = 0;
    BatchSeg *host = (BatchSeg *)host_desc;
    size_t n = describe(segs, n_segs, scale, host, &total);
    if (n == 0)
        return SELDP_OK;
    const seldp__cuda_api *rt = seldp__cuda();
    cudaError_t err =
        rt->memcpy_async(dev_desc, host, n * sizeof *host, cudaMemcpyHostToDevice, stream);
    if (err == cudaSuccess) {
        const BatchSeg *arg_segs = (const BatchSeg *)dev_desc;
        size_t arg_n = n, arg_total = (size_t)total;
        double arg_scale = scale;
        void *args[] = {&arg_segs, &arg_n, &arg_total, &arg_scale};
        err = rt->launch_kernel((const void *)convert_batch_kernel, dim3(blocks_for(arg_total)),
                                dim3(kThreads), args, 0, stream);
    }
    if (err != cudaSuccess) {
        int ordinal = -1;
        seldp__cuda_ignore(rt->get_device(&ordinal));
        return cuda_fail(err, "scale and convert", ordinal);
    }
    return SELDP_OK;
}

extern "C" seldp_status seldp__cuda_scale_f32(int ordinal, float *x, size_t n, double factor)
{
    if (n == 0)
        return SELDP_OK;
    DeviceScope scope(ordinal);
    if (scope.error() != cudaSuccess)
        return cuda_fail(scope.error(), "cudaSetDevice", ordinal);
    scale_f32_kernel<<<blocks_for(n), kThreads, 0, cudaStreamPerThread>>>((uint32_t *)x, n, factor);
    return finish("scale_f32", ordinal);
}

extern "C" seldp_status seldp__cuda_find_nonfinite(int ordinal, const void *x, seldp_dtype dtype,
                                                   size_t n, size_t *first)
{
    if (dtype != SELDP_F32 && dtype != SELDP_F64 && dtype != SELDP_F16 && dtype != SELDP_BF16)
        return seldp__fail(SELDP_ERR_DTYPE, "cuda:%d find_nonfinite: dtype %s is not a float type",
                           ordinal, seldp_dtype_name(dtype));
    if (n == 0) {
        *first = 0;
        return SELDP_OK;
    }
    DeviceScope scope(ordinal);
    if (scope.error() != cudaSuccess)
        return cuda_fail(scope.error(), "cudaSetDevice", ordinal);
    cudaStream_t stream = cudaStreamPerThread;
    /* the result's word, up and down, in a scratch of the pool: nothing allocated per call */
    seldp__cuda_scratch *scratch = NULL;
    void *host = NULL, *dev = NULL;
    seldp_status st =
        seldp__cuda_scratch_take(ordinal, sizeof(unsigned long long), &scratch, &host, &dev);
    if (st != SELDP_OK)
        return st;
    unsigned long long *d_first = (unsigned long long *)dev;
    unsigned long long *h_first = (unsigned long long *)host;
    *h_first = (unsigned long long)n;
    const seldp__cuda_api *rt = seldp__cuda();
    cudaError_t err =
        rt->memcpy_async(d_first, h_first, sizeof *h_first, cudaMemcpyHostToDevice, stream);
    if (err == cudaSuccess) {
        switch (dtype) {
        case SELDP_F32:
            err = launch_nonfinite<uint32_t>(x, n, 0x7f800000u, d_first, stream);
            break;
        case SELDP_F64:
            err =
                launch_nonfinite<unsigned long long>(x, n, 0x7ff0000000000000ull, d_first, stream);
            break;
        case SELDP_F16:
            err = launch_nonfinite<uint16_t>(x, n, (uint16_t)0x7c00u, d_first, stream);
            break;
        default:
            err = launch_nonfinite<uint16_t>(x, n, (uint16_t)0x7f80u, d_first, stream);
            break;
        }
    }
    if (err == cudaSuccess)
        err = rt->memcpy_async(h_first, d_first, sizeof *h_first, cudaMemcpyDeviceToHost, stream);
    /* always: the scratch goes back only once the stream has passed the copies */
    cudaError_t sync_err = rt->stream_synchronize(stream);
    if (err == cudaSuccess)
        err = sync_err;
    size_t found = (size_t)*h_first;
    seldp__cuda_scratch_give(scratch);
    if (err != cudaSuccess)
        return cuda_fail(err, "find_nonfinite", ordinal);
    *first = found;
    return SELDP_OK;
}
