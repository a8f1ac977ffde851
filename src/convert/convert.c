/* convert.c — GGUF -> .flm (docs/FORMAT.md): the resident GGUF, then one FFN region of neuron bundles per layer. */
#include "convert/convert.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "compute/kernels.h"
#include "core/error.h"
#include "core/files.h"
#include "flashlm_tools.h" /* the checked writer (write/out.c) */
#include "core/types.h"
#include "core/util.h"
#include "write/flm_write.h"
#include "write/gguf_write.h"
#include "model/model.h"

uint32_t flm_down_column_type(uint32_t down_type, uint32_t quantized_as) {
    return flm_type_block_elems(down_type) > 1 ? quantized_as : down_type;
}

static bool is_ffn_tensor(const char *name) {
    const char *p = strrchr(name, '.');
    if (!p || strcmp(p, ".weight") != 0 || strncmp(name, "blk.", 4) != 0) return false;
    const char *q = strchr(name + 4, '.');
    if (!q) return false;
    size_t n = (size_t)(p - q - 1);
    return (n == 6 && !strncmp(q + 1, "ffn_up", 6)) || (n == 8 && !strncmp(q + 1, "ffn_gate", 8)) ||
           (n == 8 && !strncmp(q + 1, "ffn_down", 8));
}

/* output.weight identical to token_embd.weight (a tied classifier stored twice, as converters often do): drop it,
 * the model then ties the two, as llama.cpp does when output.weight is absent. */
static bool is_duplicate_output(const flm_gguf_file *src, const flm_gguf_tensor *t) {
    if (strcmp(t->name, "output.weight") != 0) return false;
    const flm_gguf_tensor *e = flm_gguf_find_tensor(src, "token_embd.weight");
    return e && e->type == t->type && e->nbytes == t->nbytes && e->ne[0] == t->ne[0] && e->ne[1] == t->ne[1] &&
           memcmp(e->data, t->data, t->nbytes) == 0;
}

static bool keep_resident(const flm_gguf_file *src, const flm_gguf_tensor *t) {
    return !is_ffn_tensor(t->name) && !is_duplicate_output(src, t);
}

/* Position of tensor i of src in the resident GGUF's order: every kept tensor in the source's order, then
 * token_embd.weight last, so that its data ends the region and streaming modes can leave it in the file
 * (docs/FORMAT.md, "The token embedding"). pass 0 gives the others, pass 1 the embedding. */
static bool in_pass(const flm_gguf_file *src, const flm_gguf_tensor *t, int pass) {
    return keep_resident(src, t) && (strcmp(t->name, "token_embd.weight") == 0) == (pass == 1);
}

static flm_status out_write(void *user, const void *p, size_t n, flm_error *err) {
    return flm_write_cursor_put(user, p, n, err);
}

/* Write the resident GGUF (all KVs, non-FFN tensors, token_embd.weight's data last) straight into o, the .flm being
 * written: once, no temporary file of its own, nothing read back. o->h is the region's checksum state (reset by the
 * caller); *head_bytes / *head_sum get the head (docs/FORMAT.md): where token_embd.weight's data starts, and the
 * XXH64 of the region's bytes before it (0 and 0 without an embedding). */
static flm_status write_resident_gguf(const flm_gguf_file *src, flm_write_cursor *o, uint64_t *head_bytes,
                                      uint64_t *head_sum, flm_error *err) {
    *head_bytes = *head_sum = 0;
    const uint64_t start = o->pos;
    flm_gguf_writer *w = NULL;
    flm_status st = flm_gguf_writer_create_stream(o->path, out_write, o, &w, err);
    if (st) return st;
    for (uint64_t i = 0; i < src->n_kv && !st; i++) st = flm_gguf_writer_kv_copy(w, &src->kv[i]);
    for (int pass = 0; pass < 2; pass++)
        for (uint64_t i = 0; i < src->n_tensors && !st; i++) {
            const flm_gguf_tensor *t = &src->tensors[i];
            if (in_pass(src, t, pass)) st = flm_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne);
        }
    if (st) {
        flm_gguf_writer_free(w);
        return flm_fail(err, st, "%s: cannot build the resident region", o->path);
    }
    if ((st = flm_gguf_writer_begin(w, err))) goto done;
    for (int pass = 0; pass < 2; pass++)
        for (uint64_t i = 0; i < src->n_tensors; i++) {
            const flm_gguf_tensor *t = &src->tensors[i];
            if (!in_pass(src, t, pass)) continue;
            if (pass == 1 && o->pos > start) { /* the embedding's data starts here: the head ends */
                XXH64_state_t *h = XXH64_createState();
                if (!h) { st = flm_fail(err, FLM_ERR_NOMEM, "%s: out of memory", o->path); goto done; }
                XXH64_copyState(h, o->h);
                *head_bytes = o->pos - start;
                *head_sum = XXH64_digest(h);
                XXH64_freeState(h);
            }
            if ((st = flm_gguf_writer_write_tensor(w, t->data, t->nbytes, err))) goto done;
        }
    st = flm_gguf_writer_finish(w, err);
