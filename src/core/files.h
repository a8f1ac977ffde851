/* files.h — checks on the files the library reads. Internal. (The writer of the files flashlm writes, flm_out_*, is
 * the tools tier's: src/write/out.c, declared in include/flashlm_tools.h; the runtime writes no file.) */
#ifndef FLM_CORE_FILES_H
#define FLM_CORE_FILES_H
#include <stdbool.h>
#include <stdio.h>
#include "flashlm.h"

/* What a stat mode is, in words, for errors about a path that is not a regular file: "a FIFO (named pipe)",
 * "a directory", "a character device", "a block device", "a socket", "a symbolic link", else "a special file".
 * Static string. */
const char *flm_file_kind(unsigned mode);

/* path opened for reading ("rb") when it is a regular file. FLM_OK with *fp; else *fp NULL and FLM_ERR_IO naming
 * path: "cannot open" with errno's words (*missing set when that is ENOENT and missing is not NULL: the caller
 * decides whether a missing file is an error), or what it is when not a regular file (a FIFO is refused without
 * waiting for a writer; a directory would read as an error). */
flm_status flm_fopen_regular(const char *path, FILE **fp, bool *missing, flm_error *err);

#endif
