/* flm.c — the .flm flash layout (docs/FORMAT.md): open/validate, verify, read a region. Writing (the header, region
 * replacement, the hot order) is the tools tier's: write/flm_write.c; converting a GGUF model is convert/convert.c. */
#include "format/flm.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "core/types.h"
#include "core/error.h"
#include "core/files.h"
#include "core/util.h"

flm_bundle_layout flm_bundle_layout_of(uint32_t d_model, uint32_t up_type, uint32_t gate_type, uint32_t down_type,
                                       bool gated) {
    flm_bundle_layout b;
    b.up_off = 0;
    b.up_bytes = flm_row_bytes(up_type, d_model);
    b.gate_off = b.up_bytes;
    b.gate_bytes = gated && gate_type != FLM_GATE_NONE ? flm_row_bytes(gate_type, d_model) : 0;
    b.down_off = b.gate_off + b.gate_bytes;
    b.down_bytes = flm_row_bytes(down_type, d_model);
    b.record_bytes = b.down_off + b.down_bytes;
    return b;
}

flm_status flm_file_pread(int fd, void *buf, size_t n, uint64_t off, const char *path, const char *what,
                          flm_error *err) {
    uint8_t *p = buf;
    while (n) {
        ssize_t r = pread(fd, p, n, (off_t)off);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return flm_fail(err, FLM_ERR_IO, "%s: %s: read at byte %llu failed: %s", path, what,
                                   (unsigned long long)off, strerror(errno));
        if (r == 0) return flm_fail(err, FLM_ERR_FORMAT, "%s: %s: file ends at byte %llu (truncated)", path, what,
                                    (unsigned long long)off);
        p += r;
        n -= (size_t)r;
        off += (uint64_t)r;
    }
    return FLM_OK;
}

bool flm_region_checksum_ok(const flm_region *r, const void *data) { return XXH64(data, r->size, 0) == r->checksum; }

bool flm_file_is_flm(const char *path) {
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC); /* a FIFO must not block the open: it is no .flm */
    if (fd < 0) return false;
    char m[8];
    struct stat sb;
    bool ok = fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode) && pread(fd, m, 8, 0) == 8 &&
              memcmp(m, FLM_FILE_MAGIC, 8) == 0;
    close(fd);
    return ok;
}

/* ---- reading ------------------------------------------------------------------------------------------------- */

/* "resident region", "FFN region of layer 3", "predictor region" */
static void region_name(const flm_region *r, char *out, size_t n) {
    if (r->kind == FLM_REGION_RESIDENT) snprintf(out, n, "resident region");
    else if (r->kind == FLM_REGION_FFN) snprintf(out, n, "FFN region of layer %u", r->layer);
    else if (r->kind == FLM_REGION_PREDICTOR) snprintf(out, n, "predictor region");
    else if (r->kind == FLM_REGION_SUMS) snprintf(out, n, "record-sums region");
    else snprintf(out, n, "region of kind %u", r->kind);
}

