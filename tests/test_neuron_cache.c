/* test_neuron_cache.c — L_memory: the per-layer neuron cache with a sliding window (src/cache/neuron_cache.h;
 * Knowl 3, Knowl 5). Random token sets are run against a plain reference model (a window of sets and a multiset);
 * every loaded row gets a pattern derived from its neuron id, and after every step every occupied row must still
 * hold its own neuron's pattern, which proves swap-delete moves the data with the metadata. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include "cache/neuron_cache.h"
#include "testutil.h"

/* ---------------------------------------------------------------------------------------------------------------
 * Row contents: bytes 0..3 are the neuron id (little-endian), the rest a pattern derived from it.
 * ------------------------------------------------------------------------------------------------------------- */

static uint8_t pattern_byte(uint32_t id, uint64_t b) {
    if (b < 4) return (uint8_t)(id >> (8 * b));
    return (uint8_t)((id * 2654435761u >> 11) + b * 31u + id);
}

static void fill_row(uint8_t *row, uint64_t record_bytes, uint32_t id) {
    for (uint64_t b = 0; b < record_bytes; b++) row[b] = pattern_byte(id, b);
}

static bool row_holds(const uint8_t *row, uint64_t record_bytes, uint32_t id) {
    for (uint64_t b = 0; b < record_bytes; b++)
        if (row[b] != pattern_byte(id, b)) return false;
    return true;
}

/* Every occupied row holds its neuron's pattern, and the library's own check passes. */
static void check_cache(const flm_ncache *c) {
    char why[256];
    if (!flm_ncache_check(c, why, sizeof why)) fail_msg("flm_ncache_check: %s", why);
    uint64_t rb = flm_ncache_record_bytes(c);
    const uint8_t *m = flm_ncache_matrix(c);
    for (uint32_t r = 0; r < flm_ncache_rows_used(c); r++) {
        uint32_t id = flm_ncache_neuron_of(c, r);
        if (!row_holds(m + (size_t)r * rb, rb, id)) fail_msg("row %u does not hold neuron %u's bytes", r, id);
    }
}

/* Run one step and "read" the loaded neurons (fill their rows). Checks the outputs' shapes. */
static flm_status step_and_load(flm_ncache *c, const uint32_t *ids, uint32_t n, flm_ncache_stats *st,
                                const uint32_t **rows_out) {
    const uint32_t *load_ids, *rows;
    uint8_t *const *load_rows;
    flm_error err;
    flm_status s = flm_ncache_step(c, ids, n, st, &load_ids, &load_rows, &rows, &err);
    if (s != FLM_OK) {
        assert_null(load_ids);
        assert_null(load_rows);
        assert_null(rows);
        assert_int_equal(st->n_active, 0);
        return s;
    }
    uint64_t rb = flm_ncache_record_bytes(c);
    uint8_t *m = flm_ncache_matrix(c);
    for (uint32_t j = 0; j < st->n_loaded; j++) {
        int32_t r = flm_ncache_row_of(c, load_ids[j]);
        assert_true(r >= 0);
        assert_ptr_equal(load_rows[j], m + (size_t)r * rb);
        assert_ptr_equal(load_rows[j], load_rows[0] + (size_t)j * rb); /* consecutive rows */
        if (j > 0) assert_true(load_ids[j] > load_ids[j - 1]);
        fill_row(load_rows[j], rb, load_ids[j]);
    }
    for (uint32_t j = 0; j < n; j++) {
        assert_int_equal(flm_ncache_neuron_of(c, rows[j]), ids[j]);
        assert_int_equal(flm_ncache_row_of(c, ids[j]), (int32_t)rows[j]);
    }
    if (rows_out) *rows_out = rows;
    return s;
}

/* ---------------------------------------------------------------------------------------------------------------
 * Reference model: the window as a list of sets (oldest first), multiset counts, the same eviction policy.
 * ------------------------------------------------------------------------------------------------------------- */

#define D_FFN 257
#define MAX_SET 64
#define MAX_K 8

typedef struct ref_model {
    uint32_t k, capacity;
    uint32_t n_sets;
    uint32_t set_n[MAX_K];
    uint32_t sets[MAX_K][MAX_SET];
    uint32_t count[D_FFN];
} ref_model;

