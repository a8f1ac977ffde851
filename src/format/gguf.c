/* gguf.c — GGUF reader (v2/v3) and writer (v3). See gguf.h. */
#include "format/gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/types.h"
#include "core/error.h"
#include "core/files.h"
#include "core/util.h"

#define GGUF_DEFAULT_ALIGNMENT 32
#define GGUF_MIN_KV_BYTES 14     /* key length (8) + a 1-byte key + value type (4) + a 1-byte value */
#define GGUF_MIN_TENSOR_BYTES 33 /* name length (8) + 1-byte name + n_dims (4) + one ne (8) + type (4) + offset (8) */

typedef unsigned long long ull; /* for printf: uint64_t may be long or long long */

/* ---------------------------------------------------------------------------------------------------------------
 * Shared helpers
 * ------------------------------------------------------------------------------------------------------------- */

/* Byte size of a fixed-size value type; 0 for STRING, ARRAY and unknown types. */
static size_t vt_size(uint32_t t) {
    switch (t) {
    case GGUF_VT_UINT8: case GGUF_VT_INT8: case GGUF_VT_BOOL: return 1;
    case GGUF_VT_UINT16: case GGUF_VT_INT16: return 2;
    case GGUF_VT_UINT32: case GGUF_VT_INT32: case GGUF_VT_FLOAT32: return 4;
    case GGUF_VT_UINT64: case GGUF_VT_INT64: case GGUF_VT_FLOAT64: return 8;
    default: return 0;
    }
}

static const char *vt_name(uint32_t t) {
    static const char *const names[] = {"u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array",
                                        "u64", "i64", "f64"};
    return t < sizeof names / sizeof names[0] ? names[t] : "unknown";
}

static bool vt_is_signed(uint32_t t) {
    return t == GGUF_VT_INT8 || t == GGUF_VT_INT16 || t == GGUF_VT_INT32 || t == GGUF_VT_INT64;
}

static bool vt_is_int(uint32_t t) {
    return vt_is_signed(t) || t == GGUF_VT_UINT8 || t == GGUF_VT_UINT16 || t == GGUF_VT_UINT32 ||
           t == GGUF_VT_UINT64;
}

static uint64_t get_le(const uint8_t *b, size_t n) {
    uint64_t v = 0;
    for (size_t i = n; i-- > 0;) v = v << 8 | b[i];
    return v;
}

/* the n <= 8 low bytes of v, little-endian, at b (n above 8 writes 8: a uint64_t has no more) */
static void put_le(uint8_t *b, uint64_t v, size_t n) {
    for (size_t i = 0; i < n && i < sizeof v; i++, v >>= 8) b[i] = (uint8_t)v;
}

static char *dup_bytes(const char *s, size_t n) {
    char *p = malloc(n + 1);
    if (p) {
        memcpy(p, s, n);
        p[n] = '\0';
    }
    return p;
}

/* Grow *arr (elements of size elem) so that it holds at least need elements; doubling, capped at max. */
static bool grow(void **arr, uint64_t *cap, uint64_t need, uint64_t max, size_t elem) {
    if (need <= *cap) return true;
    uint64_t n = *cap ? *cap : 16;
    while (n < need) n = n > max / 2 ? max : n * 2;
    if (n > max) n = max;
    if (n > SIZE_MAX / elem) return false;
    void *p = realloc(*arr, (size_t)n * elem);
    if (!p) return false;
    memset((char *)p + (size_t)*cap * elem, 0, (size_t)(n - *cap) * elem);
    *arr = p;
    *cap = n;
    return true;
}

/* ---------------------------------------------------------------------------------------------------------------
 * Reader
 * ------------------------------------------------------------------------------------------------------------- */

typedef enum { MAP_BORROWED, MAP_MMAP, MAP_HEAP } map_kind;

typedef struct flm_gguf_file_impl {
    flm_gguf_file f;       /* first member: a flm_gguf_file * is a flm_gguf_file_impl * */
    map_kind kind;     /* who owns f.map */
} flm_gguf_file_impl;

/* A bounds-checked cursor over the file. ctx names the item being parsed ("header", "kv 3 'general.name'"). */
typedef struct rd {
    const uint8_t *p;
    uint64_t size, pos;
    uint64_t total;   /* bytes of the whole image: tensor data is checked against this; bytes [size, total) are not
                         in memory (flm_gguf_open_buffer_partial), so tensors there get data NULL */
    const char *path;
    flm_error *err;
    char ctx[160];
    uint64_t kv_done, t_done; /* entries parsed completely (flm_gguf_open_salvage keeps them) */
} rd;

