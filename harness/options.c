/* seldp-harness command line: defaults, getopt_long parsing and the help text. */
#define _POSIX_C_SOURCE 200809L

#include "options.h"

#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "seldp/version.h"

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
    OPT_OUT,
    OPT_DUMP,
    OPT_SUMMARY,
    OPT_QUIET,
    OPT_TIMEOUT,
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
    OPT_PRINT_LAYOUT
};

/* One row per option: the getopt entry, its argument's name and its help line. The help
 * text and the parser come from this one table. */
typedef struct option_doc {
    struct option opt;
    const char *metavar;
    const char *help;
} option_doc;

static const option_doc docs[] = {
    {{"world", required_argument, NULL, OPT_WORLD},
     "N",
     "number of ranks (under mpirun: the number of processes, which it defaults to)"},
    {{"ep", required_argument, NULL, OPT_EP},
     "N",
     "expert-parallel group size (divides --world; under mpirun without --world the default "
     "shrinks "
     "to divide the process count)"},
    {{"order", required_argument, NULL, OPT_ORDER},
     "ep-dp|dp-ep|ORDER",
     "ep-dp: EP groups are consecutive ranks (DeepSpeed, Megatron-Core); dp-ep: strided "
     "(DeepSpeed's data-before-expert); or a Megatron order naming tp, cp, ep, dp, pp once each "
     "(without --order: the framework's own, Megatron's tp-cp-ep-dp-pp being ep-dp at tp = cp = "
     "pp = 1)"},
    {{"framework", required_argument, NULL, OPT_FRAMEWORK},
     "NAME",
     "megatron, megatron-0.9, deepspeed or torchtitan: build the groups as that framework does "
     "(SPEC section 5.1)"},
    {{"tp", required_argument, NULL, OPT_TP}, "N", "tensor-parallel size"},
    {{"pp", required_argument, NULL, OPT_PP}, "N", "pipeline stages"},
    {{"cp", required_argument, NULL, OPT_CP}, "N", "context-parallel size"},
    {{"etp", required_argument, NULL, OPT_ETP}, "N", "expert tensor-parallel size"},
    {{"print-layout", no_argument, NULL, OPT_PRINT_LAYOUT},
     NULL,
     "print every group of the layout (any sizes) and exit without training"},
    {{"layout-file", required_argument, NULL, OPT_LAYOUT_FILE},
     "FILE",
     "JSON layout (groups, expert owners, roots) instead of --ep/--order"},
    {{"roots", required_argument, NULL, OPT_ROOTS},
     "first|last|spread",
     "roots of groups the layout does not give one"},
    {{"dtype", required_argument, NULL, OPT_DTYPE}, "f32|bf16|f16", "parameter storage dtype"},
    {{"quant", required_argument, NULL, OPT_QUANT},
     "none|nf4|awq",
     "expert weights: dense, or a frozen 4-bit base with LoRA adapters"},
    {{"expert-reduce", required_argument, NULL, OPT_EXPERT_REDUCE},
     "sum|mean",
     "sum: grads / global tokens, then sum; mean: reduce weighted by EP-group tokens"},
    {{"fp32-master", no_argument, NULL, OPT_FP32_MASTER},
     NULL,
     "FP32 gradients and master weights (reduce_fp32 / sum_fp32)"},
    {{"policy", required_argument, NULL, OPT_POLICY},
     "error|zero",
     "missing gradients: error, or contribute zero"},
    {{"steps", required_argument, NULL, OPT_STEPS}, "N", "training steps"},
    {{"tokens", required_argument, NULL, OPT_TOKENS}, "N", "mean tokens per rank and step"},
    {{"token-spread", required_argument, NULL, OPT_TOKEN_SPREAD},
     "N",
     "each rank draws tokens +- up to N (default tokens/4; 0: equal counts)"},
    {{"lr", required_argument, NULL, OPT_LR}, "X", "SGD learning rate"},
    {{"clip-grad", required_argument, NULL, OPT_CLIP_GRAD},
     "X",
     "clip the global gradient norm (every replica set and shard once) to X before the update, "
     "and check it against the FP64 reference's (0: off)"},
    {{"overlap", no_argument, NULL, OPT_OVERLAP},
     NULL,
     "overlap the reductions with the backward: each rank starts its sessions' reductions "
     "before its backward, marks each layer's gradients ready as its backward produces them and "
     "finishes after it (bit-identical results; host ranks in one process only)"},
    {{"bucket-bytes", required_argument, NULL, OPT_BUCKET_BYTES},
     "N",
     "largest bucket of the sessions' reductions in bytes (0: the library's 25 MiB); with "
     "--overlap a bucket is reduced as soon as its gradients are ready"},
    {{"seed", required_argument, NULL, OPT_SEED}, "N", "seed of weights and tokens"},
    {{"backend", required_argument, NULL, OPT_BACKEND},
     "auto|host|nccl|mpi",
     "transport; auto: under mpirun nccl (bootstrapped over MPI) when every process has a GPU of "
     "its own, else mpi; otherwise nccl when every rank has a GPU of its own, else host"},
    {{"out", required_argument, NULL, OPT_OUT},
     "DIR",
     "report.json and report.md go here (\"\" or none: no files)"},
    {{"dump", required_argument, NULL, OPT_DUMP},
     "DIR",
     "write the last step's rank{r}.safetensors and manifest.json here"},
    {{"summary", required_argument, NULL, OPT_SUMMARY},
     "FILE",
     "append this run's summary (a Markdown table row; the header if FILE is new) to FILE"},
    {{"quiet", no_argument, NULL, OPT_QUIET}, NULL, "print only errors and the result line"},
    {{"timeout", required_argument, NULL, OPT_TIMEOUT},
     "S",
     "seconds a collective may wait for a rank"},
    {{"inject", required_argument, NULL, OPT_INJECT},
     "FAULT",
     "self-test: grad, replica or absent plant a defect on the last rank that the checks must "
     "catch; fail stops every rank in step 1 (exit 1); ep-scale, rank-mean, world-div, "
     "tied-twice or local-aux (global aux loss) a framework bug on every rank (SPEC 5.2) that "
     "the checks and a sweep must catch and name"},
    {{"vocab", required_argument, NULL, OPT_VOCAB}, "N", "model: vocabulary V"},
    {{"d-model", required_argument, NULL, OPT_D_MODEL}, "N", "model: d_model D"},
    {{"d-ff", required_argument, NULL, OPT_D_FF}, "N", "model: d_ff F"},
    {{"experts", required_argument, NULL, OPT_EXPERTS}, "N", "model: experts E"},
    {{"top-k", required_argument, NULL, OPT_TOP_K}, "N", "model: experts per token K"},
    {{"layers", required_argument, NULL, OPT_LAYERS}, "N", "model: layers L"},
    {{"lora-rank", required_argument, NULL, OPT_LORA_RANK}, "N", "model: LoRA rank r (nf4, awq)"},
    {{"lora-alpha", required_argument, NULL, OPT_LORA_ALPHA},
     "X",
     "model: LoRA alpha (scale alpha/r)"},
    {{"shared-expert-ff", required_argument, NULL, OPT_SHARED_EXPERT_FF},
     "N",
     "model: d_ff of an ungated shared expert in every layer (a shared parameter; 0: none)"},
    {{"aux-loss-coeff", required_argument, NULL, OPT_AUX_LOSS_COEFF},
     "X",
     "model: load-balancing loss coefficient alpha (Switch/GShard, per layer; 0: off)"},
    {{"aux-loss-scope", required_argument, NULL, OPT_AUX_LOSS_SCOPE},
     "global|local",
     "model: the load-balancing loss over the whole global batch (counts allreduced in the "
     "forward) or each data shard's tokens"},
    {{"z-loss-coeff", required_argument, NULL, OPT_Z_LOSS_COEFF},
     "X",
     "model: router z-loss coefficient beta (ST-MoE; 0: off)"},
    {{"capacity-factor", required_argument, NULL, OPT_CAPACITY_FACTOR},
     "X",
     "model: expert capacity ceil(X*T*K/E) per rank and layer, later assignments dropped "
     "(0: no capacity)"},
    {{"global-batch", required_argument, NULL, OPT_GLOBAL_BATCH},
     "N",
     "layout-independent run: N tokens per step from one stream, split over the ranks (the "
     "first N mod world ranks take one more), and initial weights that depend only on the seed; "
     "replaces --tokens and --token-spread"},
    {{"save", required_argument, NULL, OPT_SAVE},
     "DIR",
     "write a checkpoint (safetensors shards + index.json) here at the end of the last step and "
     "of every --save-every-th step"},
    {{"save-every", required_argument, NULL, OPT_SAVE_EVERY},
     "N",
     "with --save: also after every N-th step (0: only after the last)"},
    {{"resume", required_argument, NULL, OPT_RESUME},
     "DIR",
     "continue from the checkpoint in DIR up to --steps, under any layout and world"},
    {{"sweep", required_argument, NULL, OPT_SWEEP},
     "FILE|PRESET",
     "run a list of layouts (a JSON file, or a preset: ep = every ep of --world in both "
     "orders, frameworks = every --framework with its orders, worlds = 1, 2, 4, 8, worlds-32) "
     "and compare each run's losses and final weights with the first run of its objective; "
     "sweep.md, sweep.json and a plot go to --out"},
    {{"help", no_argument, NULL, OPT_HELP}, NULL, "print this help and exit"},
    {{"version", no_argument, NULL, OPT_VERSION}, NULL, "print the library version and exit"},
};

