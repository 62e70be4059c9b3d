/* --from-megatron "ARGS": a Megatron-LM or Megatron-DeepSpeed command line as harness options
 * (import.h; docs/harness-interop.md lists the keys).
 *
 * The text is split as a shell splits it (quotes, backslashes, line continuations, # comments),
 * a launcher in front (torchrun, python -m torch.distributed.run, deepspeed) gives the world
 * (processes per node x nodes), and what follows the training script is read as argparse
 * reads Megatron's arguments: --key value..., --key=value, flags, the last of a repeated key.
 * The defaults are the frameworks' own: Megatron-LM megatron/training/arguments.py and
 * megatron/core/transformer/transformer_config.py (NVIDIA/Megatron-LM d98e8a64), and
 * Megatron-DeepSpeed megatron/arguments.py (deepspeedai/Megatron-DeepSpeed 4efb479d): top-k 1,
 * --moe-loss-coeff 0.1 and capacity factor 1.0 with token dropping there. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "import.h"
#include "util.h"

#define MG_MAX_WORDS  4096
#define MG_MAX_VALUES 64

/* ---- splitting the text as a shell does -------------------------------------------------- */

typedef struct words {
    char **w;
    int n;
} words;

static void words_free(words *ws)
{
    for (int i = 0; i < ws->n; i++)
        free(ws->w[i]);
    free(ws->w);
    *ws = (words){0};
}

static seldp_status words_push(words *ws, hx_buf *b)
{
    if (ws->n >= MG_MAX_WORDS)
        return hx_fail(SELDP_ERR_INVALID_ARGUMENT,
                       "--from-megatron: more than %d words; is this one command line?",
                       MG_MAX_WORDS);
    if (!hx_buf_ok(b))
        return hx_fail(SELDP_ERR_NOMEM, "out of memory");
    char **grown = realloc(ws->w, (size_t)(ws->n + 1) * sizeof *grown);
    if (!grown)
        return hx_fail(SELDP_ERR_NOMEM, "out of memory");
    ws->w = grown;
    ws->w[ws->n++] = b->data;
    *b = (hx_buf){0};
    return SELDP_OK;
}

static seldp_status split_words(const char *text, words *ws)
{
    seldp_status st = SELDP_OK;
    hx_buf b = {0};
    bool in_word = false;
    for (const char *p = text; *p; p++) {
        char c = *p;
        if (c == '\\') {
            if (p[1] == '\n') { /* a line continuation */
                p++;
                continue;
            }
            if (p[1] == '\0')
                HX_FAIL(SELDP_ERR_INVALID_ARGUMENT, "--from-megatron: a backslash ends the text");
            hx_buf_append(&b, ++p, 1);
            in_word = true;
            continue;
        }
        if (c == '\'' || c == '"') {
            const char *start = p;
            in_word = true;
            hx_buf_append(&b, "", 0);
            for (p++; *p && *p != c; p++) {
                if (c == '"' && *p == '\\' && p[1] && strchr("\"\\$`\n", p[1])) {
                    if (p[1] != '\n')
                        hx_buf_append(&b, p + 1, 1);
                    p++;
                    continue;
                }
                hx_buf_append(&b, p, 1);
            }
            if (!*p) {
                char shown[128], head[24];
                snprintf(head, sizeof head, "%.20s", start);
                HX_FAIL(SELDP_ERR_INVALID_ARGUMENT,
                        "--from-megatron: unterminated %s quote at \"%s\"",
                        c == '"' ? "double" : "single", hx_printable(head, shown, sizeof shown));
            }
            continue;
        }
        if (c == '#' && !in_word) { /* a comment to the end of the line */
            while (p[1] && p[1] != '\n')
                p++;
            continue;
        }
        if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
            if (in_word)
                HX_CHECK(words_push(ws, &b));
            in_word = false;
            continue;
        }
        hx_buf_append(&b, p, 1);
        in_word = true;
    }
    if (in_word)
        HX_CHECK(words_push(ws, &b));
fail:
    hx_buf_free(&b);
    return st;
}

/* ---- values ------------------------------------------------------------------------------ */

static seldp_status bad_value(const char *key, const char *value, const char *expected)
{
    char shown[256];
    return hx_fail(SELDP_ERR_INVALID_ARGUMENT, "--from-megatron: %s '%s': expected %s%s", key,
                   hx_printable(value, shown, sizeof shown), expected,
                   strchr(value, '$') ? " (a script's shell variables are not expanded here: "
                                        "give their values)"
                                      : "");
}

static seldp_status positive_int(const char *key, const char *value, long *out)
{
    char *end = NULL;
    errno = 0;
    long v = strtol(value, &end, 10);
    if (errno || end == value || *end || v < 1 || v > 1 << 24)
        return bad_value(key, value, "a positive integer");
    *out = v;
    return SELDP_OK;
}

static seldp_status number(const char *key, const char *value, double *out)
{
    char *end = NULL;
    errno = 0;
    double v = strtod(value, &end);
    if (errno || end == value || *end || !isfinite(v))
        return bad_value(key, value, "a number");
    *out = v;
    return SELDP_OK;
}

/* ---- the arguments ----------------------------------------------------------------------- */

/* How a key is read. */
typedef enum mg_kind {
    MG_SIZE,    /* a positive integer: a parallel size, a count */
    MG_NUMBER,  /* a number */
    MG_NUMBERS, /* one or more numbers (nargs='+') */
    MG_WORDS,   /* one or more words */
    MG_WORD,    /* one word */
    MG_FLAG,    /* store_true */
    MG_IGNORE   /* any values, ignored for `why` */
} mg_kind;

