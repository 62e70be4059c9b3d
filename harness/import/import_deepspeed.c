/* --from-deepspeed FILE: a DeepSpeed ds_config (JSON) as harness options (import.h;
 * docs/harness-interop.md lists the keys).
 *
 * The batch sizes (train_batch_size = micro * gradient_accumulation_steps * data-parallel size,
 * DeepSpeedConfig._batch_assertion), the ZeRO stage, fp16/bf16, gradient_clipping (default 1.0,
 * deepspeed/runtime/constants.py), use_data_before_expert_parallel_, AutoTP's
 * tensor_parallel.autotp_size and AutoEP's expert_parallel section (deepspeedai/DeepSpeed at
 * edaa7221). The classic MoE layer's sizes (ep_size, num_experts, k) are the model's code, not the
 * config's: they come from --ep, --experts and --top-k, or from a Megatron-DeepSpeed command
 * line beside it (--from-megatron).
 *
 * AutoEP (DeepSpeed #7938, #8064) builds the same expert-parallel and expert-data groups as the
 * classic deepspeed.moe.layer.MoE for every size it accepts (its folding tables are the legacy
 * path of _create_expert_and_data_parallel per stage), so the import keeps --framework
 * deepspeed and adds the sizes AutoEP refuses, with its messages. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "import.h"
#include "util.h"

typedef struct ds_ctx {
    hx_import *imp;
    const char *path;
    bool fp16, bf16, fp16_given, bf16_given;
    const hx_json *loss_scale, *grad_accum_dtype, *comm_dtype, *clip;
} ds_ctx;

static seldp_status key_error(const ds_ctx *c, const char *key, const hx_json *v,
                              const char *expected)
{
    char text[128];
    hx_import_leaf_text(v, text, sizeof text);
    return hx_fail(SELDP_ERR_INVALID_ARGUMENT, "--from-deepspeed %s:%d:%d: %s: %s: expected %s",
                   c->path, v->line, v->column, key, text, expected);
}

static bool ignore(ds_ctx *c, const char *key, const hx_json *v, const char *why)
{
    char text[128];
    hx_import_leaf_text(v, text, sizeof text);
    return hx_import_line(c->imp, HX_IMPORT_DEEPSPEED, "ignored %s: %s: %s", key, text, why);
}

static bool is_auto(const hx_json *v)
{
    return v->type == HX_JSON_STRING && strcmp(v->string, "auto") == 0;
}

/* A positive integer, or "auto" (the HF Trainer fills it in: ignored). *out stays 0 then. */
static seldp_status count_of(ds_ctx *c, const char *key, const hx_json *v, long *out)
{
    if (is_auto(v))
        return ignore(c, key, v, "the HF Trainer fills it in") ? SELDP_OK
                                                               : hx_fail(SELDP_ERR_NOMEM, "out of "
                                                                                          "memory");
    if (v->type != HX_JSON_NUMBER || !v->is_integer || v->integer < 1 || v->integer > 1 << 24)
        return key_error(c, key, v, "a positive integer");
    *out = (long)v->integer;
    return SELDP_OK;
}

static seldp_status bool_of(const ds_ctx *c, const char *key, const hx_json *v, bool *out)
{
    if (v->type != HX_JSON_BOOL)
        return key_error(c, key, v, "true or false");
    *out = v->boolean;
    return SELDP_OK;
}

static seldp_status set_count(ds_ctx *c, const char *key, const hx_json *v, const char *option)
{
    long x = 0;
    seldp_status st = count_of(c, key, v, &x);
    if (st != SELDP_OK || x == 0)
        return st;
    char value[32];
    snprintf(value, sizeof value, "%ld", x);
    return hx_import_set(c->imp, HX_IMPORT_DEEPSPEED, option, value, false, "%s: %ld", key, x);
}