static uint32_t ref_union_size(const ref_model *m) {
    uint32_t u = 0;
    for (uint32_t i = 0; i < D_FFN; i++) u += m->count[i] > 0;
    return u;
}

static void ref_drop_oldest(ref_model *m) {
    for (uint32_t j = 0; j < m->set_n[0]; j++) m->count[m->sets[0][j]]--;
    memmove(m->set_n, m->set_n + 1, (m->n_sets - 1) * sizeof m->set_n[0]);
    memmove(m->sets, m->sets + 1, (m->n_sets - 1) * sizeof m->sets[0]);
    m->n_sets--;
}

/* The size of union(window) ∪ S. */
static uint32_t ref_union_with(const ref_model *m, const uint32_t *ids, uint32_t n) {
    uint32_t u = ref_union_size(m);
    for (uint32_t j = 0; j < n; j++) u += m->count[ids[j]] == 0;
    return u;
}

/* Returns the number of sets evicted early. */
static uint32_t ref_step(ref_model *m, const uint32_t *ids, uint32_t n) {
    if (m->n_sets == m->k) ref_drop_oldest(m);
    uint32_t evicted = 0;
    while (ref_union_with(m, ids, n) > m->capacity) {
        ref_drop_oldest(m);
        evicted++;
    }
    memcpy(m->sets[m->n_sets], ids, n * sizeof *ids);
    m->set_n[m->n_sets++] = n;
    for (uint32_t j = 0; j < n; j++) m->count[ids[j]]++;
    return evicted;
}

/* A random active set: some hot neurons that recur often, plus uniformly random ones; sorted, unique. */
static uint32_t random_set(uint64_t *rng, uint32_t max_n, uint32_t *ids) {
    bool in[D_FFN] = {false};
    uint32_t target = (uint32_t)(tu_rand_u64(rng) % (max_n + 1));
    if (tu_rand_u64(rng) % 4 == 0) target = target / 4; /* some small sets */
    uint32_t n = 0;
    for (uint32_t h = 0; h < 16 && n < target; h++) /* hot neurons 0, 16, 32, ... */
        if (tu_rand_u64(rng) % 10 < 7 && !in[h * 16]) in[h * 16] = true, n++;
    while (n < target) {
        uint32_t id = (uint32_t)(tu_rand_u64(rng) % D_FFN);
        if (!in[id]) in[id] = true, n++;
    }
    n = 0;
    for (uint32_t i = 0; i < D_FFN; i++)
        if (in[i]) ids[n++] = i;
    return n;
}

