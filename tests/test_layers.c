/* test_layers.c — the module graph of src/ is the one docs/ARCHITECTURE.md draws. Reads every `#include "dir/..."`
 * in every src/<dir>/ .c and .h file (FLM_SOURCE_DIR) and fails on an edge between directories that the allowed-layers
 * table below does not permit, on a directory the table does not know, on an include that climbs out of src/ ("../"),
 * and on any cycle between directories (checked on the edges found, independently of the table).
 * Calls through the public headers are edges too: a call to a function that include/flashlm.h or flashlm_tools.h
 * declares FLM_API is an edge to the directory that defines it (so src/model calling flm_open, which src/runtime
 * defines, is refused although it only includes flashlm.h).
 * The CLI (tools/) includes only the public headers (flashlm.h, flashlm_tools.h) and its own tools/ headers (or one
 * generated at build time from its tools/X.html or by its tools/X.cmake: serve_page.h, build_info.h). */
#include "testutil.h"

#include <dirent.h>
#include <stdbool.h>
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* The layers, lowest first; each lists the directories it may include (besides itself). Keep in step with
 * docs/ARCHITECTURE.md ("Module graph"). */
typedef struct layer {
    const char *dir;
    const char *may_include[10];
} layer;

static const layer k_layers[] = {
    {"core", {NULL}},
    {"compute", {"core", NULL}},
    {"io", {"core", NULL}},
    {"cache", {"core", NULL}},
    {"format", {"core", NULL}},
    {"model", {"format", "compute", "core", NULL}},
    {"sparsity", {"model", "format", "compute", "core", NULL}},
    {"runtime", {"model", "format", "compute", "io", "cache", "sparsity", "core", NULL}},
    /* sessions (prompts, generation, stop strings, streaming): above the runtime, through its public calls */
    {"session", {"runtime", "format", "core", NULL}},
    /* the tools tier (libflashlm_tools), above the runtime; write: the GGUF and .flm writers */
    {"write", {"runtime", "format", "core", NULL}},
    {"convert", {"write", "runtime", "model", "format", "compute", "core", NULL}},
    {"calibrate", {"write", "runtime", "sparsity", "model", "format", "compute", "io", "cache", "core", NULL}},
    {"synth", {"write", "runtime", "model", "format", "compute", "core", NULL}},
    {"probe", {"write", "io", "core", NULL}},
};
#define N_LAYERS (int)(sizeof k_layers / sizeof k_layers[0])

static int layer_index(const char *dir) {
    for (int i = 0; i < N_LAYERS; i++)
        if (!strcmp(k_layers[i].dir, dir)) return i;
    return -1;
}

static bool allowed(int from, int to) {
    if (from == to) return true;
    for (const char *const *p = k_layers[from].may_include; *p; p++)
        if (!strcmp(*p, k_layers[to].dir)) return true;
    return false;
}

/* The edges found: edge[a][b] counts the includes of directory b from files in directory a; first[a][b] names one. */
typedef struct graph {
    int edge[N_LAYERS][N_LAYERS];
    char first[N_LAYERS][N_LAYERS][320];
    int n_files, n_includes, n_bad;
} graph;

static bool has_suffix(const char *s, const char *suf) {
    size_t n = strlen(s), m = strlen(suf);
    return n >= m && !strcmp(s + n - m, suf);
}

/* Read one source file; record its "dir/..." includes. Reports (and counts) every forbidden or unknown edge. */
static void scan_file(graph *g, int from, const char *path, const char *rel) {
    FILE *fp = fopen(path, "r");
    assert_non_null(fp);
    char line[1024];
    int lineno = 0;
    g->n_files++;
    while (fgets(line, sizeof line, fp)) {
        lineno++;
        const char *p = line;
        while (*p == ' ' || *p == '\t') p++;
        if (*p != '#') continue;
        p++;
        while (*p == ' ' || *p == '\t') p++;
        if (strncmp(p, "include", 7)) continue;
        p += 7;
        while (*p == ' ' || *p == '\t') p++;
        if (*p != '"') continue; /* <system> headers are not modules */
        p++;
        const char *q = strchr(p, '"');
        if (!q) continue;
        char inc[256];
        snprintf(inc, sizeof inc, "%.*s", (int)(q - p), p);
        g->n_includes++;
        if (strstr(inc, "..")) {
            print_error("%s:%d: #include \"%s\" climbs directories; include as \"dir/file.h\"\n", rel, lineno, inc);
            g->n_bad++;
            continue;
        }
        const char *slash = strchr(inc, '/');
        if (!slash) continue; /* same directory, or the public flashlm.h */
        char dir[64];
        snprintf(dir, sizeof dir, "%.*s", (int)(slash - inc), inc);
        int to = layer_index(dir);
        if (to < 0) {
            print_error("%s:%d: #include \"%s\": directory '%s' is not in the layer table\n", rel, lineno, inc, dir);
            g->n_bad++;
            continue;
        }
        if (!allowed(from, to)) {
            print_error("%s:%d: #include \"%s\": %s may not include %s (see docs/ARCHITECTURE.md)\n", rel, lineno,
                        inc, k_layers[from].dir, dir);
            g->n_bad++;
        }
        if (from != to && !g->edge[from][to]++)
            snprintf(g->first[from][to], sizeof g->first[from][to], "%s:%d", rel, lineno);
    }
    fclose(fp);
}

