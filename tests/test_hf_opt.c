/* test_hf_opt.c — OPT from a Hugging Face folder (issue 22), exact against transformers.
 *
 * tests/data/hf-tiny/opt-125m-style: a pre-LN OPT (d_model 64, 3 layers, 4 heads, d_ffn 256, vocab 1024, random
 * weights N(0, 0.08)) saved by transformers 5.24 / torch 2.15 with its own forward pass's answers in reference.json
 * (tests/data/README.md). `flm_convert_hf` writes its GGUF (src/convert/hf.c), `flm_convert` the .flm; then, with an
 * f32 KV cache:
 *   - the prompt's last logits: max_i |got_i - ref_i| / max_i |ref_i| <= 1e-4 (the infinity norm of the error
 *     relative to the infinity norm of the reference), in every mode;
 *   - the 16 greedy ids equal reference.json's greedy_ids;
 * in ram mode from the GGUF (dense FFN with biases) and ram, naive, hybrid from the .flm (bundles with the up bias
 * per neuron). The saved model's biases are 0 and its LayerNorm weights 1: test_sparse_biases makes them
 * non-trivial (hf_perturb.h) and checks dense and sparse against an independent NumPy forward pass
 * (tests/oracle/hf_numpy.py): the sparse mode with the true active sets (ReLU > 0) within 1e-4 and the same greedy
 * ids; calibrated predictors report their recall. The tokenizer (tokenizer/tokenizer.json)
 * gives every string of tokenize.json its ids. The safetensors parser refuses bad headers, naming file and tensor. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "flashlm.h"
#include "flashlm_tools.h"
#include "convert/safetensors.h"
#include "hf_perturb.h"
#include "testutil.h"

static char gguf[4096], flm[4096];
static int32_t prompt[64], greedy[16];
static int n_prompt, n_greedy;
static float ref_logits[1024];
static int n_ref;

static cJSON *read_json(const char *path) {
    size_t len = 0;
    uint8_t *b = tu_read_file(path, &len);
    cJSON *j = cJSON_ParseWithLength((const char *)b, len);
    free(b);
    return j;
}

static int setup(void **state) {
    (void)state;
    snprintf(gguf, sizeof gguf, "%s", tu_tmp("hf-opt", ".gguf"));
    snprintf(flm, sizeof flm, "%s", tu_tmp("hf-opt", ".flm"));
    char dir[4096], tok[4096];
    snprintf(dir, sizeof dir, "%s", tu_data("hf-tiny/opt-125m-style"));
    snprintf(tok, sizeof tok, "%s", tu_data("hf-tiny/tokenizer"));
    flm_error err;
    if (flm_convert_hf(dir, tok, gguf, FLM_TYPE_F32, 0, &err)) return fprintf(stderr, "convert_hf: %s\n", err.msg), -1;
    if (flm_convert_ex(gguf, flm, FLM_TYPE_F32, FLM_OUT_REPLACE, NULL, NULL, NULL, &err))
        return fprintf(stderr, "convert: %s\n", err.msg), -1;
    cJSON *r = read_json(tu_data("hf-tiny/opt-125m-style/reference.json"));
    if (!r) return -1;
    const cJSON *p = cJSON_GetObjectItem(r, "prompt_ids"), *g = cJSON_GetObjectItem(r, "greedy_ids"),
                *l = cJSON_GetObjectItem(r, "prompt_last_logits");
    for (const cJSON *e = p->child; e && n_prompt < 64; e = e->next) prompt[n_prompt++] = e->valueint;
    for (const cJSON *e = g->child; e && n_greedy < 16; e = e->next) greedy[n_greedy++] = e->valueint;
    for (const cJSON *e = l->child; e && n_ref < 1024; e = e->next) ref_logits[n_ref++] = (float)e->valuedouble;
    cJSON_Delete(r);
    return n_prompt > 0 && n_greedy == 16 && n_ref == 1024 ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    remove(gguf);
    remove(flm);
    return 0;
}

static flm_ctx *open_model(const char *path, flm_mode mode, uint64_t mem, flm_error *err) {
    flm_params p;
    flm_params_default(&p);
    p.kv_f32 = true;
    p.n_threads = 2;
    p.n_ctx = 64;
    p.mode = mode;
    p.mem_bytes = mem;
    flm_ctx *ctx = NULL;
    if (flm_open(path, &p, &ctx, err)) return NULL;
    return ctx;
}

/* The prompt's last logits against the reference, then 16 greedy steps. */
static void check_model(const char *path, flm_mode mode, uint64_t mem, const char *what) {
    flm_error err;
    flm_ctx *ctx = open_model(path, mode, mem, &err);
    if (!ctx) fail_msg("flm_open(%s, %s): %s", path, what, err.msg);
    assert_int_equal(flm_vocab_size(ctx), 1024);
    const float *logits = NULL;
    if (flm_eval_batch(ctx, prompt, (uint32_t)n_prompt, 0, NULL, &logits, &err)) fail_msg("eval: %s", err.msg);
    double num = 0, den = 0;
    for (int i = 0; i < n_ref; i++) {
        double d = fabs((double)logits[i] - ref_logits[i]);
        if (d > num) num = d;
        if (fabs(ref_logits[i]) > den) den = fabs(ref_logits[i]);
    }
    print_message("%s: prompt's last logits: max|err| %.3g, max|ref| %.3g, relative %.3g\n", what, num, den, num / den);
    assert_true(num / den <= 1e-4);
    int32_t pos = n_prompt, got[16];
    for (int s = 0; s < 16; s++) {
        got[s] = tu_argmax(logits, n_ref);
        if (s < 15 && flm_eval(ctx, got[s], pos++, &logits, &err)) fail_msg("eval: %s", err.msg);
    }
    for (int s = 0; s < 16; s++)
        if (got[s] != greedy[s]) fail_msg("%s: greedy step %d: id %d, transformers %d", what, s, got[s], greedy[s]);
    flm_close(ctx);
}

