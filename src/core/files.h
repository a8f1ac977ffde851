/* files.h — checks on the files the library reads. Internal. (The writer of the files flashlm writes, flm_out_*, is
 * the tools tier's: src/write/out.c, declared in include/flashlm_tools.h; the runtime writes no file.) */
#ifndef FLM_CORE_FILES_H
#define FLM_CORE_FILES_H
#include <stdio.h>
#include "flashlm.h"

/* What a stat mode is, in words, for errors about a path that is not a regular file: "a FIFO (named pipe)",
 * "a directory", "a character device", "a block device", "a socket", "a symbolic link", else "a special file".
 * Static string. */
const char *flm_file_kind(unsigned mode);

#endif
