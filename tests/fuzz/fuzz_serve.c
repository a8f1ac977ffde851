/* fuzz_serve.c — the request parser of `flashlm serve` (tools/serve_req.c) on arbitrary bytes: JSON syntax, every
 * field's type and range, messages and their content parts, stop strings.
 *
 * Input: byte 0 picks the endpoint (bit 0: chat completions, else text completions); the rest is the request body,
 * not NUL-terminated. Seeds: tests/fuzz/seeds/fuzz_serve (requests as OpenAI's SDK sends them). */
#include "fuzz_common.h"

#include "serve.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    bool chat = data[0] & 1;
    /* the body in its own allocation of exactly its size, so a read past it is caught */
    size_t n = size - 1;
    char *body = malloc(n ? n : 1);
    if (!body) return 0;
    memcpy(body, data + 1, n);
    serve_req r;
    char msg[SERVE_ERR_MAX];
    int status = serve_parse_request(body, n, chat, &r, msg, sizeof msg);
    fz_check(status == 0 || status == 400 || status == 500, "status %d", status);
    if (status) {
        fz_check(msg[0] != 0 && strlen(msg) < sizeof msg, "an error without a message");
        fz_check(r.msgs == NULL && r.prompt == NULL && r.n_stop == 0, "fields left after an error");
    } else {
        fz_check(r.chat == chat, "endpoint");
        if (chat) fz_check(r.n_msgs >= 1 && r.n_msgs <= SERVE_MAX_MSGS && r.prompt == NULL, "messages %zu", r.n_msgs);
        else fz_check(r.prompt != NULL && r.n_msgs == 0, "prompt");
        for (size_t i = 0; i < r.n_msgs; i++) {
            fz_check(r.msgs[i].role && r.msgs[i].content, "message %zu", i);
            fz_check(!strcmp(r.msgs[i].role, "system") || !strcmp(r.msgs[i].role, "user") ||
                     !strcmp(r.msgs[i].role, "assistant") || !strcmp(r.msgs[i].role, "tool"), "role %s",
                     r.msgs[i].role); /* "developer" is kept as "system"; "tool": a tool's result (issue 32) */
        }
        fz_check(r.n_stop >= 0 && r.n_stop <= FLM_GEN_STOP_MAX, "n_stop %d", r.n_stop);
        for (int i = 0; i < r.n_stop; i++)
            fz_check(strlen(r.stop[i]) >= 1 && strlen(r.stop[i]) <= FLM_GEN_STOP_LEN, "stop %d", i);
        fz_check(!r.has_temp || (r.temperature >= 0 && r.temperature <= 2), "temperature");
        fz_check(!r.has_top_p || (r.top_p >= 0 && r.top_p <= 1), "top_p");
        fz_check(r.max_tokens >= -1 && r.max_tokens <= (1 << 24), "max_tokens %ld", r.max_tokens);
        fz_check(r.top_k >= -1, "top_k");
        serve_req_free(&r);
    }
    free(body);
    return 0;
}
