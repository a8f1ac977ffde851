/* fuzz_chat.c — the chat template detection and rendering (src/format/chat_template.c) on arbitrary bytes: the
 * family detection of a Jinja source, the default system prompt extraction (its escapes), the format choice
 * (--chat-template name, template, architecture) and rendering a conversation in the chosen format.
 *
 * Input: fields separated by NUL bytes: the template source, then a --chat-template name, an architecture, then
 * messages (the first byte of each picks its role). Seeds: tests/fuzz/seeds/fuzz_chat (the real models' templates
 * are cut from their GGUFs by tests/fuzz/make_seeds.sh). */
#include "fuzz_common.h"

#include "format/chat_template.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *p = (const char *)data, *end = p + size;
    const char *field[16];
    size_t flen[16];
    int nf = 0;
    while (nf < 16) {
        const char *z = memchr(p, 0, (size_t)(end - p));
        field[nf] = p;
        flen[nf++] = z ? (size_t)(z - p) : (size_t)(end - p);
        if (!z) break;
        p = z + 1;
    }
    /* the template need not be NUL-terminated: give it exactly its bytes */
    char *tmpl = malloc(flen[0] ? flen[0] : 1);
    if (!tmpl) return 0;
    memcpy(tmpl, field[0], flen[0]);
    flm_chat_format fmt = flm_chat_detect(tmpl, flen[0]);
    fz_check(fmt >= FLM_CHAT_UNKNOWN && fmt < FLM_CHAT_N_FORMATS, "format %d", (int)fmt);
    fz_check(flm_chat_format_name(fmt) != NULL, "name");
    char *sys = NULL;
    if (flm_chat_default_system(tmpl, flen[0], &sys) == FLM_OK && sys) {
        fz_check(strlen(sys) <= flen[0], "a system prompt longer than its template");
        free(sys);
    }
    /* the other fields as C strings */
    char *s[16] = {0};
    for (int i = 1; i < nf; i++) {
        s[i] = malloc(flen[i] + 1);
        if (!s[i]) goto done;
        memcpy(s[i], field[i], flen[i]);
        s[i][flen[i]] = 0;
    }
    const char *name = nf > 1 && flen[1] ? s[1] : NULL, *arch = nf > 2 ? s[2] : NULL;
    (void)flm_chat_format_parse(name ? name : "");
    (void)flm_chat_from_arch(arch ? arch : "");
    flm_chat_template t;
    flm_error err;
    if (flm_chat_template_init(&t, name, flen[0] ? tmpl : NULL, flen[0], arch, &err) == FLM_OK) {
        static const char *const roles[] = {"system", "user", "assistant", "tool"};
        flm_chat_msg msgs[13];
        size_t n = 0;
        for (int i = 3; i < nf; i++, n++) {
            msgs[n].role = roles[flen[i] ? (uint8_t)s[i][0] % 4 : 1];
            msgs[n].content = flen[i] ? s[i] + 1 : s[i];
        }
        for (int add = 0; add < 2; add++) {
            char *out = NULL;
            size_t len = 0;
            if (flm_chat_render(&t, msgs, n, add, &out, &len, &err) == FLM_OK) {
                fz_check(out && strlen(out) == len, "rendered length");
                free(out);
            } else {
                fz_check(err.msg[0] != 0, "an error without a message");
            }
        }
    } else {
        fz_check(err.msg[0] != 0, "an error without a message");
    }
    flm_chat_template_free(&t);
done:
    for (int i = 1; i < nf; i++) free(s[i]);
    free(tmpl);
    return 0;
}
