/* The training step's options (docs/harness.md, The training step): the names of their values;
 * their rows are in options_rows_training.inc, their rules between options in options_check.c.
 * What they require of the layout and the devices is checked where the run is created
 * (microbatch.c, pipeline.c, zero.c, loss_scale.c). */
#define _POSIX_C_SOURCE 200809L

#include <stdio.h>

#include "options.h"

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
