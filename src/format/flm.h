/* flm.h — the .flm flash layout: reader, verifier and region replacement. Internal. The writer of whole files from
 * GGUF (`flashlm convert`) is convert/convert.h; its building blocks are write/flm_write.h.
 * Specification: docs/FORMAT.md. Paper: row-column bundling (Knowl 4), resident attention/embeddings (Knowl 2).
 *
 *   [header]              magic, version, region table, checksum of the header; padded to a multiple of 4096
 *   [RESIDENT region]     a complete GGUF v3 file: all metadata (hyper-parameters, tokenizer) and every tensor
 *                         except the FFN up/gate/down matrices; token_embd.weight's data last, after head_bytes, so
 *                         streaming modes can leave it in the file and read one row per token
 *   [FFN region, layer 0] d_ffn records, one per neuron i: up row i | gate row i (gated FFNs) | down column i
 *   ...                   (each region starts on a 4096-byte boundary; each has an xxh64 checksum)
 *   [FFN region, layer L-1]
 */
#ifndef FLM_FORMAT_FLM_H
#define FLM_FORMAT_FLM_H
#include <stdbool.h>
#include <stdint.h>
#include "flashlm.h"
#include "format/gguf.h"

#define FLM_FILE_MAGIC "FLASHLM\0"
#define FLM_FILE_VERSION 2u     /* written when the file has a SUMS region (every file convert writes) */
#define FLM_FILE_VERSION_MIN 1u /* read: version 1 (no SUMS region: its reads from flash cannot be checked) */
#define FLM_ALIGN 4096u
#define FLM_HEADER_FIXED 64u       /* fixed part of the header; the region table follows */
#define FLM_REGION_ENTRY_BYTES 64u
#define FLM_MAX_REGIONS 65536u
/* gate_type of an FFN region whose FFN has no gate projection (0 is FLM_TYPE_F32, a real gate type). */
#define FLM_GATE_NONE 0xFFFFFFFFu

typedef enum flm_region_kind {
    FLM_REGION_RESIDENT = 1,  /* a GGUF file: metadata, tokenizer, every non-FFN tensor */
    FLM_REGION_FFN = 2,       /* one layer's neuron bundles */
    FLM_REGION_PREDICTOR = 3, /* activation rules and predictors of every layer (written by flashlm calibrate) */
    FLM_REGION_SUMS = 4,      /* record sums: an XXH3 of every FFN record and token-embedding row (version 2) */
} flm_region_kind;

/* One region table entry (64 bytes on disk, little-endian, fields in this order). */
typedef struct flm_region {
    uint32_t kind;         /* flm_region_kind */
    uint32_t layer;        /* FFN: layer index; RESIDENT: 0 */
    uint64_t offset;       /* from the file start; a multiple of FLM_ALIGN */
    uint64_t size;         /* payload bytes (the region is zero-padded to FLM_ALIGN after it) */
    uint64_t checksum;     /* XXH64(payload, size, seed 0) */
    uint32_t up_type;      /* FFN: flm_type of the up row, gate row, down column; 0 for RESIDENT */
    uint32_t gate_type;    /* FLM_GATE_NONE when the FFN has no gate (plain FFN: down(act(up x))) */
    uint32_t down_type;
    uint32_t n_records;    /* FFN: d_ffn */
    uint64_t record_bytes; /* FFN: bytes of one neuron's bundle */
    /* RESIDENT (on disk where FFN regions keep record_bytes and the reserved u64): 0 (files converted before the
     * embedding was placed last), or the payload's bytes [0, head_bytes) — the GGUF header and every tensor's data
     * but token_embd.weight's — and [head_bytes, size) the "tail": token_embd.weight's data and the GGUF's final
     * padding. head_checksum is XXH64(payload[0, head_bytes), seed 0); checksum still covers the whole payload. */
    uint64_t head_bytes;
    uint64_t head_checksum;
    uint64_t flags;        /* FFN (on disk at 56, where RESIDENT keeps head_checksum): FLM_FFN_HOT_ORDER or
                              FLM_FFN_COACT_ORDER */
} flm_region;

/* FFN region flags */
#define FLM_FFN_HOT_ORDER 1u /* records stored hottest first (flm_file_permute_ffn): a prefix is the layer's hot set */
#define FLM_FFN_COACT_ORDER 2u /* records stored so that neurons predicted together lie together (calibrate/coact.c):
                                  the sparse mode's reads of a token are fewer and larger; not a hot order */

/* Byte offsets of the parts inside one FFN record. */
typedef struct flm_bundle_layout {
    uint64_t up_off, up_bytes;
    uint64_t gate_off, gate_bytes; /* gate_bytes 0 when the FFN is not gated */
    uint64_t down_off, down_bytes;
    uint64_t record_bytes;
} flm_bundle_layout;

