/* The NCCL transport: what every call of a rank goes through. Waiting (polling NCCL's
 * asynchronous state and the rank's stream against the world's timeout, never a blocking
 * CUDA call), failing (the message, the world marked aborted, the rank's NCCL communicator
 * aborted) and the device staging buffer for host payloads. See nccl_impl.h. */
#define _POSIX_C_SOURCE 200809L /* clock_gettime, nanosleep */

#include <cuda_runtime_api.h>
#include <nccl.h>
#include <sched.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm/nccl/nccl_impl.h"
#include "device.h"
#include "internal.h"

/* ---- waiting, failing and aborting --------------------------------------------------- */

double seldp__nccl_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Spin briefly (collectives often finish in microseconds), then sleep between polls so
 * that waiting ranks leave the CPU to NCCL's proxy threads. */
void seldp__nccl_backoff(unsigned *polls)
{
    if (++*polls < 2000) {
        sched_yield();
        return;
    }
    struct timespec ts = {0, 50 * 1000};
    nanosleep(&ts, NULL);
}

/* Abort this rank's NCCL communicator (its kernels stop, its resources are reclaimed by
 * NCCL in the background). Local; the handle becomes unusable. */
void seldp__nccl_abort_local(nccl_comm *c)
{
    if (c->nccl) {
        ncclCommAbort(c->nccl);
        c->nccl = NULL;
    }
}

/* Record why this rank gives up, mark the world aborted so that no other rank waits for
 * it, abort the rank's communicator and return `status`. */
seldp_status seldp__nccl_fail_abort(nccl_comm *c, seldp_status status, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    atomic_store(&c->world->aborted, true);
    seldp__nccl_abort_local(c);
    return seldp__fail(status, "%s", msg);
}

seldp_status seldp__nccl_fail_nccl(nccl_comm *c, const char *what, ncclResult_t r)
{
    return seldp__nccl_fail_abort(
        c, SELDP_ERR_TRANSPORT,
        "nccl rank %d/%d (cuda:%d): %s failed: %s (%s); the world is aborted", c->rank, c->size,
        c->ordinal, what, ncclGetErrorString(r), ncclGetLastError(NULL));
}

seldp_status seldp__nccl_fail_cuda(nccl_comm *c, const char *what, cudaError_t err)
{
    seldp__cuda_ignore(err); /* reported here: the next call must not see it again */
    return seldp__nccl_fail_abort(c, SELDP_ERR_TRANSPORT,
                                  "nccl rank %d/%d (cuda:%d): %s failed: %s; the world is aborted",
                                  c->rank, c->size, c->ordinal, what, cudaGetErrorString(err));
}

seldp_status seldp__nccl_fail_aborted(nccl_comm *c, const char *what)
{
    seldp__nccl_abort_local(c);
    return seldp__fail(SELDP_ERR_ABORTED,
                       "nccl rank %d/%d (cuda:%d): %s: the world was aborted (by a rank's "
                       "seldp_comm_abort, an error or a timeout)",
                       c->rank, c->size, c->ordinal, what);
}

seldp_status seldp__nccl_fail_timeout(nccl_comm *c, const char *what)
{
    return seldp__nccl_fail_timeout_after(c, what, c->world->timeout_s);
}

seldp_status seldp__nccl_fail_timeout_after(nccl_comm *c, const char *what, double timeout_s)
{
    return seldp__nccl_fail_abort(
        c, SELDP_ERR_TIMEOUT,
        "nccl rank %d/%d (cuda:%d): %s did not complete within %.1f s (a rank did "
        "not arrive); the world is aborted",
        c->rank, c->size, c->ordinal, what, timeout_s);
}

/* Wait until NCCL is done with what was issued on c (ncclCommGetAsyncError no longer in
 * progress) and, with `stream`, until c's stream has drained. Aborts on a world abort, an
 * asynchronous NCCL error, a CUDA error or the timeout. */
seldp_status seldp__nccl_wait_done(nccl_comm *c, const char *what, bool stream)
{
    return seldp__nccl_wait_within(c, what, stream, c->world->timeout_s);
}

double seldp__nccl_join_timeout(const nccl_comm *c)
{
    double t = c->world->timeout_s;
    return t > SELDP_NCCL_JOIN_TIMEOUT_MIN_S ? t : SELDP_NCCL_JOIN_TIMEOUT_MIN_S;
}

