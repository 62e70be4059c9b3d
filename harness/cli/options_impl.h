/* What the files of seldp-harness's command line share: the option ids and the one table
 * of getopt entries and help lines (options_table.c) that options.c parses with and
 * options_help.c prints. */
#ifndef HX_OPTIONS_IMPL_H
#define HX_OPTIONS_IMPL_H

#include <getopt.h>
#include <stdbool.h>
#include <stddef.h>

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

/* The training step's options (step_options.c, docs/harness.md, The training step): the
 * defaults into *o; the --help text of a default ("" for an option of another table part);
 * parsing option `id` with its argument, true when `id` is one of them (then
 * *ok says whether the argument was valid and *expected what it must be). */
struct hx_options;
void hx_step_options_default(struct hx_options *o);
void hx_step_option_default_text(int id, char *buf, size_t size);
bool hx_step_option_parse(int id, const char *arg, struct hx_options *o, bool *ok,
                          const char **expected);

/* One row per option: the getopt entry, its argument's name and its help line. The help
 * text and the parser come from this one table. */
typedef struct hx_option_doc {
    struct option opt;
    const char *metavar;
    const char *help;
} hx_option_doc;

/* More rows than the table may have (the parser's getopt array is this long). */
#define HX_OPTIONS_MAX 128

extern const hx_option_doc hx_option_docs[];
extern const size_t hx_option_docs_n;

#endif
