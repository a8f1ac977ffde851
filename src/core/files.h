/* files.h — checks on the files the library reads, and the one writer of the files it writes. Internal; the writer
 * (flm_out_*) is public in flashlm_tools.h, where it is described. */
#ifndef FLM_CORE_FILES_H
#define FLM_CORE_FILES_H
#include "flashlm.h"
#include "flashlm_tools.h"

/* flm_out_check(dst, src, FLM_OUT_REPLACE): refuse an output path that is a link, exists and is not a regular file
 * (a device, a directory, a FIFO), or is the same file as src (src may be NULL). FLM_ERR_ARG naming dst. */
flm_status flm_check_output(const char *dst, const char *src, flm_error *err);

/* What a stat mode is, in words, for errors about a path that is not a regular file: "a FIFO (named pipe)",
 * "a directory", "a character device", "a block device", "a socket", "a symbolic link", else "a special file".
 * Static string. */
const char *flm_file_kind(unsigned mode);

#endif
