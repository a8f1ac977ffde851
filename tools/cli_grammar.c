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
    if (a->file) {
        if (!(buf = cli_read_text(a->file))) return 1;
        text = buf;
    }
    flm_error err;
    flm_status st = a->schema ? flm_grammar_json_schema(text, strlen(text), out, &err)
                              : flm_grammar_parse(text, strlen(text), NULL, out, &err);
    if (st) fprintf(stderr, "flashlm: %s%s%s: %s\n", a->opt, a->file ? " " : "", a->file ? a->file : "", err.msg);
    free(buf);
    return st ? 1 : 0;
}