static void test_ram_gguf(void **state) {
    (void)state;
    check_model(gguf, FLM_MODE_AUTO, 0, "GGUF (mapped, dense FFN)");
}

static void test_flm_modes(void **state) {
    (void)state;
    check_model(flm, FLM_MODE_RAM, 0, ".flm ram");
    check_model(flm, FLM_MODE_NAIVE, 4u << 20, ".flm naive");
    check_model(flm, FLM_MODE_HYBRID, 4u << 20, ".flm hybrid");
}

/* f16 and q8_0 matrices: near the reference (not exact), the same first greedy id. */
static void test_f16_q8_0(void **state) {
    (void)state;
    const uint32_t types[] = {FLM_TYPE_F16, FLM_TYPE_Q8_0};
    for (int i = 0; i < 2; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s", tu_tmp("hf-opt-t", ".gguf"));
        flm_error err;
        char dir[4096];
        snprintf(dir, sizeof dir, "%s", tu_data("hf-tiny/opt-125m-style"));
        if (flm_convert_hf(dir, NULL, path, types[i], FLM_HF_NO_TOKENIZER, &err)) fail_msg("convert_hf: %s", err.msg);
        flm_ctx *ctx = open_model(path, FLM_MODE_AUTO, 0, &err);
        if (!ctx) fail_msg("open: %s", err.msg);
        const float *logits = NULL;
        if (flm_eval_batch(ctx, prompt, (uint32_t)n_prompt, 0, NULL, &logits, &err)) fail_msg("eval: %s", err.msg);
        double num = 0, den = 0;
        for (int j = 0; j < n_ref; j++) {
            double d = fabs((double)logits[j] - ref_logits[j]);
            if (d > num) num = d;
            if (fabs(ref_logits[j]) > den) den = fabs(ref_logits[j]);
        }
        print_message("%s: relative max error %.3g\n", i ? "q8_0" : "f16", num / den);
        assert_true(num / den < 0.05);
        assert_int_equal(tu_argmax(logits, n_ref), greedy[0]);
        flm_close(ctx);
        remove(path);
    }
}

