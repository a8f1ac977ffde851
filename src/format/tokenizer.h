/* tokenizer.h — the tokenizers of GGUF models, chosen by tokenizer.ggml.model. Internal.
 *
 * "llama": SentencePiece-style BPE, as llama.cpp's llm_tokenizer_spm: an optional space prefix, ' ' -> U+2581 ("▁"),
 * one symbol per UTF-8 character, then repeatedly merge the adjacent pair whose concatenation is in the vocabulary
 * with the highest score (ties: leftmost first); characters not in the vocabulary become byte tokens "<0xXX>" (byte
 * fallback). Decoding maps "▁" back to ' ' and byte tokens to their byte; control tokens decode to nothing.
 *
 * "gpt2": byte-level BPE, as llama.cpp's llm_tokenizer_bpe (GPT-2, Radford et al. 2019, and its bytes_to_unicode
 * table): the text is split by the pre-tokenizer regexes of tokenizer.ggml.pre (PCRE2, Unicode classes), each piece's
 * bytes are mapped to the GPT-2 characters, then the adjacent pair with the lowest rank in tokenizer.ggml.merges is
 * merged until none is left. Decoding maps the characters back to bytes.
 *
 * Both first cut the text at the special tokens spelled in it (llama.cpp's tokenizer_st_partition): USER_DEFINED
 * tokens always, CONTROL and UNKNOWN ones with FLM_TOKENIZE_PARSE_SPECIAL; longer tokens first. */
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

/* Build a SentencePiece ("llama") tokenizer from n_vocab pieces (UTF-8, lengths given), scores and types (types may
 * be NULL: byte tokens are then recognised by their "<0xXX>" spelling). bos/eos are token ids or -1; BOS is wanted
 * (add_bos_token true). Copies everything it needs. Same as flm_tokenizer_create_spec with model "llama".
 * Errors: FLM_ERR_FORMAT (n_vocab 0 or > 2^24, an id out of range, a piece with a NUL byte), FLM_ERR_NOMEM. */
flm_status flm_tokenizer_create(uint32_t n_vocab, const char *const *pieces, const uint32_t *lens,
                                const float *scores, const int32_t *types, int32_t bos, int32_t eos,
                                bool add_space_prefix, flm_tokenizer **out, flm_error *err);
void flm_tokenizer_free(flm_tokenizer *t);

/* Encode text (NUL-terminated UTF-8; invalid bytes go through byte fallback) into at most cap ids, preceded by BOS
 * when add_bos (whatever add_bos_token says), special tokens not parsed. An empty text gives no tokens (only BOS).
 * Returns the number of ids the full encoding needs; when that exceeds cap only the first cap were written;
 * SIZE_MAX when out of memory. */
size_t flm_tokenizer_encode(const flm_tokenizer *t, const char *text, bool add_bos, int32_t *ids, size_t cap);

/* The decoded bytes of token id: SPM "▁" -> ' ', byte tokens -> that byte; GPT-2 characters -> their bytes;
 * user-defined tokens -> their text; control/unknown/unused tokens and out-of-range ids -> "".
 * With a space prefix (SPM add_space_prefix), after BOS or another special token (prev) a leading space is dropped,
 * as SentencePiece does. *len gets the byte count; the pointer is valid until the tokenizer is freed. */
const char *flm_tokenizer_piece(const flm_tokenizer *t, int32_t prev, int32_t id, size_t *len);
/* The raw vocabulary string of id (for inspect/debug), or "" when out of range. */
const char *flm_tokenizer_vocab(const flm_tokenizer *t, int32_t id);
uint32_t flm_tokenizer_n_vocab(const flm_tokenizer *t);
int32_t flm_tokenizer_bos(const flm_tokenizer *t);
int32_t flm_tokenizer_eos(const flm_tokenizer *t);

/* ---- Added for real models (GPT-2 byte-level BPE, added/special tokens, chat). ---- */
#define FLM_TOKENIZE_ADD_BOS 1u       /* BOS first (when the vocabulary has one) */
/* FLM_TOKENIZE_PARSE_SPECIAL (2u, include/flashlm.h): control tokens spelled out in the text ("<|im_start|>") are
 * matched whole before the tokenizer proper runs (user-defined tokens always are, as in llama.cpp) */
#define FLM_TOKENIZE_ADD_EOS 4u       /* EOS last (when the vocabulary has one) */
/* Encode len bytes of text (need not be NUL-terminated) into at most cap ids. Returns the number of ids the full
 * encoding needs (only the first cap are written), or SIZE_MAX when out of memory. */