#define N_DOCS (sizeof docs / sizeof docs[0])

void hx_options_default(hx_options *o)
{
    *o = (hx_options){0};
    o->world = 8;
    o->ep = 4;
    o->order = HX_ORDER_EP_DP;
    o->roots = HX_ROOTS_FIRST;
    o->model = (tm_config)TM_CONFIG_INIT;
    o->model.vocab = 64;
    o->model.d_model = 32;
    o->model.d_ff = 64;
    o->model.experts = 8;
    o->model.top_k = 2;
    o->model.layers = 2;
    o->model.dtype = SELDP_BF16;
    o->model.quant = TM_QUANT_NONE;
    o->model.lora_rank = 4;
    o->model.lora_alpha = 8.0;
    o->model.seed = 1234;
    o->flow = HX_FLOW_SUM;
    o->policy = SELDP_MISSING_ERROR;
    o->steps = 3;
    o->tokens = 64;
    o->token_spread = -1;
    o->lr = 0.5;
    o->backend = HX_BACKEND_AUTO;
    o->out_dir = "results/latest";
    o->timeout_s = 60.0;
    o->grid = (hx_grid)HX_GRID_INIT;
}

const char *hx_flow_name(hx_flow flow)
{
    return flow == HX_FLOW_MEAN ? "mean" : "sum";
}