static void run_random(uint32_t window, uint32_t capacity, uint64_t seed) {
    const uint64_t rb = 37; /* odd on purpose: rows are not aligned */
    flm_ncache *c;
    flm_error err;
    assert_int_equal(flm_ncache_create(D_FFN, rb, capacity, window, MAX_SET, &c, &err), FLM_OK);
    assert_int_equal(flm_ncache_window(c), window == 0 ? 1 : window);
    ref_model ref;
    memset(&ref, 0, sizeof ref);
    ref.k = window == 0 ? 1 : window;
    ref.capacity = capacity;
    uint64_t rng = seed;
    uint32_t ids[MAX_SET];
    bool cached_before[D_FFN];
    uint64_t total_loaded = 0, total_evicted = 0, total_budget = 0;

    for (int t = 0; t < 400; t++) {
        if (t % 150 == 149) { /* a new sequence now and then */
            flm_ncache_reset(c);
            memset(ref.count, 0, sizeof ref.count);
            ref.n_sets = 0;
            assert_int_equal(flm_ncache_rows_used(c), 0);
            check_cache(c);
        }
        uint32_t n = random_set(&rng, MAX_SET, ids);
        for (uint32_t i = 0; i < D_FFN; i++) cached_before[i] = flm_ncache_row_of(c, i) >= 0;
        uint32_t rows_before = flm_ncache_rows_used(c), tokens_before = flm_ncache_window_tokens(c);

        flm_ncache_stats st;
        flm_status s = step_and_load(c, ids, n, &st, NULL);
        if (n > capacity) { /* refused, unchanged */
            assert_int_equal(s, FLM_ERR_BUDGET);
            assert_int_equal(flm_ncache_rows_used(c), rows_before);
            assert_int_equal(flm_ncache_window_tokens(c), tokens_before);
            for (uint32_t i = 0; i < D_FFN; i++) assert_int_equal(flm_ncache_row_of(c, i) >= 0, cached_before[i]);
            check_cache(c);
            total_budget++;
            continue;
        }
        assert_int_equal(s, FLM_OK);
        uint32_t evicted = ref_step(&ref, ids, n);

        uint32_t not_cached = 0, deleted = 0;
        for (uint32_t j = 0; j < n; j++) not_cached += !cached_before[ids[j]];
        for (uint32_t i = 0; i < D_FFN; i++) {
            bool now = flm_ncache_row_of(c, i) >= 0;
            assert_int_equal(now, ref.count[i] > 0);
            assert_int_equal(flm_ncache_refcount(c, i), ref.count[i]);
            deleted += cached_before[i] && !now;
        }
        assert_int_equal(st.n_active, n);
        assert_int_equal(st.n_loaded, not_cached);
        assert_int_equal(st.n_reused, n - not_cached);
        assert_int_equal(st.n_deleted, deleted);
        assert_true(st.n_moved <= st.n_deleted);
        assert_int_equal(st.n_evicted_tokens, evicted);
        assert_int_equal(st.rows_used, ref_union_size(&ref));
        assert_int_equal(st.rows_used, flm_ncache_rows_used(c));
        assert_true(st.rows_used <= flm_ncache_capacity(c));
        assert_int_equal(st.window_tokens, ref.n_sets);
        assert_int_equal(rows_before - deleted + st.n_loaded, st.rows_used);
        check_cache(c);
        total_loaded += st.n_loaded;
        total_evicted += evicted;
    }
    if (capacity < MAX_SET) assert_true(total_budget > 0);
    if (capacity < 100 && window >= 4) assert_true(total_evicted > 0); /* the tight configurations do evict */
    if (getenv("FLM_TEST_VERBOSE"))
        printf("k=%u capacity=%u: loaded %llu, early-evicted tokens %llu, refused %llu\n", window, capacity,
               (unsigned long long)total_loaded, (unsigned long long)total_evicted, (unsigned long long)total_budget);
    flm_ncache_free(c);
}

static void test_random_against_reference(void **state) {
    (void)state;
    const uint32_t windows[] = {0, 1, 2, 4, 8};
    const uint32_t capacities[] = {40, MAX_SET, 150, D_FFN, 1000 /* clamped to D_FFN */};
    uint64_t seed = 12345;
    for (size_t w = 0; w < sizeof windows / sizeof windows[0]; w++)
        for (size_t cap = 0; cap < sizeof capacities / sizeof capacities[0]; cap++)
            run_random(windows[w], capacities[cap] > D_FFN ? D_FFN : capacities[cap], seed++);
}

/* Larger windows load less per token: the point of Knowl 3 (on this random workload with hot neurons). */
static void test_window_reduces_loads(void **state) {
    (void)state;
    uint64_t loaded[3] = {0};
    const uint32_t windows[3] = {1, 4, 8};
    for (int w = 0; w < 3; w++) {
        flm_ncache *c;
        assert_int_equal(flm_ncache_create(D_FFN, 8, D_FFN, windows[w], MAX_SET, &c, NULL), FLM_OK);
        uint64_t rng = 777;
        uint32_t ids[MAX_SET];
        for (int t = 0; t < 300; t++) {
            uint32_t n = random_set(&rng, MAX_SET, ids);
            flm_ncache_stats st;
            assert_int_equal(step_and_load(c, ids, n, &st, NULL), FLM_OK);
            loaded[w] += st.n_loaded;
        }
        flm_ncache_free(c);
    }
    assert_true(loaded[1] < loaded[0]);
    assert_true(loaded[2] < loaded[1]);
}

/* ---------------------------------------------------------------------------------------------------------------
 * Capacity eviction, budget refusal, argument errors
 * ------------------------------------------------------------------------------------------------------------- */

static void assert_cached(const flm_ncache *c, const uint32_t *ids, size_t n, bool cached) {
    for (size_t j = 0; j < n; j++)
        if ((flm_ncache_row_of(c, ids[j]) >= 0) != cached)
            fail_msg("neuron %u should %sbe cached", ids[j], cached ? "" : "not ");
}

