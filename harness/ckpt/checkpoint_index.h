/* The parsed index.json of a checkpoint, shared by checkpoint.c (the saves, the checks against
 * a run, the reads) and checkpoint_index.c (the parser, which depends on nothing but the JSON
 * reader, so the fuzz target can run it). */
#ifndef HX_CHECKPOINT_INDEX_H
#define HX_CHECKPOINT_INDEX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "seldp/status.h"
#include "seldp/tensor.h"
#include "tinymoe.h"

typedef struct hx_ckpt hx_ckpt;

#define CKPT_FORMAT "seldp-checkpoint"
/* 2: checksums FNV-1a 64 (HX_FNV1A_BASIS); 1, still read: from HX_FNV1A_BASIS_V1 */
#define CKPT_VERSION           2
#define CKPT_INDEX             "index.json"
#define CKPT_INDEX_CHECKSUM    "\"index_checksum\""
#define CKPT_MASTER_PREFIX     "master/"
#define CKPT_EXP_AVG_PREFIX    "opt/exp_avg/"
#define CKPT_EXP_AVG_SQ_PREFIX "opt/exp_avg_sq/"

typedef struct ckpt_file {
    char *name;
    uint64_t bytes;
    uint64_t header_checksum;
} ckpt_file;

typedef struct ckpt_tensor {
    char *path;
    seldp_dtype dtype;
    int ndim;
    int64_t shape[SELDP_MAX_DIMS];
    int64_t slice[SELDP_MAX_DIMS][2];
    int file;        /* index into files */
    uint64_t offset; /* bytes from the start of the file */
    uint64_t nbytes;
    uint64_t checksum;
} ckpt_tensor;

/* A checkpoint read for --resume (checkpoint.h). */
struct hx_ckpt {
    char *dir;
    int step;
    int generation;
    tm_config config;
    bool fp32_master;
    bool global_stream;
    /* what the resume rules compare (resume.h); an index without them leaves them unknown */
    bool router_known;   /* config: d_ff_shared and the router's coefficients */
    bool training_known; /* training: lr, global_batch */
    double lr;
    int global_batch;
    char *notes; /* hx_resume_check's recorded changes, one per line (NULL: none) */
    /* the optimizer (optimizer.h): its name, each logical parameter's step count, and the loss
     * scale's state (loss_scale.h) */
    bool adamw;
    size_t n_steps;
    char **step_paths;
    int64_t *steps;
    bool loss_scale_known;
    double loss_scale;
    int64_t loss_scale_good;
    uint64_t token_state;
    ckpt_file *files;
    size_t n_files;
    ckpt_tensor *tensors;
    size_t n_tensors;
    int version;    /* the index's format version (1 or CKPT_VERSION) */
    uint64_t basis; /* its checksums' FNV-1a basis, as the index checksum found it */
};

/* 16 lower-case hex digits into *out; false for anything else. */
bool hx_ckpt_hex64(const char *text, uint64_t *out);

/* Parse the `len` bytes of an index.json (`path` names it in errors; `dir` is the checkpoint's
 * directory, copied): its own checksum first, then its structure. SELDP_ERR_PARSE with one line
 * naming the path and the problem. Free with hx_ckpt_close. */
seldp_status hx_ckpt_parse(const char *text, size_t len, const char *path, const char *dir,
                           hx_ckpt **out);

#endif
