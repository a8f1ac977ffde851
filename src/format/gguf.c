/* gguf.c — GGUF reader (v2/v3). See gguf.h. The writer is the tools tier's (write/gguf_write.c). */
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
size_t flm_gguf_vt_size(uint32_t t) {
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

bool flm_gguf_vt_is_signed(uint32_t t) {
    return t == GGUF_VT_INT8 || t == GGUF_VT_INT16 || t == GGUF_VT_INT32 || t == GGUF_VT_INT64;
}

static bool vt_is_int(uint32_t t) {
    return flm_gguf_vt_is_signed(t) || t == GGUF_VT_UINT8 || t == GGUF_VT_UINT16 || t == GGUF_VT_UINT32 ||
           t == GGUF_VT_UINT64;
}

static uint64_t get_le(const uint8_t *b, size_t n) {
    uint64_t v = 0;
    for (size_t i = n; i-- > 0;) v = v << 8 | b[i];
    return v;
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
bool flm_gguf_grow(void **arr, uint64_t *cap, uint64_t need, uint64_t max, size_t elem) {
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
    size_t n = flm_gguf_vt_size(t);
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
    } else if (flm_gguf_vt_is_signed(t) && n < 8) { /* sign-extend without implementation-defined conversions */
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
    size_t esize = et == GGUF_VT_STRING ? 8 : flm_gguf_vt_size(et);
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
        if (!flm_gguf_grow((void **)&kv->arr_str, &cap, i + 1, kv->arr_n, sizeof *kv->arr_str))
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
    if (flm_gguf_vt_size(kv->type) == 0) return rd_fail(r, FLM_ERR_FORMAT, "value type", "unknown value type %u", kv->type);
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
    if (flm_gguf_vt_is_signed(kv->type) && kv->v.i64 < 0) return false;
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
        if (!flm_gguf_grow((void **)&f->kv, &cap, i + 1, n_kv, sizeof *f->kv))
            return flm_fail(r->err, FLM_ERR_NOMEM, "%s: out of memory for %llu kvs", r->path, (ull)n_kv);
        f->n_kv = i + 1;
        if ((st = rd_kv(r, i, &f->kv[i])) != FLM_OK) return st;
        r->kv_done = i + 1;
    }
    cap = 0;
    for (uint64_t i = 0; i < n_tensors; i++) {
        if (!flm_gguf_grow((void **)&f->tensors, &cap, i + 1, n_tensors, sizeof *f->tensors))
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
        if (flm_gguf_vt_is_signed(kv->type))
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
    else if (flm_gguf_vt_is_signed(kv->type))
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
