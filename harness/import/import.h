/* A framework's configuration as harness options: --from-megatron "ARGS" (a Megatron-LM or
 * Megatron-DeepSpeed command line), --from-torchtitan FILE (a torchtitan train config, TOML)
 * and --from-deepspeed FILE (a ds_config JSON). docs/harness-interop.md lists every key each
 * reads and how it maps.
 *
 * An import is a list of settings, each a harness option with its value and the config key it
 * came from, and a list of lines for what the import recognised but did not apply and what it
 * ignored. hx_options_parse applies the settings first and the command line on top of them,
 * so an explicit option always wins. A setting the framework takes by default (Megatron's
 * --clip-grad 1.0 when the command line has none) yields to one another import writes; two
 * written settings that disagree are a contradiction. A malformed or contradictory config is
 * one line naming the key (SELDP_ERR_INVALID_ARGUMENT or _PARSE or _IO), exit status 2. */
#ifndef HX_IMPORT_H
#define HX_IMPORT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "seldp/status.h"

#include "json.h"
#include "options.h"

/* The imports one command line may name. */
typedef enum hx_import_kind {
    HX_IMPORT_MEGATRON = 0,
    HX_IMPORT_TORCHTITAN = 1,
    HX_IMPORT_DEEPSPEED = 2,
    HX_IMPORT_KINDS
} hx_import_kind;

/* One harness option the import sets. */
typedef struct hx_import_setting {
    char arg[34];        /* the option as written: "--tp", "--dtype", "--fp32-master" */
    char value[48];      /* "" for a flag */
    char source[200];    /* the config's words: "--tensor-model-parallel-size 2" */
    hx_import_kind from; /* which import set it */
    bool fallback;       /* the framework's default (not in the config): yields */
} hx_import_setting;

/* The sizes the derived settings need (micro-batches, the shared expert, experts), resolved
 * from the command line, the import and the defaults, in that order. */
typedef struct hx_import_sizes {
    int world, tp, pp, cp, ep, etp;
    int experts, d_ff;
    bool world_known; /* the command line or a config gives the world (not the default) */
} hx_import_sizes;

typedef struct hx_import {
    hx_import_setting *settings;
    size_t n, cap;
    char **lines; /* one line each: recognised-not-applied and ignored keys, notes */
    size_t n_lines, cap_lines;
    /* what the derived settings are computed from, per import (filled while reading) */
    struct {
        long micro_batch, global_batch; /* 0: not given */
        long shared_ff, ffn, moe_ffn, hidden;
        bool mds; /* a Megatron-DeepSpeed command line (--deepspeed, --moe-expert-parallel-size) */
        bool mds_etp; /* --enable-expert-tensor-parallelism: etp = the resolved tp */
    } megatron;
    struct {
        long replicate, shard; /* shard -1: the world's rest */
        long local_batch, global_batch, pp_microbatch;
        bool flavor_experts; /* the model flavor gave the experts */
        long shared;         /* the flavor's shared experts */
    } torchtitan;
    struct {
        long train_batch, micro_batch, grad_accum; /* 0: not given */
        bool autoep;
        long autoep_size, autoep_etp;
    } deepspeed;
    const hx_options *cmdline; /* the command line alone (defaults + explicit options) */
    const bool *given;         /* [hx_option_docs_n]: the options the command line names */
} hx_import;

/* Read the configs `sources` names (NULL where absent; argument text for Megatron, file names
 * for the others) into *imp (zero it first), with `cmdline` and `given` the command line's
 * options (borrowed for the call). On failure one line (naming the import and the key) is the
 * last error; *imp holds what was read and must still be freed. */
seldp_status hx_import_read(const char *const sources[HX_IMPORT_KINDS], const hx_options *cmdline,
                            const bool *given, hx_import *imp);

/* True unless the command line overrides setting s: it names the option, or --layout-file
 * (which gives the whole layout) for a layout setting. */
bool hx_import_applies(const hx_import *imp, const hx_import_setting *s);

/* Print what the import did, one line each (prefixed "import (<framework>): "): the options it
 * sets, those the command line overrides, and every recognised-not-applied and ignored key. */
void hx_import_print(const hx_import *imp, FILE *out);

void hx_import_free(hx_import *imp);

/* The name of an import kind as its option says it: "megatron", "torchtitan", "deepspeed". */
const char *hx_import_name(hx_import_kind kind);

/* ---- for the readers (import_*.c) --------------------------------------------------------- */

/* Set option `option` to `value` ("" for a flag) from `from`, the source formatted. A second
 * setting of the same option: the same value merges, a fallback yields, two written values
 * contradict (SELDP_ERR_INVALID_ARGUMENT naming both sources). An option this harness does
 * not have becomes a recognised-not-applied line. */
HX_PRINTF(6, 7)
seldp_status hx_import_set(hx_import *imp, hx_import_kind from, const char *option,
                           const char *value, bool fallback, const char *source_fmt, ...);

/* Add one line (recognised, ignored, a note). Returns false when out of memory. */
HX_PRINTF(3, 4) bool hx_import_line(hx_import *imp, hx_import_kind from, const char *fmt, ...);

/* The value a setting of `option` has, or NULL. */
const char *hx_import_value(const hx_import *imp, const char *option);

/* True when the command line names `option` (it overrides the import). */
bool hx_import_given(const hx_import *imp, const char *option);

/* The sizes as the run will see them (hx_import_sizes). */
hx_import_sizes hx_import_resolve(const hx_import *imp);

/* The readers: each reads its config into imp, then hx_import_read calls its finish with the
 * resolved sizes for the settings derived from them. */
seldp_status hx_import_megatron(const char *args, hx_import *imp);
seldp_status hx_import_megatron_finish(hx_import *imp, const hx_import_sizes *sizes);
seldp_status hx_import_torchtitan(const char *text, size_t len, const char *path, hx_import *imp);
seldp_status hx_import_torchtitan_finish(hx_import *imp, const hx_import_sizes *sizes);
seldp_status hx_import_deepspeed(const char *text, size_t len, const char *path, hx_import *imp);
seldp_status hx_import_deepspeed_finish(hx_import *imp, const hx_import_sizes *sizes);

/* A JSON or TOML leaf as config text: "2", "1e-08", "true", "\"bf16\"", "[...]". */
void hx_import_leaf_text(const hx_json *v, char *buf, size_t size);

#endif
