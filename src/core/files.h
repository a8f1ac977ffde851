/* files.h — checks on the files the library reads, and the one writer of the files it writes. Internal. The writer
 * (flm_out_*) is the runtime's own (flm_write_stats_json writes through it) and the tools tier's public interface:
 * include/flashlm_tools.h declares the same functions for programs and describes the rules (docs/SECURITY.md, "Output
 * files"); the runtime does not include that header (tests/test_layers.c), so they are declared here too. */
#ifndef FLM_CORE_FILES_H
#define FLM_CORE_FILES_H
#include <stdio.h>
#include "flashlm.h"

/* The checked writer (src/core/files.c; described in include/flashlm_tools.h, "Output files"). */
typedef struct flm_out flm_out;
#define FLM_OUT_REPLACE 1u /* an existing regular file at the path may be replaced */
#define FLM_OUT_SELF 2u    /* the path may be src itself */
FLM_API flm_status flm_out_check(const char *path, const char *src, unsigned flags, flm_error *err);
FLM_API flm_status flm_out_open(const char *path, const char *src, unsigned flags, flm_out **out, flm_error *err);
FLM_API FILE *flm_out_stream(flm_out *o);
FLM_API int flm_out_fd(const flm_out *o);
FLM_API const char *flm_out_temp(const flm_out *o);
FLM_API const char *flm_out_path(const flm_out *o);
FLM_API flm_status flm_out_commit(flm_out *o, flm_error *err);
FLM_API void flm_out_abort(flm_out *o);
FLM_API void flm_out_remove_temporaries(void);

/* flm_out_check(dst, src, FLM_OUT_REPLACE): refuse an output path that is a link, exists and is not a regular file
 * (a device, a directory, a FIFO), or is the same file as src (src may be NULL). FLM_ERR_ARG naming dst. */
flm_status flm_check_output(const char *dst, const char *src, flm_error *err);

/* What a stat mode is, in words, for errors about a path that is not a regular file: "a FIFO (named pipe)",
 * "a directory", "a character device", "a block device", "a socket", "a symbolic link", else "a special file".
 * Static string. */
const char *flm_file_kind(unsigned mode);

#endif