/* ---- the sparse mode: ReLU FFN with biases ---------------------------------------------------------------------- */

/* The smallest budget (4 KiB steps) that opens p in sparse mode on path: the neuron caches as small as they get. */
static uint64_t sparse_min_budget(const char *path, flm_params p) {
    for (uint64_t mem = 256u << 10; mem < (16u << 20); mem += 4u << 10) {
        p.mem_bytes = mem;
        flm_plan_info info;
        flm_error err;
        if (flm_plan(path, &p, &info, &err) == FLM_OK) return mem;
    }
    fail_msg("%s: no budget opens the sparse mode", path);
    return 0;
}

/* The prompt (one batch) and 16 greedy steps in ctx: the prompt's last logits into last[1024], the ids into got. */
static void run_greedy(flm_ctx *ctx, float *last, int32_t *got) {
    flm_error err;
    const float *logits = NULL;
    if (flm_eval_batch(ctx, prompt, (uint32_t)n_prompt, 0, NULL, &logits, &err)) fail_msg("eval: %s", err.msg);
    memcpy(last, logits, sizeof(float) * 1024);
    int32_t pos = n_prompt;
    for (int s = 0; s < 16; s++) {
        got[s] = tu_argmax(logits, n_ref);
        if (s < 15 && flm_eval(ctx, got[s], pos++, &logits, &err)) fail_msg("eval: %s", err.msg);
    }
}

static double rel_err(const float *got, const float *ref) { /* max |got - ref| / max |ref| */
    double num = 0, den = 0;
    for (int i = 0; i < n_ref; i++) {
        double d = fabs((double)got[i] - ref[i]);
        if (d > num) num = d;
        if (fabs(ref[i]) > den) den = fabs(ref[i]);
    }
    return num / den;
}

/* The perturbed model's reference (hf_perturb.h: every bias and LayerNorm weight non-trivial; NumPy's answers) */
static float pert_logits[1024];
static int32_t pert_greedy[16];

/* path (mode, budget mem, f32 KV) against the perturbed model's reference: logits within 1e-4, 16 greedy ids equal */
static void check_perturbed(const char *path, flm_params p, const char *what) {
    flm_error err;
    flm_ctx *ctx = NULL;
    if (flm_open(path, &p, &ctx, &err)) fail_msg("open %s: %s", what, err.msg);
    float last[1024];
    int32_t got[16];
    run_greedy(ctx, last, got);
    flm_stats st;
    flm_get_stats(ctx, &st);
    const double rel = rel_err(last, pert_logits);
    if (p.mode == FLM_MODE_SPARSE)
        print_message("%s: %llu cache rows, %llu neurons streamed, %.1f%% of neurons active; prompt's last logits: "
                      "relative max error %.3g\n", what, (unsigned long long)st.cache_rows,
                      (unsigned long long)st.n_streamed,
                      100.0 * (double)st.total.n_predicted / ((double)st.n_tokens * 3 * 256), rel);
    else
        print_message("%s: prompt's last logits: relative max error %.3g\n", what, rel);
    assert_true(rel <= 1e-4);
    for (int s = 0; s < 16; s++)
        if (got[s] != pert_greedy[s]) fail_msg("%s: greedy step %d: id %d, NumPy %d", what, s, got[s], pert_greedy[s]);
    if (p.mode == FLM_MODE_SPARSE && p.mem_bytes) assert_true(st.n_streamed > 0);
    flm_close(ctx);
}

