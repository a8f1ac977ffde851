/* cli_grammar.c — run's constrained decoding options (llama.cpp's names): --grammar GBNF, --grammar-file FILE,
 * --json-schema SCHEMA|FILE, --json-schema-file FILE; the grammar they give (flm_grammar_*, docs/STRUCTURED.md). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "flashlm.h"

int cli_parse_grammar_opt(int argc, char **argv, int *i, cli_grammar_args *g) {
    const char *a = argv[*i];
    bool gram = !strcmp(a, "--grammar"), gfile = !strcmp(a, "--grammar-file");
    bool js = !strcmp(a, "-j") || !strcmp(a, "--json-schema"), jfile = !strcmp(a, "-jf") || !strcmp(a, "--json-schema-file");
    if (!gram && !gfile && !js && !jfile) return 0;
    if (*i + 1 >= argc) { cli_die("option %s needs a value", a); return -1; }
    const char *val = argv[++*i];
    if (g->text || g->file) { cli_die("%s: only one grammar or JSON schema per run", a); return -1; }
    g->schema = js || jfile;
    /* --json-schema: inline JSON when it starts with '{' (llama.cpp's), else a file's path */
    const char *p = val;
    while (*p == ' ' || *p == '\t' || *p == '\n') p++;
    if (gfile || jfile || (js && *p != '{')) g->file = val;
    else g->text = val;
    g->opt = a;
    return 1;
}

int cli_grammar_load(const cli_grammar_args *a, flm_grammar **out) {
    *out = NULL;
    if (!a->text && !a->file) return 0;
    char *buf = NULL;
    const char *text = a->text;
    size_t len = text ? strlen(text) : 0;
    if (a->file) { /* bounded: `--grammar-file /dev/zero` read until memory ran out */
        bool too_long = false;
        buf = cli_read_text_max(a->file, CLI_GRAMMAR_MAX_BYTES, &len, &too_long);
        if (too_long)
            fprintf(stderr, "flashlm: %s %s: longer than %d bytes: not a grammar or JSON schema\n", a->opt, a->file,
                    CLI_GRAMMAR_MAX_BYTES);
        if (!buf) return 1;
        if (memchr(buf, 0, len)) { /* as C text it would end there, the rest dropped without a word */
            fprintf(stderr, "flashlm: %s %s: a NUL byte at offset %zu: a grammar or JSON schema is text\n", a->opt,
                    a->file, (size_t)((char *)memchr(buf, 0, len) - buf));
            free(buf);
            return 1;
        }
        text = buf;
    }
    flm_error err;
    flm_status st = a->schema ? flm_grammar_json_schema(text, len, out, &err) : flm_grammar_parse(text, len, NULL, out, &err);
    if (st) fprintf(stderr, "flashlm: %s%s%s: %s\n", a->opt, a->file ? " " : "", a->file ? a->file : "", err.msg);
    free(buf);
    return st ? 1 : 0;
}
