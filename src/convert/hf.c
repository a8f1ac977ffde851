/* hf.c — a Hugging Face model folder (config.json, safetensors, tokenizer.json or vocab.json + merges.txt) into a
 * GGUF file with llama.cpp's tensor names, which every other path (flm_open, flm_convert) then reads.
 *
 * OPT (transformers' models/opt/modeling_opt.py, OPTForCausalLM), pre-LN (do_layer_norm_before):
 *   model.decoder.embed_tokens.weight [V, d]            -> token_embd.weight (lm_head tied to it)
 *   model.decoder.embed_positions.weight [P + 2, d]     -> position_embd.weight [P, d]: OPTLearnedPositionalEmbedding
 *                                                          looks up row pos + 2, so the first 2 rows are dropped
 *   layers.N.self_attn_layer_norm.{weight,bias}         -> blk.N.attn_norm.{weight,bias}
 *   layers.N.self_attn.{q,k,v,out}_proj.{weight,bias}   -> blk.N.attn_{q,k,v,output}.{weight,bias}
 *       (OPT multiplies q_proj's output, bias included, by head_dim^-0.5 and then takes softmax(q k^T): the same as
 *        the engine's attention scale 1/sqrt(head_dim) on the unscaled q; nothing to fold)
 *   layers.N.final_layer_norm.{weight,bias}             -> blk.N.ffn_norm.{weight,bias}
 *   layers.N.fc1.{weight,bias} / fc2.{weight,bias}      -> blk.N.ffn_up.{weight,bias} / blk.N.ffn_down.{weight,bias}
 *   model.decoder.final_layer_norm.{weight,bias}        -> output_norm.{weight,bias}
 *   lm_head.weight (when not tied)                      -> output.weight
 * A PyTorch Linear weight [out, in] is row-major with `in` contiguous: GGUF ne = [in, out], the same bytes. */
#include <cJSON.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "compute/kernels.h"
#include "core/error.h"
#include "core/types.h"
#include "flashlm_tools.h"
#include "format/gguf.h"
#include "format/safetensors.h"

typedef unsigned long long ull;

