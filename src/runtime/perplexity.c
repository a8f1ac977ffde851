/* perplexity.c — teacher-forced perplexity over chunks (llama.cpp's `perplexity` method). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/hooks.h"
#include "runtime/runtime.h"
#include "core/error.h"

/* The chunks come from ids[0, n) (n_chunks of them), or from the stream s when ids is NULL (up to max_chunks, 0: to
 * the end; n_chunks for progress: max_chunks, or 0 when unknown). hooks (NULL: none) on every evaluation. */
static flm_status ppl_run(flm_ctx *ctx, const int32_t *ids, flm_text_stream *s, int n_chunk, int n_chunks,
                          int max_chunks, bool add_bos, void (*progress)(void *user, int chunk, int n_chunks, double ppl),
                          void *user, const flm_ffn_hooks *hooks, flm_ppl_result *out, flm_error *err) {
    const uint32_t n_vocab = ctx->model->hp.n_vocab;
    int32_t bos = add_bos ? flm_tokenizer_bos(ctx->model->tok) : -1;
    /* the scored half runs in batches of S tokens whose logits are all kept: S * n_vocab floats, outside the memory
     * plan (16 x 151,936 x 4 bytes = 9.3 MiB for Qwen2.5) */
    const uint32_t S = ctx->params.n_batch < 16 ? (uint32_t)ctx->params.n_batch : 16u;
    float *lg = malloc((size_t)S * n_vocab * sizeof(float));
    int32_t *toks = malloc((size_t)n_chunk * sizeof *toks), *chunk = malloc((size_t)n_chunk * sizeof *chunk);
    if (!lg || !toks || !chunk) {
        free(lg);
        free(toks);
        free(chunk);
        return flm_fail(err, FLM_ERR_NOMEM, "perplexity: out of memory");
    }
    double sum = 0, sum2 = 0;
    uint64_t count = 0;
    flm_status st = FLM_OK;
    for (int c = 0; !st && (ids ? c < n_chunks : max_chunks <= 0 || c < max_chunks); c++) {
        if (ids) memcpy(chunk, ids + (size_t)c * n_chunk, (size_t)n_chunk * sizeof *chunk);
        else { /* the next chunk of the text, read now: nothing past it is read or held */
            size_t got = 0;
            if ((st = flm_text_stream_read(s, chunk, (size_t)n_chunk, &got, err))) break;
            if (got < (size_t)n_chunk) {
                if (c == 0)
                    st = flm_fail(err, FLM_ERR_ARG, "perplexity: the text has %zu tokens, fewer than one chunk of %d",
                                  got, n_chunk);
                break;
            }
        }
        memcpy(toks, chunk, (size_t)n_chunk * sizeof *toks);
        if (bos >= 0) toks[0] = bos;
        /* llama.cpp scores the logits at positions first .. n_chunk-2 (n_chunk-1-first tokens): the first half is
         * context only, one batched call without logits */
        const int first = n_chunk / 2;
        const float *last;
        if ((st = flm_eval_hooked(ctx, toks, (uint32_t)first, 0, hooks, NULL, &last, err))) break;
        for (int pos = first; pos < n_chunk - 1 && !st;) {
            uint32_t m = (uint32_t)(n_chunk - 1 - pos) < S ? (uint32_t)(n_chunk - 1 - pos) : S;
            if ((st = flm_eval_hooked(ctx, toks + pos, m, pos, hooks, lg, &last, err))) break;
            for (uint32_t j = 0; j < m; j++, pos++) {
                const float *logits = lg + (size_t)j * n_vocab;
                float mx = logits[0];
                for (uint32_t i = 1; i < n_vocab; i++) mx = logits[i] > mx ? logits[i] : mx;
                double z = 0;
                for (uint32_t i = 0; i < n_vocab; i++) z += exp((double)logits[i] - mx);
                double nll = -((double)logits[chunk[pos + 1]] - mx - log(z));
                sum += nll;
                sum2 += nll * nll;
                count++;
            }
        }
        if (!st && progress) progress(user, c + 1, n_chunks, exp(sum / (double)count));
        out->n_chunks = c + 1;
    }
    free(lg);
    free(toks);
    free(chunk);
    if (st) return st;
    out->n_scored = count;
    out->nll = sum / (double)count;
    double var = sum2 / (double)count - out->nll * out->nll;
    out->nll_stderr = count > 1 && var > 0 ? sqrt(var / (double)(count - 1)) : 0;
    out->ppl = exp(out->nll);
    return FLM_OK;
}