typedef void (*file_fn)(void *user, int layer, const char *path, const char *rel);

/* Every .c and .h file of src/<dir>/, with its layer. */
static void for_each_src_file(file_fn fn, void *user) {
    char src[4096];
    snprintf(src, sizeof src, "%s/src", FLM_SOURCE_DIR);
    DIR *top = opendir(src);
    assert_non_null(top);
    struct dirent *d;
    while ((d = readdir(top))) {
        int layer = d->d_name[0] == '.' ? -1 : layer_index(d->d_name);
        if (layer < 0) continue; /* scan_tree reports unknown directories */
        char dpath[4096 + 256];
        snprintf(dpath, sizeof dpath, "%s/%s", src, d->d_name);
        DIR *sub = opendir(dpath);
        if (!sub) continue;
        struct dirent *e;
        while ((e = readdir(sub))) {
            if (!has_suffix(e->d_name, ".c") && !has_suffix(e->d_name, ".h")) continue;
            char fpath[4096 + 512], rel[300];
            snprintf(fpath, sizeof fpath, "%s/%s", dpath, e->d_name);
            snprintf(rel, sizeof rel, "src/%s/%s", d->d_name, e->d_name);
            fn(user, layer, fpath, rel);
        }
        closedir(sub);
    }
    closedir(top);
}

static void scan_file_cb(void *user, int layer, const char *path, const char *rel) {
    scan_file(user, layer, path, rel);
}

/* Every entry of src/ must be a directory the layer table knows; then every include of every file in them. */
static void scan_tree(graph *g) {
    char src[4096];
    snprintf(src, sizeof src, "%s/src", FLM_SOURCE_DIR);
    DIR *top = opendir(src);
    assert_non_null(top);
    struct dirent *d;
    while ((d = readdir(top))) {
        if (d->d_name[0] == '.') continue;
        char dpath[4096 + 256];
        snprintf(dpath, sizeof dpath, "%s/%s", src, d->d_name);
        struct stat st;
        assert_int_equal(stat(dpath, &st), 0);
        if (!S_ISDIR(st.st_mode)) {
            print_error("src/%s: source files belong in a module directory\n", d->d_name);
            g->n_bad++;
        } else if (layer_index(d->d_name) < 0) {
            print_error("src/%s/: a directory the layer table does not know; add it (and to docs/ARCHITECTURE.md)\n",
                        d->d_name);
            g->n_bad++;
        }
    }
    closedir(top);
    for_each_src_file(scan_file_cb, g);
}

/* Depth-first search for a cycle in edge[][]; on finding one, writes it as "a -> b -> ... -> a" into out and returns
 * true. color: 0 unvisited, 1 on the stack, 2 done. */
static bool dfs(const int (*edge)[N_LAYERS], int v, int *color, int *stack, int depth, char *out, size_t n) {
    color[v] = 1;
    stack[depth] = v;
    for (int w = 0; w < N_LAYERS; w++) {
        if (!edge[v][w]) continue;
        if (color[w] == 1) {
            size_t k = 0;
            int i = depth;
            while (stack[i] != w) i--;
            for (; i <= depth; i++) k += (size_t)snprintf(out + k, n - k, "%s -> ", k_layers[stack[i]].dir);
            snprintf(out + k, n - k, "%s", k_layers[w].dir);
            return true;
        }
        if (!color[w] && dfs(edge, w, color, stack, depth + 1, out, n)) return true;
    }
    color[v] = 2;
    return false;
}

