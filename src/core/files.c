#include "core/files.h"

#include <sys/stat.h>

#include "core/error.h"

flm_status flm_check_output(const char *dst, const char *src, flm_error *err) {
    struct stat d, s;
    if (stat(dst, &d) != 0) return FLM_OK; /* does not exist (or cannot be seen): creating it will tell */
    if (!S_ISREG(d.st_mode))
        return flm_fail(err, FLM_ERR_ARG, "%s: exists and is not a regular file; refusing to replace it", dst);
    if (src && stat(src, &s) == 0 && s.st_dev == d.st_dev && s.st_ino == d.st_ino)
        return flm_fail(err, FLM_ERR_ARG, "%s: the output is the input file; choose another output path", dst);
    return FLM_OK;
}

const char *flm_file_kind(unsigned mode) {
    if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
    if (S_ISDIR(mode)) return "a directory";
    if (S_ISCHR(mode)) return "a character device";
    if (S_ISBLK(mode)) return "a block device";
    if (S_ISSOCK(mode)) return "a socket";
    return "a special file";
}
