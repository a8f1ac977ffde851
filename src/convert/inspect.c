/* inspect.c — flm_inspect (include/flashlm_tools.h): a model file's format, regions, hyper-parameters, metadata and
 * tensors as a text report (`flashlm inspect`). A damaged GGUF is shown as far as it parses. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "format/flm.h"
#include "format/gguf.h"
#include "flashlm_tools.h"

/* A tensor type's name, or what the id is when it has none. */
static const char *type_str(uint32_t type, char *buf, size_t cap) {
    const char *n = flm_type_name(type);
    if (n) return n;
    if (type == FLM_GATE_NONE) return "none";
    snprintf(buf, cap, "type %u?", type);
    return buf;
}

flm_status flm_inspect(const char *path, const flm_params *params, char **text, bool *runnable, flm_error *perr) {
    if (text) *text = NULL;
    if (runnable) *runnable = false;
    if (!path || !text) return flm_fail(perr, FLM_ERR_ARG, "flm_inspect: NULL path or text");
    flm_error err, parse_err = {FLM_OK, ""};
    flm_gguf_file *g = NULL;
    flm_file *ff = NULL;
    const flm_gguf_file *f;
    char *buf = NULL;
    size_t buf_len = 0;
    FILE *fp = open_memstream(&buf, &buf_len);
    if (!fp) return flm_fail(perr, FLM_ERR_NOMEM, "%s: out of memory for the report", path);
    bool can_run = false;
    if (flm_file_is_flm(path)) {
        flm_status st = flm_file_open(path, &ff, &err);
        if (st) {
            fclose(fp);
            free(buf);
            return flm_fail(perr, st, "%s", err.msg);
        }
        f = ff->meta;
        fprintf(fp, "file        %s\nformat      .flm v%u, %.2f MiB, %u regions (%s; %s)\n", path, ff->version,
               (double)ff->file_size / 1048576.0, ff->n_regions, ff->predictor ? "calibrated" : "not calibrated",
               ff->sums ? "record sums: reads from flash are checked"
                        : "no record sums: streaming modes need --no-verify-reads, or convert again");
        fprintf(fp, "\nregions:\n  %-8s %6s %14s %14s %-6s %-6s %-6s %9s %12s\n", "kind", "layer", "offset", "bytes",
               "up", "gate", "down", "records", "record bytes");
        for (uint32_t i = 0; i < ff->n_regions; i++) {
            const flm_region *r = &ff->regions[i];
            const char *kind = r->kind == FLM_REGION_RESIDENT ? "resident" : r->kind == FLM_REGION_FFN ? "ffn"
                               : r->kind == FLM_REGION_SUMS ? "sums" : "predict";
            char b1[24], b2[24], b3[24];
            bool ffn = r->kind == FLM_REGION_FFN;
            fprintf(fp, "  %-8s %6u %14llu %14llu %-6s %-6s %-6s %9u %12llu\n", kind, r->layer,
                   (unsigned long long)r->offset, (unsigned long long)r->size,
                   ffn ? type_str(r->up_type, b1, sizeof b1) : "-", ffn ? type_str(r->gate_type, b2, sizeof b2) : "-",
                   ffn ? type_str(r->down_type, b3, sizeof b3) : "-", r->n_records, (unsigned long long)r->record_bytes);
        }
        if (ff->resident->head_bytes)
            fprintf(fp, "  (resident: head %llu bytes, then the token embedding's data, %llu bytes, which the streaming "
                   "modes leave on flash unless tied)\n", (unsigned long long)ff->resident->head_bytes,
                   (unsigned long long)flm_file_tail_bytes(ff));
        fprintf(fp, "\nresident region: ");
    } else {
        /* a damaged GGUF is shown as far as it parses: the entries before the problem, then the problem */
        flm_gguf_open_salvage(path, &g, &parse_err);
        if (!g) {
            fclose(fp);
            free(buf);
            return flm_fail(perr, parse_err.code, "%s", parse_err.msg);
        }
        f = g;
        fprintf(fp, "file        %s\n", path);
    }
    fprintf(fp, "format      GGUF v%u, %" PRIu64 " metadata keys, %" PRIu64 " tensors, alignment %" PRIu64
           ", data at byte %" PRIu64 "%s\n", f->version, f->n_kv, f->n_tensors, f->alignment, f->data_offset,
           parse_err.code ? " (as far as it could be read)" : "");
    if (!parse_err.code) { /* the model as flashlm would run it: an unusable one is named, its contents still shown */
        flm_params p;
        if (params) p = *params;
        else flm_params_default(&p);
        p.n_ctx = 1;
        flm_ctx *ctx = NULL;
        if (flm_open(path, &p, &ctx, &err)) {
            fprintf(fp, "model       cannot be run: %s\n", err.msg);
        } else {
            can_run = true;
            flm_model_info in;
            flm_get_info(ctx, &in);
            fprintf(fp, "arch        %s\nd_model     %u\nd_ffn       %u\nn_layers    %u\nn_heads     %u\nn_kv_heads  %u\n"
                   "head_dim    %u\nn_vocab     %u\nn_ctx_train %u\nnorm_eps    %g\nrope_theta  %g\nbos/eos     %d / %d\n",
                   in.arch, in.d_model, in.d_ffn, in.n_layers, in.n_heads, in.n_kv_heads, in.head_dim, in.n_vocab,
                   in.n_ctx_train, (double)in.norm_eps, (double)in.rope_theta, in.bos, in.eos);
            flm_close(ctx);
        }
    }
    fprintf(fp, "\nmetadata:\n");
    for (uint64_t i = 0; i < f->n_kv; i++) {
        const flm_gguf_kv *kv = &f->kv[i];
        fprintf(fp, "  %-40s ", kv->key);
        switch (kv->type) {
        case GGUF_VT_STRING:
            fprintf(fp, "\"%.*s\"\n", (int)(kv->v.str.len > 60 ? 60 : kv->v.str.len), kv->v.str.data);
            break;
        case GGUF_VT_ARRAY: fprintf(fp, "array[%" PRIu64 "]\n", kv->arr_n); break;
        case GGUF_VT_FLOAT32: case GGUF_VT_FLOAT64: fprintf(fp, "%g\n", kv->v.f64); break;
        case GGUF_VT_INT8: case GGUF_VT_INT16: case GGUF_VT_INT32: case GGUF_VT_INT64:
            fprintf(fp, "%" PRId64 "\n", kv->v.i64); break;
        default: fprintf(fp, "%" PRIu64 "\n", kv->v.u64);
        }
    }
    fprintf(fp, "\ntensors:\n  %-32s %-6s %-24s %12s\n", "name", "type", "shape", "bytes");
    uint64_t total = 0;
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const flm_gguf_tensor *t = &f->tensors[i];
        char shape[64], tb[24];
        int o = snprintf(shape, sizeof shape, "[");
        for (uint32_t d = 0; d < t->n_dims && o < (int)sizeof shape; d++)
            o += snprintf(shape + o, sizeof shape - (size_t)o, "%s%" PRIu64, d ? ", " : "", t->ne[d]);
        if (o < (int)sizeof shape) snprintf(shape + o, sizeof shape - (size_t)o, "]");
        fprintf(fp, "  %-32s %-6s %-24s %12" PRIu64 "\n", t->name, type_str(t->type, tb, sizeof tb), shape,
                t->nbytes);
        total += t->nbytes;
    }
    fprintf(fp, "  %-32s %-6s %-24s %12" PRIu64 "\n", "total", "", "", total);
    flm_gguf_close(g);
    flm_file_close(ff);
    if (fclose(fp) != 0 || !buf) {
        free(buf);
        return flm_fail(perr, FLM_ERR_NOMEM, "%s: out of memory for the report", path);
    }
    *text = buf;
    if (runnable) *runnable = can_run && !parse_err.code;
    if (parse_err.code) return flm_fail(perr, parse_err.code, "%s", parse_err.msg);
    return FLM_OK;
}