static bool find_cycle(const int (*edge)[N_LAYERS], char *out, size_t n) {
    int color[N_LAYERS] = {0}, stack[N_LAYERS + 1];
    for (int v = 0; v < N_LAYERS; v++)
        if (!color[v] && dfs(edge, v, color, stack, 0, out, n)) return true;
    return false;
}

/* The table itself is a one-way order: every allowed edge points to a layer listed earlier, and every name in it is a
 * layer. (So an edge the table permits can never close a cycle.) */
static void test_table_is_layered(void **state) {
    (void)state;
    for (int i = 0; i < N_LAYERS; i++)
        for (const char *const *p = k_layers[i].may_include; *p; p++) {
            int j = layer_index(*p);
            assert_true(j >= 0);
            assert_true(j < i);
        }
}

/* The cycle finder finds cycles: a synthetic graph with model -> format -> model, and one without. */
static void test_cycle_finder(void **state) {
    (void)state;
    static int edge[N_LAYERS][N_LAYERS];
    char msg[512];
    int model = layer_index("model"), format = layer_index("format"), core = layer_index("core");
    memset(edge, 0, sizeof edge);
    edge[model][format] = edge[format][core] = 1;
    assert_false(find_cycle((const int (*)[N_LAYERS])edge, msg, sizeof msg));
    edge[format][model] = 1;
    assert_true(find_cycle((const int (*)[N_LAYERS])edge, msg, sizeof msg));
    assert_true(strstr(msg, "model") && strstr(msg, "format"));
}

/* The real tree: every include edge allowed, no cycle between directories. */
static void test_src_include_graph(void **state) {
    (void)state;
    static graph g;
    memset(&g, 0, sizeof g);
    scan_tree(&g);
    assert_true(g.n_files > 50); /* the scan saw the tree */
    assert_true(g.n_includes > 100);
    char msg[512];
    bool cyc = find_cycle((const int (*)[N_LAYERS])g.edge, msg, sizeof msg);
    if (cyc) print_error("include cycle between directories: %s\n", msg);
    print_message("%d files, %d quoted includes, edges between directories:\n", g.n_files, g.n_includes);
    for (int a = 0; a < N_LAYERS; a++)
        for (int b = 0; b < N_LAYERS; b++)
            if (g.edge[a][b])
                print_message("  %-9s -> %-9s %3d  (first: %s)\n", k_layers[a].dir, k_layers[b].dir, g.edge[a][b],
                              g.first[a][b]);
    assert_false(cyc);
    assert_int_equal(g.n_bad, 0);
    /* known edges exist (the scan reads includes, not nothing) */
    assert_true(g.edge[layer_index("runtime")][layer_index("model")] > 0);
    assert_true(g.edge[layer_index("convert")][layer_index("model")] > 0);
    assert_true(g.edge[layer_index("calibrate")][layer_index("runtime")] > 0);
}

/* ---- calls through the public headers ------------------------------------------------------------------------ */

#define MAX_API 512
typedef struct api_fn {
    char name[64];
    int def_layer; /* the directory whose .c file defines it; -1: not found */
} api_fn;
typedef struct api_set {
    api_fn fn[MAX_API];
    int n;
} api_set;

static char *read_all(const char *path) {
    FILE *fp = fopen(path, "rb");
    if (!fp) return NULL;
    fseek(fp, 0, SEEK_END);
    long n = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    if (b && fread(b, 1, (size_t)n, fp) != (size_t)n) {
        free(b);
        b = NULL;
    }
    if (b) b[n] = '\0';
    fclose(fp);
    return b;
}

/* Blank out comments, string and character literals (kept: newlines), so only code is searched. */
static void strip_comments(char *s) {
    for (char *p = s; *p; p++) {
        if (p[0] == '/' && p[1] == '*') {
            char *e = strstr(p + 2, "*/");
            char *end = e ? e + 2 : p + strlen(p);
            for (; p < end; p++)
                if (*p != '\n') *p = ' ';
            p--;
        } else if (p[0] == '/' && p[1] == '/') {
            while (*p && *p != '\n') *p++ = ' ';
            p--;
        } else if (*p == '"' || *p == '\'') {
            char q = *p++;
            while (*p && *p != q && *p != '\n') {
                if (*p == '\\' && p[1]) *p++ = ' ';
                *p++ = ' ';
            }
            if (!*p) break;
        }
    }
}

