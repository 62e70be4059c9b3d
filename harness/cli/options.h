/* Command-line options of seldp-harness: one struct, whose fields the rows of the option
 * table (options_table.c) parse, default, print in --help and write into report.json; the
 * parser, and the one check of the rules between options. */
#ifndef HX_OPTIONS_H
#define HX_OPTIONS_H

#include <stdbool.h>
#include <stdio.h>

#include "seldp/session.h"
#include "tinymoe.h"

#include "backend.h"
#include "layout.h"

/* How expert gradients are reduced over their expert-data group (docs/harness.md). */
typedef enum hx_flow {
    HX_FLOW_SUM = 0, /* normalized by the global token count, then `sum` */
    HX_FLOW_MEAN = 1 /* loss-sum gradients, `reduce` weighted by the EP group's tokens */
} hx_flow;

/* A defect the harness plants on its last rank, to prove that its checks catch it. */
typedef enum hx_fault {
    HX_FAULT_NONE = 0,
    HX_FAULT_GRAD = 1,    /* double one reduced gradient after the reductions */
    HX_FAULT_REPLICA = 2, /* flip a bit of embed.weight after initialize */
    HX_FAULT_ABSENT = 3,  /* give an expert no token reached a zero gradient */
    HX_FAULT_FAIL = 4,    /* fail in the first step: every other rank must stop, none hang */
    /* framework bugs (docs/harness.md, Planted bugs and Sweeps, inject.c): planted in the
       reductions of every rank */
    HX_FAULT_EP_SCALE = 5,   /* expert grads scaled by the EP size (DeepSpeed #6545) */
    HX_FAULT_RANK_MEAN = 6,  /* per-rank token mean instead of the global (torchtitan #1842) */
    HX_FAULT_WORLD_DIV = 7,  /* expert grads divided by the world, not the expert-data size */
    HX_FAULT_TIED_TWICE = 8, /* the tied embedding reduced twice */
    HX_FAULT_LOCAL_AUX = 9,  /* load-balancing statistics of each data shard's own tokens */
    /* the second set (bugs.c holds every framework bug's name, mistake and citation) */
    HX_FAULT_ROUTER_TP = 10,        /* SP norms and routers reduced over DP only, not TP */
    HX_FAULT_AUX_CP = 11,           /* router losses' gradient not scaled for CP (x 1/cp) */
    HX_FAULT_AUX_DP = 12,           /* global aux loss's gradient without x dp (x 1/dp) */
    HX_FAULT_AUX_MICROBATCH = 13,   /* router losses not divided by the micro-batches */
    HX_FAULT_LAST_MICROBATCH = 14,  /* the last micro-batch's token count as the step's */
    HX_FAULT_NORM_PER_GROUP = 15,   /* the clipping norm from rank-local norms averaged */
    HX_FAULT_EDP1_SKIP = 16,        /* experts unnormalized when their edp group has one rank */
    HX_FAULT_SHARED_EXPERT_TP = 17, /* the shared expert's gradients summed over TP again */
    HX_FAULT_TIED_ZERO = 18,        /* tied embedding's stage sum after the reduce-scatter */
    HX_FAULT_HALF_ACCUM = 19,       /* the reduction accumulated in the half dtype */
    HX_FAULT_FOUND_INF_LOCAL = 20,  /* found_inf not agreed over the optimizers' groups */
    HX_FAULT_COUNT
} hx_fault;

/* The update of the step (docs/harness.md, Optimizers). */
typedef enum hx_optimizer {
    HX_OPT_SGD = 0,  /* w -= lr g */
    HX_OPT_ADAMW = 1 /* decoupled weight decay, bias-corrected moments (torch.optim.AdamW) */
} hx_optimizer;

/* --pipeline-schedule (docs/harness.md, Micro-batches: Pipelines): the order in which a stage runs
 * its micro-batches' forwards and backwards. */
typedef enum hx_pipe_schedule {
    HX_PIPE_DEFAULT = 0,   /* not given: 1F1B */
    HX_PIPE_1F1B = 1,      /* Megatron's: warmup forwards, one forward one backward, cooldown */
    HX_PIPE_AFAB = 2,      /* every forward, then every backward */
    HX_PIPE_SEQUENTIAL = 3 /* one micro-batch at a time through every stage and back */
} hx_pipe_schedule;