static seldp_status read_leaf(ds_ctx *c, const char *key, const hx_json *v)
{
    hx_import *imp = c->imp;
    seldp_status st = SELDP_OK;
    if (strcmp(key, "train_batch_size") == 0)
        return count_of(c, key, v, &imp->deepspeed.train_batch);
    if (strcmp(key, "train_micro_batch_size_per_gpu") == 0)
        return count_of(c, key, v, &imp->deepspeed.micro_batch);
    if (strcmp(key, "gradient_accumulation_steps") == 0)
        return count_of(c, key, v, &imp->deepspeed.grad_accum);
    if (strcmp(key, "zero_optimization.stage") == 0) {
        if (v->type != HX_JSON_NUMBER || !v->is_integer || v->integer < 0 || v->integer > 3)
            return key_error(c, key, v, "0, 1, 2 or 3");
        if (v->integer == 1 || v->integer == 2)
            return hx_import_set(imp, HX_IMPORT_DEEPSPEED, "zero", "1", false,
                                 "zero_optimization.stage: %lld (optimizer state%s sharded over "
                                 "the data-parallel groups)",
                                 (long long)v->integer, v->integer == 2 ? " and gradients" : "");
        if (v->integer == 3 &&
            !hx_import_line(imp, HX_IMPORT_DEEPSPEED,
                            "ignored zero_optimization.stage: 3: ZeRO-3 shards the parameters "
                            "too; the harness's sharded optimizer is ZeRO-1/2's"))
            return hx_fail(SELDP_ERR_NOMEM, "out of memory");
        return SELDP_OK;
    }
    if (strcmp(key, "fp16.enabled") == 0) {
        if (is_auto(v))
            return ignore(c, key, v, "the HF Trainer fills it in") ? SELDP_OK : SELDP_ERR_NOMEM;
        c->fp16_given = true;
        return bool_of(c, key, v, &c->fp16);
    }
    if (strcmp(key, "bf16.enabled") == 0 || strcmp(key, "bfloat16.enabled") == 0) {
        if (is_auto(v))
            return ignore(c, key, v, "the HF Trainer fills it in") ? SELDP_OK : SELDP_ERR_NOMEM;
        c->bf16_given = true;
        return bool_of(c, key, v, &c->bf16);
    }
    if (strcmp(key, "fp16.loss_scale") == 0) {
        c->loss_scale = v;
        return SELDP_OK;
    }
    if (strcmp(key, "data_types.grad_accum_dtype") == 0) {
        c->grad_accum_dtype = v;
        return SELDP_OK;
    }
    if (strcmp(key, "communication_data_type") == 0) {
        c->comm_dtype = v;
        return SELDP_OK;
    }
    if (strcmp(key, "gradient_clipping") == 0) {
        c->clip = v;
        return SELDP_OK;
    }
    if (strcmp(key, "use_data_before_expert_parallel_") == 0) {
        bool before = false;
        HX_CHECK(bool_of(c, key, v, &before));
        return hx_import_set(imp, HX_IMPORT_DEEPSPEED, "order", before ? "dp-ep" : "ep-dp", false,
                             "use_data_before_expert_parallel_: %s", before ? "true" : "false");
    }
    if (strcmp(key, "tensor_parallel.autotp_size") == 0)
        return set_count(c, key, v, "tp");
    if (strcmp(key, "expert_parallel.enabled") == 0)
        return bool_of(c, key, v, &imp->deepspeed.autoep);
    if (strcmp(key, "expert_parallel.autoep_size") == 0)
        return count_of(c, key, v, &imp->deepspeed.autoep_size);
    if (strcmp(key, "expert_parallel.expert_tensor_parallel_size") == 0)
        return count_of(c, key, v, &imp->deepspeed.autoep_etp);
    const char *why = "no tiny-moe setting";
    if (strncmp(key, "optimizer.", 10) == 0 || strncmp(key, "scheduler.", 10) == 0)
        why = "the harness trains with SGD at --lr";
    else if (strncmp(key, "zero_optimization.", 18) == 0)
        why = "a ZeRO implementation detail (buckets, overlap, offload)";
    else if (strncmp(key, "fp16.", 5) == 0)
        why = "a loss-scaler detail";
    else if (strncmp(key, "expert_parallel.", 16) == 0)
        why = "AutoEP's router and module patterns (tiny-moe's router is its own)";
    else if (strncmp(key, "tensor_parallel.", 16) == 0)
        why = "AutoTP's module patterns";
    else if (strcmp(key, "steps_per_print") == 0 || strcmp(key, "wall_clock_breakdown") == 0)
        why = "logging";
    if (!ignore(c, key, v, why))
        return hx_fail(SELDP_ERR_NOMEM, "out of memory");
fail:
    return st;
}

static seldp_status walk(ds_ctx *c, const hx_json *node, hx_buf *key)
{
    size_t mark = key->len;
    for (size_t i = 0; i < node->count; i++) {
        char part[256];
        hx_buf_printf(key, "%s%s", mark ? "." : "", hx_printable(node->keys[i], part, sizeof part));
        if (!hx_buf_ok(key))
            return SELDP_ERR_NOMEM;
        const hx_json *v = &node->items[i];
        seldp_status st =
            v->type == HX_JSON_OBJECT ? walk(c, v, key) : read_leaf(c, hx_buf_str(key), v);
        if (st != SELDP_OK)
            return st;
        key->len = mark;
        key->data[mark] = '\0';
    }
    return SELDP_OK;
}

static bool dtype_is(const hx_json *v, const char *a, const char *b)
{
    return v && v->type == HX_JSON_STRING &&
           (strcmp(v->string, a) == 0 || strcmp(v->string, b) == 0);
}