/* The keys the import reads, and the ones it ignores for a stated reason. */
enum {
    K_TP,
    K_PP,
    K_CP,
    K_EP,
    K_ETP,
    K_EXPERTS,
    K_TOPK,
    K_LAYERS,
    K_LB_TYPE,
    K_AUX,
    K_Z,
    K_CAPACITY,
    K_DROP_POLICY,
    K_PAD,
    K_SHARED,
    K_SHARED_GATE,
    K_FFN,
    K_MOE_FFN,
    K_HIDDEN,
    K_MBS,
    K_GBS,
    K_DIST_OPT,
    K_BF16,
    K_FP16,
    K_ACCUM_FP32,
    K_REDUCE_BF16,
    K_CLIP,
    K_TP_PP_DP,
    K_SEQ_PAR,
    /* Megatron-DeepSpeed */
    K_MDS_EP,
    K_MDS_TOPK,
    K_MDS_AUX,
    K_MDS_CAPACITY,
    K_MDS_NO_DROP,
    K_MDS_MIN_CAPACITY,
    K_MDS_ETP,
    K_MDS_DEEPSPEED,
    K_MDS_CONFIG,
    K_MDS_ZERO,
    K_MDS_MLP_TYPE,
    K_MDS_INTERVAL,
    K_COUNT
};

typedef struct mg_key {
    const char *key;
    mg_kind kind;
    int id;          /* K_*, or -1 for MG_IGNORE */
    const char *why; /* MG_IGNORE: the reason */
} mg_key;

static const mg_key keys[] = {
    {"--tensor-model-parallel-size", MG_SIZE, K_TP, NULL},
    {"--pipeline-model-parallel-size", MG_SIZE, K_PP, NULL},
    {"--context-parallel-size", MG_SIZE, K_CP, NULL},
    {"--expert-model-parallel-size", MG_SIZE, K_EP, NULL},
    {"--expert-tensor-parallel-size", MG_SIZE, K_ETP, NULL},
    {"--num-experts", MG_NUMBERS, K_EXPERTS, NULL},
    {"--moe-router-topk", MG_SIZE, K_TOPK, NULL},
    {"--num-layers", MG_SIZE, K_LAYERS, NULL},
    {"--moe-router-load-balancing-type", MG_WORDS, K_LB_TYPE, NULL},
    {"--moe-aux-loss-coeff", MG_NUMBERS, K_AUX, NULL},
    {"--moe-z-loss-coeff", MG_NUMBER, K_Z, NULL},
    {"--moe-expert-capacity-factor", MG_NUMBER, K_CAPACITY, NULL},
    {"--moe-token-drop-policy", MG_WORD, K_DROP_POLICY, NULL},
    {"--moe-pad-expert-input-to-capacity", MG_FLAG, K_PAD, NULL},
    {"--moe-shared-expert-intermediate-size", MG_SIZE, K_SHARED, NULL},
    {"--moe-shared-expert-gate", MG_FLAG, K_SHARED_GATE, NULL},
    {"--ffn-hidden-size", MG_SIZE, K_FFN, NULL},
    {"--moe-ffn-hidden-size", MG_SIZE, K_MOE_FFN, NULL},
    {"--hidden-size", MG_SIZE, K_HIDDEN, NULL},
    {"--micro-batch-size", MG_SIZE, K_MBS, NULL},
    {"--global-batch-size", MG_SIZE, K_GBS, NULL},
    {"--use-distributed-optimizer", MG_FLAG, K_DIST_OPT, NULL},
    {"--bf16", MG_FLAG, K_BF16, NULL},
    {"--fp16", MG_FLAG, K_FP16, NULL},
    {"--accumulate-allreduce-grads-in-fp32", MG_FLAG, K_ACCUM_FP32, NULL},
    {"--grad-reduce-in-bf16", MG_FLAG, K_REDUCE_BF16, NULL},
    {"--clip-grad", MG_NUMBER, K_CLIP, NULL},
    {"--use-tp-pp-dp-mapping", MG_FLAG, K_TP_PP_DP, NULL},
    {"--sequence-parallel", MG_FLAG, K_SEQ_PAR, NULL},
    {"--moe-expert-parallel-size", MG_SIZE, K_MDS_EP, NULL},
    {"--topk", MG_SIZE, K_MDS_TOPK, NULL},
    {"--moe-loss-coeff", MG_NUMBER, K_MDS_AUX, NULL},
    {"--moe-train-capacity-factor", MG_NUMBER, K_MDS_CAPACITY, NULL},
    {"--disable-moe-token-dropping", MG_FLAG, K_MDS_NO_DROP, NULL},
    {"--moe-min-capacity", MG_SIZE, K_MDS_MIN_CAPACITY, NULL},
    {"--enable-expert-tensor-parallelism", MG_FLAG, K_MDS_ETP, NULL},
    {"--deepspeed", MG_FLAG, K_MDS_DEEPSPEED, NULL},
    {"--deepspeed_config", MG_WORD, K_MDS_CONFIG, NULL},
    {"--deepspeed-config", MG_WORD, K_MDS_CONFIG, NULL},
    {"--zero-stage", MG_SIZE, K_MDS_ZERO, NULL},
    {"--mlp-type", MG_WORD, K_MDS_MLP_TYPE, NULL},
    {"--expert-interval", MG_SIZE, K_MDS_INTERVAL, NULL},
    /* ignored, with the reason a reader needs */
    {"--seq-length", MG_IGNORE, -1, "tiny-moe's tokens per rank are --tokens"},
    {"--max-position-embeddings", MG_IGNORE, -1, "tiny-moe has no position embedding"},
    {"--vocab-size", MG_IGNORE, -1, "tiny-moe keeps --vocab"},
    {"--num-attention-heads", MG_IGNORE, -1, "tiny-moe has no attention"},
    {"--num-query-groups", MG_IGNORE, -1, "tiny-moe has no attention"},
    {"--kv-channels", MG_IGNORE, -1, "tiny-moe has no attention"},
    {"--lr", MG_IGNORE, -1, "the harness trains with SGD at --lr"},
    {"--min-lr", MG_IGNORE, -1, "the harness trains with SGD at --lr"},
    {"--weight-decay", MG_IGNORE, -1, "the harness trains with SGD at --lr"},
    {"--adam-beta1", MG_IGNORE, -1, "the harness trains with SGD at --lr"},
    {"--adam-beta2", MG_IGNORE, -1, "the harness trains with SGD at --lr"},
    {"--optimizer", MG_IGNORE, -1, "the harness trains with SGD at --lr"},
    {"--train-iters", MG_IGNORE, -1, "the harness trains --steps"},
    {"--seed", MG_IGNORE, -1, "tiny-moe's weights and tokens come from --seed"},
    {"--moe-token-dispatcher-type", MG_IGNORE, -1,
     "tiny-moe dispatches by all-to-all inside the EP group whatever the dispatcher"},
    {"--moe-grouped-gemm", MG_IGNORE, -1, "a kernel choice, not a change of the gradients"},
    {"--moe-layer-freq", MG_IGNORE, -1, "every tiny-moe layer is an MoE layer"},
    {"--moe-router-score-function", MG_IGNORE, -1, "tiny-moe's router is a softmax over the top-K"},
    {"--moe-router-pre-softmax", MG_IGNORE, -1, "tiny-moe's router is a softmax over the top-K"},
    {"--moe-router-dtype", MG_IGNORE, -1, "tiny-moe's router computes in FP32"},
    {"--normalization", MG_IGNORE, -1, "tiny-moe's norms are RMSNorm"},
    {"--swiglu", MG_IGNORE, -1, "tiny-moe's experts are two-matrix MLPs"},
    {"--untie-embeddings-and-output-weights", MG_IGNORE, -1, "tiny-moe ties the embedding"},
};
#define N_KEYS (sizeof keys / sizeof keys[0])

