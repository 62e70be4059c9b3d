/* The FP64 reference's pool of threads (ref_pool.h). */
#define _POSIX_C_SOURCE 200809L

#include "ref_pool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
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

int tm__ref_lanes(int workers)
{
    return workers <= 1 ? 1 : TM_REF_LANES_PER_WORKER * workers;
}

/* The loop's state, under `lock`: items [turn, next) each hold a lane, computing or done and
 * waiting for their commit (done[item % lanes] their lane, or -1), so at most `lanes` items are
 * out at once and an item's place in `done` is free when it is handed out. */
typedef struct loop {
    int items, lanes;
    tm__ref_compute_fn compute;
    tm__ref_commit_fn commit;
    void *ctx;
    pthread_mutex_t lock;
    pthread_cond_t moved; /* an item was handed out, computed or committed */
    int next;             /* the next item to hand out */
    int turn;             /* the item whose commit is due */
    bool committing;      /* a worker runs turn's commit */
    bool stop;            /* a compute failed */
    int *done;            /* (lanes) */
    int *free_lanes;      /* (lanes) a stack */
    int n_free;
} loop;

/* Each worker commits the due item if it is done and nobody else is committing it, else
 * computes the next item if a lane is free, else waits; it leaves when every item is
 * committed. A compute never waits for a commit, so no worker idles while an item remains to
 * be computed and a lane is free. */
static void run_items(loop *lp)
{
    pthread_mutex_lock(&lp->lock);
    while (lp->turn < lp->items) {
        const int due = lp->done[lp->turn % lp->lanes];
        if (!lp->committing && due >= 0) {
            const int item = lp->turn;
            lp->done[item % lp->lanes] = -1;
            lp->committing = true;
            const bool run = !lp->stop && lp->commit;
            pthread_mutex_unlock(&lp->lock);
            if (run)
                lp->commit(lp->ctx, due, item);
            pthread_mutex_lock(&lp->lock);
            lp->committing = false;
            lp->turn++;
            lp->free_lanes[lp->n_free++] = due;
            pthread_cond_broadcast(&lp->moved);
        } else if (lp->next < lp->items && lp->n_free > 0) {
            const int item = lp->next++;
            const int lane = lp->free_lanes[--lp->n_free];
            const bool run = !lp->stop;
            pthread_mutex_unlock(&lp->lock);
            const bool ok = run && lp->compute(lp->ctx, lane, item);
            pthread_mutex_lock(&lp->lock);
            if (!ok)
                lp->stop = true;
            lp->done[item % lp->lanes] = lane;
            pthread_cond_broadcast(&lp->moved);
        } else {
            pthread_cond_wait(&lp->moved, &lp->lock);
        }
    }
    pthread_mutex_unlock(&lp->lock);
}

/* Without commits an item holds its lane only while it computes: the items go out in order
 * to whichever worker is free, each worker computing in its own lane. */
static void run_unordered(loop *lp, int lane)
{
    pthread_mutex_lock(&lp->lock);
    while (lp->next < lp->items && !lp->stop) {
        const int item = lp->next++;
        pthread_mutex_unlock(&lp->lock);
        const bool ok = lp->compute(lp->ctx, lane, item);
        pthread_mutex_lock(&lp->lock);
        if (!ok)
            lp->stop = true;
    }
    pthread_mutex_unlock(&lp->lock);
}

typedef struct worker {
    loop *lp;
    int id; /* 0: the caller */
} worker;

static void *worker_main(void *arg)
{
    const worker *w = arg;
    if (w->lp->commit)
        run_items(w->lp);
    else
        run_unordered(w->lp, w->id);
    return NULL;
}

bool tm__ref_ordered_for(int items, int workers, tm__ref_compute_fn compute,
                         tm__ref_commit_fn commit, void *ctx)
{
    if (workers > items)
        workers = items;
    int lane_buf[2 * MAX_WORKERS * TM_REF_LANES_PER_WORKER];
    const int lanes = tm__ref_lanes(workers);
    if (workers <= 1 || lanes > MAX_WORKERS * TM_REF_LANES_PER_WORKER) {
        for (int i = 0; i < items; i++) {
            if (!compute(ctx, 0, i))
                return false;
            if (commit)
                commit(ctx, 0, i);
        }
        return true;
    }
    loop lp = {.items = items,
               .lanes = lanes,
               .compute = compute,
               .commit = commit,
               .ctx = ctx,
               .done = lane_buf,
               .free_lanes = lane_buf + lanes,
               .n_free = lanes};
    /* the lanes handed out first are the low ones, so a loop of few items uses those */
    for (int i = 0; i < lanes; i++) {
        lp.done[i] = -1;
        lp.free_lanes[i] = lanes - 1 - i;
    }
    pthread_mutex_init(&lp.lock, NULL);
    pthread_cond_init(&lp.moved, NULL);
    pthread_t th[MAX_WORKERS];
    worker ws[MAX_WORKERS];
    int started = 0;
    /* the caller is a worker too; a thread that cannot start leaves its share to the others */
    for (int i = 1; i < workers; i++) {
        ws[i] = (worker){&lp, i};
        if (pthread_create(&th[i], NULL, worker_main, &ws[i]) != 0)
            break;
        started = i;
    }
    ws[0] = (worker){&lp, 0};
    worker_main(&ws[0]);
    for (int i = 1; i <= started; i++)
        pthread_join(th[i], NULL);
    pthread_cond_destroy(&lp.moved);
    pthread_mutex_destroy(&lp.lock);
    return !lp.stop;
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

typedef struct each {
    void (*fn)(void *ctx, int item);
    void *ctx;
} each;

static bool each_item(void *ctx, int lane, int item)
{
    (void)lane;
    const each *e = ctx;
    e->fn(e->ctx, item);
    return true;
}

void tm_parallel_for(int items, void (*fn)(void *ctx, int item), void *ctx)
{
    each e = {fn, ctx};
    tm__ref_ordered_for(items, tm__ref_workers(), each_item, NULL, &e);
}
