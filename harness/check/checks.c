/* The checks' vocabulary (checks.h, docs/harness.md, Checks): their names, the tensor
 * classes, the recording of one outcome, the tensors' FP32 views. The checks themselves run
 * from step_checks.c; every outcome is counted in run->checks, none stops the run. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checks.h"

static const char *const check_names[HX_CHECK_COUNT] = {
    [HX_CHECK_DIFFER_BEFORE_INIT] = "replicas differ before initialize",
    [HX_CHECK_INIT_REPLICAS] = "replicas equal their root after initialize",
    [HX_CHECK_INIT_UNTOUCHED] = "initialize writes only its selected parameters",
    [HX_CHECK_LOSS] = "loss equals the FP64 reference",
    [HX_CHECK_ROUTING] = "tokens per expert equal the reference's",
    [HX_CHECK_REDUCTION] = "reductions equal the FP64 mean or sum of their inputs",
    [HX_CHECK_RANK_GRADS] = "ranks' FP32 gradients vs the FP64 reference",
    [HX_CHECK_GRAD_ERROR] = "reduced gradients vs the FP64 reference",
    [HX_CHECK_GRAD_REPLICAS] = "reduced gradients bit-identical in each group",
    [HX_CHECK_PARAM_REPLICAS] = "parameters bit-identical in each group",
    [HX_CHECK_REDUCE_UNTOUCHED] = "reductions touch only their selected gradients",
    [HX_CHECK_ABSENT] = "experts no token reached stay absent",
    [HX_CHECK_GRAD_NORM] = "global gradient norm vs the FP64 reference",
    [HX_CHECK_LOADED_REPLICAS] = "replicas bit-identical after --resume",
    [HX_CHECK_UPDATE] = "updates equal the FP64 optimizer step",
};

const char *hx_check_name(hx_check_id id)
{
    return (unsigned)id < HX_CHECK_COUNT ? check_names[id] : "invalid";
}

static const char *const class_names[HX_CLASS_COUNT] = {
    [HX_CLASS_EMBED] = "embed",
    [HX_CLASS_NORM] = "norm",
    [HX_CLASS_ROUTER] = "router",
    [HX_CLASS_FINAL_NORM] = "final_norm",
    [HX_CLASS_EXPERT_W1] = "expert.w1",
    [HX_CLASS_EXPERT_W2] = "expert.w2",
    [HX_CLASS_LORA_A] = "lora_a",
    [HX_CLASS_LORA_B] = "lora_b",
    [HX_CLASS_SHARED_EXPERT] = "shared_expert",
};

const char *hx_class_name(hx_tensor_class c)
{
    return (unsigned)c < HX_CLASS_COUNT ? class_names[c] : "invalid";
}

hx_tensor_class hx_class_of(const char *path)
{
    if (strcmp(path, "embed.weight") == 0 || strcmp(path, "lm_head.weight") == 0)
        return HX_CLASS_EMBED;
    if (strcmp(path, "final_norm.weight") == 0)
        return HX_CLASS_FINAL_NORM;
    if (strstr(path, ".shared_expert."))
        return HX_CLASS_SHARED_EXPERT;
    if (strstr(path, ".lora_a."))
        return HX_CLASS_LORA_A;
    if (strstr(path, ".lora_b."))
        return HX_CLASS_LORA_B;
    if (strstr(path, ".w1."))
        return HX_CLASS_EXPERT_W1;
    if (strstr(path, ".w2."))
        return HX_CLASS_EXPERT_W2;
    if (strstr(path, ".router."))
        return HX_CLASS_ROUTER;
    return HX_CLASS_NORM;
}

void hx_check_vnote(hx_check_result *c, bool failed, double value, const char *fmt, va_list ap)
{
    c->tested++;
    if (c->metric && (value > c->worst || isnan(value)))
        c->worst = value;
    if (failed && c->failed++ == 0)
        vsnprintf(c->first_failure, sizeof c->first_failure, fmt, ap);
}

void hx_tensor_to_f32(const seldp_tensor *t, float *out)
{
    size_t n = seldp_tensor_numel(t);
    if (t->dtype == SELDP_F32)
        memcpy(out, t->data, n * sizeof(float));
    else
        seldp_half_to_f32(t->dtype, t->data, out, n);
}

void hx_tensor_from_f32(const float *in, seldp_tensor *t)
{
    size_t n = seldp_tensor_numel(t);
    if (t->dtype == SELDP_F32)
        memcpy(t->data, in, n * sizeof(float));
    else
        seldp_f32_to_half(t->dtype, in, t->data, n);
}

void hx_record_local(hx_check_result *c, bool failed, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    hx_check_vnote(c, failed, 0, fmt, ap);
    va_end(ap);
}

void hx_check_vmetric(hx_check_result *c, bool failed, double ratio, double bound,
                      double resolution, const char *fmt, va_list ap)
{
    bool worse = c->tested == 0 || ratio > c->worst || isnan(ratio);
    if (isfinite(resolution) && resolution > c->resolution)
        c->resolution = resolution;
    hx_check_vnote(c, failed, ratio, fmt, ap);
    if (worse)
        c->bound = bound;
}