/* OPT's FFN has biases (up . x + b_up, then ReLU): calibrate learns the active sets with the bias, and the sparse
 * mode computes each neuron with its own b_up, whether it comes from a cache row, a stream buffer record or a
 * batch. On the model with every bias and LayerNorm weight made non-trivial (hf_perturb.h; the saved model's are 0
 * and 1, which would hide a missing bias) against the NumPy forward pass's answers: dense (GGUF, .flm ram), then
 * the sparse mode with the true active sets (--no-predictor: ReLU > 0, exact for a ReLU FFN), with every neuron
 * cached and with the smallest caches (most of each token's set streamed): logits within 1e-4, the 16 greedy ids
 * equal. With the calibrated predictors the recall is reported, and a batch equals the same tokens one by one. */
static void test_sparse_biases(void **state) {
    (void)state;
    const char *tok = hf_byte_tokenizer();
    char dir[4096], g2[4096], f2[4096];
    snprintf(dir, sizeof dir, "%s", hf_perturbed_folder("opt-125m-style"));
    snprintf(g2, sizeof g2, "%s", tu_tmp("hf-opt-sparse", ".gguf"));
    snprintf(f2, sizeof f2, "%s", tu_tmp("hf-opt-sparse", ".flm"));
    flm_error err;
    if (flm_convert_hf(dir, tok, g2, FLM_TYPE_F32, 0, &err)) fail_msg("convert_hf: %s", err.msg);
    if (flm_convert_ex(g2, f2, FLM_TYPE_F32, FLM_OUT_REPLACE, NULL, NULL, NULL, &err)) fail_msg("convert: %s", err.msg);
    {
        char path[4300];
        snprintf(path, sizeof path, "%s/perturbed.json", dir);
        cJSON *r = read_json(path);
        assert_non_null(r);
        int ng = 0, nl = 0;
        for (const cJSON *e = cJSON_GetObjectItem(r, "greedy_ids")->child; e && ng < 16; e = e->next)
            pert_greedy[ng++] = e->valueint;
        for (const cJSON *e = cJSON_GetObjectItem(r, "prompt_last_logits")->child; e && nl < 1024; e = e->next)
            pert_logits[nl++] = (float)e->valuedouble;
        cJSON_Delete(r);
        assert_int_equal(ng, 16);
        assert_int_equal(nl, 1024);
        hf_remove_folder(dir);
    }
    flm_params p;
    flm_params_default(&p);
    p.kv_f32 = true;
    p.n_threads = 2;
    p.n_ctx = 64;
    check_perturbed(g2, p, "perturbed, GGUF (dense)");
    p.mode = FLM_MODE_RAM;
    check_perturbed(f2, p, "perturbed, .flm ram (bundles)");
    size_t len;
    char *text = (char *)tu_read_file(tu_data("text/tinystories_sample.txt"), &len);
    text = realloc(text, len + 1);
    text[len] = 0;
    flm_calib_opts o;
    flm_calib_opts_default(&o);
    o.text = text;
    o.chunk = 64;
    o.max_tokens = 2048;
    o.n_threads = 2;
    flm_calib_report rep;
    if (flm_calib_run(f2, &o, false, &rep, &err)) fail_msg("calibrate: %s", err.msg);
    assert_true(rep.relu);
    print_message("calibrated: ReLU rule, %u level(s); true active share %.3f, predicted %.3f, held-out recall %.3f\n",
                  rep.n_levels, rep.levels[0].oracle_frac, rep.levels[0].pred_frac, rep.levels[0].recall);
    flm_calib_report_free(&rep);
    free(text);

    p.mode = FLM_MODE_SPARSE;
    p.no_predictor = true;
    check_perturbed(f2, p, "perturbed, sparse, true active sets, every neuron cached");
    p.mem_bytes = sparse_min_budget(f2, p);
    check_perturbed(f2, p, "perturbed, sparse, true active sets, smallest caches");
    float last[1024];
    int32_t got[16];
    /* the calibrated predictors: the recall, and a batch against the same tokens one by one */
    p.no_predictor = false;
    const uint64_t tight_pred = sparse_min_budget(f2, p);
    for (int t = 0; t < 2; t++) {
        p.mem_bytes = t ? tight_pred : 0;
        p.verify_predictor = true;
        flm_ctx *ctx = NULL;
        if (flm_open(f2, &p, &ctx, &err)) fail_msg("open sparse: %s", err.msg);
        run_greedy(ctx, last, got);
        flm_stats st;
        flm_get_stats(ctx, &st);
        const double recall = (double)st.total.n_true_pos / (double)st.total.n_true;
        print_message("sparse, predictors, %s: recall %.3f (%llu of %llu truly active neurons predicted), logits "
                      "relative max error %.3g, first greedy id %d (transformers %d)\n",
                      t ? "smallest caches" : "every neuron cached", recall, (unsigned long long)st.total.n_true_pos,
                      (unsigned long long)st.total.n_true, rel_err(last, pert_logits), got[0], pert_greedy[0]);
        assert_true(recall > 0.5);
        flm_close(ctx);
        p.verify_predictor = false; /* a batch (one union, b_up gathered by cache row) against one by one */
        flm_ctx *a = NULL, *b = NULL;
        if (flm_open(f2, &p, &a, &err) || flm_open(f2, &p, &b, &err)) fail_msg("open sparse: %s", err.msg);
        const float *la = NULL, *lb = NULL;
        if (flm_eval_batch(a, prompt, (uint32_t)n_prompt, 0, NULL, &la, &err)) fail_msg("eval: %s", err.msg);
        for (int i = 0; i < n_prompt; i++)
            if (flm_eval(b, prompt[i], i, &lb, &err)) fail_msg("eval: %s", err.msg);
        const double d = rel_err(la, lb);
        print_message("  a batch against one by one: relative max difference %.3g\n", d);
        assert_true(d <= 1e-5);
        flm_close(a);
        flm_close(b);
    }
    remove(g2);
    remove(f2);
    hf_remove_tokenizer(tok);
}

