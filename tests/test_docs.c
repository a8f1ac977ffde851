/* test_docs.c — the docs' tables say what the code does: README.md's modes table names exactly the modes the library
 * parses (flm_mode_name) and `flashlm run --help` lists them all; docs/ARCHITECTURE.md's kernel-level table names
 * exactly the library's levels (flm_kernels_level_name), and every FLASHLM_KERNELS=a|b|... the docs write lists them
 * in order; docs/ARCHITECTURE.md's environment table names exactly the variables the code reads (every getenv("X")
 * in src/ and tools/). */
#include "flashlm.h"
#include "testutil.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_NAMES 64

typedef struct names {
    char v[MAX_NAMES][64];
    int n;
} names;

static void add(names *s, const char *p, size_t len) {
    if (len >= sizeof s->v[0]) fail_msg("name too long: %.*s", (int)len, p);
    for (int i = 0; i < s->n; i++)
        if (strlen(s->v[i]) == len && !strncmp(s->v[i], p, len)) return;
    assert_true(s->n < MAX_NAMES);
    memcpy(s->v[s->n], p, len);
    s->v[s->n++][len] = 0;
}

static bool has(const names *s, const char *name) {
    for (int i = 0; i < s->n; i++)
        if (!strcmp(s->v[i], name)) return true;
    return false;
}

static char *read_doc(const char *rel) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", FLM_SOURCE_DIR, rel);
    size_t len;
    char *s = (char *)tu_read_file(path, &len);
    if (!s) fail_msg("cannot read %s", path);
    return s;
}

/* The first cell's `names` of each row of the markdown table whose header line starts with `header`: every
 * backquoted word of the cell (a cell may name several, comma-separated). */
static void table_names(const char *doc, const char *header, names *out) {
    out->n = 0;
    const char *p = strstr(doc, header);
    if (!p) fail_msg("no table headed '%s'", header);
    p = strchr(p, '\n');
    assert_non_null(p);
    p = strchr(p + 1, '\n'); /* past the |---| line */
    assert_non_null(p);
    for (p++; *p == '|'; p = strchr(p, '\n') + 1) {
        const char *end = strchr(p + 1, '|');
        assert_non_null(end);
        for (const char *q = p; (q = memchr(q, '`', (size_t)(end - q))) && q < end;) {
            const char *e = memchr(q + 1, '`', (size_t)(end - q - 1));
            assert_non_null(e);
            add(out, q + 1, (size_t)(e - q - 1));
            q = e + 1;
        }
        if (!strchr(p, '\n')) break;
    }
}

static void test_modes(void **state) {
    (void)state;
    char *readme = read_doc("README.md");
    names doc;
    table_names(readme, "| mode     | FFN weights", &doc);
    names code = {.n = 0};
    for (int m = 0; flm_mode_name((flm_mode)m); m++) add(&code, flm_mode_name((flm_mode)m), strlen(flm_mode_name(m)));
    assert_true(code.n >= 6);
    for (int i = 0; i < code.n; i++)
        if (!has(&doc, code.v[i])) fail_msg("README.md's modes table lacks mode `%s`", code.v[i]);
    for (int i = 0; i < doc.n; i++)
        if (!has(&code, doc.v[i])) fail_msg("README.md's modes table names `%s`, which is no mode", doc.v[i]);
    char *help = NULL;
    assert_int_equal(tu_run_cli("run --help", &help), 0);
    const char *line = strstr(help, "--mode MODE");
    assert_non_null(line);
    for (int i = 0; i < code.n; i++) {
        char want[80];
        snprintf(want, sizeof want, " %s ", code.v[i]);
        const char *eol = strchr(line, '(');
        if (!strstr(line, want) || strstr(line, want) > eol)
            fail_msg("flashlm run --help's --mode line does not list `%s`:\n%.200s", code.v[i], line);
    }
    free(help);
    free(readme);
}

static void test_kernel_levels(void **state) {
    (void)state;
    char *arch = read_doc("docs/ARCHITECTURE.md"), *readme = read_doc("README.md");
    names doc, code = {.n = 0};
    table_names(arch, "| level | CPU features", &doc);
    char joined[256] = "FLASHLM_KERNELS=";
    for (int l = 0; flm_kernels_level_name(l); l++) {
        add(&code, flm_kernels_level_name(l), strlen(flm_kernels_level_name(l)));
        if (l) strcat(joined, "|");
        strcat(joined, flm_kernels_level_name(l));
    }
    assert_true(code.n >= 5);
    assert_int_equal(doc.n, code.n);
    for (int i = 0; i < code.n; i++) /* the table lists them lowest first, as the library does */
        if (strcmp(doc.v[i], code.v[i])) fail_msg("ARCHITECTURE.md's kernel-level row %d is `%s`, the library's `%s`", i,
                                                  doc.v[i], code.v[i]);
    const char *docs[2] = {arch, readme};
    for (int d = 0; d < 2; d++) {
        int seen = 0;
        for (const char *p = docs[d]; (p = strstr(p, "FLASHLM_KERNELS=")); p++) {
            if (p[16] == '%' || p[16] == '<' || p[16] == 'X') continue; /* a placeholder */
            size_t n = strspn(p + 16, "abcdefghijklmnopqrstuvwxyz0123456789|");
            if (!memchr(p + 16, '|', n)) continue; /* one level named, not the list */
            seen++;
            if (n != strlen(joined) - 16 || strncmp(p, joined, strlen(joined)))
                fail_msg("%s writes %.*s; the library's levels: %s", d ? "README.md" : "ARCHITECTURE.md",
                         (int)(16 + n), p, joined);
        }
        assert_true(seen > 0);
    }
    free(arch);
    free(readme);
}

/* Every getenv("NAME") of the .c files under dir (recursively). */
static void scan_getenv(const char *dir, names *out) {
    DIR *d = opendir(dir);
    if (!d) fail_msg("cannot list %s", dir);
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        size_t len = strlen(e->d_name);
        if (e->d_type == DT_DIR) {
            scan_getenv(path, out);
            continue;
        }
        if (len < 3 || strcmp(e->d_name + len - 2, ".c")) continue;
        size_t n;
        char *s = (char *)tu_read_file(path, &n);
        assert_non_null(s);
        for (const char *p = s; (p = strstr(p, "getenv(\"")); p += 8) {
            const char *q = strchr(p + 8, '"');
            assert_non_null(q);
            add(out, p + 8, (size_t)(q - p - 8));
        }
        free(s);
    }
    closedir(d);
}

static void test_environment(void **state) {
    (void)state;
    char *arch = read_doc("docs/ARCHITECTURE.md");
    names doc, code = {.n = 0};
    table_names(arch, "| variable | read by", &doc);
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/src", FLM_SOURCE_DIR);
    scan_getenv(dir, &code);
    snprintf(dir, sizeof dir, "%s/tools", FLM_SOURCE_DIR);
    scan_getenv(dir, &code);
    assert_true(code.n >= 8);
    for (int i = 0; i < code.n; i++)
        if (!has(&doc, code.v[i])) fail_msg("the code reads %s; docs/ARCHITECTURE.md's environment table lacks it",
                                            code.v[i]);
    for (int i = 0; i < doc.n; i++)
        if (!has(&code, doc.v[i])) fail_msg("docs/ARCHITECTURE.md's environment table names %s, which no code reads",
                                            doc.v[i]);
    free(arch);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_modes),
        cmocka_unit_test(test_kernel_levels),
        cmocka_unit_test(test_environment),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
