/* flm_write.h — the .flm writer's building blocks, shared by format/flm.c (region replacement) and convert/convert.c
 * (GGUF -> .flm). Internal to the writers: readers use format/flm.h only. Layout: docs/FORMAT.md. */
#ifndef FLM_FORMAT_FLM_WRITE_H
#define FLM_FORMAT_FLM_WRITE_H
#include <stdint.h>
#include <stdio.h>
#include <xxhash.h>
#include "format/flm.h"

/* A file being written sequentially: pos counts the bytes written so far; while h is non-NULL every byte written
 * (padding excepted) is fed to that XXH64 state, the checksum of the region being written. */
typedef struct flm_out_file {
    FILE *fp;
    const char *path; /* named in error messages */
    uint64_t pos;
    XXH64_state_t *h;
} flm_out_file;

/* Append n bytes at p. Errors: FLM_ERR_IO naming o->path. */
flm_status flm_out_write(flm_out_file *o, const void *p, size_t n, flm_error *err);

/* Append zeros up to the next multiple of FLM_ALIGN (not part of any checksum). Errors: FLM_ERR_IO. */
flm_status flm_out_pad(flm_out_file *o, flm_error *err);

/* Serialize the header (fixed part, n_regions 64-byte table entries, XXH64 of bytes [32, header_bytes)) into
 * hdr[0, header_bytes), which it zeroes first. header_bytes must hold FLM_HEADER_FIXED + n_regions * 64 bytes. */
void flm_build_header(uint8_t *hdr, uint32_t header_bytes, const flm_region *regions, uint32_t n_regions,
                      uint64_t file_size);

#endif
