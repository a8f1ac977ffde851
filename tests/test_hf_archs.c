/* test_hf_archs.c — Falcon, Phi-2, Persimmon and OPT-350M's layout from Hugging Face folders (issue 22), exact
 * against transformers (against NumPy for OPT-350M's).
 *
 * tests/data/hf-tiny/{falcon-7b-style,phi-2-style,persimmon-8b-style}: random-weight models (d_model 64, 3 layers,
 * 4 heads of 16, d_ffn 256, vocab 1024) of Falcon 7B's layout (parallel attention and FFN, multi-query attention,
 * fused q/k/v, exact GELU), Phi-2's (parallel, partial RoPE over 6 of 16 dimensions, tanh-GELU, biases, classifier
 * bias) and Persimmon's (q/k LayerNorm, fused q/k/v interleaved per head, partial RoPE over 8 of 16, squared ReLU,
 * biases), saved by transformers 5.24 / torch 2.15 with their forward pass's answers in reference.json; and
 * opt-350m-style: OPT-350M's layout (post-LN: do_layer_norm_before false, no final LayerNorm; word_embed_proj_dim 32
 * for d_model 64: project_in / project_out), random weights with non-trivial biases and norm weights, written with its
 * reference by the NumPy oracle (tests/oracle/hf_numpy.py --make-opt350m; no torch here)
 * (tests/data/README.md). `flm_convert_hf` writes each one's GGUF (src/convert/hf.c), `flm_convert` the .flm; then,
 * with an f32 KV cache, in ram mode from the GGUF (dense FFN, every weight mapped) and ram, naive and hybrid (some
 * layers resident, the others streamed) from the .flm (bundles):
 *   - the prompt's last logits (the prompt as one batch): max_i |got_i - ref_i| / max_i |ref_i| <= 1e-4;
 *   - the 16 greedy ids (decoding token by token) equal reference.json's greedy_ids.
 * The models were saved with biases 0 and norm weights 1 (transformers' initialization), which cannot show whether a
 * bias or a norm weight is applied, or where: each is run again with every bias and norm weight made non-trivial
 * (tests/hf_perturb.h) against the answers of an independent NumPy forward pass (tests/oracle/hf_numpy.py, which
 * gives transformers' answers on the unperturbed models within 6.3e-7), hf-tiny/DIR/perturbed.json, the same way.
 * The GGUF's names are llama.cpp's for the architecture (src/llama-arch.cpp, LLM_TENSOR_NAMES), so a GGUF from
 * llama.cpp's own converter loads the same way. Configurations flashlm cannot run are refused with the reason. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "flashlm.h"
#include "flashlm_tools.h"
#include "format/gguf.h"
#include "write/gguf_write.h"
#include "hf_perturb.h"
#include "testutil.h"

typedef struct arch_case {
    const char *dir;      /* under tests/data/hf-tiny */
    const char *arch;     /* general.architecture */
    const char *names[16]; /* llama.cpp's tensor names for it (LLM_TENSOR_NAMES), the blk.N. prefix dropped */
    const char *must[6];  /* tensors this layout needs in the written file */
    int32_t prompt[64];
    int n_prompt;
    /* [0]: the model as saved, against transformers (reference.json); [1]: perturbed, against NumPy (perturbed.json) */
    char gguf[2][4096], flm[2][4096];
    int32_t greedy[2][16];
    float ref[2][1024];
} arch_case;

