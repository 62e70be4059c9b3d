/* What the files of seldp-harness's command line share: the option ids, the --help sections
 * and the one option table (options_table.c, rows of opt_table.h) that options.c parses with,
 * options_help.c prints, sweep_entries.c reads sweep keys through and report.c writes
 * report.json's "options" from. */
#ifndef HX_OPTIONS_IMPL_H
#define HX_OPTIONS_IMPL_H

#include <getopt.h>
#include <stdbool.h>
#include <stddef.h>

#include "opt_table.h"

enum {
    OPT_WORLD = 256,
    OPT_EP,
    OPT_ORDER,
    OPT_LAYOUT_FILE,
    OPT_ROOTS,
    OPT_DTYPE,
    OPT_QUANT,
    OPT_EXPERT_REDUCE,
    OPT_FP32_MASTER,
    OPT_POLICY,
    OPT_STEPS,
    OPT_TOKENS,
    OPT_TOKEN_SPREAD,
    OPT_LR,
    OPT_CLIP_GRAD,
    OPT_OVERLAP,
    OPT_BUCKET_BYTES,
    OPT_SEED,
    OPT_BACKEND,
    OPT_RANKS_PER_PROCESS,
    OPT_OUT,
    OPT_DUMP,
    OPT_SUMMARY,
    OPT_QUIET,
    OPT_TIMEOUT,
    OPT_REFERENCE_THREADS,
    OPT_INJECT,
    OPT_VOCAB,
    OPT_D_MODEL,
    OPT_D_FF,
    OPT_EXPERTS,
    OPT_TOP_K,
    OPT_LAYERS,
    OPT_LORA_RANK,
    OPT_LORA_ALPHA,
    OPT_SHARED_EXPERT_FF,
    OPT_AUX_LOSS_COEFF,
    OPT_AUX_LOSS_SCOPE,
    OPT_Z_LOSS_COEFF,
    OPT_CAPACITY_FACTOR,
    OPT_GLOBAL_BATCH,
    OPT_SAVE,
    OPT_SAVE_EVERY,
    OPT_RESUME,
    OPT_SWEEP,
    OPT_HELP,
    OPT_VERSION,
    OPT_FRAMEWORK,
    OPT_TP,
    OPT_PP,
    OPT_CP,
    OPT_ETP,
    OPT_PRINT_LAYOUT,
    OPT_JSON,
    OPT_COMPARE_GROUPS,
    OPT_FROM_MEGATRON,
    OPT_FROM_TORCHTITAN,
    OPT_FROM_DEEPSPEED,
    /* the training step (step_options.c) */
    OPT_MICRO_BATCHES,
    OPT_PIPELINE_SCHEDULE,
    OPT_OPTIMIZER,
    OPT_ADAM_BETA1,
    OPT_ADAM_BETA2,
    OPT_ADAM_EPS,
    OPT_WEIGHT_DECAY,
    OPT_ZERO,
    OPT_LOSS_SCALE,
    OPT_LOSS_SCALE_WINDOW,
    OPT_LOSS_SCALE_INIT,
    OPT_INJECT_OVERFLOW
};

/* --help's sections, in the order printed (options_help.c); every row is in one. */
enum {
    HX_SEC_LAYOUT,
    HX_SEC_MODEL,
    HX_SEC_TRAINING,
    HX_SEC_EXPERIMENTS,
    HX_SEC_OUTPUT,
    HX_SEC_CHECKPOINTS,
    HX_SEC_SELF_TESTS,
    HX_SEC_PROGRAM,
    HX_SEC_COUNT
};

/* The one table of seldp-harness's options (options_table.c): parsing, defaults, --help,
 * sweep keys, report.json's "options" come from its rows. */
extern const hx_opt_row hx_option_docs[];
extern const size_t hx_option_docs_n;
extern const hx_opt_table hx_options_table;

/* More rows than the table may have (the parser's given[] arrays are this long). */
#define HX_OPTIONS_MAX HX_OPT_ROWS_MAX

/* The rows' callbacks for the options no kind describes (options_custom.c). */
bool hx_opt_order_parse(const hx_opt_row *row, const char *arg, void *base);
void hx_opt_order_value(const hx_opt_row *row, const void *base, char *buf, size_t size);
void hx_opt_order_show(const hx_opt_row *row, const void *base, char *buf, size_t size);
bool hx_opt_framework_parse(const hx_opt_row *row, const char *arg, void *base);
void hx_opt_framework_value(const hx_opt_row *row, const void *base, char *buf, size_t size);
bool hx_opt_dtype_parse(const hx_opt_row *row, const char *arg, void *base);
void hx_opt_dtype_value(const hx_opt_row *row, const void *base, char *buf, size_t size);
bool hx_opt_quant_parse(const hx_opt_row *row, const char *arg, void *base);
void hx_opt_quant_value(const hx_opt_row *row, const void *base, char *buf, size_t size);
bool hx_opt_aux_scope_parse(const hx_opt_row *row, const char *arg, void *base);
void hx_opt_aux_scope_value(const hx_opt_row *row, const void *base, char *buf, size_t size);
bool hx_opt_backend_parse(const hx_opt_row *row, const char *arg, void *base);
void hx_opt_backend_value(const hx_opt_row *row, const void *base, char *buf, size_t size);
bool hx_opt_inject_parse(const hx_opt_row *row, const char *arg, void *base);
void hx_opt_inject_value(const hx_opt_row *row, const void *base, char *buf, size_t size);
bool hx_opt_out_parse(const hx_opt_row *row, const char *arg, void *base);
bool hx_opt_loss_scale_parse(const hx_opt_row *row, const char *arg, void *base);
void hx_opt_spread_value(const hx_opt_row *row, const void *base, char *buf, size_t size);
void hx_opt_spread_show(const hx_opt_row *row, const void *base, char *buf, size_t size);
void hx_opt_schedule_value(const hx_opt_row *row, const void *base, char *buf, size_t size);
void hx_opt_threads_show(const hx_opt_row *row, const void *base, char *buf, size_t size);
void hx_opt_name_show(const hx_opt_row *row, const void *base, char *buf, size_t size);

#endif
