/* hf.c — a Hugging Face model folder (config.json, safetensors, tokenizer.json or vocab.json + merges.txt, and
 * tokenizer_config.json's chat_template and eos_token when present) into a GGUF file with llama.cpp's tensor names,
 * which every other path (flm_open, flm_convert) then reads. Every JSON file is checked as text first (no NUL byte or
 * "\u0000" escape, nothing after the value; config.json: no key twice) and every field by type: a wrong one is
 * refused naming the file and the field, never replaced by a default.
 *
 * One table per architecture (config.json's model_type), each mapping transformers' names onto llama.cpp's
 * (src/llama-arch.cpp; gguf-py's constants): opt (pre- and post-LN, project_in/out; llama.cpp has no OPT converter,
 * flashlm names it as llama.cpp does GPT-2), falcon (7B layout), phi (phi2) and persimmon; the mapping of each is
 * written above its table below.
 * The fused q/k/v tensors of Falcon and Persimmon are copied as they are: their row orders are already llama.cpp's
 * (model/arch.h, flm_qkv_layout), so a GGUF written here and one from llama.cpp's converter load the same way.
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
#include "core/files.h"
#include "core/types.h"
#include "flashlm_tools.h"
#include "format/gguf.h"
#include "write/gguf_write.h"
#include "convert/safetensors.h"

typedef unsigned long long ull;

/* The most bytes in one token piece or merge: the GGUF tokenizer reader's limit (format/tokenizer_gguf.c
 * MAX_PIECE), so that a piece it would refuse is refused here, at conversion, naming tokenizer.json. */
#define HF_MAX_PIECE 65536
/* The most layers: the model loader's bound on block_count (model/model.c, hyper-parameters out of range). */
#define HF_MAX_LAYERS 4096

/* path's JSON (at most 256 MiB; flm_json_parse's checks, duplicate keys too when no_dup) into *out; a missing file
 * that is not required: FLM_OK with *out NULL. */