/* What the command line said: per key its last occurrence's values. */
typedef struct mg_args {
    bool present[K_COUNT];
    const char *values[K_COUNT][MG_MAX_VALUES];
    int n_values[K_COUNT];
    const char *key_text[K_COUNT]; /* the key as written (for the sources) */
} mg_args;

/* "--key v1 v2" of an argument, for the sources and the lines. */
static void arg_text(const mg_args *a, int id, char *buf, size_t size)
{
    char shown[256];
    size_t at = (size_t)snprintf(buf, size, "%s", a->key_text[id]);
    for (int i = 0; i < a->n_values[id] && at < size; i++)
        at += (size_t)snprintf(buf + at, size - at, " %s",
                               hx_printable(a->values[id][i], shown, sizeof shown));
}

static const mg_key *find_key(const char *key)
{
    for (size_t i = 0; i < N_KEYS; i++)
        if (strcmp(keys[i].key, key) == 0)
            return &keys[i];
    return NULL;
}

/* The launcher in front of the script: torchrun's --nproc_per_node and --nnodes, the
 * deepspeed launcher's --num_gpus and --num_nodes. Returns the index of the first word after
 * the script (0 when there is no launcher). */
static seldp_status read_launcher(const words *ws, hx_import *imp, int *first)
{
    *first = 0;
    if (ws->n == 0)
        return SELDP_OK;
    const char *tool = strrchr(ws->w[0], '/') ? strrchr(ws->w[0], '/') + 1 : ws->w[0];
    bool torchrun = strcmp(tool, "torchrun") == 0, deepspeed = strcmp(tool, "deepspeed") == 0;
    bool python = strncmp(tool, "python", 6) == 0;
    long per_node = 0, nodes = 1;
    const char *per_node_text = NULL, *nodes_text = NULL;
    int i = torchrun || deepspeed || python ? 1 : 0;
    for (; i < ws->n; i++) {
        const char *w = ws->w[i];
        size_t len = strlen(w);
        if (len > 3 && strcmp(w + len - 3, ".py") == 0) {
            i++;
            break;
        }
        if (!torchrun && !deepspeed && !python)
            break;
        if (python && strcmp(w, "-m") == 0 && i + 1 < ws->n) {
            /* python -m torch.distributed.run|launch: a launcher; another module: the script */
            const char *m = ws->w[++i];
            if (strcmp(m, "torch.distributed.run") == 0 ||
                strcmp(m, "torch.distributed.launch") == 0) {
                torchrun = true;
                continue;
            }
            i++;
            break;
        }
        const char *eq = strchr(w, '=');
        char key[64];
        snprintf(key, sizeof key, "%.*s", eq ? (int)(eq - w) : (int)len, w);
        for (char *c = key; *c; c++)
            if ((unsigned char)*c < 0x20 || *c == 0x7f)
                *c = '?';
        const char *value = eq ? eq + 1 : i + 1 < ws->n ? ws->w[i + 1] : "";
        bool takes = strcmp(key, "--nproc_per_node") == 0 || strcmp(key, "--nproc-per-node") == 0 ||
                     strcmp(key, "--num_gpus") == 0 || strcmp(key, "--num-gpus") == 0;
        bool takes_nodes = strcmp(key, "--nnodes") == 0 || strcmp(key, "--num_nodes") == 0 ||
                           strcmp(key, "--num-nodes") == 0;
        if (takes || takes_nodes) {
            long v = 0;
            if (positive_int(key, value, &v) != SELDP_OK) {
                char shown[128];
                return hx_fail(SELDP_ERR_INVALID_ARGUMENT,
                               "--from-megatron: %s %s: expected a positive integer (an elastic "
                               "range or 'gpu' gives no world: give --world)",
                               key, hx_printable(value, shown, sizeof shown));
            }
            *(takes ? &per_node : &nodes) = v;
            *(takes ? &per_node_text : &nodes_text) = value;
        }
        static const char *const flags[] = {"--standalone",    "--no_python",     "--no-python",
                                            "--no_local_rank", "--no-local-rank", "--force_multi",
                                            "--no_ssh_check",  "--autotuning"};
        bool is_flag = false;
        for (size_t f = 0; f < sizeof flags / sizeof flags[0]; f++)
            is_flag = is_flag || strcmp(key, flags[f]) == 0;
        if (!eq && !is_flag && strncmp(w, "--", 2) == 0 && i + 1 < ws->n &&
            ws->w[i + 1][0] != '-' && !strstr(ws->w[i + 1], ".py"))
            i++; /* the launcher option's value */
    }
    *first = i;
    if (per_node > 0) {
        char v[32];
        snprintf(v, sizeof v, "%ld", per_node * nodes);
        return hx_import_set(imp, HX_IMPORT_MEGATRON, "world", v, false, "%s %s %s%s%s", tool,
                             torchrun ? "--nproc_per_node" : "--num_gpus", per_node_text,
                             nodes_text ? (torchrun ? " --nnodes " : " --num_nodes ") : "",
                             nodes_text ? nodes_text : "");
    }
    return SELDP_OK;
}