size_t flm_tokenizer_encode_ex(const flm_tokenizer *t, const char *text, size_t len, unsigned flags, int32_t *ids,
                               size_t cap);
/* flm_tokenizer_encode_ex where, with FLM_TOKENIZE_PARSE_SPECIAL, no control token is matched that overlaps one of the
 * n_plain spans [plain[2i], plain[2i + 1]) (sorted, disjoint byte ranges of text: e.g. chat message contents), so
 * their text tokenizes as plain text does (user-defined tokens are matched everywhere, as without the flag). */
size_t flm_tokenizer_encode_spans(const flm_tokenizer *t, const char *text, size_t len, unsigned flags,
                                  const size_t *plain, size_t n_plain, int32_t *ids, size_t cap);
/* The id whose vocabulary string is exactly piece (e.g. "<|im_end|>"), or -1. */
int32_t flm_tokenizer_find(const flm_tokenizer *t, const char *piece);
/* true for the tokens that end a generation or a chat turn: EOS, EOT, and control tokens such as "<|im_end|>",
 * "<|endoftext|>", "<end_of_turn>" (as llama.cpp's vocab marks end-of-generation tokens). */
bool flm_tokenizer_is_eog(const flm_tokenizer *t, int32_t id);
/* tokenizer.ggml.add_bos_token (default: true for "llama" vocabularies, false for "gpt2" ones except the llama3
 * pre-tokenizer, as llama.cpp). */
bool flm_tokenizer_wants_bos(const flm_tokenizer *t);
/* tokenizer.ggml.add_eos_token (default false). */
bool flm_tokenizer_wants_eos(const flm_tokenizer *t);
/* The flags for encoding as llama.cpp's add_special does: ADD_BOS / ADD_EOS as the model asks. */
unsigned flm_tokenizer_special_flags(const flm_tokenizer *t);

/* Everything a tokenizer is built from (the tokenizer.ggml.* metadata). Arrays are borrowed for the call only. */
typedef struct flm_tokenizer_spec {
    const char *model;            /* "llama" (SentencePiece) or "gpt2" (byte-level BPE) */
    const char *pre;              /* gpt2: tokenizer.ggml.pre ("gpt2", "llama-bpe", "qwen2", "smollm", ...); NULL or
                                     "default" for llama.cpp's default regexes */
    uint32_t n_vocab;
    const char *const *pieces;    /* n_vocab UTF-8 strings, lens[i] bytes each */
    const uint32_t *lens;
    const float *scores;          /* n_vocab or NULL (all 0) */
    const int32_t *types;         /* n_vocab FLM_TOK_* or NULL (byte tokens by their "<0xXX>" spelling) */
    uint32_t n_merges;            /* gpt2: tokenizer.ggml.merges, "a b" each, rank = index */
    const char *const *merges;
    const uint32_t *merge_lens;
    int32_t bos, eos, eot, eom;   /* ids or -1 */
    int32_t fim_pad, fim_rep, fim_sep; /* end-of-generation FIM ids or -1 (also found by their text) */
    int add_bos, add_eos, add_space_prefix; /* 0/1, or -1 for the model's default */
} flm_tokenizer_spec;

/* Build from a spec. Errors: FLM_ERR_FORMAT (n_vocab 0 or > 2^24, a special id out of range, a piece with a NUL
 * byte, a bad merge), FLM_ERR_UNSUPPORTED (another model or pre-tokenizer: the message names it), FLM_ERR_NOMEM.
 * Messages do not name a file: the caller prefixes it. */
flm_status flm_tokenizer_create_spec(const flm_tokenizer_spec *spec, flm_tokenizer **out, flm_error *err);

/* The tokenizer described by GGUF metadata (tokenizer.ggml.model "llama" or "gpt2"; tokens, scores, token_type,
 * merges, pre, special ids, add_bos_token/add_eos_token/add_space_prefix). Errors: FLM_ERR_FORMAT naming the file
 * and key, FLM_ERR_UNSUPPORTED (another tokenizer model or pre-tokenizer: the message names the file and the
 * string), FLM_ERR_NOMEM. (src/format/tokenizer_gguf.c) */
struct flm_gguf_file;
flm_status flm_tokenizer_from_gguf(const struct flm_gguf_file *f, flm_tokenizer **out, flm_error *err);

#endif
