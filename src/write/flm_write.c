/* flm_write.c — writing .flm files (docs/FORMAT.md), the tools tier's: the sequential writer's pieces and the header
 * (convert/convert.c writes a whole file with them), replacing one region (calibrate's predictors) and storing the
 * FFN records in a new order (calibrate's hot order). The runtime only reads (format/flm.c). */
#include "write/flm_write.h"

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
#include "flashlm_tools.h" /* the checked writer (write/out.c) */
#include "core/util.h"

/* ---- writing ------------------------------------------------------------------------------------------------- */

flm_status flm_write_cursor_put(flm_write_cursor *o, const void *p, size_t n, flm_error *err) {
    if (n && fwrite(p, 1, n, o->fp) != n)
        return flm_fail(err, FLM_ERR_IO, "%s: write failed: %s", o->path, strerror(errno));
    if (o->h) XXH64_update(o->h, p, n);
    o->pos += n;
    return FLM_OK;
}

flm_status flm_write_cursor_pad(flm_write_cursor *o, flm_error *err) {
    static const uint8_t zeros[FLM_ALIGN];
    uint64_t pad = flm_align_up(o->pos, FLM_ALIGN) - o->pos;
    XXH64_state_t *h = o->h;
    o->h = NULL; /* padding is not part of any checksum */
    flm_status st = flm_write_cursor_put(o, zeros, (size_t)pad, err);
    o->h = h;
    return st;
}

void flm_build_header(uint8_t *hdr, uint32_t header_bytes, const flm_region *regions, uint32_t n_regions,
                         uint64_t file_size) {
    memset(hdr, 0, header_bytes);
    memcpy(hdr, FLM_FILE_MAGIC, 8);
    uint32_t version = 1; /* the version a file's regions need: 2 with record sums */
    for (uint32_t i = 0; i < n_regions; i++)
        if (regions[i].kind == FLM_REGION_SUMS) version = 2;
    flm_put_u32(hdr + 8, version);
    flm_put_u32(hdr + 12, n_regions);
    flm_put_u64(hdr + 16, file_size);
    flm_put_u32(hdr + 32, header_bytes);
    for (uint32_t i = 0; i < n_regions; i++) {
        uint8_t *e = hdr + FLM_HEADER_FIXED + (size_t)i * FLM_REGION_ENTRY_BYTES;
        const flm_region *r = &regions[i];
        flm_put_u32(e, r->kind);
        flm_put_u32(e + 4, r->layer);
        flm_put_u64(e + 8, r->offset);
        flm_put_u64(e + 16, r->size);
        flm_put_u64(e + 24, r->checksum);
        flm_put_u32(e + 32, r->up_type);
        flm_put_u32(e + 36, r->gate_type);
        flm_put_u32(e + 40, r->down_type);
        flm_put_u32(e + 44, r->n_records);
        if (r->kind == FLM_REGION_RESIDENT) {
            flm_put_u64(e + 48, r->head_bytes);
            flm_put_u64(e + 56, r->head_checksum);
        } else {
            flm_put_u64(e + 48, r->record_bytes);
            flm_put_u64(e + 56, r->flags);
        }
    }
    flm_put_u64(hdr + 24, XXH64(hdr + 32, header_bytes - 32, 0));
}

/* Write n bytes at file offset off, looping: one pwrite(2) transfers at most 0x7ffff000 bytes on Linux and may return
 * early (a full disk, a signal); EINTR is retried. Errors: FLM_ERR_IO naming path, what and the offset (a write
 * that makes no progress reports ENOSPC). */
static flm_status pwrite_all(int fd, const void *buf, uint64_t n, uint64_t off, const char *path, const char *what,
                             flm_error *err) {
    const uint8_t *p = buf;
    while (n) {
        size_t m = n > (UINT64_C(1) << 30) ? (size_t)1 << 30 : (size_t)n;
        ssize_t w = pwrite(fd, p, m, (off_t)off);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return flm_fail(err, FLM_ERR_IO, "%s: %s: write at byte %llu failed: %s", path, what,
                                    (unsigned long long)off, strerror(w < 0 ? errno : ENOSPC));
        p += w;
        n -= (uint64_t)w;
        off += (uint64_t)w;
    }
    return FLM_OK;
}

