/* tokenizer_gguf.c — the tokenizer described by a GGUF file's tokenizer.ggml.* metadata (keys as llama.cpp's
 * LLM_KV_TOKENIZER_*: model, pre, tokens, scores, token_type, merges, bos/eos/eot/eom_token_id,
 * fim_pad/fim_rep/fim_sep_token_id, add_bos_token, add_eos_token, add_space_prefix). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "format/gguf.h"
#include "format/tokenizer.h"

#define MAX_PIECE 65536 /* bytes in one token or merge string */

/* An optional boolean key: *out = 0/1, or left at -1 when absent. FLM_ERR_FORMAT when it is not a bool. */
static flm_status get_bool(const flm_gguf_file *f, const char *key, int *out, flm_error *err) {
    const flm_gguf_kv *kv = flm_gguf_find_kv(f, key);
    if (!kv) return FLM_OK;
    if (kv->type != GGUF_VT_BOOL)
        return flm_fail(err, FLM_ERR_FORMAT, "%s: key '%s': expected a bool", f->path, key);
    *out = kv->v.u64 != 0;
    return FLM_OK;
}

/* An optional token id key: *out = the id when present (else unchanged: the default). An id >= n_vocab is
 * FLM_ERR_FORMAT naming the key and the value (llama.cpp warns and uses its default instead). */
static flm_status get_id(const flm_gguf_file *f, const char *key, uint64_t n_vocab, int32_t *out, flm_error *err) {
    if (!flm_gguf_find_kv(f, key)) return FLM_OK; /* absent: the default stays */
    uint32_t v = 0;
    flm_status st = flm_gguf_get_u32(f, key, true, &v, err);
    if (st) return st;
    if (v >= n_vocab) /* llama.cpp warns and falls back; a wrong special id silently changes every prompt: refuse */
        return flm_fail(err, FLM_ERR_FORMAT, "%s: key '%s' = %u is outside the vocabulary (%llu tokens: ids 0 to %llu)",
                        f->path, key, v, (unsigned long long)n_vocab, (unsigned long long)n_vocab - 1);
    *out = (int32_t)v;
    return FLM_OK;
}

/* Point pieces/lens at a string array's entries, checking each length. */
static flm_status string_array(const flm_gguf_file *f, const char *key, const flm_gguf_kv *kv, const char **pieces,
                               uint32_t *lens, flm_error *err) {
    for (uint64_t i = 0; i < kv->arr_n; i++) {
        if (kv->arr_str[i].len > MAX_PIECE)
            return flm_fail(err, FLM_ERR_FORMAT, "%s: %s[%llu] is %llu bytes long (at most %d)", f->path, key,
                            (unsigned long long)i, (unsigned long long)kv->arr_str[i].len, MAX_PIECE);
        pieces[i] = kv->arr_str[i].data;
        lens[i] = (uint32_t)kv->arr_str[i].len;
    }
    return FLM_OK;
}