const char *hx_policy_name(seldp_missing_policy policy)
{
    return policy == SELDP_MISSING_ZERO ? "zero" : "error";
}

const char *hx_order_name(hx_order order)
{
    return order == HX_ORDER_DP_EP ? "dp-ep" : "ep-dp";
}

const char *hx_fault_name(hx_fault fault)
{
    static const char *const names[HX_FAULT_COUNT] = {
        "none",     "grad",      "replica",   "absent",     "fail",
        "ep-scale", "rank-mean", "world-div", "tied-twice", "local-aux"};
    return (unsigned)fault < HX_FAULT_COUNT ? names[fault] : "invalid";
}

const char *hx_roots_name(hx_roots roots)
{
    return roots == HX_ROOTS_LAST ? "last" : roots == HX_ROOTS_SPREAD ? "spread" : "first";
}

int hx_options_spread(const hx_options *o)
{
    return o->token_spread >= 0 ? o->token_spread : o->tokens / 4;
}

/* The default of an option, as the help prints it. */
static void default_text(int id, char *buf, size_t size)
{
    hx_options d;
    hx_options_default(&d);
    switch (id) {
    case OPT_WORLD:
        snprintf(buf, size, "%d", d.world);
        break;
    case OPT_EP:
        snprintf(buf, size, "%d", d.ep);
        break;
    case OPT_ORDER:
        snprintf(buf, size, "%s", hx_order_name(d.order));
        break;
    case OPT_LAYOUT_FILE:
        snprintf(buf, size, "none");
        break;
    case OPT_ROOTS:
        snprintf(buf, size, "%s", hx_roots_name(d.roots));
        break;
    case OPT_DTYPE:
        snprintf(buf, size, "%s", tm_dtype_name(d.model.dtype));
        break;
    case OPT_QUANT:
        snprintf(buf, size, "%s", tm_quant_name(d.model.quant));
        break;
    case OPT_EXPERT_REDUCE:
        snprintf(buf, size, "%s", hx_flow_name(d.flow));
        break;
    case OPT_POLICY:
        snprintf(buf, size, "%s", hx_policy_name(d.policy));
        break;
    case OPT_STEPS:
        snprintf(buf, size, "%d", d.steps);
        break;
    case OPT_TOKENS:
        snprintf(buf, size, "%d", d.tokens);
        break;
    case OPT_TOKEN_SPREAD:
        snprintf(buf, size, "%d", hx_options_spread(&d));
        break;
    case OPT_LR:
        snprintf(buf, size, "%g", d.lr);
        break;
    case OPT_CLIP_GRAD:
        snprintf(buf, size, "%g", d.clip_grad);
        break;
    case OPT_SEED:
        snprintf(buf, size, "%llu", (unsigned long long)d.model.seed);
        break;
    case OPT_BACKEND:
        snprintf(buf, size, "%s", hx_backend_name(d.backend));
        break;
    case OPT_OUT:
        snprintf(buf, size, "%s", d.out_dir);
        break;
    case OPT_DUMP:
    case OPT_SUMMARY:
    case OPT_GLOBAL_BATCH:
    case OPT_SAVE:
    case OPT_RESUME:
    case OPT_SWEEP:
        snprintf(buf, size, "none");
        break;
    case OPT_SAVE_EVERY:
        snprintf(buf, size, "%d", d.save_every);
        break;
    case OPT_TIMEOUT:
        snprintf(buf, size, "%g", d.timeout_s);
        break;
    case OPT_INJECT:
        snprintf(buf, size, "%s", hx_fault_name(d.inject));
        break;
    case OPT_VOCAB:
        snprintf(buf, size, "%d", d.model.vocab);
        break;
    case OPT_D_MODEL:
        snprintf(buf, size, "%d", d.model.d_model);
        break;
    case OPT_D_FF:
        snprintf(buf, size, "%d", d.model.d_ff);
        break;
    case OPT_EXPERTS:
        snprintf(buf, size, "%d", d.model.experts);
        break;
    case OPT_TOP_K:
        snprintf(buf, size, "%d", d.model.top_k);
        break;
    case OPT_LAYERS:
        snprintf(buf, size, "%d", d.model.layers);
        break;
    case OPT_LORA_RANK:
        snprintf(buf, size, "%d", d.model.lora_rank);
        break;
    case OPT_LORA_ALPHA:
        snprintf(buf, size, "%g", d.model.lora_alpha);
        break;
    case OPT_SHARED_EXPERT_FF:
        snprintf(buf, size, "%d", d.model.d_ff_shared);
        break;
    case OPT_AUX_LOSS_COEFF:
        snprintf(buf, size, "%g", d.model.aux_loss_coeff);
        break;
    case OPT_AUX_LOSS_SCOPE:
        snprintf(buf, size, "%s", tm_aux_scope_name(d.model.aux_loss_scope));
        break;
    case OPT_Z_LOSS_COEFF:
        snprintf(buf, size, "%g", d.model.z_loss_coeff);
        break;
    case OPT_CAPACITY_FACTOR:
        snprintf(buf, size, "%g", d.model.capacity_factor);
        break;
    case OPT_FP32_MASTER:
    case OPT_QUIET:
    case OPT_PRINT_LAYOUT:
    case OPT_OVERLAP:
        snprintf(buf, size, "off");
        break;
    case OPT_BUCKET_BYTES:
        snprintf(buf, size, "%zu", d.bucket_bytes);
        break;
    case OPT_FRAMEWORK:
        snprintf(buf, size, "%s", seldp_framework_name(d.grid.framework));
        break;
    case OPT_TP:
        snprintf(buf, size, "%d", d.grid.tp);
        break;
    case OPT_PP:
        snprintf(buf, size, "%d", d.grid.pp);
        break;
    case OPT_CP:
        snprintf(buf, size, "%d", d.grid.cp);
        break;
    case OPT_ETP:
        snprintf(buf, size, "the framework's: Megatron tp, DeepSpeed and torchtitan 1");
        break;
    default:
        buf[0] = '\0';
    }
}

