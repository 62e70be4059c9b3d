/* The state of one reduction and the stages the blocking reductions (session_reduce.c) and
 * the overlapped ones (session_async.c) share: the agreement record and its decision
 * (session_agree.c), the validation of a gradient and the allocation of the results
 * (session_reduce.c), and the commit into the caller's container (session_commit.c).
 * Internal: nothing here is public. */
#ifndef SELDP_SESSION_REDUCE_H
#define SELDP_SESSION_REDUCE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "comm/comm_impl.h"
#include "session_impl.h"

/* Which call a record comes from (reduce_record.overlapped): a blocking reduction, the
 * start of an overlapped one (its first agreement) or its finish (its final agreement). */
#define REDUCE_BLOCKING 0
#define REDUCE_START    1
#define REDUCE_FINISH   2

/* What a call does with the selection (reduce_record.kind): an all-reduce of the gradients
 * (the seldp_session_* reductions), a reduce-scatter of them into each rank's range of the
 * shard map, or an all-gather of the ranges into the parameters (seldp/shard.h). */
#define REDUCE_KIND_ALLREDUCE 0
#define REDUCE_KIND_SCATTER   1
#define REDUCE_KIND_GATHER    2

/* This rank's side of one reducible parameter in one call. */
typedef struct reduce_slot {
    bool has_grad;
    seldp_tensor grad;   /* copy of the caller's descriptor, when has_grad */
    seldp_tensor result; /* owned result allocated in advance; data NULL when not needed */
    bool present;        /* some active rank has a gradient */
    size_t offset;       /* in the staging buffer, in elements, when present */
    bool in_place;       /* overlapped, cfg.overlap_in_place: buckets wrote results into grad
                            itself, its bytes kept in the staging buffer (session_async.c) */
} reduce_slot;

/* Bytes of a session's first path carried in the record, for messages. */
#define RECORD_PATH_MAX 64
/* reduce_record.nonfinite_slot when every input is finite (or none was checked) */
#define NO_NONFINITE UINT64_MAX

/* The fixed part of a rank's agreement record; uint64 fields and a path of a multiple of
 * 8 bytes, so no padding. The presence bitmap (n_slots bits, padded to 8 bytes) follows. */
typedef struct reduce_record {
    uint64_t status;
    uint64_t world_rank;
    uint64_t normalize;
    uint64_t fp32;
    uint64_t policy;
    uint64_t weight;
    uint64_t overlapped;  /* REDUCE_BLOCKING, REDUCE_START or REDUCE_FINISH */
    uint64_t kind;        /* REDUCE_KIND_* */
    uint64_t range_dtype; /* REDUCE_KIND_GATHER: the dtype of the ranges */
    /* the session's fingerprint */
    uint64_t digest;   /* of the selection's schema */
    uint64_t call;     /* this is the session's call-th reduction, from 1 */
    uint64_t n_params; /* selected parameters */
    uint64_t n_slots;  /* reducible ones: bits in the bitmap */
    /* the first non-finite input gradient (cfg.check_finite, active ranks) */
    uint64_t nonfinite_slot; /* its slot (path order), or NO_NONFINITE */
    uint64_t nonfinite_elem; /* its first non-finite element */
    uint64_t nonfinite_count;
    char first_path[RECORD_PATH_MAX]; /* the session's first selected path, truncated */
} reduce_record;

