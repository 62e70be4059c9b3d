/* seldp-bench: rank threads on one host world, a spin barrier between them, and the timing
 * loop every row uses. */
#define _GNU_SOURCE /* sched_yield, sysconf */

#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "driver.h"

struct bench_team {
    int size;
    bool yield; /* more ranks than cores: yield instead of spinning */
    atomic_int arrived;
    atomic_uint generation;
    atomic_bool failed;
    seldp_host_world *world;
    pthread_mutex_t lock; /* guards why */
    char why[1024];
};

typedef struct rank_start {
    bench_rank rank;
    bench_join_fn join;
    bench_rank_fn fn;
    int result;
} rank_start;

bool bench_team_barrier(bench_rank *r)
{
    bench_team *t = r->team;
    unsigned gen = atomic_load(&t->generation);
    if (atomic_fetch_add(&t->arrived, 1) == t->size - 1) {
        atomic_store(&t->arrived, 0);
        atomic_fetch_add(&t->generation, 1);
        return !atomic_load(&t->failed);
    }
    /* Spin a little, then yield: a rank waiting for one that is not running (more ranks
     * than cores, or other programs on the machine) must give up its core. */
    for (long spins = 0; atomic_load(&t->generation) == gen; spins++) {
        if (atomic_load(&t->failed))
            return false;
        if (t->yield || spins > 4096)
            sched_yield();
#if defined(__x86_64__) || defined(__i386__)
        else
            __builtin_ia32_pause();
#endif
    }
    return !atomic_load(&t->failed);
}

int bench_team_fail(bench_rank *r, const char *fmt, ...)
{
    bench_team *t = r->team;
    va_list ap;
    pthread_mutex_lock(&t->lock);
    if (!t->why[0]) {
        int used = snprintf(t->why, sizeof t->why, "rank %d: ", r->rank);
        va_start(ap, fmt);
        vsnprintf(t->why + used, sizeof t->why - (size_t)used, fmt, ap);
        va_end(ap);
    }
    pthread_mutex_unlock(&t->lock);
    atomic_store(&t->failed, true);
    if (r->comm)
        seldp_comm_abort(r->comm);
    return 1;
}

int bench_team_time(bench_rank *r, bench_op_fn op, void *ctx, int warmup, int iters, int k,
                    double *samples)
{
    for (int i = 0; i < warmup; i++)
        if (op(r, ctx))
            return 1;
    for (int s = 0; s < iters; s++) {
        if (!bench_team_barrier(r))
            return 1;
        double t0 = bench_now();
        for (int i = 0; i < k; i++)
            if (op(r, ctx))
                return 1;
        if (!bench_team_barrier(r))
            return 1;
        if (r->rank == 0)
            samples[s] = (bench_now() - t0) / k;
    }
    return 0;
}

/* Pin rank r to the r-th CPU this process may use when every rank gets one, as mpirun
 * binds its processes to cores when they do not outnumber them. */
static void pin(int rank, int size)
{
    cpu_set_t allowed, one;
    if (sched_getaffinity(0, sizeof allowed, &allowed) != 0 || size > CPU_COUNT(&allowed))
        return;
    for (int cpu = 0, seen = 0; cpu < CPU_SETSIZE; cpu++) {
        if (!CPU_ISSET(cpu, &allowed))
            continue;
        if (seen++ == rank) {
            CPU_ZERO(&one);
            CPU_SET(cpu, &one);
            pthread_setaffinity_np(pthread_self(), sizeof one, &one);
            return;
        }
    }
}

static void *rank_main(void *arg)
{
    rank_start *s = arg;
    bench_rank *r = &s->rank;
    pin(r->rank, r->size);
    seldp_status st =
        s->join ? s->join(r, r->team->world, &r->comm)
                : seldp_host_comm_init(r->team->world, r->rank, SELDP_HOST_DEVICE, &r->comm);
    if (st != SELDP_OK)
        s->result = bench_team_fail(r, "joining the communicator: %s", seldp_last_error());
    else
        s->result = s->fn(r);
    seldp_comm_destroy(r->comm);
    return NULL;
}

int bench_team_run(int size, bench_rank_fn fn, void *arg)
{
    return bench_team_run_join(size, NULL, fn, arg);
}

int bench_team_run_join(int size, bench_join_fn join, bench_rank_fn fn, void *arg)
{
    bench_team t;
    memset(&t, 0, sizeof t);
    t.size = size;
    t.yield = size > sysconf(_SC_NPROCESSORS_ONLN);
    atomic_init(&t.arrived, 0);
    atomic_init(&t.generation, 0u);
    atomic_init(&t.failed, false);
    pthread_mutex_init(&t.lock, NULL);
    rank_start *starts = calloc((size_t)size, sizeof *starts);
    pthread_t *threads = calloc((size_t)size, sizeof *threads);
    seldp_comm_config cfg = SELDP_COMM_CONFIG_INIT;
    cfg.timeout_s = 120;
    int failed = 0, started = 0;

    if (!starts || !threads || seldp_host_world_create(size, &cfg, &t.world) != SELDP_OK) {
        fprintf(stderr, "seldp-bench: cannot start %d ranks: %s\n", size, seldp_last_error());
        failed = 1;
        goto out;
    }
    for (int r = 0; r < size; r++) {
        starts[r].rank = (bench_rank){&t, r, size, NULL, arg};
        starts[r].join = join;
        starts[r].fn = fn;
        if (pthread_create(&threads[r], NULL, rank_main, &starts[r]) != 0) {
            /* the others would wait for it: make them give up */
            snprintf(t.why, sizeof t.why, "pthread_create failed for rank %d", r);
            atomic_store(&t.failed, true);
            failed = 1;
            break;
        }
        started++;
    }
    for (int r = 0; r < started; r++) {
        pthread_join(threads[r], NULL);
        failed |= starts[r].result != 0;
    }
    if (failed)
        fprintf(stderr, "seldp-bench: %d ranks: %s\n", size, t.why[0] ? t.why : "a rank failed");
out:
    seldp_host_world_destroy(t.world);
    pthread_mutex_destroy(&t.lock);
    free(starts);
    free(threads);
    return failed;
}