static arch_case cases[] = {
    {.dir = "falcon-7b-style", .arch = "falcon",
     .names = {"token_embd", "output_norm", "output", "attn_norm", "attn_norm_2", "attn_qkv", "attn_output",
               "ffn_down", "ffn_up"},
     .must = {"blk.0.attn_qkv.weight", "blk.2.ffn_up.weight", "output_norm.bias"}},
    {.dir = "phi-2-style", .arch = "phi2",
     .names = {"token_embd", "output_norm", "output", "attn_norm", "attn_qkv", "attn_q", "attn_k", "attn_v",
               "attn_output", "ffn_norm", "ffn_down", "ffn_up"},
     .must = {"blk.0.attn_q.bias", "blk.0.attn_output.bias", "blk.0.ffn_up.bias", "blk.0.ffn_down.bias",
              "output.bias"}},
    {.dir = "persimmon-8b-style", .arch = "persimmon",
     .names = {"token_embd", "output_norm", "output", "attn_norm", "attn_qkv", "attn_output", "attn_q_norm",
               "attn_k_norm", "ffn_norm", "ffn_down", "ffn_up", "attn_rot_embd"},
     .must = {"blk.0.attn_qkv.weight", "blk.0.attn_qkv.bias", "blk.0.attn_q_norm.bias", "blk.0.attn_k_norm.weight",
              "blk.1.ffn_norm.bias", "output.weight"}},
    /* OPT-350M's layout (post-LN, project_in/out, no final norm): made by tests/oracle/hf_numpy.py, so both its
       references are NumPy's (the names beyond llama.cpp's: proj_in, proj_out are flashlm's, llama.cpp has no OPT) */
    {.dir = "opt-350m-style", .arch = "opt",
     .names = {"token_embd", "position_embd", "proj_in", "proj_out", "attn_norm", "attn_q", "attn_k", "attn_v",
               "attn_output", "ffn_norm", "ffn_up", "ffn_down"},
     .must = {"proj_in.weight", "proj_out.weight", "blk.2.ffn_norm.bias", "blk.0.ffn_up.bias", "blk.0.attn_q.bias"}},
};
#define N_CASES (sizeof cases / sizeof cases[0])

static cJSON *read_json(const char *path) {
    size_t len = 0;
    uint8_t *b = tu_read_file(path, &len);
    cJSON *j = cJSON_ParseWithLength((const char *)b, len);
    free(b);
    return j;
}

/* Read a reference (reference.json or perturbed.json): prompt, 16 greedy ids, the prompt's last logits. */
static int read_ref(const char *path, arch_case *a, int v) {
    cJSON *r = read_json(path);
    if (!r) return -1;
    const cJSON *p = cJSON_GetObjectItem(r, "prompt_ids"), *g = cJSON_GetObjectItem(r, "greedy_ids"),
                *l = cJSON_GetObjectItem(r, "prompt_last_logits");
    int np = 0, ng = 0, nl = 0;
    for (const cJSON *e = p->child; e && np < 64; e = e->next) a->prompt[np++] = e->valueint;
    for (const cJSON *e = g->child; e && ng < 16; e = e->next) a->greedy[v][ng++] = e->valueint;
    for (const cJSON *e = l->child; e && nl < 1024; e = e->next) a->ref[v][nl++] = (float)e->valuedouble;
    cJSON_Delete(r);
    a->n_prompt = np;
    return np > 0 && ng == 16 && nl == 1024 ? 0 : -1;
}

static int setup(void **state) {
    (void)state;
    for (size_t c = 0; c < N_CASES; c++) {
        arch_case *a = &cases[c];
        for (int v = 0; v < 2; v++) {
            char dir[4096], rel[256];
            snprintf(a->gguf[v], sizeof a->gguf[v], "%s", tu_tmp(a->arch, ".gguf"));
            snprintf(a->flm[v], sizeof a->flm[v], "%s", tu_tmp(a->arch, ".flm"));
            snprintf(rel, sizeof rel, "hf-tiny/%s", a->dir);
            snprintf(dir, sizeof dir, "%s", v ? hf_perturbed_folder(a->dir) : tu_data(rel));
            flm_error err;
            if (flm_convert_hf(dir, NULL, a->gguf[v], FLM_TYPE_F32, FLM_HF_NO_TOKENIZER, &err))
                return fprintf(stderr, "convert_hf %s: %s\n", a->dir, err.msg), -1;
            if (flm_convert_ex(a->gguf[v], a->flm[v], FLM_TYPE_F32, FLM_OUT_REPLACE, NULL, NULL, NULL, &err))
                return fprintf(stderr, "convert %s: %s\n", a->dir, err.msg), -1;
            snprintf(rel, sizeof rel, "hf-tiny/%s/%s", a->dir, v ? "perturbed.json" : "reference.json");
            if (read_ref(tu_data(rel), a, v)) return -1;
            if (v) hf_remove_folder(dir);
        }
    }
    return 0;
}

static int teardown(void **state) {
    (void)state;
    for (size_t c = 0; c < N_CASES; c++)
        for (int v = 0; v < 2; v++) {
            remove(cases[c].gguf[v]);
            remove(cases[c].flm[v]);
        }
    return 0;
}

