/* tests/common/ranks.h over a hybrid world (seldp/hybrid.h): the contract programs, linked with
 * this file instead of seldp_testutil and started under mpirun, run each tr_run_ranks(n, ...)
 * as one world of n ranks spread over the processes (process p hosts n / P ranks, one more
 * for the first n % P), every rank a thread with its world communicator in ctx->world. A test
 * fails on every process when a rank of any process failed. Fewer ranks than processes: every
 * process runs the n ranks on threads of its own (the host transport). MPI starts at the first
 * call (MPI_THREAD_MULTIPLE) and ends at exit. */
#define _POSIX_C_SOURCE 200809L

#define tr_run_ranks_status tr_host_run_ranks_status
#define tr_run_ranks        tr_host_run_ranks
#include "../common/ranks.c"
#undef tr_run_ranks_status
#undef tr_run_ranks

#include <mpi.h>
#include <pthread.h>
#include <stdlib.h>

#include "seldp/hybrid.h"

int tr_run_ranks_status(int n, double timeout_s, tr_rank_fn fn, void *arg, char *why,
                        size_t why_size);
void tr_run_ranks(int n, double timeout_s, tr_rank_fn fn, void *arg);

static int procs = 1, proc = 0;

static void end_mpi(void)
{
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized)
        MPI_Finalize();
}

static void start_mpi(void)
{
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (initialized)
        return;
    int provided = 0;
    MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_size(MPI_COMM_WORLD, &procs);
    MPI_Comm_rank(MPI_COMM_WORLD, &proc);
    atexit(end_mpi);
}

typedef struct hy_thread {
    pthread_t tid;
    seldp_hybrid_world *world;
    int local;
    tr_rank_fn fn;
    tr_rank_ctx ctx;
    int result;
} hy_thread;

static void *hy_thread_main(void *p)
{
    hy_thread *t = p;
    seldp_comm *comm = NULL;
    seldp_status st = seldp_hybrid_comm_init(t->world, t->local, SELDP_HOST_DEVICE, &comm);
    if (st != SELDP_OK) {
        snprintf(t->ctx.why, sizeof t->ctx.why, "seldp_hybrid_comm_init returned %s: %s",
                 seldp_status_name(st), seldp_last_error());
        t->result = 1;
        return NULL;
    }
    t->ctx.world = comm;
    t->result = t->fn(&t->ctx);
    if (t->result && !t->ctx.why[0])
        snprintf(t->ctx.why, sizeof t->ctx.why, "rank function returned %d", t->result);
    if (t->result)
        seldp_comm_abort(comm); /* the others return at once */
    seldp_comm_destroy(comm);
    return NULL;
}

int tr_run_ranks_status(int n, double timeout_s, tr_rank_fn fn, void *arg, char *why,
                        size_t why_size)
{
    start_mpi();
    if (procs < 2 || n < procs)
        return tr_host_run_ranks_status(n, timeout_s, fn, arg, why, why_size);
    if (why && why_size)
        why[0] = '\0';
    int local = n / procs + (proc < n % procs);
    seldp_comm_config cfg = SELDP_COMM_CONFIG_INIT;
    cfg.timeout_s = timeout_s;
    seldp_hybrid_world *world = NULL;
    int failed = 0, total = 0;
    seldp_status st = seldp_hybrid_world_create(MPI_COMM_WORLD, local, &cfg, &world);
    if (st != SELDP_OK) {
        failed = local;
        if (why)
            snprintf(why, why_size, "process %d: seldp_hybrid_world_create returned %s: %s", proc,
                     seldp_status_name(st), seldp_last_error());
    } else {
        hy_thread *t = calloc((size_t)local, sizeof *t);
        for (int i = 0; t && i < local; i++) {
            t[i].world = world;
            t[i].local = i;
            t[i].fn = fn;
            t[i].ctx.rank = seldp_hybrid_world_first_rank(world) + i;
            t[i].ctx.size = n;
            t[i].ctx.arg = arg;
            if (pthread_create(&t[i].tid, NULL, hy_thread_main, &t[i]) != 0)
                abort();
        }
        for (int i = 0; t && i < local; i++)
            pthread_join(t[i].tid, NULL);
        for (int i = 0; t && i < local; i++)
            if (t[i].result) {
                if (!failed && why)
                    snprintf(why, why_size, "rank %d of %d (process %d): %s", t[i].ctx.rank, n,
                             proc, t[i].ctx.why);
                failed++;
            }
        free(t);
        seldp_hybrid_world_destroy(world);
    }
    MPI_Allreduce(&failed, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (total && !failed && why)
        snprintf(why, why_size, "%d rank(s) of another process failed", total);
    return total;
}

void tr_run_ranks(int n, double timeout_s, tr_rank_fn fn, void *arg)
{
    char why[1200];
    int failed = tr_run_ranks_status(n, timeout_s, fn, arg, why, sizeof why);
    if (failed)
        fail_msg("%d of %d ranks failed over %d processes; first: %s", failed, n, procs, why);
}

/* The tests of a program that read, on the main thread, what every rank of the world recorded
 * in memory the test shares (its `arg`), or that expect what only the host transport does (its
 * fused reduction): a process holds only its own ranks' records, so they are left out here,
 * named in SELDP_HYBRID_SKIP (comma-separated). The program's cmocka_run_group_tests reaches
 * this wrapper (linked with --wrap=_cmocka_run_group_tests). */
int __real__cmocka_run_group_tests(const char *group_name, const struct CMUnitTest *const tests,
                                   const size_t num_tests, CMFixtureFunction group_setup,
                                   CMFixtureFunction group_teardown);
int __wrap__cmocka_run_group_tests(const char *group_name, const struct CMUnitTest *const tests,
                                   const size_t num_tests, CMFixtureFunction group_setup,
                                   CMFixtureFunction group_teardown);

static bool skipped(const char *name)
{
    const char *list = getenv("SELDP_HYBRID_SKIP");
    size_t len = strlen(name);
    for (const char *p = list; p && *p;) {
        size_t n = strcspn(p, ",");
        if (n == len && strncmp(p, name, n) == 0)
            return true;
        p += n + (p[n] == ',');
    }
    return false;
}

int __wrap__cmocka_run_group_tests(const char *group_name, const struct CMUnitTest *const tests,
                                   const size_t num_tests, CMFixtureFunction group_setup,
                                   CMFixtureFunction group_teardown)
{
    struct CMUnitTest *kept = calloc(num_tests + 1, sizeof *kept);
    size_t n = 0;
    if (!kept)
        return 1;
    for (size_t i = 0; i < num_tests; i++)
        if (!skipped(tests[i].name))
            kept[n++] = tests[i];
    int failed = __real__cmocka_run_group_tests(group_name, kept, n, group_setup, group_teardown);
    free(kept);
    return failed;
}
