/* Helpers of the GPU tests: skipping without a GPU, rank threads on CUDA devices over the
 * host-staged or the NCCL transport, and device buffers through the public tensor API. */
#define _POSIX_C_SOURCE 200809L /* access */

#include <dirent.h>
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
#include "runner.h"
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

/* What every rank thread of one gpu_run_ranks shares. */
typedef struct gpu_run {
    gpu_world_kind kind;
    int gpus;
    seldp_host_world *host;
#ifdef SELDP_HAVE_NCCL
    seldp_nccl_world *nccl;
#endif
    tr_rank_fn fn;
    void *arg;
} gpu_run;

static int gpu_rank_main(hx_runner_rank *r)
{
    const gpu_run *run = r->arg;
    tr_rank_ctx ctx = {.rank = r->rank, .size = r->size, .arg = run->arg};
    seldp_status st = SELDP_ERR_UNSUPPORTED;
    const char *call = "join";
    if (run->kind == GPU_WORLD_HOST_ON_HOST) {
        call = "seldp_host_comm_init";
        st = seldp_host_comm_init(run->host, r->rank, SELDP_HOST_DEVICE, &ctx.world);
    } else {
        int ordinal = run->kind == GPU_WORLD_NCCL ? r->rank : r->rank % run->gpus;
        cudaError_t err = cudaSetDevice(ordinal);
        if (err != cudaSuccess)
            return hx_runner_fail(r, "cudaSetDevice(%d): %s", ordinal, cudaGetErrorString(err));
        if (run->kind == GPU_WORLD_HOST_STAGED) {
            call = "seldp_host_comm_init";
            seldp_device dev = {SELDP_DEVICE_CUDA, ordinal};
            st = seldp_host_comm_init(run->host, r->rank, dev, &ctx.world);
        }
#ifdef SELDP_HAVE_NCCL
        if (run->kind == GPU_WORLD_NCCL) {
            call = "seldp_nccl_comm_init";
            st = seldp_nccl_comm_init(run->nccl, r->rank, &ctx.world);
        }
#endif
    }
    if (st != SELDP_OK)
        return hx_runner_fail(r, "%s returned %s: %s", call, seldp_status_name(st),
                              seldp_last_error());
    r->comm = ctx.world;
    ctx.size = seldp_comm_size(ctx.world);
    int result = run->fn(&ctx);
    if (result != 0 && ctx.why[0])
        hx_runner_fail(r, "%s", ctx.why); /* aborts the world */
    else if (result != 0)
        hx_runner_fail(r, "rank function returned %d", result);
    r->comm = NULL;
    seldp_comm_destroy(ctx.world);
    return result;
}

int gpu_run_ranks(gpu_world_kind kind, int n, int gpus, double timeout_s, tr_rank_fn fn, void *arg,
                  char *why, size_t why_size)
{
    seldp_comm_config cfg = SELDP_COMM_CONFIG_INIT;
    gpu_run run = {.kind = kind, .gpus = gpus > 0 ? gpus : 1, .fn = fn, .arg = arg};
    seldp_status st = SELDP_OK;
    if (why && why_size)
        why[0] = '\0';
    cfg.timeout_s = timeout_s;
    if (kind == GPU_WORLD_NCCL) {
#ifdef SELDP_HAVE_NCCL
        st = seldp_nccl_world_create(n, &cfg, &run.nccl);
#else
        st = SELDP_ERR_UNSUPPORTED;
#endif
    } else {
        st = seldp_host_world_create(n, &cfg, &run.host);
    }
    if (st != SELDP_OK) {
        if (why)
            snprintf(why, why_size, "world of %d ranks: %s: %s", n, seldp_status_name(st),
                     seldp_last_error());
        return n > 0 ? n : 1;
    }
    hx_runner_report report;
    int failed = hx_runner_run(n, gpu_rank_main, &run, &report);
    /* the earliest failure is the cause; later ones are usually its echo (aborted) */
    if (failed && why)
        snprintf(why, why_size, "rank %d of %d: %s", report.first, n, report.why);
    seldp_host_world_destroy(run.host);
#ifdef SELDP_HAVE_NCCL
    seldp_nccl_world_destroy(run.nccl);
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
