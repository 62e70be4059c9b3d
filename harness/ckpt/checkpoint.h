/* Checkpoints of a harness run (docs/harness.md, Checkpoints): --save DIR writes the training state
 * at the end of a step, --resume DIR continues from it under the same or another layout and world.
 *
 * A checkpoint directory holds safetensors shards of the logical tensors and one index.json:
 *
 *   step000004-g0-rank00000.safetensors   the tensors rank 0 writes: every shared parameter
 *                                          when it is the shared group's root, and each expert
 *                                          whose data group it roots (one writer per replica
 *                                          set; with --fp32-master also `master/{path}`, F32)
 *   index.json                            logical path -> shape, dtype, file, offsets (bytes
 *                                          in the file), slice ([begin, end) per dimension of
 *                                          the logical shape), checksum; the step, the config,
 *                                          the layout, the training options, the token stream's
 *                                          RNG state, each file's size and header checksum,
 *                                          and last its own checksum
 *
 * Every file goes to a temporary name, is fsync'd and renamed, and the directory is fsync'd;
 * index.json is replaced last, so it names either the previous complete checkpoint or the new
 * one. Shard names carry a generation that no file of the current index uses, so a save never
 * overwrites what the current index names; after the index is in place, the files it does not
 * name are removed. Checksums are 64-bit FNV-1a (hx_checksum) as 16 hex digits. */
#ifndef HX_CHECKPOINT_H
#define HX_CHECKPOINT_H

#include <stdbool.h>
#include <stdint.h>

#include "seldp/status.h"

#include "options.h"

struct hx_run;
struct hx_rank;

/* A checkpoint read for --resume: its index, checked against itself. */
typedef struct hx_ckpt hx_ckpt;

/* Read DIR/index.json: its own checksum, its structure, the files it names. SELDP_ERR_IO or
 * _PARSE with one line naming the file and the problem. Free with hx_ckpt_close. */
seldp_status hx_ckpt_open(const char *dir, hx_ckpt **out);

void hx_ckpt_close(hx_ckpt *ckpt);

/* The step the checkpoint ends (1-based: the number of steps done). */
int hx_ckpt_step(const hx_ckpt *ckpt);

/* Check the checkpoint against the run's options before anything runs: the resume rules
 * (resume.h: what may change, what is refused, what is recorded into the checkpoint's notes,
 * hx_ckpt_notes), every tensor of the logical model present with its shape and dtype, and
 * every file whole: its size, its header and every tensor's checksum. SELDP_ERR_INVALID_ARGUMENT
 * or _IO or _PARSE with one line naming the file and the problem. */
seldp_status hx_ckpt_verify(hx_ckpt *ckpt, const hx_options *opts);

/* The changes hx_ckpt_verify recorded (the resume rules' "recorded" rows), one per line, or
 * "" for none. */
const char *hx_ckpt_notes(const hx_ckpt *ckpt);

/* The state of the global token stream after the checkpoint's step (--global-batch). */
uint64_t hx_ckpt_token_state(const hx_ckpt *ckpt);

/* Rank rk reads the slices of the parameters it holds (each read checked against its checksum)
 * into its model; with `master`, the FP32 master weights into rk->master instead. */
seldp_status hx_ckpt_load_rank(const hx_ckpt *ckpt, struct hx_rank *rk, bool master);
/* Every trainable parameter's step count and AdamW's moments (resharded like the weights) of
 * rk (optimizer.h). */
seldp_status hx_ckpt_load_moments(const hx_ckpt *ckpt, struct hx_rank *rk);
/* The step count the checkpoint holds for a logical path (0: none). */
int64_t hx_ckpt_steps_of(const hx_ckpt *ckpt, const char *path);
/* The loss scale's state the checkpoint holds: false when it holds none. */
bool hx_ckpt_loss_scale(const hx_ckpt *ckpt, double *scale, int64_t *good);

/* The first generation a save into `dir` may use: above every generation of a shard there
 * (0 when the directory does not exist). */
int hx_ckpt_next_generation(const char *dir);

/* True when --save asks for a checkpoint at the end of step `step` (0-based). */
bool hx_ckpt_due(const struct hx_run *run, int step);

/* Rank rk writes its shard of the state at the end of `step` (nothing when it writes no
 * tensor): temporary name, fsync, rename. Also records the token stream's state for the
 * index. Call after the SGD update of the step. */
seldp_status hx_ckpt_write_rank(struct hx_rank *rk, int step);

/* After every writer has written its shard: read the shards back, write index.json (temporary
 * name, fsync, rename, fsync of the directory), remove the files the new index does not name,
 * and advance the run's generation. On failure the previous index stays in place. */
seldp_status hx_ckpt_commit(struct hx_run *run, int step);

#endif