static flm_status read_json(const char *path, bool required, bool no_dup, cJSON **out, flm_error *err) {
    *out = NULL;
    FILE *fp = NULL;
    bool missing = false;
    flm_status os = flm_fopen_regular(path, &fp, &missing, err);
    if (os) return !required && missing ? FLM_OK : os;
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
    if (!st) st = flm_json_parse(path, "the file", buf, n, no_dup, out, err);
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

/* config[key] as a boolean (*v): absent or null gives dflt; any other type is refused naming the key */
static flm_status cfg_bool(const cJSON *cfg, const char *path, const char *key, bool dflt, bool *v, flm_error *err) {
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(cfg, key);
    if (!j || cJSON_IsNull(j)) { *v = dflt; return FLM_OK; }
    if (!cJSON_IsBool(j)) return flm_fail(err, FLM_ERR_FORMAT, "%s: '%s' is not true or false", path, key);
    *v = cJSON_IsTrue(j);
    return FLM_OK;
}

/* config[key] as a token id below n_vocab (*v): absent or null leaves *v; a list (eos_token_id: [0, 2]) gives its
 * first id, every element checked; anything else (a string, a fraction, a negative or too large number) is refused
 * naming the key */
static flm_status cfg_token_id(const cJSON *cfg, const char *path, const char *key, uint32_t n_vocab, uint32_t *v,
                               flm_error *err) {
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(cfg, key);
    if (!j || cJSON_IsNull(j)) return FLM_OK;
    const bool list = cJSON_IsArray(j);
    if (list && !j->child) return flm_fail(err, FLM_ERR_FORMAT, "%s: '%s' is an empty list", path, key);
    int i = 0;
    for (const cJSON *e = list ? j->child : j; e; e = list ? e->next : NULL, i++) {
        if (!cJSON_IsNumber(e) || !(e->valuedouble >= 0 && e->valuedouble < n_vocab) ||
            e->valuedouble != (double)(uint32_t)e->valuedouble) {
            char at[32] = "";
            if (list) snprintf(at, sizeof at, "[%d]", i);
            return flm_fail(err, FLM_ERR_FORMAT, "%s: '%s'%s is not a token id (an integer from 0 to %u, vocab_size "
                            "%u)", path, key, at, n_vocab - 1, n_vocab);
        }
    }
    *v = (uint32_t)(list ? j->child : j)->valuedouble;
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

/* Token id (checked: an integer below n) is piece (at most HF_MAX_PIECE bytes) of the given type; unique: refuse
 * an id a piece was already given (model.vocab naming two pieces one id). */
static flm_status vocab_set(hf_vocab *v, const char *path, const char *piece, double id, int32_t type, bool unique,
                            flm_error *err) {
    if (!(id >= 0 && id < v->n) || id != (double)(uint32_t)id)
        return flm_fail(err, FLM_ERR_FORMAT, "%s: token '%.40s' has id %g, outside the model's %u tokens", path,
                        piece, id, v->n);
    uint32_t i = (uint32_t)id;
    size_t len = strlen(piece);
    if (len > HF_MAX_PIECE)
        return flm_fail(err, FLM_ERR_FORMAT, "%s: token %u ('%.40s...') is %zu bytes long (at most %d)", path, i,
                        piece, len, HF_MAX_PIECE);
    if (unique && v->tokens[i])
        return flm_fail(err, FLM_ERR_FORMAT, "%s: vocab gives id %u to two pieces, '%.40s' and '%.40s'", path, i,
                        v->tokens[i], piece);
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
        st = vocab_set(v, path, e->string, e->valuedouble, 1, true, err);
    }
    int nm = merges ? cJSON_GetArraySize(merges) : 0;
    if (st || nm <= 0) return st;
    if (!(v->merges = calloc((size_t)nm, sizeof *v->merges))) return flm_fail(err, FLM_ERR_NOMEM, "out of memory");
    int i = 0;
    for (const cJSON *e = merges->child; e && !st; e = e->next, i++) {
        size_t ml = cJSON_IsString(e) && e->valuestring ? strlen(e->valuestring)
                    : cJSON_IsArray(e) && cJSON_IsString(e->child) && cJSON_IsString(e->child->next)
                        ? strlen(e->child->valuestring) + 1 + strlen(e->child->next->valuestring) : 0;
        if (ml > HF_MAX_PIECE)
            return flm_fail(err, FLM_ERR_FORMAT, "%s: merge %d is %zu bytes long (at most %d)", path, i, ml,
                            HF_MAX_PIECE);
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
    FILE *fp = NULL;
    flm_status os = flm_fopen_regular(path, &fp, NULL, err);
    if (os) return os;
    cJSON *arr = cJSON_CreateArray();
    char *line = NULL;
    size_t lcap = 0, total = 0;
    const size_t max = 256u << 20; /* as read_json */
    ssize_t got;
    flm_status st = arr ? FLM_OK : flm_fail(err, FLM_ERR_NOMEM, "out of memory");
    while (!st && (got = getline(&line, &lcap, fp)) >= 0) { /* no line-length limit: a long merge is not split */
        size_t n = (size_t)got;
        if ((total += n) > max) { st = flm_fail(err, FLM_ERR_FORMAT, "%s: larger than %zu bytes", path, max); break; }
        if (memchr(line, 0, n)) { st = flm_fail(err, FLM_ERR_FORMAT, "%s: a line holds a NUL byte", path); break; }
        while (n && (line[n - 1] == '\n' || line[n - 1] == '\r')) line[--n] = 0;
        if (!n || !strncmp(line, "#version", 8)) continue;
        cJSON *s = cJSON_CreateString(line);
        if (!s) { st = flm_fail(err, FLM_ERR_NOMEM, "out of memory"); break; }
        cJSON_AddItemToArray(arr, s);
    }
    if (!st && ferror(fp)) st = flm_fail(err, FLM_ERR_IO, "%s: read failed: %s", path, strerror(errno));
    free(line);
    fclose(fp);
    if (!st) st = vocab_bpe(v, path, NULL, arr, err);
    cJSON_Delete(arr);
    return st;
}

/* The tokenizer of folder dir (tokenizer.json, else vocab.json + merges.txt), for a model of n tokens; ids the
 * tokenizer leaves unset get placeholders. dir NULL (FLM_HF_NO_TOKENIZER): every token a placeholder. No tokenizer
 * file in dir: FLM_ERR_FORMAT naming the folder. */
static flm_status load_vocab(const char *dir, uint32_t n, hf_vocab *v, bool *found, flm_error *err) {
    memset(v, 0, sizeof *v);
    *found = false;
    v->n = n;
    v->tokens = calloc(n, sizeof *v->tokens);
    v->types = calloc(n, sizeof *v->types);
    if (!v->tokens || !v->types) return flm_fail(err, FLM_ERR_NOMEM, "out of memory");
    char path[PATH_MAX];
    cJSON *tj = NULL;
    flm_status st = FLM_OK;
    if (dir) {
        snprintf(path, sizeof path, "%s/tokenizer.json", dir);
        if ((st = read_json(path, false, false, &tj, err))) return st;
    }
    if (!dir) {
        /* no tokenizer asked for: placeholders only */
    } else if (tj) {
        *found = true;
        const cJSON *model = cJSON_GetObjectItemCaseSensitive(tj, "model");
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(model, "type");
        if (!cJSON_IsString(type) || strcmp(type->valuestring, "BPE") != 0)
            st = flm_fail(err, FLM_ERR_UNSUPPORTED, "%s: model.type is not \"BPE\" (only byte-level BPE is read)",
                          path);
        /* a SentencePiece-style BPE (Llama's, Persimmon's) has byte-fallback tokens and a Metaspace pre-tokenizer:
           read as byte-level BPE it would tokenize wrongly without a word of warning */
        const cJSON *pt = cJSON_GetObjectItemCaseSensitive(tj, "pre_tokenizer");
        const cJSON *ptt = cJSON_GetObjectItemCaseSensitive(pt, "type");
        if (!st && (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(model, "byte_fallback")) ||
                    (cJSON_IsString(ptt) && !strcmp(ptt->valuestring, "Metaspace"))))
            st = flm_fail(err, FLM_ERR_UNSUPPORTED, "%s: a SentencePiece-style BPE (byte_fallback or a Metaspace "
                          "pre-tokenizer) is not read (only byte-level BPE); convert without it (--no-tokenizer) and "
                          "run with --prompt-ids", path);
        const cJSON *voc = cJSON_GetObjectItemCaseSensitive(model, "vocab");
        const cJSON *mer = cJSON_GetObjectItemCaseSensitive(model, "merges");
        const cJSON *added = cJSON_GetObjectItemCaseSensitive(tj, "added_tokens");
        if (!st && !cJSON_IsObject(voc))
            st = flm_fail(err, FLM_ERR_FORMAT, "%s: model.vocab is missing or not an object (piece: id)", path);
        if (!st && mer && !cJSON_IsNull(mer) && !cJSON_IsArray(mer))
            st = flm_fail(err, FLM_ERR_FORMAT, "%s: model.merges is not an array", path);
        if (!st && added && !cJSON_IsNull(added) && !cJSON_IsArray(added))
            st = flm_fail(err, FLM_ERR_FORMAT, "%s: added_tokens is not an array", path);
        if (!st) st = vocab_bpe(v, path, voc, cJSON_IsArray(mer) ? mer : NULL, err);
        if (!cJSON_IsArray(added)) added = NULL;
        for (const cJSON *e = added ? added->child : NULL; e && !st; e = e->next) {
            const cJSON *id = cJSON_GetObjectItemCaseSensitive(e, "id");
            const cJSON *content = cJSON_GetObjectItemCaseSensitive(e, "content");
            const cJSON *special = cJSON_GetObjectItemCaseSensitive(e, "special");
            if (!cJSON_IsNumber(id) || !cJSON_IsString(content))
                st = flm_fail(err, FLM_ERR_FORMAT, "%s: an added_tokens entry without id or content", path);
            else st = vocab_set(v, path, content->valuestring, id->valuedouble, cJSON_IsTrue(special) ? 3 : 4, false,
                                err);
        }
        cJSON_Delete(tj);
    } else {
        snprintf(path, sizeof path, "%s/vocab.json", dir);
        if ((st = read_json(path, false, false, &tj, err))) return st;
        if (tj && !cJSON_IsObject(tj)) {
            cJSON_Delete(tj);
            return flm_fail(err, FLM_ERR_FORMAT, "%s: not a JSON object (piece: id)", path);
        }
        if (tj) {
            *found = true;
            st = vocab_bpe(v, path, tj, NULL, err);
            cJSON_Delete(tj);
            snprintf(path, sizeof path, "%s/merges.txt", dir);
            if (!st) st = merges_txt(v, path, err);
        } else {
            return flm_fail(err, FLM_ERR_FORMAT, "%s: no tokenizer.json (nor vocab.json + merges.txt): give the "
                            "folder that has it (--tokenizer DIR), or convert without a tokenizer (--no-tokenizer: "
                            "every token a placeholder, run with --prompt-ids)", dir);
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

/* tokenizer_config.json of dir (optional): its chat_template (a string, or a list of {"name", "template"}: the one
 * named "default", else the first) into *tmpl (strdup'd, NULL when none), and the id of its eos_token (a string, or
 * an object with "content") when that names a token of v into *eos (unchanged otherwise). A field of the wrong type
 * is refused naming the file and the field. */
static flm_status tokenizer_config(const char *dir, const hf_vocab *v, char **tmpl, uint32_t *eos, bool *eos_found,
                                   flm_error *err) {
    *tmpl = NULL;
    *eos_found = false;
    char path[PATH_MAX];
    if ((size_t)snprintf(path, sizeof path, "%s/tokenizer_config.json", dir) >= sizeof path) return FLM_OK;
    cJSON *tc = NULL;
    flm_status st = read_json(path, false, false, &tc, err);
    if (st || !tc) return st;
    if (!cJSON_IsObject(tc)) { cJSON_Delete(tc); return flm_fail(err, FLM_ERR_FORMAT, "%s: not a JSON object", path); }
    const cJSON *ct = cJSON_GetObjectItemCaseSensitive(tc, "chat_template");
    const char *t = NULL;
    if (cJSON_IsString(ct)) {
        t = ct->valuestring;
    } else if (cJSON_IsArray(ct)) {
        int i = 0;
        for (const cJSON *e = ct->child; e && !st; e = e->next, i++) {
            const cJSON *nm = cJSON_GetObjectItemCaseSensitive(e, "name");
            const cJSON *te = cJSON_GetObjectItemCaseSensitive(e, "template");
            if (!cJSON_IsObject(e) || !cJSON_IsString(te) || (nm && !cJSON_IsString(nm)))
                st = flm_fail(err, FLM_ERR_FORMAT, "%s: chat_template[%d] is not a {\"name\", \"template\"} object "
                              "of strings", path, i);
            else if (!t || (cJSON_IsString(nm) && !strcmp(nm->valuestring, "default"))) t = te->valuestring;
        }
        if (!st && !t) st = flm_fail(err, FLM_ERR_FORMAT, "%s: chat_template is an empty list", path);
    } else if (ct && !cJSON_IsNull(ct)) {
        st = flm_fail(err, FLM_ERR_FORMAT, "%s: chat_template is not a string or a list of {\"name\", \"template\"}",
                      path);
    }
    if (!st && t && !(*tmpl = strdup(t))) st = flm_fail(err, FLM_ERR_NOMEM, "%s: out of memory", path);
    const cJSON *et = cJSON_GetObjectItemCaseSensitive(tc, "eos_token");
    if (cJSON_IsObject(et)) et = cJSON_GetObjectItemCaseSensitive(et, "content");
    if (!st && et && !cJSON_IsNull(et) && !cJSON_IsString(et))
        st = flm_fail(err, FLM_ERR_FORMAT, "%s: eos_token is not a string (nor an object with a string \"content\")",
                      path);
    for (uint32_t i = 0; !st && cJSON_IsString(et) && i < v->n; i++)
        if (v->tokens[i] && !strcmp(v->tokens[i], et->valuestring)) {
            *eos = i;
            *eos_found = true;
            break;
        }
    cJSON_Delete(tc);
    if (st) { free(*tmpl); *tmpl = NULL; }
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

/* ---- architectures --------------------------------------------------------------------------------------------- */

/* What config.json says, in the GGUF's terms. */
typedef struct hf_model {
    const char *arch;      /* general.architecture (llama.cpp's name) */
    const char *pre;       /* tokenizer.ggml.pre */
    uint32_t d, F, L, H, H_kv, P, V;
    uint32_t rope_dim;     /* 0: no rope.dimension_count key (all of head_dim, or learned positions) */
    float eps, rope_theta; /* rope_theta 0: no key */
    bool tied;             /* lm_head is the token embedding */
    bool norm_after;       /* post-LN (OPT's do_layer_norm_before false): flashlm.norm_after */
    uint32_t E;            /* the token embedding's width: d, or OPT's word_embed_proj_dim (project_in/out) */
    uint32_t bos, eos;
} hf_model;

/* The tensor map being built: maps[0 .. n) of cap. */
typedef struct hf_mapper {
    const flm_st_set *set;
    const char *dir;
    hf_map *maps;
    size_t n, cap;
    uint32_t wt; /* the matrices' type */
} hf_mapper;

/* Map source tensor hf (checked: rows x cols, cols 0 for a vector) to GGUF name gg (matrices of the chosen type,
 * vectors f32); printf-style names, %u the layer. */
static flm_status map1(hf_mapper *M, const char *hf, const char *gg, uint64_t rows, uint64_t cols, flm_error *err) {
    if (M->n == M->cap) return flm_fail(err, FLM_ERR_FORMAT, "%s: too many tensors", M->dir); /* not reached */
    hf_map *m = &M->maps[M->n];
    flm_status st = want(M->set, M->dir, hf, rows, cols, &m->t, err);
    if (st) return st;
    snprintf(m->gguf, sizeof m->gguf, "%s", gg);
    m->n_dims = cols ? 2 : 1;
    m->ne[0] = cols ? cols : rows;
    m->ne[1] = cols ? rows : 1;
    m->type = cols ? M->wt : FLM_TYPE_F32;
    M->n++;
    return FLM_OK;
}

/* One entry of an architecture's per-layer table: source suffix, GGUF suffix, shape in the model's dimensions. */
typedef enum { D_ONE, D_D, D_F, D_QKV, D_Q, D_KV, D_HD } hf_dim;
typedef struct hf_entry {
    const char *hf, *gg;
    hf_dim rows, cols; /* cols D_ONE: a vector */
} hf_entry;

static uint64_t dim_of(const hf_model *h, hf_dim x) {
    const uint64_t hd = h->d / h->H;
    switch (x) {
    case D_D: return h->d;
    case D_F: return h->F;
    case D_QKV: return (uint64_t)(h->H + 2 * h->H_kv) * hd;
    case D_Q: return (uint64_t)h->H * hd;
    case D_KV: return (uint64_t)h->H_kv * hd;
    case D_HD: return hd;
    default: return 0;
    }
}

/* Map every layer's tensors: prefix "model.decoder.layers.%u." (a printf format with the layer), the table T. */
static flm_status map_layers(hf_mapper *M, const hf_model *h, const char *prefix, const hf_entry *T, size_t n,
                             flm_error *err) {
    for (uint32_t l = 0; l < h->L; l++)
        for (size_t i = 0; i < n; i++) {
            char pre[96], hf[192], gg[96];
            snprintf(pre, sizeof pre, prefix, l);
            snprintf(hf, sizeof hf, "%s%s", pre, T[i].hf);
            snprintf(gg, sizeof gg, "blk.%u.%s", l, T[i].gg);
            flm_status st = map1(M, hf, gg, dim_of(h, T[i].rows), T[i].cols == D_ONE ? 0 : dim_of(h, T[i].cols), err);
            if (st) return st;
        }
    return FLM_OK;
}

/* config[key] as a float in (0, 1) (*v), optional (absent: *v unchanged) */
static flm_status cfg_eps(const cJSON *cfg, const char *path, const char *key, float *v, flm_error *err) {
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(cfg, key);
    if (!j) return FLM_OK;
    if (!cJSON_IsNumber(j) || !(j->valuedouble > 0 && j->valuedouble < 1))
        return flm_fail(err, FLM_ERR_FORMAT, "%s: '%s' is not a number in (0, 1)", path, key);
    *v = (float)j->valuedouble;
    return FLM_OK;
}

/* config's RoPE: rope_parameters {rope_theta, partial_rotary_factor, rope_type} (transformers 5), or the older
 * top-level rope_theta / partial_rotary_factor; only the default (unscaled) RoPE. rope_dim = head_dim * factor
 * rounded down, as transformers' int(head_dim * partial_rotary_factor); it must be even. */
static flm_status cfg_rope(const cJSON *cfg, const char *path, hf_model *h, flm_error *err) {
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(cfg, "rope_parameters");
    const cJSON *src = cJSON_IsObject(rp) ? rp : cfg;
    const cJSON *th = cJSON_GetObjectItemCaseSensitive(src, "rope_theta");
    const cJSON *pf = cJSON_GetObjectItemCaseSensitive(src, "partial_rotary_factor");
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(src, "rope_type");
    const cJSON *sc = cJSON_GetObjectItemCaseSensitive(cfg, "rope_scaling");
    if ((ty && !(cJSON_IsString(ty) && !strcmp(ty->valuestring, "default"))) || (sc && !cJSON_IsNull(sc)))
        return flm_fail(err, FLM_ERR_UNSUPPORTED, "%s: RoPE scaling (rope_type '%s') is not supported (default only)",
                        path, cJSON_IsString(ty) ? ty->valuestring : "rope_scaling");
    h->rope_theta = 10000.0f;
    if (th) {
        if (!cJSON_IsNumber(th) || !(th->valuedouble > 0 && th->valuedouble < 1e12))
            return flm_fail(err, FLM_ERR_FORMAT, "%s: rope_theta is not a positive number", path);
        h->rope_theta = (float)th->valuedouble;
    }
    const uint32_t hd = h->d / h->H;
    h->rope_dim = hd;
    if (pf) {
        if (!cJSON_IsNumber(pf) || !(pf->valuedouble > 0 && pf->valuedouble <= 1))
            return flm_fail(err, FLM_ERR_FORMAT, "%s: partial_rotary_factor is not in (0, 1]", path);
        h->rope_dim = (uint32_t)((double)hd * pf->valuedouble);
    }
    if (h->rope_dim == 0 || h->rope_dim % 2)
        return flm_fail(err, FLM_ERR_UNSUPPORTED, "%s: %u rotary dimensions per head (head_dim %u x "
                        "partial_rotary_factor) is not a positive even number", path, h->rope_dim, hd);
    return FLM_OK;
}

/* config[key] is absent or the string want (what names it in the message) */
static flm_status cfg_is(const cJSON *cfg, const char *path, const char *key, const char *want_s, flm_error *err) {
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(cfg, key);
    if (j && (!cJSON_IsString(j) || strcmp(j->valuestring, want_s) != 0))
        return flm_fail(err, FLM_ERR_UNSUPPORTED, "%s: %s '%s' is not supported (%s)", path, key,
                        cJSON_IsString(j) ? j->valuestring : "?", want_s);
    return FLM_OK;
}

/* config[key] is not true (absent or false): a feature flashlm lacks, named in the message */
static flm_status cfg_not(const cJSON *cfg, const char *path, const char *key, const char *what, flm_error *err) {
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(cfg, key)))
        return flm_fail(err, FLM_ERR_UNSUPPORTED, "%s: %s is true (%s): not supported", path, key, what);
    return FLM_OK;
}

/* OPT (transformers' models/opt/modeling_opt.py, OPTForCausalLM):
 *   model.decoder.embed_tokens.weight [V, E]            -> token_embd.weight (lm_head tied to it); E = d, or
 *                                                          word_embed_proj_dim (OPT-350M: 512 for d 1024)
 *   model.decoder.project_in.weight [d, E]              -> proj_in.weight  (only when E != d; no bias)
 *   model.decoder.project_out.weight [E, d]             -> proj_out.weight (only when E != d; no bias)
 *   model.decoder.embed_positions.weight [P + 2, d]     -> position_embd.weight [P, d]: OPTLearnedPositionalEmbedding
 *                                                          looks up row pos + 2, so the first 2 rows are dropped
 *   layers.N.self_attn_layer_norm.{weight,bias}         -> blk.N.attn_norm.{weight,bias}
 *   layers.N.self_attn.{q,k,v,out}_proj.{weight,bias}   -> blk.N.attn_{q,k,v,output}.{weight,bias}
 *       (OPT multiplies q_proj's output, bias included, by head_dim^-0.5 and then takes softmax(q k^T): the same as
 *        the engine's attention scale 1/sqrt(head_dim) on the unscaled q; nothing to fold)
 *   layers.N.final_layer_norm.{weight,bias}             -> blk.N.ffn_norm.{weight,bias}
 *   layers.N.fc1.{weight,bias} / fc2.{weight,bias}      -> blk.N.ffn_up.{weight,bias} / blk.N.ffn_down.{weight,bias}
 *   model.decoder.final_layer_norm.{weight,bias}        -> output_norm.{weight,bias} (pre-LN only)
 *   lm_head.weight [V, E] (when not tied)               -> output.weight
 * do_layer_norm_before (default true) false is OPT-350M's post-LN: the layer norms follow the residual adds and the
 * decoder has no final LayerNorm; written as flashlm.norm_after = true (model/model.h). The embedding is projected
 * (project_in) before the positions are added, and project_out follows the last layer (the final norm, pre-LN). */
static flm_status cfg_opt(const cJSON *cfg, const char *path, hf_model *h, flm_error *err) {
    flm_status st;
    h->arch = "opt";
    h->pre = "gpt-2";
    h->bos = h->eos = 2;
    h->eps = 1e-5f; /* nn.LayerNorm's default: OPT's */
    if ((st = cfg_u32(cfg, path, "ffn_dim", &h->F, err)) ||
        (st = cfg_u32(cfg, path, "max_position_embeddings", &h->P, err)))
        return st;
    h->H_kv = h->H;
    h->rope_dim = 0;
    const cJSON *ln = cJSON_GetObjectItemCaseSensitive(cfg, "do_layer_norm_before");
    if (ln && !cJSON_IsBool(ln)) return flm_fail(err, FLM_ERR_FORMAT, "%s: do_layer_norm_before is not a bool", path);
    h->norm_after = cJSON_IsFalse(ln);
    /* pre-LN without the final LayerNorm is a layout flashlm lacks; post-LN has none either way */
    if (!h->norm_after && (st = cfg_not(cfg, path, "_remove_final_layer_norm", "no final LayerNorm", err))) return st;
    h->E = h->d;
    if (cJSON_GetObjectItemCaseSensitive(cfg, "word_embed_proj_dim") &&
        (st = cfg_u32(cfg, path, "word_embed_proj_dim", &h->E, err)))
        return st;
    if ((st = cfg_is(cfg, path, "activation_function", "relu", err))) return st;
    const cJSON *ea = cJSON_GetObjectItemCaseSensitive(cfg, "layer_norm_elementwise_affine");
    const cJSON *eb = cJSON_GetObjectItemCaseSensitive(cfg, "enable_bias");
    if (cJSON_IsFalse(ea) || cJSON_IsFalse(eb))
        return flm_fail(err, FLM_ERR_UNSUPPORTED, "%s: layer_norm_elementwise_affine or enable_bias is false: not "
                        "supported (OPT's defaults are true)", path);
    return cfg_bool(cfg, path, "tie_word_embeddings", true, &h->tied, err);
}

static flm_status map_opt(hf_mapper *M, const hf_model *h, flm_error *err) {
    flm_status st;
    if ((st = map1(M, "model.decoder.embed_tokens.weight", "token_embd.weight", h->V, h->E, err)) ||
        (st = map1(M, "model.decoder.embed_positions.weight", "position_embd.weight", (uint64_t)h->P + 2, h->d, err)))
        return st;
    hf_map *pe = &M->maps[M->n - 1];
    pe->type = FLM_TYPE_F32;
    pe->skip_rows = 2;
    pe->ne[1] = h->P;
    if (h->E != h->d &&
        ((st = map1(M, "model.decoder.project_in.weight", "proj_in.weight", h->d, h->E, err)) ||
         (st = map1(M, "model.decoder.project_out.weight", "proj_out.weight", h->E, h->d, err))))
        return st;
    if (!h->norm_after &&
        ((st = map1(M, "model.decoder.final_layer_norm.weight", "output_norm.weight", h->d, 0, err)) ||
         (st = map1(M, "model.decoder.final_layer_norm.bias", "output_norm.bias", h->d, 0, err))))
        return st;
    if (!h->tied && flm_st_set_find(M->set, "lm_head.weight") &&
        (st = map1(M, "lm_head.weight", "output.weight", h->V, h->E, err)))
        return st;
    static const hf_entry T[] = {
        {"self_attn_layer_norm.weight", "attn_norm.weight", D_D, D_ONE},
        {"self_attn_layer_norm.bias", "attn_norm.bias", D_D, D_ONE},
        {"self_attn.q_proj.weight", "attn_q.weight", D_D, D_D},   {"self_attn.q_proj.bias", "attn_q.bias", D_D, D_ONE},
        {"self_attn.k_proj.weight", "attn_k.weight", D_D, D_D},   {"self_attn.k_proj.bias", "attn_k.bias", D_D, D_ONE},
        {"self_attn.v_proj.weight", "attn_v.weight", D_D, D_D},   {"self_attn.v_proj.bias", "attn_v.bias", D_D, D_ONE},
        {"self_attn.out_proj.weight", "attn_output.weight", D_D, D_D},
        {"self_attn.out_proj.bias", "attn_output.bias", D_D, D_ONE},
        {"final_layer_norm.weight", "ffn_norm.weight", D_D, D_ONE},
        {"final_layer_norm.bias", "ffn_norm.bias", D_D, D_ONE},
        {"fc1.weight", "ffn_up.weight", D_F, D_D},                {"fc1.bias", "ffn_up.bias", D_F, D_ONE},
        {"fc2.weight", "ffn_down.weight", D_D, D_F},              {"fc2.bias", "ffn_down.bias", D_D, D_ONE},
    };
    return map_layers(M, h, "model.decoder.layers.%u.", T, sizeof T / sizeof T[0], err);
}

/* Falcon 7B (transformers' models/falcon/modeling_falcon.py: parallel_attn, multi_query, no bias, no alibi, the old
 * decoder architecture; llama.cpp's falcon names):
 *   transformer.word_embeddings.weight                  -> token_embd.weight (lm_head tied to it)
 *   transformer.h.N.input_layernorm.{weight,bias}       -> blk.N.attn_norm.{weight,bias} (attention's and FFN's)
 *   transformer.h.N.self_attention.query_key_value.weight [(H + 2) hd, d]
 *                                                       -> blk.N.attn_qkv.weight: with multi_query transformers reads
 *                                                          it as view(H + 2, hd): H q heads, then k, then v; already
 *                                                          llama.cpp's order (FLM_QKV_CONCAT), copied as is
 *   transformer.h.N.self_attention.dense.weight         -> blk.N.attn_output.weight
 *   transformer.h.N.mlp.dense_h_to_4h / dense_4h_to_h   -> blk.N.ffn_up.weight / blk.N.ffn_down.weight
 *   transformer.ln_f.{weight,bias}                      -> output_norm.{weight,bias}
 *   lm_head.weight (when not tied)                      -> output.weight */
static flm_status cfg_falcon(const cJSON *cfg, const char *path, hf_model *h, flm_error *err) {
    flm_status st;
    h->arch = "falcon";
    h->pre = "falcon";
    h->bos = h->eos = 11;
    h->eps = 1e-5f;
    h->F = 4 * h->d;
    if (cJSON_GetObjectItemCaseSensitive(cfg, "ffn_hidden_size") &&
        (st = cfg_u32(cfg, path, "ffn_hidden_size", &h->F, err)))
        return st;
    h->P = 2048;
    if (cJSON_GetObjectItemCaseSensitive(cfg, "max_position_embeddings") &&
        (st = cfg_u32(cfg, path, "max_position_embeddings", &h->P, err)))
        return st;
    if ((st = cfg_eps(cfg, path, "layer_norm_epsilon", &h->eps, err)) ||
        (st = cfg_not(cfg, path, "new_decoder_architecture", "Falcon 40B/180B's layout", err)) ||
        (st = cfg_not(cfg, path, "alibi", "ALiBi positions instead of RoPE", err)) ||
        (st = cfg_not(cfg, path, "bias", "biases on the linear layers", err)) ||
        (st = cfg_is(cfg, path, "activation", "gelu", err)) || (st = cfg_rope(cfg, path, h, err)))
        return st;
    if (!cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(cfg, "parallel_attn")))
        return flm_fail(err, FLM_ERR_UNSUPPORTED, "%s: parallel_attn is not true (a sequential Falcon): not "
                        "supported; flashlm runs Falcon 7B's parallel layout", path);
    if (!cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(cfg, "multi_query")))
        return flm_fail(err, FLM_ERR_UNSUPPORTED, "%s: multi_query is not true: Falcon's per-head q/k/v layout is not "
                        "supported; flashlm runs Falcon 7B's multi-query layout", path);
    if (h->rope_dim != h->d / h->H)
        return flm_fail(err, FLM_ERR_UNSUPPORTED, "%s: partial rotary embeddings in Falcon are not supported", path);
    h->rope_dim = 0; /* all of head_dim: llama.cpp writes no falcon.rope.dimension_count */
    h->H_kv = 1;
    return cfg_bool(cfg, path, "tie_word_embeddings", true, &h->tied, err);
}

static flm_status map_falcon(hf_mapper *M, const hf_model *h, flm_error *err) {
    flm_status st;
    if ((st = map1(M, "transformer.word_embeddings.weight", "token_embd.weight", h->V, h->d, err)) ||
        (st = map1(M, "transformer.ln_f.weight", "output_norm.weight", h->d, 0, err)) ||
        (st = map1(M, "transformer.ln_f.bias", "output_norm.bias", h->d, 0, err)))
        return st;
    if (!h->tied && (st = map1(M, "lm_head.weight", "output.weight", h->V, h->d, err))) return st;
    static const hf_entry T[] = {
        {"input_layernorm.weight", "attn_norm.weight", D_D, D_ONE},
        {"input_layernorm.bias", "attn_norm.bias", D_D, D_ONE},
        {"self_attention.query_key_value.weight", "attn_qkv.weight", D_QKV, D_D},
        {"self_attention.dense.weight", "attn_output.weight", D_D, D_Q},
        {"mlp.dense_h_to_4h.weight", "ffn_up.weight", D_F, D_D},
        {"mlp.dense_4h_to_h.weight", "ffn_down.weight", D_D, D_F},
    };
    return map_layers(M, h, "transformer.h.%u.", T, sizeof T / sizeof T[0], err);
}

/* Phi-2 (transformers' models/phi/modeling_phi.py, PhiForCausalLM; llama.cpp's phi2 names, separate q, k, v as its
 * converter writes them from this layout):
 *   model.embed_tokens.weight                           -> token_embd.weight
 *   model.layers.N.input_layernorm.{weight,bias}        -> blk.N.attn_norm.{weight,bias} (attention's and FFN's)
 *   model.layers.N.self_attn.{q,k,v}_proj.{weight,bias} -> blk.N.attn_{q,k,v}.{weight,bias}
 *   model.layers.N.self_attn.dense.{weight,bias}        -> blk.N.attn_output.{weight,bias}
 *   model.layers.N.mlp.fc1 / fc2.{weight,bias}          -> blk.N.ffn_up / blk.N.ffn_down.{weight,bias}
 *   model.final_layernorm.{weight,bias}                 -> output_norm.{weight,bias}
 *   lm_head.{weight,bias}                               -> output.{weight,bias} (the weight tied when so configured)
 * phi2.rope.dimension_count = int(head_dim * partial_rotary_factor). */
static flm_status cfg_phi(const cJSON *cfg, const char *path, hf_model *h, flm_error *err) {
    flm_status st;
    h->arch = "phi2";
    h->pre = "phi-2";
    h->bos = 1;
    h->eos = 2;
    h->eps = 1e-5f;
    h->H_kv = h->H;
    if ((st = cfg_u32(cfg, path, "intermediate_size", &h->F, err)) ||
        (st = cfg_u32(cfg, path, "max_position_embeddings", &h->P, err)) ||
        (cJSON_GetObjectItemCaseSensitive(cfg, "num_key_value_heads") &&
         (st = cfg_u32(cfg, path, "num_key_value_heads", &h->H_kv, err))) ||
        (st = cfg_eps(cfg, path, "layer_norm_eps", &h->eps, err)) ||
        (st = cfg_is(cfg, path, "hidden_act", "gelu_new", err)) ||
        (st = cfg_not(cfg, path, "qk_layernorm", "q/k LayerNorm in Phi", err)) || (st = cfg_rope(cfg, path, h, err)))
        return st;
    return cfg_bool(cfg, path, "tie_word_embeddings", false, &h->tied, err);
}

static flm_status map_phi(hf_mapper *M, const hf_model *h, flm_error *err) {
    flm_status st;
    if ((st = map1(M, "model.embed_tokens.weight", "token_embd.weight", h->V, h->d, err)) ||
        (st = map1(M, "model.final_layernorm.weight", "output_norm.weight", h->d, 0, err)) ||
        (st = map1(M, "model.final_layernorm.bias", "output_norm.bias", h->d, 0, err)) ||
        (!h->tied && (st = map1(M, "lm_head.weight", "output.weight", h->V, h->d, err))) ||
        (st = map1(M, "lm_head.bias", "output.bias", h->V, 0, err)))
        return st;
    static const hf_entry T[] = {
        {"input_layernorm.weight", "attn_norm.weight", D_D, D_ONE},
        {"input_layernorm.bias", "attn_norm.bias", D_D, D_ONE},
        {"self_attn.q_proj.weight", "attn_q.weight", D_Q, D_D},    {"self_attn.q_proj.bias", "attn_q.bias", D_Q, D_ONE},
        {"self_attn.k_proj.weight", "attn_k.weight", D_KV, D_D},   {"self_attn.k_proj.bias", "attn_k.bias", D_KV, D_ONE},
        {"self_attn.v_proj.weight", "attn_v.weight", D_KV, D_D},   {"self_attn.v_proj.bias", "attn_v.bias", D_KV, D_ONE},
        {"self_attn.dense.weight", "attn_output.weight", D_D, D_Q},
        {"self_attn.dense.bias", "attn_output.bias", D_D, D_ONE},
        {"mlp.fc1.weight", "ffn_up.weight", D_F, D_D},             {"mlp.fc1.bias", "ffn_up.bias", D_F, D_ONE},
        {"mlp.fc2.weight", "ffn_down.weight", D_D, D_F},           {"mlp.fc2.bias", "ffn_down.bias", D_D, D_ONE},
    };
    return map_layers(M, h, "model.layers.%u.", T, sizeof T / sizeof T[0], err);
}

/* Persimmon (transformers' models/persimmon/modeling_persimmon.py; llama.cpp's persimmon names):
 *   model.embed_tokens.weight                           -> token_embd.weight
 *   model.layers.N.input_layernorm.{weight,bias}        -> blk.N.attn_norm.{weight,bias}
 *   model.layers.N.self_attn.query_key_value.{weight,bias} [3 d, d]
 *                                                       -> blk.N.attn_qkv.{weight,bias}: transformers reads it as
 *                                                          view(H, 3, hd), per head its q, k, v rows, as llama.cpp
 *                                                          (FLM_QKV_PER_HEAD); copied as is
 *   model.layers.N.self_attn.{q,k}_layernorm.{weight,bias} [hd] -> blk.N.attn_{q,k}_norm.{weight,bias}
 *   model.layers.N.self_attn.dense.{weight,bias}        -> blk.N.attn_output.{weight,bias}
 *   model.layers.N.post_attention_layernorm.{w,b}       -> blk.N.ffn_norm.{weight,bias}
 *   model.layers.N.mlp.dense_h_to_4h / dense_4h_to_h.{weight,bias} -> blk.N.ffn_up / blk.N.ffn_down.{weight,bias}
 *   model.final_layernorm.{weight,bias}                 -> output_norm.{weight,bias}
 *   lm_head.weight                                      -> output.weight (unless tied)
 * persimmon.rope.dimension_count = int(head_dim * partial_rotary_factor). */
static flm_status cfg_persimmon(const cJSON *cfg, const char *path, hf_model *h, flm_error *err) {
    flm_status st;
    h->arch = "persimmon";
    h->pre = "gpt-2"; /* only placeholders: a tokenizer.json is refused unless byte-level (load_vocab) */
    h->bos = 1;
    h->eos = 2;
    h->eps = 1e-5f;
    h->H_kv = h->H;
    if ((st = cfg_u32(cfg, path, "intermediate_size", &h->F, err)) ||
        (st = cfg_u32(cfg, path, "max_position_embeddings", &h->P, err)) ||
        (st = cfg_eps(cfg, path, "layer_norm_eps", &h->eps, err)) ||
        (st = cfg_is(cfg, path, "hidden_act", "relu2", err)) || (st = cfg_rope(cfg, path, h, err)))
        return st;
    if (cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(cfg, "qk_layernorm")))
        return flm_fail(err, FLM_ERR_UNSUPPORTED, "%s: qk_layernorm is false: flashlm's persimmon has q/k LayerNorm",
                        path);
    return cfg_bool(cfg, path, "tie_word_embeddings", false, &h->tied, err);
}

