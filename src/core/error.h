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

#endif