/* Layout of a record for d_model-wide rows of the given types; gated false (or gate_type FLM_GATE_NONE): no gate row,
 * gate_bytes 0. */
flm_bundle_layout flm_bundle_layout_of(uint32_t d_model, uint32_t up_type, uint32_t gate_type, uint32_t down_type,
                                       bool gated);

typedef struct flm_file {
    char *path;
    uint32_t version;
    uint64_t file_size;
    uint32_t header_bytes;
    uint32_t n_regions;
    flm_region *regions;
    uint32_t n_layers;
    const flm_region **ffn;   /* [n_layers]: the FFN region of each layer */
    const flm_region *resident;
    const flm_region *predictor; /* NULL until the model is calibrated */
    const flm_region *sums;   /* the record sums (FLM_REGION_SUMS); NULL in a version-1 file */
    void *resident_data;      /* the RESIDENT payload in memory, checksummed: all of it, or its head only (the first
                                 resident->head_bytes bytes) while the tail is in the file (flm_file_tail_pending) */
    void *tail_data;          /* the tail [head_bytes, size) when loaded apart from the head (flm_file_load_tail) */
    uint64_t resident_loaded; /* bytes of the payload in memory: resident->size, or head_bytes while the tail waits */
    flm_gguf_file *meta;      /* parsed from resident_data (+ tail_data); while the tail is pending, token_embd.weight
                                 has data NULL */
    void *head_kept;          /* flm_file_load_head_skip: the head's tensor data less the bytes it skipped (the GGUF
                                 header stays in resident_data) */
} flm_file;

/* flm_file_open_ex flags */
#define FLM_FILE_LAZY_TAIL 1u /* when the resident region has a head (head_bytes > 0), load and check only the head;
                                 the token embedding stays in the file until flm_file_load_tail */
#define FLM_FILE_HEADER_ONLY 2u /* read and check the header and region table only: nothing is loaded (resident_data
                                   and meta stay NULL, resident_loaded 0); for sizes, e.g. to refuse a memory budget
                                   before loading what it cannot hold. Such an f is only for its regions and
                                   flm_file_close */

/* Open a .flm file: read and check the header and region table (magic, version, every offset and size against the
 * file size, alignment, no overlaps, one FFN region per layer), load the RESIDENT region into memory, verify its
 * checksum (and its head's) and parse it as GGUF. FFN regions are not read (see flm_file_verify).
 * Errors: FLM_ERR_IO, FLM_ERR_FORMAT (message names the file and field), FLM_ERR_UNSUPPORTED (version),
 * FLM_ERR_CHECKSUM (resident region corrupt), FLM_ERR_NOMEM. */
flm_status flm_file_open(const char *path, flm_file **out, flm_error *err);
/* flm_file_open with flags: FLM_FILE_LAZY_TAIL loads only the head of a split resident region (the head's checksum
 * is checked; the whole region's is checked by flm_file_load_tail, or by flm_file_verify); a tensor other than
 * token_embd.weight outside the head is FLM_ERR_FORMAT. Files without a head load whole, as flm_file_open. */
flm_status flm_file_open_ex(const char *path, unsigned flags, flm_file **out, flm_error *err);
/* Load the head of f's resident region (its whole payload when it has no head) except the payload bytes
 * [skip_lo, skip_hi), which lie in the GGUF data section: f is open with FLM_FILE_HEADER_ONLY and f->meta is parsed
 * from resident_data (the GGUF header; the caller's). The head is read in pieces and its checksum checked (the whole
 * region's when it has no head) over every byte, the skipped ones too; the other tensor data is kept in f->head_kept
 * and every tensor's data points there: NULL for a tensor wholly skipped or in the tail, valid up to skip_lo for one
 * the skip starts in. sums (n = ceil((skip_hi - skip_lo) / unit) entries) gets XXH3_64bits (seed 0) of each unit of
 * the skipped bytes, unit bytes each (the last one shorter), so later reads of them can be checked. The tail stays
 * pending; flm_file_load_tail then refuses (its checksum needs the head). Errors: FLM_ERR_ARG (a skip outside the
 * data section, or a tensor that crosses skip_hi), FLM_ERR_IO, FLM_ERR_NOMEM, FLM_ERR_CHECKSUM. */
flm_status flm_file_load_head_skip(flm_file *f, uint64_t skip_lo, uint64_t skip_hi, uint64_t unit, uint64_t *sums,
                                   flm_error *err);
/* true while the resident region's tail (the token embedding) is in the file only. */
bool flm_file_tail_pending(const flm_file *f);
/* Bytes of the resident region that FLM_FILE_LAZY_TAIL can leave in the file: size - head_bytes when the region is
 * split, else 0. */