static flm_status rd_fail(rd *r, flm_status code, const char *field, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 4, 5)))
#endif
    ;

static flm_status rd_fail(rd *r, flm_status code, const char *field, const char *fmt, ...) {
    char what[320];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return flm_fail(r->err, code, "%s: %s: %s%s%s", r->path, r->ctx, field ? field : "", field ? ": " : "", what);
}

static uint64_t rd_left(const rd *r) { return r->size - r->pos; }

static flm_status rd_need(rd *r, const char *field, uint64_t n) {
    if (n <= rd_left(r)) return FLM_OK;
    return rd_fail(r, FLM_ERR_FORMAT, field, "truncated: %llu bytes needed at offset %llu, file is %llu bytes",
                   (ull)n, (ull)r->pos, (ull)r->size);
}

static flm_status rd_uint(rd *r, const char *field, size_t n, uint64_t *v) {
    flm_status st = rd_need(r, field, n);
    if (st != FLM_OK) return st;
    *v = get_le(r->p + r->pos, n);
    r->pos += n;
    return FLM_OK;
}

static flm_status rd_u32(rd *r, const char *field, uint32_t *v) {
    uint64_t x = 0;
    flm_status st = rd_uint(r, field, 4, &x);
    *v = (uint32_t)x;
    return st;
}

static flm_status rd_str(rd *r, const char *field, flm_gguf_str *s) {
    uint64_t len;
    flm_status st = rd_uint(r, field, 8, &len);
    if (st != FLM_OK) return st;
    if (len > rd_left(r))
        return rd_fail(r, FLM_ERR_FORMAT, field, "string length %llu is impossible: only %llu bytes remain in the file",
                       (ull)len, (ull)rd_left(r));
    s->len = len;
    s->data = (const char *)r->p + r->pos;
    r->pos += len;
    return FLM_OK;
}

/* A key or tensor name: non-empty, no NUL bytes; copied to *out. */
static flm_status rd_name(rd *r, const char *field, char **out) {
    flm_gguf_str s = {0, NULL};
    flm_status st = rd_str(r, field, &s);
    if (st != FLM_OK) return st;
    if (s.len == 0) return rd_fail(r, FLM_ERR_FORMAT, field, "empty");
    if (memchr(s.data, 0, (size_t)s.len)) return rd_fail(r, FLM_ERR_FORMAT, field, "contains a NUL byte");
    if (!(*out = dup_bytes(s.data, (size_t)s.len))) return rd_fail(r, FLM_ERR_NOMEM, field, "out of memory");
    return FLM_OK;
}

/* One fixed-size scalar of type t into kv->v. */
static flm_status rd_scalar(rd *r, const char *field, uint32_t t, flm_gguf_kv *kv) {
    size_t n = vt_size(t);
    uint64_t u;
    flm_status st = rd_uint(r, field, n, &u);
    if (st != FLM_OK) return st;
    if (t == GGUF_VT_FLOAT32) {
        float f;
        uint32_t u32 = (uint32_t)u;
        memcpy(&f, &u32, sizeof f);
        kv->v.f64 = f;
    } else if (t == GGUF_VT_FLOAT64) {
        memcpy(&kv->v.f64, &u, sizeof u);
    } else if (vt_is_signed(t) && n < 8) { /* sign-extend without implementation-defined conversions */
        kv->v.i64 = u >> (8 * n - 1) ? (int64_t)u - ((int64_t)1 << (8 * n)) : (int64_t)u;
    } else { /* unsigned, bool, and i64 (the same bits through the union) */
        if (t == GGUF_VT_BOOL && u > 1)
            return rd_fail(r, FLM_ERR_FORMAT, field, "bool value %llu is not 0 or 1", (ull)u);
        kv->v.u64 = u;
    }
    return FLM_OK;
}

