/* out.c — the one writer of every file flashlm writes (flm_out, include/flashlm_tools.h "Output files";
 * docs/SECURITY.md): checks on the path, a lock, a unique temporary, fsync and rename. The tools tier's: the runtime
 * writes no file. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "flashlm_tools.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/error.h"
#include "core/files.h"

/* ---- the checked writer ------------------------------------------------------------------------------------- */

#define OUT_PATH_MAX 4096 /* the output path, and its temporary and lock names (the path plus 12 bytes) */

/* The temporaries and locks of the writers open now, for flm_out_remove_temporaries (a signal handler): a slot's
 * names are written before it is marked used, and it is marked free before they change. */
typedef struct out_slot {
    char tmp[OUT_PATH_MAX + 16], lock[OUT_PATH_MAX + 16];
    volatile sig_atomic_t used;
} out_slot;
#define OUT_SLOTS 8
static out_slot g_slots[OUT_SLOTS];
static pthread_mutex_t g_slots_mu = PTHREAD_MUTEX_INITIALIZER;

struct flm_out {
    char path[OUT_PATH_MAX], tmp[OUT_PATH_MAX + 16], lock[OUT_PATH_MAX + 16];
    unsigned flags;
    int fd, lock_fd, slot;
    FILE *fp;
};

/* The folder a new output goes into: it exists, is a folder, and this process may create files in it. Said before
 * any work (`run --stats-json /missing/s.json` generated everything, then failed at its lock); creating the
 * temporary is still the final word (a read-only mount that access() cannot see, a full disk). */
static flm_status check_folder(const char *path, flm_error *err) {
    char dir[OUT_PATH_MAX];
    const char *slash = strrchr(path, '/');
    if (!slash) snprintf(dir, sizeof dir, ".");
    else if (slash == path) snprintf(dir, sizeof dir, "/");
    else snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
    struct stat st;
    if (stat(dir, &st) != 0)
        return flm_fail(err, FLM_ERR_IO, "%s: cannot write it: its folder %s: %s", path, dir, strerror(errno));
    if (!S_ISDIR(st.st_mode))
        return flm_fail(err, FLM_ERR_IO, "%s: cannot write it: %s is %s, not a folder", path, dir,
                        S_ISREG(st.st_mode) ? "a file" : flm_file_kind(st.st_mode));
    if (access(dir, W_OK | X_OK) != 0)
        return flm_fail(err, FLM_ERR_IO, "%s: cannot write in its folder %s: %s", path, dir, strerror(errno));
    return FLM_OK;
}

flm_status flm_out_check(const char *path, const char *src, unsigned flags, flm_error *err) {
    if (!path || !*path) return flm_fail(err, FLM_ERR_ARG, "no output path given");
    if (strlen(path) >= OUT_PATH_MAX) return flm_fail(err, FLM_ERR_ARG, "%.64s...: output path too long", path);
    struct stat d, s;
    if (lstat(path, &d) != 0) {
        if (errno == ENOENT) return check_folder(path, err); /* a new file: its folder must take it */
        return flm_fail(err, FLM_ERR_IO, "%s: cannot check the output path: %s", path, strerror(errno));
    }
    if (S_ISLNK(d.st_mode))
        return flm_fail(err, FLM_ERR_ARG, "%s: is a symbolic link; flashlm does not write through links (the link "
                        "would be replaced, or its target overwritten): give the target's own path", path);
    if (!S_ISREG(d.st_mode))
        return flm_fail(err, FLM_ERR_ARG, "%s: is %s, not a regular file; refusing to write onto it", path,
                        flm_file_kind(d.st_mode));
    if (src && !(flags & FLM_OUT_SELF) && stat(src, &s) == 0 && s.st_dev == d.st_dev && s.st_ino == d.st_ino)
        return flm_fail(err, FLM_ERR_ARG, "%s: is the model being read (%s); choose another output path", path, src);
    if (!(flags & FLM_OUT_REPLACE))
        return flm_fail(err, FLM_ERR_ARG, "%s: already exists; use --force to replace it", path);
    return FLM_OK;
}

static void slot_release(int i) {
    if (i < 0) return;
    pthread_mutex_lock(&g_slots_mu);
    g_slots[i].used = 0;
    pthread_mutex_unlock(&g_slots_mu);
}

static int slot_take(const char *tmp, const char *lock) {
    pthread_mutex_lock(&g_slots_mu);
    int got = -1;
    for (int i = 0; i < OUT_SLOTS && got < 0; i++)
        if (!g_slots[i].used) {
            snprintf(g_slots[i].tmp, sizeof g_slots[i].tmp, "%s", tmp);
            snprintf(g_slots[i].lock, sizeof g_slots[i].lock, "%s", lock);
            g_slots[i].used = 1;
            got = i;
        }
    pthread_mutex_unlock(&g_slots_mu);
    return got; /* none free (more than 8 writers at once): that one is not removed on a signal */
}

