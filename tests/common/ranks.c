/* Test helpers: rank threads over a host world, deterministic buffer patterns. */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */

#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "ranks.h"

typedef struct rank_thread {
    pthread_t thread;
    seldp_host_world *host;
    tr_rank_fn fn;
    tr_rank_ctx ctx;
    int result;
    bool started;
    struct timespec finished; /* when fn returned, to report the earliest failure */
} rank_thread;

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

static bool finished_before(const rank_thread *a, const rank_thread *b)
{
    if (a->finished.tv_sec != b->finished.tv_sec)
        return a->finished.tv_sec < b->finished.tv_sec;
    return a->finished.tv_nsec < b->finished.tv_nsec;
}

static void *rank_main(void *p)
{
    rank_thread *t = p;
    seldp_status st = seldp_host_comm_init(t->host, t->ctx.rank, SELDP_HOST_DEVICE, &t->ctx.world);
    if (st != SELDP_OK) {
        snprintf(t->ctx.why, sizeof t->ctx.why, "seldp_host_comm_init returned %s: %s",
                 seldp_status_name(st), seldp_last_error());
        t->result = 1;
        return NULL;
    }
    t->ctx.size = seldp_comm_size(t->ctx.world);
    t->result = t->fn(&t->ctx);
    clock_gettime(CLOCK_MONOTONIC, &t->finished);
    if (t->result != 0) {
        if (t->ctx.why[0] == '\0')
            snprintf(t->ctx.why, sizeof t->ctx.why, "rank function returned %d", t->result);
        /* Release the other ranks now instead of at their timeout. */
        seldp_comm_abort(t->ctx.world);
    }
    seldp_comm_destroy(t->ctx.world);
    t->ctx.world = NULL;
    return NULL;
}

int tr_run_ranks_status(int n, double timeout_s, tr_rank_fn fn, void *arg, char *why,
                        size_t why_size)
{
    seldp_comm_config cfg = SELDP_COMM_CONFIG_INIT;
    seldp_host_world *host = NULL;
    rank_thread *threads = NULL;
    int failed = 0;
    if (why && why_size)
        why[0] = '\0';
    cfg.timeout_s = timeout_s;
    seldp_status st = seldp_host_world_create(n, &cfg, &host);
    if (st != SELDP_OK) {
        if (why)
            snprintf(why, why_size, "seldp_host_world_create(%d) returned %s: %s", n,
                     seldp_status_name(st), seldp_last_error());
        return n > 0 ? n : 1;
    }
    threads = calloc((size_t)n, sizeof *threads);
    if (!threads) {
        seldp_host_world_destroy(host);
        if (why)
            snprintf(why, why_size, "out of memory for %d rank threads", n);
        return n;
    }
    for (int r = 0; r < n; r++) {
        threads[r].host = host;
        threads[r].fn = fn;
        threads[r].ctx.rank = r;
        threads[r].ctx.size = n;
        threads[r].ctx.arg = arg;
        if (pthread_create(&threads[r].thread, NULL, rank_main, &threads[r]) != 0) {
            /* The ranks already started time out waiting for this one. */
            threads[r].result = 1;
            snprintf(threads[r].ctx.why, sizeof threads[r].ctx.why, "pthread_create failed");
            continue;
        }
        threads[r].started = true;
    }
    for (int r = 0; r < n; r++)
        if (threads[r].started)
            pthread_join(threads[r].thread, NULL);
    seldp_host_world_destroy(host);
    /* The earliest failure is the cause; later ones are usually its echo (aborted). */
    int first = -1;
    for (int r = 0; r < n; r++) {
        if (threads[r].result == 0)
            continue;
        failed++;
        if (first < 0 || finished_before(&threads[r], &threads[first]))
            first = r;
    }
    if (first >= 0 && why)
        snprintf(why, why_size, "rank %d of %d: %s", first, n, threads[first].ctx.why);
    free(threads);
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
