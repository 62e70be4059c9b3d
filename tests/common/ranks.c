/* Test helpers: rank threads over a host world, deterministic buffer patterns. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "ranks.h"
#include "runner.h"

/* What every rank thread of one tr_run_ranks_status shares. */
typedef struct rank_run {
    seldp_host_world *host;
    tr_rank_fn fn;
    void *arg;
} rank_run;

void tr_rank_fail(tr_rank_ctx *ctx, const char *file, int line, const char *fmt, ...)
{
    const char *base = strrchr(file, '/');
    int n = snprintf(ctx->why, sizeof ctx->why, "%s:%d: ", base ? base + 1 : file, line);
    if (n < 0 || (size_t)n >= sizeof ctx->why)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ctx->why + n, sizeof ctx->why - (size_t)n, fmt, ap);
    va_end(ap);
}

static int rank_main(hx_runner_rank *r)
{
    const rank_run *run = r->arg;
    tr_rank_ctx ctx = {.rank = r->rank, .size = r->size, .arg = run->arg};
    seldp_status st = seldp_host_comm_init(run->host, r->rank, SELDP_HOST_DEVICE, &ctx.world);
    if (st != SELDP_OK)
        return hx_runner_fail(r, "seldp_host_comm_init returned %s: %s", seldp_status_name(st),
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

int tr_run_ranks_status(int n, double timeout_s, tr_rank_fn fn, void *arg, char *why,
                        size_t why_size)
{
    seldp_comm_config cfg = SELDP_COMM_CONFIG_INIT;
    rank_run run = {NULL, fn, arg};
    hx_runner_report report;
    if (why && why_size)
        why[0] = '\0';
    cfg.timeout_s = timeout_s;
    seldp_status st = seldp_host_world_create(n, &cfg, &run.host);
    if (st != SELDP_OK) {
        if (why)
            snprintf(why, why_size, "seldp_host_world_create(%d) returned %s: %s", n,
                     seldp_status_name(st), seldp_last_error());
        return n > 0 ? n : 1;
    }
    int failed = hx_runner_run(n, rank_main, &run, &report);
    seldp_host_world_destroy(run.host);
    /* the earliest failure is the cause; later ones are usually its echo (aborted) */
    if (failed && why)
        snprintf(why, why_size, "rank %d of %d: %s", report.first, n, report.why);
    return failed;
}

void tr_run_ranks(int n, double timeout_s, tr_rank_fn fn, void *arg)
{
    char why[1200];
    int failed = tr_run_ranks_status(n, timeout_s, fn, arg, why, sizeof why);
    if (failed)
        fail_msg("%d of %d ranks failed; first: %s", failed, n, why);
}

uint64_t tr_hash(uint64_t seed, uint64_t i)
{
    /* splitmix64 of a mix of both inputs */
    uint64_t z = seed * 0x9e3779b97f4a7c15ull + i + 0x632be59bd9b4e019ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void tr_fill_bytes(void *buf, size_t bytes, uint64_t seed)
{
    unsigned char *p = buf;
    for (size_t i = 0; i < bytes; i++)
        p[i] = (unsigned char)(tr_hash(seed, i / 8) >> (8 * (i % 8)));
}

void tr_fill_f32(float *x, size_t n, uint64_t seed)
{
    for (size_t i = 0; i < n; i++)
        x[i] = (float)((double)(tr_hash(seed, i) >> 40) / (double)(1ull << 23) - 1.0);
}

void tr_fill_f32_exact(float *x, size_t n, uint64_t seed)
{
    for (size_t i = 0; i < n; i++)
        x[i] = (float)((int)(tr_hash(seed, i) % 128) - 64) / 8.0f;
}

size_t tr_first_diff(const void *a, const void *b, size_t bytes)
{
    const unsigned char *x = a, *y = b;
    for (size_t i = 0; i < bytes; i++)
        if (x[i] != y[i])
            return i;
    return bytes;
}
