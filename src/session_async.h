/* The state of a session's overlapped reductions, shared by the caller's side
 * (session_async.c: start, mark, finish, the layout) and the progress thread
 * (session_async_progress.c: the agreement and the buckets). Internal. */
#ifndef SELDP_SESSION_ASYNC_H
#define SELDP_SESSION_ASYNC_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>

#include "seldp/shard.h"
#include "session_reduce.h"

typedef struct id_param {
    seldp_param_id id;
    size_t param;
} id_param;

typedef struct session_async {
    seldp_session *s;
    pthread_t thread;
    bool thread_started;
    pthread_mutex_t lock;
    pthread_cond_t wake; /* to the progress thread: a job, a mark, cancel */
    pthread_cond_t idle; /* to the caller: the job is done */

    /* The layout, fixed for the session. */
    size_t capacity;      /* F32 elements per bucket */
    size_t n_buckets;     /* over s->slot_elems */
    size_t *slot_offset;  /* per slot: its F32 offset in the staging buffer */
    size_t *slot_first;   /* per slot: the first and last bucket it spans (first > last: */
    size_t *slot_last;    /*           an empty tensor, in no bucket) */
    size_t *bucket_slots; /* per bucket: the slots it holds */
    id_param *index;      /* selected ids, sorted, with their parameter */
    size_t n_index;

    /* The call in flight. Under the lock: job, cancel, quit, marked, pending. */
    bool in_flight; /* a start returned SELDP_OK and its finish has not returned; read and
                       written by the caller's thread only */
    bool job;       /* the progress thread has this call's collectives to run */
    bool cancel;    /* seldp_session_destroy: stop at the next wait */
    bool quit;
    bool *marked;    /* per slot */
    size_t *pending; /* per bucket: slots not marked yet */
    reduce_call c;
    unsigned char *mine; /* this rank's record */
    char start_message[SESSION_MESSAGE_MAX];
    /* the caller's first failure (a mark, the results' allocation) and its message */
    seldp_status local;
    char local_message[SESSION_MESSAGE_MAX];
    /* the progress thread's outcome, read by finish once job is false */
    seldp_status thread_status;
    char thread_message[SESSION_MESSAGE_MAX];
    bool start_failed; /* the first agreement failed: the same verdict on every rank */
    /* cfg.overlap_in_place: the staging buffer keeps this rank's gradients from this element
     * on (the buckets reduced so far: the last ones) where buckets wrote results in place
     * (reduce_slot.in_place); s->slot_elems when none. Written by the progress thread, read
     * by the caller once the job is done. */
    size_t kept_from;
    size_t in_place_segments; /* bucket segments written in place by the last reduction */
    /* A reduce-scatter (c.kind REDUCE_KIND_SCATTER, seldp_shard_reduce_scatter_start): the
     * map, this rank's range [begin, end) of it, where finish writes the range and the
     * presence flags, and per rank one bucket's part of its range (the bucketed path). */
    const seldp_shard_map *map;
    size_t begin, end;
    float *range;
    bool *present;
    size_t *counts;
    seldp__shard_seg *shard_segs; /* the fused path: one per slot */
    bool shard_fused; /* the buckets are fused reduce-scatters (the host-staged transport) */
} session_async;

/* Put back this rank's gradients that buckets wrote in place (reduce_slot.in_place), from
 * their copies in the staging buffer: every one (`all`), or those of parameters absent on
 * every active rank. Once the progress thread is idle. */
seldp_status seldp__session_async_restore(session_async *a, bool all);

/* The segments the session's last overlapped reduction wrote in place (for the tests). */
size_t seldp__session_async_in_place_segments(const seldp_session *s);

/* The progress thread's body: waits for a job, runs its collectives, reports, until quit.
 * `arg` is the session_async. */
void *seldp__session_progress_main(void *arg);

#endif
