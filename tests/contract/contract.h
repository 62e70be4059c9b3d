/* Helpers shared by the contract tests: rank-local test models and gradient containers
 * with deterministic, rank-dependent contents, cross-rank comparisons, and the record of
 * a collective failure that the main thread checks after the ranks have joined. */
#ifndef SELDP_CONTRACT_H
#define SELDP_CONTRACT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ranks.h"
#include "seldp/seldp.h"

#define CT_MAX         64
#define MAX_RANKS      8
#define TEST_TIMEOUT_S 30.0

/* A shape literal: SHAPE(4, 8). */
#define SHAPE(...) ((const int64_t[]){__VA_ARGS__})

typedef struct ct_param {
    char path[96];
    seldp_param_id id;
    seldp_tensor tensor;
    bool frozen;
    bool owns;               /* storage allocated here (false for a tied alias) */
    unsigned char *snapshot; /* bytes at ct_snapshot time */
} ct_param;

/* A rank-local model whose parameters' storage the test owns. */
typedef struct test_model {
    seldp_model *model;
    size_t n;
    ct_param p[CT_MAX];
} test_model;

/* Fill n elements of `dtype` at data with the deterministic pattern of `seed`: floats in
 * [-1, 1) (halves rounded from F32), other types raw bytes (bool 0/1). */
void ct_fill(seldp_dtype dtype, void *data, size_t n, uint64_t seed);

/* Element i of a float tensor as a double (F32, F64, F16, BF16). */
double ct_get(seldp_dtype dtype, const void *data, size_t i);

/* Store a value (rounded to nearest even for halves) as element i. */
void ct_set(seldp_dtype dtype, void *data, size_t i, double value);

seldp_status ct_init(test_model *m, int rank);

/* Register `path` with new host storage filled from `seed`. */
seldp_status ct_add(test_model *m, const char *path, seldp_param_id id, seldp_dtype dtype,
                    bool frozen, uint64_t seed, int ndim, const int64_t *shape);

/* ct_add, but the descriptor names `device` (the bytes stay in host memory: for testing
 * the rejection of parameters on a device other than the session's). */
seldp_status ct_add_on(test_model *m, seldp_device device, const char *path, seldp_param_id id,
                       seldp_dtype dtype, bool frozen, uint64_t seed, int ndim,
                       const int64_t *shape);

/* Register `path` as a tied alias of the earlier `existing` (same id and storage). */
seldp_status ct_tie(test_model *m, const char *path, const char *existing);

ct_param *ct_find(test_model *m, const char *path);

/* Remember every parameter's bytes; ct_unchanged compares with them. */
void ct_snapshot(test_model *m);

/* True when no parameter changed since ct_snapshot; else why names the first. */
bool ct_unchanged(const test_model *m, char *why, size_t size);

void ct_free(test_model *m);

/* A gradient container and the storage of its borrowed entries. */
typedef struct test_grads {
    seldp_grads *grads;
    size_t n;
    void *storage[CT_MAX];
} test_grads;

seldp_status tg_init(test_grads *g);

/* Put a gradient of `id` filled from `seed`, borrowed (storage kept here) or owned. *data
 * (may be NULL) receives its storage. */
seldp_status tg_put(test_grads *g, seldp_param_id id, seldp_dtype dtype, bool owned, uint64_t seed,
                    int ndim, const int64_t *shape, void **data);

void tg_free(test_grads *g);

/* Collective over comm: true on every rank when the `bytes` bytes at data are identical on
 * every rank of the group. */
bool same_everywhere(seldp_comm *comm, const void *data, size_t bytes);

/* The status and message every rank got from one collective call, and whether its inputs
 * stayed unchanged; checked on the main thread by expect_same_failure. */
typedef struct outcome {
    seldp_status st[MAX_RANKS];
    char msg[MAX_RANKS][1024];
    bool unchanged[MAX_RANKS];
    char why[MAX_RANKS][256];
} outcome;

