/* text.c — the public API's access to the model's text side: the vocabulary (flm_vocab_size, flm_token_text,
 * flm_add_bos) and its chat template (flm_chat_*: src/format/chat_template.h chosen from the model's metadata). */
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "format/chat_template.h"
#include "format/gguf.h"
#include "format/tokenizer.h"
#include "runtime/runtime.h"

struct flm_chat {
    flm_chat_template t;
};

uint32_t flm_vocab_size(const flm_ctx *ctx) { return ctx ? flm_tokenizer_n_vocab(ctx->model->tok) : 0; }

const char *flm_token_text(const flm_ctx *ctx, int32_t id) {
    return ctx ? flm_tokenizer_vocab(ctx->model->tok, id) : "";
}

bool flm_add_bos(const flm_ctx *ctx) { return ctx && flm_tokenizer_wants_bos(ctx->model->tok); }

/* The GGUF metadata of an open context: the file's, or a .flm file's resident copy. */
static const flm_gguf_file *metadata(const flm_ctx *ctx) {
    if (ctx->model->gguf) return ctx->model->gguf;
    return ctx->flash && ctx->flash->file ? ctx->flash->file->meta : NULL;
}

bool flm_chat_name_valid(const char *name) { return name && flm_chat_format_parse(name) != FLM_CHAT_UNKNOWN; }

flm_status flm_chat_open(const flm_ctx *ctx, const char *name, flm_chat **out, flm_error *err) {
    if (out) *out = NULL;
    if (!ctx || !out) return flm_fail(err, FLM_ERR_ARG, "flm_chat_open: NULL context or output");
    const flm_gguf_file *meta = metadata(ctx);
    const flm_gguf_kv *kv = meta ? flm_gguf_find_kv(meta, "tokenizer.chat_template") : NULL;
    const char *src = NULL;
    size_t src_len = 0;
    if (kv && kv->type == GGUF_VT_STRING) {
        src = kv->v.str.data;
        src_len = (size_t)kv->v.str.len;
    }
    flm_chat *c = calloc(1, sizeof *c);
    if (!c) return flm_fail(err, FLM_ERR_NOMEM, "out of memory");
    flm_model_info info;
    flm_get_info(ctx, &info);
    flm_status st = flm_chat_template_init(&c->t, name, src, src_len, info.arch, err);
    if (st) {
        flm_chat_close(c);
        return st;
    }
    *out = c;
    return FLM_OK;
}

const char *flm_chat_name(const flm_chat *c) { return c ? flm_chat_format_name(c->t.format) : "unknown"; }
const char *flm_chat_origin(const flm_chat *c) { return c && c->t.origin ? c->t.origin : ""; }
const char *flm_chat_system_prompt(const flm_chat *c) { return c ? c->t.default_system : NULL; }

flm_status flm_chat_apply(const flm_chat *c, const flm_chat_msg *msgs, size_t n, bool add_assistant, char **out,
                          size_t *out_len, flm_error *err) {
    if (!c || !out) return flm_fail(err, FLM_ERR_ARG, "flm_chat_apply: NULL template or output");
    return flm_chat_render(&c->t, msgs, n, add_assistant, out, out_len, err);
}

void flm_chat_close(flm_chat *c) {
    if (!c) return;
    flm_chat_template_free(&c->t);
    free(c);
}