/* fp16/bf16 and FP32 gradients: bf16 accumulates gradients in FP32 (BF16_Optimizer) unless
 * data_types.grad_accum_dtype says bf16; fp16 reduces them in fp16 unless
 * communication_data_type is fp32. */
static seldp_status map_dtype(ds_ctx *c)
{
    seldp_status st = SELDP_OK;
    hx_import *imp = c->imp;
    if (c->fp16 && c->bf16)
        return hx_fail(SELDP_ERR_INVALID_ARGUMENT,
                       "--from-deepspeed %s: fp16.enabled and bf16.enabled: bfloat16 and fp16 "
                       "modes cannot be simultaneously enabled",
                       c->path);
    if (c->loss_scale && c->fp16) {
        const hx_json *v = c->loss_scale;
        if (v->type != HX_JSON_NUMBER || !(v->number >= 0) || !isfinite(v->number))
            return key_error(c, "fp16.loss_scale", v, "a number >= 0 (0: dynamic)");
        char value[48];
        snprintf(value, sizeof value, v->number == 0 ? "dynamic" : "%.17g", v->number);
        HX_CHECK(hx_import_set(imp, HX_IMPORT_DEEPSPEED, "loss-scale", value, false,
                               "fp16.loss_scale: %g%s", v->number,
                               v->number == 0 ? " (dynamic)" : ""));
    }
    if (hx_import_given(imp, "dtype"))
        return SELDP_OK;
    if (c->bf16) {
        HX_CHECK(
            hx_import_set(imp, HX_IMPORT_DEEPSPEED, "dtype", "bf16", false, "bf16.enabled: true"));
        if (!dtype_is(c->grad_accum_dtype, "bf16", "bfloat16") &&
            !dtype_is(c->comm_dtype, "bf16", "bfloat16"))
            HX_CHECK(hx_import_set(imp, HX_IMPORT_DEEPSPEED, "fp32-master", "", false,
                                   "bf16.enabled: true (FP32 master weights, gradients "
                                   "accumulated in FP32)"));
    } else if (c->fp16) {
        HX_CHECK(
            hx_import_set(imp, HX_IMPORT_DEEPSPEED, "dtype", "f16", false, "fp16.enabled: true"));
        if (dtype_is(c->comm_dtype, "fp32", "float32"))
            HX_CHECK(hx_import_set(imp, HX_IMPORT_DEEPSPEED, "fp32-master", "", false,
                                   "fp16 with communication_data_type: \"fp32\""));
    } else {
        HX_CHECK(hx_import_set(imp, HX_IMPORT_DEEPSPEED, "dtype", "f32", true,
                               "neither fp16 nor bf16 enabled (DeepSpeed trains in FP32)"));
    }
fail:
    return st;
}

seldp_status hx_import_deepspeed(const char *text, size_t len, const char *path, hx_import *imp)
{
    seldp_status st = SELDP_OK;
    hx_json *root = NULL;
    hx_buf key = {0};
    ds_ctx c = {.imp = imp, .path = path};
    if (hx_json_parse(text, len, path, &root) != SELDP_OK) {
        char why[512];
        snprintf(why, sizeof why, "%s", hx_last_error());
        return hx_fail(SELDP_ERR_PARSE, "--from-deepspeed %s", why);
    }
    if (root->type != HX_JSON_OBJECT)
        HX_FAIL(SELDP_ERR_INVALID_ARGUMENT,
                "--from-deepspeed %s: expected an object of ds_config "
                "keys, found a%s %s",
                path, root->type == HX_JSON_ARRAY ? "n" : "", hx_json_type_name(root->type));
    HX_CHECK(
        hx_import_set(imp, HX_IMPORT_DEEPSPEED, "framework", "deepspeed", false, "a ds_config"));
    hx_buf_append(&key, "", 0);
    HX_CHECK(walk(&c, root, &key));
    HX_CHECK(map_dtype(&c));
    if (c.clip) {
        if (c.clip->type != HX_JSON_NUMBER || !(c.clip->number >= 0) || !isfinite(c.clip->number))
            HX_CHECK(key_error(&c, "gradient_clipping", c.clip, "a number >= 0 (0: off)"));
        char v[48];
        snprintf(v, sizeof v, "%.17g", c.clip->number);
        HX_CHECK(hx_import_set(imp, HX_IMPORT_DEEPSPEED, "clip-grad", v, false,
                               "gradient_clipping: %g", c.clip->number));
    } else {
        HX_CHECK(hx_import_set(imp, HX_IMPORT_DEEPSPEED, "clip-grad", "1", true,
                               "no gradient_clipping (DeepSpeed's default 1.0)"));
    }
    if (imp->deepspeed.autoep) {
        char v[32];
        long ep = imp->deepspeed.autoep_size ? imp->deepspeed.autoep_size : 1;
        snprintf(v, sizeof v, "%ld", ep);
        HX_CHECK(hx_import_set(imp, HX_IMPORT_DEEPSPEED, "ep", v, false,
                               "expert_parallel.autoep_size: %ld (AutoEP)", ep));
        HX_CHECK(hx_import_set(imp, HX_IMPORT_DEEPSPEED, "etp", "1", false,
                               "AutoEP keeps experts whole"));
    } else if (imp->deepspeed.autoep_size &&
               !hx_import_line(imp, HX_IMPORT_DEEPSPEED,
                               "ignored expert_parallel.autoep_size: %ld: expert_parallel.enabled "
                               "is not true",
                               imp->deepspeed.autoep_size)) {
        HX_FAIL(SELDP_ERR_NOMEM, "out of memory");
    }
fail:
    hx_buf_free(&key);
    hx_json_free(root);
    return st;
}

