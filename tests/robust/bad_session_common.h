/* The row type and runner shared by the sessions' bad-input matrices (test_bad_initialize.c,
 * test_bad_reduce.c, test_nonfinite_grads.c; docs/library.md), and the helpers and spoilers
 * more than one of them uses.
 *
 * Every row runs on its own host world. Each rank starts from the contract tests' standard
 * layout (tests/contract), the row spoils the input of one rank (or of every rank), and the
 * main thread then checks, for every rank: the documented status; for a collective error the
 * same message on every rank, naming the offending rank, the path and what was expected;
 * the caller's model and gradient container byte-identical when the call failed (snapshots
 * taken before it); the call back well before the transport's timeout (no hang); and the
 * group still in step afterwards (a barrier). Rows that succeed check their results. */
#ifndef SELDP_BAD_SESSION_COMMON_H
#define SELDP_BAD_SESSION_COMMON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "contract.h"

#define ALL  (-1) /* every rank's input is spoiled */
#define NONE (-2) /* no rank's input is spoiled */

typedef enum call {
    INIT,
    INIT_BUFFERS,
    REDUCE,
    REDUCE_FP32,
    SUM,
    SUM_FP32,
} call;

/* Ids of the parameters registered beside the standard layout on every rank. */
enum {
    ID_QWEIGHT = 60, /* aaa.qweight: U8 [16], an integer buffer (not frozen) */
    ID_TABLE = 62,   /* aaa.table: F64 [4] */
    ID_HEAD_A = 70,  /* head.a: F32 [4] */
    ID_HEAD_B = 71,  /* head.b: F32 [4], tied to head.a on a spoiled rank (ALIAS rows) */
    ID_EMPTY = 80,   /* empty.weight: F32 [0], no storage, selected by zero-length rows */
    ID_UNSELECTED = 999
};

/* A change to one standard parameter as the spoiled rank registers it. */
typedef struct std_change {
    const char *path; /* the STD path changed on the spoiled rank, or NULL */
    seldp_dtype dtype;
    int64_t dim0;
    int frozen; /* -1: as STD */
    bool cuda;
} std_change;

/* Everything one rank passes. Built with the defaults, then spoiled by the row. */
typedef struct plan {
    int rank, size;
    bool bad; /* this rank's input is the row's spoiled one */
    test_model m;
    /* initialize */
    call init_call;
    bool null_comm, null_out, null_model, null_ids;
    int root;
    seldp_param_id ids[STD_N + 4];
    size_t n_ids;
    seldp_session_config cfg;
    const std_change *change; /* applied to the spoiled rank's model, or NULL */
    bool tie_heads;           /* head.b registered as an alias of head.a */
    bool untie_head;          /* lm_head.weight registered with its own id and storage */
    bool empty_param;         /* empty.weight registered (and selected) */
    int empty_ndim;           /* its shape: [0] or [0, 4] */
    bool no_snapshot;         /* gradients not snapshotted (verify must not use `before`) */
    /* the reduction */
    call reduce_call;
    bool null_session, null_grads;
    uint64_t weight; /* the local weight; for sum, nonzero means active */
    int policy;
    test_grads g;
} plan;

typedef struct row row;

/* Spoil (or adjust) one rank's plan; p->bad says whether it is the row's spoiled rank. */
typedef void (*apply_fn)(plan *p);

/* Extra checks of a row that succeeds, on the rank thread: true when the results are right,
 * else false with why set. `s` is the session; `before` the gradients before the call. */
typedef bool (*verify_fn)(plan *p, seldp_session *s, uint64_t global_weight,
                          const grads_snapshot *before, char *why, size_t size);

struct row {
    const char *name;
    int ranks;      /* group size */
    call call;      /* what every rank calls */
    call bad_call;  /* what the spoiled rank calls instead (== call: the same) */
    int bad;        /* the spoiled rank, ALL or NONE */
    apply_fn apply; /* NULL: the defaults */
    seldp_status expected;
    const char *needles[3]; /* in every rank's message (NULL: none) */
    bool same_message;      /* the message is identical on every rank */
    verify_fn verify;       /* rows that succeed: NULL or a check of the results */
};

#define ROW(name, ranks, call, bad, apply, expected, n1, n2, n3)                                   \
    {                                                                                              \
        name, ranks, call, call, bad, apply, expected, {n1, n2, n3}, true, NULL                    \
    }
#define ROW_OK(name, ranks, call, bad, apply, verify)                                              \
    {                                                                                              \
        name, ranks, call, call, bad, apply, SELDP_OK, {NULL, NULL, NULL}, true, verify            \
    }

/* Run every row of `matrix` on its own world and fail the test at the first row whose
 * status, message, data, time or barrier is not as the row says; print the count by status. */
void bs_run_matrix(const row *matrix, size_t n_rows);

/* Element i of the gradient of STD[k], as a double (NaN when there is none). */
double grad_at(plan *p, size_t k, size_t i);

/* Spoilers and checks used by more than one matrix. */
void empty_selection(plan *p);
void select_empty(plan *p);
void nothing(plan *p);
bool all_finite(plan *p, seldp_session *s, uint64_t w, const grads_snapshot *before, char *why,
                size_t size);
bool only_unselected(plan *p, seldp_session *s, uint64_t w, const grads_snapshot *before, char *why,
                     size_t size);

#endif