/* tokenizer.json's ids of every string of tokenize.json (as transformers gives them: no BOS, specials parsed). */
static void test_tokenizer(void **state) {
    (void)state;
    flm_error err;
    flm_ctx *ctx = open_model(gguf, FLM_MODE_AUTO, 0, &err);
    if (!ctx) fail_msg("open: %s", err.msg);
    cJSON *cases = read_json(tu_data("hf-tiny/tokenizer/tokenize.json"));
    assert_non_null(cases);
    int n_cases = 0;
    for (const cJSON *c = cases->child; c; c = c->next, n_cases++) {
        const char *text = cJSON_GetObjectItem(c, "text")->valuestring;
        const cJSON *ids = cJSON_GetObjectItem(c, "ids");
        int32_t got[256];
        size_t n = flm_tokenize_ex(ctx, text, strlen(text), FLM_TOKENIZE_PARSE_SPECIAL, got, 256);
        size_t want = (size_t)cJSON_GetArraySize(ids);
        if (n != want) fail_msg("'%s': %zu ids, transformers %zu", text, n, want);
        size_t i = 0;
        for (const cJSON *e = ids->child; e; e = e->next, i++)
            if (got[i] != e->valueint) fail_msg("'%s': id %zu is %d, transformers %d", text, i, got[i], e->valueint);
    }
    assert_true(n_cases >= 7);
    /* OPT prepends its BOS </s> (id 2) when asked for the model's specials */
    int32_t ids[8];
    size_t n = flm_tokenize_ex(ctx, "<|endoftext|>", 13, FLM_TOKENIZE_ADD_SPECIAL | FLM_TOKENIZE_PARSE_SPECIAL, ids,
                               8);
    assert_int_equal(n, 2);
    assert_int_equal(ids[0], 2);
    assert_int_equal(ids[1], 0);
    cJSON_Delete(cases);
    flm_close(ctx);
}

