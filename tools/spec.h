/* spec.h — speculative decoding for the CLI (run, chat): a draft proposes tokens, the target verifies them all in one
 * batched pass and keeps the longest prefix it agrees with, plus one token of its own (Leviathan et al. 2023,
 * "Fast Inference from Transformers via Speculative Decoding"; Chen et al. 2023). The drafts come from a small model
 * that shares the target's tokenizer (--draft), or from the text itself (--draft-ngram: the tokens that followed the
 * last earlier occurrence of the current n-gram, llama.cpp's "lookup decoding"). docs/SPECULATIVE.md.
 *
 * The engine (this header, tools/spec.c) runs the models through the public API only (flashlm.h, its vocabulary
 * calls for the vocabulary check) and prints nothing; the command-line glue (flags, opening the draft inside the memory
 * budget, the statistics lines) is tools/spec_cli.c. tests/test_spec.c links the engine directly. */
#ifndef FLM_TOOLS_SPEC_H
#define FLM_TOOLS_SPEC_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "flashlm.h"

#define CLI_SPEC_NGRAM_MAX 3 /* --draft-ngram tries the last 3, then 2, then 1 tokens */
#define CLI_SPEC_DRAFT_MAX 64 /* the most tokens one step may propose (--draft-n) */

typedef struct cli_spec cli_spec;

typedef struct cli_spec_opts {
    int n_draft; /* lambda: tokens proposed per step, 1..CLI_SPEC_DRAFT_MAX (fewer near the end of -n or of the
                    context, or when the n-gram lookup finds fewer) */
    bool ngram;  /* without a draft model: propose by n-gram lookup in the prompt and the generated text */
    bool adaptive; /* choose each step's draft length 0..n_draft from the measured costs (spec.c, choose_n):
                      the expected tokens per second of a pass, E(n) / (n c_draft + c_verify(n + 1)), with
                      E(n) = (1 - a^(n+1)) / (1 - a) for the measured acceptance a; 0 drafts when drafting does not
                      pay (a compute-bound model), so speculation never costs much more than plain decoding */
    bool self_draft; /* without a draft model: the target proposes with its FFNs restricted to the neurons in memory
                        (flm_eval_draft; mode hot), its drafts' keys and values overwritten by the verification */
    int tree;        /* with self_draft: the most nodes of a draft tree (2..CLI_SPEC_DRAFT_MAX; 0: a chain). Each
                        level's nodes are drafted in one flm_eval_tree, the whole tree verified in one
                        (spec.c, tree_step); n_draft bounds its depth. Greedy trees also take the n-gram lookup's
                        continuation as a branch. */
} cli_spec_opts;

#define CLI_SPEC_AUTO_TREE 12 /* mode auto running hot: the self-draft's tree (nodes; depth CLI_SPEC_AUTO_DEPTH) */
#define CLI_SPEC_AUTO_DEPTH 6
#define CLI_SPEC_TREE_K 4     /* children considered per node: its draft's most likely tokens (greedy) or draws */
#define CLI_SPEC_TREE_W 8     /* nodes added per level at most */

/* Counts since cli_spec_create, over cli_spec_generate calls (generation only, not prompts). */
typedef struct cli_spec_stats {
    uint64_t n_gen;          /* tokens generated (an end-of-generation token included, as cli_reply.n_gen) */
    uint64_t n_passes;       /* target forward passes (flm_eval_batch calls) while generating */
    uint64_t n_steps;        /* of those, verification steps (the others feed the last token of a chat reply) */
    uint64_t n_drafted;      /* draft tokens proposed to the target */
    uint64_t n_accepted;     /* of those, accepted */
    uint64_t n_plain;        /* steps with nothing proposed (no n-gram match, or no room left) */
    uint64_t target_tokens;  /* tokens the target evaluated (accepted or not) */
    double target_ms;        /* the target's flash I/O + memory + compute ms (flm_stats) */
    uint64_t bytes_read;     /* the target's bytes read from flash */
    uint64_t n_loaded;       /* the target's neurons read from flash (sparse mode) */
    uint64_t draft_tokens;   /* tokens the draft model evaluated (re-synchronising included) */
    double draft_ms;         /* the draft model's ms */
    double draft_select_ms;  /* ms spent choosing drafts and accepting (sampler, n-gram lookup) outside both models */
    double verify_ms[CLI_SPEC_DRAFT_MAX + 2]; /* [k]: ms of the verification passes of k rows (the last token and k - 1
                                                 drafts), summed; pass time against rows */
    uint64_t verify_n[CLI_SPEC_DRAFT_MAX + 2]; /* [k]: how many such passes */
} cli_spec_stats;

/* Bytes of the engine's buffers for these sizes (what cli_spec_create allocates): the verification logits
 * ((n_draft + 1) * n_vocab floats), the draft's distributions (n_draft * n_vocab floats, with a draft model), one
 * distribution, the token histories. */