static flm_status rd_array(rd *r, flm_gguf_kv *kv) {
    flm_status st = rd_u32(r, "array element type", &kv->arr_type);
    if (st != FLM_OK) return st;
    uint32_t et = kv->arr_type;
    if (et == GGUF_VT_ARRAY) return rd_fail(r, FLM_ERR_UNSUPPORTED, "value", "nested arrays are not supported");
    size_t esize = et == GGUF_VT_STRING ? 8 : vt_size(et);
    if (esize == 0) return rd_fail(r, FLM_ERR_FORMAT, "array element type", "unknown value type %u", et);
    if ((st = rd_uint(r, "array count", 8, &kv->arr_n)) != FLM_OK) return st;
    if (kv->arr_n > rd_left(r) / esize)
        return rd_fail(r, FLM_ERR_FORMAT, "array count", "%llu elements of %s are impossible: only %llu bytes remain "
                       "in the file", (ull)kv->arr_n, vt_name(et), (ull)rd_left(r));
    if (et != GGUF_VT_STRING) {
        kv->arr_data = r->p + r->pos;
        r->pos += kv->arr_n * esize;
        if (et == GGUF_VT_BOOL)
            for (uint64_t i = 0; i < kv->arr_n; i++)
                if (kv->arr_data[i] > 1)
                    return rd_fail(r, FLM_ERR_FORMAT, "value", "element %llu: bool value %u is not 0 or 1", (ull)i,
                                   kv->arr_data[i]);
        return FLM_OK;
    }
    uint64_t cap = 0;
    for (uint64_t i = 0; i < kv->arr_n; i++) {
        if (!grow((void **)&kv->arr_str, &cap, i + 1, kv->arr_n, sizeof *kv->arr_str))
            return rd_fail(r, FLM_ERR_NOMEM, "value", "out of memory for %llu strings", (ull)kv->arr_n);
        char field[48];
        snprintf(field, sizeof field, "element %llu", (ull)i);
        if ((st = rd_str(r, field, &kv->arr_str[i])) != FLM_OK) return st;
    }
    return FLM_OK;
}

static flm_status rd_kv(rd *r, uint64_t i, flm_gguf_kv *kv) {
    snprintf(r->ctx, sizeof r->ctx, "kv %llu", (ull)i);
    flm_status st = rd_name(r, "key", &kv->key);
    if (st != FLM_OK) return st;
    snprintf(r->ctx, sizeof r->ctx, "kv %llu '%.100s'", (ull)i, kv->key);
    if ((st = rd_u32(r, "value type", &kv->type)) != FLM_OK) return st;
    if (kv->type == GGUF_VT_ARRAY) return rd_array(r, kv);
    if (kv->type == GGUF_VT_STRING) return rd_str(r, "value", &kv->v.str);
    if (vt_size(kv->type) == 0) return rd_fail(r, FLM_ERR_FORMAT, "value type", "unknown value type %u", kv->type);
    return rd_scalar(r, "value", kv->type, kv);
}

/* Tensor info, without the data range (which needs the data section offset). */
static flm_status rd_tensor_info(rd *r, uint64_t i, flm_gguf_tensor *t) {
    snprintf(r->ctx, sizeof r->ctx, "tensor %llu", (ull)i);
    flm_status st = rd_name(r, "name", &t->name);
    if (st != FLM_OK) return st;
    snprintf(r->ctx, sizeof r->ctx, "tensor %llu '%.100s'", (ull)i, t->name);
    if ((st = rd_u32(r, "n_dims", &t->n_dims)) != FLM_OK) return st;
    if (t->n_dims < 1 || t->n_dims > 4)
        return rd_fail(r, FLM_ERR_FORMAT, "n_dims", "%u dimensions (must be 1..4)", t->n_dims);
    t->n_elements = 1;
    for (uint32_t d = 0; d < 4; d++) {
        t->ne[d] = 1;
        if (d >= t->n_dims) continue;
        char field[16];
        snprintf(field, sizeof field, "ne[%u]", d);
        if ((st = rd_uint(r, field, 8, &t->ne[d])) != FLM_OK) return st;
        if (t->ne[d] == 0) return rd_fail(r, FLM_ERR_FORMAT, field, "zero");
        if (t->ne[d] > UINT64_MAX / t->n_elements)
            return rd_fail(r, FLM_ERR_FORMAT, field, "%llu: the element count overflows", (ull)t->ne[d]);
        t->n_elements *= t->ne[d];
    }
    if ((st = rd_u32(r, "type", &t->type)) != FLM_OK) return st;
    if ((st = rd_uint(r, "offset", 8, &t->offset)) != FLM_OK) return st;
    if (!flm_type_supported(t->type)) {
        char list[160];
        const char *nm = flm_type_name(t->type);
        return rd_fail(r, FLM_ERR_UNSUPPORTED, "type", "tensor type %u%s%s%s is not supported (supported: %s)",
                       t->type, nm ? " (" : "", nm ? nm : "", nm ? ")" : "",
                       flm_type_supported_list(list, sizeof list));
    }
    size_t be = flm_type_block_elems(t->type);
    if (t->ne[0] % be != 0)
        return rd_fail(r, FLM_ERR_FORMAT, "ne[0]", "%llu is not a multiple of the %s block size %zu", (ull)t->ne[0],
                       flm_type_name(t->type), be);
    uint64_t row = flm_row_bytes(t->type, t->ne[0]), rows = t->n_elements / t->ne[0];
    if (row == 0 || rows > UINT64_MAX / row)
        return rd_fail(r, FLM_ERR_FORMAT, "shape", "the byte size of %llu elements of %s overflows",
                       (ull)t->n_elements, flm_type_name(t->type));
    t->nbytes = row * rows;
    return FLM_OK;
}

