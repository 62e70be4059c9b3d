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

#include "bugs.h"
#include "import.h"
#include "options_impl.h"

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
    hx_step_options_default(o);
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
    static const char *const self_tests[] = {"none", "grad", "replica", "absent", "fail"};
    if ((unsigned)fault < sizeof self_tests / sizeof self_tests[0])
        return self_tests[fault];
    const hx_bug *bug = hx_bug_of(fault);
    return bug ? bug->name : "invalid";
}

const char *hx_roots_name(hx_roots roots)
{
    return hx_layout_roots_word(roots);
}

int hx_options_spread(const hx_options *o)
{
    return o->token_spread >= 0 ? o->token_spread : o->tokens / 4;
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

/* A Megatron order string: tp, cp, ep, dp and pp joined by '-', each at most once (Megatron's
 * RankGenerator appends the ones left out with size 1, and refuses a missing one whose size is
 * above 1; the library does the same). */
static bool is_megatron_order(const char *order)
{
    static const char *const tokens[] = {"tp", "cp", "ep", "dp", "pp"};
    size_t len = strlen(order);
    if (len < 2 || len > 14 || (len + 1) % 3 != 0)
        return false;
    unsigned seen = 0;
    for (size_t i = 0; 3 * i < len; i++) {
        if (3 * i + 2 < len && order[3 * i + 2] != '-')
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

/* One getopt pass over argv into *o; given[row] marks each row of the option table named. */
static hx_parse_result parse_pass(int argc, char **argv, hx_options *o, FILE *out, FILE *err,
                                  bool *given)
{
    struct option longopts[HX_OPTIONS_MAX + 1];
    for (size_t i = 0; i < hx_option_docs_n; i++)
        longopts[i] = hx_option_docs[i].opt;
    longopts[hx_option_docs_n] = (struct option){0};
    optind = 0; /* glibc: 0 re-initializes getopt, so the parser may run more than once */
    opterr = 0;
    for (;;) {
        int prev = optind ? optind : 1;
        int c = getopt_long(argc, argv, ":", longopts, NULL);
        if (c == -1)
            break;
        const char *arg = optarg;
        const char *name = NULL;
        for (size_t i = 0; i < hx_option_docs_n; i++) {
            if (hx_option_docs[i].opt.val == c) {
                name = hx_option_docs[i].opt.name;
                given[i] = true;
            }
        }
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
        case OPT_RANKS_PER_PROCESS:
            ok = parse_int(arg, 1, 4096, &v);
            expected = "an integer in 1..4096";
            o->ranks_per_process = (int)v;
            break;
        case OPT_EP:
            ok = parse_int(arg, 1, 4096, &v);
            expected = "an integer in 1..4096";
            o->ep = (int)v;
            o->ep_given = true;
            break;
        case OPT_ORDER:
            expected = "ep-dp or dp-ep, or a Megatron order of tp, cp, ep, dp and pp, each at "
                       "most once (e.g. tp-cp-ep-dp-pp, tp-dp-pp)";
            o->order_given = true;
            o->grid.order = arg;
            if (strcasecmp(arg, "ep-dp") == 0) {
                o->order = HX_ORDER_EP_DP;
                o->grid.order = "ep-dp";
            } else if (strcasecmp(arg, "dp-ep") == 0) {
                o->order = HX_ORDER_DP_EP;
                o->grid.order = "dp-ep";
            } else {
                ok = is_megatron_order(arg);
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
        case OPT_JSON:
            o->print_json = true;
            break;
        case OPT_COMPARE_GROUPS:
        case OPT_FROM_TORCHTITAN:
        case OPT_FROM_DEEPSPEED:
            ok = arg[0] != '\0';
            expected = "a file name";
            *(c == OPT_COMPARE_GROUPS    ? &o->compare_groups
              : c == OPT_FROM_TORCHTITAN ? &o->from_torchtitan
                                         : &o->from_deepspeed) = arg;
            break;
        case OPT_FROM_MEGATRON:
            ok = arg[0] != '\0';
            expected = "a Megatron command line (one string) or @FILE";
            o->from_megatron = arg;
            break;
        case OPT_LAYOUT_FILE:
            o->layout_file = arg;
            ok = arg[0] != '\0';
            expected = "a file name";
            break;
        case OPT_ROOTS:
            expected = "first, last or spread";
            o->roots_given = true;
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
        case OPT_REFERENCE_THREADS:
            ok = parse_int(arg, 0, 64, &v);
            expected = "an integer from 0 (the machine's cores) to 64";
            o->reference_threads = (int)v;
            break;
        case OPT_INJECT:
            expected = hx_bug_expected_names();
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
            if (hx_step_option_parse(c, arg, o, &ok, &expected))
                break;
            fprintf(err, "seldp-harness: unknown option '%s' (see --help)\n", argv[prev]);
            return HX_PARSE_ERROR;
        }
        if (!ok) {
            fprintf(err, "seldp-harness: --%s '%s': expected %s\n", name, arg, expected);
            return HX_PARSE_ERROR;
        }
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

/* What --print-layout and --compare-groups read: the layout and what decides its roots and
 * replica sets (--quant: a quantized expert's adapters under expert TP), and the imports. */
static const int layout_reads[] = {OPT_WORLD,
                                   OPT_EP,
                                   OPT_ORDER,
                                   OPT_FRAMEWORK,
                                   OPT_TP,
                                   OPT_PP,
                                   OPT_CP,
                                   OPT_ETP,
                                   OPT_LAYOUT_FILE,
                                   OPT_ROOTS,
                                   OPT_EXPERTS,
                                   OPT_QUANT,
                                   OPT_PRINT_LAYOUT,
                                   OPT_JSON,
                                   OPT_COMPARE_GROUPS,
                                   OPT_FROM_MEGATRON,
                                   OPT_FROM_TORCHTITAN,
                                   OPT_FROM_DEEPSPEED};

/* The combinations no single option can check. */
static hx_parse_result check_combinations(const hx_options *o, const bool *given, FILE *err)
{
    if (o->print_json && !o->print_layout) {
        fprintf(err, "seldp-harness: --json: needs --print-layout (a run's layout is report.json's "
                     "\"layout\")\n");
        return HX_PARSE_ERROR;
    }
    if (o->print_layout || o->compare_groups) {
        for (size_t i = 0; i < hx_option_docs_n; i++) {
            bool reads = false;
            for (size_t k = 0; k < sizeof layout_reads / sizeof layout_reads[0]; k++)
                reads = reads || hx_option_docs[i].opt.val == layout_reads[k];
            if (given[i] && !reads) {
                fprintf(err,
                        "seldp-harness: %s prints the layout and exits without training: it "
                        "would ignore --%s (drop it, or run without %s)\n",
                        o->print_layout ? "--print-layout" : "--compare-groups",
                        hx_option_docs[i].opt.name,
                        o->print_layout ? "--print-layout" : "--compare-groups");
                return HX_PARSE_ERROR;
            }
        }
    }
    if (o->layout_file && o->grid_given) {
        fprintf(err,
                "seldp-harness: --layout-file and --framework/--tp/--pp/--cp/--etp exclude each "
                "other: the layout file lists the groups\n");
        return HX_PARSE_ERROR;
    }
    if (hx_bug_refuse_options(o, err))
        return HX_PARSE_ERROR;
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
    return HX_PARSE_RUN;
}

/* The imports' settings into *o (the options before the command line), one at a time so that a
 * refusal names the config key it came from; then the command line on top. */
static hx_parse_result apply_imports(int argc, char **argv, hx_options *o, const hx_options *start,
                                     const bool *given, FILE *out, FILE *err)
{
    hx_parse_result r = HX_PARSE_RUN;
    hx_import imp = {0};
    const char *sources[HX_IMPORT_KINDS] = {o->from_megatron, o->from_torchtitan,
                                            o->from_deepspeed};
    if (hx_import_read(sources, o, given, &imp) != SELDP_OK) {
        fprintf(err, "seldp-harness: %s\n", hx_last_error());
        hx_import_free(&imp);
        return HX_PARSE_ERROR;
    }
    hx_options t = *start;
    bool scratch[HX_OPTIONS_MAX] = {0};
    for (size_t i = 0; i < imp.n && r == HX_PARSE_RUN; i++) {
        const hx_import_setting *s = &imp.settings[i];
        if (!hx_import_applies(&imp, s))
            continue;
        char *words[4] = {argv[0], (char *)s->arg, (char *)s->value, NULL};
        int n = s->value[0] ? 3 : 2;
        words[n] = NULL;
        char *text = NULL;
        size_t len = 0;
        FILE *msg = open_memstream(&text, &len);
        if (!msg) {
            fprintf(err, "seldp-harness: out of memory\n");
            r = HX_PARSE_ERROR;
            break;
        }
        r = parse_pass(n, words, &t, msg, msg, scratch);
        fclose(msg);
        if (r != HX_PARSE_RUN) {
            const char *m = text ? text : "";
            if (strncmp(m, "seldp-harness: ", 15) == 0)
                m += 15;
            fprintf(err, "seldp-harness: --from-%s %s: %.*s\n", hx_import_name(s->from), s->source,
                    (int)strcspn(m, "\n"), m);
            r = HX_PARSE_ERROR;
        }
        free(text);
    }
    if (r == HX_PARSE_RUN)
        r = parse_pass(argc, argv, &t, out, err, scratch);
    if (r == HX_PARSE_RUN) {
        *o = t;
        if (!o->quiet)
            hx_import_print(&imp, o->print_json ? err : out);
    }
    hx_import_free(&imp);
    return r;
}

hx_parse_result hx_options_parse(int argc, char **argv, hx_options *o, FILE *out, FILE *err)
{
    const hx_options start = *o;
    bool given[HX_OPTIONS_MAX] = {0};
    hx_parse_result r = parse_pass(argc, argv, o, out, err, given);
    if (r != HX_PARSE_RUN)
        return r;
    if (o->from_megatron || o->from_torchtitan || o->from_deepspeed) {
        r = apply_imports(argc, argv, o, &start, given, out, err);
        if (r != HX_PARSE_RUN)
            return r;
    }
    return check_combinations(o, given, err);
}
