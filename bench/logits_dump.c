/* logits_dump.c — a prompt's and a greedy continuation's next-token logits, for comparing builds (the 64-bit Arm
 * build under qemu against the x86-64 one: scripts/check-arm64-logits.sh). Uses the public API only.
 *
 *   logits_dump MODEL PROMPT N_GEN OUT.f32
 * evaluates the prompt (BOS as the model asks) token by token, then N_GEN greedy tokens (argmax, the lowest id on
 * ties), and writes every position's n_vocab logits as little-endian float32 rows to OUT.f32 (prompt tokens + N_GEN
 * rows). stdout: "kernels LEVEL n_vocab V positions P", "tokens ID ID ..." (the generated ones), then the
 * generated text on one line. Exit 1 with a message on
 * any error. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flashlm.h"

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: logits_dump MODEL PROMPT N_GEN OUT.f32\n");
        return 2;
    }
    const int n_gen = atoi(argv[3]);
    flm_params p;
    flm_params_default(&p);
    p.n_ctx = 256;
    flm_ctx *ctx = NULL;
    flm_error err = {0};
    if (flm_open(argv[1], &p, &ctx, &err) != FLM_OK) {
        fprintf(stderr, "logits_dump: %s\n", err.msg);
        return 1;
    }
    flm_model_info info;
    flm_get_info(ctx, &info);
    size_t n_prompt = 0;
    int32_t *ids = flm_tokenize_all(ctx, argv[2], flm_add_bos(ctx), &n_prompt);
    FILE *out = fopen(argv[4], "wb");
    if (!ids || !out || n_prompt == 0 || n_gen < 0 || n_prompt + (size_t)n_gen > (size_t)p.n_ctx) {
        fprintf(stderr, "logits_dump: %s: cannot tokenize the prompt or open the output, or too long\n", argv[4]);
        return 1;
    }
    printf("kernels %s n_vocab %u positions %zu\ntokens", flm_kernels_in_use(NULL), info.n_vocab,
           n_prompt + (size_t)n_gen);
    int32_t tok = ids[0], prev = -1;
    char *text = calloc((size_t)n_gen * 64 + 1, 1);
    size_t text_len = 0;
    for (int pos = 0; pos < (int)n_prompt + n_gen; pos++) {
        const float *lg = NULL;
        if (flm_eval(ctx, tok, pos, &lg, &err) != FLM_OK) {
            fprintf(stderr, "logits_dump: %s at position %d\n", err.msg, pos);
            return 1;
        }
        if (fwrite(lg, sizeof(float), info.n_vocab, out) != info.n_vocab) {
            fprintf(stderr, "logits_dump: %s: write failed\n", argv[4]);
            return 1;
        }
        uint32_t best = 0;
        for (uint32_t v = 1; v < info.n_vocab; v++)
            if (lg[v] > lg[best]) best = v;
        prev = tok;
        tok = pos + 1 < (int)n_prompt ? ids[pos + 1] : (int32_t)best;
        if (pos + 1 >= (int)n_prompt && pos + 1 < (int)n_prompt + n_gen) {
            printf(" %d", tok);
            size_t len = 0;
            const char *piece = flm_token_piece(ctx, prev, tok, &len);
            if (len > 63) len = 63;
            memcpy(text + text_len, piece, len);
            text_len += len;
        }
    }
    for (size_t i = 0; i < text_len; i++)
        if (text[i] == '\n') text[i] = ' ';
    printf("\n%s\n", text);
    free(text);
    free(ids);
    fclose(out);
    flm_close(ctx);
    return 0;
}
