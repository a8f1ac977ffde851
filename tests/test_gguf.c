/* test_gguf.c — GGUF reader and writer: the real stories260K model, a writer round trip, and malformed files made
 * from both (truncations, patched fields, random byte flips): each must fail cleanly with the right status and a
 * message naming the file. */
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "flashlm_tools.h"
#include "format/gguf.h"
#include "write/gguf_write.h"
#include "core/types.h"

#define MODEL "models/stories260K/stories260K.gguf"
#define MAXN 64
#define P63 ((uint64_t)1 << 63)

/* ---------------------------------------------------------------------------------------------------------------
 * A tiny independent GGUF walker, used to find the byte positions of fields to patch. It trusts its input: it only
 * ever walks files the test knows to be valid.
 * ------------------------------------------------------------------------------------------------------------- */
typedef struct layout {
    uint64_t n_t, n_kv;
    size_t kv_at[MAXN], kv_type_at[MAXN], kv_val_at[MAXN];
    char kv_key[MAXN][64];
    size_t t_at[MAXN], t_ndims_at[MAXN], t_type_at[MAXN], t_off_at[MAXN];
    char t_name[MAXN][64];
    uint32_t t_ndims[MAXN], t_type[MAXN];
    uint64_t t_ne[MAXN][4], t_off[MAXN], t_nbytes[MAXN];
    size_t infos_end, data_off, data_end; /* data_end: end of the last tensor's data */
} layout;

static uint64_t le(const uint8_t *p, size_t n) {
    uint64_t v = 0;
    for (size_t i = n; i-- > 0;) v = v << 8 | p[i];
    return v;
}

static void set_le(uint8_t *p, uint64_t v, size_t n) {
    for (size_t i = 0; i < n; i++, v >>= 8) p[i] = (uint8_t)v;
}

