/* Helpers of the GPU tests: skipping without a GPU, rank threads on CUDA devices over the
 * host-staged or the NCCL transport, and device buffers through the public tensor API. */
#define _POSIX_C_SOURCE 200809L /* access */

#include <dirent.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <cuda_runtime_api.h>

#include "gpu_ranks.h"
#ifdef SELDP_HAVE_NCCL
#include "seldp/nccl.h"
#endif

/* True when the kernel driver shows an NVIDIA GPU, whatever the CUDA runtime says. */
static bool gpu_visible_to_driver(void)
{
    DIR *dir = opendir("/proc/driver/nvidia/gpus");
    bool any = false;
    if (dir) {
        struct dirent *e;
        while (!any && (e = readdir(dir)))
            any = e->d_name[0] != '.';
        closedir(dir);
    }
    return any || access("/dev/nvidia0", F_OK) == 0;
}

int gpu_require(void)
{
    int n = 0;
    cudaError_t err = cudaGetDeviceCount(&n);
    if (err == cudaSuccess && n >= 1)
        return n;
    if (gpu_visible_to_driver()) {
        /* a GPU is there but CUDA cannot use it: an old driver, a broken install. That is a
         * failure, never a skip, or a GPU run would pass with nothing tested. */
        int driver = 0, runtime = 0;
        cudaDriverGetVersion(&driver);
        cudaRuntimeGetVersion(&runtime);
        fprintf(stderr,
                "FAIL: the NVIDIA driver shows a GPU but CUDA cannot use it: %s (%s); the driver "
                "supports CUDA %d.%d, this build's runtime is CUDA %d.%d\n",
                cudaGetErrorName(err), cudaGetErrorString(err), driver / 1000, driver % 1000 / 10,
                runtime / 1000, runtime % 1000 / 10);
        exit(1);
    }
    fprintf(stderr, "no CUDA device: skipped\n");
    exit(77);
}

bool gpu_host_mode(int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--host") == 0)
            return true;
    return false;
}

typedef struct gpu_thread {
    pthread_t thread;
    gpu_world_kind kind;
    seldp_host_world *host;
#ifdef SELDP_HAVE_NCCL
    seldp_nccl_world *nccl;
#endif
    int ordinal;
    tr_rank_fn fn;
    tr_rank_ctx ctx;
    int result;
    bool started;
} gpu_thread;

static void *gpu_rank_main(void *p)
{
    gpu_thread *t = p;
    seldp_status st = SELDP_ERR_UNSUPPORTED;
    const char *call = "join";
    if (t->kind == GPU_WORLD_HOST_ON_HOST) {
        call = "seldp_host_comm_init";
        st = seldp_host_comm_init(t->host, t->ctx.rank, SELDP_HOST_DEVICE, &t->ctx.world);
    } else {
        cudaError_t err = cudaSetDevice(t->ordinal);
        if (err != cudaSuccess) {
            snprintf(t->ctx.why, sizeof t->ctx.why, "cudaSetDevice(%d): %s", t->ordinal,
                     cudaGetErrorString(err));
            t->result = 1;
            return NULL;
        }
        if (t->kind == GPU_WORLD_HOST_STAGED) {
            call = "seldp_host_comm_init";
            seldp_device dev = {SELDP_DEVICE_CUDA, t->ordinal};
            st = seldp_host_comm_init(t->host, t->ctx.rank, dev, &t->ctx.world);
        }
#ifdef SELDP_HAVE_NCCL
        if (t->kind == GPU_WORLD_NCCL) {
            call = "seldp_nccl_comm_init";
            st = seldp_nccl_comm_init(t->nccl, t->ctx.rank, &t->ctx.world);
        }
#endif
    }
    if (st != SELDP_OK) {
        snprintf(t->ctx.why, sizeof t->ctx.why, "%s returned %s: %s", call, seldp_status_name(st),
                 seldp_last_error());
        t->result = 1;
        return NULL;
    }
    t->ctx.size = seldp_comm_size(t->ctx.world);
    t->result = t->fn(&t->ctx);
    if (t->result != 0 && t->ctx.why[0] == '\0')
        snprintf(t->ctx.why, sizeof t->ctx.why, "rank function returned %d", t->result);
    seldp_comm_destroy(t->ctx.world);
    t->ctx.world = NULL;
    return NULL;
}