typedef struct hx_options {
    int world;
    int ep;
    hx_order order;
    const char *layout_file; /* NULL: generated from world, ep, order */
    hx_roots roots;
    bool roots_given; /* --roots on the command line: it decides every root the layout does
                         not name, over the framework's own rule */
    tm_config model;  /* dtype, quant, sizes, lora, seed */
    hx_flow flow;
    bool fp32_master;
    seldp_missing_policy policy;
    int steps;
    int tokens;       /* mean tokens per rank and step */
    int token_spread; /* each rank draws tokens +- up to this many; -1: tokens / 4 */
    double lr;
    double clip_grad;    /* --clip-grad: largest global gradient norm before the update; 0: off */
    bool overlap;        /* --overlap: reductions overlapped with the backward (overlap.c) */
    size_t bucket_bytes; /* --bucket-bytes: the sessions' bucket size; 0: the library's */
    hx_backend_kind backend;
    int ranks_per_process; /* --ranks-per-process: rank threads per MPI process; 0: off */
    const char *out_dir;   /* NULL or "": no report files */
    const char *dump_dir;  /* NULL: no dump */
    const char *summary;   /* NULL: none; else a file this run appends its table row to */
    bool quiet;
    double timeout_s;
    int reference_threads; /* --reference-threads: the FP64 reference's threads; 0: the cores */
    hx_fault inject;
    bool inject_anywhere; /* a sweep's run: plant --inject even where it cannot show (the sweep
                             refuses it when no run of it can) */
    bool world_given;     /* --world on the command line (a layout file may set it otherwise) */
    bool experts_given;   /* --experts on the command line */
    bool ep_given;        /* --ep on the command line (excludes --layout-file) */
    bool order_given;     /* --order on the command line (excludes --layout-file) */
    hx_grid grid;    /* --framework, --tp, --pp, --cp, --etp and --order (docs/harness.md, Framework
                        presets) */
    bool grid_given; /* one of --framework, --tp, --pp, --cp, --etp (excludes --layout-file) */
    bool print_layout; /* --print-layout: print the groups and exit without training */
    bool tokens_given; /* --tokens or --token-spread on the command line */

    /* layout-independent runs and checkpoints (docs/harness.md, Layout-independent runs and
     * Checkpoints) */
    int global_batch;       /* > 0: the global batch of each step, split over the data shards */
    const char *save_dir;   /* NULL: no checkpoints */
    int save_every;         /* save after every N-th step (0: after the last step only) */
    const char *resume_dir; /* NULL: start from step 0 */

    const char *sweep; /* NULL: one run; else a sweep file or preset name (sweep.h) */

    /* a framework's layout, in and out (import.h, show.h) */
    bool print_json;            /* --json: --print-layout writes the layout as JSON */
    const char *compare_groups; /* --compare-groups FILE */
    const char *from_megatron;  /* --from-megatron ARGS (@FILE: read from FILE) */
    const char *from_torchtitan;
    const char *from_deepspeed;

    /* the training step (docs/harness.md, The training step; step_options.c) */
    int micro_batches; /* --micro-batches: gradient accumulation over M micro-batches (1) */
    hx_pipe_schedule pipeline_schedule; /* --pipeline-schedule (HX_PIPE_DEFAULT: 1F1B) */
    hx_optimizer optimizer;             /* --optimizer (sgd) */
    double adam_beta1, adam_beta2, adam_eps, weight_decay; /* AdamW's (0.9, 0.999, 1e-8, 0) */
    bool adam_given;        /* one of --adam-beta1/-beta2/-eps or --weight-decay given */
    int zero;               /* --zero 1: the distributed optimizer (zero.h); 0: all-reduce */
    double loss_scale;      /* --loss-scale X (> 0), or 0: dynamic (loss_scale.h) */
    bool loss_scale_given;  /* --loss-scale given */
    int loss_scale_window;  /* --loss-scale-window: steps without overflow before S doubles */
    double loss_scale_init; /* --loss-scale-init: dynamic scaling's first S (1024) */
    int inject_overflow;    /* --inject-overflow STEP (1-based); 0: none */
} hx_options;

/* The defaults: the README's main command (world 8, ep 4, bf16, small model). */
void hx_options_default(hx_options *opts);

/* Outcome of parsing. */
typedef enum hx_parse_result {
    HX_PARSE_RUN = 0,  /* run with *opts */
    HX_PARSE_EXIT = 1, /* --help or --version was printed: exit 0 */
    HX_PARSE_ERROR = 2 /* a bad option: a one-line error is printed to err; exit 2 */
} hx_parse_result;

/* Parse argv into *opts (start from hx_options_default). The strings of argv are borrowed.
 * Help goes to `out`, errors (one line, naming the option) to `err`. Resets getopt's state
 * first, so it may be called more than once per process. */
hx_parse_result hx_options_parse(int argc, char **argv, hx_options *opts, FILE *out, FILE *err);

/* Every rule between options (options_check.c, docs/harness.md): the first one o breaks as
 * hx_fail's message (SELDP_ERR_INVALID_ARGUMENT; nothing is printed). given:
 * [hx_option_docs_n] the rows the command line named (NULL: the rules on what --print-layout
 * would ignore are skipped). hx_run_create calls it with NULL before anything is resolved. */
seldp_status hx_options_rules(const hx_options *o, const bool *given);

/* hx_options_rules with its message as one line on err ("seldp-harness: ..."): false when o
 * breaks a rule. hx_options_parse calls it last. */
bool hx_options_check(const hx_options *o, const bool *given, FILE *err);

/* report.json's "options": {"world": 8, ...} from the rows with a report key, in table order
 * (their values as the run uses them: the order, the spread and the schedule resolved);
 * after(key) may append members behind each (report.c: the transport after the backend). */
struct hx_buf;
struct hx_json;
void hx_options_json(const hx_options *o, struct hx_buf *b,
                     void (*after)(const char *key, struct hx_buf *b, const void *ctx),
                     const void *ctx);

/* That object read back through the same rows into *o (start from hx_options_default): false
 * with the row's error in msg. o borrows the document's strings. */
bool hx_options_from_json(const struct hx_json *obj, hx_options *o, char *msg, size_t size);

/* Print the --help text. */
void hx_options_usage(FILE *out);

/* Names for printing and reports. */
const char *hx_flow_name(hx_flow flow);
const char *hx_policy_name(seldp_missing_policy policy);
const char *hx_order_name(hx_order order);
const char *hx_roots_name(hx_roots roots);
const char *hx_optimizer_name(hx_optimizer opt);
/* The schedule a run uses (the default resolved: 1F1B) and its option value's name. */
hx_pipe_schedule hx_pipe_schedule_of(const hx_options *o);
const char *hx_pipe_schedule_name(hx_pipe_schedule s);

/* The token spread actually used (resolves -1). */
int hx_options_spread(const hx_options *opts);

#endif