/* Data range of tensor i against the data section at data_off. */
static flm_status check_tensor_data(rd *r, uint64_t i, flm_gguf_tensor *t, uint64_t data_off, uint64_t align) {
    snprintf(r->ctx, sizeof r->ctx, "tensor %llu '%.100s'", (ull)i, t->name);
    if (t->offset % align != 0)
        return rd_fail(r, FLM_ERR_FORMAT, "offset", "%llu is not a multiple of the alignment %llu", (ull)t->offset,
                       (ull)align);
    if (t->offset > UINT64_MAX - data_off || t->nbytes > UINT64_MAX - data_off - t->offset)
        return rd_fail(r, FLM_ERR_FORMAT, NULL, "data at offset %llu + %llu (%llu bytes) runs past the end of the file "
                       "(%llu bytes)", (ull)data_off, (ull)t->offset, (ull)t->nbytes, (ull)r->total);
    uint64_t start = data_off + t->offset, end = start + t->nbytes;
    if (end > r->total)
        return rd_fail(r, FLM_ERR_FORMAT, NULL, "data [%llu, %llu) runs past the end of the file (%llu bytes)",
                       (ull)start, (ull)end, (ull)r->total);
    t->data = end <= r->size ? r->p + start : NULL; /* NULL: not (wholly) in memory */
    return FLM_OK;
}

static int cmp_tensor_name(const void *a, const void *b) {
    return strcmp((*(const flm_gguf_tensor *const *)a)->name, (*(const flm_gguf_tensor *const *)b)->name);
}

static int cmp_kv_key(const void *a, const void *b) {
    return strcmp((*(const flm_gguf_kv *const *)a)->key, (*(const flm_gguf_kv *const *)b)->key);
}

/* Refuse duplicate keys and tensor names: sort pointers, compare neighbours (O(n log n)). */
static flm_status check_duplicates(rd *r, flm_gguf_file *f) {
    uint64_t n = f->n_kv > f->n_tensors ? f->n_kv : f->n_tensors;
    if (n < 2) return FLM_OK;
    const void **p = malloc((size_t)n * sizeof *p);
    if (!p) return flm_fail(r->err, FLM_ERR_NOMEM, "%s: out of memory", r->path);
    flm_status st = FLM_OK;
    for (uint64_t i = 0; i < f->n_kv; i++) p[i] = &f->kv[i];
    qsort(p, (size_t)f->n_kv, sizeof *p, cmp_kv_key);
    for (uint64_t i = 1; i < f->n_kv && st == FLM_OK; i++) {
        const flm_gguf_kv *a = p[i - 1], *b = p[i];
        if (strcmp(a->key, b->key) == 0)
            st = flm_fail(r->err, FLM_ERR_FORMAT, "%s: kv %llu and kv %llu: duplicate key '%.100s'", r->path,
                          (ull)((a < b ? a : b) - f->kv), (ull)((a < b ? b : a) - f->kv), a->key);
    }
    for (uint64_t i = 0; i < f->n_tensors && st == FLM_OK; i++) p[i] = &f->tensors[i];
    if (st == FLM_OK) qsort(p, (size_t)f->n_tensors, sizeof *p, cmp_tensor_name);
    for (uint64_t i = 1; i < f->n_tensors && st == FLM_OK; i++) {
        const flm_gguf_tensor *a = p[i - 1], *b = p[i];
        if (strcmp(a->name, b->name) == 0)
            st = flm_fail(r->err, FLM_ERR_FORMAT, "%s: tensor %llu and tensor %llu: duplicate name '%.100s'", r->path,
                          (ull)((a < b ? a : b) - f->tensors), (ull)((a < b ? b : a) - f->tensors), a->name);
    }
    free(p);
    return st;
}