static flm_status check_regions(flm_file *f, flm_error *err) {
    const char *path = f->path;
    uint32_t n_layers = 0;
    for (uint32_t i = 0; i < f->n_regions; i++) {
        const flm_region *r = &f->regions[i];
        if (r->kind != FLM_REGION_RESIDENT && r->kind != FLM_REGION_FFN && r->kind != FLM_REGION_PREDICTOR &&
            r->kind != FLM_REGION_SUMS)
            return flm_fail(err, FLM_ERR_FORMAT, "%s: region %u: unknown kind %u", path, i, r->kind);
        if (r->offset % FLM_ALIGN || r->offset < f->header_bytes)
            return flm_fail(err, FLM_ERR_FORMAT, "%s: region %u: offset %llu is not 4096-aligned after the header",
                            path, i, (unsigned long long)r->offset);
        if (r->size > f->file_size || r->offset > f->file_size - r->size)
            return flm_fail(err, FLM_ERR_FORMAT, "%s: region %u: bytes [%llu, +%llu) run past the end of the file "
                            "(%llu bytes)", path, i, (unsigned long long)r->offset, (unsigned long long)r->size,
                            (unsigned long long)f->file_size);
        if (i > 0) {
            const flm_region *p = &f->regions[i - 1];
            if (r->offset < p->offset + p->size)
                return flm_fail(err, FLM_ERR_FORMAT, "%s: region %u overlaps region %u", path, i, i - 1);
        }
        if (r->kind == FLM_REGION_RESIDENT) {
            if (f->resident) return flm_fail(err, FLM_ERR_FORMAT, "%s: more than one resident region", path);
            if (r->head_bytes > r->size)
                return flm_fail(err, FLM_ERR_FORMAT, "%s: resident region: head of %llu bytes exceeds its %llu bytes",
                                path, (unsigned long long)r->head_bytes, (unsigned long long)r->size);
            f->resident = r;
        } else if (r->kind == FLM_REGION_PREDICTOR) {
            if (f->predictor) return flm_fail(err, FLM_ERR_FORMAT, "%s: more than one predictor region", path);
            f->predictor = r;
        } else if (r->kind == FLM_REGION_SUMS) {
            if (f->sums) return flm_fail(err, FLM_ERR_FORMAT, "%s: more than one record-sums region", path);
            if (f->version < 2)
                return flm_fail(err, FLM_ERR_FORMAT, "%s: region %u: a record-sums region in a version-%u file", path,
                                i, f->version);
            f->sums = r;
        } else {
            if (r->layer != n_layers)
                return flm_fail(err, FLM_ERR_FORMAT, "%s: region %u: FFN layer %u out of order (expected %u)", path,
                                i, r->layer, n_layers);
            n_layers++;
            if (!flm_type_supported(r->up_type) || !flm_type_supported(r->down_type) ||
                (r->gate_type != FLM_GATE_NONE && !flm_type_supported(r->gate_type)))
                return flm_fail(err, FLM_ERR_UNSUPPORTED, "%s: FFN region of layer %u: unsupported tensor type (up %s, "
                                "gate %s, down %s; types by GGUF id: %u, %u, %u)", path, r->layer,
                                flm_type_name(r->up_type) ? flm_type_name(r->up_type) : "unknown",
                                r->gate_type == FLM_GATE_NONE ? "none" : flm_type_name(r->gate_type)
                                    ? flm_type_name(r->gate_type) : "unknown",
                                flm_type_name(r->down_type) ? flm_type_name(r->down_type) : "unknown", r->up_type,
                                r->gate_type, r->down_type);
            /* docs/FORMAT.md: at most one order bit, other bits zero. A bit this reader does not know is a layout
             * it cannot read (a newer writer's), not one to run as if it were absent */
            if ((r->flags & ~(uint64_t)(FLM_FFN_HOT_ORDER | FLM_FFN_COACT_ORDER)) ||
                ((r->flags & FLM_FFN_HOT_ORDER) && (r->flags & FLM_FFN_COACT_ORDER)))
                return flm_fail(err, FLM_ERR_FORMAT, "%s: FFN region of layer %u: flags 0x%llx (known: 0x%x hot order or "
                                "0x%x co-activation order, at most one)", path, r->layer,
                                (unsigned long long)r->flags, (unsigned)FLM_FFN_HOT_ORDER,
                                (unsigned)FLM_FFN_COACT_ORDER);
            if (r->n_records == 0 || r->record_bytes == 0 || r->record_bytes > (1ull << 32) ||
                (uint64_t)r->n_records * r->record_bytes != r->size)
                return flm_fail(err, FLM_ERR_FORMAT, "%s: FFN region of layer %u: %u records of %llu bytes do not "
                                "make its %llu bytes", path, r->layer, r->n_records,
                                (unsigned long long)r->record_bytes, (unsigned long long)r->size);
        }
    }
    if (!f->resident) return flm_fail(err, FLM_ERR_FORMAT, "%s: no resident region", path);
    if (f->version >= 2 && !f->sums)
        return flm_fail(err, FLM_ERR_FORMAT, "%s: a version-%u file without its record-sums region", path, f->version);
    f->n_layers = n_layers;
    f->ffn = calloc(n_layers ? n_layers : 1, sizeof *f->ffn);
    if (!f->ffn) return flm_fail(err, FLM_ERR_NOMEM, "%s: out of memory", path);
    for (uint32_t i = 0; i < f->n_regions; i++)
        if (f->regions[i].kind == FLM_REGION_FFN) f->ffn[f->regions[i].layer] = &f->regions[i];
    return FLM_OK;
}

/* Check the first n bytes of the resident payload (n = head_bytes, or the whole size) against the head's checksum
 * (when the region has a head) and, when n is the whole payload, the region's: one pass over the bytes. */
static flm_status check_resident(const flm_file *f, const uint8_t *data, uint64_t n, flm_error *err) {
    const flm_region *r = f->resident;
    XXH64_state_t *h = XXH64_createState();
    if (!h) return flm_fail(err, FLM_ERR_NOMEM, "%s: out of memory", f->path);
    XXH64_reset(h, 0);
    bool ok = true;
    if (r->head_bytes) {
        XXH64_update(h, data, (size_t)r->head_bytes);
        ok = XXH64_digest(h) == r->head_checksum;
    }
    if (ok && n == r->size) {
        XXH64_update(h, data + r->head_bytes, (size_t)(n - r->head_bytes));
        ok = XXH64_digest(h) == r->checksum;
    }
    XXH64_freeState(h);
    return ok ? FLM_OK : flm_fail(err, FLM_ERR_CHECKSUM, "%s: resident region%s: checksum mismatch (the file is "
                                  "corrupt)", f->path, n < r->size ? " (head)" : "");
}

