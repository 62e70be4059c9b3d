/* The training step's options (docs/harness.md, The training step): their defaults and their
 * parsing, beside the table rows of options_table.c. What they require of each other and of
 * the layout is checked where the run is created (microbatch.c). */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "options.h"
#include "options_impl.h"

void hx_step_options_default(hx_options *o)
{
    o->micro_batches = 1;
}

void hx_step_option_default_text(int id, char *buf, size_t size)
{
    switch (id) {
    case OPT_MICRO_BATCHES:
        snprintf(buf, size, "1");
        break;
    default:
        buf[0] = '\0';
    }
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
    default:
        return false;
    }
}