static flm_status map_persimmon(hf_mapper *M, const hf_model *h, flm_error *err) {
    flm_status st;
    if ((st = map1(M, "model.embed_tokens.weight", "token_embd.weight", h->V, h->d, err)) ||
        (st = map1(M, "model.final_layernorm.weight", "output_norm.weight", h->d, 0, err)) ||
        (st = map1(M, "model.final_layernorm.bias", "output_norm.bias", h->d, 0, err)) ||
        (!h->tied && (st = map1(M, "lm_head.weight", "output.weight", h->V, h->d, err))))
        return st;
    static const hf_entry T[] = {
        {"input_layernorm.weight", "attn_norm.weight", D_D, D_ONE},
        {"input_layernorm.bias", "attn_norm.bias", D_D, D_ONE},
        {"self_attn.query_key_value.weight", "attn_qkv.weight", D_QKV, D_D},
        {"self_attn.query_key_value.bias", "attn_qkv.bias", D_QKV, D_ONE},
        {"self_attn.q_layernorm.weight", "attn_q_norm.weight", D_HD, D_ONE},
        {"self_attn.q_layernorm.bias", "attn_q_norm.bias", D_HD, D_ONE},
        {"self_attn.k_layernorm.weight", "attn_k_norm.weight", D_HD, D_ONE},
        {"self_attn.k_layernorm.bias", "attn_k_norm.bias", D_HD, D_ONE},
        {"self_attn.dense.weight", "attn_output.weight", D_D, D_Q},
        {"self_attn.dense.bias", "attn_output.bias", D_D, D_ONE},
        {"post_attention_layernorm.weight", "ffn_norm.weight", D_D, D_ONE},
        {"post_attention_layernorm.bias", "ffn_norm.bias", D_D, D_ONE},
        {"mlp.dense_h_to_4h.weight", "ffn_up.weight", D_F, D_D},
        {"mlp.dense_h_to_4h.bias", "ffn_up.bias", D_F, D_ONE},
        {"mlp.dense_4h_to_h.weight", "ffn_down.weight", D_D, D_F},
        {"mlp.dense_4h_to_h.bias", "ffn_down.bias", D_D, D_ONE},
    };
    return map_layers(M, h, "model.layers.%u.", T, sizeof T / sizeof T[0], err);
}