flm_status flm_file_open(const char *path, flm_file **out, flm_error *err) { return flm_file_open_ex(path, 0, out, err); }

flm_status flm_file_open_ex(const char *path, unsigned flags, flm_file **out, flm_error *err) {
    *out = NULL;
    flm_file *f = calloc(1, sizeof *f);
    if (!f || !(f->path = strdup(path))) { free(f); return flm_fail(err, FLM_ERR_NOMEM, "%s: out of memory", path); }
    flm_status st = FLM_OK;
    uint8_t *hdr = NULL;
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC); /* O_NONBLOCK: a FIFO is refused below, not waited on */
    if (fd < 0) { st = flm_fail(err, FLM_ERR_IO, "%s: cannot open: %s", path, strerror(errno)); goto done; }
    struct stat sb;
    if (fstat(fd, &sb) != 0) { st = flm_fail(err, FLM_ERR_IO, "%s: cannot stat: %s", path, strerror(errno)); goto done; }
    if (!S_ISREG(sb.st_mode)) {
        st = flm_fail(err, FLM_ERR_IO, "%s: is %s, not a regular file: a model must be a file", path,
                      flm_file_kind(sb.st_mode));
        goto done;
    }
    f->file_size = (uint64_t)sb.st_size;
    uint8_t fixed[FLM_HEADER_FIXED];
    if (f->file_size < FLM_HEADER_FIXED) {
        st = flm_fail(err, FLM_ERR_FORMAT, "%s: header: file is only %llu bytes", path,
                      (unsigned long long)f->file_size);
        goto done;
    }
    if ((st = flm_file_pread(fd, fixed, sizeof fixed, 0, path, "header", err))) goto done;
    if (memcmp(fixed, FLM_FILE_MAGIC, 8) != 0) {
        st = flm_fail(err, FLM_ERR_FORMAT, "%s: header: bad magic (not a .flm file)", path);
        goto done;
    }
    f->version = flm_get_u32(fixed + 8);
    if (f->version < FLM_FILE_VERSION_MIN || f->version > FLM_FILE_VERSION) {
        st = flm_fail(err, FLM_ERR_UNSUPPORTED, "%s: header: version %u is not supported (this flashlm reads %u to "
                      "%u); convert the model again", path, f->version, FLM_FILE_VERSION_MIN, FLM_FILE_VERSION);
        goto done;
    }
    f->n_regions = flm_get_u32(fixed + 12);
    uint64_t stored_size = flm_get_u64(fixed + 16), header_sum = flm_get_u64(fixed + 24);
    f->header_bytes = flm_get_u32(fixed + 32);
    if (stored_size != f->file_size) {
        st = flm_fail(err, FLM_ERR_FORMAT, "%s: header: file is %llu bytes but the header says %llu (truncated or "
                      "appended to)", path, (unsigned long long)f->file_size, (unsigned long long)stored_size);
        goto done;
    }
    /* the header has room for its regions, and at most one spare entry (kept by convert for the predictor) */
    if (f->n_regions < 2 || f->n_regions > FLM_MAX_REGIONS ||
        (f->header_bytes != flm_align_up(FLM_HEADER_FIXED + (uint64_t)f->n_regions * FLM_REGION_ENTRY_BYTES, FLM_ALIGN) &&
         f->header_bytes != flm_align_up(FLM_HEADER_FIXED + (uint64_t)(f->n_regions + 1) * FLM_REGION_ENTRY_BYTES,
                                     FLM_ALIGN)) ||
        f->header_bytes > f->file_size) {
        st = flm_fail(err, FLM_ERR_FORMAT, "%s: header: %u regions / header size %u are inconsistent", path,
                      f->n_regions, f->header_bytes);
        goto done;
    }
    hdr = malloc(f->header_bytes);
    f->regions = calloc(f->n_regions, sizeof *f->regions);
    if (!hdr || !f->regions) { st = flm_fail(err, FLM_ERR_NOMEM, "%s: out of memory", path); goto done; }
    if ((st = flm_file_pread(fd, hdr, f->header_bytes, 0, path, "header", err))) goto done;
    if (XXH64(hdr + 32, f->header_bytes - 32, 0) != header_sum) {
        st = flm_fail(err, FLM_ERR_CHECKSUM, "%s: header: checksum mismatch (the file is corrupt)", path);
        goto done;
    }
    /* docs/FORMAT.md: bytes 36..63 are reserved, zero; a writer that sets them means something this reader does
     * not know (the checksum above matched, so it is not damage) */
    for (uint32_t i = 36; i < FLM_HEADER_FIXED; i++)
        if (hdr[i]) {
            st = flm_fail(err, FLM_ERR_UNSUPPORTED, "%s: header: reserved byte %u is 0x%02x, not zero (written by a "
                          "newer flashlm, or not by flashlm); convert the model again", path, i, hdr[i]);
            goto done;
        }
    for (uint32_t i = 0; i < f->n_regions; i++) {
        const uint8_t *e = hdr + FLM_HEADER_FIXED + (size_t)i * FLM_REGION_ENTRY_BYTES;
        flm_region *r = &f->regions[i];
        r->kind = flm_get_u32(e);
        r->layer = flm_get_u32(e + 4);
        r->offset = flm_get_u64(e + 8);
        r->size = flm_get_u64(e + 16);
        r->checksum = flm_get_u64(e + 24);
        r->up_type = flm_get_u32(e + 32);
        r->gate_type = flm_get_u32(e + 36);
        r->down_type = flm_get_u32(e + 40);
        r->n_records = flm_get_u32(e + 44);
        if (r->kind == FLM_REGION_RESIDENT) {
            r->head_bytes = flm_get_u64(e + 48);
            r->head_checksum = flm_get_u64(e + 56);
        } else {
            r->record_bytes = flm_get_u64(e + 48);
            r->flags = flm_get_u64(e + 56);
        }
    }
    if ((st = check_regions(f, err))) goto done;
    if (flags & FLM_FILE_HEADER_ONLY) goto done;
    /* the resident region (or its head only: FLM_FILE_LAZY_TAIL): into memory, checksummed, parsed as GGUF */
    const flm_region *res = f->resident;
    bool lazy = (flags & FLM_FILE_LAZY_TAIL) && res->head_bytes > 0 && res->head_bytes < res->size;
    uint64_t n = lazy ? res->head_bytes : res->size;
    if (n > SIZE_MAX || !(f->resident_data = malloc(n ? (size_t)n : 1))) {
        st = flm_fail(err, FLM_ERR_NOMEM, "%s: cannot allocate %llu bytes for the resident region", path,
                      (unsigned long long)n);
        goto done;
    }
    f->resident_loaded = n;
    if ((st = flm_file_pread(fd, f->resident_data, (size_t)n, res->offset, path, "resident region", err))) goto done;
    if ((st = check_resident(f, f->resident_data, n, err))) goto done;
