/* text.c — the public API's access to the model's text side: the vocabulary (flm_vocab_size, flm_token_text,
 * flm_add_bos), its chat template (flm_chat_*: src/format/chat_template.h chosen from the model's metadata), and text
 * files read as a stream of tokens (flm_text_stream_*, flm_tokenize_file: calibrate's and perplexity's texts). */
#include <errno.h>
#include <stdio.h>
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

const char *flm_chat_format_of(const char *tmpl, size_t len) {
    const flm_chat_format f = flm_chat_detect(tmpl, len);
    return f == FLM_CHAT_UNKNOWN ? NULL : flm_chat_format_name(f);
}

const char *flm_chat_name(const flm_chat *c) { return c ? flm_chat_format_name(c->t.format) : "unknown"; }
const char *flm_chat_origin(const flm_chat *c) { return c && c->t.origin ? c->t.origin : ""; }
const char *flm_chat_system_prompt(const flm_chat *c) { return c ? c->t.default_system : NULL; }

flm_status flm_chat_apply(const flm_chat *c, const flm_chat_msg *msgs, size_t n, bool add_assistant, char **out,
                          size_t *out_len, flm_error *err) {
    if (!c || !out) return flm_fail(err, FLM_ERR_ARG, "flm_chat_apply: NULL template or output");
    if (!add_assistant || n == 0 || !msgs || !msgs[n - 1].role || strcmp(msgs[n - 1].role, "assistant") ||
        !msgs[n - 1].content)
        return flm_chat_render(&c->t, msgs, n, add_assistant, out, out_len, err);
    /* a final assistant message is a prefill (llama-server's): the turns before it with the assistant's opening, then
     * its content left open, so that generation continues it */
    char *head = NULL;
    size_t hl = 0, cl = strlen(msgs[n - 1].content);
    flm_status st = flm_chat_render(&c->t, msgs, n - 1, true, &head, &hl, err);
    if (st) return st;
    char *all = realloc(head, hl + cl + 1);
    if (!all) {
        free(head);
        return flm_fail(err, FLM_ERR_NOMEM, "out of memory rendering a chat");
    }
    memcpy(all + hl, msgs[n - 1].content, cl + 1);
    *out = all;
    if (out_len) *out_len = hl + cl;
    return FLM_OK;
}

const char *flm_chat_tool_format(const flm_chat *c) {
    return c && c->t.tools == FLM_CHAT_TOOLS_QWEN ? "qwen" : NULL;
}

bool flm_chat_tool_tags(const flm_chat *c, const char **open_tag, const char **close_tag) {
    const bool on = c && c->t.tools == FLM_CHAT_TOOLS_QWEN;
    if (open_tag) *open_tag = on ? "<tool_call>" : NULL;
    if (close_tag) *close_tag = on ? "</tool_call>" : NULL;
    return on;
}

flm_status flm_chat_tools_messages(const flm_chat *c, const flm_chat_msg *msgs, const char *const *tool_calls,
                                   size_t n, const char *tools, flm_chat_msg **out, size_t *n_out, flm_error *err) {
    if (!c || !out || !n_out || (n && !msgs)) return flm_fail(err, FLM_ERR_ARG, "flm_chat_tools_messages: NULL argument");
    return flm_chat_tools_rewrite(&c->t, c->t.tools, msgs, tool_calls, n, tools, out, n_out, err);
}

void flm_chat_msgs_free(flm_chat_msg *m, size_t n) { flm_chat_tools_msgs_free(m, n); }

flm_status flm_chat_parse_tool_calls(const flm_chat *c, const char *text, size_t len, char **content,
                                     flm_tool_call **calls, size_t *n_calls, flm_error *err) {
    if (!c || (!text && len) || !content || !calls || !n_calls)
        return flm_fail(err, FLM_ERR_ARG, "flm_chat_parse_tool_calls: NULL argument");
    return flm_chat_tools_parse(c->t.tools, text ? text : "", len, content, calls, n_calls, err);
}

void flm_tool_calls_free(flm_tool_call *calls, size_t n) { flm_chat_tools_calls_free(calls, n); }

/* The marker that stands for message i's content in the skeleton rendering (no whitespace: trimming keeps it). */
#define SPAN_MARK_FMT "\x01\x02" "flm%zu\x03"

