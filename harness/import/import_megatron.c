/* --from-megatron "ARGS": a Megatron-LM or Megatron-DeepSpeed command line as harness options
 * (import.h; docs/harness-interop.md lists the keys).
 *
 * The text is split as a shell splits it (quotes, backslashes, line continuations, # comments),
 * a launcher in front (torchrun, python -m torch.distributed.run, deepspeed) gives the world
 * (processes per node x nodes), and what follows the training script is read as argparse
 * reads Megatron's arguments: --key value..., --key=value, flags, the last of a repeated key;
 * import_megatron_map.c maps them.
 * The defaults are the frameworks' own: Megatron-LM megatron/training/arguments.py and
 * megatron/core/transformer/transformer_config.py (NVIDIA/Megatron-LM d98e8a64), and
 * Megatron-DeepSpeed megatron/arguments.py (deepspeedai/Megatron-DeepSpeed 4efb479d): top-k 1,
 * --moe-loss-coeff 0.1 and capacity factor 1.0 with token dropping there. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "import_megatron.h"
#include "util.h"

#define MG_MAX_WORDS 4096

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

seldp_status hx_mg_bad_value(const char *key, const char *value, const char *expected)
{
    char shown[256];
    return hx_fail(SELDP_ERR_INVALID_ARGUMENT, "--from-megatron: %s '%s': expected %s%s", key,
                   hx_printable(value, shown, sizeof shown), expected,
                   strchr(value, '$') ? " (a script's shell variables are not expanded here: "
                                        "give their values)"
                                      : "");
}

seldp_status hx_mg_positive_int(const char *key, const char *value, long *out)
{
    char *end = NULL;
    errno = 0;
    long v = strtol(value, &end, 10);
    if (errno || end == value || *end || v < 1 || v > 1 << 24)
        return hx_mg_bad_value(key, value, "a positive integer");
    *out = v;
    return SELDP_OK;
}

seldp_status hx_mg_number(const char *key, const char *value, double *out)
{
    char *end = NULL;
    errno = 0;
    double v = strtod(value, &end);
    if (errno || end == value || *end || !isfinite(v))
        return hx_mg_bad_value(key, value, "a number");
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

/* "--key v1 v2" of an argument, for the sources and the lines. */
void hx_mg_arg_text(const mg_args *a, int id, char *buf, size_t size)
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
            if (hx_mg_positive_int(key, value, &v) != SELDP_OK) {
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
    HX_CHECK(hx_mg_map(imp, a));
fail:
    words_free(&ws);
    free(text);
    free(a);
    return st;
}