typedef struct reduce_call {
    seldp_session *s;
    seldp_grads *grads;
    bool normalize, fp32;
    uint64_t overlapped;     /* which call of an overlapped reduction, or REDUCE_BLOCKING */
    uint64_t kind;           /* REDUCE_KIND_*: all-reduce, reduce-scatter or all-gather */
    seldp_dtype range_dtype; /* REDUCE_KIND_GATHER: the dtype of the ranges */
    seldp_missing_policy policy;
    uint64_t weight; /* the rank's weight: local_weight, or 1/0 for active/inactive */
    uint64_t call;   /* the session's reduction count, this call included */
    reduce_slot *slots;
    uint64_t nonfinite_slot, nonfinite_elem, nonfinite_count; /* this rank's first */
    size_t record_bytes;
    unsigned char *records; /* every rank's record, back to back (one allgatherv) */
    size_t *record_lengths; /* bytes of each rank's record */
    size_t *record_offsets; /* where each rank's record starts in records */
    int *world_ranks;
    uint64_t global_weight;
    size_t elems;            /* F32 elements of the present parameters */
    bool fused;              /* the transport reduces the tensors in a single pass */
    bool staged;             /* results land in the staging buffer first (bucketed path) */
    bool staged_as_result;   /* ... in the result dtype (overlapped, fused), not in F32 */
    seldp__reduce_seg *segs; /* fused: one per reducible parameter */
} reduce_call;

/* The public call a record or call comes from: "seldp_session_sum_fp32",
 * "seldp_session_reduce_start", "seldp_session_finish", "seldp_shard_reduce_scatter"... */
const char *seldp__reduce_method(uint64_t kind, uint64_t normalize, uint64_t fp32,
                                 uint64_t overlapped);

/* The public call of c. */
static inline const char *seldp__reduce_call_name(const reduce_call *c)
{
    return seldp__reduce_method(c->kind, c->normalize, c->fp32, c->overlapped);
}

/* The dtype the result of a parameter takes in call c. */
static inline seldp_dtype seldp__reduce_result_dtype(const reduce_call *c, const session_param *g)
{
    return c->fp32 ? SELDP_F32 : g->tensor.dtype;
}

/* Check this rank's gradient t of parameter g (frozen, dtype, shape, device); on success record
 * it in its slot. Local: the error names the path and what was expected. */
seldp_status seldp__reduce_check_gradient(reduce_call *c, const session_param *g,
                                          const seldp_tensor *t);

/* With cfg.check_finite on an active rank: look for a non-finite element in the recorded
 * gradient of `slot`, and keep it as this rank's first when it comes before the one kept
 * so far in path order. */
seldp_status seldp__reduce_check_finite(reduce_call *c, size_t slot);

/* Allocate what the commit needs beyond the caller's tensors, from the slots' has_grad: room
 * in the container for new entries, and the results that cannot be written in place. */
seldp_status seldp__reduce_allocate_results(reduce_call *c);

/* Allocate the agreement's buffers of call c (n ranks) and size its record. */
seldp_status seldp__reduce_call_alloc(reduce_call *c, int n);

/* Free what seldp__reduce_call_alloc and the stages allocated; c can be reused. */
void seldp__reduce_call_free(reduce_call *c);

/* Fill this rank's agreement record (record_bytes, zeroed) from c and its status. */
void seldp__reduce_fill_record(const reduce_call *c, seldp_status local, reduce_record *mine);

/* Collective: the agreement. All-gather every rank's record, then decide from them, the
 * same on every rank: another session or call, disagreement, local failures (whose
 * `message` is shared), non-finite inputs, the global weight and its overflow, presence,
 * and gradients missing under the error policy. `mine` is this rank's filled record.
 * *gathered (may be NULL) tells whether the all-gather succeeded, so that a failure of the
 * exchange itself can be told from the group's decision. */
seldp_status seldp__reduce_agree(reduce_call *c, const void *mine, const char *message,
                                 bool *gathered);

/* Write the results into the caller's container (cannot fail for want of memory: see
 * seldp__reduce_allocate_results). */
seldp_status seldp__reduce_commit(reduce_call *c);

/* Collective, with cfg.staged_commit: every rank tells the others whether its part of the
 * call succeeded (`reduced`: this rank's status so far), so that staged results are
 * committed everywhere or nowhere. Returns the lowest failing rank's status and message on
 * every rank that can still reach the others. */
seldp_status seldp__reduce_confirm(reduce_call *c, seldp_status reduced);

#endif