flm_status flm_tokenizer_from_gguf(const struct flm_gguf_file *f, flm_tokenizer **out, flm_error *err) {
    *out = NULL;
    flm_status st;
    char *model = NULL, *pre = NULL;
    const char **pieces = NULL, **merges = NULL;
    uint32_t *lens = NULL, *merge_lens = NULL;
    float *sc = NULL;
    int32_t *ty = NULL;
    if ((st = flm_gguf_get_str(f, "tokenizer.ggml.model", true, &model, err))) return st;
    bool bpe = strcmp(model, "gpt2") == 0;
    if (!bpe && strcmp(model, "llama") != 0) {
        st = flm_fail(err, FLM_ERR_UNSUPPORTED,
                      "%s: tokenizer.ggml.model '%s' is not supported (only 'llama' and 'gpt2')", f->path, model);
        goto done;
    }
    if ((st = flm_gguf_get_str(f, "tokenizer.ggml.pre", false, &pre, err))) goto done;
    const flm_gguf_kv *tokens = NULL, *scores = NULL, *types = NULL, *mkv = NULL;
    if ((st = flm_gguf_get_arr(f, "tokenizer.ggml.tokens", GGUF_VT_STRING, true, &tokens, err)) ||
        (st = flm_gguf_get_arr(f, "tokenizer.ggml.scores", GGUF_VT_FLOAT32, false, &scores, err)) ||
        (st = flm_gguf_get_arr(f, "tokenizer.ggml.token_type", GGUF_VT_INT32, false, &types, err)) ||
        (st = flm_gguf_get_arr(f, "tokenizer.ggml.merges", GGUF_VT_STRING, bpe, &mkv, err)))
        goto done;
    uint64_t n = tokens->arr_n;
    if (n == 0 || n > (1u << 24)) {
        st = flm_fail(err, FLM_ERR_FORMAT, "%s: tokenizer.ggml.tokens has %llu entries (1 to 2^24 allowed)", f->path,
                      (unsigned long long)n);
        goto done;
    }
    if ((scores && scores->arr_n != n) || (types && types->arr_n != n)) {
        st = flm_fail(err, FLM_ERR_FORMAT, "%s: tokenizer.ggml.scores/token_type length differs from %llu tokens",
                      f->path, (unsigned long long)n);
        goto done;
    }
    uint64_t n_merges = bpe && mkv ? mkv->arr_n : 0;
    if (n_merges >= (1u << 28)) {
        st = flm_fail(err, FLM_ERR_FORMAT, "%s: tokenizer.ggml.merges has %llu entries", f->path,
                      (unsigned long long)n_merges);
        goto done;
    }
    flm_tokenizer_spec sp = {
        .model = model, .pre = pre, .n_vocab = (uint32_t)n, .n_merges = (uint32_t)n_merges,
        /* llama.cpp's defaults: SPM BOS 1 / EOS 2; GPT-2 BOS = EOS = 11 */
        .bos = bpe ? (n > 11 ? 11 : -1) : (n > 1 ? 1 : -1), .eos = bpe ? (n > 11 ? 11 : -1) : (n > 2 ? 2 : -1),
        .eot = -1, .eom = -1, .fim_pad = -1, .fim_rep = -1, .fim_sep = -1,
        .add_bos = -1, .add_eos = -1, .add_space_prefix = -1,
    };
    if ((st = get_id(f, "tokenizer.ggml.bos_token_id", n, &sp.bos, err)) ||
        (st = get_id(f, "tokenizer.ggml.eos_token_id", n, &sp.eos, err)) ||
        (st = get_id(f, "tokenizer.ggml.eot_token_id", n, &sp.eot, err)) ||
        (st = get_id(f, "tokenizer.ggml.eom_token_id", n, &sp.eom, err)) ||
        (st = get_id(f, "tokenizer.ggml.fim_pad_token_id", n, &sp.fim_pad, err)) ||
        (st = get_id(f, "tokenizer.ggml.fim_rep_token_id", n, &sp.fim_rep, err)) ||
        (st = get_id(f, "tokenizer.ggml.fim_sep_token_id", n, &sp.fim_sep, err)) ||
        (st = get_bool(f, "tokenizer.ggml.add_bos_token", &sp.add_bos, err)) ||
        (st = get_bool(f, "tokenizer.ggml.add_eos_token", &sp.add_eos, err)) ||
        (st = get_bool(f, "tokenizer.ggml.add_space_prefix", &sp.add_space_prefix, err)))
        goto done;
    pieces = malloc(n * sizeof *pieces);
    lens = malloc(n * sizeof *lens);
    sc = scores ? malloc(n * sizeof *sc) : NULL;
    ty = types ? malloc(n * sizeof *ty) : NULL;
    merges = malloc((n_merges + 1) * sizeof *merges);
    merge_lens = malloc((n_merges + 1) * sizeof *merge_lens);
    if (!pieces || !lens || (scores && !sc) || (types && !ty) || !merges || !merge_lens) {
        st = flm_fail(err, FLM_ERR_NOMEM, "%s: out of memory for the tokenizer", f->path);
        goto done;
    }
    if ((st = string_array(f, "tokenizer.ggml.tokens", tokens, pieces, lens, err))) goto done;
    if (n_merges && (st = string_array(f, "tokenizer.ggml.merges", mkv, merges, merge_lens, err))) goto done;
    for (uint64_t i = 0; i < n; i++) {
        if (sc) memcpy(&sc[i], scores->arr_data + 4 * i, 4);
        if (ty) memcpy(&ty[i], types->arr_data + 4 * i, 4);
    }
    sp.pieces = pieces;
    sp.lens = lens;
    sp.scores = sc;
    sp.types = ty;
    sp.merges = merges;
    sp.merge_lens = merge_lens;
    st = flm_tokenizer_create_spec(&sp, out, err);
    if (st && err) {
        char tmp[2 * FLM_ERROR_MSG_MAX];
        snprintf(tmp, sizeof tmp, "%s: %s", f->path, err->msg);
        snprintf(err->msg, sizeof err->msg, "%.*s", (int)sizeof err->msg - 1, tmp);
    }
done:
    free(model);
    free(pre);
    free(pieces);
    free(lens);
    free(sc);
    free(ty);
    free(merges);
    free(merge_lens);
    return st;
}