/* Integer value of kv as uint64 when it is a non-negative integer. */
static bool kv_uint(const flm_gguf_kv *kv, uint64_t *out) {
    if (!vt_is_int(kv->type)) return false;
    if (vt_is_signed(kv->type) && kv->v.i64 < 0) return false;
    *out = kv->v.u64; /* non-negative: same bits in both union members */
    return true;
}

static flm_status parse(rd *r, flm_gguf_file *f) {
    flm_status st;
    uint64_t v;
    snprintf(r->ctx, sizeof r->ctx, "header");
    if ((st = rd_need(r, "magic", 4)) != FLM_OK) return st;
    if (memcmp(r->p, "GGUF", 4) != 0)
        return rd_fail(r, FLM_ERR_FORMAT, "magic", "bytes %02x %02x %02x %02x are not \"GGUF\": not a GGUF file",
                       r->p[0], r->p[1], r->p[2], r->p[3]);
    r->pos = 4;
    if ((st = rd_u32(r, "version", &f->version)) != FLM_OK) return st;
    if (f->version != 2 && f->version != 3) {
        uint32_t sw = (f->version >> 24) | (f->version >> 8 & 0xff00u);
        return rd_fail(r, FLM_ERR_UNSUPPORTED, "version", "GGUF version %u is not supported (only 2 and 3)%s",
                       f->version, (sw == 2 || sw == 3) && (f->version & 0xffff) == 0 ? "; a big-endian file?" : "");
    }
    if ((st = rd_uint(r, "tensor count", 8, &f->n_tensors)) != FLM_OK) return st;
    if ((st = rd_uint(r, "kv count", 8, &f->n_kv)) != FLM_OK) return st;
    if (f->n_tensors > rd_left(r) / GGUF_MIN_TENSOR_BYTES)
        return rd_fail(r, FLM_ERR_FORMAT, NULL, "tensor count %llu is impossible for a file of %llu bytes",
                       (ull)f->n_tensors, (ull)r->size);
    if (f->n_kv > rd_left(r) / GGUF_MIN_KV_BYTES)
        return rd_fail(r, FLM_ERR_FORMAT, NULL, "kv count %llu is impossible for a file of %llu bytes",
                       (ull)f->n_kv, (ull)r->size);

    /* Arrays grow as items parse, so a forged count never allocates more than the bytes actually present.
     * n_kv / n_tensors count the entries allocated so far (zeroed, possibly half-parsed) for flm_gguf_close(). */
    uint64_t n_kv = f->n_kv, n_tensors = f->n_tensors, cap = 0;
    f->n_kv = f->n_tensors = 0;
    for (uint64_t i = 0; i < n_kv; i++) {
        if (!grow((void **)&f->kv, &cap, i + 1, n_kv, sizeof *f->kv))
            return flm_fail(r->err, FLM_ERR_NOMEM, "%s: out of memory for %llu kvs", r->path, (ull)n_kv);
        f->n_kv = i + 1;
        if ((st = rd_kv(r, i, &f->kv[i])) != FLM_OK) return st;
        r->kv_done = i + 1;
    }
    cap = 0;
    for (uint64_t i = 0; i < n_tensors; i++) {
        if (!grow((void **)&f->tensors, &cap, i + 1, n_tensors, sizeof *f->tensors))
            return flm_fail(r->err, FLM_ERR_NOMEM, "%s: out of memory for %llu tensors", r->path, (ull)n_tensors);
        f->n_tensors = i + 1;
        if ((st = rd_tensor_info(r, i, &f->tensors[i])) != FLM_OK) return st;
        r->t_done = i + 1;
    }
    if ((st = check_duplicates(r, f)) != FLM_OK) return st;

    f->alignment = GGUF_DEFAULT_ALIGNMENT;
    const flm_gguf_kv *al = flm_gguf_find_kv(f, "general.alignment");
    if (al) {
        if (!kv_uint(al, &v))
            return flm_fail(r->err, FLM_ERR_FORMAT, "%s: kv 'general.alignment': expected an unsigned integer, found "
                            "%s", r->path, al->type == GGUF_VT_ARRAY ? "an array" : vt_name(al->type));
        if (v == 0 || (v & (v - 1)) != 0)
            return flm_fail(r->err, FLM_ERR_FORMAT, "%s: kv 'general.alignment': %llu is not a nonzero power of two",
                            r->path, (ull)v);
        f->alignment = v;
    }
    f->data_offset = flm_align_up(r->pos, f->alignment);
    if (f->n_tensors > 0 && f->data_offset > r->total) {
        snprintf(r->ctx, sizeof r->ctx, "data section");
        return rd_fail(r, FLM_ERR_FORMAT, NULL, "starts at %llu, past the end of the file (%llu bytes)",
                       (ull)f->data_offset, (ull)r->total);
    }
    for (uint64_t i = 0; i < f->n_tensors; i++)
        if ((st = check_tensor_data(r, i, &f->tensors[i], f->data_offset, f->alignment)) != FLM_OK) return st;
    return FLM_OK;
}

