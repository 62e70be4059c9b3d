/* The FP64 reference's pool of threads (ref_pool.h). */
#define _POSIX_C_SOURCE 200809L

#include "ref_pool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

#include "tinymoe.h"

#define MAX_WORKERS 64

static atomic_int requested; /* 0: the online cores */

void tm_reference_set_threads(int threads)
{
    atomic_store(&requested, threads > 0 ? threads : 0);
}

int tm_reference_threads(void)
{
    return tm__ref_workers();
}

int tm__ref_workers(void)
{
    int n = atomic_load(&requested);
    if (n <= 0) {
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        n = cores > 0 ? (int)cores : 1;
    }
    return n < 1 ? 1 : n > MAX_WORKERS ? MAX_WORKERS : n;
}

typedef struct loop {
    int items;
    tm__ref_compute_fn compute;
    tm__ref_commit_fn commit;
    void *ctx;
    atomic_int next;  /* the next item to hand out */
    atomic_bool stop; /* a compute failed */
    pthread_mutex_t lock;
    pthread_cond_t turn_moved;
    int turn; /* the item whose commit is due */
} loop;

typedef struct worker {
    loop *lp;
    int id;
} worker;

static void run_items(loop *lp, int id)
{
    for (;;) {
        int item = atomic_fetch_add(&lp->next, 1);
        if (item >= lp->items)
            return;
        bool ok = !atomic_load(&lp->stop) && lp->compute(lp->ctx, id, item);
        if (!ok)
            atomic_store(&lp->stop, true);
        pthread_mutex_lock(&lp->lock);
        while (lp->turn != item)
            pthread_cond_wait(&lp->turn_moved, &lp->lock);
        if (ok && !atomic_load(&lp->stop) && lp->commit)
            lp->commit(lp->ctx, id, item);
        lp->turn++;
        pthread_cond_broadcast(&lp->turn_moved);
        pthread_mutex_unlock(&lp->lock);
    }
}

static void *worker_main(void *arg)
{
    worker *w = arg;
    run_items(w->lp, w->id);
    return NULL;
}

bool tm__ref_ordered_for(int items, int workers, tm__ref_compute_fn compute,
                         tm__ref_commit_fn commit, void *ctx)
{
    if (workers > items)
        workers = items;
    if (workers <= 1) {
        for (int i = 0; i < items; i++) {
            if (!compute(ctx, 0, i))
                return false;
            if (commit)
                commit(ctx, 0, i);
        }
        return true;
    }
    loop lp = {.items = items, .compute = compute, .commit = commit, .ctx = ctx, .turn = 0};
    atomic_init(&lp.next, 0);
    atomic_init(&lp.stop, false);
    pthread_mutex_init(&lp.lock, NULL);
    pthread_cond_init(&lp.turn_moved, NULL);
    pthread_t th[MAX_WORKERS];
    worker ws[MAX_WORKERS];
    int started = 0;
    /* worker 0 is the caller; a thread that cannot start leaves its share to the others */
    for (int i = 1; i < workers; i++) {
        ws[i] = (worker){&lp, i};
        if (pthread_create(&th[i], NULL, worker_main, &ws[i]) != 0)
            break;
        started = i;
    }
    run_items(&lp, 0);
    for (int i = 1; i <= started; i++)
        pthread_join(th[i], NULL);
    pthread_cond_destroy(&lp.turn_moved);
    pthread_mutex_destroy(&lp.lock);
    return !atomic_load(&lp.stop);
}

typedef struct blocks {
    size_t n, block;
    tm__ref_block_fn compute;
    tm__ref_block_commit_fn commit;
    void *ctx;
} blocks;

static size_t block_end(const blocks *b, int item)
{
    const size_t end = ((size_t)item + 1) * b->block;
    return end < b->n ? end : b->n;
}

static bool block_compute(void *ctx, int id, int item)
{
    const blocks *b = ctx;
    return b->compute(b->ctx, id, (size_t)item * b->block, block_end(b, item));
}

static void block_commit(void *ctx, int id, int item)
{
    const blocks *b = ctx;
    b->commit(b->ctx, id, (size_t)item * b->block, block_end(b, item));
}

bool tm__ref_blocks_for(size_t n, size_t block, int workers, tm__ref_block_fn compute,
                        tm__ref_block_commit_fn commit, void *ctx)
{
    if (block == 0)
        block = 1;
    blocks b = {n, block, compute, commit, ctx};
    const size_t items = (n + block - 1) / block;
    return tm__ref_ordered_for((int)items, workers, block_compute, commit ? block_commit : NULL,
                               &b);
}