#ifdef POSIX_FADV_DONTNEED
    posix_fadvise(fd, (off_t)res->offset, (off_t)n, POSIX_FADV_DONTNEED);
#endif
    char name[4096];
    snprintf(name, sizeof name, "%s (resident region)", path);
    if ((st = flm_gguf_open_buffer_partial(name, f->resident_data, (size_t)n, res->size, &f->meta, err))) goto done;
    for (uint64_t i = 0; i < f->meta->n_tensors; i++) { /* the tail holds the token embedding and nothing else */
        const flm_gguf_tensor *t = &f->meta->tensors[i];
        uint64_t start = f->meta->data_offset + t->offset;
        if (!t->data && (strcmp(t->name, "token_embd.weight") != 0 || start < res->head_bytes)) {
            st = flm_fail(err, FLM_ERR_FORMAT, "%s: resident region: tensor '%s' at bytes [%llu, %llu) lies %s the "
                          "head of %llu bytes, where only token_embd.weight may", path, t->name,
                          (unsigned long long)start, (unsigned long long)(start + t->nbytes),
                          start < res->head_bytes ? "across" : "past", (unsigned long long)res->head_bytes);
            goto done;
        }
    }
done:
    if (fd >= 0) close(fd);
    free(hdr);
    if (st) flm_file_close(f);
    else *out = f;
    return st;
}

bool flm_file_tail_pending(const flm_file *f) { return f->resident_loaded < f->resident->size; }

uint64_t flm_file_tail_bytes(const flm_file *f) {
    const flm_region *r = f->resident;
    return r->head_bytes ? r->size - r->head_bytes : 0;
}

