/* test_bench.c — `flashlm bench` end to end on stories260K (converted and calibrated here): its JSON parses back
 * (cJSON) and its numbers agree with each other (parts add up to totals, per-token series to the totals, naive reads
 * every FFN region once per token), its SVG figures are well-formed XML with the expected series, sweeps run and bad
 * sweep syntax is refused. The SVG writer (tools/svg.c) is also tested directly. */
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "flashlm.h"
#include "convert/convert.h"
#include "format/flm.h"
#include "calibrate/calibrate.h"
#include "sparsity/sparsity.h"
#include "testutil.h"

#include <cJSON.h>

#include "../tools/svg.c" /* the writer is part of the CLI, not of the library: compiled into this test too */

static char flm_path[4096];

static int setup(void **state) {
    (void)state;
    size_t len;
    char *text = (char *)tu_read_file(tu_data("text/tinystories_sample.txt"), &len);
    snprintf(flm_path, sizeof flm_path, "%s", tu_tmp("bench", ".flm"));
    flm_error err;
    if (flm_convert(tu_data("models/stories260K/stories260K.gguf"), flm_path, NULL, NULL, &err)) {
        fprintf(stderr, "convert: %s\n", err.msg);
        return -1;
    }
    flm_calib_opts o;
    flm_calib_opts_default(&o);
    o.text = text;
    o.level = 0.02f;
    o.chunk = 64;
    o.max_tokens = 2048;
    flm_status st = flm_calibrate(flm_path, &o, NULL, &err);
    free(text);
    if (st) { fprintf(stderr, "calibrate: %s\n", err.msg); return -1; }
    return 0;
}

static int teardown(void **state) {
    (void)state;
    remove(flm_path);
    return 0;
}

/* ---- JSON, read back with cJSON ------------------------------------------------------------------------------- */

enum { J_NULL, J_BOOL, J_NUM, J_STR, J_ARR, J_OBJ };

/* Parse a whole document (nothing may follow it); fails the test when it is not valid JSON. */
static cJSON *j_parse(const char *text) {
    const char *end = NULL;
    cJSON *v = cJSON_ParseWithOpts(text, &end, true);
    if (!v) fail_msg("invalid JSON at offset %ld: '%.40s'", end ? (long)(end - text) : -1L, end ? end : "");
    return v;
}

static bool j_is(const cJSON *v, int type) {
    switch (type) {
    case J_NULL: return cJSON_IsNull(v);
    case J_BOOL: return cJSON_IsBool(v);
    case J_NUM: return cJSON_IsNumber(v);
    case J_STR: return cJSON_IsString(v);
    case J_ARR: return cJSON_IsArray(v);
    case J_OBJ: return cJSON_IsObject(v);
    default: return false;
    }
}

/* Member of an object; fails the test when absent or of another type. */
static const cJSON *j_get(const cJSON *o, const char *key, int type) {
    if (!cJSON_IsObject(o)) fail_msg("'%s' looked up in a non-object", key);
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v) fail_msg("no member '%s'", key);
    if (!j_is(v, type)) fail_msg("'%s' has the wrong JSON type (want %d)", key, type);
    return v;
}
static double j_num(const cJSON *o, const char *key) { return j_get(o, key, J_NUM)->valuedouble; }
static const char *j_str(const cJSON *o, const char *key) { return j_get(o, key, J_STR)->valuestring; }
static int j_len(const cJSON *a) { return cJSON_GetArraySize(a); }
static double j_at(const cJSON *a, int i) {
    const cJSON *v = cJSON_GetArrayItem(a, i);
    if (!cJSON_IsNumber(v)) fail_msg("array item %d is not a number", i);
    return v->valuedouble;
}

/* ---- a small XML well-formedness checker ----------------------------------------------------------------------- */

static bool x_entity(const char **p) { /* at '&': a predefined entity or a character reference */
    const char *ents[] = {"&amp;", "&lt;", "&gt;", "&quot;", "&apos;"};
    for (size_t i = 0; i < 5; i++)
        if (!strncmp(*p, ents[i], strlen(ents[i]))) { *p += strlen(ents[i]); return true; }
    const char *s = *p + 1;
    if (*s++ != '#') return false;
    bool hex = *s == 'x';
    if (hex) s++;
    const char *d = s;
    while (hex ? isxdigit((unsigned char)*s) : isdigit((unsigned char)*s)) s++;
    if (s == d || *s != ';') return false;
    *p = s + 1;
    return true;
}