/* Map path read-only (or read it into memory when mmap fails). */
static flm_status load(flm_gguf_file_impl *fi, const char *path, flm_error *err) {
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC); /* O_NONBLOCK: a FIFO is refused below, not waited on */
    if (fd < 0) return flm_fail(err, FLM_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    flm_status st = FLM_OK;
    if (fstat(fd, &sb) != 0) {
        st = flm_fail(err, FLM_ERR_IO, "%s: cannot stat: %s", path, strerror(errno));
    } else if (!S_ISREG(sb.st_mode)) {
        st = flm_fail(err, FLM_ERR_IO, "%s: is %s, not a regular file: a model must be a file", path,
                      flm_file_kind(sb.st_mode));
    } else if ((uint64_t)sb.st_size > SIZE_MAX) {
        st = flm_fail(err, FLM_ERR_IO, "%s: file of %llu bytes is too large to map", path, (ull)sb.st_size);
    } else if ((fi->f.size = (size_t)sb.st_size) > 0) {
        void *m = mmap(NULL, fi->f.size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m != MAP_FAILED) {
            fi->f.map = m;
            fi->kind = MAP_MMAP;
        } else {
            uint8_t *buf = malloc(fi->f.size);
            fi->kind = MAP_HEAP;
            size_t got = 0;
            if (!buf) st = flm_fail(err, FLM_ERR_NOMEM, "%s: out of memory reading %zu bytes", path, fi->f.size);
            while (st == FLM_OK && got < fi->f.size) {
                ssize_t n = read(fd, buf + got, fi->f.size - got);
                if (n < 0 && errno == EINTR) continue;
                if (n <= 0)
                    st = flm_fail(err, FLM_ERR_IO, "%s: read failed at byte %zu: %s", path, got,
                                  n < 0 ? strerror(errno) : "unexpected end of file");
                else
                    got += (size_t)n;
            }
            fi->f.map = buf;
        }
    }
    close(fd);
    return st;
}

/* Open from a file (data == NULL) or a borrowed buffer holding the first size bytes of an image of total bytes;
 * salvage: on a parse error keep the complete entries (flm_gguf_open_salvage). */
static flm_status open_common(const char *path, const void *data, size_t size, uint64_t total, bool salvage,
                              flm_gguf_file **out,
                              flm_error *err) {
    *out = NULL;
    flm_error_clear(err);
    flm_gguf_file_impl *fi = calloc(1, sizeof *fi);
    if (!fi || !(fi->f.path = dup_bytes(path, strlen(path)))) {
        free(fi);
        return flm_fail(err, FLM_ERR_NOMEM, "%s: out of memory", path);
    }
    fi->f.map = data;
    fi->f.size = size;
    flm_status st = data ? FLM_OK : load(fi, path, err);
    bool loaded = st == FLM_OK;
    if (st == FLM_OK) {
        rd r = {.p = fi->f.map, .size = fi->f.size, .total = data ? total : fi->f.size, .path = path, .err = err};
        st = parse(&r, &fi->f);
        if (st != FLM_OK && salvage) { /* drop the entry that failed half-way, keep the others */
            flm_gguf_file *f = &fi->f;
            for (uint64_t i = r.kv_done; f->kv && i < f->n_kv; i++) {
                free(f->kv[i].key);
                free(f->kv[i].arr_str);
            }
            for (uint64_t i = r.t_done; f->tensors && i < f->n_tensors; i++) free(f->tensors[i].name);
            f->n_kv = r.kv_done;
            f->n_tensors = r.t_done;
        }
    }
    if (st != FLM_OK && salvage && loaded) {
        *out = &fi->f;
        return st;
    }
    if (st != FLM_OK) {
        flm_gguf_close(&fi->f);
        return st;
    }
    *out = &fi->f;
    return FLM_OK;
}

flm_status flm_gguf_open(const char *path, flm_gguf_file **out, flm_error *err) {
    return open_common(path, NULL, 0, 0, false, out, err);
}

flm_status flm_gguf_open_salvage(const char *path, flm_gguf_file **out, flm_error *err) {
    return open_common(path, NULL, 0, 0, true, out, err);
}