static size_t scalar_size(uint32_t t) {
    static const size_t sz[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    assert_true(t < 13 && sz[t] != 0);
    return sz[t];
}

static size_t skip_value(const uint8_t *d, size_t p, uint32_t t) {
    if (t == GGUF_VT_STRING) return p + 8 + le(d + p, 8);
    if (t != GGUF_VT_ARRAY) return p + scalar_size(t);
    uint32_t et = (uint32_t)le(d + p, 4);
    uint64_t n = le(d + p + 4, 8);
    p += 12;
    for (uint64_t i = 0; i < n; i++) p = skip_value(d, p, et);
    return p;
}

static void walk(const uint8_t *d, size_t len, layout *L) {
    memset(L, 0, sizeof *L);
    assert_true(len >= 24 && memcmp(d, "GGUF", 4) == 0);
    L->n_t = le(d + 8, 8);
    L->n_kv = le(d + 16, 8);
    assert_true(L->n_t <= MAXN && L->n_kv <= MAXN);
    size_t p = 24;
    for (uint64_t i = 0; i < L->n_kv; i++) {
        L->kv_at[i] = p;
        size_t kl = (size_t)le(d + p, 8);
        snprintf(L->kv_key[i], sizeof L->kv_key[i], "%.*s", (int)kl, (const char *)d + p + 8);
        p += 8 + kl;
        L->kv_type_at[i] = p;
        L->kv_val_at[i] = p + 4;
        p = skip_value(d, p + 4, (uint32_t)le(d + p, 4));
    }
    for (uint64_t i = 0; i < L->n_t; i++) {
        L->t_at[i] = p;
        size_t nl = (size_t)le(d + p, 8);
        snprintf(L->t_name[i], sizeof L->t_name[i], "%.*s", (int)nl, (const char *)d + p + 8);
        p += 8 + nl;
        L->t_ndims_at[i] = p;
        L->t_ndims[i] = (uint32_t)le(d + p, 4);
        p += 4;
        uint64_t n = 1;
        for (uint32_t k = 0; k < L->t_ndims[i]; k++, p += 8) n *= (L->t_ne[i][k] = le(d + p, 8));
        L->t_type_at[i] = p;
        L->t_type[i] = (uint32_t)le(d + p, 4);
        L->t_off_at[i] = p + 4;
        L->t_off[i] = le(d + p + 4, 8);
        L->t_nbytes[i] = flm_row_bytes(L->t_type[i], L->t_ne[i][0]) * (n / L->t_ne[i][0]);
        p += 12;
    }
    L->infos_end = p;
    L->data_off = (p + 31) / 32 * 32; /* the files walked here have no general.alignment */
    for (uint64_t i = 0; i < L->n_t; i++) {
        size_t end = L->data_off + (size_t)(L->t_off[i] + L->t_nbytes[i]);
        if (end > L->data_end) L->data_end = end;
    }
    assert_true(L->data_end <= len);
}

static int find_tensor_idx(const layout *L, const char *name) {
    for (uint64_t i = 0; i < L->n_t; i++)
        if (strcmp(L->t_name[i], name) == 0) return (int)i;
    fail_msg("tensor %s not found by the walker", name);
    return -1;
}

static int find_kv_idx(const layout *L, const char *key) {
    for (uint64_t i = 0; i < L->n_kv; i++)
        if (strcmp(L->kv_key[i], key) == 0) return (int)i;
    fail_msg("kv %s not found by the walker", key);
    return -1;
}

/* ---------------------------------------------------------------------------------------------------------------
 * Helpers
 * ------------------------------------------------------------------------------------------------------------- */

/* Write data to a fresh tmp file and check that flm_gguf_open fails with want, a message naming the file and containing
 * needle (when non-NULL). */
static void expect_fail(const char *tag, const uint8_t *data, size_t len, flm_status want, const char *needle) {
    char path[4096];
    snprintf(path, sizeof path, "%s", tu_tmp(tag, ".gguf"));
    tu_write_file(path, data, len);
    flm_gguf_file dummy, *f = &dummy; /* must be reset to NULL */
    flm_error err = {0};
    flm_status st = flm_gguf_open(path, &f, &err);
    print_message("    %-18s %s\n", tag, err.msg);
    if (st != want) fail_msg("%s: status %d, want %d: %s", tag, st, want, err.msg);
    assert_null(f);
    assert_int_equal(err.code, want);
    if (!strstr(err.msg, path)) fail_msg("%s: message does not name the file: %s", tag, err.msg);
    if (needle && !strstr(err.msg, needle)) fail_msg("%s: message lacks '%s': %s", tag, needle, err.msg);
    unlink(path);
}

/* A copy of src with n bytes at off replaced by the little-endian v. */
static uint8_t *copy(const uint8_t *src, size_t len) {
    uint8_t *d = malloc(len);
    assert_non_null(d);
    memcpy(d, src, len);
    return d;
}

static uint8_t *patched(const uint8_t *src, size_t len, size_t off, uint64_t v, size_t n) {
    uint8_t *d = copy(src, len);
    assert_true(off + n <= len);
    set_le(d + off, v, n);
    return d;
}

static void expect_patch_fail(const char *tag, const uint8_t *src, size_t len, size_t off, uint64_t v, size_t n,
                              flm_status want, const char *needle) {
    uint8_t *d = patched(src, len, off, v, n);
    expect_fail(tag, d, len, want, needle);
    free(d);
}

static flm_gguf_file *open_ok(const char *path) {
    flm_gguf_file *f = NULL;
    flm_error err = {0};
    flm_status st = flm_gguf_open(path, &f, &err);
    if (st != FLM_OK) fail_msg("flm_gguf_open(%s): %s", path, err.msg);
    assert_non_null(f);
    return f;
}

/* ---------------------------------------------------------------------------------------------------------------
 * 1. The real model
 * ------------------------------------------------------------------------------------------------------------- */
static void test_real_model(void **state) {
    (void)state;
    char path[4096];
    snprintf(path, sizeof path, "%s", tu_data(MODEL));
    size_t len;
    uint8_t *bytes = tu_read_file(path, &len);
    static layout L;
    walk(bytes, len, &L);

    flm_gguf_file *f = open_ok(path);
    flm_error err = {0};
    assert_int_equal(f->version, 3);
    assert_int_equal(f->n_tensors, 48);
    assert_int_equal(f->n_kv, L.n_kv);
    assert_int_equal(f->size, len);
    assert_int_equal(f->alignment, 32);
    assert_int_equal(f->data_offset, L.data_off);
    assert_string_equal(f->path, path);

    char *arch = NULL;
    assert_int_equal(flm_gguf_get_str(f, "general.architecture", true, &arch, &err), FLM_OK);
    assert_string_equal(arch, "llama");
    free(arch);
    struct { const char *key; uint32_t want; } u32s[] = {
        {"llama.embedding_length", 64}, {"llama.block_count", 5}, {"llama.feed_forward_length", 172},
        {"llama.attention.head_count", 8}, {"llama.attention.head_count_kv", 4}, {"llama.context_length", 2048},
        {"tokenizer.ggml.seperator_token_id", UINT32_MAX},
    };
    for (size_t i = 0; i < sizeof u32s / sizeof u32s[0]; i++) {
        uint32_t v = 0;
        assert_int_equal(flm_gguf_get_u32(f, u32s[i].key, true, &v, &err), FLM_OK);
        assert_int_equal(v, u32s[i].want);
    }
    float eps = 0;
    assert_int_equal(flm_gguf_get_f32(f, "llama.attention.layer_norm_rms_epsilon", true, &eps, &err), FLM_OK);
    assert_true(eps > 0.99e-5f && eps < 1.01e-5f);
    float fl = 0;
    assert_int_equal(flm_gguf_get_f32(f, "llama.block_count", true, &fl, &err), FLM_OK); /* integers accepted */
    assert_true(fl == 5.0f);

    const flm_gguf_kv *tok = NULL;
    assert_int_equal(flm_gguf_get_arr(f, "tokenizer.ggml.tokens", GGUF_VT_STRING, true, &tok, &err), FLM_OK);
    assert_int_equal(tok->arr_n, 512);
    assert_non_null(tok->arr_str);
    assert_int_equal(tok->arr_str[0].len, 5);
    assert_memory_equal(tok->arr_str[0].data, "<unk>", 5);
    assert_memory_equal(tok->arr_str[1].data, "<s>", 3);
    const flm_gguf_kv *scores = NULL;
    assert_int_equal(flm_gguf_get_arr(f, "tokenizer.ggml.scores", GGUF_VT_FLOAT32, true, &scores, &err), FLM_OK);
    assert_int_equal(scores->arr_n, 512);
    assert_true(scores->arr_data > f->map && scores->arr_data + 4 * 512 <= f->map + f->size);

    /* absent keys: optional leaves *out alone, required names the key */
    uint32_t keep = 12345;
    assert_int_equal(flm_gguf_get_u32(f, "llama.nonexistent", false, &keep, &err), FLM_OK);
    assert_int_equal(keep, 12345);
    assert_int_equal(flm_gguf_get_u32(f, "llama.nonexistent", true, &keep, &err), FLM_ERR_FORMAT);
    assert_int_equal(err.code, FLM_ERR_FORMAT);
    assert_non_null(strstr(err.msg, "llama.nonexistent"));
    assert_non_null(strstr(err.msg, path));
    assert_int_equal(keep, 12345);
    static const flm_gguf_kv sentinel;
    const flm_gguf_kv *none = &sentinel;
    assert_int_equal(flm_gguf_get_arr(f, "nope", GGUF_VT_UINT8, false, &none, &err), FLM_OK);
    assert_ptr_equal(none, &sentinel);

    /* type mismatches */
    assert_int_equal(flm_gguf_get_u32(f, "general.architecture", true, &keep, &err), FLM_ERR_FORMAT);
    assert_non_null(strstr(err.msg, "general.architecture"));
    assert_int_equal(flm_gguf_get_u32(f, "llama.attention.layer_norm_rms_epsilon", true, &keep, &err), FLM_ERR_FORMAT);
    char *s = NULL;
    assert_int_equal(flm_gguf_get_str(f, "llama.block_count", true, &s, &err), FLM_ERR_FORMAT);
    assert_null(s);
    assert_int_equal(flm_gguf_get_f32(f, "tokenizer.ggml.tokens", true, &fl, &err), FLM_ERR_FORMAT);
    assert_int_equal(flm_gguf_get_arr(f, "tokenizer.ggml.tokens", GGUF_VT_FLOAT32, true, &tok, &err), FLM_ERR_FORMAT);
    assert_non_null(strstr(err.msg, "array of string"));
    assert_int_equal(flm_gguf_get_arr(f, "llama.block_count", GGUF_VT_UINT32, true, &tok, &err), FLM_ERR_FORMAT);

    /* tensors: every one matches the walker and the file bytes */
    const flm_gguf_tensor *te = flm_gguf_find_tensor(f, "token_embd.weight");
    assert_non_null(te);
    assert_int_equal(te->n_dims, 2);
    assert_int_equal(te->ne[0], 64);
    assert_int_equal(te->ne[1], 512);
    assert_int_equal(te->ne[2], 1);
    assert_int_equal(te->ne[3], 1);
    assert_int_equal(te->type, FLM_TYPE_F32);
    assert_int_equal(te->n_elements, 64 * 512);
    assert_int_equal(te->nbytes, 64 * 512 * 4);
    assert_true(te->data >= f->map + f->data_offset && te->data + te->nbytes <= f->map + f->size);
    assert_null(flm_gguf_find_tensor(f, "nope"));
    assert_non_null(flm_gguf_find_kv(f, "general.name"));
    assert_null(flm_gguf_find_kv(f, "general.nam"));
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const flm_gguf_tensor *t = &f->tensors[i];
        assert_string_equal(t->name, L.t_name[i]);
        assert_int_equal(t->type, L.t_type[i]);
        assert_int_equal(t->offset, L.t_off[i]);
        assert_int_equal(t->nbytes, L.t_nbytes[i]);
        assert_int_equal(t->offset % f->alignment, 0);
        assert_ptr_equal(t->data, f->map + f->data_offset + t->offset);
        assert_memory_equal(t->data, bytes + L.data_off + L.t_off[i], (size_t)t->nbytes);
    }
    flm_gguf_close(f);
    flm_gguf_close(NULL);
    free(bytes);
}