static size_t x_name(const char *s) {
    size_t n = 0;
    if (!(isalpha((unsigned char)s[0]) || s[0] == '_' || s[0] == ':')) return 0;
    while (isalnum((unsigned char)s[n]) || s[n] == '_' || s[n] == ':' || s[n] == '-' || s[n] == '.') n++;
    return n;
}

/* Fails the test unless doc is well-formed XML whose root element is `root`. */
static void check_xml(const char *doc, const char *root, const char *what) {
    const char *p = doc, *stack[64];
    size_t stack_len[64];
    int depth = 0, roots = 0;
    if (!strncmp(p, "<?xml", 5)) {
        p = strstr(p, "?>");
        if (!p) fail_msg("%s: unterminated XML declaration", what);
        p += 2;
    }
    while (*p) {
        if (*p == '&') {
            if (!x_entity(&p)) fail_msg("%s: bare '&' at offset %ld", what, (long)(p - doc));
            continue;
        }
        if (*p != '<') {
            if (!depth && !isspace((unsigned char)*p)) fail_msg("%s: text outside the root element", what);
            p++;
            continue;
        }
        if (!strncmp(p, "<!--", 4)) {
            const char *e = strstr(p, "-->");
            if (!e) fail_msg("%s: unterminated comment", what);
            p = e + 3;
            continue;
        }
        if (p[1] == '/') { /* end tag */
            size_t n = x_name(p + 2);
            if (!n || !depth || n != stack_len[depth - 1] || strncmp(p + 2, stack[depth - 1], n))
                fail_msg("%s: mismatched end tag at offset %ld: '%.20s'", what, (long)(p - doc), p);
            p += 2 + n;
            while (isspace((unsigned char)*p)) p++;
            if (*p++ != '>') fail_msg("%s: bad end tag", what);
            depth--;
            continue;
        }
        size_t n = x_name(p + 1);
        if (!n) fail_msg("%s: bad tag at offset %ld: '%.20s'", what, (long)(p - doc), p);
        if (!depth) {
            if (roots++ || n != strlen(root) || strncmp(p + 1, root, n))
                fail_msg("%s: root element is '%.*s', want one <%s>", what, (int)n, p + 1, root);
        }
        const char *name = p + 1;
        p += 1 + n;
        for (;;) { /* attributes */
            bool ws = isspace((unsigned char)*p);
            while (isspace((unsigned char)*p)) p++;
            if (*p == '>' || !strncmp(p, "/>", 2)) break;
            size_t an = x_name(p);
            if (!an || !ws) fail_msg("%s: bad attribute at offset %ld: '%.20s'", what, (long)(p - doc), p);
            p += an;
            if (*p++ != '=') fail_msg("%s: attribute without a value", what);
            char q = *p++;
            if (q != '"' && q != '\'') fail_msg("%s: unquoted attribute value", what);
            while (*p && *p != q) {
                if (*p == '<') fail_msg("%s: '<' in an attribute value", what);
                if (*p == '&') { if (!x_entity(&p)) fail_msg("%s: bare '&' in an attribute", what); }
                else p++;
            }
            if (*p++ != q) fail_msg("%s: unterminated attribute value", what);
        }
        if (*p == '/') { p += 2; continue; } /* empty element */
        p++;
        if (depth == 64) fail_msg("%s: nested too deep", what);
        stack[depth] = name;
        stack_len[depth++] = n;
    }
    if (depth) fail_msg("%s: %d unclosed elements", what, depth);
    if (!roots) fail_msg("%s: no root element", what);
}

static void test_xml_checker_itself(void **state) {
    (void)state;
    check_xml("<?xml version=\"1.0\"?>\n<svg a=\"1 &amp; 2\"><g><text>a &lt; b</text></g><rect/></svg>\n", "svg", "ok");
}

static char *read_text(const char *path) {
    size_t len;
    return (char *)tu_read_file(path, &len);
}

static void check_svg_file(const char *dir, const char *name, const char *const *must_have) {
    char path[8192];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    char *s = read_text(path);
    check_xml(s, "svg", path);
    for (; must_have && *must_have; must_have++)
        if (!strstr(s, *must_have)) fail_msg("%s lacks '%s'", path, *must_have);
    free(s);
}

/* ---- the SVG writer --------------------------------------------------------------------------------------------- */

