/* Helpers of the checkpoint tests: read a checkpoint's logical tensors through its index.json
 * and compare two checkpoints exactly or within a tolerance. */
#ifndef CKPT_TEST_H
#define CKPT_TEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "seldp/dtype.h"

typedef struct ckpt_test_tensor {
    char name[160];
    seldp_dtype dtype;
    size_t numel;
    unsigned char *bytes; /* as stored */
    size_t nbytes;
} ckpt_test_tensor;

typedef struct ckpt_test {
    int step;
    char token_state[40]; /* the token stream's state, or "" */
    ckpt_test_tensor *tensors;
    size_t count;
} ckpt_test;

/* Read dir/index.json and every tensor it names (fails the test when it cannot). */
void ckpt_test_read(const char *dir, ckpt_test *out);
void ckpt_test_free(ckpt_test *c);

/* Every tensor of a equals b's bit for bit, the same names and the same token stream state;
 * otherwise fails the test naming the first difference. */
void ckpt_test_same(const ckpt_test *a, const ckpt_test *b, const char *what);

/* The largest relative difference ||a - b|| / ||b|| over the floating-point tensors (the
 * others must be identical); its tensor in `worst` (may be NULL). */
double ckpt_test_distance(const ckpt_test *a, const ckpt_test *b, char *worst, size_t size);

/* True when some tensor of a differs from b's. */
bool ckpt_test_differ(const ckpt_test *a, const ckpt_test *b);

#endif