/* The real model from memory, and copied whole through the writer: the copy is byte-identical (same KV order, tensor
 * order, alignment 32 and packing). */
static void test_buffer_and_copy(void **state) {
    (void)state;
    size_t len;
    uint8_t *bytes = tu_read_file(tu_data(MODEL), &len);
    flm_gguf_file *f = NULL;
    flm_error err = {0};
    assert_int_equal(flm_gguf_open_buffer("model (in memory)", bytes, len, &f, &err), FLM_OK);
    assert_ptr_equal(f->map, bytes);
    assert_int_equal(f->n_tensors, 48);
    assert_string_equal(f->path, "model (in memory)");
    const flm_gguf_tensor *t = flm_gguf_find_tensor(f, "output.weight");
    assert_non_null(t);
    assert_true(t->data > bytes && t->data + t->nbytes <= bytes + len);

    char path[4096];
    snprintf(path, sizeof path, "%s", tu_tmp("copy", ".gguf"));
    flm_gguf_writer *w = NULL;
    assert_int_equal(flm_gguf_writer_create(path, FLM_OUT_REPLACE, &w, &err), FLM_OK);
    for (uint64_t i = 0; i < f->n_kv; i++) assert_int_equal(flm_gguf_writer_kv_copy(w, &f->kv[i]), FLM_OK);
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        t = &f->tensors[i];
        assert_int_equal(flm_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne), FLM_OK);
    }
    assert_int_equal(flm_gguf_writer_begin(w, &err), FLM_OK);
    for (uint64_t i = 0; i < f->n_tensors; i++)
        assert_int_equal(flm_gguf_writer_write_tensor(w, f->tensors[i].data, f->tensors[i].nbytes, &err), FLM_OK);
    assert_int_equal(flm_gguf_writer_finish(w, &err), FLM_OK);
    flm_gguf_writer_free(w);
    flm_gguf_close(f); /* the borrowed buffer stays ours */
    size_t clen;
    uint8_t *copy_bytes = tu_read_file(path, &clen);
    assert_int_equal(clen, len);
    assert_memory_equal(copy_bytes, bytes, len);
    free(copy_bytes);
    unlink(path);

    f = NULL;
    assert_int_equal(flm_gguf_open_buffer("model (in memory)", bytes, len - 1, &f, &err), FLM_ERR_FORMAT);
    assert_null(f);
    assert_non_null(strstr(err.msg, "model (in memory): tensor 47"));
    assert_int_equal(flm_gguf_open_buffer("nothing", NULL, 0, &f, &err), FLM_ERR_FORMAT);
    assert_non_null(strstr(err.msg, "nothing: header: magic: truncated"));

    /* a prefix of the image: tensors wholly inside get their data, the others NULL; checked against the whole */
    assert_int_equal(flm_gguf_open_buffer("model (in memory)", bytes, len, &f, &err), FLM_OK);
    const flm_gguf_tensor *last = &f->tensors[0];
    for (uint64_t i = 1; i < f->n_tensors; i++)
        if (f->tensors[i].offset > last->offset) last = &f->tensors[i];
    const size_t cut = (size_t)(f->data_offset + last->offset + 1), header = (size_t)f->data_offset;
    char last_name[128];
    snprintf(last_name, sizeof last_name, "%s", last->name);
    flm_gguf_close(f);
    assert_int_equal(flm_gguf_open_buffer_partial("prefix", bytes, cut, len, &f, &err), FLM_OK);
    assert_int_equal(f->size, cut);
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        t = &f->tensors[i];
        if (!strcmp(t->name, last_name)) assert_null(t->data);
        else assert_ptr_equal(t->data, bytes + f->data_offset + t->offset);
    }
    flm_gguf_close(f);
    assert_int_equal(flm_gguf_open_buffer_partial("prefix", bytes, header, len, &f, &err), FLM_OK); /* no data */
    for (uint64_t i = 0; i < f->n_tensors; i++) assert_null(f->tensors[i].data);
    flm_gguf_close(f);
    f = NULL;
    assert_int_equal(flm_gguf_open_buffer_partial("prefix", bytes, 100, len, &f, &err), FLM_ERR_FORMAT);
    assert_non_null(strstr(err.msg, "prefix: header: tensor count 48 is impossible")); /* the header must be there */
    assert_int_equal(flm_gguf_open_buffer_partial("prefix", bytes, cut, len - 1, &f, &err), FLM_ERR_FORMAT);
    assert_non_null(strstr(err.msg, "runs past the end of the file"));
    assert_int_equal(flm_gguf_open_buffer_partial("prefix", bytes, cut, cut - 1, &f, &err), FLM_ERR_ARG);
    assert_null(f);
    free(bytes);
}

/* ---------------------------------------------------------------------------------------------------------------
 * 2. Writer round trip
 * ------------------------------------------------------------------------------------------------------------- */
#define N_WT 6
static const struct { const char *name; uint32_t type, n_dims; uint64_t ne[4]; } wt[N_WT] = {
    {"f32.weight", FLM_TYPE_F32, 2, {7, 3}},          /* 84 bytes: data padded */
    {"f16.weight", FLM_TYPE_F16, 1, {33}},
    {"bf16.weight", FLM_TYPE_BF16, 3, {16, 2, 3}},
    {"q8_0.weight", FLM_TYPE_Q8_0, 2, {64, 3}},
    {"q4_0.weight", FLM_TYPE_Q4_0, 4, {96, 2, 1, 2}},
    {"tail.weight", FLM_TYPE_F32, 1, {1}},
};

static uint64_t wt_nbytes(int i) {
    uint64_t rows = 1;
    for (uint32_t d = 1; d < wt[i].n_dims; d++) rows *= wt[i].ne[d];
    return flm_row_bytes(wt[i].type, wt[i].ne[0]) * rows;
}