static void test_svg_writer(void **state) {
    (void)state;
    double first, step;
    int n = svg_ticks(0, 4.28, 7, &first, &step);
    assert_true(n >= 2 && n <= 7 && first <= 0 && first + (n - 1) * step >= 4.28 && step == 1.0);
    n = svg_ticks(3, 3, 7, &first, &step); /* one value: widened */
    assert_true(n >= 2 && first <= 3 && first + (n - 1) * step >= 3 && step > 0);
    n = svg_ticks(0.013, 0.0172, 8, &first, &step);
    assert_true(n >= 2 && n <= 8 && first <= 0.013 + 1e-9 * step && first + (n - 1) * step >= 0.0172);

    const char *path = tu_tmp("svg", ".svg");
    svg_set_replace(true); /* one path, written four times */
    const char *evil = "a<b & \"c\" 'd'>\x01";
    double x[4] = {1, 2, NAN, 4}, y[4] = {3, 1, 2, INFINITY};
    svg_line lines[3] = {{evil, x, y, 4, false, true}, {"dashed", x, y, 2, true, false},
                         {"empty", NULL, NULL, 0, false, false}};
    assert_true(svg_line_chart(path, evil, "x <axis>", "y & axis", lines, 3));
    char *s = read_text(path);
    check_xml(s, "svg", "line chart");
    assert_non_null(strstr(s, "a&lt;b &amp; &quot;c&quot; &apos;d&apos;&gt;"));
    assert_null(strchr(s, '\x01'));
    assert_non_null(strstr(s, ">dashed<"));
    assert_non_null(strstr(s, ">empty<"));
    assert_non_null(strstr(s, "stroke-dasharray"));
    free(s);
    /* no lines at all, then bars: zero, negative and non-finite parts */
    assert_true(svg_line_chart(path, "nothing", "x", "y", NULL, 0));
    s = read_text(path);
    check_xml(s, "svg", "empty line chart");
    free(s);
    const char *cats[2] = {"naive", "sp&rse"}, *parts[3] = {"flash I/O", "memory", "compute"};
    double v[6] = {4, 0, 1, -1, NAN, 0.5};
    assert_true(svg_stacked_bars(path, "bars", "ms", cats, 2, parts, 3, v));
    s = read_text(path);
    check_xml(s, "svg", "bars");
    assert_non_null(strstr(s, ">naive<"));
    assert_non_null(strstr(s, ">sp&amp;rse<"));
    assert_non_null(strstr(s, ">flash I/O<"));
    assert_non_null(strstr(s, ">5<"));   /* the first bar's total */
    assert_non_null(strstr(s, ">0.5<")); /* the second's: the bad parts count as 0 */
    free(s);
    assert_true(svg_stacked_bars(path, "no bars", "ms", NULL, 0, parts, 3, NULL));
    s = read_text(path);
    check_xml(s, "svg", "no bars");
    free(s);
    remove(path);
    assert_false(svg_line_chart("/nonexistent-dir/x.svg", "t", "x", "y", NULL, 0));
}

/* ---- flashlm bench ---------------------------------------------------------------------------------------------- */

static void near(double a, double b, double rel, const char *what) {
    if (fabs(a - b) > rel * fmax(fabs(a), fabs(b)) + 1e-6) fail_msg("%s: %.9g vs %.9g", what, a, b);
}

/* The invariants of one run's record; returns its bytes per token. */
static double check_run(const cJSON *r, int gen_tokens) {
    const char *label = j_str(r, "requested");
    if (!cJSON_IsTrue(j_get(r, "ok", J_BOOL))) fail_msg("%s did not run: %s", label, j_str(r, "error"));
    for (int w = 0; w < 2; w++) {
        const cJSON *m = j_get(r, w ? "mean" : "median", J_OBJ);
        near(j_num(m, "io_ms") + j_num(m, "mem_ms") + j_num(m, "compute_ms"), j_num(m, "total_ms"), 1e-3, label);
    }
    int n_dec = (int)j_num(r, "n_decode_tokens");
    assert_int_equal(n_dec, gen_tokens - 1); /* the first token after the prompt is reported apart */
    double bpt = j_num(r, "bytes_per_token"), total = j_num(r, "bytes_read_total");
    near(bpt * n_dec, total, 1e-6, "bytes per token x tokens");
    const cJSON *t = j_get(r, "tokens", J_OBJ);
    int n = (int)j_num(t, "n");
    assert_int_equal(n, gen_tokens);
    const char *keys[] = {"total_ms", "io_ms", "mem_ms", "compute_ms", "bytes_read", "n_reads", "n_predicted",
                          "n_loaded", "n_reused"};
    for (size_t k = 0; k < sizeof keys / sizeof *keys; k++) assert_int_equal(j_len(j_get(t, keys[k], J_ARR)), n);
    const cJSON *tot = j_get(t, "total_ms", J_ARR), *io = j_get(t, "io_ms", J_ARR), *mem = j_get(t, "mem_ms", J_ARR),
                *cmp = j_get(t, "compute_ms", J_ARR), *bytes = j_get(t, "bytes_read", J_ARR),
                *loaded = j_get(t, "n_loaded", J_ARR), *pred = j_get(t, "n_predicted", J_ARR);
    double sum = 0;
    for (int i = 0; i < n; i++) {
        near(j_at(io, i) + j_at(mem, i) + j_at(cmp, i), j_at(tot, i), 1e-3, "token total");
        if (i) sum += j_at(bytes, i);
        assert_true(j_at(loaded, i) <= j_at(pred, i));
    }
    assert_true(sum == total); /* exact: integers */
    /* the reader's busy share: of the generation's wall time, at most all of it; above 0 when anything was read */
    double busy = j_num(r, "io_busy_ms"), wall = j_num(r, "gen_wall_ms"), share = j_num(r, "io_busy_share");
    assert_true(busy >= 0 && busy <= wall);
    near(share, wall > 0 ? busy / wall : 0, 1e-6, "busy share");
    if (total > 0) assert_true(busy > 0);
    if (!strcmp(j_str(r, "mode"), "ram")) assert_true(busy == 0);
    return bpt;
}