/* Record rank r's status and last error into o. */
void outcome_record(outcome *o, int rank, seldp_status st);

/* cmocka assertions (main thread): every one of n ranks returned `expected` with the same
 * message, containing each non-NULL needle, and reported its inputs unchanged. */
void expect_same_failure(const outcome *o, int n, seldp_status expected, const char *needle1,
                         const char *needle2);

/* Collectives that moved gradient data: allreduces and fused reductions. */
uint64_t stats_moves(seldp_comm_stats s);

/* What a gradient container holds: ids, descriptors, ownership and bytes. */
typedef struct grads_snapshot {
    size_t n;
    seldp_param_id id[CT_MAX];
    seldp_tensor t[CT_MAX];
    seldp_ownership own[CT_MAX];
    unsigned char *bytes[CT_MAX];
} grads_snapshot;

void gs_take(grads_snapshot *s, const seldp_grads *grads);

/* True when grads holds exactly the snapshot's entries: same ids, same descriptors (data
 * pointers included), same ownership and the same bytes. Else why names the first
 * difference. */
bool gs_same(const grads_snapshot *s, const seldp_grads *grads, char *why, size_t size);

/* True when the entry of id is unchanged since the snapshot (present in both). */
bool gs_entry_same(const grads_snapshot *s, const seldp_grads *grads, seldp_param_id id);

void gs_free(grads_snapshot *s);

/* True when every element of a float tensor is within tol_rel * max(|ref|, 1) of ref,
 * or, for a half dtype, within half a unit in the last place of ref (plus tol_rel).
 * Else why names the worst element. */
bool close_to(seldp_dtype dtype, const void *data, const double *ref, size_t n, double tol_rel,
              char *why, size_t size);

/* --- the standard layout ---------------------------------------------------
 * Shared parameters every rank selects (listed in path order), with "lm_head.weight"
 * tied to "embed.weight"; ParamIds permuted per rank; values rank-dependent. Beside them,
 * unselected parameters that differ between ranks: an expert whose shape and dtype depend
 * on the rank, an F64 table on odd ranks, and "layers.0.norm.bias" on every rank with
 * rank-dependent values. */
typedef struct std_spec {
    const char *path;
    seldp_dtype dtype;
    int ndim;
    int64_t shape[2];
    bool frozen;
} std_spec;

#define STD_N 5
extern const std_spec STD[STD_N];

/* ParamId of STD[k] on `rank` (a rank-dependent permutation of 1..STD_N). */
seldp_param_id std_id(int rank, size_t k);

/* Seed of the initial values of STD[k] on `rank`. */
uint64_t std_seed(int rank, size_t k);

/* Build the standard layout for `rank`, registering in a rank-dependent order. */
seldp_status std_model(test_model *m, int rank);

/* The STD_N selected ids of `rank`, in a rank-dependent order. */
void std_selection(int rank, seldp_param_id *ids);

/* True when STD[k] holds the initial values of `root`; else why says where not. */
bool std_holds_root(test_model *m, size_t k, int root, char *why, size_t size);

/* Build the standard layout for the caller's rank and initialize a session over comm
 * selecting it from root 0. */
seldp_status std_session(seldp_comm *comm, test_model *m, const seldp_session_config *cfg,
                         seldp_session **s);

/* Elements of STD[k]. */
size_t std_numel(size_t k);

/* Seed of `rank`'s gradient of STD[k]. */
uint64_t std_grad_seed(int rank, size_t k);

/* Put `rank`'s gradient of STD[k], stored as `dtype`, into g. */
seldp_status std_put_grad(test_grads *g, int rank, size_t k, seldp_dtype dtype, bool owned,
                          void **data);

/* FP64 reference: the sum over the ranks r < n with include[r] of their gradients of
 * STD[k] as stored in `dtype`, divided by `divisor`; numel(k) values into ref. */
void std_reference(size_t k, seldp_dtype dtype, int n, const bool *include, double divisor,
                   double *ref);

#endif