static flm_params params(flm_mode mode, uint64_t mem, bool kv_f32) {
    flm_params p;
    flm_params_default(&p);
    p.kv_f32 = kv_f32;
    p.n_threads = 2;
    p.n_ctx = 64;
    p.mode = mode;
    p.mem_bytes = mem;
    return p;
}

/* max_i |got_i - ref_i| / max_i |ref_i| */
static double rel_err(const float *got, const float *ref, int n) {
    double num = 0, den = 0;
    for (int i = 0; i < n; i++) {
        double d = fabs((double)got[i] - ref[i]);
        if (d > num) num = d;
        if (fabs(ref[i]) > den) den = fabs(ref[i]);
    }
    return num / den;
}

/* The prompt's last logits against reference v (relative error <= tol), then 16 greedy steps (all equal when
 * exact, else only the first). */
static void check_model(const arch_case *a, int v, const char *path, flm_params p, double tol, bool exact,
                        const char *what) {
    flm_error err;
    flm_ctx *ctx = NULL;
    if (flm_open(path, &p, &ctx, &err)) fail_msg("%s %s: flm_open: %s", a->arch, what, err.msg);
    assert_int_equal(flm_vocab_size(ctx), 1024);
    const float *logits = NULL;
    if (flm_eval_batch(ctx, a->prompt, (uint32_t)a->n_prompt, 0, NULL, &logits, &err)) fail_msg("eval: %s", err.msg);
    const double rel = rel_err(logits, a->ref[v], 1024);
    print_message("%-9s %-13s %-26s prompt's last logits: relative max error %.3g\n", a->arch,
                  v ? "perturbed" : "as saved", what, rel);
    assert_true(rel <= tol);
    int32_t pos = a->n_prompt, got[16];
    for (int s = 0; s < 16; s++) {
        got[s] = tu_argmax(logits, 1024);
        if (s < 15 && flm_eval(ctx, got[s], pos++, &logits, &err)) fail_msg("eval: %s", err.msg);
    }
    for (int s = 0; s < (exact ? 16 : 1); s++)
        if (got[s] != a->greedy[v][s])
            fail_msg("%s %s: greedy step %d: id %d, reference %d", a->arch, what, s, got[s], a->greedy[v][s]);
    flm_close(ctx);
}

/* Hybrid at the smallest budget (4 KiB steps) where it keeps at least one FFN layer in memory and streams another
 * (without read-ahead: with three layers, the room for one resident layer and two buffers holds all three). */
static flm_params hybrid_params(const char *path) {
    for (uint64_t mem = 256u << 10; mem < (8u << 20); mem += 4u << 10) {
        flm_params p = params(FLM_MODE_HYBRID, mem, true);
        p.no_read_ahead = true;
        flm_plan_info info;
        flm_error err;
        if (flm_plan(path, &p, &info, &err)) continue;
        if (info.n_resident_layers >= 1 && info.n_resident_layers < info.n_layers) {
            print_message("hybrid at %.2f MiB: %u of %u layers resident\n", (double)mem / 1048576.0,
                          info.n_resident_layers, info.n_layers);
            return p;
        }
    }
    fail_msg("%s: no budget gives hybrid a resident and a streamed layer", path);
    return params(FLM_MODE_HYBRID, 0, true);
}

/* Every mode against the reference, f32 KV cache: the models as saved (transformers), and perturbed (NumPy). */
static void test_exact(void **state) {
    (void)state;
    for (size_t c = 0; c < N_CASES; c++)
        for (int v = 0; v < 2; v++) {
            const arch_case *a = &cases[c];
            check_model(a, v, a->gguf[v], params(FLM_MODE_AUTO, 0, true), 1e-4, true, "GGUF (mapped, dense FFN)");
            check_model(a, v, a->flm[v], params(FLM_MODE_RAM, 0, true), 1e-4, true, ".flm ram");
            check_model(a, v, a->flm[v], params(FLM_MODE_NAIVE, 4u << 20, true), 1e-4, true, ".flm naive (read-ahead)");
            check_model(a, v, a->flm[v], hybrid_params(a->flm[v]), 1e-4, true, ".flm hybrid");
        }
}

/* The f16 KV cache (the default; keys, values, q and the softmax weights rounded to f16 as llama.cpp does) stays near
 * the reference. */