/* The architectures a folder may hold, by config.json's model_type. */
static const struct hf_arch {
    const char *model_type;
    flm_status (*cfg)(const cJSON *, const char *, hf_model *, flm_error *);
    flm_status (*map)(hf_mapper *, const hf_model *, flm_error *);
    size_t per_layer; /* tensors per layer at most */
} hf_archs[] = {
    {"opt", cfg_opt, map_opt, 16},
    {"falcon", cfg_falcon, map_falcon, 6},
    {"phi", cfg_phi, map_phi, 14},
    {"persimmon", cfg_persimmon, map_persimmon, 16},
};

/* dst against folder/name: FLM_ERR_ARG when they are one file (device and inode: hard links too). */
static flm_status not_input(const struct stat *d, const char *dst, const char *folder, const char *name,
                            flm_error *err) {
    char path[PATH_MAX];
    struct stat s;
    if ((size_t)snprintf(path, sizeof path, "%s/%s", folder, name) >= sizeof path) return FLM_OK;
    if (stat(path, &s) == 0 && s.st_dev == d->st_dev && s.st_ino == d->st_ino)
        return flm_fail(err, FLM_ERR_ARG, "%s: is %s, which the conversion reads; choose another output path", dst,
                        path);
    return FLM_OK;
}

flm_status flm_hf_check_output(const char *dir, const char *tok_dir, const char *dst, flm_error *err) {
    struct stat d;
    if (!dst || lstat(dst, &d) != 0 || !S_ISREG(d.st_mode)) return FLM_OK; /* nothing there to overwrite */
    static const char *const in_dir[] = {"config.json", "model.safetensors", "model.safetensors.index.json"};
    static const char *const in_tok[] = {"tokenizer.json", "vocab.json", "merges.txt"};
    flm_status st = FLM_OK;
    for (size_t i = 0; i < 3 && !st; i++) st = not_input(&d, dst, dir, in_dir[i], err);
    for (size_t i = 0; i < 3 && !st && tok_dir; i++) st = not_input(&d, dst, tok_dir, in_tok[i], err);
    if (st) return st;
    /* the shards the index names (a bad index is refused later, by the reader) */
    char path[PATH_MAX];
    cJSON *idx = NULL;
    if ((size_t)snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir) >= sizeof path) return FLM_OK;
    flm_error ignored;
    if (read_json(path, false, false, &idx, &ignored) || !idx) return FLM_OK;
    const cJSON *wm = cJSON_GetObjectItemCaseSensitive(idx, "weight_map");
    for (const cJSON *e = cJSON_IsObject(wm) ? wm->child : NULL; e && !st; e = e->next)
        if (cJSON_IsString(e) && e->valuestring && !strchr(e->valuestring, '/'))
            st = not_input(&d, dst, dir, e->valuestring, err);
    cJSON_Delete(idx);
    return st;
}