static const uint8_t a_u8[] = {0, 1, 255};
static const int8_t a_i8[] = {-128, 0, 127};
static const uint16_t a_u16[] = {0, 65535, 1234};
static const int16_t a_i16[] = {-32768, 32767, -1};
static const uint32_t a_u32[] = {0, 4294967295u, 7};
static const int32_t a_i32[] = {INT32_MIN, -1, INT32_MAX, 42};
static const float a_f32[] = {-1.5f, 0.0f, 3.25e-7f, 1e30f};
static const uint64_t a_u64[] = {UINT64_MAX, 0};
static const int64_t a_i64[] = {INT64_MIN, -2, INT64_MAX};
static const double a_f64[] = {3.141592653589793, -2.5e-300};
static const uint8_t a_bool[] = {0, 1, 1, 0};
static const char *const a_str[] = {"", "hello", "wörld", "<0x0A>"};

/* Write the round-trip file; data[i] gets the random tensor bytes (caller frees). */
static void write_sample(const char *path, uint8_t *data[N_WT]) {
    flm_gguf_writer *w = NULL;
    flm_error err = {0};
    assert_int_equal(flm_gguf_writer_create(path, FLM_OUT_REPLACE, &w, &err), FLM_OK);
    assert_int_equal(flm_gguf_writer_kv_str(w, "general.architecture", "llama"), FLM_OK);
    assert_int_equal(flm_gguf_writer_kv_u32(w, "llama.block_count", 3), FLM_OK);
    assert_int_equal(flm_gguf_writer_kv_u32(w, "general.alignment", 32), FLM_OK);
    assert_int_equal(flm_gguf_writer_kv_f32(w, "llama.eps", 1e-6f), FLM_OK);
    assert_int_equal(flm_gguf_writer_kv_str(w, "general.empty", ""), FLM_OK);
#define ARR(key, vt, a) assert_int_equal(flm_gguf_writer_kv_arr(w, key, vt, a, sizeof a / sizeof a[0]), FLM_OK)
    ARR("a.u8", GGUF_VT_UINT8, a_u8);
    ARR("a.i8", GGUF_VT_INT8, a_i8);
    ARR("a.u16", GGUF_VT_UINT16, a_u16);
    ARR("a.i16", GGUF_VT_INT16, a_i16);
    ARR("a.u32", GGUF_VT_UINT32, a_u32);
    ARR("a.i32", GGUF_VT_INT32, a_i32);
    ARR("a.f32", GGUF_VT_FLOAT32, a_f32);
    ARR("a.u64", GGUF_VT_UINT64, a_u64);
    ARR("a.i64", GGUF_VT_INT64, a_i64);
    ARR("a.f64", GGUF_VT_FLOAT64, a_f64);
    ARR("a.bool", GGUF_VT_BOOL, a_bool);
    ARR("a.str", GGUF_VT_STRING, a_str);
#undef ARR
    assert_int_equal(flm_gguf_writer_kv_arr(w, "a.empty", GGUF_VT_INT32, NULL, 0), FLM_OK);
    for (int i = 0; i < N_WT; i++)
        assert_int_equal(flm_gguf_writer_add_tensor(w, wt[i].name, wt[i].type, wt[i].n_dims, wt[i].ne), FLM_OK);
    assert_int_equal(flm_gguf_writer_begin(w, &err), FLM_OK);
    uint64_t rng = 0x1234567;
    for (int i = 0; i < N_WT; i++) {
        size_t n = (size_t)wt_nbytes(i);
        data[i] = malloc(n);
        assert_non_null(data[i]);
        for (size_t k = 0; k < n; k++) data[i][k] = (uint8_t)tu_rand_u64(&rng);
        if (flm_gguf_writer_write_tensor(w, data[i], n, &err) != FLM_OK) fail_msg("%s", err.msg);
    }
    if (flm_gguf_writer_finish(w, &err) != FLM_OK) fail_msg("%s", err.msg);
    flm_gguf_writer_free(w);
}

static const flm_gguf_kv *arr(flm_gguf_file *f, const char *key, uint32_t vt, uint64_t n) {
    const flm_gguf_kv *kv = NULL;
    flm_error err = {0};
    if (flm_gguf_get_arr(f, key, vt, true, &kv, &err) != FLM_OK) fail_msg("%s", err.msg);
    assert_int_equal(kv->arr_n, n);
    return kv;
}

static void test_writer_round_trip(void **state) {
    (void)state;
    char path[4096];
    snprintf(path, sizeof path, "%s", tu_tmp("rt", ".gguf"));
    uint8_t *data[N_WT];
    write_sample(path, data);
    assert_false(tu_temp_left(path)); /* renamed away, the lock removed */

    flm_gguf_file *f = open_ok(path);
    flm_error err = {0};
    assert_int_equal(f->version, 3);
    assert_int_equal(f->n_kv, 18);
    assert_int_equal(f->n_tensors, N_WT);
    assert_int_equal(f->alignment, 32);
    assert_int_equal(f->size % 32, 0);
    char *s = NULL;
    assert_int_equal(flm_gguf_get_str(f, "general.architecture", true, &s, &err), FLM_OK);
    assert_string_equal(s, "llama");
    free(s);
    assert_int_equal(flm_gguf_get_str(f, "general.empty", true, &s, &err), FLM_OK);
    assert_string_equal(s, "");
    free(s);
    uint32_t u = 0;
    assert_int_equal(flm_gguf_get_u32(f, "llama.block_count", true, &u, &err), FLM_OK);
    assert_int_equal(u, 3);
    float fv = 0;
    assert_int_equal(flm_gguf_get_f32(f, "llama.eps", true, &fv, &err), FLM_OK);
    assert_true(fv == 1e-6f);

#define CHECK_ARR(key, vt, a) assert_memory_equal(arr(f, key, vt, sizeof a / sizeof a[0])->arr_data, a, sizeof a)
    CHECK_ARR("a.u8", GGUF_VT_UINT8, a_u8); /* a little-endian host: raw elements equal the C arrays */
    CHECK_ARR("a.i8", GGUF_VT_INT8, a_i8);
    CHECK_ARR("a.u16", GGUF_VT_UINT16, a_u16);
    CHECK_ARR("a.i16", GGUF_VT_INT16, a_i16);
    CHECK_ARR("a.u32", GGUF_VT_UINT32, a_u32);
    CHECK_ARR("a.i32", GGUF_VT_INT32, a_i32);
    CHECK_ARR("a.f32", GGUF_VT_FLOAT32, a_f32);
    CHECK_ARR("a.u64", GGUF_VT_UINT64, a_u64);
    CHECK_ARR("a.i64", GGUF_VT_INT64, a_i64);
    CHECK_ARR("a.f64", GGUF_VT_FLOAT64, a_f64);
    CHECK_ARR("a.bool", GGUF_VT_BOOL, a_bool);
#undef CHECK_ARR
    const flm_gguf_kv *sa = arr(f, "a.str", GGUF_VT_STRING, 4);
    for (int i = 0; i < 4; i++) {
        assert_int_equal(sa->arr_str[i].len, strlen(a_str[i]));
        assert_memory_equal(sa->arr_str[i].data, a_str[i], strlen(a_str[i]));
    }
    arr(f, "a.empty", GGUF_VT_INT32, 0);

    for (int i = 0; i < N_WT; i++) {
        const flm_gguf_tensor *t = flm_gguf_find_tensor(f, wt[i].name);
        assert_non_null(t);
        assert_ptr_equal(t, &f->tensors[i]); /* order kept */
        assert_int_equal(t->type, wt[i].type);
        assert_int_equal(t->n_dims, wt[i].n_dims);
        for (uint32_t d = 0; d < 4; d++) assert_int_equal(t->ne[d], d < wt[i].n_dims ? wt[i].ne[d] : 1);
        assert_int_equal(t->nbytes, wt_nbytes(i));
        assert_int_equal((size_t)(t->data - f->map) % 32, 0);
        assert_memory_equal(t->data, data[i], (size_t)t->nbytes);
        free(data[i]);
    }
    flm_gguf_close(f);

    /* the independent walker agrees with the reader on the layout */
    size_t len;
    uint8_t *bytes = tu_read_file(path, &len);
    static layout L;
    walk(bytes, len, &L);
    assert_int_equal(L.n_t, N_WT);
    assert_int_equal((L.data_end + 31) / 32 * 32, len); /* the last tensor is padded too */
    free(bytes);
    unlink(path);
}

