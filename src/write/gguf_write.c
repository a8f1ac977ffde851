/* gguf_write.c — the GGUF v3 writer (write/gguf_write.h): `flashlm synth`, `convert` (a Hugging Face folder, the .flm
 * resident region) and tests. The tools tier's: the runtime only reads GGUF (format/gguf.c). */
#include "write/gguf_write.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/types.h"
#include "core/error.h"
#include "core/files.h"
#include "flashlm_tools.h" /* the checked writer (write/out.c) */
#include "core/util.h"

#define GGUF_DEFAULT_ALIGNMENT 32

typedef unsigned long long ull; /* for printf: uint64_t may be long or long long */

/* the n <= 8 low bytes of v, little-endian, at b (n above 8 writes 8: a uint64_t has no more) */
static void put_le(uint8_t *b, uint64_t v, size_t n) {
    for (size_t i = 0; i < n && i < sizeof v; i++, v >>= 8) b[i] = (uint8_t)v;
}

/* ---------------------------------------------------------------------------------------------------------------
 * Writer
 * ------------------------------------------------------------------------------------------------------------- */

enum { W_BUILD, W_BEGUN, W_DONE, W_FAILED };

typedef struct wtensor {
    char *name;
    uint32_t type, n_dims;
    uint64_t ne[4], nbytes, offset;
} wtensor;

struct flm_gguf_writer {
    char *path, *tmp;
    FILE *fp;
    flm_out *out;            /* the checked writer (write/out.c) behind fp and tmp */
    flm_gguf_write_fn write; /* stream writer: every byte goes to write(user, ...); fp and tmp stay NULL */
    void *user;
    int state;
    flm_error err;          /* first error of the kv/tensor adders, reported by begin() */
    uint8_t *kv;            /* serialized KVs */
    uint64_t kv_len, kv_cap, n_kv;
    char **keys;
    uint64_t keys_cap;
    wtensor *t;
    uint64_t n_t, t_cap;
    uint64_t next;          /* next tensor to write */
    uint64_t pos;           /* bytes written to the file */
};