void flm_out_remove_temporaries(void) {
    for (int i = 0; i < OUT_SLOTS; i++)
        if (g_slots[i].used) {
            unlink(g_slots[i].tmp);
            unlink(g_slots[i].lock);
        }
}

/* Lock "<path>.lock": created when missing, held with flock, removed by whoever holds it when done. A lock taken on
 * a file that its holder removed meanwhile is not the lock: check that the locked file is still the one named. */
static flm_status take_lock(flm_out *o, flm_error *err) {
    for (int tries = 0; tries < 100; tries++) {
        int fd = open(o->lock, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0644);
        if (fd < 0)
            return flm_fail(err, FLM_ERR_IO, "%s: cannot create the lock %s: %s", o->path, o->lock, strerror(errno));
        struct stat a, b;
        if (fstat(fd, &a) != 0 || !S_ISREG(a.st_mode)) {
            close(fd);
            return flm_fail(err, FLM_ERR_IO, "%s: the lock %s is not a regular file", o->path, o->lock);
        }
        if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
            int e = errno;
            close(fd);
            if (e == EWOULDBLOCK)
                return flm_fail(err, FLM_ERR_IO, "%s: another flashlm is writing this file now (it holds %s); wait "
                                "for it to finish or choose another output path", o->path, o->lock);
            return flm_fail(err, FLM_ERR_IO, "%s: cannot lock %s: %s", o->path, o->lock, strerror(e));
        }
        if (stat(o->lock, &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino) {
            o->lock_fd = fd;
            return FLM_OK;
        }
        close(fd); /* its holder removed it as we opened it: take the new one */
    }
    return flm_fail(err, FLM_ERR_IO, "%s: cannot take the lock %s", o->path, o->lock);
}

static void drop_lock(flm_out *o) {
    if (o->lock_fd < 0) return;
    unlink(o->lock); /* while held: see take_lock */
    close(o->lock_fd);
    o->lock_fd = -1;
}

/* Remove "<path>.tmp.XXXXXX" (six hex digits: the names flm_out_open makes) left by writers that died without
 * cleaning up (SIGKILL, a power cut). Called with "<path>.lock" held: every live writer of path holds it from
 * before its temporary exists until after the temporary is renamed or removed, so any such file now is a dead
 * writer's. Only regular files are removed; a link or anything else of that name is left alone. */
static void remove_stale_temporaries(const flm_out *o) {
    char dir[OUT_PATH_MAX];
    snprintf(dir, sizeof dir, "%s", o->path);
    char *slash = strrchr(dir, '/');
    const char *base = slash ? slash + 1 : o->path;
    if (!slash) snprintf(dir, sizeof dir, ".");
    else if (slash == dir) dir[1] = 0;
    else *slash = 0;
    const size_t nb = strlen(base);
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) return;
    DIR *d = fdopendir(dfd);
    if (!d) { close(dfd); return; }
    for (struct dirent *e; (e = readdir(d));) {
        const char *n = e->d_name;
        if (strlen(n) != nb + 11 || strncmp(n, base, nb) != 0 || strncmp(n + nb, ".tmp.", 5) != 0) continue;
        bool hex = true;
        for (int i = 0; i < 6; i++) hex = hex && strchr("0123456789abcdef", n[nb + 5 + i]) && n[nb + 5 + i];
        struct stat st;
        if (hex && fstatat(dfd, n, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode)) unlinkat(dfd, n, 0);
    }
    closedir(d);
}

/* Test hook (tests/test_harden33.c, not documented for users): with FLASHLM_TEST_COMMIT_WAIT naming a FIFO, a commit
 * reads it to its end before its last check and rename, so a test can make a file appear at the path at exactly
 * that point without sleeping. */
