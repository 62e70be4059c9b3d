/* --from-megatron, the mapping (import_megatron.h): what the command line's arguments set
 * in the harness, with Megatron-LM's and Megatron-DeepSpeed's defaults, and the settings that
 * follow from the resolved sizes (micro-batches, the shared expert, expert TP). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "import_megatron.h"
#include "json.h"
#include "util.h"

/* ---- the mapping ------------------------------------------------------------------------- */

static seldp_status set_size(hx_import *imp, const mg_args *a, int id, const char *option,
                             long *out)
{
    char text[256], v[32];
    long x = 0;
    seldp_status st = hx_mg_positive_int(a->key_text[id], a->values[id][0], &x);
    if (st != SELDP_OK)
        return st;
    if (out)
        *out = x;
    if (!option)
        return SELDP_OK;
    hx_mg_arg_text(a, id, text, sizeof text);
    snprintf(v, sizeof v, "%ld", x);
    return hx_import_set(imp, HX_IMPORT_MEGATRON, option, v, false, "%s", text);
}

static seldp_status set_number(hx_import *imp, const mg_args *a, int id, int index,
                               const char *option, double *out)
{
    char text[256], v[48];
    double x = 0;
    seldp_status st = hx_mg_number(a->key_text[id], a->values[id][index], &x);
    if (st != SELDP_OK)
        return st;
    if (out)
        *out = x;
    if (!option)
        return SELDP_OK;
    hx_mg_arg_text(a, id, text, sizeof text);
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
            HX_CHECK(hx_mg_number("--moe-aux-loss-coeff", a->values[K_AUX][n_coeffs > 1 ? t : 0],
                                  &coeff));
        bool known = strcmp(type, "aux_loss") == 0 || strcmp(type, "global_aux_loss") == 0 ||
                     strcmp(type, "seq_aux_loss") == 0 || strcmp(type, "sinkhorn") == 0 ||
                     strcmp(type, "quantile_balancing") == 0 || strcmp(type, "none") == 0;
        if (!known)
            return hx_mg_bad_value("--moe-router-load-balancing-type", type,
                                   "aux_loss, seq_aux_loss, global_aux_loss, sinkhorn, "
                                   "quantile_balancing or none");
        if (coeff < 0)
            return hx_mg_bad_value("--moe-aux-loss-coeff", a->values[K_AUX][0], "a number >= 0");
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
    HX_CHECK(hx_mg_number("--moe-expert-capacity-factor", a->values[K_CAPACITY][0], &cf));
    if (cf < 0) /* TransformerConfig: a negative factor is None, no capacity */
        return line(imp, "%s %s: a negative factor is no capacity (dropless), as Megatron reads it",
                    "--moe-expert-capacity-factor", a->values[K_CAPACITY][0])
                   ? SELDP_OK
                   : hx_fail(SELDP_ERR_NOMEM, "out of memory");
    HX_CHECK(set_number(imp, a, K_CAPACITY, 0, "capacity-factor", NULL));
    const char *policy = a->present[K_DROP_POLICY] ? a->values[K_DROP_POLICY][0] : "probs";
    if (strcmp(policy, "probs") != 0 && strcmp(policy, "position") != 0)
        return hx_mg_bad_value("--moe-token-drop-policy", policy, "probs or position");
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
        hx_mg_arg_text(a, ignored[i], text, sizeof text);
        if (!line(imp, "ignored %s: %s", text, why[i]))
            return hx_fail(SELDP_ERR_NOMEM, "out of memory");
    }
fail:
    return st;
}

seldp_status hx_mg_map(hx_import *imp, const mg_args *a)
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
            HX_CHECK(hx_mg_positive_int("--num-experts", a->values[K_EXPERTS][i], &x));
            uniform = uniform && (i == 0 || x == first);
            first = i == 0 ? x : first;
        }
        if (!mds && a->n_values[K_EXPERTS] != 1)
            return hx_fail(SELDP_ERR_INVALID_ARGUMENT,
                           "--from-megatron: --num-experts: Megatron-LM takes one count");
        hx_mg_arg_text(a, K_EXPERTS, text, sizeof text);
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
        HX_CHECK(hx_mg_number("--clip-grad", a->values[K_CLIP][0], &clip));
        if (clip < 0)
            return hx_mg_bad_value("--clip-grad", a->values[K_CLIP][0], "a number >= 0");
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
            hx_mg_arg_text(a, model[i], text, sizeof text);
            if (!line(imp, "ignored %s: %s", text,
                      i == 0 ? "tiny-moe keeps --d-model" : "tiny-moe keeps --d-ff"))
                return hx_fail(SELDP_ERR_NOMEM, "out of memory");
        }
    }
fail:
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
