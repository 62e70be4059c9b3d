/* seldp-harness --help: every option with its help line and default, wrapped. */
#define _POSIX_C_SOURCE 200809L

#include <stdio.h>
#include <string.h>

#include "options.h"
#include "options_impl.h"
#include "seldp/version.h"

/* Each framework's order when --order is absent, as the library resolves it. */
static void default_orders(char *buf, size_t size)
{
    static const seldp_framework frameworks[] = {
        SELDP_FRAMEWORK_MEGATRON, SELDP_FRAMEWORK_MEGATRON_0_9, SELDP_FRAMEWORK_DEEPSPEED,
        SELDP_FRAMEWORK_TORCHTITAN};
    size_t at = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < sizeof frameworks / sizeof frameworks[0] && at < size; i++) {
        seldp_layout_config cfg = SELDP_LAYOUT_CONFIG_INIT;
        cfg.framework = frameworks[i];
        seldp_layout *l = NULL;
        const char *order = "?";
        if (seldp_layout_create(&cfg, &l) == SELDP_OK) {
            const char *o = seldp_layout_get_config(l).order;
            order = o ? o : "none (its mesh pp, dp_shard, cp, tp)";
        }
        /* \x01: spaces the wrapping keeps */
        at += (size_t)snprintf(buf + at, size - at, "%s%s\x01%s", i ? ", " : "",
                               seldp_framework_name(frameworks[i]), order);
        seldp_layout_destroy(l);
    }
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
        default_orders(buf, size);
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
    case OPT_COMPARE_GROUPS:
    case OPT_FROM_MEGATRON:
    case OPT_FROM_TORCHTITAN:
    case OPT_FROM_DEEPSPEED:
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
    case OPT_REFERENCE_THREADS:
        snprintf(buf, size, "0 (%d here)", tm_reference_threads());
        break;
    case OPT_RANKS_PER_PROCESS:
        snprintf(buf, size, "off: one rank per process");
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
    case OPT_JSON:
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
        hx_step_option_default_text(id, buf, size);
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

/* --help's sections, in the order printed; each option's table order is kept within its
 * section. An option the switch does not name is listed under training. */
enum {
    SEC_LAYOUT,
    SEC_MODEL,
    SEC_TRAINING,
    SEC_EXPERIMENTS,
    SEC_OUTPUT,
    SEC_CHECKPOINTS,
    SEC_SELF_TESTS,
    SEC_PROGRAM,
    SEC_COUNT
};

static const char *const section_titles[SEC_COUNT] = {
    "layout (the ranks and their groups)",
    "model (tiny-moe and its router)",
    "training (the step, its dtypes, the transport)",
    "experiments (sweeps, layouts printed or compared)",
    "output",
    "checkpoints",
    "self-tests (defects and planted framework bugs the checks must catch)",
    "program",
};

static int section_of(int id)
{
    switch (id) {
    case OPT_WORLD:
    case OPT_EP:
    case OPT_ORDER:
    case OPT_FRAMEWORK:
    case OPT_TP:
    case OPT_PP:
    case OPT_CP:
    case OPT_ETP:
    case OPT_LAYOUT_FILE:
    case OPT_ROOTS:
    case OPT_FROM_MEGATRON:
    case OPT_FROM_TORCHTITAN:
    case OPT_FROM_DEEPSPEED:
    case OPT_RANKS_PER_PROCESS:
        return SEC_LAYOUT;
    case OPT_VOCAB:
    case OPT_D_MODEL:
    case OPT_D_FF:
    case OPT_EXPERTS:
    case OPT_TOP_K:
    case OPT_LAYERS:
    case OPT_QUANT:
    case OPT_LORA_RANK:
    case OPT_LORA_ALPHA:
    case OPT_SHARED_EXPERT_FF:
    case OPT_AUX_LOSS_COEFF:
    case OPT_AUX_LOSS_SCOPE:
    case OPT_Z_LOSS_COEFF:
    case OPT_CAPACITY_FACTOR:
        return SEC_MODEL;
    case OPT_SWEEP:
    case OPT_PRINT_LAYOUT:
    case OPT_JSON:
    case OPT_COMPARE_GROUPS:
        return SEC_EXPERIMENTS;
    case OPT_OUT:
    case OPT_DUMP:
    case OPT_SUMMARY:
    case OPT_QUIET:
        return SEC_OUTPUT;
    case OPT_SAVE:
    case OPT_SAVE_EVERY:
    case OPT_RESUME:
        return SEC_CHECKPOINTS;
    case OPT_INJECT:
    case OPT_INJECT_OVERFLOW:
        return SEC_SELF_TESTS;
    case OPT_HELP:
    case OPT_VERSION:
        return SEC_PROGRAM;
    default:
        return SEC_TRAINING;
    }
}

static void print_option(FILE *out, const hx_option_doc *d)
{
    char left[64], def[256], text[1024];
    snprintf(left, sizeof left, "--%s%s%s", d->opt.name, d->metavar ? " " : "",
             d->metavar ? d->metavar : "");
    default_text(d->opt.val, def, sizeof def);
    if (def[0])
        /* \x01: a space the wrapping keeps, so "[default: X]" stays on one line */
        snprintf(text, sizeof text, "%s [default:\x01%s]", d->help, def);
    else
        snprintf(text, sizeof text, "%s", d->help);
    int at = fprintf(out, "  %-30s", left);
    print_wrapped(out, text, at, 33);
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
            "reference of the global loss, and the replicas (docs/harness.md).\n"
            "Exit status: 0 every check passed, 1 a check or the run failed, 2 bad options or "
            "layout.\n\n");
    for (int sec = 0; sec < SEC_COUNT; sec++) {
        fprintf(out, "%s%s:\n", sec ? "\n" : "", section_titles[sec]);
        for (size_t i = 0; i < hx_option_docs_n; i++)
            if (section_of(hx_option_docs[i].opt.val) == sec)
                print_option(out, &hx_option_docs[i]);
    }
    fprintf(out, "\nexample: seldp-harness --world 8 --ep 4 --order ep-dp --dtype bf16\n");
}