/* FFN region bytes one naive token reads: every layer's region, rounded up to 4 KiB. */
static double naive_bytes_per_token(void) {
    flm_file *f;
    flm_error err;
    assert_int_equal(flm_file_open(flm_path, &f, &err), FLM_OK);
    double b = 0;
    for (uint32_t l = 0; l < f->n_layers; l++) b += (double)((f->ffn[l]->size + FLM_ALIGN - 1) / FLM_ALIGN * FLM_ALIGN);
    flm_file_close(f);
    return b;
}

static const cJSON *find_run(const cJSON *arr, const char *label) {
    const cJSON *r;
    cJSON_ArrayForEach(r, arr) if (!strcmp(j_str(r, "requested"), label)) return r;
    fail_msg("no run '%s'", label);
    return NULL;
}

static void test_bench_json_and_svg(void **state) {
    (void)state;
    const char *json = tu_tmp("bench", ".json");
    char dir[4096], args[16384];
    snprintf(dir, sizeof dir, "%s", tu_tmp("bench-svg", ""));
    const int gen = 8;
    snprintf(args, sizeof args, "bench -m '%s' --modes naive,hybrid,sparse --mem 0 --window 2 -t 2 --prompt-tokens 8 "
             "--gen-tokens %d --json '%s' --svg '%s' 2>&1", flm_path, gen, json, dir);
    char *out = NULL;
    int rc = tu_run_cli(args, &out);
    if (rc != 0) fail_msg("flashlm %s: exit %d\n%s", args, rc, out);
    assert_non_null(strstr(out, "| naive |"));
    assert_non_null(strstr(out, "| sparse |"));
    free(out);

    char *text = read_text(json);
    cJSON *d = j_parse(text);
    assert_string_equal(j_str(d, "flashlm"), FLM_VERSION_STRING);
    const cJSON *mach = j_get(d, "machine", J_OBJ);
    assert_true(strlen(j_str(mach, "cpu")) > 0);
    assert_true(j_num(mach, "cores") >= 1 && j_num(mach, "mem_bytes") > 0);
    assert_non_null(strstr(j_str(mach, "kernel"), "Linux"));
    const cJSON *model = j_get(d, "model", J_OBJ);
    assert_string_equal(j_str(model, "path"), flm_path);
    j_get(model, "disk_probe", J_NULL); /* no <model>.probe.json here */
    assert_true(j_num(model, "d_model") == 64 && j_num(model, "n_layers") == 5 && j_num(model, "d_ffn") == 172);
    const cJSON *flags = j_get(d, "flags", J_OBJ);
    assert_non_null(strstr(j_str(flags, "command"), "--gen-tokens 8"));
    assert_true(j_num(flags, "window") == 2);

    const cJSON *modes = j_get(d, "modes", J_ARR);
    assert_int_equal(j_len(modes), 3);
    double naive = check_run(find_run(modes, "naive"), gen);
    double hybrid = check_run(find_run(modes, "hybrid"), gen);
    double sparse = check_run(find_run(modes, "sparse"), gen);
    double want = naive_bytes_per_token();
    assert_true(naive == want);
    const cJSON *nb = j_get(j_get(find_run(modes, "naive"), "tokens", J_OBJ), "bytes_read", J_ARR);
    for (int i = 0; i < j_len(nb); i++) assert_true(j_at(nb, i) == want); /* every token, the first included */
    assert_true(hybrid <= naive);
    assert_true(sparse < naive);
    assert_true(j_num(find_run(modes, "sparse"), "window") == 2);
    cJSON_Delete(d);
    free(text);
    remove(json);

    const char *tags[] = {">naive<", ">hybrid<", ">sparse<", ">flash I/O<", ">memory<", ">compute<", NULL};
    check_svg_file(dir, "latency_breakdown.svg", tags);
    const char *over[] = {">naive<", ">hybrid<", ">sparse<", "<polyline", NULL};
    check_svg_file(dir, "latency_over_time.svg", over);
    char path[8192];
    snprintf(path, sizeof path, "%s/memory_latency.svg", dir);
    assert_int_not_equal(access(path, 0), 0); /* no sweep, no sweep figure */
    snprintf(path, sizeof path, "%s/latency_breakdown.svg", dir); remove(path);
    snprintf(path, sizeof path, "%s/latency_over_time.svg", dir); remove(path);
    rmdir(dir);
}

