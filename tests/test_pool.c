/* test_pool.c — compute/pool.h: every chunk runs exactly once for any thread count, calls nested in a chunk and
 * calls from several threads at once complete (serially when the pool is busy), and a forked child starts its own
 * workers. */
#include "testutil.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "compute/pool.h"

#define MAX_CHUNKS 4096

typedef struct counts {
    _Atomic int n[MAX_CHUNKS];
    _Atomic int nested_total;
} counts;

static void count_chunk(void *arg, size_t c) {
    counts *k = arg;
    atomic_fetch_add(&k->n[c], 1);
    volatile double x = 0; /* a little work, so that chunks overlap */
    for (int i = 0; i < 200; i++) x += i * 0.5;
}

static void check_once(counts *k, size_t n) {
    for (size_t c = 0; c < MAX_CHUNKS; c++) assert_int_equal(atomic_load(&k->n[c]), c < n ? 1 : 0);
}

static void test_every_chunk_once(void **state) {
    (void)state;
    static const size_t sizes[] = {0, 1, 2, 3, 7, 64, 1000, MAX_CHUNKS};
    counts *k = calloc(1, sizeof *k);
    assert_non_null(k);
    for (int t = 0; t <= 5; t++)
        for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++)
            for (int rep = 0; rep < 20; rep++) {
                for (size_t c = 0; c < MAX_CHUNKS; c++) atomic_store(&k->n[c], 0);
                flm_pool_run(t, sizes[s], count_chunk, k);
                check_once(k, sizes[s]);
            }
    free(k);
}

static void nested_chunk(void *arg, size_t c) {
    counts *inner = (counts *)arg + 1 + c; /* its own counters */
    flm_pool_run(2, 100, count_chunk, inner);
    atomic_fetch_add(&((counts *)arg)->n[c], 1);
}

static void test_nested(void **state) {
    (void)state;
    counts *k = calloc(1 + 8, sizeof *k);
    assert_non_null(k);
    flm_pool_run(3, 8, nested_chunk, k);
    check_once(&k[0], 8);
    for (int c = 0; c < 8; c++) check_once(&k[1 + c], 100);
    free(k);
}

static void *caller(void *arg) {
    counts *k = arg;
    for (int rep = 0; rep < 200; rep++) {
        for (size_t c = 0; c < 300; c++) atomic_store(&k->n[c], 0);
        flm_pool_run(2, 300, count_chunk, k);
        for (size_t c = 0; c < 300; c++)
            if (atomic_load(&k->n[c]) != 1) return (void *)1;
    }
    return NULL;
}

static void test_concurrent_callers(void **state) {
    (void)state;
    counts *k = calloc(3, sizeof *k);
    assert_non_null(k);
    pthread_t th[3];
    for (int i = 0; i < 3; i++) assert_int_equal(pthread_create(&th[i], NULL, caller, &k[i]), 0);
    for (int i = 0; i < 3; i++) {
        void *r;
        assert_int_equal(pthread_join(th[i], &r), 0);
        assert_null(r);
    }
    free(k);
}

static void test_fork(void **state) {
    (void)state;
    counts *k = calloc(1, sizeof *k);
    assert_non_null(k);
    flm_pool_run(2, 50, count_chunk, k); /* the parent's workers exist */
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        for (size_t c = 0; c < MAX_CHUNKS; c++) atomic_store(&k->n[c], 0);
        flm_pool_run(2, 500, count_chunk, k);
        for (size_t c = 0; c < MAX_CHUNKS; c++)
            if (atomic_load(&k->n[c]) != (c < 500)) _exit(1);
        _exit(0);
    }
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    free(k);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_chunk_once),
        cmocka_unit_test(test_nested),
        cmocka_unit_test(test_concurrent_callers),
        cmocka_unit_test(test_fork),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
