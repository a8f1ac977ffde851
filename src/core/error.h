/* error.h — filling an flm_error. Internal. */
#ifndef FLM_CORE_ERROR_H
#define FLM_CORE_ERROR_H
#include "flashlm.h"

/* Format a message into err (when non-NULL) and return code, so callers can write
 *   return flm_fail(err, FLM_ERR_FORMAT, "%s: tensor '%s': offset %llu past end of file", path, name, off); */
#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
flm_status flm_fail(flm_error *err, flm_status code, const char *fmt, ...);

/* Clear err to FLM_OK with an empty message. */
void flm_error_clear(flm_error *err);

/* Where a component sends log messages (flashlm.h, "Log messages"): fn NULL drops them. */
typedef struct flm_logger {
    flm_log_fn fn;
    void *user;
} flm_logger;

/* Format one message (at most 1023 bytes; no trailing newline) and pass it to lg->fn. lg NULL or lg->fn NULL: the
 * message is dropped without being formatted. Never writes to stdout or stderr. */
#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
void flm_log(const flm_logger *lg, flm_log_level level, const char *fmt, ...);

#endif