seldp_status seldp__nccl_wait_within(nccl_comm *c, const char *what, bool stream, double timeout_s)
{
    double deadline = seldp__nccl_now() + timeout_s;
    unsigned polls = 0;
    for (;;) {
        if (atomic_load(&c->world->aborted))
            return seldp__nccl_fail_aborted(c, what);
        ncclResult_t state = ncclSuccess;
        ncclResult_t r = ncclCommGetAsyncError(c->nccl, &state);
        if (r != ncclSuccess)
            return seldp__nccl_fail_nccl(c, "ncclCommGetAsyncError", r);
        if (state != ncclSuccess && state != ncclInProgress)
            return seldp__nccl_fail_nccl(c, what, state);
        if (state == ncclSuccess) {
            if (!stream)
                return SELDP_OK;
            cudaError_t q = seldp__cuda()->stream_query(c->stream);
            if (q == cudaSuccess)
                return SELDP_OK;
            if (q != cudaErrorNotReady)
                return seldp__nccl_fail_cuda(c, what, q);
        }
        if (seldp__nccl_now() > deadline)
            return seldp__nccl_fail_timeout_after(c, what, timeout_s);
        seldp__nccl_backoff(&polls);
    }
}

/* Make the rank's device current and refuse to start on an aborted world. */
seldp_status seldp__nccl_enter(nccl_comm *c, const char *what)
{
    if (atomic_load(&c->world->aborted) || !c->nccl)
        return seldp__nccl_fail_aborted(c, what);
    int cur = -1;
    cudaError_t err = seldp__cuda()->get_device(&cur);
    if (err == cudaSuccess && cur != c->ordinal)
        err = seldp__cuda()->set_device(c->ordinal);
    if (err != cudaSuccess)
        return seldp__nccl_fail_cuda(c, "cudaSetDevice", err);
    return SELDP_OK;
}

/* A device buffer must be on this rank's GPU: NCCL reads it from there. */
seldp_status seldp__nccl_check_device_mem(nccl_comm *c, const char *what, seldp_device mem)
{
    if (mem.kind == SELDP_DEVICE_CUDA && mem.ordinal != c->ordinal)
        return seldp__nccl_fail_abort(
            c, SELDP_ERR_DEVICE,
            "nccl rank %d/%d: %s: buffer on cuda:%d, expected the rank's device "
            "cuda:%d or the host",
            c->rank, c->size, what, mem.ordinal, c->ordinal);
    return SELDP_OK;
}

/* At least `bytes` of device staging. Only called between collectives (nothing of this
 * rank in flight); the smaller buffer is retired, not freed: freeing would synchronize the
 * device, and its peers, while a peer may be inside an NCCL kernel waiting for this rank. */
seldp_status seldp__nccl_ensure_staging(nccl_comm *c, size_t bytes)
{
    if (bytes <= c->staging_bytes)
        return SELDP_OK;
    seldp__device_buffer b = {.device = {SELDP_DEVICE_CUDA, c->ordinal},
                              .ptr = c->staging,
                              .bytes = c->staging_bytes,
                              .retire = &c->retired_buffers};
    size_t want = bytes < 4096 ? 4096 : bytes;
    c->staging = NULL;
    c->staging_bytes = 0;
    if (seldp__device_reserve(&b, b.device, want) != SELDP_OK) {
        char why[256];
        snprintf(why, sizeof why, "%s", seldp_last_error());
        return seldp__nccl_fail_abort(c, SELDP_ERR_NOMEM,
                                      "nccl rank %d/%d: %zu staging bytes on cuda:%d: %s", c->rank,
                                      c->size, want, c->ordinal, why);
    }
    c->staging = b.ptr;
    c->staging_bytes = b.bytes;
    return SELDP_OK;
}

/* Copy between host and device on the rank's stream and wait. Used only when no NCCL work
 * is pending on the stream, so the wait cannot depend on another rank. */
seldp_status seldp__nccl_copy_sync(nccl_comm *c, void *dst, const void *src, size_t bytes,
                                   enum cudaMemcpyKind kind)
{
    if (bytes == 0)
        return SELDP_OK;
    cudaError_t err = seldp__cuda()->memcpy_async(dst, src, bytes, kind, c->stream);
    if (err == cudaSuccess)
        err = seldp__cuda()->stream_synchronize(c->stream);
    if (err != cudaSuccess)
        return seldp__nccl_fail_cuda(c, "staging copy", err);
    return SELDP_OK;
}

bool seldp__nccl_type(seldp_dtype dtype, ncclDataType_t *out)
{
    switch (dtype) {
    case SELDP_F32:
        *out = ncclFloat32;
        return true;
    case SELDP_F64:
        *out = ncclFloat64;
        return true;
    case SELDP_F16:
        *out = ncclFloat16;
        return true;
    case SELDP_BF16:
        *out = ncclBfloat16;
        return true;
    case SELDP_I8:
        *out = ncclInt8;
        return true;
    case SELDP_U8:
        *out = ncclUint8;
        return true;
    case SELDP_I32:
        *out = ncclInt32;
        return true;
    case SELDP_U32:
        *out = ncclUint32;
        return true;
    case SELDP_I64:
        *out = ncclInt64;
        return true;
    case SELDP_U64:
        *out = ncclUint64;
        return true;
    default:
        return false;
    }
}
