/* safetensors.h — the Hugging Face safetensors reader (parse only), single files and sharded folders. Internal.
 * Source: the safetensors specification, https://huggingface.co/docs/safetensors (and the reference implementation,
 * huggingface/safetensors safetensors/src/tensor.rs): an 8-byte little-endian unsigned header length N, then N bytes
 * of a UTF-8 JSON object {"NAME": {"dtype": "F32", "shape": [d0, d1, ...], "data_offsets": [BEGIN, END]}, ...,
 * "__metadata__": {string: string}} (optionally padded with spaces), then the byte buffer; a tensor's bytes are
 * buffer[BEGIN, END), row-major (the last dimension contiguous), little-endian.
 *
 * Every field is checked before it is trusted: the header length against the file size and FLM_ST_MAX_HEADER, the
 * JSON (no NUL byte, no "\u0000" escape, nothing but the padding spaces after the object: flm_json_parse), each
 * entry's keys and their types, the dtype (F32, F16, BF16 only: the others are refused by name), the rank
 * (at most FLM_ST_MAX_DIMS), every dimension (a non-negative integer below 2^53), the element count (no overflow),
 * BEGIN <= END <= buffer size, END - BEGIN == elements x dtype size, and that no two tensors' byte ranges overlap.
 * Errors name the file and the tensor (e.g. "model.safetensors: tensor 'lm_head.weight': data_offsets [0, 4096) run
 * past the end of the data (1024 bytes)"). Nothing is read out of bounds. */
#ifndef FLM_FORMAT_SAFETENSORS_H
#define FLM_FORMAT_SAFETENSORS_H
#include <stddef.h>
#include <stdbool.h>
#include <stdint.h>
#include "flashlm.h"

struct cJSON;

#define FLM_ST_MAX_DIMS 8
#define FLM_ST_MAX_HEADER (100u << 20) /* the reference implementation's limit (100 MB) */

typedef struct flm_st_tensor {
    char *name;                    /* NUL-terminated copy */
    uint32_t type;                 /* FLM_TYPE_F32, FLM_TYPE_F16 or FLM_TYPE_BF16 */
    uint32_t n_dims;               /* 0 (a scalar) .. FLM_ST_MAX_DIMS */
    uint64_t shape[FLM_ST_MAX_DIMS]; /* as in the file: shape[n_dims - 1] is contiguous (PyTorch order) */
    uint64_t n_elements;
    uint64_t nbytes;               /* n_elements x the dtype's size */
    const uint8_t *data;           /* inside the file's bytes, nbytes long */
} flm_st_tensor;

typedef struct flm_st_file {
    char *path;
    const uint8_t *map;            /* the whole file */
    size_t size;
    uint64_t n_tensors;
    flm_st_tensor *tensors;
} flm_st_file;

/* Open and check a .safetensors file (mapped read-only). Free with flm_st_close().
 * Errors: FLM_ERR_IO (cannot open, not a regular file), FLM_ERR_FORMAT (truncated, bad header length, JSON, dtype,
 * shape, offsets, overlap: the message names the file and the tensor), FLM_ERR_UNSUPPORTED (a dtype other than
 * F32/F16/BF16), FLM_ERR_NOMEM. */
flm_status flm_st_open(const char *path, flm_st_file **out, flm_error *err);
/* The same for size bytes in memory (borrowed: they must outlive the file; flm_st_close does not free them). name
 * stands for the path in messages. */
flm_status flm_st_open_buffer(const char *name, const void *data, size_t size, flm_st_file **out, flm_error *err);
void flm_st_close(flm_st_file *f);
/* The tensor called name, or NULL. */
const flm_st_tensor *flm_st_find(const flm_st_file *f, const char *name);

/* Parse len bytes of JSON text (path and what name it in messages: "PATH: WHAT is not valid JSON"): refused with
 * FLM_ERR_FORMAT are a raw NUL byte, a "\u0000" escape (a string that C would cut short: a tensor name or a token
 * piece silently shortened), invalid JSON, and anything but whitespace after the value (safetensors pads its header
 * with spaces). With no_dup_keys, an object that holds one key twice is refused too (the whole tree is checked:
 * meant for small files such as config.json). *out: the tree (cJSON_Delete), NULL on error. */
flm_status flm_json_parse(const char *path, const char *what, const char *text, size_t len, bool no_dup_keys,
                          struct cJSON **out, flm_error *err);

/* A model's weights: DIR/model.safetensors, or the shards DIR/model.safetensors.index.json names in its weight_map
 * (every shard a plain file name inside DIR; each tensor must be in the shard the map gives). */
typedef struct flm_st_set {
    uint32_t n_files;
    flm_st_file **files;
} flm_st_set;

/* Open DIR's weights (above). Errors: FLM_ERR_IO (neither file exists, a shard cannot be opened), FLM_ERR_FORMAT
 * (the index's JSON, a shard name with a '/', a tensor missing from its shard or present in two), as flm_st_open. */
flm_status flm_st_open_dir(const char *dir, flm_st_set **out, flm_error *err);
/* The tensor called name in any file of the set, or NULL. */
const flm_st_tensor *flm_st_set_find(const flm_st_set *s, const char *name);
void flm_st_set_close(flm_st_set *s);

#endif