static void test_capacity_eviction(void **state) {
    (void)state;
    flm_ncache *c;
    flm_error err;
    assert_int_equal(flm_ncache_create(100, 16, 10, 4, 20, &c, &err), FLM_OK);
    flm_ncache_stats st;
    const uint32_t s1[] = {0, 1, 2}, s2[] = {3, 4, 5}, s3[] = {6, 7, 8}, s4[] = {9, 10};
    assert_int_equal(step_and_load(c, s1, 3, &st, NULL), FLM_OK);
    assert_int_equal(step_and_load(c, s2, 3, &st, NULL), FLM_OK);
    assert_int_equal(step_and_load(c, s3, 3, &st, NULL), FLM_OK);
    assert_int_equal(st.rows_used, 9);
    assert_int_equal(st.n_evicted_tokens, 0);

    /* 9 + 2 > 10: the oldest token (s1) is dropped early, nothing else. */
    assert_int_equal(step_and_load(c, s4, 2, &st, NULL), FLM_OK);
    assert_int_equal(st.n_evicted_tokens, 1);
    assert_int_equal(st.n_deleted, 3);
    assert_int_equal(st.n_loaded, 2);
    assert_int_equal(st.rows_used, 8);
    assert_int_equal(st.window_tokens, 3);
    assert_cached(c, s1, 3, false);
    assert_cached(c, s2, 3, true);
    assert_cached(c, s3, 3, true);
    assert_cached(c, s4, 2, true);
    check_cache(c);

    /* 8 + 5 > 10: s2 goes (3 stays: it is in s5), still 6 + 5 > 10: s3 goes too; 3 is reused, not read again. */
    const uint32_t s5[] = {3, 20, 21, 22, 23, 24};
    assert_int_equal(step_and_load(c, s5, 6, &st, NULL), FLM_OK);
    assert_int_equal(st.n_evicted_tokens, 2);
    assert_int_equal(st.n_reused, 1);
    assert_int_equal(st.n_loaded, 5);
    assert_int_equal(st.n_deleted, 5); /* 4, 5, 6, 7, 8 */
    assert_int_equal(st.rows_used, 8);
    assert_int_equal(st.window_tokens, 2);
    assert_cached(c, s4, 2, true);
    assert_cached(c, s5, 6, true);
    assert_cached(c, (const uint32_t[]){4, 5, 6, 7, 8}, 5, false);
    assert_int_equal(flm_ncache_refcount(c, 3), 1);
    check_cache(c);

    /* |S_t| = 11 > capacity 10: refused, nothing changes. */
    uint32_t big[11];
    for (uint32_t j = 0; j < 11; j++) big[j] = 50 + j;
    const uint32_t *load_ids = (const uint32_t *)1;
    err.code = FLM_OK;
    assert_int_equal(flm_ncache_step(c, big, 11, &st, &load_ids, NULL, NULL, &err), FLM_ERR_BUDGET);
    assert_int_equal(err.code, FLM_ERR_BUDGET);
    assert_non_null(strstr(err.msg, "11 neurons"));
    assert_non_null(strstr(err.msg, "10 rows"));
    assert_null(load_ids);
    assert_int_equal(flm_ncache_rows_used(c), 8);
    assert_int_equal(flm_ncache_window_tokens(c), 2);
    check_cache(c);

    /* Exactly capacity: fits, by evicting the whole window. */
    assert_int_equal(step_and_load(c, big, 10, &st, NULL), FLM_OK);
    assert_int_equal(st.n_evicted_tokens, 2);
    assert_int_equal(st.rows_used, 10);
    assert_int_equal(st.window_tokens, 1);
    check_cache(c);
    flm_ncache_free(c);
}

/* A step whose reads failed is undone: the neurons it appended are no longer cached (their rows were never filled),
 * those of the earlier sets stay, and the next step with the same set loads exactly the missing ones again. */