static seldp_status read_args(const words *ws, int first, mg_args *a, hx_import *imp)
{
    for (int i = first; i < ws->n;) {
        const char *w = ws->w[i];
        if (strncmp(w, "--", 2) != 0) {
            char shown[256];
            if (!hx_import_line(imp, HX_IMPORT_MEGATRON, "ignored '%s': not an option%s",
                                hx_printable(w, shown, sizeof shown),
                                strchr(w, '$') ? " (a script's shell variables are not expanded "
                                                 "here: give their values)"
                                               : ""))
                return hx_fail(SELDP_ERR_NOMEM, "out of memory");
            i++;
            continue;
        }
        const char *eq = strchr(w, '=');
        char key[128], shown[256];
        snprintf(key, sizeof key, "%.*s", eq ? (int)(eq - w) : (int)strlen(w), w);
        for (char *c = key; *c; c++) /* a quoted key may hold anything: one line of it */
            if ((unsigned char)*c < 0x20 || *c == 0x7f)
                *c = '?';
        const mg_key *k = find_key(key);
        const char *values[MG_MAX_VALUES];
        int n = 0;
        if (eq)
            values[n++] = eq + 1;
        i++;
        bool flag = k && k->kind == MG_FLAG;
        while (!flag && !eq && i < ws->n && strncmp(ws->w[i], "--", 2) != 0) {
            if (n == MG_MAX_VALUES)
                return hx_fail(SELDP_ERR_INVALID_ARGUMENT,
                               "--from-megatron: %s: more than %d "
                               "values",
                               key, MG_MAX_VALUES);
            values[n++] = ws->w[i++];
        }
        if (!k || k->kind == MG_IGNORE) {
            hx_buf b = {0};
            hx_buf_puts(&b, key);
            for (int v = 0; v < n; v++)
                hx_buf_printf(&b, " %s", hx_printable(values[v], shown, sizeof shown));
            bool ok =
                hx_buf_ok(&b) && hx_import_line(imp, HX_IMPORT_MEGATRON, "ignored %s: %s",
                                                hx_buf_str(&b), k ? k->why : "no tiny-moe setting");
            hx_buf_free(&b);
            if (!ok)
                return hx_fail(SELDP_ERR_NOMEM, "out of memory");
            continue;
        }
        if (flag && eq)
            return hx_fail(SELDP_ERR_INVALID_ARGUMENT, "--from-megatron: %s takes no value",
                           hx_printable(w, shown, sizeof shown));
        bool one = k->kind == MG_SIZE || k->kind == MG_NUMBER || k->kind == MG_WORD;
        if (!flag && (n == 0 || (one && n != 1)))
            return hx_fail(SELDP_ERR_INVALID_ARGUMENT,
                           "--from-megatron: %s: expected %s, found "
                           "%d values",
                           key, one ? "one value" : "one or more values", n);
        a->present[k->id] = true;
        a->key_text[k->id] = k->key;
        a->n_values[k->id] = n;
        for (int v = 0; v < n; v++)
            a->values[k->id][v] = values[v];
        if (flag && i < ws->n && strncmp(ws->w[i], "--", 2) != 0) {
            if (!hx_import_line(imp, HX_IMPORT_MEGATRON,
                                "ignored '%s' after %s (a flag takes "
                                "no value)",
                                hx_printable(ws->w[i], shown, sizeof shown), key))
                return hx_fail(SELDP_ERR_NOMEM, "out of memory");
            i++;
        }
    }
    return SELDP_OK;
}

/* ---- the mapping ------------------------------------------------------------------------- */

static seldp_status set_size(hx_import *imp, const mg_args *a, int id, const char *option,
                             long *out)
{
    char text[256], v[32];
    long x = 0;
    seldp_status st = positive_int(a->key_text[id], a->values[id][0], &x);
    if (st != SELDP_OK)
        return st;
    if (out)
        *out = x;
    if (!option)
        return SELDP_OK;
    arg_text(a, id, text, sizeof text);
    snprintf(v, sizeof v, "%ld", x);
    return hx_import_set(imp, HX_IMPORT_MEGATRON, option, v, false, "%s", text);
}