flm_status flm_file_load_head_skip(flm_file *f, uint64_t skip_lo, uint64_t skip_hi, uint64_t unit, uint64_t *sums,
                                   flm_error *err) {
    const flm_region *r = f->resident;
    const bool split = r->head_bytes > 0 && r->head_bytes < r->size;
    const uint64_t n = split ? r->head_bytes : r->size, d0 = f->meta ? f->meta->data_offset : 0;
    if (!f->meta || f->resident_loaded || f->head_kept || skip_lo < d0 || skip_hi < skip_lo || skip_hi > n || !unit)
        return flm_fail(err, FLM_ERR_ARG, "%s: resident region: cannot skip bytes [%llu, %llu) of its head", f->path,
                        (unsigned long long)skip_lo, (unsigned long long)skip_hi);
    for (uint64_t i = 0; i < f->meta->n_tensors; i++) {
        const flm_gguf_tensor *t = &f->meta->tensors[i];
        const uint64_t a = d0 + t->offset, b = a + t->nbytes;
        if (a < skip_hi && b > skip_hi)
            return flm_fail(err, FLM_ERR_ARG, "%s: resident region: tensor '%s' crosses byte %llu, where a skip ends",
                            f->path, t->name, (unsigned long long)skip_hi);
    }
    const uint64_t skip = skip_hi - skip_lo, keep = n - d0 - skip;
    if (keep > SIZE_MAX || !(f->head_kept = malloc(keep ? (size_t)keep : 1)))
        return flm_fail(err, FLM_ERR_NOMEM, "%s: cannot allocate %llu bytes for the resident weights", f->path,
                        (unsigned long long)keep);
    const size_t piece = 1u << 20;
    uint8_t *buf = malloc(piece);
    XXH64_state_t *h = XXH64_createState();
    XXH3_state_t *u = XXH3_createState();
    int fd = open(f->path, O_RDONLY | O_CLOEXEC);
    flm_status st = FLM_OK;
    if (!buf || !h || !u) st = flm_fail(err, FLM_ERR_NOMEM, "%s: out of memory", f->path);
    else if (fd < 0) st = flm_fail(err, FLM_ERR_IO, "%s: cannot open: %s", f->path, strerror(errno));
    if (!st) XXH64_reset(h, 0);
    uint8_t *kept = f->head_kept;
    for (uint64_t o = 0; !st && o < n;) {
        const size_t m = n - o < piece ? (size_t)(n - o) : piece;
        if ((st = flm_file_pread(fd, buf, m, r->offset + o, f->path, "resident region", err))) break;
        XXH64_update(h, buf, m);
        for (uint64_t p = o; p < o + m;) { /* the piece in parts: header, kept data, skipped units */
            uint64_t end = o + m;
            if (p < d0) {
                p = end < d0 ? end : d0;
            } else if (p < skip_lo || p >= skip_hi) {
                if (p < skip_lo && end > skip_lo) end = skip_lo;
                memcpy(kept + (p < skip_lo ? p - d0 : p - d0 - skip), buf + (p - o), (size_t)(end - p));
                p = end;
            } else { /* units of the skipped bytes, hashed as they pass */
                const uint64_t k = (p - skip_lo) / unit, us = skip_lo + k * unit;
                const uint64_t ue = us + unit < skip_hi ? us + unit : skip_hi;
                if (end > ue) end = ue;
                if (p == us) XXH3_64bits_reset(u);
                XXH3_64bits_update(u, buf + (p - o), (size_t)(end - p));
                if (end == ue) sums[k] = XXH3_64bits_digest(u);
                p = end;
            }
        }
        o += m;
    }
    if (!st) {
        const uint64_t want = split ? r->head_checksum : r->checksum;
        if (XXH64_digest(h) != want)
            st = flm_fail(err, FLM_ERR_CHECKSUM, "%s: resident region%s: checksum mismatch (the file is corrupt)",
                          f->path, split ? " (head)" : "");
    }
#ifdef POSIX_FADV_DONTNEED
    if (fd >= 0) posix_fadvise(fd, (off_t)r->offset, (off_t)n, POSIX_FADV_DONTNEED);
#endif
    if (fd >= 0) close(fd);
    free(buf);
    XXH64_freeState(h);
    XXH3_freeState(u);
    if (st) {
        free(f->head_kept);
        f->head_kept = NULL;
        return st;
    }
    for (uint64_t i = 0; i < f->meta->n_tensors; i++) {
        flm_gguf_tensor *t = &f->meta->tensors[i];
        const uint64_t a = d0 + t->offset;
        t->data = a >= n || (a >= skip_lo && a < skip_hi) ? NULL : kept + (a < skip_lo ? a - d0 : a - d0 - skip);
    }
    f->resident_loaded = n;
    return FLM_OK;
}