done:
    flm_gguf_writer_free(w);
    return st;
}

/* Write the FFN region of one layer: d_ffn bundles (up row | gate row | down column), and each bundle's record sum
 * (XXH3_64bits, little-endian) into sums[8 * i]. */
static flm_status write_ffn_layer(flm_write_cursor *o, const flm_model *m, uint32_t l, flm_region *r, float *downT,
                                  uint8_t *chunk, size_t chunk_records, uint32_t down_as, uint8_t *sums,
                                  flm_error *err) {
    const flm_hparams *hp = &m->hp;
    const flm_layer_weights *L = &m->layers[l];
    const flm_kernels *k = flm_kernels_scalar();
    uint32_t d = hp->d_model, n_ffn = hp->d_ffn;
    const uint32_t col_type = flm_down_column_type(L->ffn_down.type, down_as);
    flm_bundle_layout b = flm_bundle_layout_of(d, L->ffn_up.type, L->ffn_gate.type, col_type, hp->gated);
    /* down is d_model rows of d_ffn: transpose it into d_ffn rows of d_model floats */
    size_t down_row = flm_row_bytes(L->ffn_down.type, n_ffn);
    float *row = downT + (size_t)n_ffn * d; /* scratch of n_ffn floats after the transpose buffer */
    for (uint32_t r_ = 0; r_ < d; r_++) {
        k->dequant[L->ffn_down.type]((const uint8_t *)L->ffn_down.data + (size_t)r_ * down_row, row, n_ffn);
        for (uint32_t i = 0; i < n_ffn; i++) downT[(size_t)i * d + r_] = row[i];
    }
    *r = (flm_region){.kind = FLM_REGION_FFN, .layer = l, .offset = o->pos, .up_type = L->ffn_up.type,
                      .gate_type = hp->gated ? L->ffn_gate.type : FLM_GATE_NONE, .down_type = col_type,
                      .n_records = n_ffn, .record_bytes = b.record_bytes};
    XXH64_reset(o->h, 0);
    uint64_t start = o->pos;
    for (uint32_t i0 = 0; i0 < n_ffn; i0 += (uint32_t)chunk_records) {
        uint32_t n = n_ffn - i0 < chunk_records ? n_ffn - i0 : (uint32_t)chunk_records;
        for (uint32_t j = 0; j < n; j++) {
            uint32_t i = i0 + j;
            uint8_t *rec = chunk + (size_t)j * b.record_bytes;
            memcpy(rec + b.up_off, (const uint8_t *)L->ffn_up.data + (size_t)i * b.up_bytes, b.up_bytes);
            if (b.gate_bytes)
                memcpy(rec + b.gate_off, (const uint8_t *)L->ffn_gate.data + (size_t)i * b.gate_bytes, b.gate_bytes);
            flm_quantize_row(col_type, downT + (size_t)i * d, rec + b.down_off, d);
            flm_put_u64(sums + 8ull * i, XXH3_64bits(rec, (size_t)b.record_bytes)); /* its record sum */
        }
        flm_status st = flm_write_cursor_put(o, chunk, (size_t)n * b.record_bytes, err);
        if (st) return st;
    }
    r->size = o->pos - start;
    r->checksum = XXH64_digest(o->h);
    return flm_write_cursor_pad(o, err);
}

flm_status flm_convert(const char *src, const char *dst, flm_progress_fn progress, void *user, flm_error *err) {
    return flm_convert_ex(src, dst, FLM_TYPE_Q8_0, FLM_OUT_REPLACE, progress, user, NULL, err);
}