/* Print `text` from column `indent`, wrapped at 100 columns; the first line continues what
 * is already printed up to column `at`. */
static void print_wrapped(FILE *out, const char *text, int at, int indent)
{
    int col = at;
    while (*text) {
        const char *space = strchr(text, ' ');
        int word = space ? (int)(space - text) : (int)strlen(text);
        if (col > indent && col + 1 + word > 100) {
            fprintf(out, "\n%*s", indent, "");
            col = indent;
        } else if (col > indent) {
            fputc(' ', out);
            col++;
        } else {
            while (col < indent) {
                fputc(' ', out);
                col++;
            }
        }
        for (int i = 0; i < word; i++)
            fputc(text[i] == '\x01' ? ' ' : text[i], out);
        col += word;
        text += word;
        while (*text == ' ')
            text++;
    }
    fputc('\n', out);
}

void hx_options_usage(FILE *out)
{
    fprintf(out,
            "usage: seldp-harness [options]\n"
            "\n"
            "Runs tiny-moe training steps on simulated ranks (one thread each; under mpirun one\n"
            "process each, e.g. mpirun -np 4 seldp-harness): the shared parameters replicated\n"
            "over the world, each expert over its expert-data group, tokens dispatched to expert\n"
            "owners by alltoallv. Checks every reduced gradient on every rank against an FP64\n"
            "reference of the global loss, and the replicas (SPEC section 5).\n"
            "Exit status: 0 every check passed, 1 a check or the run failed, 2 bad options or "
            "layout.\n\n");
    for (size_t i = 0; i < N_DOCS; i++) {
        char left[64], def[128], text[512];
        snprintf(left, sizeof left, "--%s%s%s", docs[i].opt.name, docs[i].metavar ? " " : "",
                 docs[i].metavar ? docs[i].metavar : "");
        default_text(docs[i].opt.val, def, sizeof def);
        if (def[0])
            /* \x01: a space the wrapping keeps, so "[default: X]" stays on one line */
            snprintf(text, sizeof text, "%s [default:\x01%s]", docs[i].help, def);
        else
            snprintf(text, sizeof text, "%s", docs[i].help);
        int at = fprintf(out, "  %-30s", left);
        print_wrapped(out, text, at, 33);
    }
    fprintf(out, "\nexample: seldp-harness --world 8 --ep 4 --order ep-dp --dtype bf16\n");
}

