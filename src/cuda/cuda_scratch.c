/* The pools of description buffers behind seldp__cuda_convert_batch (cuda_kernels.h): one
 * list of idle scratches for the process, each tagged with its device ordinal, under one
 * mutex held only to take or give one (never across an allocation or a CUDA call). A
 * scratch is a grow-only pair of buffers (device.h: seldp__device_buffer on its GPU and
 * seldp__pinned_buffer), as the NCCL transport keeps its reduction's buffers. Built only
 * with CUDA. */
#include <pthread.h>
#include <stdlib.h>

#include "cuda/cuda_kernels.h"
#include "device.h"
#include "internal.h"

struct seldp__cuda_scratch {
    int ordinal;
    seldp__device_buffer dev;  /* on cuda:ordinal */
    seldp__pinned_buffer host; /* the same bytes, written on the host */
    /* what growing gave up: freed with the pool, since freeing synchronizes the device while
     * an NCCL rank's peer may be inside a kernel waiting for it (device.h) */
    seldp__retired retired;
    struct seldp__cuda_scratch *next;
};

static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER;
static seldp__cuda_scratch *idle; /* every scratch not held, of every ordinal */
static pthread_once_t exit_once = PTHREAD_ONCE_INIT;

/* At exit: free the pools while the CUDA runtime still answers (registered after the first
 * allocation, so before any handler the runtime registered when it started); a runtime
 * already unloading keeps them, as the process ends anyway. */
static void release_at_exit(void)
{
    int n = 0;
    if (seldp__cuda()->get_device_count(&n) != cudaSuccess)
        return;
    seldp__cuda_scratch_release();
}

static void register_exit(void)
{
    atexit(release_at_exit);
}

static bool fits(const seldp__cuda_scratch *s, size_t bytes)
{
    return s->dev.ptr && s->host.ptr && s->dev.bytes >= bytes && s->host.bytes >= bytes;
}

static size_t held(const seldp__cuda_scratch *s)
{
    return s->dev.bytes < s->host.bytes ? s->dev.bytes : s->host.bytes;
}

/* An idle scratch of `ordinal`, unlinked: the smallest that fits when one does (threads
 * that convert batches of different sizes at once each find theirs again), else the
 * largest, to be grown. */
static seldp__cuda_scratch *pick(int ordinal, size_t bytes)
{
    seldp__cuda_scratch **best = NULL;
    pthread_mutex_lock(&pool_lock);
    for (seldp__cuda_scratch **p = &idle; *p; p = &(*p)->next) {
        if ((*p)->ordinal != ordinal)
            continue;
        bool fit = fits(*p, bytes), best_fit = best && fits(*best, bytes);
        if (!best || (fit && (!best_fit || held(*p) < held(*best))) ||
            (!fit && !best_fit && held(*p) > held(*best)))
            best = p;
    }
    seldp__cuda_scratch *s = best ? *best : NULL;
    if (s) {
        *best = s->next;
        s->next = NULL;
    }
    pthread_mutex_unlock(&pool_lock);
    return s;
}

seldp_status seldp__cuda_scratch_take(int ordinal, size_t bytes, seldp__cuda_scratch **out,
                                      void **host, void **dev)
{
    seldp_status st = SELDP_OK;
    seldp__cuda_scratch *s = pick(ordinal, bytes);
    *out = NULL;
    *host = *dev = NULL;
    if (!s) {
        if (!(s = calloc(1, sizeof *s)))
            return seldp__fail(SELDP_ERR_NOMEM,
                               "cuda:%d: out of memory for a conversion's descriptions", ordinal);
        s->ordinal = ordinal;
        s->dev.retire = &s->retired;
        s->host.retire = &s->retired;
    }
    if (!fits(s, bytes)) {
        st = seldp__device_reserve(&s->dev, (seldp_device){SELDP_DEVICE_CUDA, ordinal}, bytes);
        if (st == SELDP_OK)
            st = seldp__pinned_reserve(&s->host, (seldp_device){SELDP_DEVICE_CUDA, ordinal}, bytes);
        if (st != SELDP_OK) {
            seldp__cuda_scratch_give(s); /* what it holds stays for the next call */
            return st;
        }
        pthread_once(&exit_once, register_exit);
    }
    *out = s;
    *host = s->host.ptr;
    *dev = s->dev.ptr;
    return SELDP_OK;
}

void seldp__cuda_scratch_give(seldp__cuda_scratch *scratch)
{
    if (!scratch)
        return;
    pthread_mutex_lock(&pool_lock);
    scratch->next = idle;
    idle = scratch;
    pthread_mutex_unlock(&pool_lock);
}

size_t seldp__cuda_scratch_release(void)
{
    size_t n = 0;
    pthread_mutex_lock(&pool_lock);
    seldp__cuda_scratch *s = idle;
    idle = NULL;
    pthread_mutex_unlock(&pool_lock);
    while (s) {
        seldp__cuda_scratch *next = s->next;
        seldp__device_release(&s->dev);
        seldp__pinned_release(&s->host);
        seldp__retired_free(&s->retired);
        free(s);
        s = next;
        n++;
    }
    return n;
}
