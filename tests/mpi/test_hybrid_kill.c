/* A process of a hybrid world (seldp/hybrid.h) killed in the middle of its collectives: every
 * rank thread of every other process returns SELDP_ERR_TIMEOUT or SELDP_ERR_ABORTED within a
 * bound of the timeout. Run under mpirun --enable-recovery (Open MPI), which leaves the
 * survivors running: they print their verdict (the test's pass and fail expressions read
 * it) and leave without MPI_Finalize, whose peer is gone. */
#define _POSIX_C_SOURCE 200809L

#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "hybrid_test.h"

#define THREADS   2
#define TIMEOUT_S 2.0
#define KILL_AT   20

typedef struct outcome {
    seldp_status st;
    double waited; /* from the last success to the error */
    int calls;
    char why[256];
} outcome;

static outcome outcomes[THREADS];
static seldp_hybrid_world *world;
static int victim; /* the last process */

static void *rank_thread(void *arg)
{
    int local = (int)(intptr_t)arg;
    outcome *o = &outcomes[local];
    seldp_comm *comm = NULL;
    o->st = seldp_hybrid_comm_init(world, local, SELDP_HOST_DEVICE, &comm);
    if (o->st != SELDP_OK) {
        snprintf(o->why, sizeof o->why, "join: %s", seldp_last_error());
        return NULL;
    }
    float x[1024] = {0}, y[1024];
    double last = mt_now();
    for (o->calls = 0; o->calls < 100000; o->calls++) {
        if (mt_rank == victim && local == 1 && o->calls == KILL_AT)
            raise(SIGKILL); /* the whole process, in the middle of the others' collectives */
        o->st = seldp_comm_allreduce(comm, x, y, 1024, SELDP_F32, SELDP_HOST_DEVICE);
        if (o->st != SELDP_OK)
            break;
        last = mt_now();
    }
    o->waited = mt_now() - last;
    snprintf(o->why, sizeof o->why, "%s", seldp_last_error());
    seldp_comm_destroy(comm);
    return NULL;
}

static void test_process_killed(void **state)
{
    (void)state;
    pthread_t t[THREADS];
    for (int i = 0; i < THREADS; i++)
        assert_int_equal(pthread_create(&t[i], NULL, rank_thread, (void *)(intptr_t)i), 0);
    for (int i = 0; i < THREADS; i++)
        pthread_join(t[i], NULL);
    for (int i = 0; i < THREADS; i++) {
        const outcome *o = &outcomes[i];
        if (o->st != SELDP_ERR_TIMEOUT && o->st != SELDP_ERR_ABORTED)
            fail_msg(
                "process %d, thread %d: %s after %d calls (%s), expected a timeout or an abort",
                mt_rank, i, seldp_status_name(o->st), o->calls, o->why);
        if (o->waited > 2 * TIMEOUT_S + 3)
            fail_msg("process %d, thread %d: returned %.1f s after the last success, expected "
                     "within %.1f s",
                     mt_rank, i, o->waited, 2 * TIMEOUT_S + 3);
        if (o->calls < KILL_AT)
            fail_msg("process %d, thread %d: failed at call %d, before the kill (%s)", mt_rank, i,
                     o->calls, o->why);
        print_message("process %d, thread %d: %s after %.1f s: %s\n", mt_rank, i,
                      seldp_status_name(o->st), o->waited, o->why);
    }
}

int main(int argc, char **argv)
{
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &mt_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &mt_size);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    if (provided != MPI_THREAD_MULTIPLE || mt_size < 2) {
        fprintf(stderr, "hybrid_kill: needs MPI_THREAD_MULTIPLE and 2 processes; skipped\n");
        MPI_Finalize();
        return 77;
    }
    victim = mt_size - 1;
    seldp_comm_config cfg = SELDP_COMM_CONFIG_INIT;
    cfg.timeout_s = TIMEOUT_S;
    if (seldp_hybrid_world_create(MPI_COMM_WORLD, THREADS, &cfg, &world) != SELDP_OK) {
        fprintf(stderr, "hybrid_kill FAILED: process %d: %s\n", mt_rank, seldp_last_error());
        fflush(NULL);
        _exit(1);
    }
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_process_killed)};
    int failed = cmocka_run_group_tests_name("hybrid_kill", tests, NULL, NULL);
    /* the world stays: destroying it would free MPI communicators whose peer is dead */
    printf(failed ? "hybrid_kill FAILED: process %d\n"
                  : "hybrid_kill: process %d: every rank returned an error in time\n",
           mt_rank);
    fflush(NULL);
    _exit(failed ? 1 : 0);
}