flm_status flm_gguf_open_buffer(const char *name, const void *data, size_t size, flm_gguf_file **out, flm_error *err) {
    static const uint8_t empty[1];
    return open_common(name, data ? data : empty, data ? size : 0, data ? size : 0, false, out, err);
}

flm_status flm_gguf_open_buffer_salvage(const char *name, const void *data, size_t size, flm_gguf_file **out,
                                        flm_error *err) {
    static const uint8_t empty[1];
    return open_common(name, data ? data : empty, data ? size : 0, data ? size : 0, true, out, err);
}

flm_status flm_gguf_open_buffer_partial(const char *name, const void *data, size_t size, uint64_t total,
                                        flm_gguf_file **out, flm_error *err) {
    static const uint8_t empty[1];
    if (size > total) return flm_fail(err, FLM_ERR_ARG, "%s: %zu bytes in memory of a %llu-byte image", name, size,
                                      (ull)total);
    return open_common(name, data ? data : empty, data ? size : 0, total, false, out, err);
}

void flm_gguf_prefault(const flm_gguf_file *f) {
    const flm_gguf_file_impl *fi = (const flm_gguf_file_impl *)f;
    if (!f || fi->kind != MAP_MMAP || !f->size) return;
#ifdef MADV_POPULATE_READ
    if (madvise((void *)f->map, f->size, MADV_POPULATE_READ) == 0) return;
#endif
    (void)madvise((void *)f->map, f->size, MADV_WILLNEED); /* older kernels: read ahead at least */
}

void flm_gguf_close(flm_gguf_file *f) {
    if (!f) return;
    flm_gguf_file_impl *fi = (flm_gguf_file_impl *)f;
    for (uint64_t i = 0; f->kv && i < f->n_kv; i++) {
        free(f->kv[i].key);
        free(f->kv[i].arr_str);
    }
    for (uint64_t i = 0; f->tensors && i < f->n_tensors; i++) free(f->tensors[i].name);
    free(f->kv);
    free(f->tensors);
    if (fi->kind == MAP_MMAP)
        munmap((void *)f->map, f->size);
    else if (fi->kind == MAP_HEAP)
        free((void *)f->map);
    free(f->path);
    free(fi);
}

const flm_gguf_kv *flm_gguf_find_kv(const flm_gguf_file *f, const char *key) {
    for (uint64_t i = 0; f->kv && i < f->n_kv; i++)
        if (strcmp(f->kv[i].key, key) == 0) return &f->kv[i];
    return NULL;
}

const flm_gguf_tensor *flm_gguf_find_tensor(const flm_gguf_file *f, const char *name) {
    for (uint64_t i = 0; f->tensors && i < f->n_tensors; i++)
        if (strcmp(f->tensors[i].name, name) == 0) return &f->tensors[i];
    return NULL;
}

/* Find key; sets *kv (NULL when absent) and returns FLM_ERR_FORMAT when absent and required. */
static flm_status lookup(const flm_gguf_file *f, const char *key, bool required, const flm_gguf_kv **kv, flm_error *err) {
    *kv = flm_gguf_find_kv(f, key);
    if (!*kv && required) return flm_fail(err, FLM_ERR_FORMAT, "%s: key '%s': required key is missing", f->path, key);
    return FLM_OK;
}

static flm_status type_error(const flm_gguf_file *f, const flm_gguf_kv *kv, const char *want, flm_error *err) {
    if (kv->type == GGUF_VT_ARRAY)
        return flm_fail(err, FLM_ERR_FORMAT, "%s: key '%s': expected %s, found an array of %s", f->path, kv->key, want,
                        vt_name(kv->arr_type));
    return flm_fail(err, FLM_ERR_FORMAT, "%s: key '%s': expected %s, found %s", f->path, kv->key, want,
                    vt_name(kv->type));
}

flm_status flm_gguf_get_u32(const flm_gguf_file *f, const char *key, bool required, uint32_t *out, flm_error *err) {
    const flm_gguf_kv *kv;
    flm_status st = lookup(f, key, required, &kv, err);
    if (st != FLM_OK || !kv) return st;
    if (!vt_is_int(kv->type)) return type_error(f, kv, "an integer", err);
    uint64_t v = 0;
    if (!kv_uint(kv, &v) || v > UINT32_MAX) {
        if (vt_is_signed(kv->type))
            return flm_fail(err, FLM_ERR_FORMAT, "%s: key '%s': value %lld does not fit in u32", f->path, key,
                            (long long)kv->v.i64);
        return flm_fail(err, FLM_ERR_FORMAT, "%s: key '%s': value %llu does not fit in u32", f->path, key, (ull)v);
    }
    *out = (uint32_t)v;
    return FLM_OK;
}