static void test_bench_sweeps(void **state) {
    (void)state;
    const char *json = tu_tmp("sweep", ".json");
    char dir[4096], args[16384];
    snprintf(dir, sizeof dir, "%s", tu_tmp("sweep-svg", ""));
    const int gen = 6;
    char probe[8192]; /* a disk probe next to the model (flashlm probe-disk): its path goes into the JSON */
    snprintf(probe, sizeof probe, "%s.probe.json", flm_path);
    tu_write_file(probe, "{}\n", 3);
    snprintf(args, sizeof args, "bench -m '%s' --modes naive,sparse --mem 0 -t 2 --prompt-tokens 4 --gen-tokens %d "
             "--sweep mem=80%%,200%% --sweep window=1,2 --json '%s' --svg '%s' 2>&1", flm_path, gen, json, dir);
    char *out = NULL;
    int rc = tu_run_cli(args, &out);
    remove(probe);
    if (rc != 0) fail_msg("flashlm %s: exit %d\n%s", args, rc, out);
    assert_non_null(strstr(out, "memory-latency trade-off"));
    assert_non_null(strstr(out, "| 80% ("));
    assert_non_null(strstr(out, "| 200% ("));
    assert_non_null(strstr(out, "s_agg(k+1)-s_agg(k)"));
    free(out);

    char *text = read_text(json);
    cJSON *d = j_parse(text);
    assert_string_equal(j_str(j_get(d, "model", J_OBJ), "disk_probe"), probe);
    const cJSON *ms = j_get(d, "sweep_mem", J_ARR);
    assert_int_equal(j_len(ms), 2);
    assert_string_equal(j_str(cJSON_GetArrayItem(ms, 0), "budget"), "80%");
    for (int b = 0; b < 2; b++) {
        const cJSON *runs = j_get(cJSON_GetArrayItem(ms, b), "runs", J_ARR);
        assert_int_equal(j_len(runs), 2);
        const cJSON *nv = find_run(runs, "naive");
        check_run(nv, gen);
        near(j_num(nv, "budget"), j_num(nv, "model_bytes") * (b ? 2.0 : 0.8), 1e-6, "budget");
    }
    /* at 200% of the (tiny) model the neuron cache fits: sparse runs and reads less than naive */
    const cJSON *runs200 = j_get(cJSON_GetArrayItem(ms, 1), "runs", J_ARR);
    assert_true(check_run(find_run(runs200, "sparse"), gen) < check_run(find_run(runs200, "naive"), gen));

    const cJSON *ws = j_get(j_get(d, "sweep_window", J_OBJ), "rows", J_ARR);
    assert_int_equal(j_len(ws), 2);
    double loaded[2];
    for (int i = 0; i < 2; i++) {
        const cJSON *row = cJSON_GetArrayItem(ws, i);
        assert_true(j_num(row, "window") == i + 1);
        const cJSON *r = j_get(row, "run", J_OBJ);
        check_run(r, gen);
        assert_true(j_num(r, "window") == i + 1);
        loaded[i] = j_num(r, "neurons_loaded_per_token");
        assert_true(j_num(row, "calibration_loaded_per_token") >= 0);
    }
    assert_true(loaded[1] <= loaded[0]); /* a longer window reuses more (Knowl 3) */
    const cJSON *agg = j_get(j_get(d, "calibration", J_OBJ), "s_agg_neurons", J_ARR);
    assert_int_equal(j_len(agg), FLM_AGG_K);
    for (int k = 1; k < j_len(agg); k++) assert_true(j_at(agg, k) >= j_at(agg, k - 1) - 1e-3);
    cJSON_Delete(d);
    free(text);
    remove(json);

    const char *ml[] = {">naive<", ">sparse<", "<circle", NULL};
    check_svg_file(dir, "memory_latency.svg", ml);
    const char *win[] = {"measured: loaded per token", "s_agg(k+1) - s_agg(k)", NULL};
    check_svg_file(dir, "window.svg", win);
    check_svg_file(dir, "latency_breakdown.svg", NULL);
    check_svg_file(dir, "latency_over_time.svg", NULL);
    const char *files[] = {"memory_latency.svg", "window.svg", "latency_breakdown.svg", "latency_over_time.svg"};
    for (int i = 0; i < 4; i++) {
        char path[8192];
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        remove(path);
    }
    rmdir(dir);
}

