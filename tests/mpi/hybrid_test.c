/* Helpers of the hybrid transport's tests (see hybrid_test.h). */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "hybrid_test.h"

typedef struct ht_thread {
    pthread_t tid;
    seldp_hybrid_world *world;
    int local;
    tr_rank_fn fn;
    tr_rank_ctx ctx;
    int result;
} ht_thread;

static void *ht_body(void *p)
{
    ht_thread *t = p;
    seldp_comm *comm = NULL;
    seldp_status st = seldp_hybrid_comm_init(t->world, t->local, SELDP_HOST_DEVICE, &comm);
    if (st != SELDP_OK) {
        snprintf(t->ctx.why, sizeof t->ctx.why, "hybrid_comm_init returned %s: %s",
                 seldp_status_name(st), seldp_last_error());
        t->result = 1;
        return NULL;
    }
    t->ctx.world = comm;
    t->result = t->fn(&t->ctx);
    if (t->result)
        seldp_comm_abort(comm); /* the others return at once */
    seldp_comm_destroy(comm);
    return NULL;
}

int ht_run_status(int threads, double timeout_s, tr_rank_fn fn, void *arg)
{
    seldp_comm_config cfg = SELDP_COMM_CONFIG_INIT;
    cfg.timeout_s = timeout_s;
    seldp_hybrid_world *world = NULL;
    seldp_status st = seldp_hybrid_world_create(MPI_COMM_WORLD, threads, &cfg, &world);
    int failed = 0, total = 0;
    if (st != SELDP_OK) {
        print_error("process %d: hybrid_world_create returned %s: %s\n", mt_rank,
                    seldp_status_name(st), seldp_last_error());
        failed = threads;
    } else {
        ht_thread *t = calloc((size_t)threads, sizeof *t);
        assert_non_null(t);
        for (int i = 0; i < threads; i++) {
            t[i].world = world;
            t[i].local = i;
            t[i].fn = fn;
            t[i].ctx.rank = seldp_hybrid_world_first_rank(world) + i;
            t[i].ctx.size = seldp_hybrid_world_size(world);
            t[i].ctx.arg = arg;
            assert_int_equal(pthread_create(&t[i].tid, NULL, ht_body, &t[i]), 0);
        }
        for (int i = 0; i < threads; i++)
            pthread_join(t[i].tid, NULL);
        for (int i = 0; i < threads; i++)
            if (t[i].result) {
                if (!failed)
                    print_error("rank %d (process %d): %s\n", t[i].ctx.rank, mt_rank, t[i].ctx.why);
                failed++;
            }
        free(t);
        seldp_hybrid_world_destroy(world);
    }
    MPI_Allreduce(&failed, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    return total;
}

void ht_run(int threads, double timeout_s, tr_rank_fn fn, void *arg)
{
    int total = ht_run_status(threads, timeout_s, fn, arg);
    if (total)
        fail_msg("%d rank(s) of %d processes x %d threads failed", total, mt_size, threads);
}

int ht_main(int argc, char **argv, const char *name, const struct CMUnitTest *tests, size_t count)
{
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    if (provided != MPI_THREAD_MULTIPLE) {
        fprintf(stderr, "%s: MPI gives thread level %d, not MPI_THREAD_MULTIPLE; skipped\n", name,
                provided);
        MPI_Finalize();
        return 77;
    }
    return mt_main(argc, argv, name, tests, count);
}
