/* test_layers.c — the module graph of src/ is the one docs/ARCHITECTURE.md draws. Reads every `#include "dir/..."`
 * in every src/<dir>/ .c and .h file (FLM_SOURCE_DIR) and fails on an edge between directories that the allowed-layers table below
 * does not permit, on a directory the table does not know, on an include that climbs out of src/ ("../"), and on any
 * cycle between directories (checked on the edges found, independently of the table). */
#include "testutil.h"

#include <dirent.h>
#include <stdbool.h>
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
    /* the tools tier (libflashlm_tools), above the runtime */
    {"convert", {"model", "format", "compute", "core", NULL}},
    {"calibrate", {"runtime", "sparsity", "model", "format", "compute", "io", "cache", "core", NULL}},
    {"synth", {"model", "format", "compute", "core", NULL}},
    {"probe", {"io", "core", NULL}},
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
            continue;
        }
        int from = layer_index(d->d_name);
        if (from < 0) {
            print_error("src/%s/: a directory the layer table does not know; add it (and to docs/ARCHITECTURE.md)\n",
                        d->d_name);
            g->n_bad++;
            continue;
        }
        DIR *sub = opendir(dpath);
        assert_non_null(sub);
        struct dirent *e;
        while ((e = readdir(sub))) {
            if (!has_suffix(e->d_name, ".c") && !has_suffix(e->d_name, ".h")) continue;
            char fpath[4096 + 512], rel[300];
            snprintf(fpath, sizeof fpath, "%s/%s", dpath, e->d_name);
            snprintf(rel, sizeof rel, "src/%s/%s", d->d_name, e->d_name);
            scan_file(g, from, fpath, rel);
        }
        closedir(sub);
    }
    closedir(top);
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

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_table_is_layered),
        cmocka_unit_test(test_cycle_finder),
        cmocka_unit_test(test_src_include_graph),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