/* The CLI: `flashlm convert HF_DIR OUT.flm`, then `run --prompt-ids ... --print-ids` prints transformers' ids. */
static void test_cli_prompt_ids(void **state) {
    (void)state;
    char out[4096], args[16384], ids[512] = "", want[512] = "";
    snprintf(out, sizeof out, "%s", tu_tmp("hf-opt-cli", ".flm"));
    char dir[4096], tok[4096];
    snprintf(dir, sizeof dir, "%s", tu_data("hf-tiny/opt-125m-style"));
    snprintf(tok, sizeof tok, "%s", tu_data("hf-tiny/tokenizer"));
    snprintf(args, sizeof args, "convert '%s' '%s' --type f32 --tokenizer '%s' 2>&1", dir, out, tok);
    char *text = NULL;
    int rc = tu_run_cli(args, &text);
    if (rc) fail_msg("convert: exit %d: %s", rc, text);
    free(text);
    for (int i = 0; i < n_prompt; i++) snprintf(ids + strlen(ids), sizeof ids - strlen(ids), "%s%d", i ? "," : "", prompt[i]);
    for (int i = 0; i < 16; i++) snprintf(want + strlen(want), sizeof want - strlen(want), "%s%d", i ? "," : "", greedy[i]);
    snprintf(args, sizeof args, "run -m '%s' --prompt-ids %s --print-ids --temp 0 -n 16 --kv-f32 --mode naive "
             "--mem 4M 2>/dev/null", out, ids);
    rc = tu_run_cli(args, &text);
    assert_int_equal(rc, 0);
    size_t n = strlen(text);
    while (n && (text[n - 1] == '\n' || text[n - 1] == ' ')) text[--n] = 0;
    print_message("cli: %s\n", text);
    assert_string_equal(text, want);
    free(text);
    remove(out);
}

/* Write tensors [i0, i1) of f as a safetensors file at path (f32/f16/bf16 as they are; offsets in order). */
static void write_shard(const flm_st_file *f, uint64_t i0, uint64_t i1, const char *path) {
    cJSON *h = cJSON_CreateObject();
    uint64_t off = 0;
    for (uint64_t i = i0; i < i1; i++) {
        const flm_st_tensor *t = &f->tensors[i];
        cJSON *e = cJSON_AddObjectToObject(h, t->name);
        cJSON_AddStringToObject(e, "dtype", "F32");
        assert_int_equal(t->type, FLM_TYPE_F32);
        cJSON *shape = cJSON_AddArrayToObject(e, "shape");
        for (uint32_t d = 0; d < t->n_dims; d++) cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)t->shape[d]));
        cJSON *o = cJSON_AddArrayToObject(e, "data_offsets");
        cJSON_AddItemToArray(o, cJSON_CreateNumber((double)off));
        cJSON_AddItemToArray(o, cJSON_CreateNumber((double)(off + t->nbytes)));
        off += t->nbytes;
    }
    char *js = cJSON_PrintUnformatted(h);
    size_t hl = strlen(js), len = 8 + hl + off;
    uint8_t *b = malloc(len);
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)((uint64_t)hl >> (8 * i));
    memcpy(b + 8, js, hl);
    uint8_t *p = b + 8 + hl;
    for (uint64_t i = i0; i < i1; i++) {
        memcpy(p, f->tensors[i].data, f->tensors[i].nbytes);
        p += f->tensors[i].nbytes;
    }
    tu_write_file(path, b, len);
    free(b);
    free(js);
    cJSON_Delete(h);
}

/* The same model in two shards named by model.safetensors.index.json converts to the same GGUF bytes; a weight_map
 * that puts a tensor in the wrong shard is refused, naming it. */