uint64_t cli_spec_buffer_bytes(uint32_t n_vocab, uint32_t n_ctx, int n_draft, bool with_draft_model);
/* Bytes a draft tree of `tree` nodes adds (cli_spec_opts.tree): its logits rows beyond n_draft + 1, the drafts'
 * distributions when sampling (!greedy), the nodes. */
uint64_t cli_spec_tree_bytes(uint32_t n_vocab, int tree, bool greedy);

/* A speculative decoder over an open target context and, when draft is not NULL, a draft context (both borrowed:
 * the caller closes them after cli_spec_free). smp (borrowed) samples every token: the draft's proposals from the
 * draft's distributions, the target's tokens, and the acceptance draws (greedy when its temp is 0).
 * Errors: FLM_ERR_ARG (n_draft out of range, no draft model and !ngram, vocabulary sizes that differ: check the
 * tokenizers first with cli_spec_check_vocab), FLM_ERR_NOMEM. */
flm_status cli_spec_create(flm_ctx *target, flm_ctx *draft, flm_sampler *smp, const cli_spec_opts *o, cli_spec **out,
                           flm_error *err);
void cli_spec_free(cli_spec *s);

/* Whether draft can draft for target: the same vocabulary size (logits), every token's string identical, the same
 * BOS and EOS. FLM_OK, or FLM_ERR_ARG with a message naming both files (target_path, draft_path) and the first
 * difference. */
flm_status cli_spec_check_vocab(const flm_ctx *target, const char *target_path, const flm_ctx *draft,
                                const char *draft_path, flm_error *err);

/* Evaluate ids[0..n) in the target at positions pos .. pos + n - 1 (pos <= the tokens it holds: an earlier pos
 * forgets what follows, as flm_eval_batch), *logits (may be NULL) set to the last one's logits. The draft model is
 * brought up to the same tokens (one batched call). Errors: those of flm_eval_batch (the draft's name its file). */
flm_status cli_spec_feed(cli_spec *s, const int32_t *ids, size_t n, int32_t pos, const float **logits,
                         flm_error *err);
/* Forget the tokens at positions >= n (the target is rewound by the next evaluation, which starts at n). */
void cli_spec_rewind(cli_spec *s, int32_t n);
/* Tokens the target holds (as far as the engine knows: those fed and accepted). */
int32_t cli_spec_n_past(const cli_spec *s);

/* Called with each generated token (not an end-of-generation one) and the token before it (-1 at position 0), in
 * order; false stops generation with FLM_ERR_NOMEM (e.g. the caller ran out of memory storing text). */
typedef bool (*cli_spec_emit_fn)(void *user, int32_t prev, int32_t token);

typedef struct cli_spec_result {
    long n_gen;          /* tokens generated (an end-of-generation token included) */
    bool eog;            /* stopped at an end-of-generation token (not emitted, not in the context) */
    bool ctx_full;       /* stopped: the context has no room for the next token */
    int32_t n_past;      /* tokens the target holds now: every emitted token except, when !feed_last, the last */
    int32_t last;        /* the token at n_past - 1 (-1 when none) */
    const float *logits; /* the next-token logits after those n_past tokens (valid until the next evaluation) */
} cli_spec_result;

/* Generate up to n_predict tokens after the tokens fed (cli_spec_feed), whose next-token logits are `logits`, as
 * plain decoding with smp would — token for token the same text when greedy; with sampling, the same distribution
 * (flm_sampler_accept) — but with as few target passes as the drafts allow: each step proposes up to n_draft tokens
 * and the target evaluates the last token and the proposals in one flm_eval_batch. Stops at an end-of-generation
 * token, after n_predict tokens, or when the context is full; each generated token goes to emit as it is decided.
 * feed_last: the n_predict-th token is evaluated too (a chat reply the next turn follows). Errors: those of the
 * evaluations (r still says where the context stands), FLM_ERR_NOMEM (emit returned false). */
flm_status cli_spec_generate(cli_spec *s, const float *logits, long n_predict, bool feed_last, cli_spec_emit_fn emit,
                             void *user, cli_spec_result *r, flm_error *err);

void cli_spec_get_stats(const cli_spec *s, cli_spec_stats *st);

/* The n-gram lookup of --draft-ngram: for n = max_n, ..., 1, find the most recent earlier occurrence of the last n
 * tokens of seq[0..len) (one that is followed by at least one token) and copy up to cap of the tokens that followed it
 * into out; the first n that matches decides. Returns the number copied (0: no n-gram recurs). */
uint32_t cli_spec_ngram_lookup(const int32_t *seq, size_t len, uint32_t max_n, int32_t *out, uint32_t cap);

#endif
