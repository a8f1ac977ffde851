/* testutil.h — helpers shared by the cmocka tests. */
#ifndef FLM_TESTUTIL_H
#define FLM_TESTUTIL_H
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

/* Path under tests/data, the tests' own fixtures (e.g. "models/stories260K/stories260K.gguf"); static buffer, valid until the next call. */
const char *tu_data(const char *rel);
/* A fresh path under the test build's tmp dir, unique per call: "<tmp>/<tag>-<pid>-<n><suffix>". Static ring. */
const char *tu_tmp(const char *tag, const char *suffix);
/* true when the checked writer (flm_out) has left a temporary "<path>.tmp.XXXXXX" or a lock "<path>.lock" (or an
 * old-style "<path>.tmp") beside path. */
#include <stdbool.h>
bool tu_temp_left(const char *path);
/* Read a whole file into malloc'd memory; *len gets its size. Fails the test on error. */
uint8_t *tu_read_file(const char *path, size_t *len);
/* Write len bytes to path (overwrites). Fails the test on error. */
void tu_write_file(const char *path, const void *data, size_t len);
/* Run the flashlm CLI with the given argument string through /bin/sh (append "2>&1" to capture stderr); capture stdout (malloc'd, NUL-ended)
 * into *out when non-NULL; return the exit status (or -1 when killed by a signal). */
int tu_run_cli(const char *args, char **out);
/* Run the CLI with args, stderr joined to stdout; fail the test (the command and its output in the message) unless it
 * exits want_rc and, when want_text is not NULL, its output holds want_text. Returns the output (malloc'd). */
char *tu_cli_expect(const char *args, int want_rc, const char *want_text);
/* Convert the pulled model `name` (tu_model) into a temporary .flm named after tag with `flashlm convert`; returns
 * its path (valid until the next call), or NULL when the model is not pulled. A failed convert fails the test. */
const char *tu_convert_pulled(const char *name, const char *tag);
/* The index of the largest of x[0..n) (the first on ties): greedy decoding's choice. */
int32_t tu_argmax(const float *x, uint32_t n);
/* Simple deterministic RNG for tests. */
uint64_t tu_rand_u64(uint64_t *state);
float tu_rand_f32(uint64_t *state); /* uniform in [-1, 1) */

/* The path of a real model pulled by `flashlm pull NAME` ($FLASHLM_CACHE, else $XDG_CACHE_HOME/flashlm, else
 * ~/.cache/flashlm; then models/NAME.gguf), or NULL when it has not been pulled. When it is missing and
 * FLASHLM_REQUIRE_MODELS=1 (CI) the test fails; otherwise the caller should skip(). Static buffer. */
const char *tu_model(const char *name);

/* Helpers over the public API (flashlm.h). */
struct flm_ctx;
/* The context's logits per token (n_vocab). */
uint32_t tu_vocab(const struct flm_ctx *ctx);
/* Logits [T][n_vocab] (malloc'd) of ids[0..T) from position 0: one flm_eval per token, or one flm_eval_batch. */
float *tu_logits(struct flm_ctx *ctx, const int32_t *ids, int T, bool batch);
struct flm_sampler;
/* Fails unless every count[i] / draws is within 5 binomial standard deviations (+ 1 / draws) of p[i]; what names the
 * check. */
void tu_expect_freqs(const double *count, const double *p, int n, double draws, const char *what);
/* The exact joint of the first three tokens after prompt (already tokenized; ref evaluates it from position 0) under a
 * top-k 3 sampler ps: cell a * 9 + b * 3 + c holds tokens cand[cell][0..2] (each position's 3 candidates in id order)
 * and their probability joint[cell]. */
void tu_joint3(struct flm_ctx *ref, const int32_t *prompt, int n_prompt, struct flm_sampler *ps, int32_t cand[27][3],
               double joint[27]);
/* The hot share flm_plan gives path (a hot-ordered .flm) in mode hot at mem bytes with 2 threads and n_ctx (-1: it
 * does not fit). */
double tu_hot_share_at(const char *path, uint64_t mem, int n_ctx);
/* A budget at which mode hot keeps between lo and hi of every layer of path (fails the test when none does). */
uint64_t tu_hot_budget_for_share(const char *path, double lo, double hi, int n_ctx);

/* tests/testutil_tools.c (the tools tier; not in test_public_api): */
/* Convert stories260K (tests/data) to the .flm path and store its FFN neurons hottest first (flm_hot_order: 512 tokens
 * of the first max_chars characters of the TinyStories sample, chunks of 128, 2 threads). 0, or -1 with the error on
 * stderr (for a cmocka setup). */
int tu_stories_hot(const char *path, size_t max_chars);
/* flm_open of path with 2 threads, n_ctx, mode, budget mem bytes or pct percent, and the draft window; fails the test
 * on error. The mode is an flm_mode. */
struct flm_ctx *tu_open_mode(const char *path, int mode, uint64_t mem, double pct, int n_ctx, double window);

#endif
