/* gguf_write.h — a small GGUF v3 writer, in the tools tier (`flashlm synth`, `convert`, tests); the runtime reads GGUF
 * only (format/gguf.h). Source: the GGUF specification, ggml/docs/gguf.md. */
#ifndef FLM_WRITE_GGUF_WRITE_H
#define FLM_WRITE_GGUF_WRITE_H
#include "format/gguf.h"

/* --- Writer (for `flashlm synth` and tests): builds a GGUF v3 file in two passes. ---------------------------------
 * Add all KVs and tensor infos first, then write the header with flm_gguf_writer_begin(), then stream each tensor's data
 * in the order added with flm_gguf_writer_write_tensor() (exactly nbytes each), then flm_gguf_writer_finish(), which pads,
 * fsyncs and renames the unique temporary "<path>.tmp.XXXXXX" onto path (the checked writer, core/files.h: a link or a
 * non-regular path is refused, "<path>.lock" is held meanwhile). On any error the temporary file is removed.
 * out_flags: FLM_OUT_REPLACE when an existing file at path may be replaced (the CLI's --force; without it one that
 * appears while writing is not replaced either: RENAME_NOREPLACE), or 0. */
typedef struct flm_gguf_writer flm_gguf_writer;
flm_status flm_gguf_writer_create(const char *path, unsigned out_flags, flm_gguf_writer **out, flm_error *err);
/* A writer that hands every byte to write(user, bytes, n) instead of a file of its own (e.g. straight into a region of
 * a .flm file being written): no temporary file, no fsync or rename; finish() only pads. name stands for the file in
 * messages. write returns FLM_OK or an error (it fills err itself: the writer passes the err of the call). */
typedef flm_status (*flm_gguf_write_fn)(void *user, const void *bytes, size_t n, flm_error *err);
flm_status flm_gguf_writer_create_stream(const char *name, flm_gguf_write_fn write, void *user, flm_gguf_writer **out,
                                         flm_error *err);
flm_status flm_gguf_writer_kv_u32(flm_gguf_writer *w, const char *key, uint32_t v);
flm_status flm_gguf_writer_kv_f32(flm_gguf_writer *w, const char *key, float v);
flm_status flm_gguf_writer_kv_bool(flm_gguf_writer *w, const char *key, bool v);
flm_status flm_gguf_writer_kv_str(flm_gguf_writer *w, const char *key, const char *v);
/* Arrays: elem_type UINT8..FLOAT64 except STRING/ARRAY take n raw elements from data; STRING takes n C strings. */
flm_status flm_gguf_writer_kv_arr(flm_gguf_writer *w, const char *key, uint32_t elem_type, const void *data, uint64_t n);
/* Copy a KV of a file read by flm_gguf_open() (any type, arrays included) as is. general.alignment is skipped: the
 * writer always aligns to 32. */
flm_status flm_gguf_writer_kv_copy(flm_gguf_writer *w, const flm_gguf_kv *kv);
flm_status flm_gguf_writer_add_tensor(flm_gguf_writer *w, const char *name, uint32_t type, uint32_t n_dims,
                                  const uint64_t *ne);
flm_status flm_gguf_writer_begin(flm_gguf_writer *w, flm_error *err);
flm_status flm_gguf_writer_write_tensor(flm_gguf_writer *w, const void *data, uint64_t nbytes, flm_error *err);
flm_status flm_gguf_writer_finish(flm_gguf_writer *w, flm_error *err);
/* Abandon: remove the temporary file and free. Safe after finish (then only frees). */
void flm_gguf_writer_free(flm_gguf_writer *w);

#endif