static bool parse_int(const char *text, long min, long max, long *out)
{
    char *end = NULL;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0' || v < min || v > max)
        return false;
    *out = v;
    return true;
}

static bool parse_double(const char *text, double min, double max, double *out)
{
    char *end = NULL;
    errno = 0;
    double v = strtod(text, &end);
    if (errno != 0 || end == text || *end != '\0' || !isfinite(v) || v < min || v > max)
        return false;
    *out = v;
    return true;
}

static bool parse_seed(const char *text, uint64_t *out)
{
    char *end = NULL;
    errno = 0;
    if (text[0] == '-')
        return false;
    unsigned long long v = strtoull(text, &end, 0);
    if (errno != 0 || end == text || *end != '\0')
        return false;
    *out = v;
    return true;
}

/* A Megatron order string naming each of tp, cp, ep, dp and pp once (the harness asks for
 * all five so that a typo is not read as a size-1 dimension). */
static bool is_full_megatron_order(const char *order)
{
    static const char *const tokens[] = {"tp", "cp", "ep", "dp", "pp"};
    if (strlen(order) != 14)
        return false;
    unsigned seen = 0;
    for (int i = 0; i < 5; i++) {
        if (i < 4 && order[3 * i + 2] != '-')
            return false;
        int id = -1;
        for (int t = 0; t < 5; t++)
            if (strncasecmp(order + 3 * i, tokens[t], 2) == 0)
                id = t;
        if (id < 0 || seen & (1u << id))
            return false;
        seen |= 1u << id;
    }
    return true;
}