static flm_status read_json(const char *path, bool required, cJSON **out, flm_error *err) {
    *out = NULL;
    FILE *fp = fopen(path, "rb");
    if (!fp) {
        if (!required && errno == ENOENT) return FLM_OK;
        return flm_fail(err, FLM_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    }
    const size_t max = 256u << 20;
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    flm_status st = FLM_OK;
    while (buf) {
        if (n == cap) {
            if (cap >= max) { st = flm_fail(err, FLM_ERR_FORMAT, "%s: larger than %zu bytes", path, max); break; }
            char *nb = realloc(buf, cap * 2);
            if (!nb) break;
            buf = nb;
            cap *= 2;
        }
        size_t got = fread(buf + n, 1, cap - n, fp);
        n += got;
        if (got == 0) break;
    }
    if (!buf) st = flm_fail(err, FLM_ERR_NOMEM, "%s: out of memory", path);
    else if (!st && ferror(fp)) st = flm_fail(err, FLM_ERR_IO, "%s: read failed", path);
    fclose(fp);
    if (!st) {
        *out = cJSON_ParseWithLength(buf, n);
        if (!*out) st = flm_fail(err, FLM_ERR_FORMAT, "%s: not valid JSON", path);
    }
    free(buf);
    return st;
}

/* config[key] as a positive integer below 2^24 (*v), required */
static flm_status cfg_u32(const cJSON *cfg, const char *path, const char *key, uint32_t *v, flm_error *err) {
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(cfg, key);
    if (!cJSON_IsNumber(j) || !(j->valuedouble >= 1 && j->valuedouble < 16777216.0) ||
        j->valuedouble != (double)(uint32_t)j->valuedouble)
        return flm_fail(err, FLM_ERR_FORMAT, "%s: '%s' is missing or not a positive integer", path, key);
    *v = (uint32_t)j->valuedouble;
    return FLM_OK;
}

/* ---- the tokenizer --------------------------------------------------------------------------------------------- */

typedef struct hf_vocab {
    uint32_t n;        /* n_vocab (the model's) */
    char **tokens;     /* [n]; placeholders "[UNUSED_i]" where the tokenizer has no token */
    int32_t *types;    /* [n]: 1 normal (placeholders too), 3 control (special added tokens), 4 user-defined */
    uint32_t n_merges;
    char **merges;     /* "a b" */
} hf_vocab;

static void vocab_free(hf_vocab *v) {
    for (uint32_t i = 0; v->tokens && i < v->n; i++) free(v->tokens[i]);
    for (uint32_t i = 0; v->merges && i < v->n_merges; i++) free(v->merges[i]);
    free(v->tokens);
    free(v->types);
    free(v->merges);
}

static flm_status vocab_set(hf_vocab *v, const char *path, const char *piece, double id, int32_t type,
                            flm_error *err) {
    if (!(id >= 0 && id < v->n) || id != (double)(uint32_t)id)
        return flm_fail(err, FLM_ERR_FORMAT, "%s: token '%.40s' has id %g, outside the model's %u tokens", path,
                        piece, id, v->n);
    uint32_t i = (uint32_t)id;
    char *c = strdup(piece);
    if (!c) return flm_fail(err, FLM_ERR_NOMEM, "out of memory");
    free(v->tokens[i]);
    v->tokens[i] = c;
    v->types[i] = type;
    return FLM_OK;
}

static flm_status add_merge(hf_vocab *v, const char *a, const char *b, flm_error *err) {
    size_t la = strlen(a), lb = strlen(b);
    char *m = malloc(la + lb + 2);
    if (!m) return flm_fail(err, FLM_ERR_NOMEM, "out of memory");
    memcpy(m, a, la);
    m[la] = ' ';
    memcpy(m + la + 1, b, lb + 1);
    v->merges[v->n_merges++] = m;
    return FLM_OK;
}

/* vocab (object piece -> id) and merges (array of "a b" or ["a", "b"]) into v */
static flm_status vocab_bpe(hf_vocab *v, const char *path, const cJSON *vocab, const cJSON *merges, flm_error *err) {
    flm_status st = FLM_OK;
    for (const cJSON *e = vocab ? vocab->child : NULL; e && !st; e = e->next) {
        if (!cJSON_IsNumber(e) || !e->string)
            return flm_fail(err, FLM_ERR_FORMAT, "%s: vocab entry '%.40s' is not a number", path,
                            e->string ? e->string : "");
        st = vocab_set(v, path, e->string, e->valuedouble, 1, err);
    }
    int nm = merges ? cJSON_GetArraySize(merges) : 0;
    if (st || nm <= 0) return st;
    if (!(v->merges = calloc((size_t)nm, sizeof *v->merges))) return flm_fail(err, FLM_ERR_NOMEM, "out of memory");
    int i = 0;
    for (const cJSON *e = merges->child; e && !st; e = e->next, i++) {
        if (cJSON_IsString(e) && e->valuestring) {
            const char *sp = strchr(e->valuestring, ' ');
            if (!sp || sp == e->valuestring || !sp[1] || strchr(sp + 1, ' '))
                return flm_fail(err, FLM_ERR_FORMAT, "%s: merge %d '%.40s' is not two pieces", path, i,
                                e->valuestring);
            char *c = strdup(e->valuestring);
            if (!c) return flm_fail(err, FLM_ERR_NOMEM, "out of memory");
            v->merges[v->n_merges++] = c;
        } else if (cJSON_IsArray(e) && cJSON_GetArraySize(e) == 2 && cJSON_IsString(e->child) &&
                   cJSON_IsString(e->child->next)) {
            st = add_merge(v, e->child->valuestring, e->child->next->valuestring, err);
        } else {
            return flm_fail(err, FLM_ERR_FORMAT, "%s: merge %d is neither \"a b\" nor [\"a\", \"b\"]", path, i);
        }
    }
    return st;
}

/* merges.txt: "#version" first line (optional), then one "a b" a line */
static flm_status merges_txt(hf_vocab *v, const char *path, flm_error *err) {
    FILE *fp = fopen(path, "rb");
    if (!fp) return flm_fail(err, FLM_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    cJSON *arr = cJSON_CreateArray();
    char line[4096];
    flm_status st = arr ? FLM_OK : flm_fail(err, FLM_ERR_NOMEM, "out of memory");
    while (!st && fgets(line, sizeof line, fp)) {
        size_t n = strlen(line);
        while (n && (line[n - 1] == '\n' || line[n - 1] == '\r')) line[--n] = 0;
        if (!n || !strncmp(line, "#version", 8)) continue;
        cJSON_AddItemToArray(arr, cJSON_CreateString(line));
    }
    fclose(fp);
    if (!st) st = vocab_bpe(v, path, NULL, arr, err);
    cJSON_Delete(arr);
    return st;
}

/* The tokenizer of folder dir (tokenizer.json, else vocab.json + merges.txt), for a model of n tokens; ids the
 * tokenizer leaves unset get placeholders. No tokenizer file at all: every token a placeholder. */
static flm_status load_vocab(const char *dir, uint32_t n, hf_vocab *v, bool *found, flm_error *err) {
    memset(v, 0, sizeof *v);
    *found = false;
    v->n = n;
    v->tokens = calloc(n, sizeof *v->tokens);
    v->types = calloc(n, sizeof *v->types);
    if (!v->tokens || !v->types) return flm_fail(err, FLM_ERR_NOMEM, "out of memory");
    char path[PATH_MAX];
    cJSON *tj = NULL;
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    flm_status st = read_json(path, false, &tj, err);
    if (st) return st;
    if (tj) {
        *found = true;
        const cJSON *model = cJSON_GetObjectItemCaseSensitive(tj, "model");
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(model, "type");
        if (!cJSON_IsString(type) || strcmp(type->valuestring, "BPE") != 0)
            st = flm_fail(err, FLM_ERR_UNSUPPORTED, "%s: model.type is not \"BPE\" (only byte-level BPE is read)",
                          path);
        if (!st)
            st = vocab_bpe(v, path, cJSON_GetObjectItemCaseSensitive(model, "vocab"),
                           cJSON_GetObjectItemCaseSensitive(model, "merges"), err);
        const cJSON *added = cJSON_GetObjectItemCaseSensitive(tj, "added_tokens");
        for (const cJSON *e = added ? added->child : NULL; e && !st; e = e->next) {
            const cJSON *id = cJSON_GetObjectItemCaseSensitive(e, "id");
            const cJSON *content = cJSON_GetObjectItemCaseSensitive(e, "content");
            const cJSON *special = cJSON_GetObjectItemCaseSensitive(e, "special");
            if (!cJSON_IsNumber(id) || !cJSON_IsString(content))
                st = flm_fail(err, FLM_ERR_FORMAT, "%s: an added_tokens entry without id or content", path);
            else st = vocab_set(v, path, content->valuestring, id->valuedouble, cJSON_IsTrue(special) ? 3 : 4, err);
        }
        cJSON_Delete(tj);
    } else {
        snprintf(path, sizeof path, "%s/vocab.json", dir);
        if ((st = read_json(path, false, &tj, err))) return st;
        if (tj) {
            *found = true;
            st = vocab_bpe(v, path, tj, NULL, err);
            cJSON_Delete(tj);
            snprintf(path, sizeof path, "%s/merges.txt", dir);
            if (!st) st = merges_txt(v, path, err);
        }
    }
    for (uint32_t i = 0; !st && i < n; i++)
        if (!v->tokens[i]) {
            char ph[32];
            snprintf(ph, sizeof ph, "[UNUSED_%u]", i);
            if (!(v->tokens[i] = strdup(ph))) st = flm_fail(err, FLM_ERR_NOMEM, "out of memory");
            v->types[i] = 1; /* normal: a model whose tokenizer lacks tokens still prints (flm_open refuses a
                                vocabulary where nothing decodes to text) */
        }
    return st;
}

/* ---- tensors --------------------------------------------------------------------------------------------------- */

typedef struct hf_map {
    char gguf[96];
    const flm_st_tensor *t;
    uint64_t ne[2];   /* GGUF ne: ne[0] contiguous */
    uint32_t n_dims;
    uint64_t skip_rows; /* rows of the source dropped first (OPT's position offset) */
    uint32_t type;    /* output type */
} hf_map;

static float src_elem(const flm_st_tensor *t, uint64_t i) {
    const uint8_t *p = t->data;
    if (t->type == FLM_TYPE_F32) {
        float f;
        memcpy(&f, p + i * 4, 4);
        return f;
    }
    uint16_t h = (uint16_t)(p[i * 2] | p[i * 2 + 1] << 8);
    return t->type == FLM_TYPE_F16 ? flm_f16_to_f32(h) : flm_bf16_to_f32(h);
}

/* A tensor of the folder checked against its expected shape (PyTorch order: rows, cols; a vector: rows only). */
static flm_status want(const flm_st_set *s, const char *dir, const char *name, uint64_t rows, uint64_t cols,
                       const flm_st_tensor **out, flm_error *err) {
    const flm_st_tensor *t = flm_st_set_find(s, name);
    if (!t) return flm_fail(err, FLM_ERR_FORMAT, "%s: tensor '%s' is missing", dir, name);
    bool ok = cols ? t->n_dims == 2 && t->shape[0] == rows && t->shape[1] == cols
                   : t->n_dims == 1 && t->shape[0] == rows;
    if (!ok) {
        char got[96] = "";
        for (uint32_t i = 0; i < t->n_dims && i < 4; i++)
            snprintf(got + strlen(got), sizeof got - strlen(got), "%s%llu", i ? ", " : "", (ull)t->shape[i]);
        if (cols)
            return flm_fail(err, FLM_ERR_FORMAT, "%s: tensor '%s' has shape [%s], expected [%llu, %llu]", dir, name,
                            got, (ull)rows, (ull)cols);
        return flm_fail(err, FLM_ERR_FORMAT, "%s: tensor '%s' has shape [%s], expected [%llu]", dir, name, got,
                        (ull)rows);
    }
    *out = t;
    return FLM_OK;
}

flm_status flm_convert_hf(const char *dir, const char *tok_dir, const char *dst, uint32_t type, flm_error *err) {
    flm_error_clear(err);
    if (type != FLM_TYPE_F32 && type != FLM_TYPE_F16 && type != FLM_TYPE_Q8_0)
        return flm_fail(err, FLM_ERR_ARG, "convert: --type %s is not supported from a Hugging Face folder (f32, f16, "
                        "q8_0)", flm_type_name(type));
    char path[PATH_MAX];
    if ((size_t)snprintf(path, sizeof path, "%s/config.json", dir) >= sizeof path)
        return flm_fail(err, FLM_ERR_ARG, "%s: path too long", dir);
    cJSON *cfg = NULL;
    flm_status st = read_json(path, true, &cfg, err);
    if (st) return st;
    flm_st_set *set = NULL;
    hf_vocab voc = {0};
    hf_map *maps = NULL;
    flm_gguf_writer *w = NULL;
    float *row = NULL;
    void *orow = NULL;
    uint32_t d = 0, F = 0, L = 0, H = 0, P = 0, V = 0;
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(cfg, "model_type");
    if (!cJSON_IsString(mt) || strcmp(mt->valuestring, "opt") != 0) {
        st = flm_fail(err, FLM_ERR_UNSUPPORTED, "%s: model_type '%s' is not supported from a Hugging Face folder "
                      "(only opt; convert others with llama.cpp's convert_hf_to_gguf.py)", path,
                      cJSON_IsString(mt) ? mt->valuestring : "(missing)");
        goto done;
    }
    if ((st = cfg_u32(cfg, path, "hidden_size", &d, err)) || (st = cfg_u32(cfg, path, "ffn_dim", &F, err)) ||
        (st = cfg_u32(cfg, path, "num_hidden_layers", &L, err)) ||
        (st = cfg_u32(cfg, path, "num_attention_heads", &H, err)) ||
        (st = cfg_u32(cfg, path, "max_position_embeddings", &P, err)) ||
        (st = cfg_u32(cfg, path, "vocab_size", &V, err)))
        goto done;
    if (d % H) {
        st = flm_fail(err, FLM_ERR_FORMAT, "%s: hidden_size %u is not a multiple of num_attention_heads %u", path, d,
                      H);
        goto done;
    }
    const cJSON *ln = cJSON_GetObjectItemCaseSensitive(cfg, "do_layer_norm_before");
    if (cJSON_IsFalse(ln)) {
        st = flm_fail(err, FLM_ERR_UNSUPPORTED, "%s: do_layer_norm_before is false (post-LN, as OPT-350M): not "
                      "supported yet; flashlm runs pre-LN OPT", path);
        goto done;
    }
    const cJSON *rf = cJSON_GetObjectItemCaseSensitive(cfg, "_remove_final_layer_norm");
    if (cJSON_IsTrue(rf)) {
        st = flm_fail(err, FLM_ERR_UNSUPPORTED, "%s: _remove_final_layer_norm is true: not supported", path);
        goto done;
    }
    uint32_t wp = d;
    if (cJSON_GetObjectItemCaseSensitive(cfg, "word_embed_proj_dim") &&
        (st = cfg_u32(cfg, path, "word_embed_proj_dim", &wp, err)))
        goto done;
    if (wp != d) {
        st = flm_fail(err, FLM_ERR_UNSUPPORTED, "%s: word_embed_proj_dim %u differs from hidden_size %u: OPT's "
                      "project_in/project_out are not supported yet", path, wp, d);
        goto done;
    }
    const cJSON *act = cJSON_GetObjectItemCaseSensitive(cfg, "activation_function");
    if (act && (!cJSON_IsString(act) || strcmp(act->valuestring, "relu") != 0)) {
        st = flm_fail(err, FLM_ERR_UNSUPPORTED, "%s: activation_function '%s' is not supported (relu)", path,
                      cJSON_IsString(act) ? act->valuestring : "?");
        goto done;
    }
    const cJSON *ea = cJSON_GetObjectItemCaseSensitive(cfg, "layer_norm_elementwise_affine");
    const cJSON *eb = cJSON_GetObjectItemCaseSensitive(cfg, "enable_bias");
    if (cJSON_IsFalse(ea) || cJSON_IsFalse(eb)) {
        st = flm_fail(err, FLM_ERR_UNSUPPORTED, "%s: layer_norm_elementwise_affine or enable_bias is false: not "
                      "supported (OPT's defaults are true)", path);
        goto done;
    }
    const cJSON *tie = cJSON_GetObjectItemCaseSensitive(cfg, "tie_word_embeddings");
    const bool tied = !cJSON_IsFalse(tie);
    uint32_t bos = 2, eos = 2;
    const cJSON *jb = cJSON_GetObjectItemCaseSensitive(cfg, "bos_token_id");
    const cJSON *je = cJSON_GetObjectItemCaseSensitive(cfg, "eos_token_id");
    if (cJSON_IsNumber(jb) && jb->valuedouble >= 0 && jb->valuedouble < V) bos = (uint32_t)jb->valuedouble;
    if (cJSON_IsNumber(je) && je->valuedouble >= 0 && je->valuedouble < V) eos = (uint32_t)je->valuedouble;

    if ((st = flm_st_open_dir(dir, &set, err))) goto done;
    bool have_tok = false;
    if ((st = load_vocab(tok_dir ? tok_dir : dir, V, &voc, &have_tok, err))) goto done;

    /* the tensor map */
    const size_t n_max = 6 + (size_t)L * 16;
    maps = calloc(n_max, sizeof *maps);
    if (!maps) { st = flm_fail(err, FLM_ERR_NOMEM, "out of memory"); goto done; }
    size_t nm = 0;
    const uint32_t wt = type; /* matrices */
#define MAP(hf, gg, rows, cols, ty)                                                                               \
    do {                                                                                                         \
        hf_map *m_ = &maps[nm];                                                                                  \
        if ((st = want(set, dir, hf, rows, cols, &m_->t, err))) goto done;                                       \
        snprintf(m_->gguf, sizeof m_->gguf, "%s", gg);                                                           \
        m_->n_dims = (cols) ? 2 : 1;                                                                             \
        m_->ne[0] = (cols) ? (cols) : (rows);                                                                    \
        m_->ne[1] = (cols) ? (rows) : 1;                                                                         \
        m_->type = (cols) ? (ty) : FLM_TYPE_F32;                                                                 \
        nm++;                                                                                                    \
    } while (0)
    MAP("model.decoder.embed_tokens.weight", "token_embd.weight", V, d, wt);
    MAP("model.decoder.embed_positions.weight", "position_embd.weight", (uint64_t)P + 2, d, FLM_TYPE_F32);
    maps[nm - 1].skip_rows = 2;
    maps[nm - 1].ne[1] = P;
    MAP("model.decoder.final_layer_norm.weight", "output_norm.weight", d, 0, 0);
    MAP("model.decoder.final_layer_norm.bias", "output_norm.bias", d, 0, 0);
    if (!tied && flm_st_set_find(set, "lm_head.weight")) MAP("lm_head.weight", "output.weight", V, d, wt);
    for (uint32_t l = 0; l < L; l++) {
        char hf[128], gg[96];
        static const struct { const char *hf, *gg; int kind; } T[] = {
            {"self_attn_layer_norm.weight", "attn_norm.weight", 0}, {"self_attn_layer_norm.bias", "attn_norm.bias", 0},
            {"self_attn.q_proj.weight", "attn_q.weight", 1},        {"self_attn.q_proj.bias", "attn_q.bias", 0},
            {"self_attn.k_proj.weight", "attn_k.weight", 1},        {"self_attn.k_proj.bias", "attn_k.bias", 0},
            {"self_attn.v_proj.weight", "attn_v.weight", 1},        {"self_attn.v_proj.bias", "attn_v.bias", 0},
            {"self_attn.out_proj.weight", "attn_output.weight", 1}, {"self_attn.out_proj.bias", "attn_output.bias", 0},
            {"final_layer_norm.weight", "ffn_norm.weight", 0},      {"final_layer_norm.bias", "ffn_norm.bias", 0},
            {"fc1.weight", "ffn_up.weight", 2},                     {"fc1.bias", "ffn_up.bias", 3},
            {"fc2.weight", "ffn_down.weight", 4},                   {"fc2.bias", "ffn_down.bias", 0},
        };
        for (size_t i = 0; i < sizeof T / sizeof T[0]; i++) {
            snprintf(hf, sizeof hf, "model.decoder.layers.%u.%s", l, T[i].hf);
            snprintf(gg, sizeof gg, "blk.%u.%s", l, T[i].gg);
            switch (T[i].kind) {
            case 0: MAP(hf, gg, d, 0, 0); break;
            case 1: MAP(hf, gg, d, d, wt); break;
            case 2: MAP(hf, gg, F, d, wt); break;
            case 3: MAP(hf, gg, F, 0, 0); break;
            default: MAP(hf, gg, d, F, wt); break;
            }
        }
    }
#undef MAP
    for (size_t i = 0; i < nm; i++)
        if (maps[i].type == FLM_TYPE_Q8_0 && maps[i].ne[0] % 32) {
            st = flm_fail(err, FLM_ERR_ARG, "%s: --type q8_0 needs rows of a multiple of 32 elements; '%s' has %llu",
                          dir, maps[i].t->name, (ull)maps[i].ne[0]);
            goto done;
        }

    /* the GGUF */
    if ((st = flm_gguf_writer_create(dst, &w, err))) goto done;
    flm_gguf_writer_kv_str(w, "general.architecture", "opt");
    flm_gguf_writer_kv_str(w, "general.name", "opt (from a Hugging Face folder)");
    flm_gguf_writer_kv_u32(w, "opt.embedding_length", d);
    flm_gguf_writer_kv_u32(w, "opt.feed_forward_length", F);
    flm_gguf_writer_kv_u32(w, "opt.block_count", L);
    flm_gguf_writer_kv_u32(w, "opt.attention.head_count", H);
    flm_gguf_writer_kv_u32(w, "opt.context_length", P);
    flm_gguf_writer_kv_f32(w, "opt.attention.layer_norm_epsilon", 1e-5f); /* nn.LayerNorm's default: OPT's */
    flm_gguf_writer_kv_str(w, "tokenizer.ggml.model", "gpt2");
    flm_gguf_writer_kv_str(w, "tokenizer.ggml.pre", "gpt-2");
    flm_gguf_writer_kv_arr(w, "tokenizer.ggml.tokens", GGUF_VT_STRING, voc.tokens, V);
    flm_gguf_writer_kv_arr(w, "tokenizer.ggml.token_type", GGUF_VT_INT32, voc.types, V);
    flm_gguf_writer_kv_arr(w, "tokenizer.ggml.merges", GGUF_VT_STRING, voc.merges ? (const void *)voc.merges
                                                                                  : (const void *)"", voc.n_merges);
    flm_gguf_writer_kv_u32(w, "tokenizer.ggml.bos_token_id", bos);
    flm_gguf_writer_kv_u32(w, "tokenizer.ggml.eos_token_id", eos);
    flm_gguf_writer_kv_bool(w, "tokenizer.ggml.add_bos_token", true); /* OPT's tokenizer prepends </s> (BOS) */
    for (size_t i = 0; i < nm; i++)
        if ((st = flm_gguf_writer_add_tensor(w, maps[i].gguf, maps[i].type, maps[i].n_dims, maps[i].ne))) {
            st = flm_fail(err, st, "%s: cannot add tensor '%s'", dst, maps[i].gguf);
            goto done;
        }
    if ((st = flm_gguf_writer_begin(w, err))) goto done;
    /* the writer takes a tensor in one piece: the largest one's output bytes */
    size_t big = 0;
    for (size_t i = 0; i < nm; i++) {
        size_t b = flm_row_bytes(maps[i].type, maps[i].ne[0]) * (size_t)maps[i].ne[1];
        if (b > big) big = b;
    }
    row = malloc((size_t)(d > F ? d : F) * sizeof *row);
    orow = malloc(big ? big : 1);
    if (!row || !orow) { st = flm_fail(err, FLM_ERR_NOMEM, "%s: out of memory (%zu bytes)", dst, big); goto done; }
    for (size_t i = 0; i < nm && !st; i++) {
        const hf_map *m = &maps[i];
        const uint64_t n_in = m->ne[0], rows = m->ne[1];
        const size_t rb = flm_row_bytes(m->type, n_in);
        for (uint64_t r = 0; r < rows && !st; r++) {
            const uint64_t base = (r + m->skip_rows) * n_in;
            uint8_t *o = (uint8_t *)orow + r * rb;
            for (uint64_t j = 0; j < n_in; j++) row[j] = src_elem(m->t, base + j);
            if (m->type == FLM_TYPE_F32) memcpy(o, row, n_in * 4);
            else if (m->type == FLM_TYPE_F16)
                for (uint64_t j = 0; j < n_in; j++) {
                    uint16_t h = flm_f32_to_f16(row[j]);
                    memcpy(o + j * 2, &h, 2);
                }
            else if (!flm_quantize_row(m->type, row, o, n_in))
                st = flm_fail(err, FLM_ERR_ARG, "%s: cannot quantize '%s'", dir, m->t->name);
        }
        if (!st) st = flm_gguf_writer_write_tensor(w, orow, rb * rows, err);
    }
    if (!st) st = flm_gguf_writer_finish(w, err);
done:
    if (w) flm_gguf_writer_free(w);
    free(row);
    free(orow);
    free(maps);
    vocab_free(&voc);
    flm_st_set_close(set);
    cJSON_Delete(cfg);
    return st;
}