flm_status flm_file_load_tail(flm_file *f, flm_error *err) {
    if (!flm_file_tail_pending(f)) return FLM_OK;
    if (f->head_kept)
        return flm_fail(err, FLM_ERR_ARG, "%s: the token embedding cannot be loaded after a partial head", f->path);
    const flm_region *r = f->resident;
    uint64_t head = f->resident_loaded, n = r->size - head;
    if (n > SIZE_MAX || !(f->tail_data = malloc((size_t)n)))
        return flm_fail(err, FLM_ERR_NOMEM, "%s: cannot allocate %llu bytes for the token embedding", f->path,
                        (unsigned long long)n);
    int fd = open(f->path, O_RDONLY);
    flm_status st = fd < 0 ? flm_fail(err, FLM_ERR_IO, "%s: cannot open: %s", f->path, strerror(errno))
                           : flm_file_pread(fd, f->tail_data, (size_t)n, r->offset + head, f->path, "resident region", err);
    XXH64_state_t *h = st ? NULL : XXH64_createState();
    if (!st && !h) st = flm_fail(err, FLM_ERR_NOMEM, "%s: out of memory", f->path);
    if (!st) {
        XXH64_reset(h, 0);
        XXH64_update(h, f->resident_data, (size_t)head);
        XXH64_update(h, f->tail_data, (size_t)n);
        if (XXH64_digest(h) != r->checksum)
            st = flm_fail(err, FLM_ERR_CHECKSUM, "%s: resident region: checksum mismatch (the file is corrupt)",
                          f->path);
    }
    XXH64_freeState(h);
    if (fd >= 0) {
#ifdef POSIX_FADV_DONTNEED
        posix_fadvise(fd, (off_t)(r->offset + head), (off_t)n, POSIX_FADV_DONTNEED);
#endif
        close(fd);
    }
    if (st) {
        free(f->tail_data);
        f->tail_data = NULL;
        return st;
    }
    for (uint64_t i = 0; i < f->meta->n_tensors; i++) { /* checked at open: NULL ones lie wholly in the tail */
        flm_gguf_tensor *t = &f->meta->tensors[i];
        if (!t->data) t->data = (const uint8_t *)f->tail_data + (f->meta->data_offset + t->offset - head);
    }
    f->resident_loaded = r->size;
    return FLM_OK;
}

void flm_file_close(flm_file *f) {
    if (!f) return;
    flm_gguf_close(f->meta);
    free(f->resident_data);
    free(f->tail_data);
    free(f->head_kept);
    free(f->regions);
    free(f->ffn);
    free(f->path);
    free(f);
}

/* ---- record sums ---------------------------------------------------------------------------------------------- */

void flm_sums_free(flm_sums *s) {
    if (!s) return;
    free(s->tables);
    free(s->ffn);
    free(s->data);
    memset(s, 0, sizeof *s);
}

/* Parse and check the SUMS payload p[0, size) of f into s (tables pointing into p, which s takes; the sums are
 * converted to host order in place when to_host). */
