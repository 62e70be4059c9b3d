/* Test helpers: run a function on N rank threads of a host world, and fill buffers
 * with deterministic patterns.
 *
 * cmocka is not thread-safe, so rank functions never call cmocka assertions: they
 * return 0 on success or 1 with a message in ctx->why (RANK_CHECK does both), and
 * tr_run_ranks fails the current test on the main thread after joining. */
#ifndef SELDP_TEST_RANKS_H
#define SELDP_TEST_RANKS_H

#include <stddef.h>
#include <stdint.h>

#include "seldp/seldp.h"

typedef struct tr_rank_ctx {
    seldp_comm *world; /* this rank's communicator on the world */
    int rank;
    int size;
    void *arg; /* as passed to tr_run_ranks, shared by every rank */
    char why[1024];
} tr_rank_ctx;

/* One rank's work: 0 on success, else non-zero with ctx->why saying why. */
typedef int (*tr_rank_fn)(tr_rank_ctx *ctx);

/* Record "file:line: message" as the rank's failure (used by RANK_CHECK). */
#if defined(__GNUC__)
__attribute__((format(printf, 4, 5)))
#endif
void tr_rank_fail(tr_rank_ctx *ctx, const char *file, int line, const char *fmt, ...);

/* If !cond: record "file:line: message" in ctx->why and return 1 from the rank function. */
#define RANK_CHECK(ctx, cond, ...)                                                                 \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            tr_rank_fail((ctx), __FILE__, __LINE__, __VA_ARGS__);                                  \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

/* RANK_CHECK that a seldp call returned SELDP_OK, quoting the call and seldp_last_error(). */
#define RANK_CHECK_OK(ctx, call)                                                                   \
    do {                                                                                           \
        seldp_status rank_check_st_ = (call);                                                      \
        RANK_CHECK(ctx, rank_check_st_ == SELDP_OK, "%s returned %s: %s", #call,                   \
                   seldp_status_name(rank_check_st_), seldp_last_error());                         \
    } while (0)

/* Create a host world of n ranks with the timeout, join each rank on its own thread
 * (seldp_host_comm_init on the host device), run fn, destroy comm and world; then, on
 * the main thread, fail the current cmocka test with the first failing rank's message.
 * A rank whose fn fails aborts the world, so that the others return at once (with
 * SELDP_ERR_ABORTED) instead of at their timeout; "first" is the earliest to fail. */
void tr_run_ranks(int n, double timeout_s, tr_rank_fn fn, void *arg);

/* Like tr_run_ranks but returns instead of failing the test: the number of ranks
 * that failed, with the first failing rank's message copied into why (may be NULL). */
int tr_run_ranks_status(int n, double timeout_s, tr_rank_fn fn, void *arg, char *why,
                        size_t why_size);

/* A well-mixed 64-bit value for (seed, i): the same on every run and platform. */
uint64_t tr_hash(uint64_t seed, uint64_t i);

/* Fill `bytes` bytes with the deterministic pattern of `seed`. */
void tr_fill_bytes(void *buf, size_t bytes, uint64_t seed);

/* Fill n floats with deterministic values in [-1, 1). */
void tr_fill_f32(float *x, size_t n, uint64_t seed);

/* Fill n floats with multiples of 1/8 in [-8, 8): sums of up to 2^17 of them are exact in
 * F32 in any order, so reductions can be checked for equality. */
void tr_fill_f32_exact(float *x, size_t n, uint64_t seed);

/* Index of the first byte where a and b differ, or `bytes` when they are equal. */
size_t tr_first_diff(const void *a, const void *b, size_t bytes);

#endif