static void test_unstep_after_failed_read(void **state) {
    (void)state;
    flm_ncache *c;
    flm_error err;
    assert_int_equal(flm_ncache_create(64, 40, 16, 3, 0, &c, &err), FLM_OK);
    assert_false(flm_ncache_unstep(c)); /* empty window: nothing to undo */
    flm_ncache_stats st;
    const uint32_t a[] = {1, 5, 9}, b[] = {5, 9, 20, 30};
    assert_int_equal(step_and_load(c, a, 3, &st, NULL), FLM_OK);
    /* b's step: 20 and 30 are appended, but their reads "fail": rows left unfilled */
    const uint32_t *load_ids, *rows;
    uint8_t *const *load_rows;
    assert_int_equal(flm_ncache_step(c, b, 4, &st, &load_ids, &load_rows, &rows, &err), FLM_OK);
    assert_int_equal(st.n_loaded, 2);
    assert_true(flm_ncache_unstep(c));
    check_cache(c); /* consistent, and every occupied row holds its neuron's bytes */
    assert_cached(c, a, 3, true);
    assert_cached(c, (const uint32_t[]){20, 30}, 2, false);
    assert_int_equal(flm_ncache_window_tokens(c), 1);
    assert_int_equal(flm_ncache_refcount(c, 5), 1);
    /* the retry reads 20 and 30 again */
    assert_int_equal(step_and_load(c, b, 4, &st, NULL), FLM_OK);
    assert_int_equal(st.n_loaded, 2);
    assert_int_equal(st.n_reused, 2);
    check_cache(c);
    flm_ncache_free(c);
}

/* Speculative decoding: a batch's union entered the window as its newest set; trimming it to the accepted tokens'
 * neurons drops the others (unless an older set holds them), keeps the bytes of every remaining row, and the window
 * then ages as usual. */
static void test_trim_newest(void **state) {
    (void)state;
    flm_ncache *c;
    flm_error err;
    assert_int_equal(flm_ncache_create(64, 40, 32, 2, 0, &c, &err), FLM_OK);
    assert_int_equal(flm_ncache_trim_newest(c, NULL, 0, &err), FLM_ERR_ARG); /* nothing in the window */
    flm_ncache_stats st;
    const uint32_t a[] = {1, 5, 9}, u[] = {2, 5, 7, 9, 11, 40}, keep[] = {2, 9, 40};
    assert_int_equal(step_and_load(c, a, 3, &st, NULL), FLM_OK);
    assert_int_equal(step_and_load(c, u, 6, &st, NULL), FLM_OK);
    /* not a subset, not ascending: refused, nothing changes */
    assert_int_equal(flm_ncache_trim_newest(c, (const uint32_t[]){2, 3}, 2, &err), FLM_ERR_ARG);
    assert_int_equal(flm_ncache_trim_newest(c, (const uint32_t[]){9, 2}, 2, &err), FLM_ERR_ARG);
    assert_int_equal(flm_ncache_rows_used(c), 7);
    assert_int_equal(flm_ncache_trim_newest(c, keep, 3, &err), FLM_OK);
    check_cache(c);
    assert_cached(c, (const uint32_t[]){1, 2, 5, 9, 40}, 5, true); /* 5 stays: the older set holds it */
    assert_cached(c, (const uint32_t[]){7, 11}, 2, false);
    assert_int_equal(flm_ncache_refcount(c, 5), 1);
    assert_int_equal(flm_ncache_refcount(c, 9), 2);
    assert_int_equal(flm_ncache_rows_used(c), 5);
    /* the next token: a leaves the window (k = 2), the trimmed set stays */
    assert_int_equal(step_and_load(c, (const uint32_t[]){40, 41}, 2, &st, NULL), FLM_OK);
    check_cache(c);
    assert_cached(c, (const uint32_t[]){2, 9, 40, 41}, 4, true);
    assert_cached(c, (const uint32_t[]){1, 5}, 2, false);
    assert_int_equal(st.n_reused, 1);
    /* trimming to nothing empties the newest set */
    assert_int_equal(flm_ncache_trim_newest(c, NULL, 0, &err), FLM_OK);
    check_cache(c);
    assert_cached(c, (const uint32_t[]){2, 9, 40}, 3, true);
    assert_cached(c, (const uint32_t[]){41}, 1, false);
    flm_ncache_free(c);
}

