#include "core/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

flm_status flm_fail(flm_error *err, flm_status code, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
        err->code = code;
    }
    return code;
}

void flm_log(const flm_logger *lg, flm_log_level level, const char *fmt, ...) {
    if (!lg || !lg->fn) return;
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    lg->fn(lg->user, level, msg);
}

int flm_version(const char **str) {
    if (str) *str = FLM_VERSION_STRING;
    return FLM_VERSION_NUMBER;
}

void flm_error_clear(flm_error *err) {
    if (err) {
        err->code = FLM_OK;
        err->msg[0] = '\0';
    }
}

const char *flm_status_str(flm_status s) {
    switch (s) {
    case FLM_OK: return "ok";
    case FLM_ERR_IO: return "I/O error";
    case FLM_ERR_FORMAT: return "bad format";
    case FLM_ERR_NOMEM: return "out of memory";
    case FLM_ERR_UNSUPPORTED: return "unsupported";
    case FLM_ERR_ARG: return "bad argument";
    case FLM_ERR_BUDGET: return "memory budget too small";
    case FLM_ERR_CHECKSUM: return "checksum mismatch";
    case FLM_ERR_CONTEXT: return "context full";
    case FLM_ERR_CANCELLED: return "cancelled";
    }
    return "unknown error";
}