static void test_kv_f16(void **state) {
    (void)state;
    for (size_t c = 0; c < N_CASES; c++)
        check_model(&cases[c], 0, cases[c].flm[0], params(FLM_MODE_NAIVE, 4u << 20, false), 5e-3, false,
                    ".flm naive, f16 KV");
}

/* f16 and q8_0 matrices (the per-head q/k/v rows of Persimmon as row ranges of a quantized tensor): near the
 * reference, the same first greedy id. */
static void test_f16_q8_0(void **state) {
    (void)state;
    const uint32_t types[] = {FLM_TYPE_F16, FLM_TYPE_Q8_0};
    for (size_t c = 0; c < N_CASES; c++)
        for (int i = 0; i < 2; i++) {
            const arch_case *a = &cases[c];
            char path[4096], dir[4096], rel[256];
            snprintf(path, sizeof path, "%s", tu_tmp("hf-archs-t", ".gguf"));
            snprintf(rel, sizeof rel, "hf-tiny/%s", a->dir);
            snprintf(dir, sizeof dir, "%s", tu_data(rel));
            flm_error err;
            if (flm_convert_hf(dir, NULL, path, types[i], FLM_HF_NO_TOKENIZER, &err)) fail_msg("convert_hf: %s", err.msg);
            check_model(a, 0, path, params(FLM_MODE_AUTO, 0, true), 0.05, false, i ? "GGUF q8_0" : "GGUF f16");
            remove(path);
        }
}

/* The written GGUF: llama.cpp's architecture name and tensor names. */
static void test_gguf_names(void **state) {
    (void)state;
    for (size_t c = 0; c < N_CASES; c++) {
        const arch_case *a = &cases[c];
        flm_gguf_file *f = NULL;
        flm_error err;
        if (flm_gguf_open(a->gguf[0], &f, &err)) fail_msg("%s", err.msg);
        char *arch = NULL;
        assert_int_equal(flm_gguf_get_str(f, "general.architecture", true, &arch, &err), FLM_OK);
        assert_string_equal(arch, a->arch);
        free(arch);
        for (uint64_t i = 0; i < f->n_tensors; i++) {
            char base[128];
            const char *n = f->tensors[i].name;
            if (!strncmp(n, "blk.", 4)) n = strchr(n + 4, '.') + 1;
            snprintf(base, sizeof base, "%s", n);
            char *dot = strrchr(base, '.');
            assert_non_null(dot);
            assert_true(!strcmp(dot, ".weight") || !strcmp(dot, ".bias"));
            *dot = 0;
            bool known = false;
            for (int k = 0; k < 16 && a->names[k]; k++) known |= !strcmp(a->names[k], base);
            if (!known) fail_msg("%s: tensor '%s' is not one of llama.cpp's %s names", a->arch, f->tensors[i].name,
                                 a->arch);
        }
        for (int k = 0; k < 6 && a->must[k]; k++)
            if (!flm_gguf_find_tensor(f, a->must[k])) fail_msg("%s: tensor '%s' is missing", a->arch, a->must[k]);
        print_message("%s: %llu tensors, all named as llama.cpp names them\n", a->arch,
                      (unsigned long long)f->n_tensors);
        flm_gguf_close(f);
    }
}

/* The CLI: `flashlm convert HF_DIR OUT.flm`, then `run --prompt-ids ... --print-ids` prints transformers' ids. */
static void test_cli_prompt_ids(void **state) {
    (void)state;
    for (size_t c = 0; c < N_CASES; c++) {
        const arch_case *a = &cases[c];
        char out[4096], args[16384], ids[512] = "", want[512] = "", dir[4096], rel[256];
        snprintf(out, sizeof out, "%s", tu_tmp("hf-archs-cli", ".flm"));
        snprintf(rel, sizeof rel, "hf-tiny/%s", a->dir);
        snprintf(dir, sizeof dir, "%s", tu_data(rel));
        snprintf(args, sizeof args, "convert '%s' '%s' --type f32 --no-tokenizer 2>&1", dir, out);
        char *text = NULL;
        int rc = tu_run_cli(args, &text);
        if (rc) fail_msg("convert: exit %d: %s", rc, text);
        free(text);
        for (int i = 0; i < a->n_prompt; i++)
            snprintf(ids + strlen(ids), sizeof ids - strlen(ids), "%s%d", i ? "," : "", a->prompt[i]);
        for (int i = 0; i < 16; i++)
            snprintf(want + strlen(want), sizeof want - strlen(want), "%s%d", i ? "," : "", a->greedy[0][i]);
        snprintf(args, sizeof args, "run -m '%s' --prompt-ids %s --print-ids --temp 0 -n 16 --kv-f32 --mode naive "
                 "--mem 4M 2>/dev/null", out, ids);
        rc = tu_run_cli(args, &text);
        assert_int_equal(rc, 0);
        size_t n = strlen(text);
        while (n && (text[n - 1] == '\n' || text[n - 1] == ' ')) text[--n] = 0;
        print_message("%s cli: %s\n", a->arch, text);
        assert_string_equal(text, want);
        free(text);
        remove(out);
    }
}