static void test_bad_arguments(void **state) {
    (void)state;
    flm_ncache *c;
    flm_error err;
    assert_int_equal(flm_ncache_create(0, 16, 10, 4, 0, &c, &err), FLM_ERR_ARG);
    assert_null(c);
    assert_int_equal(flm_ncache_create(100, 0, 10, 4, 0, &c, &err), FLM_ERR_ARG);
    assert_int_equal(flm_ncache_create(100, 16, 0, 4, 0, &c, &err), FLM_ERR_ARG);
    assert_int_equal(flm_ncache_create(100, 16, 10, 4, 0, NULL, &err), FLM_ERR_ARG);
    assert_int_equal(flm_ncache_create(100, UINT64_MAX / 2, 10, 4, 0, &c, &err), FLM_ERR_ARG); /* overflows */

    assert_int_equal(flm_ncache_create(100, 16, 10, 2, 5, &c, &err), FLM_OK);
    const uint32_t ok[] = {1, 2}, dup[] = {1, 1}, desc[] = {5, 2}, range[] = {3, 100}, six[] = {1, 2, 3, 4, 5, 6};
    assert_int_equal(step_and_load(c, ok, 2, &(flm_ncache_stats){0}, NULL), FLM_OK);
    flm_ncache_stats st;
    assert_int_equal(flm_ncache_step(c, dup, 2, &st, NULL, NULL, NULL, &err), FLM_ERR_ARG);
    assert_non_null(strstr(err.msg, "ascending"));
    assert_int_equal(flm_ncache_step(c, desc, 2, &st, NULL, NULL, NULL, &err), FLM_ERR_ARG);
    assert_int_equal(flm_ncache_step(c, range, 2, &st, NULL, NULL, NULL, &err), FLM_ERR_ARG);
    assert_non_null(strstr(err.msg, "d_ffn"));
    assert_int_equal(flm_ncache_step(c, six, 6, &st, NULL, NULL, NULL, &err), FLM_ERR_ARG); /* > max_set */
    assert_int_equal(flm_ncache_step(c, NULL, 1, &st, NULL, NULL, NULL, &err), FLM_ERR_ARG);
    assert_int_equal(flm_ncache_step(NULL, ok, 2, &st, NULL, NULL, NULL, &err), FLM_ERR_ARG);
    /* failures changed nothing */
    assert_int_equal(flm_ncache_rows_used(c), 2);
    assert_int_equal(flm_ncache_window_tokens(c), 1);
    check_cache(c);
    /* an empty set is a token too: with k = 2 it pushes {1, 2} to the edge, the next one drops it */
    assert_int_equal(flm_ncache_step(c, NULL, 0, &st, NULL, NULL, NULL, &err), FLM_OK);
    assert_int_equal(st.rows_used, 2);
    assert_int_equal(flm_ncache_step(c, NULL, 0, &st, NULL, NULL, NULL, &err), FLM_OK);
    assert_int_equal(st.rows_used, 0);
    assert_int_equal(st.n_deleted, 2);
    check_cache(c);
    flm_ncache_free(c);
    flm_ncache_free(NULL);
}

/* ---------------------------------------------------------------------------------------------------------------
 * No window: the cache holds the current set only
 * ------------------------------------------------------------------------------------------------------------- */

static void test_window_one(void **state) {
    (void)state;
    for (uint32_t window = 0; window <= 1; window++) {
        flm_ncache *c;
        assert_int_equal(flm_ncache_create(D_FFN, 24, MAX_SET, window, MAX_SET, &c, NULL), FLM_OK);
        uint64_t rng = 99 + window;
        uint32_t ids[MAX_SET], prev[MAX_SET], n_prev = 0;
        for (int t = 0; t < 200; t++) {
            uint32_t n = random_set(&rng, MAX_SET, ids);
            uint32_t overlap = 0;
            for (uint32_t j = 0; j < n; j++)
                for (uint32_t q = 0; q < n_prev; q++) overlap += ids[j] == prev[q];
            flm_ncache_stats st;
            const uint32_t *rows;
            assert_int_equal(step_and_load(c, ids, n, &st, &rows), FLM_OK);
            assert_int_equal(st.rows_used, n);
            assert_int_equal(st.window_tokens, 1);
            assert_int_equal(st.n_evicted_tokens, 0);
            assert_int_equal(st.n_reused, overlap);      /* the overlap with the previous token stays */
            assert_int_equal(st.n_loaded, n - overlap);
            assert_int_equal(st.n_deleted, n_prev - overlap);
            for (uint32_t j = 0; j < n; j++) assert_int_equal(flm_ncache_refcount(c, ids[j]), 1);
            check_cache(c);
            memcpy(prev, ids, n * sizeof *ids);
            n_prev = n;
        }
        /* reset before every step: every neuron is read every token (predictor-only loading) */
        for (int t = 0; t < 20; t++) {
            uint32_t n = random_set(&rng, MAX_SET, ids);
            flm_ncache_reset(c);
            flm_ncache_stats st;
            assert_int_equal(step_and_load(c, ids, n, &st, NULL), FLM_OK);
            assert_int_equal(st.n_loaded, n);
            assert_int_equal(st.n_deleted, 0);
            check_cache(c);
        }
        flm_ncache_free(c);
    }
}

