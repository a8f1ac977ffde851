/* pool.c — L_compute: the worker pool of flm_pool_run (pool.h).
 *
 * State: one job at a time (run_lock, taken with trylock: a nested or concurrent call runs serially). The caller
 * fills the job, then bumps `gen`, the futex word the workers wait on. A worker that sees a new generation joins
 * it when its index is below the job's worker count: it raises `active`, checks that the job is still open (the
 * caller may have finished it meanwhile), then takes chunks from `next` until none is left. The caller takes
 * chunks too, waits until `done` counts every chunk, closes the job (`closed` = its generation) and waits for
 * `active` to fall to 0, so no worker still reads the job when the next one is written. `closed` and `active` are
 * sequentially consistent: a worker that raised `active` after the caller read 0 sees the job closed and leaves.
 * Idle workers spin (FLASHLM_SPIN_US, default 50 microseconds), then sleep in FUTEX_WAIT on `gen`; the caller wakes
 * them only when some sleep (`sleepers`). */
#include "compute/pool.h"

#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#else
#define cpu_relax() ((void)0)
#endif

#define POOL_MAX_THREADS 256

static struct {
    pthread_mutex_t run_lock;   /* one job at a time */
    pthread_mutex_t grow_lock;  /* starting workers */
    int n_workers;              /* started */
    _Atomic uint32_t gen;       /* the job's generation: the futex word */
    _Atomic uint32_t closed;    /* the last generation whose chunks have all run */
    _Atomic int active;         /* workers inside the current job */
    _Atomic int sleepers;       /* workers in FUTEX_WAIT */
    /* the job (written by the caller before gen is bumped) */
    flm_pool_fn fn;
    void *arg;
    size_t n_chunks;
    int job_workers;            /* workers 0 .. job_workers-1 take part */
    _Atomic size_t next, done;
} P = {.run_lock = PTHREAD_MUTEX_INITIALIZER, .grow_lock = PTHREAD_MUTEX_INITIALIZER};

static long spin_ns(void) {
    static _Atomic long cached = -1;
    long v = atomic_load_explicit(&cached, memory_order_relaxed);
    if (v >= 0) return v;
    const char *e = getenv("FLASHLM_SPIN_US");
    char *end = NULL;
    long us = e && *e ? strtol(e, &end, 10) : 50;
    if (!e || !*e || *end || us < 0 || us > 1000000) us = 50;
    v = us * 1000;
    atomic_store_explicit(&cached, v, memory_order_relaxed);
    return v;
}

static bool use_omp(void) {
    static _Atomic int cached = -1;
    int v = atomic_load_explicit(&cached, memory_order_relaxed);
    if (v < 0) {
        const char *e = getenv("FLASHLM_THREADS");
        v = e && strcmp(e, "omp") == 0;
        atomic_store_explicit(&cached, v, memory_order_relaxed);
    }
    return v;
}

static long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long)ts.tv_sec * 1000000000L + ts.tv_nsec;
}