/* ---- what follows from the sizes --------------------------------------------------------- */

seldp_status hx_import_deepspeed_finish(hx_import *imp, const hx_import_sizes *s)
{
    seldp_status st = SELDP_OK;
    long model = (long)s->tp * s->pp;
    long dp = model > 0 && s->world % model == 0 ? s->world / model : 0;
    long train = imp->deepspeed.train_batch, micro = imp->deepspeed.micro_batch;
    long gas = imp->deepspeed.grad_accum;
    /* _set_batch_related_parameters, then _batch_assertion */
    if (dp > 0 && (train || micro || gas)) {
        if (train && micro && !gas)
            gas = train / micro / dp;
        else if (train && gas && !micro)
            micro = train / dp / gas;
        else if (train && !micro && !gas)
            micro = train / dp, gas = 1;
        if (!gas)
            gas = 1;
        if (!micro)
            micro = 1;
        if (!train)
            train = micro * gas * dp;
        if (gas < 1 || micro < 1 || train != micro * gas * dp)
            return hx_fail(SELDP_ERR_INVALID_ARGUMENT,
                           "--from-deepspeed: train_batch_size: Check batch related parameters. "
                           "train_batch_size is not equal to micro_batch_per_gpu * "
                           "gradient_acc_step * world_size %ld != %ld * %ld * %ld%s",
                           train, micro, gas, dp,
                           s->world_known ? "" : " (data-parallel size at the default --world)");
        char v[32];
        snprintf(v, sizeof v, "%ld", gas);
        HX_CHECK(hx_import_set(imp, HX_IMPORT_DEEPSPEED, "micro-batches", v, false,
                               "gradient_accumulation_steps %ld (train_batch_size %ld, micro %ld, "
                               "data-parallel size %ld)",
                               gas, train, micro, dp));
    }
    if (!imp->deepspeed.autoep)
        return SELDP_OK;
    /* AutoEP's refusals: validate_folding_global, validate_autoep_post_detection */
    const char *order = hx_import_value(imp, "order");
    if (hx_import_given(imp, "order"))
        order = imp->cmdline->grid.order;
    if (s->tp > 1 && s->pp > 1)
        return hx_fail(SELDP_ERR_INVALID_ARGUMENT,
                       "--from-deepspeed: expert_parallel: AutoEP+AutoTP folding currently "
                       "supports pp_size=1 only; got pp_size=%d",
                       s->pp);
    if (s->etp != 1 || imp->deepspeed.autoep_etp > 1)
        return hx_fail(SELDP_ERR_INVALID_ARGUMENT,
                       "--from-deepspeed: expert_parallel.expert_tensor_parallel_size=%ld is "
                       "reserved for expert-internal tensor parallelism and is not supported yet",
                       imp->deepspeed.autoep_etp > 1 ? imp->deepspeed.autoep_etp : (long)s->etp);
    if (s->tp > 1 && s->ep == 1)
        return hx_fail(SELDP_ERR_INVALID_ARGUMENT,
                       "--from-deepspeed: expert_parallel: AutoEP+AutoTP folding requires "
                       "expert_parallel.autoep_size > 1");
    if (s->tp > 1 && order && strcmp(order, "dp-ep") == 0)
        return hx_fail(SELDP_ERR_INVALID_ARGUMENT,
                       "--from-deepspeed: expert_parallel with use_data_before_expert_parallel_ is "
                       "not supported with AutoEP+AutoTP folding");
    if (s->ep > s->experts)
        return hx_fail(SELDP_ERR_INVALID_ARGUMENT,
                       "--from-deepspeed: autoep_size=%d exceeds num_experts=%d", s->ep,
                       s->experts);
fail:
    return st;
}