static void test_writer_empty(void **state) {
    (void)state;
    char path[4096];
    snprintf(path, sizeof path, "%s", tu_tmp("empty", ".gguf"));
    flm_gguf_writer *w = NULL;
    flm_error err = {0};
    assert_int_equal(flm_gguf_writer_create(path, FLM_OUT_REPLACE, &w, &err), FLM_OK);
    assert_int_equal(flm_gguf_writer_begin(w, &err), FLM_OK);
    assert_int_equal(flm_gguf_writer_finish(w, &err), FLM_OK);
    flm_gguf_writer_free(w);
    flm_gguf_file *f = open_ok(path);
    assert_int_equal(f->n_kv, 0);
    assert_int_equal(f->n_tensors, 0);
    assert_null(flm_gguf_find_kv(f, "x"));
    assert_null(flm_gguf_find_tensor(f, "x"));
    flm_gguf_close(f);
    unlink(path);
}

/* Writer misuse: each error is reported, and neither the file nor the temporary file is left behind. */
typedef enum { M_NBYTES, M_MISSING, M_EXTRA, M_TYPE, M_BLOCK, M_DUP_KEY, M_DUP_TENSOR, M_BOOL, M_ALIGN, M_FREE } misuse;

static void test_writer_errors(void **state) {
    (void)state;
    static const uint64_t ne[2] = {32, 2};
    static const uint64_t ne_bad[1] = {33};
    static const uint8_t two[1] = {2};
    uint8_t buf[256] = {0};
    for (int m = M_NBYTES; m <= M_FREE; m++) {
        char path[4096];
        snprintf(path, sizeof path, "%s", tu_tmp("werr", ".gguf"));
        flm_gguf_writer *w = NULL;
        flm_error err = {0};
        assert_int_equal(flm_gguf_writer_create(path, FLM_OUT_REPLACE, &w, &err), FLM_OK);
        assert_true(tu_temp_left(path)); /* the writer's unique temporary and lock */
        flm_gguf_writer_kv_u32(w, "k", 1);
        flm_gguf_writer_add_tensor(w, "t", FLM_TYPE_F32, 2, ne);
        flm_status want = FLM_ERR_ARG, st = FLM_OK;
        switch (m) {
        case M_TYPE: st = flm_gguf_writer_add_tensor(w, "u", 99, 2, ne), want = FLM_ERR_UNSUPPORTED; break;
        case M_BLOCK: st = flm_gguf_writer_add_tensor(w, "u", FLM_TYPE_Q8_0, 1, ne_bad); break;
        case M_DUP_KEY: st = flm_gguf_writer_kv_str(w, "k", "x"); break;
        case M_DUP_TENSOR: st = flm_gguf_writer_add_tensor(w, "t", FLM_TYPE_F16, 2, ne); break;
        case M_BOOL: st = flm_gguf_writer_kv_arr(w, "b", GGUF_VT_BOOL, two, 1); break;
        case M_ALIGN: st = flm_gguf_writer_kv_u32(w, "general.alignment", 64); break;
        default: break;
        }
        if (m >= M_TYPE && m <= M_ALIGN) {
            assert_int_equal(st, want);
            st = flm_gguf_writer_begin(w, &err); /* the deferred error surfaces here */
        } else if (m != M_FREE) {
            assert_int_equal(flm_gguf_writer_begin(w, &err), FLM_OK);
            if (m == M_NBYTES) {
                st = flm_gguf_writer_write_tensor(w, buf, 255, &err);
            } else {
                if (m == M_EXTRA) assert_int_equal(flm_gguf_writer_write_tensor(w, buf, 256, &err), FLM_OK);
                st = m == M_EXTRA ? flm_gguf_writer_write_tensor(w, buf, 256, &err) : flm_gguf_writer_finish(w, &err);
            }
        }
        if (m != M_FREE) {
            print_message("    misuse %d: %s\n", m, err.msg);
            assert_int_equal(st, want);
            assert_int_equal(err.code, want);
            assert_non_null(strstr(err.msg, path));
            assert_false(tu_temp_left(path));
            assert_int_not_equal(flm_gguf_writer_finish(w, &err), FLM_OK); /* stays failed */
        }
        flm_gguf_writer_free(w);
        assert_false(tu_temp_left(path));
        assert_int_not_equal(access(path, F_OK), 0);
    }
    flm_gguf_writer *w = NULL;
    flm_error err = {0};
    assert_int_equal(flm_gguf_writer_create("/nonexistent-dir/x.gguf", FLM_OUT_REPLACE, &w, &err), FLM_ERR_IO);
    assert_null(w);
    assert_non_null(strstr(err.msg, "/nonexistent-dir/x.gguf"));
    flm_gguf_writer_free(NULL);
}

/* ---------------------------------------------------------------------------------------------------------------
 * 3. Malformed files made from the real model
 * ------------------------------------------------------------------------------------------------------------- */
