/* fuzz_gguf.c — the GGUF reader (src/format/gguf.c) on arbitrary bytes, and everything that reads a parsed GGUF's
 * metadata: the typed getters, the hyper-parameters, the tokenizer built from tokenizer.ggml.* (encode and decode
 * of a fixed text), the chat template detection of tokenizer.chat_template, and the model loader's tensor checks
 * (flm_model_from_gguf). Seeds: tests/fuzz/make_seeds.sh (GGUF headers cut from tests/data and the pulled models). */
#include "fuzz_common.h"

#include "format/chat_template.h"
#include "format/gguf.h"
#include "format/tokenizer.h"
#include "model/model.h"

static void use_tokenizer(const flm_tokenizer *t) {
    static const char text[] = "Hello world! <|im_start|>user\n  tabs\tand 12345 \xC3\xA9\xE2\x96\x81 \xFF\xFE";
    int32_t ids[256];
    size_t n = flm_tokenizer_encode_ex(t, text, sizeof text - 1, FLM_TOKENIZE_ADD_BOS | FLM_TOKENIZE_PARSE_SPECIAL |
                                       FLM_TOKENIZE_ADD_EOS, ids, 256);
    fz_check(n != SIZE_MAX, "out of memory");
    uint32_t nv = flm_tokenizer_n_vocab(t);
    for (size_t i = 0; i < n && i < 256; i++) {
        fz_check(ids[i] >= 0 && (uint32_t)ids[i] < nv, "id %d of %u", ids[i], nv);
        size_t len = 0;
        const char *p = flm_tokenizer_piece(t, i ? ids[i - 1] : -1, ids[i], &len);
        fz_check(p != NULL, "piece");
        volatile char sink = len ? p[len - 1] : 0;
        (void)sink;
        (void)flm_tokenizer_is_eog(t, ids[i]);
    }
    (void)flm_tokenizer_find(t, "<|im_end|>");
}

/* What flashlm inspect shows of a damaged file: the complete entries before the problem. */
static void partial(const uint8_t *data, size_t size) {
    flm_gguf_file *f = NULL;
    flm_error err;
    flm_status st = flm_gguf_open_buffer_salvage("fuzz.gguf", data, size, &f, &err);
    fz_check(st == FLM_OK || err.msg[0], "an error without a message");
    if (!f) return;
    for (uint64_t i = 0; i < f->n_kv; i++) {
        const flm_gguf_kv *kv = &f->kv[i];
        fz_check(kv->key && strlen(kv->key) > 0, "kv %llu without a key", (unsigned long long)i);
        if (kv->type == GGUF_VT_ARRAY && kv->arr_type == GGUF_VT_STRING && kv->arr_n)
            fz_check(kv->arr_str && kv->arr_str[kv->arr_n - 1].len <= size, "string array");
    }
    for (uint64_t i = 0; i < f->n_tensors; i++) fz_check(f->tensors[i].name != NULL, "tensor without a name");
    flm_gguf_close(f);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    partial(data, size);
    flm_gguf_file *f = NULL;
    flm_error err;
    if (flm_gguf_open_buffer("fuzz.gguf", data, size, &f, &err) != FLM_OK) {
        fz_check(err.msg[0] != 0, "an error without a message");
        return 0;
    }
    /* every getter on every key: any type, any value */
    for (uint64_t i = 0; i < f->n_kv; i++) {
        uint32_t u;
        float x;
        char *s = NULL;
        const flm_gguf_kv *kv;
        (void)flm_gguf_get_u32(f, f->kv[i].key, true, &u, &err);
        (void)flm_gguf_get_f32(f, f->kv[i].key, true, &x, &err);
        if (flm_gguf_get_str(f, f->kv[i].key, true, &s, &err) == FLM_OK) free(s);
        (void)flm_gguf_get_arr(f, f->kv[i].key, GGUF_VT_STRING, true, &kv, &err);
    }
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const flm_gguf_tensor *t = &f->tensors[i];
        fz_check(t->data >= f->map && t->data + t->nbytes <= f->map + f->size, "tensor %llu outside the file",
                 (unsigned long long)i);
        fz_check(flm_gguf_find_tensor(f, t->name) == t, "duplicate tensor name");
    }
    flm_hparams hp;
    (void)flm_hparams_from_gguf(f, &hp, &err);
    flm_tokenizer *tok = NULL;
    if (flm_tokenizer_from_gguf(f, &tok, &err) == FLM_OK) {
        use_tokenizer(tok);
        flm_tokenizer_free(tok);
    }
    const flm_gguf_kv *ct = flm_gguf_find_kv(f, "tokenizer.chat_template");
    if (ct && ct->type == GGUF_VT_STRING) {
        flm_chat_template t;
        if (flm_chat_template_init(&t, NULL, ct->v.str.data, (size_t)ct->v.str.len, "llama", &err) == FLM_OK) {
            flm_chat_msg m = {"user", "hi"};
            char *out = NULL;
            if (flm_chat_render(&t, &m, 1, true, &out, NULL, &err) == FLM_OK) free(out);
        }
        flm_chat_template_free(&t);
    }
    flm_model *m = NULL;
    if (flm_model_from_gguf(f, &m, &err) == FLM_OK) { /* takes f, closes it on error */
        fz_check(m->hp.n_layers > 0 && m->layers, "a model without layers");
        use_tokenizer(m->tok);
        flm_model_free(m);
    }
    return 0;
}
