/* gguf.h — GGUF reader (versions 2 and 3). Internal. The writer is the tools tier's: write/gguf_write.h.
 * Source: the GGUF specification, ggml/docs/gguf.md (little-endian; header: magic "GGUF", u32 version,
 * u64 tensor_count, u64 metadata_kv_count; then KV pairs; then tensor infos; then padding to general.alignment
 * (default 32); then tensor data, each tensor at data_offset + its offset).
 *
 * The reader maps the file read-only and checks every count, length, offset, shape and type against the file size,
 * overflow-safely, before it trusts it. On any problem flm_gguf_open() returns an error whose message names the file,
 * the field and the problem (e.g. "model.gguf: tensor 3 'blk.0.attn_q.weight': data [1024, 5024) runs past the end
 * of the file (4096 bytes)"). Nothing is read out of bounds. */
#ifndef FLM_FORMAT_GGUF_H
#define FLM_FORMAT_GGUF_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "flashlm.h"

typedef enum flm_gguf_vtype {
    GGUF_VT_UINT8 = 0, GGUF_VT_INT8 = 1, GGUF_VT_UINT16 = 2, GGUF_VT_INT16 = 3, GGUF_VT_UINT32 = 4,
    GGUF_VT_INT32 = 5, GGUF_VT_FLOAT32 = 6, GGUF_VT_BOOL = 7, GGUF_VT_STRING = 8, GGUF_VT_ARRAY = 9,
    GGUF_VT_UINT64 = 10, GGUF_VT_INT64 = 11, GGUF_VT_FLOAT64 = 12,
} flm_gguf_vtype;

/* A string inside the mapped file: not NUL-terminated. */
typedef struct flm_gguf_str { uint64_t len; const char *data; } flm_gguf_str;

typedef struct flm_gguf_kv {
    char *key;                 /* NUL-terminated copy of the key */
    uint32_t type;             /* flm_gguf_vtype */
    /* scalar values (type != ARRAY): integers widened, floats as double, bools 0/1, strings by reference */
    union { uint64_t u64; int64_t i64; double f64; flm_gguf_str str; } v;
    /* arrays (type == ARRAY) */
    uint32_t arr_type;         /* element flm_gguf_vtype (never ARRAY: nested arrays are refused) */
    uint64_t arr_n;            /* number of elements */
    const uint8_t *arr_data;   /* non-string arrays: raw little-endian elements inside the map */
    flm_gguf_str *arr_str;         /* string arrays: arr_n parsed strings (allocated) */
} flm_gguf_kv;

typedef struct flm_gguf_tensor {
    char *name;                /* NUL-terminated copy */
    uint32_t n_dims;           /* 1..4 */
    uint64_t ne[4];            /* ne[0] is the row length (contiguous dimension); unused dims are 1 */
    uint32_t type;             /* flm_type id; only supported types are accepted */
    uint64_t offset;           /* relative to the data section, a multiple of the alignment */
    uint64_t n_elements;
    uint64_t nbytes;
    const uint8_t *data;       /* inside the map; NULL when not in memory (flm_gguf_open_buffer_partial) */
} flm_gguf_tensor;

typedef struct flm_gguf_file {
    char *path;
    const uint8_t *map;        /* whole file, read-only */
    size_t size;               /* file size in bytes (flm_gguf_open_buffer_partial: the bytes in memory) */
    uint32_t version;          /* 2 or 3 */
    uint64_t n_kv;
    flm_gguf_kv *kv;
    uint64_t n_tensors;
    flm_gguf_tensor *tensors;
    uint64_t alignment;        /* general.alignment or 32 */
    uint64_t data_offset;      /* start of the tensor data section, in bytes from the file start */
} flm_gguf_file;

/* Open and validate a GGUF file. On success *out owns the mapping; free with flm_gguf_close().
 * Errors: FLM_ERR_IO (cannot open/map), FLM_ERR_FORMAT (malformed: bad magic, counts, lengths, offsets, shapes,
 * duplicate names, data past the end), FLM_ERR_UNSUPPORTED (version other than 2/3, unknown tensor type),
 * FLM_ERR_NOMEM. */