static void test_bad_real(void **state) {
    (void)state;
    size_t len;
    uint8_t *src = tu_read_file(tu_data(MODEL), &len);
    static layout L;
    walk(src, len, &L);
    assert_int_equal(L.data_end, len); /* the last tensor ends the file: every truncation cuts data */
    char msg[256];

    /* truncations */
    int last = find_tensor_idx(&L, "blk.4.ffn_norm.weight");
    size_t cuts[] = {0, 3, 4, 8, 20, 23, 24, 100, L.kv_at[L.n_kv / 2] + 5, L.kv_at[L.n_kv - 1] + 3,
                     L.t_at[L.n_t / 2] + 10, L.t_off_at[L.n_t - 1] + 4, L.infos_end, L.data_off - 1, L.data_off,
                     L.data_off + L.t_off[1] + 7, L.data_off + (size_t)L.t_off[last] + 100, len - 1};
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
        char tag[32];
        snprintf(tag, sizeof tag, "cut-%zu", cuts[i]);
        expect_fail(tag, src, cuts[i], FLM_ERR_FORMAT, cuts[i] < 24 ? "header: " : NULL);
    }
    snprintf(msg, sizeof msg, "data [%zu, %zu) runs past the end of the file (%zu bytes)",
             L.data_off + (size_t)L.t_off[last], len, len - 1);
    expect_fail("cut-last", src, len - 1, FLM_ERR_FORMAT, msg);

    /* header */
    expect_patch_fail("magic", src, len, 0, 'X', 1, FLM_ERR_FORMAT, "magic");
    expect_patch_fail("version1", src, len, 4, 1, 4, FLM_ERR_UNSUPPORTED, "version 1 ");
    expect_patch_fail("version99", src, len, 4, 99, 4, FLM_ERR_UNSUPPORTED, "version 99");
    expect_patch_fail("version-be", src, len, 4, 0x03000000, 4, FLM_ERR_UNSUPPORTED, "big-endian");
    snprintf(msg, sizeof msg, "header: tensor count 9223372036854775808 is impossible for a file of %zu bytes", len);
    expect_patch_fail("n_tensors", src, len, 8, P63, 8, FLM_ERR_FORMAT, msg);
    expect_patch_fail("n_tensors-max", src, len, 8, UINT64_MAX, 8, FLM_ERR_FORMAT, "impossible");
    expect_patch_fail("n_kv", src, len, 16, P63, 8, FLM_ERR_FORMAT, "kv count 9223372036854775808 is impossible");
    expect_patch_fail("n_kv-big", src, len, 16, (uint64_t)1 << 40, 8, FLM_ERR_FORMAT, "impossible");
    expect_patch_fail("n_kv-more", src, len, 16, L.n_kv + 1, 8, FLM_ERR_FORMAT, NULL); /* eats a tensor info */

    /* KVs (kv 0 is tokenizer.ggml.tokens, a string array) */
    assert_int_equal(L.kv_at[0], 24);
    assert_string_equal(L.kv_key[0], "tokenizer.ggml.tokens");
    expect_patch_fail("keylen", src, len, 24, P63, 8, FLM_ERR_FORMAT, "kv 0: key: string length 9223372036854775808");
    expect_patch_fail("keylen-0", src, len, 24, 0, 8, FLM_ERR_FORMAT, "kv 0: key: empty");
    expect_patch_fail("key-nul", src, len, 24 + 8 + 3, 0, 1, FLM_ERR_FORMAT, "NUL");
    expect_patch_fail("vtype", src, len, L.kv_type_at[0], 13, 4, FLM_ERR_FORMAT, "unknown value type 13");
    expect_patch_fail("elemtype", src, len, L.kv_val_at[0], 99, 4, FLM_ERR_FORMAT, "unknown value type 99");
    expect_patch_fail("nested", src, len, L.kv_val_at[0], GGUF_VT_ARRAY, 4, FLM_ERR_UNSUPPORTED, "nested");
    expect_patch_fail("arr-count", src, len, L.kv_val_at[0] + 4, P63, 8, FLM_ERR_FORMAT,
                      "'tokenizer.ggml.tokens': array count: 9223372036854775808 elements of string are impossible");
    expect_patch_fail("arr-strlen", src, len, L.kv_val_at[0] + 12, P63, 8, FLM_ERR_FORMAT, "element 0");
    int bc = find_kv_idx(&L, "llama.block_count");
    expect_patch_fail("bool", src, len, L.kv_type_at[bc], GGUF_VT_BOOL, 4, FLM_ERR_FORMAT, "bool value 5");
    int tm = find_kv_idx(&L, "tokenizer.ggml.model");
    {
        uint8_t *d = copy(src, len);
        memcpy(d + L.kv_at[tm] + 8, "general.architecture", 20); /* same length as the key it replaces */
        expect_fail("dup-key", d, len, FLM_ERR_FORMAT, "duplicate key 'general.architecture'");
        free(d);
    }

    /* tensor infos */
    int up = find_tensor_idx(&L, "blk.0.ffn_up.weight");
    uint64_t past = (len - L.data_off) / 32 * 32; /* aligned, inside nothing */
    snprintf(msg, sizeof msg, "tensor %d 'blk.0.ffn_up.weight': data [%zu, %zu) runs past the end of the file (%zu "
             "bytes)", up, L.data_off + (size_t)past - 32, L.data_off + (size_t)past - 32 + (size_t)L.t_nbytes[up],
             len);
    expect_patch_fail("offset", src, len, L.t_off_at[up], past - 32, 8, FLM_ERR_FORMAT, msg);
    expect_patch_fail("offset-huge", src, len, L.t_off_at[up], UINT64_MAX - 31, 8, FLM_ERR_FORMAT, "past the end");
    expect_patch_fail("offset-align", src, len, L.t_off_at[up], L.t_off[up] + 4, 8, FLM_ERR_FORMAT,
                      "not a multiple of the alignment 32");
    snprintf(msg, sizeof msg, "tensor %d 'blk.0.ffn_up.weight': type: tensor type 99 is not supported", up);
    expect_patch_fail("ttype", src, len, L.t_type_at[up], 99, 4, FLM_ERR_UNSUPPORTED, msg);
    /* a known id that cannot be a tensor's type (q8_k: activations only) is named in the message */
    expect_patch_fail("ttype-q8_k", src, len, L.t_type_at[up], FLM_TYPE_Q8_K, 4, FLM_ERR_UNSUPPORTED,
                      "tensor type 15 (q8_k) is not supported");
    expect_patch_fail("ttype-q4_k", src, len, L.t_type_at[up], FLM_TYPE_Q4_K, 4, FLM_ERR_FORMAT,
                      "not a multiple of the q4_k block size 256");
    int down = find_tensor_idx(&L, "blk.0.ffn_down.weight"); /* ne[0] = 172: not a multiple of 32 */
    expect_patch_fail("block", src, len, L.t_type_at[down], FLM_TYPE_Q8_0, 4, FLM_ERR_FORMAT, "block size 32");
    expect_patch_fail("ndims0", src, len, L.t_ndims_at[up], 0, 4, FLM_ERR_FORMAT, "n_dims");
    expect_patch_fail("ndims5", src, len, L.t_ndims_at[up], 5, 4, FLM_ERR_FORMAT, "n_dims");
    expect_patch_fail("ne0-zero", src, len, L.t_ndims_at[up] + 4, 0, 8, FLM_ERR_FORMAT, "ne[0]: zero");
    {
        uint8_t *d = patched(src, len, L.t_ndims_at[up] + 4, (uint64_t)1 << 32, 8);
        set_le(d + L.t_ndims_at[up] + 12, (uint64_t)1 << 33, 8);
        expect_fail("ne-overflow", d, len, FLM_ERR_FORMAT, "overflows");
        set_le(d + L.t_ndims_at[up] + 12, 1, 8);
        expect_fail("ne-big", d, len, FLM_ERR_FORMAT, "past the end");
        free(d);
    }
    expect_patch_fail("namelen", src, len, L.t_at[up], P63, 8, FLM_ERR_FORMAT, "name: string length");
    int q = find_tensor_idx(&L, "blk.0.attn_q.weight"), k = find_tensor_idx(&L, "blk.0.attn_k.weight");
    {
        uint8_t *d = copy(src, len);
        memcpy(d + L.t_at[k] + 8, "blk.0.attn_q.weight", 19);
        snprintf(msg, sizeof msg, "tensor %d and tensor %d: duplicate name 'blk.0.attn_q.weight'", q, k);
        expect_fail("dup-tensor", d, len, FLM_ERR_FORMAT, msg);
        free(d);
    }

    /* version 2 has the same layout: accepted */
    {
        uint8_t *d = patched(src, len, 4, 2, 4);
        char path[4096];
        snprintf(path, sizeof path, "%s", tu_tmp("v2", ".gguf"));
        tu_write_file(path, d, len);
        flm_gguf_file *f = open_ok(path);
        assert_int_equal(f->version, 2);
        flm_gguf_close(f);
        unlink(path);
        free(d);
    }

    /* not a file */
    flm_gguf_file *f = NULL;
    flm_error err = {0};
    assert_int_equal(flm_gguf_open("/nonexistent/m.gguf", &f, &err), FLM_ERR_IO);
    assert_null(f);
    assert_non_null(strstr(err.msg, "/nonexistent/m.gguf"));
    assert_int_equal(flm_gguf_open(FLM_TEST_TMPDIR, &f, &err), FLM_ERR_IO);
    assert_non_null(strstr(err.msg, FLM_TEST_TMPDIR));
    free(src);
}