flm_status flm_file_put_region(const char *path, uint32_t kind, const void *payload, uint64_t size, flm_error *err) {
    flm_file *f = NULL;
    /* the header and regions only: the regions are copied as they are, nothing is loaded (calibrate under a memory
     * budget smaller than the resident region calls this) */
    flm_status st = flm_file_open_ex(path, FLM_FILE_HEADER_ONLY, &f, err);
    if (st) return st;
    /* keep every region but the one being replaced; they stay where they are */
    flm_region *regions = calloc(f->n_regions + 1, sizeof *regions);
    uint8_t *hdr = calloc(f->header_bytes, 1);
    const char *tmp = NULL;
    flm_out *w = NULL; /* the checked writer (core/files.h): path replaced by a unique temporary, renamed */
    int in = -1, out = -1;
    if (!regions || !hdr) { st = flm_fail(err, FLM_ERR_NOMEM, "%s: out of memory", path); goto done; }
    uint32_t n = 0;
    uint64_t end = f->header_bytes;
    for (uint32_t i = 0; i < f->n_regions; i++) {
        if (f->regions[i].kind == kind) continue;
        regions[n++] = f->regions[i];
        uint64_t e = flm_align_up(f->regions[i].offset + f->regions[i].size, FLM_ALIGN);
        if (e > end) end = e;
    }
    if (FLM_HEADER_FIXED + (uint64_t)(n + 1) * FLM_REGION_ENTRY_BYTES > f->header_bytes) {
        st = flm_fail(err, FLM_ERR_FORMAT, "%s: the header has no room for another region; convert the model again",
                      path);
        goto done;
    }
    regions[n] = (flm_region){.kind = kind, .offset = end, .size = size, .checksum = XXH64(payload, size, 0)};
    uint64_t file_size = flm_align_up(end + size, FLM_ALIGN);
    flm_build_header(hdr, f->header_bytes, regions, n + 1, file_size);
    if ((in = open(path, O_RDONLY | O_CLOEXEC)) < 0) {
        st = flm_fail(err, FLM_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
        goto done;
    }
    if ((st = flm_out_open(path, path, FLM_OUT_SELF | FLM_OUT_REPLACE, &w, err))) goto done;
    tmp = flm_out_temp(w);
    out = flm_out_fd(w);
    /* copy [header_bytes, end) — the kept regions — then write the new region and the header */
    uint64_t off = f->header_bytes;
    while (off < end) {
        loff_t a = (loff_t)off, b = (loff_t)off;
        ssize_t k = copy_file_range(in, &a, out, &b, (size_t)(end - off < (1u << 30) ? end - off : (1u << 30)), 0);
        if (k < 0 && (errno == EXDEV || errno == ENOSYS || errno == EINVAL || errno == EOPNOTSUPP)) {
            uint8_t buf[1 << 16]; /* fallback: plain copy */
            size_t m = (size_t)(end - off < sizeof buf ? end - off : sizeof buf);
            if ((st = flm_file_pread(in, buf, m, off, path, "copy", err))) goto done;
            if ((st = pwrite_all(out, buf, m, off, tmp, "copy", err))) goto done;
            k = (ssize_t)m;
        }
        if (k <= 0) { st = flm_fail(err, FLM_ERR_IO, "%s: copy failed: %s", tmp, strerror(errno)); goto done; }
        off += (uint64_t)k;
    }
    static const uint8_t zeros[FLM_ALIGN];
    if ((st = pwrite_all(out, payload, size, end, tmp, "region", err)) ||
        (st = pwrite_all(out, zeros, file_size - end - size, end + size, tmp, "padding", err)) ||
        (st = pwrite_all(out, hdr, f->header_bytes, 0, tmp, "header", err)))
        goto done;
    st = flm_out_commit(w, err); /* fsync, close, rename; frees w */
    w = NULL;
done:
    if (in >= 0) close(in);
    flm_out_abort(w); /* an error before the commit: the temporary is removed */
    free(hdr);
    free(regions);
    flm_file_close(f);
    return st;
}

uint8_t *flm_sums_payload_new(flm_sums_table *t, uint32_t n, uint64_t *size) {
    uint64_t pos = FLM_SUMS_HEAD + (uint64_t)n * FLM_SUMS_ENTRY;
    for (uint32_t i = 0; i < n; i++) {
        if (t[i].n_units > (UINT64_C(1) << 40)) return NULL;
        t[i].pos = pos;
        pos += t[i].n_units * 8;
    }
    if (pos > SIZE_MAX) return NULL;
    uint8_t *p = calloc((size_t)pos, 1);
    if (!p) return NULL;
    flm_put_u32(p, n);
    for (uint32_t i = 0; i < n; i++) {
        uint8_t *e = p + FLM_SUMS_HEAD + (size_t)i * FLM_SUMS_ENTRY;
        flm_put_u32(e, t[i].kind);
        flm_put_u32(e + 4, t[i].layer);
        flm_put_u64(e + 8, t[i].offset);
        flm_put_u64(e + 16, t[i].unit_bytes);
        flm_put_u64(e + 24, t[i].n_units);
    }
    *size = pos;
    return p;
}

flm_status flm_file_permute_ffn(const char *path, const uint32_t *const *perm, flm_error *err) {
    return flm_file_permute_ffn_to(path, path, perm, err);
}

flm_status flm_file_permute_ffn_to(const char *path, const char *dst, const uint32_t *const *perm, flm_error *err) {
    return flm_file_permute_ffn_ex(path, dst, perm, FLM_FFN_HOT_ORDER, false, NULL, 0, err);
}

/* One FFN bias vector of the resident GGUF in the new order: payload bytes [off, off + len) are replaced by data. */
typedef struct bias_patch {
    uint64_t off, len;
    uint8_t *data;
} bias_patch;

/* The resident region's FFN biases (blk.N.ffn_up.bias, blk.N.ffn_gate.bias: one element per neuron) permuted as
 * perm orders the records: *out gets n_out patches (malloc'd, each with its data). Errors: FLM_ERR_UNSUPPORTED (a
 * bias of a block type, or not d_ffn long), FLM_ERR_NOMEM. */
static flm_status bias_patches(const flm_file *f, const uint32_t *const *perm, bias_patch **out, uint32_t *n_out,
                               flm_error *err) {
    *out = NULL;
    *n_out = 0;
    const flm_gguf_file *g = f->meta;
    bias_patch *p = calloc(2 * (size_t)f->n_layers + 1, sizeof *p);
    if (!p) return flm_fail(err, FLM_ERR_NOMEM, "%s: out of memory", f->path);
    uint32_t n = 0;
    for (uint32_t l = 0; l < f->n_layers; l++)
        for (int k = 0; k < 2; k++) {
            char name[64];
            snprintf(name, sizeof name, "blk.%u.ffn_%s.bias", l, k ? "gate" : "up");
            const flm_gguf_tensor *t = flm_gguf_find_tensor(g, name);
            if (!t) continue;
            const uint32_t F = f->ffn[l]->n_records;
            if (t->n_elements != F || t->nbytes % F || !t->data) {
                for (uint32_t j = 0; j < n; j++) free(p[j].data);
                free(p);
                return flm_fail(err, FLM_ERR_UNSUPPORTED, "%s: %s holds %llu elements in %llu bytes, not one element "
                                "per neuron of the %u: its order cannot follow the records'", f->path, name,
                                (unsigned long long)t->n_elements, (unsigned long long)t->nbytes, F);
            }
            const size_t es = (size_t)(t->nbytes / F);
            uint8_t *d = malloc((size_t)t->nbytes);
            if (!d) {
                for (uint32_t j = 0; j < n; j++) free(p[j].data);
                free(p);
                return flm_fail(err, FLM_ERR_NOMEM, "%s: out of memory", f->path);
            }
            for (uint32_t i = 0; i < F; i++) memcpy(d + (size_t)i * es, t->data + (size_t)perm[l][i] * es, es);
            p[n++] = (bias_patch){g->data_offset + t->offset, t->nbytes, d};
        }
    *out = p;
    *n_out = n;
    return FLM_OK;
}

flm_status flm_file_permute_ffn_ex(const char *path, const char *dst, const uint32_t *const *perm, uint64_t order_flag,
                                   bool biases, const void *predictor, uint64_t predictor_size, flm_error *err) {
    flm_file *f = NULL;
    flm_status st = flm_file_open_ex(path, FLM_FILE_LAZY_TAIL, &f, err); /* the GGUF metadata: FFN biases? */
    if (st) return st;
    flm_region *regions = calloc(f->n_regions + 1, sizeof *regions);
    uint8_t *hdr = calloc(f->header_bytes, 1), *next = NULL, *seen = NULL;
    void *cur = NULL;
    bias_patch *patch = NULL;
    uint32_t n_patch = 0;
    flm_sums sums = {0}; /* the record sums: the FFN tables are computed again in the new order */
    const char *tmp = NULL;
    flm_out *w = NULL; /* the checked writer (core/files.h): path replaced by a unique temporary, renamed */
    int in = -1, out = -1;
    if (!regions || !hdr) { st = flm_fail(err, FLM_ERR_NOMEM, "%s: out of memory", path); goto done; }
    /* every order a permutation, before anything reads by it */
    for (uint32_t l = 0; l < f->n_layers; l++) {
        const uint32_t F = f->ffn[l]->n_records;
        free(seen);
        if (!(seen = calloc(F ? F : 1, 1))) { st = flm_fail(err, FLM_ERR_NOMEM, "%s: out of memory", path); goto done; }
        for (uint32_t j = 0; j < F; j++) {
            if (perm[l][j] >= F || seen[perm[l][j]]) {
                st = flm_fail(err, FLM_ERR_ARG, "%s: layer %u: the new neuron order is not a permutation", path, l);
                goto done;
            }
            seen[perm[l][j]] = 1;
        }
    }
    for (uint32_t i = 0; i < f->meta->n_tensors && !biases; i++)
        if (strstr(f->meta->tensors[i].name, "ffn_up.bias") || strstr(f->meta->tensors[i].name, "ffn_gate.bias")) {
            st = flm_fail(err, FLM_ERR_UNSUPPORTED, "%s: the FFN has biases (%s): ordering its neurons is not "
                          "supported yet", path, f->meta->tensors[i].name);
            goto done;
        }
    if (biases && (st = bias_patches(f, perm, &patch, &n_patch, err))) goto done;
    /* keep the resident and FFN regions where they are; drop the predictor region (the last one: file order), or
     * put the caller's after the others */
    uint32_t n = 0;
    uint64_t end = f->header_bytes;
    for (uint32_t i = 0; i < f->n_regions; i++) {
        if (f->regions[i].kind == FLM_REGION_PREDICTOR) continue;
        regions[n++] = f->regions[i];
        uint64_t e = flm_align_up(f->regions[i].offset + f->regions[i].size, FLM_ALIGN);
        if (e > end) end = e;
    }
    uint64_t file_end = end;
    if (predictor && FLM_HEADER_FIXED + (uint64_t)(n + 1) * FLM_REGION_ENTRY_BYTES > f->header_bytes) {
        st = flm_fail(err, FLM_ERR_FORMAT, "%s: the header has no room for another region; convert the model again",
                      path);
        goto done;
    }
    if (predictor) {
        regions[n++] = (flm_region){.kind = FLM_REGION_PREDICTOR, .offset = end, .size = predictor_size,
                                    .checksum = XXH64(predictor, (size_t)predictor_size, 0)};
        file_end = flm_align_up(end + predictor_size, FLM_ALIGN);
    }
    if (f->sums && (st = flm_sums_load(f, &sums, err))) goto done;
    if ((in = open(path, O_RDONLY | O_CLOEXEC)) < 0) {
        st = flm_fail(err, FLM_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
        goto done;
    }
    if ((st = flm_out_open(dst, path, (strcmp(dst, path) ? 0u : FLM_OUT_SELF) | FLM_OUT_REPLACE, &w, err))) goto done;
    tmp = flm_out_temp(w);
    out = flm_out_fd(w);
    /* the resident region, its FFN biases in the new order (its checksums computed again as it is copied) */
    {
        flm_region *r = NULL;
        for (uint32_t i = 0; i < n; i++)
            if (regions[i].kind == FLM_REGION_RESIDENT) r = &regions[i];
        if (!r) { st = flm_fail(err, FLM_ERR_FORMAT, "%s: no resident region", path); goto done; }
        uint64_t len = flm_align_up(r->size, FLM_ALIGN);
        uint8_t buf[1 << 16];
        XXH64_state_t *hw = n_patch ? XXH64_createState() : NULL, *hh = n_patch ? XXH64_createState() : NULL;
        if (n_patch && (!hw || !hh)) {
            XXH64_freeState(hw);
            XXH64_freeState(hh);
            st = flm_fail(err, FLM_ERR_NOMEM, "%s: out of memory", path);
            goto done;
        }
        if (n_patch) {
            XXH64_reset(hw, 0);
            XXH64_reset(hh, 0);
        }
        for (uint64_t o = 0; o < len && !st; o += sizeof buf) {
            size_t m = (size_t)(len - o < sizeof buf ? len - o : sizeof buf);
            if ((st = flm_file_pread(in, buf, m, r->offset + o, path, "resident region", err))) break;
            for (uint32_t k = 0; k < n_patch; k++) { /* the part of each bias vector inside [o, o + m) */
                uint64_t a = patch[k].off > o ? patch[k].off : o, b = patch[k].off + patch[k].len;
                if (b > o + m) b = o + m;
                if (a < b) memcpy(buf + (a - o), patch[k].data + (a - patch[k].off), (size_t)(b - a));
            }
            if (n_patch) {
                uint64_t in_payload = o < r->size ? (r->size - o < m ? r->size - o : m) : 0;
                uint64_t hb = r->head_bytes, in_head = o < hb ? (hb - o < m ? hb - o : m) : 0;
                XXH64_update(hw, buf, (size_t)in_payload);
                XXH64_update(hh, buf, (size_t)in_head);
            }
            st = pwrite_all(out, buf, m, r->offset + o, tmp, "resident region", err);
        }
        if (n_patch) {
            r->checksum = XXH64_digest(hw);
            if (r->head_bytes) r->head_checksum = XXH64_digest(hh);
        }
        XXH64_freeState(hw);
        XXH64_freeState(hh);
        if (st) goto done;
    }
    static const uint8_t zeros[FLM_ALIGN];
    for (uint32_t i = 0; i < n; i++) {
        flm_region *r = &regions[i];
        if (r->kind != FLM_REGION_FFN) continue;
        const uint32_t *p = perm[r->layer];
        const uint64_t rb = r->record_bytes;
        free(cur);
        cur = NULL;
        if ((st = flm_file_read_region(f, f->ffn[r->layer], &cur, err))) goto done;
        free(next);
        next = malloc(r->size ? r->size : 1);
        if (!next) { st = flm_fail(err, FLM_ERR_NOMEM, "%s: out of memory", path); goto done; }
        for (uint32_t j = 0; j < r->n_records; j++) /* a permutation: checked above */
            memcpy(next + (uint64_t)j * rb, (const uint8_t *)cur + (uint64_t)p[j] * rb, rb);
        r->checksum = XXH64(next, r->size, 0);
        r->flags = (r->flags & ~(uint64_t)(FLM_FFN_HOT_ORDER | FLM_FFN_COACT_ORDER)) | order_flag;
        if (sums.data) /* the layer's record sums, in the new order */
            for (uint32_t j = 0; j < r->n_records; j++)
                ((uint64_t *)sums.ffn[r->layer]->sums)[j] = XXH3_64bits(next + (uint64_t)j * rb, (size_t)rb);
        uint64_t pad = flm_align_up(r->size, FLM_ALIGN) - r->size;
        if ((st = pwrite_all(out, next, r->size, r->offset, tmp, "FFN region", err)) ||
            (st = pwrite_all(out, zeros, pad, r->offset + r->size, tmp, "padding", err)))
            goto done;
    }
    uint32_t header_bytes = f->header_bytes;
    for (uint32_t i = 0; i < n; i++) { /* the record sums, rewritten (little-endian, as stored) */
        flm_region *r = &regions[i];
        if (r->kind != FLM_REGION_SUMS) continue;
        for (uint32_t k = 0; k < sums.n_tables; k++) {
            const flm_sums_table *t = &sums.tables[k];
            for (uint64_t j = 0; j < t->n_units; j++) flm_put_u64((uint8_t *)&((uint64_t *)t->sums)[j], t->sums[j]);
        }
        r->checksum = XXH64(sums.data, r->size, 0);
        if ((st = pwrite_all(out, sums.data, r->size, r->offset, tmp, "record-sums region", err)) ||
            (st = pwrite_all(out, zeros, flm_align_up(r->size, FLM_ALIGN) - r->size, r->offset + r->size, tmp,
                             "padding", err)))
            goto done;
    }
    if (predictor && ((st = pwrite_all(out, predictor, predictor_size, end, tmp, "predictor region", err)) ||
                      (st = pwrite_all(out, zeros, file_end - end - predictor_size, end + predictor_size, tmp,
                                       "padding", err))))
        goto done;
    flm_build_header(hdr, header_bytes, regions, n, file_end);
    if ((st = pwrite_all(out, hdr, header_bytes, 0, tmp, "header", err))) goto done;
    st = flm_out_commit(w, err); /* fsync, close, rename; frees w */
    w = NULL;
done:
    if (in >= 0) close(in);
    flm_out_abort(w); /* an error before the commit: the temporary is removed */
    free(hdr);
    free(regions);
    free(cur);
    free(next);
    free(seen);
    for (uint32_t k = 0; k < n_patch; k++) free(patch[k].data);
    free(patch);
    flm_sums_free(&sums);
    flm_file_close(f);
    return st;
}