/* Ends with suffix. */
static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcmp(s + n - k, suffix);
}

/* Every tensor of the folder must be one the map uses: a config.json that describes fewer layers (or another shape)
 * than the weights hold would otherwise convert a different, shorter model without a word. Not weights, and
 * skipped: PyTorch's saved buffers (rotary inv_freq, GPT-2-style attention masks) and lm_head when tied. */
static flm_status check_all_used(const flm_st_set *set, const hf_map *maps, size_t nm, const hf_model *h,
                                 const char *dir, flm_error *err) {
    uint64_t n_left = 0;
    char names[512] = "";
    for (uint32_t f = 0; f < set->n_files; f++)
        for (uint64_t i = 0; i < set->files[f]->n_tensors; i++) {
            const flm_st_tensor *t = &set->files[f]->tensors[i];
            bool used = false;
            for (size_t k = 0; k < nm && !used; k++) used = maps[k].t == t;
            if (used || ends_with(t->name, ".rotary_emb.inv_freq") || ends_with(t->name, ".attn.masked_bias") ||
                ends_with(t->name, ".attn.bias") || (h->tied && !strcmp(t->name, "lm_head.weight")))
                continue;
            if (n_left++ < 4)
                snprintf(names + strlen(names), sizeof names - strlen(names), "%s'%s'", n_left > 1 ? ", " : "",
                         t->name);
        }
    if (!n_left) return FLM_OK;
    if (n_left > 4) snprintf(names + strlen(names), sizeof names - strlen(names), " and %llu more", (ull)(n_left - 4));
    return flm_fail(err, FLM_ERR_FORMAT, "%s: %llu tensor%s not part of the model config.json describes (%s, "
                    "num_hidden_layers %u): %s; config.json and the weights disagree", dir, (ull)n_left,
                    n_left == 1 ? " is" : "s are", h->arch, h->L, names);
}