static bool is_ident(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_'; }

/* The names a public header declares FLM_API (functions: "FLM_API ... name("). */
static void read_api(api_set *a, const char *header) {
    char path[4096];
    snprintf(path, sizeof path, "%s/include/%s", FLM_SOURCE_DIR, header);
    char *s = read_all(path);
    assert_non_null(s);
    strip_comments(s);
    for (char *p = strstr(s, "FLM_API "); p; p = strstr(p + 8, "FLM_API ")) {
        char *paren = strchr(p, '(');
        char *semi = strchr(p, ';');
        if (!paren || (semi && semi < paren)) continue;
        char *e = paren;
        while (e > p && e[-1] == ' ') e--;
        char *b = e;
        while (b > p && is_ident(b[-1])) b--;
        if (e - b <= 0 || e - b >= 64 || a->n >= MAX_API || !strncmp(b, "__", 2)) continue; /* the macro itself */
        snprintf(a->fn[a->n].name, sizeof a->fn[a->n].name, "%.*s", (int)(e - b), b);
        a->fn[a->n].def_layer = -1;
        a->n++;
    }
    free(s);
}

/* The first occurrence of name( as a whole identifier in s, or NULL. */
static const char *find_call(const char *s, const char *name) {
    size_t n = strlen(name);
    for (const char *p = strstr(s, name); p; p = strstr(p + 1, name)) {
        if (p > s && is_ident(p[-1])) continue;
        const char *q = p + n;
        while (*q == ' ') q++;
        if (*q == '(') return p;
    }
    return NULL;
}

/* Does code (comments stripped) define name: at the start of a line, "... name(" with a body, not a ';' first? */
static bool defines(const char *code, const char *name) {
    size_t n = strlen(name);
    for (const char *p = strstr(code, name); p; p = strstr(p + 1, name)) {
        if (p > code && is_ident(p[-1])) continue;
        if (p[n] != '(') continue;
        const char *ls = p;
        while (ls > code && ls[-1] != '\n') ls--;
        if (*ls == ' ' || *ls == '\t' || *ls == '#') continue; /* a call inside a function, or a macro */
        const char *brace = strchr(p, '{'), *semi = strchr(p, ';');
        if (brace && (!semi || brace < semi)) return true;
    }
    return false;
}

static void find_definitions(void *user, int layer, const char *path, const char *rel) {
    (void)rel;
    api_set *a = user;
    if (!has_suffix(path, ".c")) return;
    char *s = read_all(path);
    assert_non_null(s);
    strip_comments(s);
    for (int i = 0; i < a->n; i++)
        if (a->fn[i].def_layer < 0 && defines(s, a->fn[i].name)) a->fn[i].def_layer = layer;
    free(s);
}

typedef struct call_scan {
    api_set *a;
    int n_bad, n_calls;
} call_scan;

static void check_calls(void *user, int layer, const char *path, const char *rel) {
    call_scan *c = user;
    char *s = read_all(path);
    assert_non_null(s);
    strip_comments(s);
    for (int i = 0; i < c->a->n; i++) {
        const api_fn *f = &c->a->fn[i];
        if (f->def_layer < 0 || f->def_layer == layer) continue;
        const char *at = find_call(s, f->name);
        if (!at) continue;
        c->n_calls++;
        if (!allowed(layer, f->def_layer)) {
            int line = 1;
            for (const char *q = s; q < at; q++) line += *q == '\n';
            print_error("%s:%d: calls %s (public, defined in src/%s/): %s may not use %s (see docs/ARCHITECTURE.md)\n",
                        rel, line, f->name, k_layers[f->def_layer].dir, k_layers[layer].dir,
                        k_layers[f->def_layer].dir);
            c->n_bad++;
        }
    }
    free(s);
}

/* The public headers' functions are edges too: nothing below src/runtime calls a runtime entry point (flm_open,
 * flm_eval, ...), nothing in the runtime tier calls the tools tier's (flashlm_tools.h). */
static void test_public_calls_respect_layers(void **state) {
    (void)state;
    static api_set a;
    memset(&a, 0, sizeof a);
    read_api(&a, "flashlm.h");
    int n_runtime_api = a.n;
    read_api(&a, "flashlm_tools.h");
    assert_true(n_runtime_api > 40);
    assert_true(a.n > n_runtime_api + 10);
    for_each_src_file(find_definitions, &a);
    int undefined = 0;
    for (int i = 0; i < a.n; i++)
        if (a.fn[i].def_layer < 0) {
            print_error("%s: declared FLM_API but no src/ .c file defines it\n", a.fn[i].name);
            undefined++;
        }
    assert_int_equal(undefined, 0);
    /* known definitions: the scan finds them where they are */
    for (int i = 0; i < a.n; i++) {
        if (!strcmp(a.fn[i].name, "flm_open") || !strcmp(a.fn[i].name, "flm_eval"))
            assert_int_equal(a.fn[i].def_layer, layer_index("runtime"));
        if (!strcmp(a.fn[i].name, "flm_calib_run")) assert_int_equal(a.fn[i].def_layer, layer_index("calibrate"));
    }
    call_scan c = {&a, 0, 0};
    for_each_src_file(check_calls, &c);
    print_message("%d public functions, %d calls between directories through them\n", a.n, c.n_calls);
    assert_true(c.n_calls > 0);
    assert_int_equal(c.n_bad, 0);
}

/* The finder sees a call from below the runtime layer: "flm_open(" in model code is an edge model -> runtime. */
static void test_public_call_finder(void **state) {
    (void)state;
    char code[] = "/* flm_open( in a comment */ static int f(void) { const char *s = \"flm_open(\"; return 0; }\n"
                  "int g(void) {\n    return flm_open (p, q, r, s);\n}\n";
    strip_comments(code);
    const char *at = find_call(code, "flm_open");
    assert_non_null(at);
    assert_true(strstr(at, "(p, q, r, s)") != NULL);
    assert_false(defines(code, "flm_open"));
    char def[] = "flm_status flm_open(const char *path,\n                    flm_error *err) {\n    return 0;\n}\n";
    assert_true(defines(def, "flm_open"));
    assert_false(allowed(layer_index("model"), layer_index("runtime")));
    assert_true(allowed(layer_index("synth"), layer_index("runtime")));
}

/* ---- the CLI includes only the public headers --------------------------------------------------------------- */

/* Includes of src/ headers from tools/ still to be replaced by public API: each one is listed here, and a listed one
 * that is no longer there fails too (keep the list exact). None left: tools/spec_cli.c's draft/target split is
 * flm_plan_split's. */
static const char *const k_tools_internal[][2] = {
    {NULL, NULL},
};
#define N_TOOLS_INTERNAL 0

static void test_tools_include_public_headers_only(void **state) {
    (void)state;
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/tools", FLM_SOURCE_DIR);
    DIR *d = opendir(dir);
    assert_non_null(d);
    struct dirent *e;
    int n_files = 0, n_bad = 0, used[N_TOOLS_INTERNAL + 1] = {0};
    while ((e = readdir(d))) {
        if (!has_suffix(e->d_name, ".c") && !has_suffix(e->d_name, ".h")) continue;
        char path[4096 + 512];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        FILE *fp = fopen(path, "r");
        assert_non_null(fp);
        n_files++;
        char line[1024];
        int lineno = 0;
        while (fgets(line, sizeof line, fp)) {
            lineno++;
            const char *p = line;
            while (*p == ' ' || *p == '\t') p++;
            if (*p != '#') {
                /* a declaration or definition at the margin: the function it names is not flm_ (the library's) */
                const char *par = line[0] >= 'a' && line[0] <= 'z' ? strchr(line, '(') : NULL;
                if (par) {
                    const char *id = par;
                    while (id > line && (isalnum((unsigned char)id[-1]) || id[-1] == '_')) id--;
                    if (!strncmp(id, "flm_", 4)) {
                        print_error("tools/%s:%d: %.*s: the flm_ prefix is the library's; the CLI's functions are "
                                    "named cli_*\n", e->d_name, lineno, (int)(par - id), id);
                        n_bad++;
                    }
                }
                continue;
            }
            p++;
            while (*p == ' ' || *p == '\t') p++;
            if (strncmp(p, "include", 7)) continue;
            p += 7;
            while (*p == ' ' || *p == '\t') p++;
            if (*p != '"') continue; /* <system> headers */
            const char *q = strchr(p + 1, '"');
            if (!q) continue;
            char inc[256];
            snprintf(inc, sizeof inc, "%.*s", (int)(q - p - 1), p + 1);
            if (!strcmp(inc, "flashlm.h") || !strcmp(inc, "flashlm_tools.h")) continue;
            bool own = false;
            if (!strchr(inc, '/')) { /* a header of tools/ itself */
                char own_path[4096 + 512];
                snprintf(own_path, sizeof own_path, "%s/%s", dir, inc);
                struct stat st;
                own = stat(own_path, &st) == 0;
                size_t li = strlen(inc);
                if (!own && li > 2 && !strcmp(inc + li - 2, ".h")) { /* generated at build time from tools/X.html
                                                                         (tools/embed.cmake: serve_page.h) or by
                                                                         tools/X.cmake (build_info.h) */
                    snprintf(own_path, sizeof own_path, "%s/%.*s.html", dir, (int)(li - 2), inc);
                    own = stat(own_path, &st) == 0;
                    snprintf(own_path, sizeof own_path, "%s/%.*s.cmake", dir, (int)(li - 2), inc);
                    own = own || stat(own_path, &st) == 0;
                }
            }
            if (own) continue;
            int k = 0;
            while (k < N_TOOLS_INTERNAL &&
                   (strcmp(k_tools_internal[k][0], e->d_name) || strcmp(k_tools_internal[k][1], inc)))
                k++;
            if (k < N_TOOLS_INTERNAL) {
                used[k]++;
                continue;
            }
            print_error("tools/%s:%d: #include \"%s\": the CLI includes only flashlm.h, flashlm_tools.h and tools/ "
                        "headers; what it needs from the library belongs in the public API\n", e->d_name, lineno, inc);
            n_bad++;
        }
        fclose(fp);
    }
    closedir(d);
    for (int k = 0; k < N_TOOLS_INTERNAL; k++)
        if (!used[k]) {
            print_error("tools/%s no longer includes \"%s\": remove it from k_tools_internal\n", k_tools_internal[k][0],
                        k_tools_internal[k][1]);
            n_bad++;
        }
    assert_true(n_files > 10);
    assert_int_equal(n_bad, 0);
}

/* Tiers hold (docs/ARCHITECTURE.md): no file of a runtime directory includes the tools tier's public header
 * (flashlm_tools.h), none of the runtime or the session includes the tools-only runtime/hooks.h (only runtime/
 * implements it), and the tools tier reads no field of the context: `ctx->` appears in no code of convert/,
 * calibrate/, synth/ or probe/ (they go through runtime/hooks.h's views and the public API). */
static bool is_tools_dir(const char *dir) {
    return !strcmp(dir, "write") || !strcmp(dir, "convert") || !strcmp(dir, "calibrate") || !strcmp(dir, "synth") ||
           !strcmp(dir, "probe");
}

typedef struct tier_scan {
    int n_files, n_bad;
} tier_scan;

static void check_tiers(void *user, int layer, const char *path, const char *rel) {
    tier_scan *t = user;
    char *code = read_all(path);
    assert_non_null(code);
    t->n_files++;
    const char *dir = k_layers[layer].dir;
    const bool tools = is_tools_dir(dir);
    /* includes, before the string literals are blanked */
    for (const char *p = code; (p = strstr(p, "#include \"")); p += 10) {
        const char *inc = p + 10;
        if (!tools && !strncmp(inc, "flashlm_tools.h\"", 16)) {
            print_error("%s: includes flashlm_tools.h: the runtime tier does not see the tools tier\n", rel);
            t->n_bad++;
        }
        if (!tools && strcmp(dir, "runtime") && !strncmp(inc, "runtime/hooks.h\"", 16)) {
            print_error("%s: includes runtime/hooks.h: the tools tier's interface to the runtime\n", rel);
            t->n_bad++;
        }
    }
    if (tools) {
        strip_comments(code);
        for (const char *p = code; (p = strstr(p, "ctx->")); p += 5) {
            if (p > code && is_ident(p[-1]) ) continue; /* another name ending in ctx */
            int line = 1;
            for (const char *q = code; q < p; q++) line += *q == '\n';
            print_error("%s:%d: reads a field of the context (ctx->): use runtime/hooks.h or the public API\n", rel,
                        line);
            t->n_bad++;
        }
    }
    free(code);
}

static void test_tiers_hold(void **state) {
    (void)state;
    tier_scan t = {0};
    for_each_src_file(check_tiers, &t);
    assert_true(t.n_files > 10);
    assert_int_equal(t.n_bad, 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_table_is_layered),
        cmocka_unit_test(test_cycle_finder),
        cmocka_unit_test(test_src_include_graph),
        cmocka_unit_test(test_public_call_finder),
        cmocka_unit_test(test_public_calls_respect_layers),
        cmocka_unit_test(test_tools_include_public_headers_only),
        cmocka_unit_test(test_tiers_hold),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
