/* seldp-bench: rank threads on one host world (harness/runner.h: the threads, the spin
 * barrier, the first failure), each pinned to a core when they fit, and the timing loop every
 * row uses. */
#define _GNU_SOURCE /* sched_getaffinity, pthread_setaffinity_np */

#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "driver.h"
#include "env.h"
#include "runner.h"

struct bench_team {
    seldp_host_world *world;
    bench_join_fn join; /* NULL: seldp_host_comm_init on the host */
    bench_rank_fn fn;
    void *arg;
};

bool bench_team_barrier(bench_rank *r)
{
    return hx_runner_barrier(r->runner);
}

int bench_team_fail(bench_rank *r, const char *fmt, ...)
{
    char why[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    return hx_runner_fail(r->runner, "%s", why);
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
    /* SELDP_BENCH_PIN=0: leave placement to the scheduler */
    if (!seldp__env_flag(SELDP__ENV_BENCH_PIN) ||
        sched_getaffinity(0, sizeof allowed, &allowed) != 0 || size > CPU_COUNT(&allowed))
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

static int rank_main(hx_runner_rank *runner)
{
    bench_team *t = runner->arg;
    bench_rank r = {t, runner, runner->rank, runner->size, NULL, t->arg};
    pin(r.rank, r.size);
    seldp_status st = t->join ? t->join(&r, t->world, &r.comm)
                              : seldp_host_comm_init(t->world, r.rank, SELDP_HOST_DEVICE, &r.comm);
    int result;
    if (st != SELDP_OK) {
        result = bench_team_fail(&r, "joining the communicator: %s", seldp_last_error());
    } else {
        runner->comm = r.comm; /* a failure aborts the world */
        result = t->fn(&r);
    }
    runner->comm = NULL;
    seldp_comm_destroy(r.comm);
    return result;
}

int bench_team_run(int size, bench_rank_fn fn, void *arg)
{
    return bench_team_run_join(size, NULL, fn, arg);
}

int bench_team_run_join(int size, bench_join_fn join, bench_rank_fn fn, void *arg)
{
    bench_team t = {NULL, join, fn, arg};
    seldp_comm_config cfg = SELDP_COMM_CONFIG_INIT;
    cfg.timeout_s = 120;
    if (seldp_host_world_create(size, &cfg, &t.world) != SELDP_OK) {
        fprintf(stderr, "seldp-bench: cannot start %d ranks: %s\n", size, seldp_last_error());
        return 1;
    }
    hx_runner_report report;
    int failed = hx_runner_run(size, rank_main, &t, &report);
    if (failed)
        fprintf(stderr, "seldp-bench: %d ranks: rank %d: %s\n", size, report.first, report.why);
    seldp_host_world_destroy(t.world);
    return failed ? 1 : 0;
}