/* A copy of hf-tiny/DIR/config.json in a fresh folder with `from` replaced by `to` (which must occur); returns the
 * folder (static). */
static const char *edited_config(const char *dir_name, const char *from, const char *to) {
    static char dir[4096];
    char rel[256], path[4200];
    snprintf(dir, sizeof dir, "%s", tu_tmp("hf-archs-cfg", ""));
    assert_int_equal(mkdir(dir, 0755), 0);
    snprintf(rel, sizeof rel, "hf-tiny/%s/config.json", dir_name);
    size_t len;
    uint8_t *c = tu_read_file(tu_data(rel), &len);
    char *s = calloc(1, len + 1), *t = calloc(1, len + strlen(to) + 1);
    memcpy(s, c, len);
    char *p = strstr(s, from);
    if (!p) fail_msg("'%s' not in %s", from, rel);
    size_t head = (size_t)(p - s);
    memcpy(t, s, head);
    strcpy(t + head, to);
    strcat(t, p + strlen(from));
    snprintf(path, sizeof path, "%s/config.json", dir);
    tu_write_file(path, t, strlen(t));
    free(s);
    free(t);
    free(c);
    return dir;
}

/* What flashlm does not run is refused at conversion, naming the reason. */
static void test_config_refused(void **state) {
    (void)state;
    static const struct { const char *dir, *from, *to, *needle; } R[] = {
        {"falcon-7b-style", "\"alibi\": false", "\"alibi\": true", "ALiBi"},
        {"falcon-7b-style", "\"new_decoder_architecture\": false", "\"new_decoder_architecture\": true",
         "new_decoder_architecture"},
        {"falcon-7b-style", "\"multi_query\": true", "\"multi_query\": false", "multi_query"},
        {"falcon-7b-style", "\"parallel_attn\": true", "\"parallel_attn\": false", "parallel_attn"},
        {"falcon-7b-style", "\"activation\": \"gelu\"", "\"activation\": \"relu\"", "activation 'relu'"},
        {"phi-2-style", "\"qk_layernorm\": false", "\"qk_layernorm\": true", "qk_layernorm"},
        {"phi-2-style", "\"partial_rotary_factor\": 0.4", "\"partial_rotary_factor\": 0.35", "even"},
        {"persimmon-8b-style", "\"hidden_act\": \"relu2\"", "\"hidden_act\": \"gelu\"", "hidden_act 'gelu'"},
        {"persimmon-8b-style", "\"rope_type\": \"default\"", "\"rope_type\": \"linear\"", "RoPE scaling"},
    };
    for (size_t i = 0; i < sizeof R / sizeof R[0]; i++) {
        const char *dir = edited_config(R[i].dir, R[i].from, R[i].to);
        char out[4096], cfg[4200];
        snprintf(out, sizeof out, "%s", tu_tmp("hf-archs-refused", ".gguf"));
        flm_error err;
        assert_int_equal(flm_convert_hf(dir, NULL, out, FLM_TYPE_F32, FLM_HF_NO_TOKENIZER, &err), FLM_ERR_UNSUPPORTED);
        print_message("%s, %s: %s\n", R[i].dir, R[i].to, err.msg);
        if (!strstr(err.msg, R[i].needle)) fail_msg("'%s' does not say '%s'", err.msg, R[i].needle);
        snprintf(cfg, sizeof cfg, "%s/config.json", dir);
        remove(cfg);
        rmdir(dir);
    }
}