flm_status flm_convert_ex(const char *src, const char *dst, uint32_t down_as, unsigned out_flags,
                          flm_progress_fn progress, void *user, flm_convert_info *info, flm_error *err) {
    if (info) memset(info, 0, sizeof *info);
    const double t0 = flm_now_ms();
    if (down_as != FLM_TYPE_Q8_0 && down_as != FLM_TYPE_F16 && down_as != FLM_TYPE_F32)
        return flm_fail(err, FLM_ERR_ARG, "convert: down columns can be stored as q8_0, f16 or f32, not %s",
                        flm_type_name(down_as) ? flm_type_name(down_as) : "that type");
    flm_gguf_file *g = NULL;
    flm_model *m = NULL;
    /* the checked writer (core/files.h): refuses a link, a device, the source; locks dst; a unique temporary */
    flm_out *w = NULL;
    /* a source that is missing or no file (a FIFO, a folder) is said first, before anything about dst; a stat waits
     * on no FIFO */
    struct stat ss;
    if (stat(src, &ss) != 0) return flm_fail(err, FLM_ERR_IO, "%s: cannot open: %s", src, strerror(errno));
    if (!S_ISREG(ss.st_mode))
        return flm_fail(err, FLM_ERR_IO, "%s: is %s, not a regular file: a model must be a file", src,
                        flm_file_kind(ss.st_mode));
    flm_status st = flm_out_check(dst, src, out_flags & FLM_OUT_REPLACE, err); /* refused before the source is read */
    if (st || (st = flm_gguf_open(src, &g, err))) return st;
    if ((st = flm_out_open(dst, src, out_flags & FLM_OUT_REPLACE, &w, err))) { flm_gguf_close(g); return st; }
    if ((st = flm_model_from_gguf(g, &m, err))) { flm_out_abort(w); return st; } /* closes g on error */
    const flm_hparams *hp = &m->hp;
    for (uint32_t l = 0; l < hp->n_layers; l++) {
        uint32_t t = m->layers[l].ffn_down.type, ct = flm_down_column_type(t, down_as);
        if (!flm_row_bytes(ct, hp->d_model))
            return flm_model_free(m), flm_out_abort(w),
                   flm_fail(err, FLM_ERR_UNSUPPORTED, "%s: layer %u: a %s down projection is stored by columns as %s, "
                            "which needs d_model (%u) to be a multiple of %zu", src, l, flm_type_name(t),
                            flm_type_name(ct), hp->d_model, flm_type_block_elems(ct));
    }
    const char *tmp = flm_out_temp(w);
    uint32_t n_regions = 2 + hp->n_layers; /* resident, FFN layers, record sums */
    flm_region *regions = calloc(n_regions, sizeof *regions);
    /* one spare table entry: `flashlm calibrate` adds the predictor region without moving any other */
    uint32_t header_bytes = (uint32_t)flm_align_up(FLM_HEADER_FIXED + (uint64_t)(n_regions + 1) * FLM_REGION_ENTRY_BYTES,
                                               FLM_ALIGN);
    uint8_t *hdr = calloc(header_bytes, 1);
    size_t max_rec = 0;
    for (uint32_t l = 0; l < hp->n_layers; l++) {
        const flm_layer_weights *L = &m->layers[l];
        flm_bundle_layout b = flm_bundle_layout_of(hp->d_model, L->ffn_up.type, L->ffn_gate.type,
                                                   flm_down_column_type(L->ffn_down.type, down_as), hp->gated);
        if (b.record_bytes > max_rec) max_rec = b.record_bytes;
    }
    size_t chunk_records = 256;
    float *downT = malloc(((size_t)hp->d_ffn * hp->d_model + hp->d_ffn) * sizeof(float));
    uint8_t *chunk = malloc(chunk_records * max_rec);
    flm_write_cursor o = {NULL, dst, 0, XXH64_createState()};
    /* the record sums (docs/FORMAT.md, "Record sums"): one table per FFN layer, then the token embedding's rows */
    const flm_gguf_tensor *embd = flm_gguf_find_tensor(m->gguf, "token_embd.weight");
    uint32_t n_tab = hp->n_layers + (embd && embd->n_dims == 2 ? 1 : 0);
    flm_sums_table *tab = calloc(n_tab ? n_tab : 1, sizeof *tab);
    uint8_t *sums = NULL;
    uint64_t sums_bytes = 0;
    if (tab) {
        for (uint32_t l = 0; l < hp->n_layers; l++) {
            const flm_layer_weights *L = &m->layers[l];
            flm_bundle_layout b = flm_bundle_layout_of(hp->d_model, L->ffn_up.type, L->ffn_gate.type,
                                                       flm_down_column_type(L->ffn_down.type, down_as), hp->gated);
            tab[l] = (flm_sums_table){.kind = FLM_SUMS_FFN, .layer = l, .unit_bytes = b.record_bytes,
                                      .n_units = hp->d_ffn};
        }
        if (n_tab > hp->n_layers) /* offset: known once the resident region is written (its head) */
            tab[hp->n_layers] = (flm_sums_table){.kind = FLM_SUMS_EMBD, .unit_bytes = flm_row_bytes(embd->type,
                                                 embd->ne[0]), .n_units = embd->ne[1]};
        sums = flm_sums_payload_new(tab, n_tab, &sums_bytes);
    }
    if (!regions || !hdr || !downT || !chunk || !o.h || !tab || !sums) {
        st = flm_fail(err, FLM_ERR_NOMEM, "%s: out of memory", dst);
        goto done;
    }
    XXH64_reset(o.h, 0); /* a fresh state is uninitialised */
    o.path = tmp;
    if (!(o.fp = flm_out_stream(w))) { st = flm_fail(err, FLM_ERR_NOMEM, "%s: out of memory", dst); goto done; }
    /* header placeholder, then the resident region */
    if ((st = flm_write_cursor_put(&o, hdr, header_bytes, err))) goto done;
    if (progress) progress(user, "resident", 0, 1);
    regions[0] = (flm_region){.kind = FLM_REGION_RESIDENT, .offset = o.pos};
    XXH64_reset(o.h, 0);
    if ((st = write_resident_gguf(m->gguf, &o, &regions[0].head_bytes, &regions[0].head_checksum, err))) goto done;
    regions[0].size = o.pos - regions[0].offset;
    regions[0].checksum = XXH64_digest(o.h);
    if ((st = flm_write_cursor_pad(&o, err))) goto done;
    for (uint32_t l = 0; l < hp->n_layers; l++) {
        if (progress) progress(user, "FFN layers", l, hp->n_layers);
        if ((st = write_ffn_layer(&o, m, l, &regions[1 + l], downT, chunk, chunk_records, down_as, sums + tab[l].pos,
                                  err)))
            goto done;
    }
    if (progress) progress(user, "FFN layers", hp->n_layers, hp->n_layers);
    if (n_tab > hp->n_layers) { /* the embedding's rows, as written last in the resident region (the tail) */
        flm_sums_table *t = &tab[hp->n_layers];
        if (!regions[0].head_bytes || t->unit_bytes * t->n_units > regions[0].size - regions[0].head_bytes) {
            st = flm_fail(err, FLM_ERR_FORMAT, "%s: the token embedding is not the resident region's tail", src);
            goto done;
        }
        t->offset = regions[0].head_bytes;
        flm_put_u64(sums + FLM_SUMS_HEAD + (size_t)hp->n_layers * FLM_SUMS_ENTRY + 8, t->offset);
        for (uint64_t i = 0; i < t->n_units; i++)
            flm_put_u64(sums + t->pos + 8 * i,
                        XXH3_64bits((const uint8_t *)embd->data + i * t->unit_bytes, (size_t)t->unit_bytes));
    }
    regions[1 + hp->n_layers] = (flm_region){.kind = FLM_REGION_SUMS, .offset = o.pos, .size = sums_bytes,
                                             .checksum = XXH64(sums, (size_t)sums_bytes, 0)};
    {
        XXH64_state_t *h = o.h;
        o.h = NULL; /* checksummed above */
        st = flm_write_cursor_put(&o, sums, (size_t)sums_bytes, err);
        o.h = h;
        if (st || (st = flm_write_cursor_pad(&o, err))) goto done;
    }
    /* the header, now that every region is known */
    flm_build_header(hdr, header_bytes, regions, n_regions, o.pos);
    if (fseek(o.fp, 0, SEEK_SET) != 0 || fwrite(hdr, 1, header_bytes, o.fp) != header_bytes || fflush(o.fp) != 0) {
        st = flm_fail(err, FLM_ERR_IO, "%s: cannot write the header: %s", tmp, strerror(errno));
        goto done;
    }
    o.fp = NULL;
    st = flm_out_commit(w, err); /* fsync, rename, unlock; frees w */
    w = NULL;
    if (st) goto done;
    if (info) { /* what was written, without reading it back */
        info->file_bytes = o.pos;
        info->src_bytes = m->gguf->size;
        info->resident_bytes = regions[0].size;
        info->embd_bytes = regions[0].head_bytes ? regions[0].size - regions[0].head_bytes : 0;
        for (uint32_t l = 0; l < hp->n_layers; l++) info->ffn_bytes += regions[1 + l].size;
        info->n_layers = hp->n_layers;
        info->n_records = hp->n_layers ? regions[1].n_records : 0;
        info->record_bytes = hp->n_layers ? regions[1].record_bytes : 0;
        info->seconds = (flm_now_ms() - t0) / 1e3;
    }
done:
    flm_out_abort(w); /* an error before the commit: removes the temporary and the lock */
    XXH64_freeState(o.h);
    free(tab);
    free(sums);
    free(regions);
    free(hdr);
    free(downT);
    free(chunk);
    flm_model_free(m);
    return st;
}