static flm_status sums_parse(const flm_file *f, uint8_t *p, uint64_t size, bool to_host, flm_sums *s,
                             flm_error *err) {
    const char *path = f->path;
    memset(s, 0, sizeof *s);
    if (size < FLM_SUMS_HEAD)
        return flm_fail(err, FLM_ERR_FORMAT, "%s: record-sums region: %llu bytes is too short", path,
                        (unsigned long long)size);
    uint32_t n = flm_get_u32(p);
    if (n > f->n_layers + 1u || flm_get_u32(p + 4) != 0 || (uint64_t)FLM_SUMS_HEAD + (uint64_t)n * FLM_SUMS_ENTRY > size)
        return flm_fail(err, FLM_ERR_FORMAT, "%s: record-sums region: %u tables do not fit its %llu bytes (at most "
                        "one per FFN layer and one embedding)", path, n, (unsigned long long)size);
    s->tables = calloc(n ? n : 1, sizeof *s->tables);
    s->ffn = calloc(f->n_layers ? f->n_layers : 1, sizeof *s->ffn);
    if (!s->tables || !s->ffn) {
        flm_sums_free(s);
        return flm_fail(err, FLM_ERR_NOMEM, "%s: out of memory for the record sums", path);
    }
    s->n_tables = n;
    uint64_t pos = FLM_SUMS_HEAD + (uint64_t)n * FLM_SUMS_ENTRY;
    flm_status st = FLM_OK;
    for (uint32_t i = 0; i < n && !st; i++) {
        const uint8_t *e = p + FLM_SUMS_HEAD + (size_t)i * FLM_SUMS_ENTRY;
        flm_sums_table *t = &s->tables[i];
        *t = (flm_sums_table){flm_get_u32(e), flm_get_u32(e + 4), flm_get_u64(e + 8), flm_get_u64(e + 16),
                              flm_get_u64(e + 24), NULL, pos};
        if (t->n_units > (size - pos) / 8) {
            st = flm_fail(err, FLM_ERR_FORMAT, "%s: record-sums region: table %u's %llu sums run past its %llu bytes",
                          path, i, (unsigned long long)t->n_units, (unsigned long long)size);
            break;
        }
        pos += t->n_units * 8;
        if (t->kind == FLM_SUMS_FFN) {
            const flm_region *r = t->layer < f->n_layers ? f->ffn[t->layer] : NULL;
            if (!r || s->ffn[t->layer] || t->offset != 0 || t->unit_bytes != r->record_bytes ||
                t->n_units != r->n_records)
                st = flm_fail(err, FLM_ERR_FORMAT, "%s: record-sums region: table %u (layer %u: %llu units of %llu "
                              "bytes at %llu) does not match an FFN region's records, or repeats one", path, i,
                              t->layer, (unsigned long long)t->n_units, (unsigned long long)t->unit_bytes,
                              (unsigned long long)t->offset);
            else
                s->ffn[t->layer] = t;
        } else if (t->kind == FLM_SUMS_EMBD) {
            const flm_region *r = f->resident;
            if (s->embd || t->layer || (r->head_bytes && t->offset != r->head_bytes) || !t->unit_bytes ||
                t->offset > r->size || t->n_units > (r->size - t->offset) / t->unit_bytes)
                st = flm_fail(err, FLM_ERR_FORMAT, "%s: record-sums region: table %u (%llu embedding rows of %llu "
                              "bytes at %llu) does not lie in the resident region (its tail), or repeats one", path, i,
                              (unsigned long long)t->n_units, (unsigned long long)t->unit_bytes,
                              (unsigned long long)t->offset);
            else
                s->embd = t;
        } else {
            st = flm_fail(err, FLM_ERR_FORMAT, "%s: record-sums region: table %u has unknown kind %u", path, i,
                          t->kind);
        }
    }
    if (!st && pos != size)
        st = flm_fail(err, FLM_ERR_FORMAT, "%s: record-sums region: %llu bytes, its tables need %llu", path,
                      (unsigned long long)size, (unsigned long long)pos);
    for (uint32_t l = 0; l < f->n_layers && !st; l++)
        if (!s->ffn[l])
            st = flm_fail(err, FLM_ERR_FORMAT, "%s: record-sums region: no table for the FFN region of layer %u", path,
                          l);
    if (st) {
        flm_sums_free(s);
        return st;
    }
    for (uint32_t i = 0; i < n; i++) {
        flm_sums_table *t = &s->tables[i];
        uint64_t *v = (uint64_t *)(void *)(p + t->pos); /* pos is a multiple of 8 in a malloc'd block */
        if (to_host)
            for (uint64_t k = 0; k < t->n_units; k++) v[k] = flm_get_u64((const uint8_t *)&v[k]);
        t->sums = v;
    }
    s->data = (uint64_t *)(void *)p;
    s->bytes = size + n * sizeof *s->tables + f->n_layers * sizeof *s->ffn;
    return FLM_OK;
}

flm_status flm_sums_load(const flm_file *f, flm_sums *s, flm_error *err) {
    memset(s, 0, sizeof *s);
    if (!f->sums)
        return flm_fail(err, FLM_ERR_FORMAT, "%s: no record sums (a version-%u file, written before flashlm stored "
                        "them): convert the model again", f->path, f->version);
    void *p = NULL;
    flm_status st = flm_file_read_region(f, f->sums, &p, err);
    if (st) return st;
    if ((st = sums_parse(f, p, f->sums->size, true, s, err))) free(p);
    return st;
}

void flm_sums_table_name(const flm_sums_table *t, char *out, size_t n) {
    if (t->kind == FLM_SUMS_FFN) snprintf(out, n, "FFN region of layer %u", t->layer);
    else snprintf(out, n, "token embedding");
}

const char *flm_sums_unit_name(const flm_sums_table *t) { return t->kind == FLM_SUMS_FFN ? "record" : "row"; }

/* flm_file_verify's unit checks within one region: the table of its units, and a streaming XXH3 of the unit the
 * chunks are in the middle of. */
typedef struct unit_check {
    const flm_sums_table *t;
    XXH3_state_t *h;
} unit_check;

/* Bytes [o, o + n) of the region's payload are in buf: hash the units of u->t they hold, comparing each when its
 * last byte has been hashed. */
static flm_status check_units(const flm_file *f, const flm_region *r, unit_check *u, const uint8_t *buf, uint64_t o,
                              uint64_t n, flm_error *err) {
    const flm_sums_table *t = u->t;
    const uint64_t t0 = t->offset, t1 = t->offset + t->n_units * t->unit_bytes;
    uint64_t pos = o > t0 ? o : t0, end = o + n < t1 ? o + n : t1;
    while (pos < end) {
        uint64_t k = (pos - t0) / t->unit_bytes, us = t0 + k * t->unit_bytes, ue = us + t->unit_bytes;
        if (pos == us) XXH3_64bits_reset(u->h);
        uint64_t take = (ue < end ? ue : end) - pos;
        XXH3_64bits_update(u->h, buf + (pos - o), (size_t)take);
        pos += take;
        if (pos == ue && XXH3_64bits_digest(u->h) != t->sums[k]) {
            char what[48];
            flm_sums_table_name(t, what, sizeof what);
            return flm_fail(err, FLM_ERR_CHECKSUM, "%s: %s, %s %llu (file bytes %llu..%llu): checksum mismatch (the "
                            "file is corrupt)", f->path, what, flm_sums_unit_name(t), (unsigned long long)k,
                            (unsigned long long)(r->offset + us), (unsigned long long)(r->offset + ue));
        }
    }
    return FLM_OK;
}

