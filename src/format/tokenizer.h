/* tokenizer.h — SentencePiece-style BPE tokenizer (GGUF tokenizer.ggml.model = "llama"). Internal.
 *
 * Encoding follows llama.cpp's llm_tokenizer_spm: an optional space prefix, ' ' -> U+2581 ("▁"), one symbol per
 * UTF-8 character, then repeatedly merge the adjacent pair whose concatenation is in the vocabulary with the highest
 * score (ties: leftmost first); characters not in the vocabulary become byte tokens "<0xXX>" (byte fallback).
 * Decoding maps "▁" back to ' ' and byte tokens to their byte; control tokens decode to nothing. */
#ifndef FLM_FORMAT_TOKENIZER_H
#define FLM_FORMAT_TOKENIZER_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "flashlm.h"

/* GGUF tokenizer.ggml.token_type values. */
enum { FLM_TOK_NORMAL = 1, FLM_TOK_UNKNOWN = 2, FLM_TOK_CONTROL = 3, FLM_TOK_USER = 4, FLM_TOK_UNUSED = 5,
       FLM_TOK_BYTE = 6 };

typedef struct flm_tokenizer flm_tokenizer;

/* Build from n_vocab pieces (UTF-8, lengths given), scores and types (types may be NULL: byte tokens are then
 * recognised by their "<0xXX>" spelling). bos/eos are token ids or -1. Copies everything it needs.
 * Errors: FLM_ERR_FORMAT (n_vocab 0 or > 2^24, an id out of range, a piece with a NUL byte), FLM_ERR_NOMEM. */
flm_status flm_tokenizer_create(uint32_t n_vocab, const char *const *pieces, const uint32_t *lens,
                                const float *scores, const int32_t *types, int32_t bos, int32_t eos,
                                bool add_space_prefix, flm_tokenizer **out, flm_error *err);
void flm_tokenizer_free(flm_tokenizer *t);

/* Encode text (NUL-terminated UTF-8; invalid bytes go through byte fallback) into at most cap ids, preceded by BOS
 * when add_bos. An empty text gives no tokens (only BOS). Returns the number of ids the full encoding needs; when
 * that exceeds cap only the first cap were written. */
size_t flm_tokenizer_encode(const flm_tokenizer *t, const char *text, bool add_bos, int32_t *ids, size_t cap);

/* The decoded bytes of token id: "▁" -> ' ', byte tokens -> that byte, control/unknown-range ids -> "".
 * After BOS (prev == bos) a leading space is dropped, as SentencePiece does. *len gets the byte count; the
 * pointer is valid until the tokenizer is freed. */
const char *flm_tokenizer_piece(const flm_tokenizer *t, int32_t prev, int32_t id, size_t *len);
/* The raw vocabulary string of id (for inspect/debug), or "" when out of range. */
const char *flm_tokenizer_vocab(const flm_tokenizer *t, int32_t id);
uint32_t flm_tokenizer_n_vocab(const flm_tokenizer *t);
int32_t flm_tokenizer_bos(const flm_tokenizer *t);
int32_t flm_tokenizer_eos(const flm_tokenizer *t);

/* ---- Added for real models (GPT-2 byte-level BPE, added/special tokens, chat). ---- */
#define FLM_TOKENIZE_ADD_BOS 1u       /* BOS first (when the vocabulary has one) */
#define FLM_TOKENIZE_PARSE_SPECIAL 2u /* control and user-defined tokens spelled out in the text ("<|im_start|>")
                                         are matched whole before the tokenizer proper runs */
/* Encode len bytes of text (need not be NUL-terminated) into at most cap ids. Returns the number of ids the full
 * encoding needs (only the first cap are written), or SIZE_MAX when out of memory. */
size_t flm_tokenizer_encode_ex(const flm_tokenizer *t, const char *text, size_t len, unsigned flags, int32_t *ids,
                               size_t cap);
/* The id whose vocabulary string is exactly piece (e.g. "<|im_end|>"), or -1. */
int32_t flm_tokenizer_find(const flm_tokenizer *t, const char *piece);
/* true for the tokens that end a generation or a chat turn: EOS, EOT, and control tokens such as "<|im_end|>",
 * "<|endoftext|>", "<end_of_turn>" (as llama.cpp's vocab marks end-of-generation tokens). */
bool flm_tokenizer_is_eog(const flm_tokenizer *t, int32_t id);
/* tokenizer.ggml.add_bos_token (default: true for "llama" vocabularies, false for "gpt2"). */
bool flm_tokenizer_wants_bos(const flm_tokenizer *t);

/* The tokenizer described by GGUF metadata (tokenizer.ggml.model = "llama"; tokens, scores, token_type, BOS/EOS
 * ids). Errors: FLM_ERR_FORMAT naming the file and key, FLM_ERR_UNSUPPORTED (another tokenizer model),
 * FLM_ERR_NOMEM. (src/format/tokenizer_gguf.c) */
struct flm_gguf_file;
flm_status flm_tokenizer_from_gguf(const struct flm_gguf_file *f, flm_tokenizer **out, flm_error *err);

#endif
