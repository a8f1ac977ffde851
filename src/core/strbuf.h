/* strbuf.h — a growable NUL-terminated string buffer for text the library composes (chat renderings, grammars).
 * Bottom layer (core): no other project header. */
#ifndef FLM_CORE_STRBUF_H
#define FLM_CORE_STRBUF_H
#include <stdbool.h>
#include <stddef.h>

typedef struct {
    char *p;          /* the text, NUL-terminated once anything was put (NULL before); malloc'd, the caller frees it */
    size_t len, cap;  /* bytes of text (without the NUL) and bytes allocated */
    bool oom;         /* an allocation failed (or the size would overflow): later puts do nothing; the text so far is
                         kept; check it once at the end */
} flm_strbuf;

/* Append n bytes of s (n may be 0; s need not be NUL-terminated). Capacity doubles from 256 bytes. */
void flm_sb_put_n(flm_strbuf *b, const char *s, size_t n);
/* Append the NUL-terminated s. */
void flm_sb_put(flm_strbuf *b, const char *s);

#endif