static seldp_status set_number(hx_import *imp, const mg_args *a, int id, int index,
                               const char *option, double *out)
{
    char text[256], v[48];
    double x = 0;
    seldp_status st = number(a->key_text[id], a->values[id][index], &x);
    if (st != SELDP_OK)
        return st;
    if (out)
        *out = x;
    if (!option)
        return SELDP_OK;
    arg_text(a, id, text, sizeof text);
    snprintf(v, sizeof v, "%.17g", x);
    return hx_import_set(imp, HX_IMPORT_MEGATRON, option, v, false, "%s", text);
}

static bool line(hx_import *imp, const char *fmt, const char *a, const char *b)
{
    return hx_import_line(imp, HX_IMPORT_MEGATRON, fmt, a, b);
}

/* The router losses: Megatron's load-balancing types with their coefficients. */
static seldp_status map_router(hx_import *imp, const mg_args *a)
{
    seldp_status st = SELDP_OK;
    char text[256], v[48];
    int n_types = a->present[K_LB_TYPE] ? a->n_values[K_LB_TYPE] : 1;
    int n_coeffs = a->present[K_AUX] ? a->n_values[K_AUX] : 0;
    if (a->present[K_AUX] && n_types != n_coeffs && (n_types > 1 || n_coeffs > 1))
        return hx_fail(SELDP_ERR_INVALID_ARGUMENT,
                       "--from-megatron: --moe-aux-loss-coeff: %d values for %d load-balancing "
                       "types: moe_aux_loss_coeff must be a list of the same length as "
                       "moe_router_load_balancing_type",
                       n_coeffs, n_types);
    bool applied = false;
    for (int t = 0; t < n_types; t++) {
        const char *type = a->present[K_LB_TYPE] ? a->values[K_LB_TYPE][t] : "aux_loss";
        double coeff = 0;
        if (a->present[K_AUX])
            HX_CHECK(
                number("--moe-aux-loss-coeff", a->values[K_AUX][n_coeffs > 1 ? t : 0], &coeff));
        bool known = strcmp(type, "aux_loss") == 0 || strcmp(type, "global_aux_loss") == 0 ||
                     strcmp(type, "seq_aux_loss") == 0 || strcmp(type, "sinkhorn") == 0 ||
                     strcmp(type, "quantile_balancing") == 0 || strcmp(type, "none") == 0;
        if (!known)
            return bad_value("--moe-router-load-balancing-type", type,
                             "aux_loss, seq_aux_loss, global_aux_loss, sinkhorn, "
                             "quantile_balancing or none");
        if (coeff < 0)
            return bad_value("--moe-aux-loss-coeff", a->values[K_AUX][0], "a number >= 0");
        if (!(coeff > 0))
            continue;
        bool global = strcmp(type, "global_aux_loss") == 0;
        if (!global && strcmp(type, "aux_loss") != 0) {
            snprintf(text, sizeof text, "%s with --moe-aux-loss-coeff %g", type, coeff);
            if (!line(imp, "ignored --moe-router-load-balancing-type %s: %s", text,
                      "tiny-moe's load-balancing loss is Switch/GShard's over a data shard "
                      "(aux_loss) or the global batch (global_aux_loss)"))
                return hx_fail(SELDP_ERR_NOMEM, "out of memory");
            continue;
        }
        if (applied) {
            snprintf(text, sizeof text, "%s %g", type, coeff);
            if (!line(imp, "ignored the second load-balancing loss %s%s", text,
                      ": tiny-moe has one"))
                return hx_fail(SELDP_ERR_NOMEM, "out of memory");
            continue;
        }
        applied = true;
        snprintf(v, sizeof v, "%.17g", coeff);
        HX_CHECK(hx_import_set(imp, HX_IMPORT_MEGATRON, "aux-loss-coeff", v, false,
                               "--moe-aux-loss-coeff %g (%s)", coeff, type));
        /* aux_loss: the counts of the micro-batch's data shard (the TP x CP group) */
        HX_CHECK(hx_import_set(imp, HX_IMPORT_MEGATRON, "aux-loss-scope",
                               global ? "global" : "local", false,
                               "--moe-router-load-balancing-type %s", type));
    }
fail:
    return st;
}

static seldp_status map_capacity(hx_import *imp, const mg_args *a)
{
    seldp_status st = SELDP_OK;
    double cf = 0;
    if (!a->present[K_CAPACITY])
        return SELDP_OK;
    HX_CHECK(number("--moe-expert-capacity-factor", a->values[K_CAPACITY][0], &cf));
    if (cf < 0) /* TransformerConfig: a negative factor is None, no capacity */
        return line(imp, "%s %s: a negative factor is no capacity (dropless), as Megatron reads it",
                    "--moe-expert-capacity-factor", a->values[K_CAPACITY][0])
                   ? SELDP_OK
                   : hx_fail(SELDP_ERR_NOMEM, "out of memory");
    HX_CHECK(set_number(imp, a, K_CAPACITY, 0, "capacity-factor", NULL));
    const char *policy = a->present[K_DROP_POLICY] ? a->values[K_DROP_POLICY][0] : "probs";
    if (strcmp(policy, "probs") != 0 && strcmp(policy, "position") != 0)
        return bad_value("--moe-token-drop-policy", policy, "probs or position");
    if (strcmp(policy, "probs") == 0 &&
        !line(imp, "ignored --moe-token-drop-policy %s%s", policy,
              " (Megatron's default): tiny-moe drops the assignments beyond capacity in token "
              "order (position), so the dropped ones may differ"))
        return hx_fail(SELDP_ERR_NOMEM, "out of memory");
fail:
    return st;
}