hx_parse_result hx_options_parse(int argc, char **argv, hx_options *o, FILE *out, FILE *err)
{
    struct option longopts[N_DOCS + 1];
    for (size_t i = 0; i < N_DOCS; i++)
        longopts[i] = docs[i].opt;
    longopts[N_DOCS] = (struct option){0};
    optind = 0; /* glibc: 0 re-initializes getopt, so the parser may run more than once */
    opterr = 0;
    for (;;) {
        int prev = optind ? optind : 1;
        int c = getopt_long(argc, argv, ":", longopts, NULL);
        if (c == -1)
            break;
        const char *arg = optarg;
        const char *name = NULL;
        for (size_t i = 0; i < N_DOCS; i++)
            if (docs[i].opt.val == c)
                name = docs[i].opt.name;
        long v = 0;
        double x = 0;
        bool ok = true;
        const char *expected = NULL;
        switch (c) {
        case OPT_WORLD:
            ok = parse_int(arg, 1, 4096, &v);
            expected = "an integer in 1..4096";
            o->world = (int)v;
            o->world_given = true;
            break;
        case OPT_EP:
            ok = parse_int(arg, 1, 4096, &v);
            expected = "an integer in 1..4096";
            o->ep = (int)v;
            o->ep_given = true;
            break;
        case OPT_ORDER:
            expected = "ep-dp or dp-ep, or a Megatron order naming tp, cp, ep, dp and pp once "
                       "each (e.g. tp-cp-ep-dp-pp)";
            o->order_given = true;
            o->grid.order = arg;
            if (strcasecmp(arg, "ep-dp") == 0) {
                o->order = HX_ORDER_EP_DP;
                o->grid.order = "ep-dp";
            } else if (strcasecmp(arg, "dp-ep") == 0) {
                o->order = HX_ORDER_DP_EP;
                o->grid.order = "dp-ep";
            } else {
                ok = is_full_megatron_order(arg);
            }
            break;
        case OPT_FRAMEWORK:
            expected = "megatron, megatron-0.9, deepspeed or torchtitan";
            ok = seldp_framework_parse(arg, &o->grid.framework) == SELDP_OK;
            o->grid.framework_given = true;
            o->grid_given = true;
            break;
        case OPT_TP:
        case OPT_PP:
        case OPT_CP:
        case OPT_ETP: {
            ok = parse_int(arg, 1, 4096, &v);
            expected = "an integer in 1..4096";
            int *field = c == OPT_TP   ? &o->grid.tp
                         : c == OPT_PP ? &o->grid.pp
                         : c == OPT_CP ? &o->grid.cp
                                       : &o->grid.etp;
            *field = (int)v;
            o->grid_given = true;
            break;
        }
        case OPT_PRINT_LAYOUT:
            o->print_layout = true;
            break;
        case OPT_LAYOUT_FILE:
            o->layout_file = arg;
            ok = arg[0] != '\0';
            expected = "a file name";
            break;
        case OPT_ROOTS:
            expected = "first, last or spread";
            if (strcasecmp(arg, "first") == 0)
                o->roots = HX_ROOTS_FIRST;
            else if (strcasecmp(arg, "last") == 0)
                o->roots = HX_ROOTS_LAST;
            else if (strcasecmp(arg, "spread") == 0)
                o->roots = HX_ROOTS_SPREAD;
            else
                ok = false;
            break;
        case OPT_DTYPE:
            ok = tm_dtype_parse(arg, &o->model.dtype);
            expected = "f32, bf16 or f16";
            break;
        case OPT_QUANT:
            ok = tm_quant_parse(arg, &o->model.quant);
            expected = "none, nf4 or awq";
            break;
        case OPT_EXPERT_REDUCE:
            expected = "sum or mean";
            if (strcasecmp(arg, "sum") == 0)
                o->flow = HX_FLOW_SUM;
            else if (strcasecmp(arg, "mean") == 0)
                o->flow = HX_FLOW_MEAN;
            else
                ok = false;
            break;
        case OPT_FP32_MASTER:
            o->fp32_master = true;
            break;
        case OPT_OVERLAP:
            o->overlap = true;
            break;
        case OPT_BUCKET_BYTES:
            ok = parse_int(arg, 0, 1L << 30, &v);
            expected = "an integer in 0..1073741824 (0: the library's default)";
            o->bucket_bytes = (size_t)v;
            break;
        case OPT_POLICY:
            expected = "error or zero";
            if (strcasecmp(arg, "error") == 0)
                o->policy = SELDP_MISSING_ERROR;
            else if (strcasecmp(arg, "zero") == 0)
                o->policy = SELDP_MISSING_ZERO;
            else
                ok = false;
            break;
        case OPT_STEPS:
            ok = parse_int(arg, 0, 100000, &v);
            expected = "an integer in 0..100000";
            o->steps = (int)v;
            break;
        case OPT_TOKENS:
            ok = parse_int(arg, 1, 1 << 20, &v);
            expected = "an integer in 1..1048576";
            o->tokens = (int)v;
            o->tokens_given = true;
            break;
        case OPT_TOKEN_SPREAD:
            ok = parse_int(arg, 0, 1 << 20, &v);
            expected = "a non-negative integer";
            o->token_spread = (int)v;
            o->tokens_given = true;
            break;
        case OPT_LR:
            ok = parse_double(arg, 0.0, 1e6, &x);
            expected = "a number >= 0";
            o->lr = x;
            break;
        case OPT_CLIP_GRAD:
            ok = parse_double(arg, 0.0, 1e30, &x);
            expected = "a number >= 0 (0: no clipping)";
            o->clip_grad = x;
            break;
        case OPT_SEED:
            ok = parse_seed(arg, &o->model.seed);
            expected = "an unsigned 64-bit integer";
            break;
        case OPT_BACKEND:
            ok = hx_backend_parse(arg, &o->backend);
            expected = "auto, host, nccl or mpi";
            break;
        case OPT_OUT:
            o->out_dir = strcmp(arg, "none") == 0 ? "" : arg;
            break;
        case OPT_DUMP:
            o->dump_dir = arg;
            ok = arg[0] != '\0';
            expected = "a directory";
            break;
        case OPT_SUMMARY:
            o->summary = arg;
            ok = arg[0] != '\0';
            expected = "a file name";
            break;
        case OPT_QUIET:
            o->quiet = true;
            break;
        case OPT_TIMEOUT:
            ok = parse_double(arg, 0.001, 1e6, &x);
            expected = "seconds > 0";
            o->timeout_s = x;
            break;
        case OPT_INJECT:
            expected = "none, grad, replica or absent (defects the checks must catch), fail (an "
                       "error that must stop every rank), or ep-scale, rank-mean, world-div, "
                       "tied-twice or local-aux (framework bugs)";
            ok = false;
            for (int f = 0; f < HX_FAULT_COUNT; f++) {
                if (strcasecmp(arg, hx_fault_name((hx_fault)f)) == 0) {
                    o->inject = (hx_fault)f;
                    ok = true;
                }
            }
            break;
        case OPT_VOCAB:
        case OPT_D_MODEL:
        case OPT_D_FF:
        case OPT_EXPERTS:
        case OPT_TOP_K:
        case OPT_LAYERS:
        case OPT_LORA_RANK: {
            ok = parse_int(arg, 1, 1 << 16, &v);
            expected = "an integer in 1..65536";
            int *field = c == OPT_VOCAB     ? &o->model.vocab
                         : c == OPT_D_MODEL ? &o->model.d_model
                         : c == OPT_D_FF    ? &o->model.d_ff
                         : c == OPT_EXPERTS ? &o->model.experts
                         : c == OPT_TOP_K   ? &o->model.top_k
                         : c == OPT_LAYERS  ? &o->model.layers
                                            : &o->model.lora_rank;
            *field = (int)v;
            o->experts_given = o->experts_given || c == OPT_EXPERTS;
            break;
        }
        case OPT_LORA_ALPHA:
            ok = parse_double(arg, 1e-6, 1e6, &x);
            expected = "a number > 0";
            o->model.lora_alpha = x;
            break;
        case OPT_SHARED_EXPERT_FF:
            ok = parse_int(arg, 0, 1 << 16, &v);
            expected = "an integer in 0..65536";
            o->model.d_ff_shared = (int)v;
            break;
        case OPT_AUX_LOSS_COEFF:
        case OPT_Z_LOSS_COEFF:
        case OPT_CAPACITY_FACTOR:
            ok = parse_double(arg, 0.0, 1e6, &x);
            expected = "a number >= 0 (0: off)";
            *(c == OPT_AUX_LOSS_COEFF ? &o->model.aux_loss_coeff
              : c == OPT_Z_LOSS_COEFF ? &o->model.z_loss_coeff
                                      : &o->model.capacity_factor) = x;
            break;
        case OPT_AUX_LOSS_SCOPE:
            ok = tm_aux_scope_parse(arg, &o->model.aux_loss_scope);
            expected = "global or local";
            break;
        case OPT_GLOBAL_BATCH:
            ok = parse_int(arg, 1, 1 << 24, &v);
            expected = "an integer in 1..16777216";
            o->global_batch = (int)v;
            break;
        case OPT_SAVE:
        case OPT_RESUME:
            ok = arg[0] != '\0';
            expected = "a directory";
            *(c == OPT_SAVE ? &o->save_dir : &o->resume_dir) = arg;
            break;
        case OPT_SAVE_EVERY:
            ok = parse_int(arg, 0, 100000, &v);
            expected = "an integer in 0..100000";
            o->save_every = (int)v;
            break;
        case OPT_SWEEP:
            o->sweep = arg;
            ok = arg[0] != '\0';
            expected = "a sweep file or a preset (ep, frameworks, worlds, worlds-32)";
            break;
        case OPT_HELP:
            hx_options_usage(out);
            return HX_PARSE_EXIT;
        case OPT_VERSION:
            fprintf(out, "seldp-harness %s\n", seldp_version());
            return HX_PARSE_EXIT;
        case ':':
            fprintf(err, "seldp-harness: option '%s' needs a value (see --help)\n", argv[prev]);
            return HX_PARSE_ERROR;
        default:
            fprintf(err, "seldp-harness: unknown option '%s' (see --help)\n", argv[prev]);
            return HX_PARSE_ERROR;
        }
        if (!ok) {
            fprintf(err, "seldp-harness: --%s '%s': expected %s\n", name, arg, expected);
            return HX_PARSE_ERROR;
        }
    }
    if (o->layout_file && o->grid_given) {
        fprintf(err,
                "seldp-harness: --layout-file and --framework/--tp/--pp/--cp/--etp exclude each "
                "other: the layout file lists the groups\n");
        return HX_PARSE_ERROR;
    }
    if (o->inject == HX_FAULT_LOCAL_AUX &&
        (!(o->model.aux_loss_coeff > 0.0) || o->model.aux_loss_scope != TM_AUX_GLOBAL)) {
        fprintf(err,
                "seldp-harness: --inject local-aux: expected --aux-loss-coeff > 0 with "
                "--aux-loss-scope global (the bug normalizes the global load-balancing "
                "statistics locally; this run has %s)\n",
                o->model.aux_loss_coeff > 0.0 ? "--aux-loss-scope local"
                                              : "no load-balancing loss");
        return HX_PARSE_ERROR;
    }
    if (optind < argc) {
        fprintf(err,
                "seldp-harness: unexpected argument '%s' (options start with --; see "
                "--help)\n",
                argv[optind]);
        return HX_PARSE_ERROR;
    }
    return HX_PARSE_RUN;
}