int gpu_run_ranks(gpu_world_kind kind, int n, int gpus, double timeout_s, tr_rank_fn fn, void *arg,
                  char *why, size_t why_size)
{
    seldp_comm_config cfg = SELDP_COMM_CONFIG_INIT;
    seldp_host_world *host = NULL;
#ifdef SELDP_HAVE_NCCL
    seldp_nccl_world *nccl = NULL;
#endif
    seldp_status st = SELDP_OK;
    int failed = 0;
    if (why && why_size)
        why[0] = '\0';
    cfg.timeout_s = timeout_s;
    if (kind == GPU_WORLD_NCCL) {
#ifdef SELDP_HAVE_NCCL
        st = seldp_nccl_world_create(n, &cfg, &nccl);
#else
        st = SELDP_ERR_UNSUPPORTED;
#endif
    } else {
        st = seldp_host_world_create(n, &cfg, &host);
    }
    if (st != SELDP_OK) {
        if (why)
            snprintf(why, why_size, "world of %d ranks: %s: %s", n, seldp_status_name(st),
                     seldp_last_error());
        return n > 0 ? n : 1;
    }
    gpu_thread *threads = calloc((size_t)n, sizeof *threads);
    if (!threads) {
        if (why)
            snprintf(why, why_size, "out of memory for %d rank threads", n);
        failed = n;
        goto done;
    }
    for (int r = 0; r < n; r++) {
        gpu_thread *t = &threads[r];
        t->kind = kind;
        t->host = host;
#ifdef SELDP_HAVE_NCCL
        t->nccl = nccl;
#endif
        t->ordinal = kind == GPU_WORLD_NCCL ? r : r % (gpus > 0 ? gpus : 1);
        t->fn = fn;
        t->ctx.rank = r;
        t->ctx.size = n;
        t->ctx.arg = arg;
        if (pthread_create(&t->thread, NULL, gpu_rank_main, t) != 0) {
            t->result = 1;
            snprintf(t->ctx.why, sizeof t->ctx.why, "pthread_create failed");
            continue;
        }
        t->started = true;
    }
    for (int r = 0; r < n; r++)
        if (threads[r].started)
            pthread_join(threads[r].thread, NULL);
    for (int r = 0; r < n; r++) {
        if (threads[r].result == 0)
            continue;
        if (failed++ == 0 && why)
            snprintf(why, why_size, "rank %d of %d: %s", r, n, threads[r].ctx.why);
    }
    free(threads);
done:
    seldp_host_world_destroy(host);
#ifdef SELDP_HAVE_NCCL
    seldp_nccl_world_destroy(nccl);
#endif
    return failed;
}

void gpu_run_ranks_or_fail(gpu_world_kind kind, int n, int gpus, double timeout_s, tr_rank_fn fn,
                           void *arg)
{
    char why[1200];
    int failed = gpu_run_ranks(kind, n, gpus, timeout_s, fn, arg, why, sizeof why);
    if (failed)
        fail_msg("%d of %d ranks failed; first: %s", failed, n, why);
}

static seldp_tensor byte_tensor(seldp_device device, void *data, size_t bytes)
{
    int64_t shape[1] = {(int64_t)bytes};
    return seldp_tensor_view(SELDP_U8, device, data, 1, shape);
}

void *gpu_buf_alloc(seldp_device device, size_t bytes)
{
    seldp_tensor t = byte_tensor(device, NULL, bytes);
    if (seldp_tensor_alloc(&t) != SELDP_OK)
        return NULL;
    return t.data;
}

void gpu_buf_free(seldp_device device, void *ptr)
{
    seldp_tensor t = byte_tensor(device, ptr, 0);
    seldp_tensor_free(&t);
}

seldp_status gpu_upload(seldp_device device, void *dst, const void *src, size_t bytes)
{
    seldp_tensor d = byte_tensor(device, dst, bytes);
    seldp_tensor s = byte_tensor(SELDP_HOST_DEVICE, (void *)src, bytes);
    return bytes ? seldp_tensor_copy(&d, &s) : SELDP_OK;
}

seldp_status gpu_download(seldp_device device, void *dst, const void *src, size_t bytes)
{
    seldp_tensor d = byte_tensor(SELDP_HOST_DEVICE, dst, bytes);
    seldp_tensor s = byte_tensor(device, (void *)src, bytes);
    return bytes ? seldp_tensor_copy(&d, &s) : SELDP_OK;
}