static seldp_status map_dtype(hx_import *imp, const mg_args *a)
{
    if (a->present[K_BF16] && a->present[K_FP16])
        return hx_fail(SELDP_ERR_INVALID_ARGUMENT,
                       "--from-megatron: --bf16 and --fp16 contradict each other (Megatron "
                       "asserts not args.fp16 under --bf16)");
    if (hx_import_given(imp, "dtype"))
        return SELDP_OK; /* --dtype decides --fp32-master with it */
    seldp_status st = SELDP_OK;
    if (a->present[K_BF16]) {
        /* bf16 accumulates and all-reduces the gradients in FP32 unless told otherwise */
        HX_CHECK(hx_import_set(imp, HX_IMPORT_MEGATRON, "dtype", "bf16", false, "--bf16"));
        if (!a->present[K_REDUCE_BF16])
            HX_CHECK(hx_import_set(imp, HX_IMPORT_MEGATRON, "fp32-master", "", false,
                                   "--bf16 (gradients accumulated and all-reduced in FP32, FP32 "
                                   "main parameters)"));
    } else if (a->present[K_FP16]) {
        HX_CHECK(hx_import_set(imp, HX_IMPORT_MEGATRON, "dtype", "f16", false, "--fp16"));
        if (a->present[K_ACCUM_FP32])
            HX_CHECK(hx_import_set(imp, HX_IMPORT_MEGATRON, "fp32-master", "", false,
                                   "--fp16 --accumulate-allreduce-grads-in-fp32"));
    } else {
        HX_CHECK(hx_import_set(imp, HX_IMPORT_MEGATRON, "dtype", "f32", true,
                               "neither --bf16 nor --fp16 (Megatron trains in FP32)"));
    }
fail:
    return st;
}

/* Megatron-DeepSpeed's MoE keys (DeepSpeed's MoE layer under Megatron's arguments). */
static seldp_status map_mds(hx_import *imp, const mg_args *a, bool moe)
{
    seldp_status st = SELDP_OK;
    char text[256];
    HX_CHECK(
        hx_import_set(imp, HX_IMPORT_MEGATRON, "framework", "deepspeed", false, "%s",
                      a->present[K_MDS_DEEPSPEED] ? "--deepspeed" : "--moe-expert-parallel-size"));
    if (a->present[K_MDS_EP])
        HX_CHECK(set_size(imp, a, K_MDS_EP, "ep", NULL));
    /* experts whole on every rank, or split over the whole tensor-parallel group (the etp
     * setting waits for the resolved tp: hx_import_megatron_finish) */
    imp->megatron.mds_etp = a->present[K_MDS_ETP];
    if (!a->present[K_MDS_ETP])
        HX_CHECK(hx_import_set(imp, HX_IMPORT_MEGATRON, "etp", "1", true,
                               "no --enable-expert-tensor-parallelism"));
    if (a->present[K_MDS_TOPK])
        HX_CHECK(set_size(imp, a, K_MDS_TOPK, "top-k", NULL));
    else if (moe)
        HX_CHECK(hx_import_set(imp, HX_IMPORT_MEGATRON, "top-k", "1", true,
                               "no --topk "
                               "(default 1)"));
    if (moe) {
        if (a->present[K_MDS_AUX])
            HX_CHECK(set_number(imp, a, K_MDS_AUX, 0, "aux-loss-coeff", NULL));
        else
            HX_CHECK(hx_import_set(imp, HX_IMPORT_MEGATRON, "aux-loss-coeff", "0.1", true,
                                   "no --moe-loss-coeff (default 0.1)"));
        /* DeepSpeed's gating computes l_aux over the rank's own tokens */
        HX_CHECK(hx_import_set(imp, HX_IMPORT_MEGATRON, "aux-loss-scope", "local", true,
                               "DeepSpeed's l_aux over each rank's tokens"));
        if (a->present[K_MDS_NO_DROP])
            HX_CHECK(hx_import_set(imp, HX_IMPORT_MEGATRON, "capacity-factor", "0", false,
                                   "--disable-moe-token-dropping"));
        else if (a->present[K_MDS_CAPACITY])
            HX_CHECK(set_number(imp, a, K_MDS_CAPACITY, 0, "capacity-factor", NULL));
        else
            HX_CHECK(hx_import_set(imp, HX_IMPORT_MEGATRON, "capacity-factor", "1", true,
                                   "no --moe-train-capacity-factor (default 1.0, dropping)"));
        if (!a->present[K_MDS_NO_DROP] &&
            !hx_import_line(imp, HX_IMPORT_MEGATRON,
                            "note: DeepSpeed's top-1 gating drops by random token selection and "
                            "keeps --moe-min-capacity (default 4); tiny-moe drops in token order "
                            "with no minimum"))
            return hx_fail(SELDP_ERR_NOMEM, "out of memory");
    }
    static const int ignored[] = {K_MDS_CONFIG, K_MDS_ZERO, K_MDS_MLP_TYPE, K_MDS_INTERVAL,
                                  K_MDS_MIN_CAPACITY};
    static const char *const why[] = {
        "pass the ds_config itself with --from-deepspeed FILE",
        "the ZeRO stage is the ds_config's zero_optimization.stage (--from-deepspeed)",
        "PR-MoE's residual MLP has a learned coefficient; tiny-moe's shared expert is ungated",
        "every tiny-moe layer is an MoE layer", "tiny-moe has no minimum capacity"};
    for (size_t i = 0; i < sizeof ignored / sizeof ignored[0]; i++) {
        if (!a->present[ignored[i]])
            continue;
        arg_text(a, ignored[i], text, sizeof text);
        if (!line(imp, "ignored %s: %s", text, why[i]))
            return hx_fail(SELDP_ERR_NOMEM, "out of memory");
    }
fail:
    return st;
}