flm_status flm_chat_apply_spans(const flm_chat *c, const flm_chat_msg *msgs, size_t n, bool add_assistant, char **out,
                                size_t *out_len, size_t **spans, size_t *n_spans, flm_error *err) {
    *spans = NULL;
    *n_spans = 0;
    size_t len = 0;
    flm_status st = flm_chat_apply(c, msgs, n, add_assistant, out, &len, err);
    if (out_len) *out_len = len;
    if (st || n == 0) return st;
    flm_chat_msg *mk = calloc(n, sizeof *mk);
    char *marks = malloc(n * 32), *skel = NULL;
    size_t *sp = malloc(2 * n * sizeof *sp), slen = 0;
    if (!mk || !marks || !sp) goto oom;
    for (size_t i = 0; i < n; i++) {
        mk[i].role = msgs[i].role;
        snprintf(marks + 32 * i, 32, SPAN_MARK_FMT, i);
        mk[i].content = marks + 32 * i;
    }
    if ((st = flm_chat_apply(c, mk, n, add_assistant, &skel, &slen, err))) goto done;
    /* align: skel = L0 M(i0) L1 M(i1) ... and text = L0 C(i0) L1 C(i1) ..., C a content as it is or trimmed */
    const char *text = *out;
    size_t ps = 0, pt = 0, k = 0;
    for (;;) {
        const char *m = memmem(skel + ps, slen - ps, "\x01\x02" "flm", 5);
        size_t lit = m ? (size_t)(m - (skel + ps)) : slen - ps;
        if (pt + lit > len || memcmp(text + pt, skel + ps, lit)) break;
        pt += lit;
        if (!m) break;
        char *end;
        size_t i = strtoul(m + 5, &end, 10);
        if (i >= n || *end != '\x03') break;
        ps = (size_t)(end + 1 - skel);
        const char *nm = memmem(skel + ps, slen - ps, "\x01\x02" "flm", 5);
        size_t nlit = nm ? (size_t)(nm - (skel + ps)) : slen - ps; /* the literal after it */
        const char *ct = msgs[i].content;
        size_t cl = strlen(ct), b = 0, e = cl;
        while (b < e && (ct[b] == ' ' || (ct[b] >= '\t' && ct[b] <= '\r'))) b++;
        while (e > b && (ct[e - 1] == ' ' || (ct[e - 1] >= '\t' && ct[e - 1] <= '\r'))) e--;
        const size_t cand[4][2] = {{0, cl}, {b, e}, {b, cl}, {0, e}}; /* as it is, trimmed, either end */
        bool found = false;
        for (int q = 0; q < 4 && !found; q++) {
            size_t cb = cand[q][0], ce = cand[q][1], w = ce - cb;
            if (pt + w + nlit <= len && !memcmp(text + pt, ct + cb, w) && !memcmp(text + pt + w, skel + ps, nlit)) {
                if (w) { sp[2 * k] = pt; sp[2 * k + 1] = pt + w; k++; }
                pt += w;
                found = true;
            }
        }
        if (!found) break; /* rewritten: no range for it or the contents after it */
    }
    *spans = k ? sp : NULL;
    *n_spans = k;
    if (k) sp = NULL;
    goto done;
oom:
    st = flm_fail(err, FLM_ERR_NOMEM, "out of memory rendering a chat");
    free(*out);
    *out = NULL;
done:
    free(mk);
    free(marks);
    free(skel);
    free(sp);
    return st;
}

void flm_chat_close(flm_chat *c) {
    if (!c) return;
    flm_chat_template_free(&c->t);
    free(c);
}

/* ---- text files as a stream of tokens ------------------------------------------------------------------------ */

#define TEXT_PIECE (256u << 10) /* bytes tokenized at a time */

struct flm_text_stream {
    const flm_ctx *ctx;
    FILE *f;
    bool own, eof, first, add_eos;
    unsigned flags;         /* the model's special-token flags (FLM_TOKENIZE_ADD_BOS / _ADD_EOS), or 0 */
    char path[1024];
    char *buf;              /* TEXT_PIECE bytes: [0, have) read, not yet tokenized */
    size_t have;
    uint64_t offset;        /* bytes of the file before buf[0] */
    int32_t *ids;           /* tokens of the last piece not handed out yet: ids[pos, n) */
    size_t n, pos, cap;
};

flm_status flm_text_stream_open(const flm_ctx *ctx, const char *path, bool add_bos, flm_text_stream **out,
                                flm_error *err) {
    *out = NULL;
    if (!ctx || !path) return flm_fail(err, FLM_ERR_ARG, "flm_text_stream_open: NULL argument");
    flm_text_stream *s = calloc(1, sizeof *s);
    if (!s || !(s->buf = malloc(TEXT_PIECE))) {
        free(s);
        return flm_fail(err, FLM_ERR_NOMEM, "%s: out of memory", path);
    }
    snprintf(s->path, sizeof s->path, "%s", strcmp(path, "-") ? path : "(standard input)");
    s->own = strcmp(path, "-") != 0;
    s->f = s->own ? fopen(path, "rb") : stdin;
    if (!s->f) {
        int e = errno;
        free(s->buf);
        free(s);
        return flm_fail(err, FLM_ERR_IO, "%s: cannot open the text: %s", path, strerror(e));
    }
    s->ctx = ctx;
    s->first = true;
    s->flags = add_bos ? flm_tokenizer_special_flags(ctx->model->tok) : 0u;
    s->add_eos = s->flags & FLM_TOKENIZE_ADD_EOS;
    *out = s;
    return FLM_OK;
}