flm_status flm_gguf_get_f32(const flm_gguf_file *f, const char *key, bool required, float *out, flm_error *err) {
    const flm_gguf_kv *kv;
    flm_status st = lookup(f, key, required, &kv, err);
    if (st != FLM_OK || !kv) return st;
    double d;
    if (kv->type == GGUF_VT_FLOAT32 || kv->type == GGUF_VT_FLOAT64)
        d = kv->v.f64;
    else if (vt_is_signed(kv->type))
        d = (double)kv->v.i64;
    else if (vt_is_int(kv->type))
        d = (double)kv->v.u64;
    else
        return type_error(f, kv, "a number", err);
    if (isfinite(d) && fabs(d) > FLT_MAX)
        return flm_fail(err, FLM_ERR_FORMAT, "%s: key '%s': value %g does not fit in f32", f->path, key, d);
    *out = (float)d;
    return FLM_OK;
}

flm_status flm_gguf_get_str(const flm_gguf_file *f, const char *key, bool required, char **out, flm_error *err) {
    const flm_gguf_kv *kv;
    flm_status st = lookup(f, key, required, &kv, err);
    if (st != FLM_OK || !kv) return st;
    if (kv->type != GGUF_VT_STRING) return type_error(f, kv, "a string", err);
    char *s = dup_bytes(kv->v.str.data, (size_t)kv->v.str.len);
    if (!s) return flm_fail(err, FLM_ERR_NOMEM, "%s: key '%s': out of memory", f->path, key);
    *out = s;
    return FLM_OK;
}

flm_status flm_gguf_get_arr(const flm_gguf_file *f, const char *key, uint32_t elem_type, bool required,
                        const flm_gguf_kv **out, flm_error *err) {
    const flm_gguf_kv *kv;
    flm_status st = lookup(f, key, required, &kv, err);
    if (st != FLM_OK || !kv) return st;
    if (kv->type != GGUF_VT_ARRAY || kv->arr_type != elem_type) {
        char want[48];
        snprintf(want, sizeof want, "an array of %s", vt_name(elem_type));
        return type_error(f, kv, want, err);
    }
    *out = kv;
    return FLM_OK;
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
    flm_out *out;            /* the checked writer (core/files.h) behind fp and tmp */
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
    if (!grow((void **)&w->kv, &w->kv_cap, w->kv_len + n, UINT64_MAX, 1)) return false;
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
    if (!grow((void **)&w->keys, &w->keys_cap, w->n_kv + 1, UINT64_MAX, sizeof *w->keys) ||
        !(w->keys[w->n_kv] = dup_bytes(key, strlen(key))) || !w_put_str(w, key) || !w_put_uint(w, type, 4))
        return w_note(w, FLM_ERR_NOMEM, "kv '%s': out of memory", key);
    w->n_kv++;
    return FLM_OK;
}

flm_status flm_gguf_writer_create(const char *path, unsigned out_flags, flm_gguf_writer **out, flm_error *err) {
    *out = NULL;
    flm_gguf_writer *w = calloc(1, sizeof *w);
    size_t n = strlen(path);
    if (!w || !(w->path = dup_bytes(path, n))) {
        flm_gguf_writer_free(w);
        return flm_fail(err, FLM_ERR_NOMEM, "%s: out of memory", path);
    }
    /* the checked writer: refuses a link or a non-regular file, locks path, a unique temporary */
    flm_status st = flm_out_open(path, NULL, out_flags & FLM_OUT_REPLACE, &w->out, err);
    if (!st && !(w->fp = flm_out_stream(w->out))) st = flm_fail(err, FLM_ERR_NOMEM, "%s: out of memory", path);
    if (!st && !(w->tmp = dup_bytes(flm_out_temp(w->out), strlen(flm_out_temp(w->out)))))
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
    if (!w || !(w->path = dup_bytes(name, strlen(name)))) {
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
    size_t es = vt_size(elem_type);
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
    size_t es = vt_size(t);
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
        ok = w_put_uint(w, vt_is_signed(t) ? (uint64_t)kv->v.i64 : kv->v.u64, es);
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
    if (!grow((void **)&w->t, &w->t_cap, w->n_t + 1, UINT64_MAX, sizeof *w->t) ||
        !(t.name = dup_bytes(name, strlen(name))))
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
