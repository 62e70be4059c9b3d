/* Status names and the per-thread message of the last failing call. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "internal.h"

#define SELDP_ERROR_MAX 1024

static _Thread_local char last_error[SELDP_ERROR_MAX];

const char *seldp_status_name(seldp_status status)
{
    switch (status) {
    case SELDP_OK:
        return "SELDP_OK";
    case SELDP_ERR_INVALID_ARGUMENT:
        return "SELDP_ERR_INVALID_ARGUMENT";
    case SELDP_ERR_NOMEM:
        return "SELDP_ERR_NOMEM";
    case SELDP_ERR_NOT_FOUND:
        return "SELDP_ERR_NOT_FOUND";
    case SELDP_ERR_DUPLICATE:
        return "SELDP_ERR_DUPLICATE";
    case SELDP_ERR_DTYPE:
        return "SELDP_ERR_DTYPE";
    case SELDP_ERR_SHAPE:
        return "SELDP_ERR_SHAPE";
    case SELDP_ERR_DEVICE:
        return "SELDP_ERR_DEVICE";
    case SELDP_ERR_ALIAS:
        return "SELDP_ERR_ALIAS";
    case SELDP_ERR_SCHEMA:
        return "SELDP_ERR_SCHEMA";
    case SELDP_ERR_DISAGREE:
        return "SELDP_ERR_DISAGREE";
    case SELDP_ERR_MISSING_GRADIENT:
        return "SELDP_ERR_MISSING_GRADIENT";
    case SELDP_ERR_FROZEN:
        return "SELDP_ERR_FROZEN";
    case SELDP_ERR_NONFINITE:
        return "SELDP_ERR_NONFINITE";
    case SELDP_ERR_OVERFLOW:
        return "SELDP_ERR_OVERFLOW";
    case SELDP_ERR_ABORTED:
        return "SELDP_ERR_ABORTED";
    case SELDP_ERR_TIMEOUT:
        return "SELDP_ERR_TIMEOUT";
    case SELDP_ERR_TRANSPORT:
        return "SELDP_ERR_TRANSPORT";
    case SELDP_ERR_UNSUPPORTED:
        return "SELDP_ERR_UNSUPPORTED";
    case SELDP_ERR_PARSE:
        return "SELDP_ERR_PARSE";
    case SELDP_ERR_IO:
        return "SELDP_ERR_IO";
    case SELDP_ERR_INTERNAL:
        return "SELDP_ERR_INTERNAL";
    case SELDP_ERR_GRADS_UNDEFINED:
        return "SELDP_ERR_GRADS_UNDEFINED";
    case SELDP_ERR_PARAMS_UNDEFINED:
        return "SELDP_ERR_PARAMS_UNDEFINED";
    }
    return "SELDP_ERR_UNKNOWN";
}

const char *seldp_last_error(void)
{
    return last_error;
}

void seldp_clear_error(void)
{
    last_error[0] = '\0';
}

seldp_status seldp__fail(seldp_status status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return status;
}

void seldp__set_error(const char *message)
{
    if (message != last_error)
        snprintf(last_error, sizeof last_error, "%s", message);
}