static void futex_wait(_Atomic uint32_t *w, uint32_t val) {
    syscall(SYS_futex, (uint32_t *)w, FUTEX_WAIT_PRIVATE, val, NULL, NULL, 0);
}
static void futex_wake_all(_Atomic uint32_t *w) {
    syscall(SYS_futex, (uint32_t *)w, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}

/* take chunks until none is left */
static void take_chunks(flm_pool_fn fn, void *arg, size_t n) {
    for (;;) {
        const size_t c = atomic_fetch_add_explicit(&P.next, 1, memory_order_relaxed);
        if (c >= n) return;
        fn(arg, c);
        atomic_fetch_add_explicit(&P.done, 1, memory_order_release);
    }
}

static void *worker(void *p) {
    const int id = (int)(intptr_t)p;
    uint32_t seen = atomic_load(&P.gen);
    for (;;) {
        uint32_t g = atomic_load_explicit(&P.gen, memory_order_acquire);
        if (g == seen) { /* idle: spin, then sleep */
            const long until = now_ns() + spin_ns();
            for (int i = 1;; i++) {
                cpu_relax();
                if ((g = atomic_load_explicit(&P.gen, memory_order_acquire)) != seen) break;
                if ((i & 63) == 0 && now_ns() >= until) {
                    atomic_fetch_add(&P.sleepers, 1);
                    while ((g = atomic_load(&P.gen)) == seen) futex_wait(&P.gen, seen);
                    atomic_fetch_sub(&P.sleepers, 1);
                    break;
                }
            }
        }
        seen = g;
        atomic_fetch_add(&P.active, 1);
        /* still this job, and still open: then its fields are this job's until active falls back */
        if (atomic_load(&P.gen) == g && atomic_load(&P.closed) != g && id < P.job_workers)
            take_chunks(P.fn, P.arg, P.n_chunks);
        atomic_fetch_sub(&P.active, 1);
    }
    return NULL;
}

/* in a child of fork() only the forking thread exists: start the pool afresh */
static void after_fork_child(void) {
    pthread_mutex_init(&P.run_lock, NULL);
    pthread_mutex_init(&P.grow_lock, NULL);
    P.n_workers = 0;
    atomic_store(&P.active, 0);
    atomic_store(&P.sleepers, 0);
}

static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;
static void register_atfork(void) { pthread_atfork(NULL, NULL, after_fork_child); }

/* start workers until there are `want` (under grow_lock); returns how many there are */
static int grow(int want) {
    pthread_once(&atfork_once, register_atfork);
    pthread_mutex_lock(&P.grow_lock);
    while (P.n_workers < want) {
        pthread_t th;
        pthread_attr_t at;
        pthread_attr_init(&at);
        pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
        int rc = pthread_create(&th, &at, worker, (void *)(intptr_t)P.n_workers);
        pthread_attr_destroy(&at);
        if (rc) break;
        P.n_workers++;
    }
    int n = P.n_workers;
    pthread_mutex_unlock(&P.grow_lock);
    return n;
}

void flm_pool_run(int n_threads, size_t n_chunks, flm_pool_fn fn, void *arg) {
    if (n_threads > POOL_MAX_THREADS) n_threads = POOL_MAX_THREADS;
    if ((size_t)n_threads > n_chunks) n_threads = (int)n_chunks;
    if (n_threads <= 1) {
        for (size_t c = 0; c < n_chunks; c++) fn(arg, c);
        return;
    }
    if (use_omp()) {
        const ptrdiff_t n = (ptrdiff_t)n_chunks;
#pragma omp parallel for num_threads(n_threads) schedule(dynamic, 1)
        for (ptrdiff_t c = 0; c < n; c++) fn(arg, (size_t)c);
        return;
    }
    if (pthread_mutex_trylock(&P.run_lock) != 0) { /* busy (nested, or another thread's product): serially */
        for (size_t c = 0; c < n_chunks; c++) fn(arg, c);
        return;
    }
    int workers = grow(n_threads - 1);
    if (workers > n_threads - 1) workers = n_threads - 1;
    P.fn = fn;
    P.arg = arg;
    P.n_chunks = n_chunks;
    P.job_workers = workers;
    atomic_store_explicit(&P.next, 0, memory_order_relaxed);
    atomic_store_explicit(&P.done, 0, memory_order_relaxed);
    const uint32_t g = atomic_fetch_add(&P.gen, 1) + 1; /* publishes the job */
    if (workers > 0 && atomic_load(&P.sleepers) > 0) futex_wake_all(&P.gen);
    take_chunks(fn, arg, n_chunks);
    /* the chunks workers took: they are running (a worker that lost its core: give it ours) */
    for (int i = 1; atomic_load_explicit(&P.done, memory_order_acquire) < n_chunks; i++) {
        cpu_relax();
        if ((i & 1023) == 0) sched_yield();
    }
    atomic_store(&P.closed, g);
    for (int i = 1; atomic_load(&P.active) > 0; i++) {
        cpu_relax();
        if ((i & 1023) == 0) sched_yield();
    }
    pthread_mutex_unlock(&P.run_lock);
}