static void commit_wait_hook(void) {
    const char *fifo = getenv("FLASHLM_TEST_COMMIT_WAIT");
    if (!fifo || !*fifo) return;
    int fd = open(fifo, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;
    char buf[64];
    while (read(fd, buf, sizeof buf) > 0) {}
    close(fd);
}

flm_status flm_out_open(const char *path, const char *src, unsigned flags, flm_out **out, flm_error *err) {
    *out = NULL;
    flm_status st = flm_out_check(path, src, flags, err);
    if (st) return st;
    flm_out *o = calloc(1, sizeof *o);
    if (!o) return flm_fail(err, FLM_ERR_NOMEM, "%s: out of memory", path);
    o->fd = o->lock_fd = o->slot = -1;
    o->flags = flags;
    snprintf(o->path, sizeof o->path, "%s", path);
    snprintf(o->lock, sizeof o->lock, "%s.lock", path);
    if ((st = take_lock(o, err)) || (st = flm_out_check(path, src, flags, err))) { /* again: it may have appeared */
        drop_lock(o);
        free(o);
        return st;
    }
    remove_stale_temporaries(o); /* the lock is ours: any "<path>.tmp.XXXXXX" is a dead writer's */
    /* a unique temporary beside the output (the same file system, so the rename is atomic); O_EXCL: never someone
     * else's file, never through a link; mode 0644 less the umask, as any new file */
    static unsigned counter;
    unsigned seed = (unsigned)getpid() * 2654435761u ^ (unsigned)time(NULL) ^ __atomic_add_fetch(&counter, 0x9e37u, __ATOMIC_RELAXED);
    for (int tries = 0; tries < 100 && o->fd < 0; tries++) {
        seed = seed * 1103515245u + 12345u;
        snprintf(o->tmp, sizeof o->tmp, "%s.tmp.%06x", path, (seed >> 4) & 0xffffffu);
        o->slot = slot_take(o->tmp, o->lock);
        o->fd = open(o->tmp, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644);
        if (o->fd < 0) {
            int e = errno;
            slot_release(o->slot);
            o->slot = -1;
            if (e != EEXIST) {
                st = flm_fail(err, FLM_ERR_IO, "%s: cannot create: %s", o->tmp, strerror(e));
                break;
            }
        }
    }
    if (o->fd < 0) {
        if (!st) st = flm_fail(err, FLM_ERR_IO, "%s: cannot find a free temporary name", path);
        drop_lock(o);
        free(o);
        return st;
    }
    *out = o;
    return FLM_OK;
}

FILE *flm_out_stream(flm_out *o) {
    if (!o->fp) o->fp = fdopen(o->fd, "w+b");
    return o->fp;
}

int flm_out_fd(const flm_out *o) { return o->fd; }

const char *flm_out_temp(const flm_out *o) { return o->tmp; }

const char *flm_out_path(const flm_out *o) { return o->path; }

static void out_free(flm_out *o, bool remove_tmp) {
    if (o->fp) fclose(o->fp);
    else if (o->fd >= 0) close(o->fd);
    if (remove_tmp) unlink(o->tmp);
    slot_release(o->slot);
    drop_lock(o);
    free(o);
}

void flm_out_abort(flm_out *o) {
    if (o) out_free(o, true);
}

flm_status flm_out_commit(flm_out *o, flm_error *err) {
    if (!o) return flm_fail(err, FLM_ERR_ARG, "no output");
    flm_status st = FLM_OK;
    if (o->fp && (fflush(o->fp) != 0 || ferror(o->fp)))
        st = flm_fail(err, FLM_ERR_IO, "%s: cannot write: %s", o->tmp, strerror(errno ? errno : EIO));
    else if (fsync(o->fd) != 0 && errno != EINVAL && errno != EROFS)
        st = flm_fail(err, FLM_ERR_IO, "%s: cannot write (fsync): %s", o->tmp, strerror(errno));
    int rc = o->fp ? fclose(o->fp) : close(o->fd);
    o->fp = NULL;
    o->fd = -1;
    if (!st && rc != 0) st = flm_fail(err, FLM_ERR_IO, "%s: cannot write (close): %s", o->tmp, strerror(errno));
    if (!st) commit_wait_hook();
    /* what path is now: it may have changed while the file was written (a link or a device put there) */
    if (!st) st = flm_out_check(o->path, NULL, o->flags, err);
    if (!st) {
        if (o->flags & FLM_OUT_REPLACE) rc = rename(o->tmp, o->path);
        else {
            rc = renameat2(AT_FDCWD, o->tmp, AT_FDCWD, o->path, RENAME_NOREPLACE);
            if (rc != 0 && (errno == EINVAL || errno == ENOSYS)) { /* a file system without it: link refuses too */
                rc = link(o->tmp, o->path);
                if (rc == 0) unlink(o->tmp);
            }
        }
        if (rc != 0 && errno == EEXIST)
            st = flm_fail(err, FLM_ERR_ARG, "%s: already exists (created while flashlm wrote it); use --force to "
                          "replace it", o->path);
        else if (rc != 0)
            st = flm_fail(err, FLM_ERR_IO, "%s: cannot rename onto %s: %s", o->tmp, o->path, strerror(errno));
    }
    if (!st) { /* make the rename durable: fsync the folder */
        char dir[OUT_PATH_MAX];
        snprintf(dir, sizeof dir, "%s", o->path);
        char *slash = strrchr(dir, '/');
        if (!slash) snprintf(dir, sizeof dir, ".");
        else if (slash == dir) dir[1] = 0;
        else *slash = 0;
        int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd >= 0) { fsync(dfd); close(dfd); }
    }
    out_free(o, st != FLM_OK);
    return st;
}
