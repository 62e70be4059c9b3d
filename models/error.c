/* tiny-moe's error channel: the message of the last failing tm_ call, per thread. The model
 * keeps its own channel rather than writing into the library's: a failure of a seldp call
 * inside a tm_ function is carried over with its message (tm__fail_lib). */
#include <stdarg.h>
#include <stdio.h>

#include "tm_internal.h"

#define TM_ERROR_BYTES 1024

static _Thread_local char last_error[TM_ERROR_BYTES];

seldp_status tm__fail(seldp_status status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    /* the library's message belongs to an older failure now: callers that read both channels
     * (the harness) find the newer one */
    seldp_clear_error();
    return status;
}

seldp_status tm__fail_lib(seldp_status status, const char *fmt, ...)
{
    char context[TM_ERROR_BYTES / 2];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(context, sizeof context, fmt, ap);
    va_end(ap);
    const char *lib = seldp_last_error();
    return tm__fail(status, "%s: %s%s%s", context, seldp_status_name(status), lib[0] ? ": " : "",
                    lib);
}

const char *tm_last_error(void)
{
    return last_error;
}

void tm_clear_error(void)
{
    last_error[0] = '\0';
}
