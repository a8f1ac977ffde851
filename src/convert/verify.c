/* verify.c — flm_verify (include/flashlm_tools.h): every region of a .flm file read and its checksum compared. */
#include <stddef.h>

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
    return st;
}