/* A speculative row (hot with a self-draft chain of 2, stored hottest first by the setup's calibration) reports the
 * draft's tokens per generated token and its ms per drafted token: the tokens are whole (tokens per token x
 * generated tokens is the draft's count), the ms positive, and the table gives their share of ram's ms/token; a
 * row that does not speculate reports 0 for both. */
static void test_bench_draft_cost(void **state) {
    (void)state;
    const char *json = tu_tmp("bench-draft", ".json");
    char args[16384];
    const int gen = 12;
    snprintf(args, sizeof args, "bench -m '%s' --modes ram,hot+self2 --mem 80%% -t 2 --prompt-tokens 4 --gen-tokens %d "
             "--json '%s' 2>&1", flm_path, gen, json);
    char *out = NULL;
    int rc = tu_run_cli(args, &out);
    if (rc != 0) fail_msg("flashlm %s: exit %d\n%s", args, rc, out);
    assert_non_null(strstr(out, "| drafted tokens per token | ms per drafted token |"));
    const char *row = strstr(out, "| hot+self2 | ");
    if (!row || !strstr(row, "% of ram's) |")) fail_msg("no share of ram's ms/token in the hot+self2 row:\n%s", out);
    free(out);
    char *text = read_text(json);
    cJSON *d = j_parse(text);
    const cJSON *modes = j_get(d, "modes", J_ARR);
    const cJSON *ram = find_run(modes, "ram"), *hot = find_run(modes, "hot+self2");
    assert_true(j_num(ram, "draft_tokens_per_token") == 0 && j_num(ram, "draft_ms_per_draft_token") == 0);
    assert_true(j_num(hot, "tokens_per_pass") > 1); /* it speculated, and drafts were accepted */
    /* a speculative row counts every generated token (gen + 1: bench asks for the first token besides) */
    const double n_tok = j_num(hot, "n_decode_tokens"), per = j_num(hot, "draft_tokens_per_token"), drafted = per * n_tok;
    assert_true(n_tok >= gen);
    if (!(drafted >= 1 && fabs(drafted - round(drafted)) < 1e-6))
        fail_msg("draft tokens per token %.9g x %.0f tokens is not a whole count of draft tokens", per, n_tok);
    assert_true(j_num(hot, "draft_ms_per_draft_token") > 0);
    cJSON_Delete(d);
    free(text);
    remove(json);
}

/* --mem B1,B2,...: ram once without a budget, then naive, hybrid, sparse (calibrated here) and auto at each budget, in
 * one table; a budget too small is a row per mode saying why, not a failure; --svg FILE is one figure with one line
 * per mode; the JSON holds every run with its budget in bytes. */