/* Persimmon's squared ReLU (and OPT's ReLU) is zero exactly where up . x + b_up <= 0: calibrate gives it the ReLU
 * rule, and the
 * sparse mode with the true active sets (--no-predictor) equals the dense model, on the perturbed model (non-zero
 * FFN biases; NumPy's answers): logits within 1e-4, 16 greedy ids equal, with every neuron cached and with the
 * smallest caches (neurons streamed). */
static void sparse_case(const arch_case *a) {
    const char *tok = hf_byte_tokenizer();
    char dir[4096], g[4096], f[4096];
    snprintf(dir, sizeof dir, "%s", hf_perturbed_folder(a->dir));
    snprintf(g, sizeof g, "%s", tu_tmp("hf-relu2", ".gguf"));
    snprintf(f, sizeof f, "%s", tu_tmp("hf-relu2", ".flm"));
    flm_error err;
    if (flm_convert_hf(dir, tok, g, FLM_TYPE_F32, 0, &err)) fail_msg("convert_hf: %s", err.msg);
    if (flm_convert_ex(g, f, FLM_TYPE_F32, FLM_OUT_REPLACE, NULL, NULL, NULL, &err)) fail_msg("convert: %s", err.msg);
    hf_remove_folder(dir);
    hf_remove_tokenizer(tok);
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
    if (flm_calib_run(f, &o, false, &rep, &err)) fail_msg("calibrate: %s", err.msg);
    print_message("%s calibrated: %s rule; true active share %.3f, predicted %.3f, held-out recall %.3f\n",
                  a->arch, rep.relu ? "ReLU" : "contribution", rep.levels[0].oracle_frac, rep.levels[0].pred_frac,
                  rep.levels[0].recall);
    assert_true(rep.relu);
    flm_calib_report_free(&rep);
    free(text);
    flm_params p = params(FLM_MODE_SPARSE, 0, true);
    p.no_predictor = true;
    check_model(a, 1, f, p, 1e-4, true, "sparse, true sets, all cached");
    for (uint64_t mem = 256u << 10; mem < (16u << 20); mem += 4u << 10) { /* the smallest caches that open */
        p.mem_bytes = mem;
        flm_plan_info info;
        if (flm_plan(f, &p, &info, &err) == FLM_OK) break;
    }
    check_model(a, 1, f, p, 1e-4, true, "sparse, true sets, smallest caches");
    flm_ctx *ctx = NULL;
    if (flm_open(f, &p, &ctx, &err)) fail_msg("open: %s", err.msg);
    flm_stats st;
    const float *logits;
    if (flm_eval_batch(ctx, a->prompt, (uint32_t)a->n_prompt, 0, NULL, &logits, &err)) fail_msg("eval: %s", err.msg);
    flm_get_stats(ctx, &st);
    print_message("  smallest caches: %llu cache rows for 3 layers of 256 neurons, %llu neurons streamed\n",
                  (unsigned long long)st.cache_rows, (unsigned long long)st.n_streamed);
    assert_true(st.n_streamed > 0);
    flm_close(ctx);
    remove(g);
    remove(f);
}

static void test_sparse_relu2(void **state) {
    (void)state;
    assert_string_equal(cases[2].arch, "persimmon");
    sparse_case(&cases[2]);
}

/* The same for OPT-350M's layout: the FFN reads the residual stream itself (post-LN), ReLU with biases. */
static void test_sparse_post_ln(void **state) {
    (void)state;
    assert_string_equal(cases[3].dir, "opt-350m-style");
    sparse_case(&cases[3]);
}