static seldp_status map_args(hx_import *imp, const mg_args *a)
{
    seldp_status st = SELDP_OK;
    char text[256];
    bool mds = a->present[K_MDS_DEEPSPEED] || a->present[K_MDS_EP] || a->present[K_MDS_TOPK] ||
               a->present[K_MDS_AUX] || a->present[K_MDS_CONFIG];
    imp->megatron.mds = mds;
    if (mds && (a->present[K_EP] || a->present[K_TOPK]))
        return hx_fail(SELDP_ERR_INVALID_ARGUMENT,
                       "--from-megatron: %s is Megatron-LM's and --deepspeed/--moe-expert-"
                       "parallel-size Megatron-DeepSpeed's: which framework's command line is it?",
                       a->present[K_EP] ? "--expert-model-parallel-size" : "--moe-router-topk");
    if (!mds)
        HX_CHECK(hx_import_set(imp, HX_IMPORT_MEGATRON, "framework", "megatron", false,
                               "a Megatron-LM command line"));
    HX_CHECK(a->present[K_TP] ? set_size(imp, a, K_TP, "tp", NULL) : SELDP_OK);
    HX_CHECK(a->present[K_PP] ? set_size(imp, a, K_PP, "pp", NULL) : SELDP_OK);
    HX_CHECK(a->present[K_CP] ? set_size(imp, a, K_CP, "cp", NULL) : SELDP_OK);
    HX_CHECK(a->present[K_EP] ? set_size(imp, a, K_EP, "ep", NULL) : SELDP_OK);
    HX_CHECK(a->present[K_ETP] ? set_size(imp, a, K_ETP, "etp", NULL) : SELDP_OK);
    HX_CHECK(a->present[K_LAYERS] ? set_size(imp, a, K_LAYERS, "layers", NULL) : SELDP_OK);
    if (a->present[K_TP_PP_DP])
        HX_CHECK(hx_import_set(imp, HX_IMPORT_MEGATRON, "order", "tp-cp-ep-pp-dp", false,
                               "--use-tp-pp-dp-mapping"));
    /* experts: Megatron-LM one count (none: a dense model); Megatron-DeepSpeed a list */
    bool moe = false;
    if (a->present[K_EXPERTS]) {
        long first = 0, x = 0;
        bool uniform = true;
        for (int i = 0; i < a->n_values[K_EXPERTS]; i++) {
            HX_CHECK(positive_int("--num-experts", a->values[K_EXPERTS][i], &x));
            uniform = uniform && (i == 0 || x == first);
            first = i == 0 ? x : first;
        }
        if (!mds && a->n_values[K_EXPERTS] != 1)
            return hx_fail(SELDP_ERR_INVALID_ARGUMENT,
                           "--from-megatron: --num-experts: Megatron-LM takes one count");
        arg_text(a, K_EXPERTS, text, sizeof text);
        if (!uniform) {
            if (!line(imp, "ignored %s: %s", text,
                      "a pyramid of expert counts (PR-MoE); tiny-moe has one count for every "
                      "layer"))
                return hx_fail(SELDP_ERR_NOMEM, "out of memory");
        } else {
            char v[32];
            snprintf(v, sizeof v, "%ld", first);
            HX_CHECK(hx_import_set(imp, HX_IMPORT_MEGATRON, "experts", v, false, "%s", text));
            moe = first > 1;
        }
    } else if (!hx_import_line(imp, HX_IMPORT_MEGATRON,
                               "no --num-experts: the model is dense; tiny-moe keeps its experts "
                               "(--experts)")) {
        return hx_fail(SELDP_ERR_NOMEM, "out of memory");
    }
    if (mds) {
        HX_CHECK(map_mds(imp, a, moe));
    } else {
        HX_CHECK(a->present[K_TOPK] ? set_size(imp, a, K_TOPK, "top-k", NULL) : SELDP_OK);
        if (a->present[K_Z])
            HX_CHECK(set_number(imp, a, K_Z, 0, "z-loss-coeff", NULL));
        HX_CHECK(map_router(imp, a));
        HX_CHECK(map_capacity(imp, a));
        if (a->present[K_PAD] && !line(imp, "ignored %s: %s", "--moe-pad-expert-input-to-capacity",
                                       "padding changes no gradient"))
            return hx_fail(SELDP_ERR_NOMEM, "out of memory");
    }
    HX_CHECK(map_dtype(imp, a));
    if (a->present[K_CLIP]) {
        double clip = 0;
        HX_CHECK(number("--clip-grad", a->values[K_CLIP][0], &clip));
        if (clip < 0)
            return bad_value("--clip-grad", a->values[K_CLIP][0], "a number >= 0");
        HX_CHECK(set_number(imp, a, K_CLIP, 0, "clip-grad", NULL));
    } else {
        HX_CHECK(hx_import_set(imp, HX_IMPORT_MEGATRON, "clip-grad", "1", true,
                               "no --clip-grad (Megatron's default 1.0)"));
    }
    if (a->present[K_DIST_OPT])
        HX_CHECK(hx_import_set(imp, HX_IMPORT_MEGATRON, "zero", "1", false,
                               "--use-distributed-optimizer"));
    if (a->present[K_SEQ_PAR] &&
        !line(imp, "%s: %s", "--sequence-parallel",
              "recognised: tiny-moe's tensor parallelism is always sequence-parallel"))
        return hx_fail(SELDP_ERR_NOMEM, "out of memory");
    if (a->present[K_SHARED_GATE] && !line(imp, "ignored %s: %s", "--moe-shared-expert-gate",
                                           "tiny-moe's shared expert is ungated"))
        return hx_fail(SELDP_ERR_NOMEM, "out of memory");
    /* kept for the derived settings (hx_import_megatron_finish) */
    long x = 0;
    static const int sizes[] = {K_MBS, K_GBS, K_SHARED, K_FFN, K_MOE_FFN, K_HIDDEN};
    long *into[] = {&imp->megatron.micro_batch, &imp->megatron.global_batch,
                    &imp->megatron.shared_ff,   &imp->megatron.ffn,
                    &imp->megatron.moe_ffn,     &imp->megatron.hidden};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        if (!a->present[sizes[i]])
            continue;
        HX_CHECK(set_size(imp, a, sizes[i], NULL, &x));
        *into[i] = x;
    }
    if (a->present[K_FFN] || a->present[K_MOE_FFN] || a->present[K_HIDDEN]) {
        static const int model[] = {K_HIDDEN, K_FFN, K_MOE_FFN};
        for (size_t i = 0; i < 3; i++) {
            if (!a->present[model[i]])
                continue;
            arg_text(a, model[i], text, sizeof text);
            if (!line(imp, "ignored %s: %s", text,
                      i == 0 ? "tiny-moe keeps --d-model" : "tiny-moe keeps --d-ff"))
                return hx_fail(SELDP_ERR_NOMEM, "out of memory");
        }
    }