uint64_t flm_file_tail_bytes(const flm_file *f);
/* Read the pending tail into memory (size - head_bytes bytes, malloc'd), check the whole region's checksum and point
 * the tensors lying there (token_embd.weight) at it. Nothing to do when no tail is pending. Errors: FLM_ERR_IO,
 * FLM_ERR_NOMEM, FLM_ERR_CHECKSUM ("resident region: checksum mismatch"), naming the file. */
flm_status flm_file_load_tail(flm_file *f, flm_error *err);
void flm_file_close(flm_file *f);

/* ---- record sums (docs/FORMAT.md, "Record sums") --------------------------------------------------------------
 * The SUMS region holds tables of XXH3_64bits (seed 0) checksums of fixed-size units: every FFN region's records,
 * one table per layer, and the token embedding's rows in the resident region's tail. Streaming reads are checked
 * against them unit by unit (io/reader.h, "Checked reads"). */
#define FLM_SUMS_FFN 1u  /* the records of the FFN region of `layer` */
#define FLM_SUMS_EMBD 2u /* the rows of token_embd.weight, in the resident region */
#define FLM_SUMS_HEAD 8u /* u32 n_tables, u32 reserved */
#define FLM_SUMS_ENTRY 32u

typedef struct flm_sums_table {
    uint32_t kind;        /* FLM_SUMS_FFN or FLM_SUMS_EMBD */
    uint32_t layer;       /* FFN: the layer; EMBD: 0 */
    uint64_t offset;      /* of unit 0, from the start of its region's payload (FFN: 0; EMBD: the head's end) */
    uint64_t unit_bytes;  /* FFN: record_bytes; EMBD: bytes of one row */
    uint64_t n_units;     /* FFN: n_records; EMBD: rows (the vocabulary) */
    const uint64_t *sums; /* [n_units], host order (flm_sums_load) */
    uint64_t pos;         /* byte position of the first sum in the region's payload */
} flm_sums_table;

typedef struct flm_sums {
    uint32_t n_tables;
    flm_sums_table *tables;
    const flm_sums_table **ffn; /* [n_layers]: the table of each layer's FFN records */
    const flm_sums_table *embd; /* the token embedding's rows, or NULL */
    uint64_t *data;             /* the region's payload (its sums converted to host order in place) */
    uint64_t bytes;             /* memory held */
} flm_sums;

/* Read the SUMS region (checking its region checksum), check every table against the file (one FFN table per layer
 * matching its region's records; an embedding table inside the resident region's tail) and point s at it.
 * Errors: FLM_ERR_FORMAT (no SUMS region: a version-1 file; a table that does not match the file, naming it),
 * FLM_ERR_CHECKSUM, FLM_ERR_IO, FLM_ERR_NOMEM. */
flm_status flm_sums_load(const flm_file *f, flm_sums *s, flm_error *err);
void flm_sums_free(flm_sums *s);
/* How errors name a table and its units: "FFN region of layer 3" / "record", "token embedding" / "row". */
void flm_sums_table_name(const flm_sums_table *t, char *out, size_t n);
const char *flm_sums_unit_name(const flm_sums_table *t);

/* true when data (the region's payload, r->size bytes) matches the region's checksum. */
bool flm_region_checksum_ok(const flm_region *r, const void *data);

/* true when the file starts with the .flm magic (false also when it cannot be read). */
bool flm_file_is_flm(const char *path);

/* Progress callback: done/total in bytes; what names the stage. */
typedef void (*flm_progress_fn)(void *user, const char *what, uint64_t done, uint64_t total);

/* Re-read every region and check its checksum (and the resident head's), and, in a version-2 file, every FFN record
 * and token-embedding row against its record sum: the same sums, and the same error for a bad record ("FFN region of
 * layer L, record R"), as the runtime's checked reads. Errors: FLM_ERR_CHECKSUM naming the region (and record),
 * FLM_ERR_FORMAT (a SUMS region that does not match the file), FLM_ERR_IO, FLM_ERR_NOMEM. */
flm_status flm_file_verify(const flm_file *f, flm_progress_fn progress, void *user, flm_error *err);

/* Read a whole region's payload into memory and check its checksum. *out is malloc'd (caller frees).
 * Errors: FLM_ERR_IO, FLM_ERR_CHECKSUM, FLM_ERR_NOMEM. */
flm_status flm_file_read_region(const flm_file *f, const flm_region *r, void **out, flm_error *err);

/* Read n bytes at file offset off of fd, looping over short reads and EINTR (the writers share it: write/).
 * Errors: FLM_ERR_IO naming path, what and the offset; FLM_ERR_FORMAT when the file ends first (truncated). */
flm_status flm_file_pread(int fd, void *buf, size_t n, uint64_t off, const char *path, const char *what,
                          flm_error *err);

#endif
