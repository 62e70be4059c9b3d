/* Rank threads with a barrier, the first failure and an abort of the world (runner.h). */
#define _GNU_SOURCE /* sched_yield, sysconf */

#include "runner.h"

#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct hx_runner {
    int size;
    bool yield; /* more ranks than cores: yield instead of spinning */
    atomic_int arrived;
    atomic_uint generation;
    atomic_bool failed;
    pthread_mutex_t lock; /* guards first and why */
    int first;
    char why[1024];
};

typedef struct rank_thread {
    hx_runner_rank rank;
    hx_runner_fn fn;
    pthread_t thread;
    int result;
} rank_thread;

static void vfail(hx_runner_rank *r, const char *fmt, va_list ap)
{
    hx_runner *rn = r->runner;
    pthread_mutex_lock(&rn->lock);
    if (rn->first < 0) {
        rn->first = r->rank;
        vsnprintf(rn->why, sizeof rn->why, fmt, ap);
    }
    pthread_mutex_unlock(&rn->lock);
    atomic_store(&rn->failed, true);
    if (r->comm)
        seldp_comm_abort(r->comm); /* release the other ranks now, not at their timeout */
}

int hx_runner_fail(hx_runner_rank *r, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vfail(r, fmt, ap);
    va_end(ap);
    return 1;
}

bool hx_runner_failed(const hx_runner_rank *r)
{
    return atomic_load(&r->runner->failed);
}

bool hx_runner_barrier(hx_runner_rank *r)
{
    hx_runner *rn = r->runner;
    unsigned gen = atomic_load(&rn->generation);
    if (atomic_fetch_add(&rn->arrived, 1) == rn->size - 1) {
        atomic_store(&rn->arrived, 0);
        atomic_fetch_add(&rn->generation, 1);
        return !atomic_load(&rn->failed);
    }
    /* Spin a little, then yield: a rank waiting for one that is not running (more ranks
     * than cores, or other programs on the machine) must give up its core. */
    for (long spins = 0; atomic_load(&rn->generation) == gen; spins++) {
        if (atomic_load(&rn->failed))
            return false;
        if (rn->yield || spins > 4096)
            sched_yield();
#if defined(__x86_64__) || defined(__i386__)
        else
            __builtin_ia32_pause();
#endif
    }
    return !atomic_load(&rn->failed);
}

static void *rank_main(void *p)
{
    rank_thread *t = p;
    t->result = t->fn(&t->rank);
    if (t->result != 0) /* kept only when no rank failed before */
        hx_runner_fail(&t->rank, "rank function returned %d", t->result);
    return NULL;
}

int hx_runner_run(int size, hx_runner_fn fn, void *arg, hx_runner_report *report)
{
    hx_runner rn;
    memset(&rn, 0, sizeof rn);
    rn.size = size;
    rn.yield = size > sysconf(_SC_NPROCESSORS_ONLN);
    rn.first = -1;
    atomic_init(&rn.arrived, 0);
    atomic_init(&rn.generation, 0u);
    atomic_init(&rn.failed, false);
    pthread_mutex_init(&rn.lock, NULL);
    int failed = 0, started = 0;
    rank_thread *threads = size > 0 ? calloc((size_t)size, sizeof *threads) : NULL;
    if (!threads) {
        failed = size > 0 ? size : 1;
        rn.first = 0;
        snprintf(rn.why, sizeof rn.why, "cannot start %d rank threads", size);
        goto out;
    }
    for (int r = 0; r < size; r++) {
        rank_thread *t = &threads[r];
        t->rank = (hx_runner_rank){&rn, r, size, arg, NULL};
        t->fn = fn;
        t->result = 1; /* until it runs */
    }
    for (; started < size; started++) {
        rank_thread *t = &threads[started];
        if (pthread_create(&t->thread, NULL, rank_main, t) != 0) {
            hx_runner_fail(&t->rank, "pthread_create failed for rank %d", started);
            break;
        }
    }
    for (int r = 0; r < started; r++)
        pthread_join(threads[r].thread, NULL);
    for (int r = 0; r < size; r++)
        failed += threads[r].result != 0;
out:
    if (report) {
        report->failed = failed;
        report->first = failed ? rn.first : -1;
        snprintf(report->why, sizeof report->why, "%s", failed ? rn.why : "");
    }
    pthread_mutex_destroy(&rn.lock);
    free(threads);
    return failed;
}
