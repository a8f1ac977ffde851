/* grammar.h — constrained decoding (internal; the public face is flm_grammar_* and flm_gen_params.grammar in
 * include/flashlm.h): a context-free grammar over bytes (parsed from a GBNF subset, llama.cpp's grammar format, or
 * compiled from a JSON schema by json_schema.c), run as a pushdown automaton whose configurations (sets of parse
 * stacks, as llama.cpp's grammar sampler keeps them) are interned as states with a lazily filled transition table per
 * byte; a state's token mask (which vocabulary tokens can be consumed whole from it) comes from one walk of the
 * vocabulary's byte trie along those transitions and is cached per state. docs/STRUCTURED.md. */
#ifndef FLM_SESSION_GRAMMAR_H
#define FLM_SESSION_GRAMMAR_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "flashlm.h"

/* GBNF for a reply made only of tool calls in Qwen2.5's format (tool_grammar.c; flm_chat_tool_grammar says what).
 * Errors: FLM_ERR_FORMAT (tools), FLM_ERR_ARG (no tool named only), FLM_ERR_UNSUPPORTED (a parameters keyword),
 * FLM_ERR_NOMEM. */
flm_status gram_tool_calls(const char *tools, const char *only, bool parallel, char **out, flm_error *err);

#define GRAM_DEAD (-1) /* no state: the byte or token cannot follow */

/* The vocabulary as the automaton sees it: every token's decoded bytes (flm_token_piece with no previous token), a
 * byte trie of them, and the end-of-generation tokens. */
typedef struct gvocab gvocab;
/* Built from an open context (borrowed: the pieces point into it). Errors: FLM_ERR_NOMEM. */
flm_status gvocab_build(flm_ctx *ctx, gvocab **out, flm_error *err);
void gvocab_free(gvocab *v);

/* The start state of g (a generation begins there). Clears the automaton's caches first when they grew past their
 * cap. Errors: FLM_ERR_NOMEM, FLM_ERR_UNSUPPORTED (the configuration exceeds the automaton's limits). */
flm_status gram_start(flm_grammar *g, int32_t *state, flm_error *err);
/* The state after the bytes p[0..n) from state st, or GRAM_DEAD; -2 on an error (err set). */
int32_t gram_advance(flm_grammar *g, int32_t st, const char *p, size_t n, flm_error *err);
/* Whether the text so far is a complete sentence of the grammar (an end of generation may come). */
bool gram_accepting(const flm_grammar *g, int32_t st);
/* Whether it is complete and nothing may follow (the generation ends here). -1 on an error (err set). */
int gram_complete(flm_grammar *g, int32_t st, flm_error *err);
/* Whether token id may come next from st: an end-of-generation token when accepting; another token when its bytes
 * are not empty and can be consumed whole. -1 on an error (err set). */
int gram_token_ok(flm_grammar *g, const gvocab *v, int32_t st, int32_t id, flm_error *err);
/* The mask of st: bit i of words[i / 32] set when token i may come next (gram_token_ok for every token at once),
 * n_logits bits; cached in g (valid until the next gram_start). NULL on an error (err set). */
const uint32_t *gram_mask(flm_grammar *g, const gvocab *v, int32_t st, flm_error *err);

#endif
