/* files.c — the checks on the files flashlm reads (the writer of the files it writes is the tools tier's:
 * write/out.c). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "core/files.h"

#include <sys/stat.h>

const char *flm_file_kind(unsigned mode) {
    if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
    if (S_ISDIR(mode)) return "a directory";
    if (S_ISCHR(mode)) return "a character device";
    if (S_ISBLK(mode)) return "a block device";
    if (S_ISSOCK(mode)) return "a socket";
    if (S_ISLNK(mode)) return "a symbolic link";
    return "a special file";
}
