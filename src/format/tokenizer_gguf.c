/* tokenizer_gguf.c — the tokenizer described by a GGUF file's tokenizer.ggml.* metadata. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "format/gguf.h"
#include "format/tokenizer.h"

flm_status flm_tokenizer_from_gguf(const struct flm_gguf_file *f, flm_tokenizer **out, flm_error *err) {
    flm_status st;
    char *model = NULL;
    if ((st = flm_gguf_get_str(f, "tokenizer.ggml.model", true, &model, err))) return st;
    bool ok = strcmp(model, "llama") == 0;
    if (!ok) {
        st = flm_fail(err, FLM_ERR_UNSUPPORTED, "%s: tokenizer.ggml.model '%s' is not supported (only 'llama')",
                      f->path, model);
        free(model);
        return st;
    }
    free(model);
    const flm_gguf_kv *tokens = NULL, *scores = NULL, *types = NULL;
    if ((st = flm_gguf_get_arr(f, "tokenizer.ggml.tokens", GGUF_VT_STRING, true, &tokens, err))) return st;
    if ((st = flm_gguf_get_arr(f, "tokenizer.ggml.scores", GGUF_VT_FLOAT32, false, &scores, err))) return st;
    if ((st = flm_gguf_get_arr(f, "tokenizer.ggml.token_type", GGUF_VT_INT32, false, &types, err))) return st;
    uint64_t n = tokens->arr_n;
    if (n == 0 || n > (1u << 24)) return flm_fail(err, FLM_ERR_FORMAT, "%s: tokenizer.ggml.tokens has %llu entries",
                                                  f->path, (unsigned long long)n);
    if ((scores && scores->arr_n != n) || (types && types->arr_n != n))
        return flm_fail(err, FLM_ERR_FORMAT, "%s: tokenizer scores/token_type length differs from %llu tokens",
                        f->path, (unsigned long long)n);
    uint32_t bos = 1, eos = 2;
    if ((st = flm_gguf_get_u32(f, "tokenizer.ggml.bos_token_id", false, &bos, err)) ||
        (st = flm_gguf_get_u32(f, "tokenizer.ggml.eos_token_id", false, &eos, err)))
        return st;
    const char **pieces = malloc(n * sizeof *pieces);
    uint32_t *lens = malloc(n * sizeof *lens);
    float *sc = scores ? malloc(n * sizeof *sc) : NULL;
    int32_t *ty = types ? malloc(n * sizeof *ty) : NULL;
    if (!pieces || !lens || (scores && !sc) || (types && !ty)) {
        st = flm_fail(err, FLM_ERR_NOMEM, "%s: out of memory for the tokenizer", f->path);
        goto done;
    }
    for (uint64_t i = 0; i < n; i++) {
        if (tokens->arr_str[i].len > 1024) {
            st = flm_fail(err, FLM_ERR_FORMAT, "%s: token %llu is %llu bytes long", f->path, (unsigned long long)i,
                          (unsigned long long)tokens->arr_str[i].len);
            goto done;
        }
        pieces[i] = tokens->arr_str[i].data;
        lens[i] = (uint32_t)tokens->arr_str[i].len;
        if (sc) memcpy(&sc[i], scores->arr_data + 4 * i, 4);
        if (ty) memcpy(&ty[i], types->arr_data + 4 * i, 4);
    }
    st = flm_tokenizer_create((uint32_t)n, pieces, lens, sc, ty, bos < n ? (int32_t)bos : -1,
                              eos < n ? (int32_t)eos : -1, true, out, err);
    if (st && err) {
        char tmp[2 * FLM_ERROR_MSG_MAX];
        snprintf(tmp, sizeof tmp, "%s: %s", f->path, err->msg);
        snprintf(err->msg, sizeof err->msg, "%.*s", (int)sizeof err->msg - 1, tmp);
    }
done:
    free(pieces);
    free(lens);
    free(sc);
    free(ty);
    return st;
}