static flm_status w_note(flm_gguf_writer *w, flm_status st, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/* Remember the first adder error (reported by begin()) and return st. */
static flm_status w_note(flm_gguf_writer *w, flm_status st, const char *fmt, ...) {
    if (w->err.code == FLM_OK) {
        int n = snprintf(w->err.msg, sizeof w->err.msg, "%s: ", w->path);
        va_list ap;
        va_start(ap, fmt);
        if (n > 0 && (size_t)n < sizeof w->err.msg) vsnprintf(w->err.msg + n, sizeof w->err.msg - (size_t)n, fmt, ap);
        va_end(ap);
        w->err.code = st;
    }
    return st;
}

/* Close and remove the temporary file; the writer is then failed. Returns st. */
static flm_status w_abort(flm_gguf_writer *w, flm_status st) {
    if (w->out) { /* closes fp, removes the temporary and the lock */
        flm_out_abort(w->out);
        w->out = NULL;
        w->fp = NULL;
    }
    w->state = W_FAILED;
    return st;
}

static bool w_put(flm_gguf_writer *w, const void *p, size_t n) {
    if (n == 0) return true;
    if (!flm_gguf_grow((void **)&w->kv, &w->kv_cap, w->kv_len + n, UINT64_MAX, 1)) return false;
    memcpy(w->kv + w->kv_len, p, n);
    w->kv_len += n;
    return true;
}

static bool w_put_uint(flm_gguf_writer *w, uint64_t v, size_t n) {
    uint8_t b[8];
    if (n > sizeof b) return false;
    put_le(b, v, n);
    return w_put(w, b, n);
}

static bool w_put_strn(flm_gguf_writer *w, const char *s, size_t n) { return w_put_uint(w, n, 8) && w_put(w, s, n); }

static bool w_put_str(flm_gguf_writer *w, const char *s) { return w_put_strn(w, s, strlen(s)); }

/* Validate the key and write it with the value type; the caller writes the value. */
static flm_status w_key(flm_gguf_writer *w, const char *key, uint32_t type) {
    if (!w) return FLM_ERR_ARG;
    if (w->state != W_BUILD) return w_note(w, FLM_ERR_ARG, "kv '%s' added after flm_gguf_writer_begin()", key ? key : "");
    if (!key || !*key) return w_note(w, FLM_ERR_ARG, "kv %llu: empty key", (ull)w->n_kv);
    if (strcmp(key, "general.alignment") == 0 && type != GGUF_VT_UINT32)
        return w_note(w, FLM_ERR_ARG, "kv 'general.alignment': must be a u32 (and 32: the writer aligns to 32)");
    for (uint64_t i = 0; i < w->n_kv; i++)
        if (strcmp(w->keys[i], key) == 0) return w_note(w, FLM_ERR_ARG, "kv '%s': duplicate key", key);
    if (!flm_gguf_grow((void **)&w->keys, &w->keys_cap, w->n_kv + 1, UINT64_MAX, sizeof *w->keys) ||
        !(w->keys[w->n_kv] = strndup(key, strlen(key))) || !w_put_str(w, key) || !w_put_uint(w, type, 4))
        return w_note(w, FLM_ERR_NOMEM, "kv '%s': out of memory", key);
    w->n_kv++;
    return FLM_OK;
}

flm_status flm_gguf_writer_create(const char *path, unsigned out_flags, flm_gguf_writer **out, flm_error *err) {
    *out = NULL;
    flm_gguf_writer *w = calloc(1, sizeof *w);
    size_t n = strlen(path);
    if (!w || !(w->path = strndup(path, n))) {
        flm_gguf_writer_free(w);
        return flm_fail(err, FLM_ERR_NOMEM, "%s: out of memory", path);
    }
    /* the checked writer: refuses a link or a non-regular file, locks path, a unique temporary */
    flm_status st = flm_out_open(path, NULL, out_flags & FLM_OUT_REPLACE, &w->out, err);
    if (!st && !(w->fp = flm_out_stream(w->out))) st = flm_fail(err, FLM_ERR_NOMEM, "%s: out of memory", path);
    if (!st && !(w->tmp = strndup(flm_out_temp(w->out), strlen(flm_out_temp(w->out)))))
        st = flm_fail(err, FLM_ERR_NOMEM, "%s: out of memory", path);
    if (st) {
        flm_gguf_writer_free(w);
        return st;
    }
    *out = w;
    return FLM_OK;
}

flm_status flm_gguf_writer_create_stream(const char *name, flm_gguf_write_fn write, void *user, flm_gguf_writer **out,
                                         flm_error *err) {
    *out = NULL;
    if (!name || !write) return flm_fail(err, FLM_ERR_ARG, "flm_gguf_writer_create_stream: NULL name or write");
    flm_gguf_writer *w = calloc(1, sizeof *w);
    if (!w || !(w->path = strndup(name, strlen(name)))) {
        free(w);
        return flm_fail(err, FLM_ERR_NOMEM, "%s: out of memory", name);
    }
    w->write = write;
    w->user = user;
    *out = w;
    return FLM_OK;
}

flm_status flm_gguf_writer_kv_u32(flm_gguf_writer *w, const char *key, uint32_t v) {
    if (w && key && strcmp(key, "general.alignment") == 0 && v != GGUF_DEFAULT_ALIGNMENT)
        return w_note(w, FLM_ERR_ARG, "kv 'general.alignment': %u is not supported: the writer aligns to 32", v);
    flm_status st = w_key(w, key, GGUF_VT_UINT32);
    if (st == FLM_OK && !w_put_uint(w, v, 4)) st = w_note(w, FLM_ERR_NOMEM, "kv '%s': out of memory", key);
    return st;
}

flm_status flm_gguf_writer_kv_bool(flm_gguf_writer *w, const char *key, bool v) {
    flm_status st = w_key(w, key, GGUF_VT_BOOL);
    const uint8_t b = v ? 1 : 0;
    if (st == FLM_OK && !w_put(w, &b, 1)) st = w_note(w, FLM_ERR_NOMEM, "kv '%s': out of memory", key);
    return st;
}

flm_status flm_gguf_writer_kv_f32(flm_gguf_writer *w, const char *key, float v) {
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    flm_status st = w_key(w, key, GGUF_VT_FLOAT32);
    if (st == FLM_OK && !w_put_uint(w, u, 4)) st = w_note(w, FLM_ERR_NOMEM, "kv '%s': out of memory", key);
    return st;
}

flm_status flm_gguf_writer_kv_str(flm_gguf_writer *w, const char *key, const char *v) {
    flm_status st = w_key(w, key, GGUF_VT_STRING);
    if (st == FLM_OK && !w_put_str(w, v ? v : "")) st = w_note(w, FLM_ERR_NOMEM, "kv '%s': out of memory", key);
    return st;
}

flm_status flm_gguf_writer_kv_arr(flm_gguf_writer *w, const char *key, uint32_t elem_type, const void *data, uint64_t n) {
    if (!w) return FLM_ERR_ARG;
    const char *k = key ? key : "";
    size_t es = flm_gguf_vt_size(elem_type);
    if (elem_type != GGUF_VT_STRING && es == 0)
        return w_note(w, FLM_ERR_ARG, "kv '%s': bad array element type %u", k, elem_type);
    if (n > 0 && !data) return w_note(w, FLM_ERR_ARG, "kv '%s': NULL array data", k);
    if (elem_type != GGUF_VT_STRING && n > SIZE_MAX / es)
        return w_note(w, FLM_ERR_ARG, "kv '%s': array of %llu elements is too large", k, (ull)n);
    for (uint64_t i = 0; elem_type == GGUF_VT_BOOL && i < n; i++)
        if (((const uint8_t *)data)[i] > 1)
            return w_note(w, FLM_ERR_ARG, "kv '%s': element %llu: bool value is not 0 or 1", k, (ull)i);
    flm_status st = w_key(w, key, GGUF_VT_ARRAY);
    if (st != FLM_OK) return st;
    bool ok = w_put_uint(w, elem_type, 4) && w_put_uint(w, n, 8);
    if (elem_type == GGUF_VT_STRING) {
        const char *const *s = data;
        for (uint64_t i = 0; ok && i < n; i++) ok = w_put_str(w, s[i] ? s[i] : "");
    } else if (ok) {
        /* raw elements, converted to little-endian (a no-op copy on little-endian hosts) */
        const uint8_t *p = data;
        for (uint64_t i = 0; ok && i < n; i++) {
            uint64_t v = 0;
            memcpy(&v, p + i * es, es); /* host-endian value in the low bytes on LE hosts */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
            v >>= 8 * (8 - es);
#endif
            ok = w_put_uint(w, v, es);
        }
    }
    return ok ? FLM_OK : w_note(w, FLM_ERR_NOMEM, "kv '%s': out of memory", key);
}

flm_status flm_gguf_writer_kv_copy(flm_gguf_writer *w, const flm_gguf_kv *kv) {
    if (!w) return FLM_ERR_ARG;
    if (!kv || !kv->key) return w_note(w, FLM_ERR_ARG, "kv_copy: NULL kv");
    if (strcmp(kv->key, "general.alignment") == 0) return FLM_OK;
    bool arr = kv->type == GGUF_VT_ARRAY;
    uint32_t t = arr ? kv->arr_type : kv->type;
    size_t es = flm_gguf_vt_size(t);
    if (t != GGUF_VT_STRING && es == 0) return w_note(w, FLM_ERR_ARG, "kv '%s': bad value type %u", kv->key, t);
    flm_status st = w_key(w, kv->key, kv->type);
    if (st != FLM_OK) return st;
    bool ok = true;
    if (arr) {
        ok = w_put_uint(w, t, 4) && w_put_uint(w, kv->arr_n, 8);
        if (t == GGUF_VT_STRING)
            for (uint64_t i = 0; ok && i < kv->arr_n; i++)
                ok = w_put_strn(w, kv->arr_str[i].data, (size_t)kv->arr_str[i].len);
        else if (ok)
            ok = w_put(w, kv->arr_data, (size_t)(kv->arr_n * es)); /* already little-endian */
    } else if (t == GGUF_VT_STRING) {
        ok = w_put_strn(w, kv->v.str.data, (size_t)kv->v.str.len);
    } else if (t == GGUF_VT_FLOAT32 || t == GGUF_VT_FLOAT64) {
        float f = (float)kv->v.f64;
        uint32_t u32;
        uint64_t u64;
        memcpy(&u32, &f, 4);
        memcpy(&u64, &kv->v.f64, 8);
        ok = t == GGUF_VT_FLOAT32 ? w_put_uint(w, u32, 4) : w_put_uint(w, u64, 8);
    } else { /* integers and bool: two's complement bits of the widened value, truncated */
        ok = w_put_uint(w, flm_gguf_vt_is_signed(t) ? (uint64_t)kv->v.i64 : kv->v.u64, es);
    }
    return ok ? FLM_OK : w_note(w, FLM_ERR_NOMEM, "kv '%s': out of memory", kv->key);
}

flm_status flm_gguf_writer_add_tensor(flm_gguf_writer *w, const char *name, uint32_t type, uint32_t n_dims,
                                  const uint64_t *ne) {
    if (!w) return FLM_ERR_ARG;
    if (!name || !*name) return w_note(w, FLM_ERR_ARG, "tensor %llu: empty name", (ull)w->n_t);
    if (w->state != W_BUILD) return w_note(w, FLM_ERR_ARG, "tensor '%s' added after flm_gguf_writer_begin()", name);
    if (!flm_type_supported(type))
        return w_note(w, FLM_ERR_UNSUPPORTED, "tensor '%s': unsupported type %u%s%s%s", name, type,
                      flm_type_name(type) ? " (" : "", flm_type_name(type) ? flm_type_name(type) : "",
                      flm_type_name(type) ? ")" : "");
    if (n_dims < 1 || n_dims > 4 || !ne)
        return w_note(w, FLM_ERR_ARG, "tensor '%s': %u dimensions (must be 1..4)", name, n_dims);
    wtensor t = {.type = type, .n_dims = n_dims, .ne = {1, 1, 1, 1}};
    uint64_t n = 1;
    for (uint32_t d = 0; d < n_dims; d++) {
        if (ne[d] == 0 || ne[d] > UINT64_MAX / n)
            return w_note(w, FLM_ERR_ARG, "tensor '%s': bad ne[%u] = %llu", name, d, (ull)ne[d]);
        n *= (t.ne[d] = ne[d]);
    }
    uint64_t row = flm_row_bytes(type, ne[0]), rows = n / ne[0];
    if (row == 0 || rows > UINT64_MAX / row / 2)
        return w_note(w, FLM_ERR_ARG, "tensor '%s': ne[0] = %llu is not a multiple of the %s block size, or the "
                      "size overflows", name, (ull)ne[0], flm_type_name(type));
    t.nbytes = row * rows;
    for (uint64_t i = 0; i < w->n_t; i++)
        if (strcmp(w->t[i].name, name) == 0) return w_note(w, FLM_ERR_ARG, "tensor '%s': duplicate name", name);
    if (!flm_gguf_grow((void **)&w->t, &w->t_cap, w->n_t + 1, UINT64_MAX, sizeof *w->t) ||
        !(t.name = strndup(name, strlen(name))))
        return w_note(w, FLM_ERR_NOMEM, "tensor '%s': out of memory", name);
    w->t[w->n_t++] = t;
    return FLM_OK;
}

/* Write n bytes to the file (data, or zeros when p is NULL). */
static flm_status w_write(flm_gguf_writer *w, const void *p, uint64_t n, flm_error *err) {
    static const uint8_t zeros[GGUF_DEFAULT_ALIGNMENT];
    if (w->write) {
        flm_status st = w->write(w->user, p ? p : zeros, (size_t)n, err);
        if (st) return w_abort(w, st);
        w->pos += n;
        return FLM_OK;
    }
    if (p ? fwrite(p, 1, (size_t)n, w->fp) != n : fwrite(zeros, 1, (size_t)n, w->fp) != n)
        return w_abort(w, flm_fail(err, FLM_ERR_IO, "%s: write failed: %s", w->tmp, strerror(errno)));
    w->pos += n;
    return FLM_OK;
}

static flm_status w_pad(flm_gguf_writer *w, flm_error *err) {
    uint64_t pad = (GGUF_DEFAULT_ALIGNMENT - w->pos % GGUF_DEFAULT_ALIGNMENT) % GGUF_DEFAULT_ALIGNMENT;
    return pad ? w_write(w, NULL, pad, err) : FLM_OK;
}

flm_status flm_gguf_writer_begin(flm_gguf_writer *w, flm_error *err) {
    if (!w) return flm_fail(err, FLM_ERR_ARG, "flm_gguf_writer_begin: NULL writer");
    if (w->err.code != FLM_OK) {
        if (err) *err = w->err;
        return w_abort(w, w->err.code);
    }
    if (w->state != W_BUILD) return w_abort(w, flm_fail(err, FLM_ERR_ARG, "%s: begin called twice", w->path));
    uint8_t hdr[24];
    memcpy(hdr, "GGUF", 4);
    put_le(hdr + 4, 3, 4);
    put_le(hdr + 8, w->n_t, 8);
    put_le(hdr + 16, w->n_kv, 8);
    flm_status st = w_write(w, hdr, sizeof hdr, err);
    if (st == FLM_OK) st = w_write(w, w->kv, w->kv_len, err);
    uint64_t off = 0;
    for (uint64_t i = 0; st == FLM_OK && i < w->n_t; i++) {
        wtensor *t = &w->t[i];
        uint8_t b[8 + 4 + 8 * 4 + 4 + 8];
        size_t len = strlen(t->name), k;
        t->offset = off;
        off += flm_align_up(t->nbytes, GGUF_DEFAULT_ALIGNMENT);
        put_le(b, len, 8);
        if ((st = w_write(w, b, 8, err)) != FLM_OK || (st = w_write(w, t->name, len, err)) != FLM_OK) break;
        put_le(b, t->n_dims, 4);
        k = 4;
        for (uint32_t d = 0; d < t->n_dims; d++, k += 8) put_le(b + k, t->ne[d], 8);
        put_le(b + k, t->type, 4);
        put_le(b + k + 4, t->offset, 8);
        st = w_write(w, b, k + 12, err);
    }
    if (st == FLM_OK) st = w_pad(w, err);
    if (st == FLM_OK) w->state = W_BEGUN;
    return st;
}

flm_status flm_gguf_writer_write_tensor(flm_gguf_writer *w, const void *data, uint64_t nbytes, flm_error *err) {
    if (!w) return flm_fail(err, FLM_ERR_ARG, "flm_gguf_writer_write_tensor: NULL writer");
    if (w->state != W_BEGUN)
        return w_abort(w, flm_fail(err, FLM_ERR_ARG, "%s: write_tensor outside begin..finish", w->path));
    if (w->next >= w->n_t)
        return w_abort(w, flm_fail(err, FLM_ERR_ARG, "%s: more tensors written than the %llu added", w->path,
                                   (ull)w->n_t));
    const wtensor *t = &w->t[w->next];
    if (nbytes != t->nbytes || (nbytes && !data))
        return w_abort(w, flm_fail(err, FLM_ERR_ARG, "%s: tensor %llu '%s': %llu bytes given, %llu expected",
                                   w->path, (ull)w->next, t->name, (ull)nbytes, (ull)t->nbytes));
    flm_status st = w_write(w, data, nbytes, err);
    if (st == FLM_OK) st = w_pad(w, err);
    if (st == FLM_OK) w->next++;
    return st;
}

flm_status flm_gguf_writer_finish(flm_gguf_writer *w, flm_error *err) {
    if (!w) return flm_fail(err, FLM_ERR_ARG, "flm_gguf_writer_finish: NULL writer");
    if (w->state != W_BEGUN) return w_abort(w, flm_fail(err, FLM_ERR_ARG, "%s: finish without begin", w->path));
    if (w->next != w->n_t)
        return w_abort(w, flm_fail(err, FLM_ERR_ARG, "%s: only %llu of %llu tensors written", w->path, (ull)w->next,
                                   (ull)w->n_t));
    flm_status st = w_pad(w, err);
    if (st != FLM_OK) return st;
    if (w->write) {
        w->state = W_DONE;
        return FLM_OK;
    }
    st = flm_out_commit(w->out, err); /* flush, fsync, close, rename, fsync the folder; frees out */
    w->out = NULL;
    w->fp = NULL;
    w->state = st ? W_FAILED : W_DONE;
    return st;
}

void flm_gguf_writer_free(flm_gguf_writer *w) {
    if (!w) return;
    if (w->state != W_DONE) w_abort(w, FLM_OK);
    for (uint64_t i = 0; i < w->n_kv; i++) free(w->keys[i]);
    for (uint64_t i = 0; i < w->n_t; i++) free(w->t[i].name);
    free(w->keys);
    free(w->t);
    free(w->kv);
    free(w->path);
    free(w->tmp);
    free(w);
}