flm_status flm_perplexity(flm_ctx *ctx, const char *text, int n_chunk, int max_chunks,
                          void (*progress)(void *user, int chunk, int n_chunks, double ppl), void *user,
                          flm_ppl_result *out, flm_error *err) {
    return flm_perplexity_hooked(ctx, text, n_chunk, max_chunks, progress, user, NULL, out, err);
}

flm_status flm_perplexity_hooked(flm_ctx *ctx, const char *text, int n_chunk, int max_chunks,
                                 void (*progress)(void *user, int chunk, int n_chunks, double ppl), void *user,
                                 const flm_ffn_hooks *hooks, flm_ppl_result *out, flm_error *err) {
    memset(out, 0, sizeof *out);
    if (n_chunk < 4 || n_chunk > ctx->params.n_ctx)
        return flm_fail(err, FLM_ERR_ARG, "perplexity: chunk of %d tokens must be in [4, context %d]", n_chunk,
                        ctx->params.n_ctx);
    size_t n = 0;
    /* as llama.cpp: BOS first only when the model adds one (tokenizer.ggml.add_bos_token) */
    const bool add_bos = flm_tokenizer_wants_bos(ctx->model->tok);
    int32_t *ids = flm_tokenize_all(ctx, text, add_bos, &n);
    if (!ids) return flm_fail(err, FLM_ERR_NOMEM, "perplexity: out of memory");
    int n_chunks = (int)(n / (size_t)n_chunk);
    if (max_chunks > 0 && n_chunks > max_chunks) n_chunks = max_chunks;
    if (n_chunks < 1) {
        free(ids);
        return flm_fail(err, FLM_ERR_ARG, "perplexity: the text has %zu tokens, fewer than one chunk of %d", n,
                        n_chunk);
    }
    flm_status st = ppl_run(ctx, ids, NULL, n_chunk, n_chunks, max_chunks, add_bos, progress, user, hooks, out, err);
    free(ids);
    return st;
}

flm_status flm_perplexity_file(flm_ctx *ctx, const char *path, int n_chunk, int max_chunks,
                               void (*progress)(void *user, int chunk, int n_chunks, double ppl), void *user,
                               flm_ppl_result *out, flm_error *err) {
    return flm_perplexity_file_hooked(ctx, path, n_chunk, max_chunks, progress, user, NULL, out, err);
}

flm_status flm_perplexity_file_hooked(flm_ctx *ctx, const char *path, int n_chunk, int max_chunks,
                                      void (*progress)(void *user, int chunk, int n_chunks, double ppl), void *user,
                                      const flm_ffn_hooks *hooks, flm_ppl_result *out, flm_error *err) {
    memset(out, 0, sizeof *out);
    if (n_chunk < 4 || n_chunk > ctx->params.n_ctx)
        return flm_fail(err, FLM_ERR_ARG, "perplexity: chunk of %d tokens must be in [4, context %d]", n_chunk,
                        ctx->params.n_ctx);
    const bool add_bos = flm_tokenizer_wants_bos(ctx->model->tok);
    flm_text_stream *s = NULL;
    flm_status st = flm_text_stream_open(ctx, path, add_bos, &s, err);
    if (st) return st;
    st = ppl_run(ctx, NULL, s, n_chunk, max_chunks > 0 ? max_chunks : 0, max_chunks, add_bos, progress, user, hooks,
                 out, err);
    flm_text_stream_close(s);
    return st;
}
