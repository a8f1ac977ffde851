/* verify.c — flm_verify (include/flashlm_tools.h): every region of a .flm file read and its checksum compared, then
 * the checks flm_open makes of what the header and the resident region say (counts that agree, every tensor's
 * presence, shape and type), so verify never says OK of a file that run refuses. */
#include <stddef.h>
#include <stdio.h>

#include "core/error.h"
#include "flashlm_tools.h"
#include "format/flm.h"

flm_status flm_verify(const char *path, flm_progress_fn progress, void *user, flm_verify_info *info, flm_error *err) {
    flm_file *f = NULL;
    flm_status st = flm_file_open(path, &f, err);
    if (st == FLM_OK) st = flm_file_verify(f, progress, user, err);
    if (st == FLM_OK && info) {
        info->n_regions = f->n_regions;
        info->file_bytes = f->file_size;
    }
    flm_file_close(f);
    if (st) return st;
    /* the same validation as open: a context in naive mode (the resident region only, a short KV cache) */
    flm_params p;
    flm_params_default(&p);
    p.mode = FLM_MODE_NAIVE;
    p.n_ctx = 8;
    p.n_threads = 1;
    p.n_batch = 1;
    p.io = FLM_IO_KIND_THREADS;
    p.io_threads = 1;
    flm_ctx *ctx = NULL;
    flm_error oe;
    if (flm_open(path, &p, &ctx, &oe) != FLM_OK)
        return flm_fail(err, oe.code, "%s: every checksum matches, but the file is not a model flashlm can open: %s",
                        path, oe.msg);
    flm_close(ctx);
    return FLM_OK;
}