static void test_sharded(void **state) {
    (void)state;
    flm_st_file *f = NULL;
    flm_error err;
    if (flm_st_open(tu_data("hf-tiny/opt-125m-style/model.safetensors"), &f, &err)) fail_msg("%s", err.msg);
    char dir[4096], path[4300], out[4096];
    snprintf(dir, sizeof dir, "%s", tu_tmp("hf-sharded", ""));
    assert_int_equal(mkdir(dir, 0755), 0);
    const uint64_t half = f->n_tensors / 2;
    snprintf(path, sizeof path, "%s/model-00001-of-00002.safetensors", dir);
    write_shard(f, 0, half, path);
    snprintf(path, sizeof path, "%s/model-00002-of-00002.safetensors", dir);
    write_shard(f, half, f->n_tensors, path);
    for (int bad = 0; bad < 2; bad++) {
        cJSON *idx = cJSON_CreateObject(), *wm = cJSON_AddObjectToObject(idx, "weight_map");
        for (uint64_t i = 0; i < f->n_tensors; i++)
            cJSON_AddStringToObject(wm, f->tensors[i].name, (i < half) != (bad && i == 0)
                                                                ? "model-00001-of-00002.safetensors"
                                                                : "model-00002-of-00002.safetensors");
        char *js = cJSON_Print(idx);
        snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
        tu_write_file(path, js, strlen(js));
        free(js);
        cJSON_Delete(idx);
        size_t len;
        uint8_t *cfg = tu_read_file(tu_data("hf-tiny/opt-125m-style/config.json"), &len);
        snprintf(path, sizeof path, "%s/config.json", dir);
        tu_write_file(path, cfg, len);
        free(cfg);
        snprintf(out, sizeof out, "%s", tu_tmp("hf-sharded", ".gguf"));
        char tok[4096];
        snprintf(tok, sizeof tok, "%s", tu_data("hf-tiny/tokenizer"));
        flm_status st = flm_convert_hf(dir, tok, out, FLM_TYPE_F32, 0, &err);
        if (bad) {
            assert_int_equal(st, FLM_ERR_FORMAT);
            print_message("bad weight_map: %s\n", err.msg);
            assert_non_null(strstr(err.msg, f->tensors[0].name));
            continue;
        }
        if (st) fail_msg("convert_hf (sharded): %s", err.msg);
        size_t na, nb;
        uint8_t *a = tu_read_file(out, &na), *b = tu_read_file(gguf, &nb);
        assert_int_equal(na, nb);
        assert_memory_equal(a, b, na);
        free(a);
        free(b);
        remove(out);
    }
    const char *names[] = {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
                           "model.safetensors.index.json", "config.json"};
    for (int i = 0; i < 4; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        remove(path);
    }
    rmdir(dir);
    flm_st_close(f);
}

/* ---- the safetensors parser on bad input ---------------------------------------------------------------------- */

/* A file of header h (JSON) and data_bytes zero bytes. */
static uint8_t *make_st(const char *h, size_t data_bytes, size_t *len) {
    size_t hl = strlen(h);
    *len = 8 + hl + data_bytes;
    uint8_t *b = calloc(1, *len);
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)((uint64_t)hl >> (8 * i));
    memcpy(b + 8, h, hl);
    return b;
}

static void expect_error(const uint8_t *b, size_t len, const char *needle) {
    flm_st_file *f = NULL;
    flm_error err;
    flm_status st = flm_st_open_buffer("bad.safetensors", b, len, &f, &err);
    assert_int_not_equal(st, FLM_OK);
    assert_null(f);
    print_message("  %s\n", err.msg);
    assert_non_null(strstr(err.msg, "bad.safetensors"));
    if (!strstr(err.msg, needle)) fail_msg("'%s' does not say '%s'", err.msg, needle);
}

