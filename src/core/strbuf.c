/* strbuf.c — see strbuf.h. */
#include "core/strbuf.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

void flm_sb_put_n(flm_strbuf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (n > SIZE_MAX / 2 - b->len) { b->oom = true; return; }
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1) {
            if (cap > SIZE_MAX / 2) { b->oom = true; return; }
            cap *= 2;
        }
        char *q = realloc(b->p, cap);
        if (!q) { b->oom = true; return; }
        b->p = q;
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
}

void flm_sb_put(flm_strbuf *b, const char *s) { flm_sb_put_n(b, s, strlen(s)); }
