/* replay.c — runs a fuzz target's LLVMFuzzerTestOneInput over files, without libFuzzer, so the regression inputs
 * (tests/fuzz/regress/TARGET) and seeds (tests/fuzz/seeds/TARGET) are replayed by CTest with any compiler:
 *
 *   replay_TARGET PATH...    each PATH a file, or a directory whose regular files are replayed in name order
 *
 * A path that does not exist is skipped with a note (a fresh checkout has no findings yet). A finding crashes the
 * process as it would under libFuzzer (a sanitizer report in the sanitizer build, abort() for a failed check). */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv) __attribute__((weak));

static size_t g_inputs;

static void replay_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) { fprintf(stderr, "replay: cannot open %s\n", path); exit(1); }
    size_t cap = 1 << 16, len = 0, n;
    uint8_t *buf = malloc(cap);
    while (buf && (n = fread(buf + len, 1, cap - len, f)) > 0) {
        len += n;
        if (len == cap) buf = realloc(buf, cap *= 2);
    }
    fclose(f);
    if (!buf) { fprintf(stderr, "replay: out of memory reading %s\n", path); exit(1); }
    /* an exact-size copy, so reading one byte past the input is caught under AddressSanitizer as with libFuzzer */
    uint8_t *exact = malloc(len ? len : 1);
    if (!exact) exit(1);
    memcpy(exact, buf, len);
    free(buf);
    fprintf(stderr, "replay: %s (%zu bytes)\n", path, len);
    LLVMFuzzerTestOneInput(exact, len);
    free(exact);
    g_inputs++;
}

static int by_name(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static void replay_path(const char *path) {
    struct stat sb;
    if (stat(path, &sb) != 0) { fprintf(stderr, "replay: %s does not exist: skipped\n", path); return; }
    if (!S_ISDIR(sb.st_mode)) { replay_file(path); return; }
    DIR *d = opendir(path);
    if (!d) { fprintf(stderr, "replay: cannot open directory %s\n", path); exit(1); }
    char **names = NULL;
    size_t n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.' || !strcmp(e->d_name, "README.md")) continue;
        if (n == cap && !(names = realloc(names, (cap = cap ? 2 * cap : 64) * sizeof *names))) exit(1);
        size_t len = strlen(path) + strlen(e->d_name) + 2;
        names[n] = malloc(len);
        snprintf(names[n++], len, "%s/%s", path, e->d_name);
    }
    closedir(d);
    if (n) qsort(names, n, sizeof *names, by_name);
    for (size_t i = 0; i < n; i++) {
        if (stat(names[i], &sb) == 0 && S_ISREG(sb.st_mode)) replay_file(names[i]);
        free(names[i]);
    }
    free(names);
}

int main(int argc, char **argv) {
    if (LLVMFuzzerInitialize) LLVMFuzzerInitialize(&argc, &argv);
    for (int i = 1; i < argc; i++) replay_path(argv[i]);
    fprintf(stderr, "replay: %zu inputs, no finding\n", g_inputs);
    return 0;
}
