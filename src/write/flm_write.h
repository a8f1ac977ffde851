/* flm_write.h — writing .flm files (docs/FORMAT.md), in the tools tier: the writer's building blocks (convert/convert.c:
 * GGUF -> .flm), region replacement and the hot order (calibrate). Readers use format/flm.h only. */
#ifndef FLM_WRITE_FLM_WRITE_H
#define FLM_WRITE_FLM_WRITE_H
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <xxhash.h>
#include "format/flm.h"

/* A file being written sequentially: pos counts the bytes written so far; while h is non-NULL every byte written
 * (padding excepted) is fed to that XXH64 state, the checksum of the region being written. */
typedef struct flm_write_cursor {
    FILE *fp;
    const char *path; /* named in error messages */
    uint64_t pos;
    XXH64_state_t *h;
} flm_write_cursor;

/* Append n bytes at p. Errors: FLM_ERR_IO naming o->path. */
flm_status flm_write_cursor_put(flm_write_cursor *o, const void *p, size_t n, flm_error *err);

/* Append zeros up to the next multiple of FLM_ALIGN (not part of any checksum). Errors: FLM_ERR_IO. */
flm_status flm_write_cursor_pad(flm_write_cursor *o, flm_error *err);

/* A new SUMS region payload (zeroed sums) for tables t[0 .. n) (kind, layer, offset, unit_bytes, n_units set; pos is
 * filled: where each table's sums go, each a little-endian u64 XXH3_64bits of its unit). *size gets its bytes.
 * NULL when out of memory or too large. */
uint8_t *flm_sums_payload_new(flm_sums_table *t, uint32_t n, uint64_t *size);

/* Serialize the header (fixed part, n_regions 64-byte table entries, XXH64 of bytes [32, header_bytes)) into
 * hdr[0, header_bytes), which it zeroes first. header_bytes must hold FLM_HEADER_FIXED + n_regions * 64 bytes. */
void flm_build_header(uint8_t *hdr, uint32_t header_bytes, const flm_region *regions, uint32_t n_regions,
                      uint64_t file_size); /* version 2 when a SUMS region is among them, else 1 */

/* Add, or replace, the file's single region of `kind` (FLM_REGION_PREDICTOR) with payload[0, size): writes
 * a unique temporary "<path>.tmp.XXXXXX" (the checked writer, core/files.h, which also locks "<path>.lock") holding the header, the resident and FFN regions (copied) and the new region, fsyncs and renames it
 * onto path, so the file is valid and checksummed at every moment. Only the header is read into memory (the regions
 * are copied file to file). Errors: FLM_ERR_IO, FLM_ERR_FORMAT (the header has no room for another region: convert
 * again), errors of flm_file_open_ex with FLM_FILE_HEADER_ONLY. */
flm_status flm_file_put_region(const char *path, uint32_t kind, const void *payload, uint64_t size, flm_error *err);

/* Store every layer's FFN records in a new order: record i of layer l becomes the old record perm[l][i] (perm[l] a
 * permutation of [0, d_ffn)), and mark each FFN region FLM_FFN_HOT_ORDER; the record sums of the FFN tables are
 * computed again in the new order. Neuron order does not change the FFN (Knowl 5), so the model computes the same
 * function. A predictor region (its neuron ids are the old ones) is dropped:
 * calibrate again. Writes a unique "<path>.tmp.XXXXXX" (the checked writer, core/files.h) (header, resident region copied, FFN regions permuted and checksummed), fsyncs
 * and renames it onto path. Memory: one FFN region at a time, twice. Errors: FLM_ERR_IO, FLM_ERR_NOMEM,
 * FLM_ERR_CHECKSUM (a region read back does not match its checksum: nothing is written), FLM_ERR_ARG (a perm[l] that
 * is not a permutation), FLM_ERR_UNSUPPORTED (FFN biases: blk.N.ffn_up.bias would need the same order), errors of
 * flm_file_open. */
flm_status flm_file_permute_ffn(const char *path, const uint32_t *const *perm, flm_error *err);
/* The same, written to dst (replaced when it exists) instead of onto path, which is left as it was (calibrate's one
 * replacement at the end: the ordered copy is calibrated, then renamed onto the model). */
flm_status flm_file_permute_ffn_to(const char *path, const char *dst, const uint32_t *const *perm, flm_error *err);
/* flm_file_permute_ffn_to with the order's flag and what else follows the records:
 *   order_flag  set on every FFN region in place of the other order flag (FLM_FFN_HOT_ORDER, FLM_FFN_COACT_ORDER; 0:
 *               neither);
 *   biases      true: the resident GGUF's FFN biases with one element per neuron (blk.N.ffn_up.bias,
 *               blk.N.ffn_gate.bias; OPT, Phi-2, Persimmon) are stored in the same order, and the resident region's
 *               checksums (whole and head) computed again; false: a file with such biases is refused
 *               (FLM_ERR_UNSUPPORTED);
 *   predictor   non-NULL: the new PREDICTOR region payload (predictor_size bytes; its neuron ids must be the new
 *               ones: the caller permutes it), written after the other regions; NULL: the region is dropped.
 * Errors: those of flm_file_permute_ffn_to; FLM_ERR_UNSUPPORTED also for a bias that is not one element per neuron;
 * FLM_ERR_FORMAT (no room in the header for a predictor region the file had not). */
flm_status flm_file_permute_ffn_ex(const char *path, const char *dst, const uint32_t *const *perm, uint64_t order_flag,
                                   bool biases, const void *predictor, uint64_t predictor_size, flm_error *err);

#endif
