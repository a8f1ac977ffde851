/* files.c — the checks on the files flashlm reads (the writer of the files it writes is the tools tier's:
 * write/out.c). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "core/files.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"

const char *flm_file_kind(unsigned mode) {
    if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
    if (S_ISDIR(mode)) return "a directory";
    if (S_ISCHR(mode)) return "a character device";
    if (S_ISBLK(mode)) return "a block device";
    if (S_ISSOCK(mode)) return "a socket";
    if (S_ISLNK(mode)) return "a symbolic link";
    return "a special file";
}

flm_status flm_fopen_regular(const char *path, FILE **fp, bool *missing, flm_error *err) {
    if (missing) *missing = false;
    *fp = NULL;
    /* O_NONBLOCK: opening a FIFO does not wait for a writer; cleared once fstat says a regular file */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        const int e = errno;
        if (missing) *missing = e == ENOENT;
        return flm_fail(err, FLM_ERR_IO, "%s: cannot open: %s", path, strerror(e));
    }
    struct stat sb;
    const bool ok = fstat(fd, &sb) == 0;
    if (!ok || !S_ISREG(sb.st_mode)) {
        close(fd);
        return flm_fail(err, FLM_ERR_IO, "%s: is %s, not a regular file", path,
                        ok ? flm_file_kind(sb.st_mode) : "unreadable");
    }
    const int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) < 0 || !(*fp = fdopen(fd, "rb"))) {
        const int e = errno;
        close(fd);
        return flm_fail(err, FLM_ERR_IO, "%s: cannot open: %s", path, strerror(e));
    }
    return FLM_OK;
}