/* Fields the real file lacks, patched into the writer's output: general.alignment and a bool array. */
static void test_bad_written(void **state) {
    (void)state;
    char path[4096];
    snprintf(path, sizeof path, "%s", tu_tmp("src", ".gguf"));
    uint8_t *data[N_WT];
    write_sample(path, data);
    for (int i = 0; i < N_WT; i++) free(data[i]);
    size_t len;
    uint8_t *src = tu_read_file(path, &len);
    unlink(path);
    static layout L;
    walk(src, len, &L);

    int al = find_kv_idx(&L, "general.alignment");
    expect_patch_fail("align-0", src, len, L.kv_val_at[al], 0, 4, FLM_ERR_FORMAT, "0 is not a nonzero power of two");
    expect_patch_fail("align-48", src, len, L.kv_val_at[al], 48, 4, FLM_ERR_FORMAT, "48 is not");
    /* the f32 tensor is 84 bytes, so the next one sits at 96: not a multiple of 64 */
    expect_patch_fail("align-64", src, len, L.kv_val_at[al], 64, 4, FLM_ERR_FORMAT, "tensor 1 'f16.weight': offset");
    expect_patch_fail("align-str", src, len, L.kv_type_at[al], GGUF_VT_FLOAT32, 4, FLM_ERR_FORMAT,
                      "general.alignment");
    expect_patch_fail("align-huge", src, len, L.kv_type_at[al], GGUF_VT_UINT64, 4, FLM_ERR_FORMAT, NULL);
    int b = find_kv_idx(&L, "a.bool");
    expect_patch_fail("bool-arr", src, len, L.kv_val_at[b] + 12 + 1, 2, 1, FLM_ERR_FORMAT, "bool value 2");
    free(src);
}

/* Random corruption of a small written file: open must succeed or fail cleanly, never crash or read out of bounds
 * (run under ASan to check the latter). */
static void test_fuzz(void **state) {
    (void)state;
    char path[4096];
    snprintf(path, sizeof path, "%s", tu_tmp("fz", ".gguf"));
    uint8_t *data[N_WT];
    write_sample(path, data);
    for (int i = 0; i < N_WT; i++) free(data[i]);
    size_t len;
    uint8_t *src = tu_read_file(path, &len);
    static layout L;
    walk(src, len, &L);
    uint8_t *d = malloc(len);
    assert_non_null(d);
    uint64_t rng = 42;
    int ok = 0, bad = 0;
    for (int it = 0; it < 3000; it++) {
        memcpy(d, src, len);
        size_t n = len;
        int flips = 1 + (int)(tu_rand_u64(&rng) % 4);
        for (int k = 0; k < flips; k++) {
            size_t at = (size_t)(tu_rand_u64(&rng) % L.data_off); /* metadata only: data bytes are opaque */
            uint64_t r = tu_rand_u64(&rng);
            d[at] = r & 1 ? (uint8_t)(r >> 8) : (uint8_t)(d[at] ^ (1u << (r >> 8 & 7)));
        }
        if (tu_rand_u64(&rng) % 8 == 0) n = (size_t)(tu_rand_u64(&rng) % len);
        tu_write_file(path, d, n);
        flm_gguf_file *f = NULL;
        flm_error err = {0};
        flm_status st = flm_gguf_open(path, &f, &err);
        if (st == FLM_OK) {
            ok++;
            for (uint64_t i = 0; i < f->n_tensors; i++) {
                const flm_gguf_tensor *t = &f->tensors[i];
                assert_true(t->data >= f->map && t->nbytes <= f->size && t->data + t->nbytes <= f->map + f->size);
            }
            flm_gguf_close(f);
        } else {
            bad++;
            assert_null(f);
            if (st != FLM_ERR_FORMAT && st != FLM_ERR_UNSUPPORTED) fail_msg("status %d: %s", st, err.msg);
            if (!strstr(err.msg, path)) fail_msg("message does not name the file: %s", err.msg);
        }
    }
    print_message("    fuzz: %d opened, %d refused\n", ok, bad);
    assert_true(bad > 0);
    free(d);
    free(src);
    unlink(path);
}