/* A copy of the falcon GGUF with one more tensor, extra (the shape of blk.0.attn_norm.weight), at out. */
static void gguf_with_extra(const char *out, const char *extra) {
    flm_gguf_file *f = NULL;
    flm_error err;
    if (flm_gguf_open(cases[0].gguf[0], &f, &err)) fail_msg("%s", err.msg);
    flm_gguf_writer *w = NULL;
    assert_int_equal(flm_gguf_writer_create(out, FLM_OUT_REPLACE, &w, &err), FLM_OK);
    for (uint64_t i = 0; i < f->n_kv; i++) assert_int_equal(flm_gguf_writer_kv_copy(w, &f->kv[i]), FLM_OK);
    const flm_gguf_tensor *norm = flm_gguf_find_tensor(f, "blk.0.attn_norm.weight");
    assert_non_null(norm);
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const flm_gguf_tensor *t = &f->tensors[i];
        assert_int_equal(flm_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne), FLM_OK);
    }
    assert_int_equal(flm_gguf_writer_add_tensor(w, extra, norm->type, 1, norm->ne), FLM_OK);
    assert_int_equal(flm_gguf_writer_begin(w, &err), FLM_OK);
    for (uint64_t i = 0; i < f->n_tensors; i++)
        assert_int_equal(flm_gguf_writer_write_tensor(w, f->tensors[i].data, f->tensors[i].nbytes, &err), FLM_OK);
    assert_int_equal(flm_gguf_writer_write_tensor(w, norm->data, norm->nbytes, &err), FLM_OK);
    assert_int_equal(flm_gguf_writer_finish(w, &err), FLM_OK);
    flm_gguf_writer_free(w);
    flm_gguf_close(f);
}

/* Layouts flashlm does not run are refused, saying why, by flm_plan, flm_open and flm_convert alike (never run
 * wrongly with a tensor ignored): Falcon 40B's second attention norm; a mixture-of-experts FFN, which is not one FFN
 * per layer that can be streamed by neurons. */
static void test_layouts_refused(void **state) {
    (void)state;
    static const struct { const char *extra, *needle; } R[] = {
        {"blk.0.attn_norm_2.weight", "attn_norm_2"},
        {"blk.0.ffn_gate_inp.weight", "mixture-of-experts"},
    };
    for (size_t i = 0; i < sizeof R / sizeof R[0]; i++) {
        char out[4096], flm[4096];
        snprintf(out, sizeof out, "%s", tu_tmp("hf-refused", ".gguf"));
        snprintf(flm, sizeof flm, "%s", tu_tmp("hf-refused", ".flm"));
        gguf_with_extra(out, R[i].extra);
        const flm_params p = params(FLM_MODE_AUTO, 0, true);
        flm_ctx *ctx = NULL;
        flm_error err;
        flm_plan_info info;
        assert_int_equal(flm_plan(out, &p, &info, &err), FLM_ERR_UNSUPPORTED);
        char plan_msg[sizeof err.msg];
        snprintf(plan_msg, sizeof plan_msg, "%s", err.msg);
        assert_int_equal(flm_open(out, &p, &ctx, &err), FLM_ERR_UNSUPPORTED);
        print_message("%s: %s\n", R[i].extra, err.msg);
        assert_non_null(strstr(err.msg, R[i].needle));
        assert_string_equal(plan_msg, err.msg);
        assert_int_equal(flm_convert_ex(out, flm, FLM_TYPE_F32, FLM_OUT_REPLACE, NULL, NULL, NULL, &err), FLM_ERR_UNSUPPORTED);
        assert_non_null(strstr(err.msg, R[i].needle));
        remove(out);
    }
}

/* A model whose token embedding is projected (OPT-350M's proj_in / proj_out) needs both projections: one alone is a
 * malformed file, refused naming the tensors (a 1-D proj_in.weight added to the Falcon GGUF). */
static void test_projection_refused(void **state) {
    (void)state;
    char out[4096];
    snprintf(out, sizeof out, "%s", tu_tmp("hf-proj", ".gguf"));
    gguf_with_extra(out, "proj_in.weight");
    const flm_params p = params(FLM_MODE_AUTO, 0, true);
    flm_ctx *ctx = NULL;
    flm_error err;
    assert_int_equal(flm_open(out, &p, &ctx, &err), FLM_ERR_FORMAT);
    print_message("proj_in alone: %s\n", err.msg);
    assert_non_null(strstr(err.msg, "proj_out.weight"));
    remove(out);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_exact),          cmocka_unit_test(test_kv_f16),
        cmocka_unit_test(test_f16_q8_0),       cmocka_unit_test(test_gguf_names),
        cmocka_unit_test(test_cli_prompt_ids), cmocka_unit_test(test_config_refused),
        cmocka_unit_test(test_layouts_refused), cmocka_unit_test(test_sparse_relu2),
        cmocka_unit_test(test_sparse_post_ln),  cmocka_unit_test(test_projection_refused),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