flm_status flm_gguf_open(const char *path, flm_gguf_file **out, flm_error *err);
/* The same for a GGUF image already in memory (e.g. a region of another file). The buffer is borrowed: it must
 * outlive the flm_gguf_file, and flm_gguf_close() does not free it. name stands for the path in f->path and in messages. */
flm_status flm_gguf_open_buffer(const char *name, const void *data, size_t size, flm_gguf_file **out, flm_error *err);
/* For showing a damaged file (flashlm inspect): like flm_gguf_open(_buffer), but when the file could be read and only
 * parsing failed, *out still gets a file holding the metadata and tensor infos parsed completely before the
 * problem (n_kv, n_tensors count them; a tensor whose data range was not checked has data NULL; alignment and
 * data_offset may be 0), and the error is returned as well. Never use such a file for anything but display.
 * When the file cannot be read at all *out is NULL. Free with flm_gguf_close(). */
flm_status flm_gguf_open_salvage(const char *path, flm_gguf_file **out, flm_error *err);
flm_status flm_gguf_open_buffer_salvage(const char *name, const void *data, size_t size, flm_gguf_file **out,
                                        flm_error *err);
/* The same for the first size bytes of a GGUF image of total bytes (total >= size), the rest not in memory: the
 * header (metadata and tensor infos) must lie within the size bytes; tensor data ranges are checked against total,
 * and a tensor whose data does not lie wholly within the size bytes gets data NULL (the caller may point it at its
 * bytes once it has them). (.flm files leave the token embedding on flash this way: format/flm.h.)
 * Errors: as flm_gguf_open_buffer (a header running past size is "truncated"); FLM_ERR_ARG when size > total. */
flm_status flm_gguf_open_buffer_partial(const char *name, const void *data, size_t size, uint64_t total,
                                        flm_gguf_file **out, flm_error *err);
void flm_gguf_close(flm_gguf_file *f);

/* Maps every page of an opened file's mapping now (madvise MADV_POPULATE_READ, Linux 5.14+; MADV_WILLNEED read-ahead
 * where that is missing), so the first forward pass does not take the minor faults of mapping a model that runs
 * from memory (ram mode). A file read into the heap is already in memory: nothing to do. Best effort: a failure
 * leaves the pages to fault in on first use, as without the call; nothing is returned. */
void flm_gguf_prefault(const flm_gguf_file *f);

/* Lookups; NULL when absent. */
const flm_gguf_kv *flm_gguf_find_kv(const flm_gguf_file *f, const char *key);
const flm_gguf_tensor *flm_gguf_find_tensor(const flm_gguf_file *f, const char *name);

/* Typed getters. When the key is absent: return FLM_ERR_FORMAT naming the file and key if required, else leave
 * *out untouched and return FLM_OK. Integer getters accept any integer type whose value fits; the float getter
 * accepts FLOAT32/FLOAT64 and integers. Type mismatches and out-of-range values are FLM_ERR_FORMAT. */
flm_status flm_gguf_get_u32(const flm_gguf_file *f, const char *key, bool required, uint32_t *out, flm_error *err);
flm_status flm_gguf_get_f32(const flm_gguf_file *f, const char *key, bool required, float *out, flm_error *err);
/* *out is a NUL-terminated malloc'd copy (caller frees). */
flm_status flm_gguf_get_str(const flm_gguf_file *f, const char *key, bool required, char **out, flm_error *err);
/* A required array of the given element type; *out points at the kv (arr_n, arr_data / arr_str). */
flm_status flm_gguf_get_arr(const flm_gguf_file *f, const char *key, uint32_t elem_type, bool required,
                        const flm_gguf_kv **out, flm_error *err);

/* Shared with the writer (write/gguf_write.c): the byte size of a fixed-size value type (0 for STRING, ARRAY and
 * unknown types); grow *arr (elements of size elem) to hold at least need elements, doubling, capped at max (false
 * when out of memory). */
size_t flm_gguf_vt_size(uint32_t t);
bool flm_gguf_vt_is_signed(uint32_t t); /* INT8, INT16, INT32 or INT64 */
bool flm_gguf_grow(void **arr, uint64_t *cap, uint64_t need, uint64_t max, size_t elem);

#endif