void flm_text_stream_close(flm_text_stream *s) {
    if (!s) return;
    if (s->own && s->f) fclose(s->f);
    free(s->buf);
    free(s->ids);
    free(s);
}

/* Where to cut buf[0, n) (a full piece): after its last newline, else its last space, else at a UTF-8 character
 * boundary; returns the bytes to tokenize now. */
static size_t piece_cut(const char *b, size_t n) {
    for (size_t i = n; i > n / 2; i--)
        if (b[i - 1] == '\n') return i;
    for (size_t i = n; i > n / 2; i--)
        if (b[i - 1] == ' ') return i;
    size_t i = n;
    for (int k = 0; k < 3 && i > 0 && ((unsigned char)b[i - 1] & 0xc0) == 0x80; k++) i--; /* continuation bytes */
    if (i > 0 && (unsigned char)b[i - 1] >= 0xc0) i--; /* the lead byte of a character cut short */
    return i ? i : n;
}

/* Read and tokenize the next piece into s->ids. */
static flm_status next_piece(flm_text_stream *s, flm_error *err) {
    while (!s->eof && s->have < TEXT_PIECE) {
        size_t got = fread(s->buf + s->have, 1, TEXT_PIECE - s->have, s->f);
        if (got == 0) {
            if (ferror(s->f)) return flm_fail(err, FLM_ERR_IO, "%s: cannot read the text: %s", s->path, strerror(errno));
            s->eof = true;
        }
        const char *nul = memchr(s->buf + s->have, 0, got);
        if (nul)
            return flm_fail(err, FLM_ERR_FORMAT, "%s: a NUL byte at offset %llu: not a text file", s->path,
                            (unsigned long long)(s->offset + (size_t)(nul - s->buf)));
        s->have += got;
    }
    size_t take = s->eof ? s->have : piece_cut(s->buf, s->have);
    unsigned f = (s->first ? s->flags & FLM_TOKENIZE_ADD_BOS : 0u) | (s->eof && s->add_eos ? FLM_TOKENIZE_ADD_EOS : 0u);
    s->first = false;
    if (s->eof) s->add_eos = false;
    size_t need = flm_tokenizer_encode_ex(s->ctx->model->tok, s->buf, take, f, s->ids, s->cap);
    if (need != SIZE_MAX && need > s->cap) { /* byte fallback can give several tokens per byte */
        int32_t *more = realloc(s->ids, need * sizeof *more);
        if (!more) need = SIZE_MAX;
        else {
            s->ids = more;
            s->cap = need;
            need = flm_tokenizer_encode_ex(s->ctx->model->tok, s->buf, take, f, s->ids, s->cap);
        }
    }
    if (need == SIZE_MAX) return flm_fail(err, FLM_ERR_NOMEM, "%s: out of memory tokenizing the text", s->path);
    s->n = need;
    s->pos = 0;
    memmove(s->buf, s->buf + take, s->have - take);
    s->have -= take;
    s->offset += take;
    return FLM_OK;
}

flm_status flm_text_stream_read(flm_text_stream *s, int32_t *ids, size_t cap, size_t *n, flm_error *err) {
    *n = 0;
    while (*n < cap) {
        if (s->pos == s->n) {
            if (s->eof && !s->have && !s->add_eos && !s->first) break;
            flm_status st = next_piece(s, err);
            if (st) return st;
            continue;
        }
        size_t k = s->n - s->pos < cap - *n ? s->n - s->pos : cap - *n;
        memcpy(ids + *n, s->ids + s->pos, k * sizeof *ids);
        s->pos += k;
        *n += k;
    }
    return FLM_OK;
}

flm_status flm_tokenize_file(const flm_ctx *ctx, const char *path, bool add_bos, size_t max, int32_t **ids, size_t *n,
                             flm_error *err) {
    *ids = NULL;
    *n = 0;
    flm_text_stream *s = NULL;
    flm_status st = flm_text_stream_open(ctx, path, add_bos, &s, err);
    if (st) return st;
    size_t cap = 0, len = 0;
    int32_t *v = NULL;
    for (;;) {
        size_t want = max ? max - len : 1u << 16, got = 0;
        if (!want) break;
        if (len + want > cap) {
            size_t nc = max ? max : (cap ? cap * 2 : want);
            if (nc < len + want) nc = len + want;
            int32_t *more = realloc(v, nc * sizeof *more);
            if (!more) { st = flm_fail(err, FLM_ERR_NOMEM, "%s: out of memory for its tokens", path); break; }
            v = more;
            cap = nc;
        }
        if ((st = flm_text_stream_read(s, v + len, want, &got, err))) break;
        len += got;
        if (got < want) break;
    }
    flm_text_stream_close(s);
    if (st) { free(v); return st; }
    if (!v) v = malloc(sizeof *v); /* an empty text: a valid, empty array */
    if (!v) return flm_fail(err, FLM_ERR_NOMEM, "%s: out of memory", path);
    *ids = v;
    *n = len;
    return FLM_OK;
}
