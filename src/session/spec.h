/* spec.h — the speculative decoding engine of a session (internal; the public face is flm_session_speculate and
 * flm_session_generate in include/flashlm.h): drafting (a draft model, the n-gram lookup, the self-draft as a chain or
 * a tree), one batched verification per step, the acceptance rule, keeping the draft model in step with the text.
 * The session owns the token loop (stops, limits, cancellation, the context shift, the callback); the engine decides
 * the tokens of one step at a time. It runs the models through the public runtime API only. docs/SPECULATIVE.md. */
#ifndef FLM_SESSION_SPEC_H
#define FLM_SESSION_SPEC_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "flashlm.h"
#include "runtime/runtime.h" /* FLM_SPEC_TREE_K: the buffers the plan sizes (flm_spec_buffer_bytes) */

#define SPEC_NGRAM_MAX 3 /* the n-gram lookup tries the last 3, then 2, then 1 tokens */
#define SPEC_TREE_K FLM_SPEC_TREE_K /* children considered per node: its draft's most likely tokens (greedy) or draws */
#define SPEC_TREE_W 8    /* nodes added per level at most */

typedef struct spec spec;

/* An engine over target and, when draft is not NULL, a draft model's context (both borrowed). hist (borrowed, at
 * least n_ctx + 1 int32 of the target's context) is the session's token history: the tokens the target holds,
 * which each step reads and extends. smp (borrowed; spec_set_sampler replaces it) samples every token.
 * Errors: FLM_ERR_ARG (as flm_session_speculate), FLM_ERR_NOMEM. */
flm_status spec_create(flm_ctx *target, flm_ctx *draft, flm_sampler *smp, int32_t *hist, const flm_spec_params *o,
                       spec **out, flm_error *err);
void spec_free(spec *s);
/* The sampler the next steps use (the session replaced its own). */
void spec_set_sampler(spec *s, flm_sampler *smp);
/* The noise key of position i is i + key_off from now on (the session's: the positions a context shift discarded,
 * so that a key is never used twice for one text). */
void spec_set_key_off(spec *s, uint64_t key_off);

/* The target's sequence the engine evaluates (the session's; 0 until set). */
void spec_set_seq(spec *s, uint32_t seq);
/* The target's evaluations since the last take: *sum their own statistics summed (flm_evaluate's flm_call_stats),
 * *last the last one's (a step's verification, whose logits decided its tokens); both zeroed after. */
void spec_take_calls(spec *s, flm_call_stats *sum, flm_call_stats *last);

/* After the target was fed up to hist[0..n) (a prompt): bring a draft model up to the same tokens now, so the
 * prompt's time is not charged to generation. Errors: those of the draft's flm_eval_batch. */
flm_status spec_prompted(spec *s, int32_t n, flm_error *err);

/* One step with the target holding hist[0..H) (H < n_ctx) and `last` (decided, not evaluated) next: propose,
 * verify [last, proposals] in one pass, accept. out[0..*m) gets the tokens decided (1 <= *m <= max_new): the accepted
 * drafts, then the target's own token. The target then holds hist[0..H + *m) = hist + last + the accepted drafts
 * (hist written), and *rows row j (n_vocab floats) the logits after out[j - 1] (row 0: after last), valid until the
 * next step. joined (a shared context whose other sequences are busy): the self-draft's tree (o.tree: each level
 * joined with the other sequences' drafts, the tree at most n_batch / n_seq nodes, pruned under the joined pass's
 * cost) or a chain of drafts (the self-draft's, a draft model's, or the n-gram lookup's) verified in a pass joined
 * with the other sequences' (flm_evaluate with join); the caller must not hold the context's turn. Errors:
 * those of the evaluations (the target then holds hist[0..H) at most). */
flm_status spec_step(spec *s, int32_t H, int32_t last, long max_new, bool joined, int32_t *out, uint32_t *m,
                     const float **rows, flm_error *err);

/* The counters (the session adds the target's share, from spec_take_calls, and the tokens generated). */
flm_spec_stats *spec_stats(spec *s);

/* The n-gram lookup: for n = max_n, ..., 1, find the most recent earlier occurrence of the last n tokens of
 * seq[0..len) (one followed by at least one token) and copy up to cap of the tokens that followed it into out; the
 * first n that matches decides. Returns the number copied (0: no n-gram recurs). */
uint32_t spec_ngram_lookup(const int32_t *seq, size_t len, uint32_t max_n, int32_t *out, uint32_t cap);

#endif
