/* files.h — checks on the files the library reads and writes. Internal. */
#ifndef FLM_CORE_FILES_H
#define FLM_CORE_FILES_H
#include "flashlm.h"

/* Refuse an output path that exists and is not a regular file (a device, a directory, a FIFO: replacing it by rename
 * would be destructive) or that is the same file as src (src may be NULL). FLM_ERR_ARG with a message naming dst. */
flm_status flm_check_output(const char *dst, const char *src, flm_error *err);

/* What a stat mode is, in words, for errors about a path that is not a regular file: "a FIFO (named pipe)",
 * "a directory", "a character device", "a block device", "a socket", else "not a regular file". Static string. */
const char *flm_file_kind(unsigned mode);

#endif