/* ---------------------------------------------------------------------------------------------------------------
 * Sizes, alignment, reset, swap-delete moves
 * ------------------------------------------------------------------------------------------------------------- */

static void test_sizes(void **state) {
    (void)state;
    /* 4 + 4 + 4 (+ one 4-byte ring length, and 4 per ring id) per the header's formula */
    uint64_t rb = 100, d = 1000, cap = 300, k = 4, ms = 200;
    uint64_t matrix = (cap * rb + FLM_NCACHE_ALIGN - 1) / FLM_NCACHE_ALIGN * FLM_NCACHE_ALIGN;
    uint64_t meta = 8 * d + 4 * cap + 4 * k * ms + 4 * k + 16 * ms;
    uint64_t b = flm_ncache_bytes((uint32_t)d, rb, (uint32_t)cap, (uint32_t)k, (uint32_t)ms);
    assert_true(b >= matrix + meta && b <= matrix + meta + 256); /* + the object */
    /* clamping: capacity > d_ffn is d_ffn; max_set 0 is d_ffn, and ring/outputs use min(max_set, capacity) */
    assert_int_equal(flm_ncache_bytes(50, 8, 500, 2, 0), flm_ncache_bytes(50, 8, 50, 2, 50));
    assert_int_equal(flm_ncache_bytes(50, 8, 20, 2, 0), flm_ncache_bytes(50, 8, 20, 2, 20));
    assert_int_equal(flm_ncache_bytes(50, 8, 20, 0, 10), flm_ncache_bytes(50, 8, 20, 1, 10));
    assert_int_equal(flm_ncache_bytes(0, 8, 20, 1, 10), UINT64_MAX);
    assert_int_equal(flm_ncache_bytes(50, 8, 0, 1, 10), UINT64_MAX);

    /* capacity_for inverts bytes */
    for (uint64_t budget = 0; budget < 200000; budget += 7919) {
        uint32_t c = flm_ncache_capacity_for(budget, (uint32_t)d, rb, (uint32_t)k, (uint32_t)ms);
        if (c > 0) assert_true(flm_ncache_bytes((uint32_t)d, rb, c, (uint32_t)k, (uint32_t)ms) <= budget);
        if (c < d) assert_true(flm_ncache_bytes((uint32_t)d, rb, c + 1, (uint32_t)k, (uint32_t)ms) > budget);
    }
    assert_int_equal(flm_ncache_capacity_for(UINT64_MAX - 1, (uint32_t)d, rb, 4, 0), d);
    assert_int_equal(flm_ncache_capacity_for(10, (uint32_t)d, rb, 4, 0), 0);

    flm_ncache *c;
    assert_int_equal(flm_ncache_create(50, 8, 500, 0, 0, &c, NULL), FLM_OK);
    assert_int_equal(flm_ncache_capacity(c), 50);
    assert_int_equal(flm_ncache_window(c), 1);
    assert_int_equal(flm_ncache_max_set(c), 50);
    assert_int_equal(flm_ncache_d_ffn(c), 50);
    assert_int_equal((uintptr_t)flm_ncache_matrix(c) % FLM_NCACHE_ALIGN, 0);
    assert_ptr_equal(flm_ncache_row_ptr(c, 3), flm_ncache_matrix(c) + 24);
    assert_null(flm_ncache_row_ptr(c, 50));
    assert_int_equal(flm_ncache_row_of(c, 50), -1);
    assert_int_equal(flm_ncache_neuron_of(c, 0), UINT32_MAX);
    flm_ncache_free(c);
}