fail:
    return st;
}

static seldp_status read_text(const char *args, char **text)
{
    *text = NULL;
    if (args[0] != '@')
        return SELDP_OK;
    seldp_status st = hx_read_file(args + 1, text, NULL);
    if (st != SELDP_OK) {
        char why[512];
        snprintf(why, sizeof why, "%s", hx_last_error());
        return hx_fail(SELDP_ERR_INVALID_ARGUMENT, "--from-megatron %s", why);
    }
    return SELDP_OK;
}

seldp_status hx_import_megatron(const char *args, hx_import *imp)
{
    seldp_status st = SELDP_OK;
    words ws = {0};
    char *text = NULL;
    mg_args *a = hx_calloc(1, sizeof *a);
    if (!a)
        return SELDP_ERR_NOMEM;
    HX_CHECK(read_text(args, &text));
    HX_CHECK(split_words(text ? text : args, &ws));
    if (ws.n == 0)
        HX_FAIL(SELDP_ERR_INVALID_ARGUMENT, "--from-megatron: an empty command line");
    int first = 0;
    HX_CHECK(read_launcher(&ws, imp, &first));
    HX_CHECK(read_args(&ws, first, a, imp));
    HX_CHECK(map_args(imp, a));
fail:
    words_free(&ws);
    free(text);
    free(a);
    return st;
}

/* ---- what follows from the sizes --------------------------------------------------------- */

seldp_status hx_import_megatron_finish(hx_import *imp, const hx_import_sizes *s)
{
    seldp_status st = SELDP_OK;
    char v[32];
    long model = (long)s->tp * s->pp * s->cp;
    long dp = model > 0 && s->world % model == 0 ? s->world / model : 0;
    long mbs = imp->megatron.micro_batch, gbs = imp->megatron.global_batch;
    if ((mbs || gbs) && dp > 0) {
        if (!mbs)
            mbs = 1;
        if (!gbs)
            gbs = mbs * dp;
        if (gbs % (mbs * dp) != 0)
            return hx_fail(SELDP_ERR_INVALID_ARGUMENT,
                           "--from-megatron: --global-batch-size %ld: global batch size (%ld) is "
                           "not divisible by micro batch size (%ld) times data parallel size "
                           "(%ld)",
                           gbs, gbs, mbs, dp);
        snprintf(v, sizeof v, "%ld", gbs / (mbs * dp));
        HX_CHECK(hx_import_set(imp, HX_IMPORT_MEGATRON, "micro-batches", v, false,
                               "--micro-batch-size %ld --global-batch-size %ld (data-parallel "
                               "size %ld%s)",
                               mbs, gbs, dp, s->world_known ? "" : " at the default --world"));
    }
    if (imp->megatron.mds_etp) {
        snprintf(v, sizeof v, "%d", s->tp);
        HX_CHECK(hx_import_set(imp, HX_IMPORT_MEGATRON, "etp", v, false,
                               "--enable-expert-tensor-parallelism (experts split over the "
                               "tensor-parallel group of %d)",
                               s->tp));
    }
    if (imp->megatron.shared_ff > 0 && !hx_import_given(imp, "shared-expert-ff")) {
        /* tiny-moe's shared expert in the config's proportion to a routed expert */
        long f = imp->megatron.moe_ffn  ? imp->megatron.moe_ffn
                 : imp->megatron.ffn    ? imp->megatron.ffn
                 : imp->megatron.hidden ? 4 * imp->megatron.hidden
                                        : 0;
        double ratio = f > 0 ? (double)imp->megatron.shared_ff / (double)f : 1.0;
        long fs = lround(ratio * s->d_ff);
        long tp = s->tp > 0 ? s->tp : 1;
        fs = fs < tp ? tp : (fs + tp - 1) / tp * tp;
        snprintf(v, sizeof v, "%ld", fs);
        HX_CHECK(hx_import_set(imp, HX_IMPORT_MEGATRON, "shared-expert-ff", v, false,
                               "--moe-shared-expert-intermediate-size %ld",
                               imp->megatron.shared_ff));
        if (!hx_import_line(imp, HX_IMPORT_MEGATRON,
                            "--shared-expert-ff %ld: the shared expert %s tiny-moe's --d-ff %d%s",
                            fs, f > 0 ? "in the config's proportion to a routed expert of" : "as",
                            s->d_ff, f > 0 ? "" : " (the config gives no expert size)"))
            return hx_fail(SELDP_ERR_NOMEM, "out of memory");
    }
fail:
    return st;
}