flm_status flm_file_verify(const flm_file *f, flm_progress_fn progress, void *user, flm_error *err) {
    int fd = open(f->path, O_RDONLY);
    if (fd < 0) return flm_fail(err, FLM_ERR_IO, "%s: cannot open: %s", f->path, strerror(errno));
    const size_t chunk = 8u << 20;
    uint8_t *buf = malloc(chunk);
    XXH64_state_t *h = XXH64_createState();
    flm_sums sums = {0};
    unit_check u = {NULL, XXH3_createState()};
    flm_status st = FLM_OK;
    if (!buf || !h || !u.h) { st = flm_fail(err, FLM_ERR_NOMEM, "%s: out of memory", f->path); goto done; }
    if (f->sums && (st = flm_sums_load(f, &sums, err))) goto done; /* the record sums, checked, before the records */
    uint64_t total = 0, done_bytes = 0;
    for (uint32_t i = 0; i < f->n_regions; i++) total += f->regions[i].size;
    for (uint32_t i = 0; i < f->n_regions && !st; i++) {
        const flm_region *r = &f->regions[i];
        char what[64];
        region_name(r, what, sizeof what);
        XXH64_reset(h, 0);
        bool head_ok = true;
        u.t = !f->sums ? NULL : r->kind == FLM_REGION_FFN ? sums.ffn[r->layer]
                              : r->kind == FLM_REGION_RESIDENT ? sums.embd : NULL;
        for (uint64_t o = 0; o < r->size && !st; o += chunk) {
            size_t n = (size_t)(r->size - o < chunk ? r->size - o : chunk);
            if ((st = flm_file_pread(fd, buf, n, r->offset + o, f->path, what, err))) break;
            if (u.t && (st = check_units(f, r, &u, buf, o, n, err))) break;
            if (r->head_bytes && o < r->head_bytes && o + n >= r->head_bytes) { /* the head ends in this chunk */
                XXH64_update(h, buf, (size_t)(r->head_bytes - o));
                head_ok = XXH64_digest(h) == r->head_checksum;
                XXH64_update(h, buf + (r->head_bytes - o), n - (size_t)(r->head_bytes - o));
            } else {
                XXH64_update(h, buf, n);
            }
            done_bytes += n;
            if (progress) progress(user, "verify", done_bytes, total);
        }
        if (!st && !head_ok)
            st = flm_fail(err, FLM_ERR_CHECKSUM, "%s: %s (head): checksum mismatch (the file is corrupt)", f->path,
                          what);
        if (!st && XXH64_digest(h) != r->checksum)
            st = flm_fail(err, FLM_ERR_CHECKSUM, "%s: %s: checksum mismatch (the file is corrupt)", f->path, what);
#ifdef POSIX_FADV_DONTNEED
        posix_fadvise(fd, (off_t)r->offset, (off_t)r->size, POSIX_FADV_DONTNEED);
#endif
    }
done:
    XXH64_freeState(h);
    XXH3_freeState(u.h);
    flm_sums_free(&sums);
    free(buf);
    close(fd);
    return st;
}

flm_status flm_file_read_region(const flm_file *f, const flm_region *r, void **out, flm_error *err) {
    *out = NULL;
    if (r->size > SIZE_MAX - 1) return flm_fail(err, FLM_ERR_NOMEM, "%s: region too large", f->path);
    void *buf = malloc(r->size ? (size_t)r->size : 1);
    if (!buf) return flm_fail(err, FLM_ERR_NOMEM, "%s: cannot allocate %llu bytes", f->path,
                              (unsigned long long)r->size);
    int fd = open(f->path, O_RDONLY);
    if (fd < 0) { free(buf); return flm_fail(err, FLM_ERR_IO, "%s: cannot open: %s", f->path, strerror(errno)); }
    char what[64];
    region_name(r, what, sizeof what);
    flm_status st = flm_file_pread(fd, buf, (size_t)r->size, r->offset, f->path, what, err);
    close(fd);
    if (!st && XXH64(buf, (size_t)r->size, 0) != r->checksum)
        st = flm_fail(err, FLM_ERR_CHECKSUM, "%s: %s: checksum mismatch (the file is corrupt)", f->path, what);
    if (st) { free(buf); return st; }
    *out = buf;
    return FLM_OK;
}
