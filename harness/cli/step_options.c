/* The training step's options (docs/harness.md, The training step): their defaults and their
 * parsing, beside the table rows of options_table.c. What they require of each other and of
 * the layout is checked where the run is created (microbatch.c). */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "options.h"
#include "options_impl.h"

void hx_step_options_default(hx_options *o)
{
    o->micro_batches = 1;
    o->optimizer = HX_OPT_SGD;
    o->adam_beta1 = 0.9;
    o->adam_beta2 = 0.999;
    o->adam_eps = 1e-8;
    o->weight_decay = 0.0;
    o->loss_scale_window = 1000;
    o->loss_scale_init = 1024.0;
}

const char *hx_optimizer_name(hx_optimizer opt)
{
    return opt == HX_OPT_ADAMW ? "adamw" : "sgd";
}

hx_pipe_schedule hx_pipe_schedule_of(const hx_options *o)
{
    return o->pipeline_schedule == HX_PIPE_DEFAULT ? HX_PIPE_1F1B : o->pipeline_schedule;
}

const char *hx_pipe_schedule_name(hx_pipe_schedule s)
{
    switch (s) {
    case HX_PIPE_AFAB:
        return "afab";
    case HX_PIPE_SEQUENTIAL:
        return "sequential";
    default:
        return "1f1b";
    }
}

const char *hx_step_sweep_refusal(const hx_options *o)
{
    /* AdamW's state, --zero 1's ranges and the loss scale go with the weights in lockstep
     * (lockstep.h); nothing of the step is refused today */
    (void)o;
    return NULL;
}

void hx_step_option_default_text(int id, char *buf, size_t size)
{
    switch (id) {
    case OPT_MICRO_BATCHES:
        snprintf(buf, size, "1");
        break;
    case OPT_PIPELINE_SCHEDULE:
        snprintf(buf, size, "1f1b");
        break;
    case OPT_OPTIMIZER:
        snprintf(buf, size, "sgd");
        break;
    case OPT_ADAM_BETA1:
        snprintf(buf, size, "0.9");
        break;
    case OPT_ADAM_BETA2:
        snprintf(buf, size, "0.999");
        break;
    case OPT_ADAM_EPS:
        snprintf(buf, size, "1e-08");
        break;
    case OPT_WEIGHT_DECAY:
    case OPT_ZERO:
        snprintf(buf, size, "0");
        break;
    case OPT_LOSS_SCALE:
    case OPT_INJECT_OVERFLOW:
        snprintf(buf, size, "none");
        break;
    case OPT_LOSS_SCALE_WINDOW:
        snprintf(buf, size, "1000");
        break;
    case OPT_LOSS_SCALE_INIT:
        snprintf(buf, size, "1024");
        break;
    default:
        buf[0] = '\0';
    }
}

/* A finite number in [min, max] (min excluded when open_min, max when open_max). */
static bool parse_real(const char *text, double min, double max, bool open_min, bool open_max,
                       double *out)
{
    char *end = NULL;
    errno = 0;
    double v = strtod(text, &end);
    if (errno != 0 || end == text || *end != '\0' || !isfinite(v) || v < min || v > max ||
        (open_min && v == min) || (open_max && v == max))
        return false;
    *out = v;
    return true;
}

static bool parse_count(const char *text, long min, long max, long *out)
{
    char *end = NULL;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0' || v < min || v > max)
        return false;
    *out = v;
    return true;
}

bool hx_step_option_parse(int id, const char *arg, hx_options *o, bool *ok, const char **expected)
{
    long v = 0;
    switch (id) {
    case OPT_MICRO_BATCHES:
        *ok = parse_count(arg, 1, 4096, &v);
        *expected = "an integer in 1..4096";
        if (*ok)
            o->micro_batches = (int)v;
        return true;
    case OPT_PIPELINE_SCHEDULE:
        *ok = true;
        *expected = "1f1b, afab or sequential";
        if (strcmp(arg, "1f1b") == 0)
            o->pipeline_schedule = HX_PIPE_1F1B;
        else if (strcmp(arg, "afab") == 0)
            o->pipeline_schedule = HX_PIPE_AFAB;
        else if (strcmp(arg, "sequential") == 0)
            o->pipeline_schedule = HX_PIPE_SEQUENTIAL;
        else
            *ok = false;
        return true;
    case OPT_OPTIMIZER:
        *ok = strcmp(arg, "sgd") == 0 || strcmp(arg, "adamw") == 0;
        *expected = "sgd or adamw";
        if (*ok)
            o->optimizer = strcmp(arg, "adamw") == 0 ? HX_OPT_ADAMW : HX_OPT_SGD;
        return true;
    case OPT_ADAM_BETA1:
    case OPT_ADAM_BETA2:
        *ok = parse_real(arg, 0.0, 1.0, false, true,
                         id == OPT_ADAM_BETA1 ? &o->adam_beta1 : &o->adam_beta2);
        *expected = "a number in [0, 1)";
        o->adam_given = true;
        return true;
    case OPT_ADAM_EPS:
        *ok = parse_real(arg, 0.0, 1.0, true, false, &o->adam_eps);
        *expected = "a number in (0, 1]";
        o->adam_given = true;
        return true;
    case OPT_WEIGHT_DECAY:
        *ok = parse_real(arg, 0.0, 1.0, false, false, &o->weight_decay);
        *expected = "a number in [0, 1]";
        o->adam_given = true;
        return true;
    case OPT_ZERO:
        *ok = parse_count(arg, 0, 1, &v);
        *expected = "0 or 1";
        if (*ok)
            o->zero = (int)v;
        return true;
    case OPT_LOSS_SCALE:
        o->loss_scale_given = true;
        o->loss_scale = 0.0;
        *ok = strcmp(arg, "dynamic") == 0 ||
              (parse_real(arg, 0.0, 1e30, true, false, &o->loss_scale) && o->loss_scale > 0);
        *expected = "dynamic or a number > 0";
        return true;
    case OPT_LOSS_SCALE_INIT:
        *ok = parse_real(arg, 1.0, 1e30, false, false, &o->loss_scale_init);
        *expected = "a number >= 1";
        return true;
    case OPT_LOSS_SCALE_WINDOW:
        *ok = parse_count(arg, 1, 1000000, &v);
        *expected = "an integer in 1..1000000";
        if (*ok)
            o->loss_scale_window = (int)v;
        return true;
    case OPT_INJECT_OVERFLOW:
        *ok = parse_count(arg, 1, 1000000, &v);
        *expected = "a step, 1 or more";
        if (*ok)
            o->inject_overflow = (int)v;
        return true;
    default:
        return false;
    }
}
