/* testutil_tools.c — test helpers over the tools tier (flashlm_tools.h): linked into the tests/test_*.c programs, not
 * into test_public_api (which links the runtime's public archive only). */
#include "testutil.h"
#include "flashlm.h"
#include "flashlm_tools.h"

#include <stdio.h>
#include <stdlib.h>

int tu_stories_hot(const char *path, size_t max_chars) {
    flm_error err;
    if (flm_convert(tu_data("models/stories260K/stories260K.gguf"), path, NULL, NULL, &err)) {
        fprintf(stderr, "convert %s: %s\n", path, err.msg);
        return -1;
    }
    size_t len;
    char *text = (char *)tu_read_file(tu_data("text/tinystories_sample.txt"), &len);
    text[len < max_chars ? len : max_chars] = 0;
    const flm_status st = flm_hot_order(path, text, 512, 128, 2, NULL, NULL, &err);
    free(text);
    if (st) {
        fprintf(stderr, "hot order %s: %s\n", path, err.msg);
        return -1;
    }
    return 0;
}

struct flm_ctx *tu_open_mode(const char *path, int mode, uint64_t mem, double pct, int n_ctx, double window) {
    flm_params p;
    flm_params_default(&p);
    p.n_threads = 2;
    p.n_ctx = n_ctx;
    p.mode = (flm_mode)mode;
    p.mem_bytes = mem;
    p.mem_percent = pct;
    p.draft_window = window;
    flm_ctx *ctx = NULL;
    flm_error err;
    if (flm_open(path, &p, &ctx, &err)) fail_msg("open %s (%s): %s", path, flm_mode_name((flm_mode)mode), err.msg);
    return ctx;
}