static void test_safetensors_bad(void **state) {
    (void)state;
    size_t len;
    uint8_t *b = make_st("{\"w\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]}}", 16, &len);
    flm_st_file *f = NULL;
    flm_error err;
    assert_int_equal(flm_st_open_buffer("good.safetensors", b, len, &f, &err), FLM_OK);
    assert_int_equal(f->n_tensors, 1);
    assert_int_equal(f->tensors[0].shape[1], 2);
    assert_ptr_equal(f->tensors[0].data, b + len - 16);
    flm_st_close(f);
    expect_error(b, 5, "truncated");              /* shorter than the length */
    expect_error(b, len - 20, "truncated");       /* header cut */
    expect_error(b, len - 1, "'w'");              /* data cut: offsets past the end, naming the tensor */
    free(b);
    b = make_st("{\"w\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,64]}}", 16, &len);
    expect_error(b, len, "past the end");
    free(b);
    b = make_st("{\"w\":{\"dtype\":\"F16\",\"shape\":[2,2],\"data_offsets\":[0,16]}}", 16, &len);
    expect_error(b, len, "shape x F16 is 8 bytes"); /* dtype/shape against the byte length */
    free(b);
    b = make_st("{\"w\":{\"dtype\":\"I64\",\"shape\":[2],\"data_offsets\":[0,16]}}", 16, &len);
    expect_error(b, len, "I64");
    free(b);
    b = make_st("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 16, &len);
    expect_error(b, len, "overlap");
    free(b);
    b = make_st("{\"w\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 16, &len);
    expect_error(b, len, "shape[0]");
    free(b);
    b = make_st("{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", 16, &len);
    expect_error(b, len, "begin after");
    free(b);
    b = make_st("{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}", 16, &len); /* no closing brace */
    expect_error(b, len, "JSON");
    free(b);
    uint8_t huge[16] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f, '{', '}'};
    expect_error(huge, sizeof huge, "header length");
}

/* A layout flashlm lacks is refused with the reason: pre-LN OPT without its final LayerNorm
 * (_remove_final_layer_norm; post-LN OPT-350M runs: tests/test_hf_archs.c). */
static void test_config_refused(void **state) {
    (void)state;
    char dir[4096], cfg[4200];
    snprintf(dir, sizeof dir, "%s", tu_tmp("hf-no-final-ln", ""));
    assert_int_equal(mkdir(dir, 0755), 0);
    size_t len;
    uint8_t *c = tu_read_file(tu_data("hf-tiny/opt-125m-style/config.json"), &len);
    char *s = malloc(len + 1);
    memcpy(s, c, len);
    s[len] = 0;
    const char *from = "\"_remove_final_layer_norm\": false";
    char *p = strstr(s, from);
    assert_non_null(p);
    char *t = calloc(1, len + 8);
    memcpy(t, s, (size_t)(p - s));
    strcat(t, "\"_remove_final_layer_norm\": true");
    strcat(t, p + strlen(from));
    snprintf(cfg, sizeof cfg, "%s/config.json", dir);
    tu_write_file(cfg, t, strlen(t));
    free(t);
    flm_error err;
    char out[4096];
    snprintf(out, sizeof out, "%s", tu_tmp("hf-no-final-ln", ".gguf"));
    assert_int_equal(flm_convert_hf(dir, NULL, out, FLM_TYPE_F32, FLM_HF_NO_TOKENIZER, &err), FLM_ERR_UNSUPPORTED);
    print_message("no final LayerNorm: %s\n", err.msg);
    assert_non_null(strstr(err.msg, "_remove_final_layer_norm"));
    remove(cfg);
    rmdir(dir);
    free(s);
    free(c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ram_gguf),       cmocka_unit_test(test_flm_modes),
        cmocka_unit_test(test_f16_q8_0),       cmocka_unit_test(test_sparse_biases),
        cmocka_unit_test(test_tokenizer),      cmocka_unit_test(test_safetensors_bad),
        cmocka_unit_test(test_config_refused), cmocka_unit_test(test_cli_prompt_ids),
        cmocka_unit_test(test_sharded),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