flm_status flm_convert_hf(const char *dir, const char *tok_dir, const char *dst, uint32_t type, unsigned flags,
                          flm_error *err) {
    flm_error_clear(err);
    if (type != FLM_TYPE_F32 && type != FLM_TYPE_F16 && type != FLM_TYPE_Q8_0)
        return flm_fail(err, FLM_ERR_ARG, "convert: --type %s is not supported from a Hugging Face folder (f32, f16, "
                        "q8_0)", flm_type_name(type));
    const bool no_tok = flags & FLM_HF_NO_TOKENIZER;
    if (no_tok && tok_dir)
        return flm_fail(err, FLM_ERR_ARG, "convert: --tokenizer %s and --no-tokenizer contradict each other", tok_dir);
    if (!tok_dir && !no_tok) tok_dir = dir;
    struct stat ts;
    if (tok_dir && tok_dir != dir && (stat(tok_dir, &ts) != 0 || !S_ISDIR(ts.st_mode)))
        return flm_fail(err, FLM_ERR_ARG, "--tokenizer %s: %s", tok_dir,
                        stat(tok_dir, &ts) != 0 ? strerror(errno) : "not a folder");
    flm_status st = flm_hf_check_output(dir, tok_dir, dst, err); /* never onto a file being read */
    if (st) return st;
    char path[PATH_MAX];
    if ((size_t)snprintf(path, sizeof path, "%s/config.json", dir) >= sizeof path)
        return flm_fail(err, FLM_ERR_ARG, "%s: path too long", dir);
    cJSON *cfg = NULL;
    st = read_json(path, true, true, &cfg, err);
    if (st) return st;
    flm_st_set *set = NULL;
    hf_vocab voc = {0};
    hf_mapper M = {0};
    flm_gguf_writer *w = NULL;
    float *row = NULL;
    void *orow = NULL;
    char *chat_tmpl = NULL;
    hf_model h = {0};
    const struct hf_arch *A = NULL;
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(cfg, "model_type");
    for (size_t i = 0; cJSON_IsString(mt) && i < sizeof hf_archs / sizeof hf_archs[0]; i++)
        if (!strcmp(mt->valuestring, hf_archs[i].model_type)) A = &hf_archs[i];
    if (!A) {
        st = flm_fail(err, FLM_ERR_UNSUPPORTED, "%s: model_type '%s' is not supported from a Hugging Face folder "
                      "(opt, falcon, phi, persimmon; convert others with llama.cpp's convert_hf_to_gguf.py)", path,
                      cJSON_IsString(mt) ? mt->valuestring : "(missing)");
        goto done;
    }
    if ((st = cfg_u32(cfg, path, "hidden_size", &h.d, err)) ||
        (st = cfg_u32(cfg, path, "num_hidden_layers", &h.L, err)) ||
        (st = cfg_u32(cfg, path, "num_attention_heads", &h.H, err)) || (st = cfg_u32(cfg, path, "vocab_size", &h.V, err)))
        goto done;
    if (h.L > HF_MAX_LAYERS) { /* before the tensor map of L x per-layer entries is allocated */
        st = flm_fail(err, FLM_ERR_FORMAT, "%s: num_hidden_layers %u is above %u, the most flashlm loads", path, h.L,
                      HF_MAX_LAYERS);
        goto done;
    }
    if (h.d % h.H) {
        st = flm_fail(err, FLM_ERR_FORMAT, "%s: hidden_size %u is not a multiple of num_attention_heads %u", path, h.d,
                      h.H);
        goto done;
    }
    if ((st = A->cfg(cfg, path, &h, err))) goto done;
    if (!h.H_kv || h.H % h.H_kv) {
        st = flm_fail(err, FLM_ERR_FORMAT, "%s: %u attention heads are not a multiple of %u key/value heads", path, h.H,
                      h.H_kv);
        goto done;
    }
    if ((st = cfg_token_id(cfg, path, "bos_token_id", h.V, &h.bos, err)) ||
        (st = cfg_token_id(cfg, path, "eos_token_id", h.V, &h.eos, err)))
        goto done;

    if ((st = flm_st_open_dir(dir, &set, err))) goto done;

    /* the tensor map */
    M = (hf_mapper){.set = set, .dir = dir, .cap = 8 + (size_t)h.L * A->per_layer, .wt = type};
    if (!(M.maps = calloc(M.cap, sizeof *M.maps))) { st = flm_fail(err, FLM_ERR_NOMEM, "out of memory"); goto done; }
    if ((st = A->map(&M, &h, err))) goto done;
    const hf_map *maps = M.maps;
    const size_t nm = M.n;
    if ((st = check_all_used(set, maps, nm, &h, dir, err))) goto done;
    /* the vocabulary after the tensors: vocab_size is checked against the embedding's rows before anything of its
     * size is allocated (a forged 4e9 allocated 32 GB of token pointers first) */
    bool have_tok = false;
    if ((st = load_vocab(tok_dir, h.V, &voc, &have_tok, err))) goto done;
    if (!have_tok && strcmp(h.pre, "falcon") == 0) h.pre = "gpt-2"; /* placeholders only: any pre-tokenizer reads */
    if (have_tok) { /* the chat template, and the eos token when config.json names none */
        uint32_t eos = h.eos;
        bool eos_found = false;
        const cJSON *je = cJSON_GetObjectItemCaseSensitive(cfg, "eos_token_id");
        if ((st = tokenizer_config(tok_dir, &voc, &chat_tmpl, &eos, &eos_found, err))) goto done;
        if (eos_found && (!je || cJSON_IsNull(je))) h.eos = eos;
    }
    for (size_t i = 0; i < nm; i++)
        if (maps[i].type == FLM_TYPE_Q8_0 && maps[i].ne[0] % 32) {
            st = flm_fail(err, FLM_ERR_ARG, "%s: --type q8_0 needs rows of a multiple of 32 elements; '%s' has %llu",
                          dir, maps[i].t->name, (ull)maps[i].ne[0]);
            goto done;
        }

    /* the GGUF */
    if ((st = flm_gguf_writer_create(dst, flags & FLM_OUT_REPLACE, &w, err))) goto done;
    char key[96], name[128];
#define AKEY(s) (snprintf(key, sizeof key, "%s.%s", h.arch, s), key)
    snprintf(name, sizeof name, "%s (from a Hugging Face folder)", h.arch);
    flm_gguf_writer_kv_str(w, "general.architecture", h.arch);
    flm_gguf_writer_kv_str(w, "general.name", name);
    flm_gguf_writer_kv_u32(w, AKEY("embedding_length"), h.d);
    flm_gguf_writer_kv_u32(w, AKEY("feed_forward_length"), h.F);
    flm_gguf_writer_kv_u32(w, AKEY("block_count"), h.L);
    flm_gguf_writer_kv_u32(w, AKEY("attention.head_count"), h.H);
    if (h.H_kv != h.H) flm_gguf_writer_kv_u32(w, AKEY("attention.head_count_kv"), h.H_kv);
    flm_gguf_writer_kv_u32(w, AKEY("context_length"), h.P);
    flm_gguf_writer_kv_f32(w, AKEY("attention.layer_norm_epsilon"), h.eps);
    if (h.rope_theta > 0) flm_gguf_writer_kv_f32(w, AKEY("rope.freq_base"), h.rope_theta);
    if (h.rope_dim) flm_gguf_writer_kv_u32(w, AKEY("rope.dimension_count"), h.rope_dim);
#undef AKEY
    flm_gguf_writer_kv_str(w, "tokenizer.ggml.model", "gpt2");
    flm_gguf_writer_kv_str(w, "tokenizer.ggml.pre", h.pre);
    flm_gguf_writer_kv_arr(w, "tokenizer.ggml.tokens", GGUF_VT_STRING, voc.tokens, h.V);
    flm_gguf_writer_kv_arr(w, "tokenizer.ggml.token_type", GGUF_VT_INT32, voc.types, h.V);
    flm_gguf_writer_kv_arr(w, "tokenizer.ggml.merges", GGUF_VT_STRING, voc.merges ? (const void *)voc.merges
                                                                                  : (const void *)"", voc.n_merges);
    flm_gguf_writer_kv_u32(w, "tokenizer.ggml.bos_token_id", h.bos);
    flm_gguf_writer_kv_u32(w, "tokenizer.ggml.eos_token_id", h.eos);
    if (chat_tmpl) flm_gguf_writer_kv_str(w, "tokenizer.chat_template", chat_tmpl);
    /* OPT's tokenizer prepends </s> (BOS); the others' add none */
    flm_gguf_writer_kv_bool(w, "tokenizer.ggml.add_bos_token", strcmp(h.arch, "opt") == 0);
    if (h.norm_after) flm_gguf_writer_kv_bool(w, "flashlm.norm_after", true);
    for (size_t i = 0; i < nm; i++)
        if ((st = flm_gguf_writer_add_tensor(w, maps[i].gguf, maps[i].type, maps[i].n_dims, maps[i].ne))) {
            st = flm_fail(err, st, "%s: cannot add tensor '%s'", dst, maps[i].gguf);
            goto done;
        }
    if ((st = flm_gguf_writer_begin(w, err))) goto done;
    /* the writer takes a tensor in one piece: the largest one's output bytes */
    size_t big = 0, widest = 0;
    for (size_t i = 0; i < nm; i++) {
        size_t b = flm_row_bytes(maps[i].type, maps[i].ne[0]) * (size_t)maps[i].ne[1];
        if (b > big) big = b;
        if (maps[i].ne[0] > widest) widest = (size_t)maps[i].ne[0];
    }
    row = malloc((widest ? widest : 1) * sizeof *row);
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
                    uint16_t hh = flm_f32_to_f16(row[j]);
                    memcpy(o + j * 2, &hh, 2);
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
    free(chat_tmpl);
    free(M.maps);
    vocab_free(&voc);
    flm_st_set_close(set);
    cJSON_Delete(cfg);
    return st;
}