/* Swap-delete: the last row moves into the hole with its bytes; loads of the same step are appended after. */
static void test_swap_delete(void **state) {
    (void)state;
    flm_ncache *c;
    assert_int_equal(flm_ncache_create(20, 64, 20, 2, 0, &c, NULL), FLM_OK);
    flm_ncache_stats st;
    const uint32_t a[] = {1, 2, 3, 4}, b[] = {4, 9}, d[] = {4, 9, 11};
    assert_int_equal(step_and_load(c, a, 4, &st, NULL), FLM_OK); /* rows: 1 2 3 4 */
    assert_int_equal(step_and_load(c, b, 2, &st, NULL), FLM_OK); /* rows: 1 2 3 4 9 */
    assert_int_equal(flm_ncache_row_of(c, 9), 4);
    /* a leaves: 1 2 3 deleted (4 stays, it is in b and d). Deleting 1 moves 9 into row 0, deleting 2 moves 4 into
     * row 1, deleting 3 (now last) moves nothing; then 11 is appended at row 2. */
    const uint32_t *rows;
    assert_int_equal(step_and_load(c, d, 3, &st, &rows), FLM_OK);
    assert_int_equal(st.n_deleted, 3);
    assert_int_equal(st.n_moved, 2);
    assert_int_equal(st.n_loaded, 1);
    assert_int_equal(st.rows_used, 3);
    assert_int_equal(flm_ncache_neuron_of(c, 0), 9);
    assert_int_equal(flm_ncache_neuron_of(c, 1), 4);
    assert_int_equal(flm_ncache_neuron_of(c, 2), 11);
    assert_int_equal(rows[0], 1);
    assert_int_equal(rows[1], 0);
    assert_int_equal(rows[2], 2);
    check_cache(c);
    flm_ncache_reset(c);
    assert_int_equal(flm_ncache_rows_used(c), 0);
    assert_int_equal(flm_ncache_window_tokens(c), 0);
    assert_int_equal(flm_ncache_refcount(c, 4), 0);
    check_cache(c);
    assert_int_equal(step_and_load(c, d, 3, &st, NULL), FLM_OK);
    assert_int_equal(st.n_loaded, 3);
    check_cache(c);
    flm_ncache_free(c);
}

/* ---------------------------------------------------------------------------------------------------------------
 * No allocation after create (by design: the step touches only preallocated arrays). Checked empirically with
 * glibc's allocator statistics where they are meaningful (not under AddressSanitizer, which replaces malloc).
 * ------------------------------------------------------------------------------------------------------------- */

static void test_no_allocation_in_step(void **state) {
    (void)state;
    flm_ncache *c;
    assert_int_equal(flm_ncache_create(D_FFN, 33, 100, 4, MAX_SET, &c, NULL), FLM_OK);
    uint64_t rng = 4242;
    uint32_t ids[MAX_SET];
    flm_ncache_stats st;
    const uint32_t *load_ids, *rows;
    uint8_t *const *load_rows;
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 33))
    struct mallinfo2 before = mallinfo2();
#endif
    for (int t = 0; t < 500; t++) {
        uint32_t n = random_set(&rng, MAX_SET, ids);
        flm_status s = flm_ncache_step(c, ids, n, &st, &load_ids, &load_rows, &rows, NULL);
        if (s != FLM_OK) fail_msg("step %d failed", t);
        for (uint32_t j = 0; j < st.n_loaded; j++) memset(load_rows[j], (int)load_ids[j], 33);
        if (t % 100 == 99) flm_ncache_reset(c);
    }
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 33))
    struct mallinfo2 after = mallinfo2();
    assert_int_equal(before.uordblks, after.uordblks);
    assert_int_equal(before.hblkhd, after.hblkhd);
#endif
    flm_ncache_free(c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_random_against_reference),
        cmocka_unit_test(test_window_reduces_loads),
        cmocka_unit_test(test_capacity_eviction),
        cmocka_unit_test(test_unstep_after_failed_read),
        cmocka_unit_test(test_trim_newest),
        cmocka_unit_test(test_bad_arguments),
        cmocka_unit_test(test_window_one),
        cmocka_unit_test(test_sizes),
        cmocka_unit_test(test_swap_delete),
        cmocka_unit_test(test_no_allocation_in_step),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
