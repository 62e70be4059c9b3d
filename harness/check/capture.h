/* What the ranks passed into each replica set's reduction this step, summed in FP64, for the
 * checks that need it (docs/tolerances.md): the reduction given its inputs (every result
 * within one ulp of their mean or sum), and the ranks' own FP32 gradients against the model's
 * reference before any export rounding.
 *
 * Per set and parameter (by logical path), over the members that take part in the reduction
 * (a mean's weight or a sum's activity not zero): the sum of the inputs as exported, the sum
 * of their absolute values, and the sum of the FP32 loss-sum gradients the inputs were
 * exported from. Ranks add under the set's lock; under mpirun every process holds its own
 * rank's and rank 0 merges the others' (gather.c). */
#ifndef HX_CAPTURE_H
#define HX_CAPTURE_H

#include <pthread.h>
#include <stddef.h>

#include "seldp/tensor.h"
#include "util.h"

struct hx_run;
struct hx_set;

typedef struct hx_capture_entry {
    char path[128]; /* the logical path (a shard's: the path its members hold it under) */
    size_t n;
    int inputs;        /* members that passed a gradient */
    double *in_sum;    /* sum of the inputs, as passed */
    double *in_abs;    /* sum of their absolute values */
    double *local_sum; /* sum of the FP32 gradients they were exported from */
    /* the three sums' rounding errors so far (hx_capture_settle folds them in): members add in
     * the order their threads arrive, and a compensated sum rounds the same in any order */
    double *lo;   /* (3 n): in_sum's, in_abs's, local_sum's */
    double bound; /* the checks' bound of the reduced result (verdict.c) */
} hx_capture_entry;

typedef struct hx_capture {
    pthread_mutex_t lock;
    hx_capture_entry *entries;
    int n, cap;
} hx_capture;

/* run->capture, one per replica set; hx_capture_reset zeroes it for the next step. */
seldp_status hx_capture_create(struct hx_run *run);
void hx_capture_destroy(struct hx_run *run);
void hx_capture_reset(struct hx_run *run);

/* Fold e's compensation into its sums (idempotent). Before the sums are read or sent. */
void hx_capture_settle(hx_capture_entry *e);

/* Add one member's input to set s: `input` its gradient as passed to the reduction (host
 * memory), `local` the FP32 gradient it was exported from (n floats; NULL: zeros owed). */
seldp_status hx_capture_add(struct hx_run *run, const struct hx_set *s, const char *path,
                            const seldp_tensor *input, const float *local);

/* Merge a whole entry (another process's) into set s. */
seldp_status hx_capture_merge(struct hx_run *run, const struct hx_set *s,
                              const hx_capture_entry *e);

/* The entry of `path` (logical) in set s, or NULL when no member passed one. */
hx_capture_entry *hx_capture_find(const struct hx_run *run, const struct hx_set *s,
                                  const char *path);

#endif
