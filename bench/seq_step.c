/* seq_step.c — what the joined passes of `serve --parallel N` cost without HTTP, sampling or streaming around them:
 * N threads on one context of N sequences (flm_params.n_seq), each evaluating its own prompt then decoding greedily
 * token by token with flm_eval_seq, so that the passes join (continuous batching, src/runtime/context.c).
 *   seq_step MODEL N [GEN [PROMPT [THREADS [MEM%]]]]   e.g. seq_step qwen2.5-coder-0.5b.gguf 4 64 32 2
 * Prints the decode's generated tokens/s (all sequences), the passes it took, rows per pass and ms per pass; run
 * with N = 1 and N = 4 in one sitting for the batching's gain. The prompts are token ids 100 + 7 * seq + i.
 * With SEQ_STEP_SESSION=1 each thread decodes through a session instead (flm_session_create_seq, greedy
 * flm_session_generate, what serve's slots run), so the difference is the session's cost around the passes. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "flashlm.h"

typedef struct job {
    flm_ctx *ctx;
    uint32_t seq;
    int prompt, gen;
    pthread_barrier_t *bar;
    bool session;
    flm_status st;
    flm_error err;
} job;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int32_t argmax(const float *x, size_t n) {
    size_t b = 0;
    for (size_t i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return (int32_t)b;
}

static void *run_session(job *J) {
    flm_session *S = NULL;
    int32_t *ids = malloc((size_t)J->prompt * sizeof *ids);
    for (int i = 0; i < J->prompt; i++) ids[i] = 100 + 7 * (int32_t)J->seq + i;
    flm_sampler_params sp;
    flm_sampler_params_default(&sp);
    sp.temp = 0;
    size_t reused = 0;
    if (!(J->st = flm_session_create_seq(J->ctx, J->seq, &S, &J->err)) &&
        !(J->st = flm_session_sampling(S, &sp, &J->err)))
        J->st = flm_session_prompt(S, ids, (size_t)J->prompt, &reused, &J->err);
    pthread_barrier_wait(J->bar);
    pthread_barrier_wait(J->bar);
    if (!J->st) {
        flm_gen_params gp;
        flm_gen_params_default(&gp);
        gp.max_tokens = J->gen;
        flm_gen_result r;
        J->st = flm_session_generate(S, &gp, NULL, NULL, &r, &J->err);
    }
    flm_session_free(S);
    free(ids);
    return NULL;
}

static void *run(void *arg) {
    job *J = arg;
    if (J->session) return run_session(J);
    const size_t V = flm_vocab_size(J->ctx);
    int32_t *ids = malloc((size_t)J->prompt * sizeof *ids);
    for (int i = 0; i < J->prompt; i++) ids[i] = 100 + 7 * (int32_t)J->seq + i;
    const float *logits = NULL;
    J->st = flm_eval_seq(J->ctx, J->seq, ids, (uint32_t)J->prompt, 0, &logits, NULL, &J->err);
    pthread_barrier_wait(J->bar); /* every prompt in, then the decode is timed */
    pthread_barrier_wait(J->bar);
    for (int i = 0; i < J->gen && !J->st; i++) {
        int32_t t = argmax(logits, V);
        J->st = flm_eval_seq(J->ctx, J->seq, &t, 1, J->prompt + i, &logits, NULL, &J->err);
    }
    flm_seq_leave(J->ctx, J->seq);
    free(ids);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: seq_step MODEL N [GEN [PROMPT [THREADS [MEM%%]]]]\n");
        return 2;
    }
    const int n = atoi(argv[2]), gen = argc > 3 ? atoi(argv[3]) : 64, prompt = argc > 4 ? atoi(argv[4]) : 32;
    if (n < 1 || n > 16 || gen < 1 || prompt < 1) {
        fprintf(stderr, "seq_step: N 1..16, GEN and PROMPT >= 1\n");
        return 2;
    }
    flm_params p;
    flm_params_default(&p);
    p.n_seq = n;
    p.n_ctx = prompt + gen + 1;
    if (argc > 5) p.n_threads = atoi(argv[5]);
    if (argc > 6) p.mem_percent = atof(argv[6]);
    flm_ctx *ctx = NULL;
    flm_error err;
    if (flm_open(argv[1], &p, &ctx, &err)) {
        fprintf(stderr, "seq_step: %s\n", err.msg);
        return 1;
    }
    const bool session = getenv("SEQ_STEP_SESSION") && atoi(getenv("SEQ_STEP_SESSION"));
    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, (unsigned)n + 1);
    job jobs[16];
    pthread_t th[16];
    for (int s = 0; s < n; s++) {
        jobs[s] = (job){ctx, (uint32_t)s, prompt, gen, &bar, session, FLM_OK, {0}};
        pthread_create(&th[s], NULL, run, &jobs[s]);
    }
    pthread_barrier_wait(&bar);
    flm_stats a, b;
    flm_get_stats(ctx, &a);
    const double t0 = now_s();
    pthread_barrier_wait(&bar);
    for (int s = 0; s < n; s++) pthread_join(th[s], NULL);
    const double dt = now_s() - t0;
    flm_get_stats(ctx, &b);
    int rc = 0;
    for (int s = 0; s < n; s++)
        if (jobs[s].st) {
            fprintf(stderr, "seq_step: sequence %d: %s\n", s, jobs[s].err.msg);
            rc = 1;
        }
    const uint64_t passes = b.n_joined - a.n_joined, rows = b.rows_joined - a.rows_joined;
    printf("%d sequences x %d tokens in %.3f s: %.2f generated tokens/s; %llu joined passes of %.2f rows, %.2f ms "
           "per generated token of one sequence\n",
           n, gen, dt, (double)n * gen / dt, (unsigned long long)passes, passes ? (double)rows / passes : 0.0,
           dt * 1000.0 / gen);
    flm_close(ctx);
    return rc;
}