/* Scalars of every type, in a file built by hand (the writer only writes u32, f32 and strings). */
typedef struct bb { uint8_t d[1024]; size_t n; } bb;
static void bb_put(bb *b, uint64_t v, size_t n) {
    assert_true(b->n + n <= sizeof b->d);
    set_le(b->d + b->n, v, n);
    b->n += n;
}
static void bb_key(bb *b, const char *key, uint32_t type) {
    bb_put(b, strlen(key), 8);
    memcpy(b->d + b->n, key, strlen(key));
    b->n += strlen(key);
    bb_put(b, type, 4);
}

static void test_getters(void **state) {
    (void)state;
    static bb b;
    double big = 1e300, half = 0.5;
    uint64_t big_bits, half_bits;
    memcpy(&big_bits, &big, 8);
    memcpy(&half_bits, &half, 8);
    memcpy(b.d, "GGUF", 4);
    b.n = 4;
    bb_put(&b, 2, 4); /* version 2 */
    bb_put(&b, 0, 8);
    bb_put(&b, 11, 8);
    bb_key(&b, "i8", GGUF_VT_INT8), bb_put(&b, 0xff, 1);
    bb_key(&b, "i16", GGUF_VT_INT16), bb_put(&b, (uint16_t)-300, 2);
    bb_key(&b, "i32", GGUF_VT_INT32), bb_put(&b, 70000, 4);
    bb_key(&b, "i64", GGUF_VT_INT64), bb_put(&b, (uint64_t)-5, 8);
    bb_key(&b, "u8", GGUF_VT_UINT8), bb_put(&b, 200, 1);
    bb_key(&b, "u16", GGUF_VT_UINT16), bb_put(&b, 60000, 2);
    bb_key(&b, "u64", GGUF_VT_UINT64), bb_put(&b, (uint64_t)1 << 40, 8);
    bb_key(&b, "u64s", GGUF_VT_UINT64), bb_put(&b, UINT32_MAX, 8);
    bb_key(&b, "f64", GGUF_VT_FLOAT64), bb_put(&b, half_bits, 8);
    bb_key(&b, "f64big", GGUF_VT_FLOAT64), bb_put(&b, big_bits, 8);
    bb_key(&b, "bool", GGUF_VT_BOOL), bb_put(&b, 1, 1);
    char path[4096];
    snprintf(path, sizeof path, "%s", tu_tmp("getters", ".gguf"));
    tu_write_file(path, b.d, b.n);
    flm_gguf_file *f = open_ok(path);
    flm_error err = {0};
    assert_int_equal(f->version, 2);
    assert_int_equal(flm_gguf_find_kv(f, "i8")->v.i64, -1);
    assert_int_equal(flm_gguf_find_kv(f, "i16")->v.i64, -300);
    assert_int_equal(flm_gguf_find_kv(f, "i64")->v.i64, -5);
    assert_int_equal(flm_gguf_find_kv(f, "bool")->v.u64, 1);
    struct { const char *key; flm_status st; uint32_t u; float fl; } c[] = {
        {"i8", FLM_ERR_FORMAT, 0, -1.0f},      {"i16", FLM_ERR_FORMAT, 0, -300.0f}, {"i32", FLM_OK, 70000, 70000.0f},
        {"i64", FLM_ERR_FORMAT, 0, -5.0f},     {"u8", FLM_OK, 200, 200.0f},         {"u16", FLM_OK, 60000, 60000.0f},
        {"u64", FLM_ERR_FORMAT, 0, 1099511627776.0f}, {"u64s", FLM_OK, UINT32_MAX, 4294967295.0f},
        {"f64", FLM_ERR_FORMAT, 0, 0.5f},
    };
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        uint32_t u = 0;
        float fl = 0;
        assert_int_equal(flm_gguf_get_u32(f, c[i].key, true, &u, &err), c[i].st);
        if (c[i].st == FLM_OK) assert_int_equal(u, c[i].u);
        else assert_non_null(strstr(err.msg, c[i].key));
        assert_int_equal(flm_gguf_get_f32(f, c[i].key, true, &fl, &err), FLM_OK);
        assert_true(fl == c[i].fl);
    }
    /* flm_gguf_writer_kv_copy keeps every type and value */
    char path2[4096];
    snprintf(path2, sizeof path2, "%s", tu_tmp("kvcopy", ".gguf"));
    flm_gguf_writer *w = NULL;
    assert_int_equal(flm_gguf_writer_create(path2, FLM_OUT_REPLACE, &w, &err), FLM_OK);
    for (uint64_t i = 0; i < f->n_kv; i++) assert_int_equal(flm_gguf_writer_kv_copy(w, &f->kv[i]), FLM_OK);
    assert_int_equal(flm_gguf_writer_begin(w, &err), FLM_OK);
    assert_int_equal(flm_gguf_writer_finish(w, &err), FLM_OK);
    flm_gguf_writer_free(w);
    flm_gguf_file *g = open_ok(path2);
    assert_int_equal(g->n_kv, f->n_kv);
    for (uint64_t i = 0; i < f->n_kv; i++) {
        assert_string_equal(g->kv[i].key, f->kv[i].key);
        assert_int_equal(g->kv[i].type, f->kv[i].type);
        assert_int_equal(g->kv[i].v.u64, f->kv[i].v.u64); /* same bits: integers widened the same, floats as f64 */
    }
    flm_gguf_close(g);
    unlink(path2);

    float fl = 0;
    assert_int_equal(flm_gguf_get_f32(f, "f64big", true, &fl, &err), FLM_ERR_FORMAT);
    assert_non_null(strstr(err.msg, "does not fit in f32"));
    assert_int_equal(flm_gguf_get_f32(f, "bool", true, &fl, &err), FLM_ERR_FORMAT);
    uint32_t u = 0;
    assert_int_equal(flm_gguf_get_u32(f, "bool", true, &u, &err), FLM_ERR_FORMAT);
    flm_gguf_close(f);
    unlink(path);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_real_model),
        cmocka_unit_test(test_getters),
        cmocka_unit_test(test_buffer_and_copy),
        cmocka_unit_test(test_writer_round_trip),
        cmocka_unit_test(test_writer_empty),
        cmocka_unit_test(test_writer_errors),
        cmocka_unit_test(test_bad_real),
        cmocka_unit_test(test_bad_written),
        cmocka_unit_test(test_fuzz),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
