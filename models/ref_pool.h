/* The FP64 reference's pool of threads (tm_reference_set_threads): a loop over items (the
 * experts of a layer, the router's token blocks) whose computations run on any worker, in any
 * order, and whose commits (the sums the items share) run one at a time in item order. An item
 * computes into the buffers of a lane (0 to tm__ref_lanes(workers) - 1) that it holds until its
 * commit has read them, so a worker whose item waits for its commit goes on with the next item
 * in another lane. Which worker or lane computes an item never changes what it computes, and
 * the shared sums see the items in the same order whatever the number of workers: the results
 * are the same bits for any thread count. */
#ifndef TM_REF_POOL_H
#define TM_REF_POOL_H

#include <stdbool.h>
#include <stddef.h>

/* compute(ctx, lane, item): false stops the loop (the later items are neither computed nor
 * committed); commit(ctx, lane, item) with the lane its compute used, or NULL: after item - 1's
 * commit. */
typedef bool (*tm__ref_compute_fn)(void *ctx, int lane, int item);
typedef void (*tm__ref_commit_fn)(void *ctx, int lane, int item);

/* Lanes per worker: one computing, the others done and waiting for their turn to commit. */
#define TM_REF_LANES_PER_WORKER 2

/* Items 0 to items - 1 on `workers` threads (the caller's among them; 1: in the caller, in
 * order). Returns false when a compute did. */
bool tm__ref_ordered_for(int items, int workers, tm__ref_compute_fn compute,
                         tm__ref_commit_fn commit, void *ctx);

/* Token loops run in blocks of this many tokens, whatever the number of workers: a block's
 * partial results (its part of a sum over tokens) are committed in block order. */
#define TM_REF_TOKEN_BLOCK 1024

/* compute(ctx, lane, begin, end): items [begin, end) of a block; commit as above, or NULL. */
typedef bool (*tm__ref_block_fn)(void *ctx, int lane, size_t begin, size_t end);
typedef void (*tm__ref_block_commit_fn)(void *ctx, int lane, size_t begin, size_t end);

/* tm__ref_ordered_for over items 0 to n - 1 in blocks of `block` (the last one shorter): block
 * b is [b * block, min(n, (b + 1) * block)). Returns false when a compute did. */
bool tm__ref_blocks_for(size_t n, size_t block, int workers, tm__ref_block_fn compute,
                        tm__ref_block_commit_fn commit, void *ctx);

/* The reference's worker count: tm_reference_set_threads's, or the online cores (1 to 64). */
int tm__ref_workers(void);

/* The lanes a loop on `workers` workers uses: the buffers a caller keeps per lane. */
int tm__ref_lanes(int workers);

#endif