static void test_bench_budget_list(void **state) {
    (void)state;
    const char *json = tu_tmp("budgets", ".json"), *svg = tu_tmp("budgets", ".svg");
    char args[16384];
    const int gen = 6;
    snprintf(args, sizeof args, "bench -m '%s' --mem 200%%,80%%,1K -t 2 --prompt-tokens 4 --gen-tokens %d --json '%s' "
             "--svg '%s' 2>&1", flm_path, gen, json, svg);
    char *out = NULL;
    int rc = tu_run_cli(args, &out);
    if (rc != 0) fail_msg("flashlm %s: exit %d\n%s", args, rc, out);
    assert_non_null(strstr(out, "| budget | mode | ran as | ms/token | x ram | tokens per pass | MiB read per token"));
    assert_non_null(strstr(out, "| none | ram | ram |"));
    const char *modes[] = {"naive", "hybrid", "sparse", "auto"};
    for (int m = 0; m < 4; m++) {
        char row[128];
        snprintf(row, sizeof row, "| 200%% (2.04 MiB) | %s | ", modes[m]);
        assert_non_null(strstr(out, row));
        snprintf(row, sizeof row, "| 1K (1.00 KiB) | %s | refused: ", modes[m]); /* with the plan's reason */
        const char *at = strstr(out, row);
        if (!at || !strstr(at, "too small")) fail_msg("no refused row for %s at 1K:\n%s", modes[m], out);
    }
    assert_non_null(strstr(out, "| 200% (2.04 MiB) | naive | naive |")); /* ran as itself */
    free(out);

    char *text = read_text(json);
    cJSON *d = j_parse(text);
    const cJSON *ram = j_get(d, "modes", J_ARR);
    assert_int_equal(j_len(ram), 1);
    check_run(find_run(ram, "ram"), gen);
    const cJSON *ms = j_get(d, "sweep_mem", J_ARR);
    assert_int_equal(j_len(ms), 3);
    for (int b = 0; b < 3; b++) {
        const cJSON *e = cJSON_GetArrayItem(ms, b);
        const cJSON *runs = j_get(e, "runs", J_ARR);
        assert_int_equal(j_len(runs), 4);
        if (b == 2) {
            assert_true(j_num(e, "budget_bytes") == 1024);
            for (int m = 0; m < 4; m++) {
                const cJSON *r = find_run(runs, modes[m]);
                assert_false(cJSON_IsTrue(j_get(r, "ok", J_BOOL)));
                assert_non_null(strstr(j_str(r, "error"), "too small"));
            }
            continue;
        }
        const cJSON *nv = find_run(runs, "naive");
        check_run(nv, gen);
        near(j_num(nv, "budget"), j_num(e, "budget_bytes"), 1e-9, "budget bytes");
        near(j_num(nv, "budget"), j_num(nv, "model_bytes") * (b ? 0.8 : 2.0), 1e-6, "budget");
        assert_true(j_num(nv, "io_busy_share") > 0 && j_num(nv, "io_busy_share") <= 1);
        assert_true(j_num(nv, "tokens_per_pass") == 1);
    }
    cJSON_Delete(d);
    free(text);
    remove(json);

    char *doc = read_text(svg);
    check_xml(doc, "svg", svg);
    int lines = 0;
    for (const char *p = doc; (p = strstr(p, "<polyline")); p++) lines++;
    assert_int_equal(lines, 5); /* ram's level and one line per mode */
    const char *names[] = {">ram (no budget)<", ">naive<", ">hybrid<", ">sparse<", ">auto<",
                           ">memory budget, % of the model&apos;s weights<", ">ms per token<"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        if (!strstr(doc, names[i])) fail_msg("the figure lacks %s", names[i]);
    free(doc);
    remove(svg);

    /* a bad list is refused before anything runs, naming --mem */
    snprintf(args, sizeof args, "bench -m '%s' --mem 50%%,,25%% 2>&1", flm_path);
    rc = tu_run_cli(args, &out);
    if (rc != 2 || !strstr(out, "bad --mem '50%,,25%'")) fail_msg("flashlm %s: exit %d\n%s", args, rc, out);
    free(out);
    snprintf(args, sizeof args, "bench -m '%s' --mem 50%%,25%% --sweep window=1 2>&1", flm_path);
    rc = tu_run_cli(args, &out);
    if (rc != 2 || !strstr(out, "no --sweep beside it")) fail_msg("flashlm %s: exit %d\n%s", args, rc, out);
    free(out);
}

static void test_bench_bad_sweeps(void **state) {
    (void)state;
    struct { const char *opts, *msg; } cases[] = {
        {"--sweep mem", "expected mem="},
        {"--sweep mem=", "no values"},
        {"--sweep speed=1,2", "unknown sweep"},
        {"--sweep mem=30%,,40%", "empty value"},
        {"--sweep mem=30%,", "empty value"},
        {"--sweep mem=12Q", "budget '12Q'"},
        {"--sweep mem=0", "budget '0'"},
        {"--sweep window=0", "1..4096"},
        {"--sweep window=2x", "window '2x'"},
        {"--sweep window=1 --sweep window=2", "twice"},
        {"--sweep window=1,2 --no-window", "contradicts"},
        {"--sweep", "needs a value"},
        {"--modes naive,warp", "unknown mode 'warp'"},
        {"--svg fig.svg", "names a folder"}, /* several figures: not a file named like one */
        {"--svg fig.svg", "names a folder"}, /* several figures: not a file named like one */
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char args[16384], *out = NULL;
        snprintf(args, sizeof args, "bench -m '%s' %s 2>&1", flm_path, cases[i].opts);
        int rc = tu_run_cli(args, &out);
        if (rc != 2 || !strstr(out, cases[i].msg))
            fail_msg("flashlm %s: exit %d (want 2), output lacks '%s':\n%s", args, rc, cases[i].msg, out);
        assert_null(strstr(out, "flashlm bench: ")); /* refused before running anything */
        free(out);
    }
}

/* The read path of the standard synthetic shape (synth's defaults, issue 20), scaled down: a ReLU Llama-shaped model,
 * stored hottest first by `calibrate --hot-only` under the budget, benched at --mem 50% in modes hybrid and hot. The
 * hot mode reads every layer's streamed range for every token: (1 - hot share) of each layer's records (to a record
 * and the 4 KiB alignment of a direct read at each end); hybrid reads whole streamed layers. */
static void test_bench_synthetic_hot(void **state) {
    (void)state;
    char g[4096], f[4096], json[4096], args[32768];
    snprintf(g, sizeof g, "%s", tu_tmp("bench-syn", ".gguf"));
    snprintf(f, sizeof f, "%s", tu_tmp("bench-syn", ".flm"));
    snprintf(json, sizeof json, "%s", tu_tmp("bench-syn", ".json"));
    char *out = NULL;
    snprintf(args, sizeof args, "synth '%s' --d-model 128 --d-ffn 512 --layers 16 --heads 4 --vocab 259 --calib 8 -f "
             "2>&1 && '%s' convert '%s' '%s' --force 2>&1 && '%s' calibrate '%s' --text '%s' --hot-only --mem 50%% "
             "--hot-tokens 256 --chunk 32 -t 2 2>&1", g, FLM_CLI, g, f, FLM_CLI, f, tu_data("text/tinystories_sample.txt"));
    if (tu_run_cli(args, &out) != 0) fail_msg("synth, convert, calibrate --hot-only:\n%s", out);
    assert_non_null(strstr(out, "stored hottest first"));
    free(out);
    const int gen = 8;
    snprintf(args, sizeof args, "bench -m '%s' --modes hybrid,hot --mem 50%% -t 2 --prompt-tokens 8 --gen-tokens %d "
             "--json '%s' 2>&1", f, gen, json);
    if (tu_run_cli(args, &out) != 0) fail_msg("flashlm %s:\n%s", args, out);
    assert_non_null(strstr(out, "| hybrid |"));
    assert_non_null(strstr(out, "| hot |"));
    free(out);
    char *text = read_text(json);
    cJSON *d = j_parse(text);
    const cJSON *modes = j_get(d, "modes", J_ARR);
    assert_int_equal(j_len(modes), 2);
    double hybrid = check_run(find_run(modes, "hybrid"), gen), hot = check_run(find_run(modes, "hot"), gen);
    /* the plan's hot share at bench's context (prompt + generated tokens) */
    flm_params p;
    flm_params_default(&p);
    p.mode = FLM_MODE_HOT;
    p.mem_percent = 50;
    p.n_ctx = 8 + gen;
    p.n_threads = 2;
    flm_plan_info pi;
    flm_error err;
    assert_int_equal(flm_plan(f, &p, &pi, &err), FLM_OK);
    flm_file *ff;
    assert_int_equal(flm_file_open(f, &ff, &err), FLM_OK);
    const double L = ff->n_layers, F = ff->ffn[0]->n_records, rb = (double)ff->ffn[0]->record_bytes;
    flm_file_close(ff);
    print_message("synthetic, --mem 50%%: hot keeps %.1f%% of every layer; MiB read per token: hybrid %.3f, hot %.3f\n",
                  100 * pi.hot_share, hybrid / 1048576, hot / 1048576);
    assert_true(pi.hot_share > 0.05 && pi.hot_share < 0.95);
    const double streamed = F * (1 - pi.hot_share);
    /* every token reads every layer's streamed range (plus, now and then, a 4 KiB page of the token embedding,
     * which this small model leaves on flash) */
    const double lo = L * (streamed - 1) * rb, hi = L * ((streamed + 1) * rb + 2 * FLM_ALIGN) + FLM_ALIGN;
    assert_true(hot >= lo && hot <= hi);
    const cJSON *tb = j_get(j_get(find_run(modes, "hot"), "tokens", J_OBJ), "bytes_read", J_ARR);
    for (int i = 0; i < j_len(tb); i++) assert_true(j_at(tb, i) >= lo && j_at(tb, i) <= hi);
    assert_true(hybrid > 0);
    cJSON_Delete(d);
    free(text);
    remove(json);
    remove(g);
    remove(f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_xml_checker_itself),
        cmocka_unit_test(test_svg_writer),
        cmocka_unit_test(test_bench_json_and_svg),
        cmocka_unit_test(test_bench_sweeps),
        cmocka_unit_test(test_bench_budget_list),
        cmocka_unit_test(test_bench_draft_cost),
        cmocka_unit_test(test_bench_bad_sweeps),
        cmocka_unit_test(test_bench_synthetic_hot),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
