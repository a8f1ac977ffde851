/* hf_perturb.h — the tiny Hugging Face models with every bias and norm weight made non-trivial (test_hf_opt.c,
 * test_hf_archs.c; header-only: static functions).
 *
 * The models of tests/data/hf-tiny were saved with transformers' initialization: every bias 0 and every norm weight
 * 1, so their reference answers cannot tell whether a bias or a norm weight is applied at all, or to the right place.
 * hf_perturbed_folder writes a copy of a folder whose biases and norm weights follow the formula of
 * tests/oracle/hf_numpy.py --perturb (for NAME's element i, k = (sum of NAME's bytes) % 97: a bias is
 * 0.1 sin(0.7 i + 1.3 k), a norm weight 1 + 0.2 sin(0.7 i + 1.3 k), in double, rounded to float), whose answers
 * (the NumPy forward pass, checked against transformers' on the unperturbed models) are hf-tiny/DIR/perturbed.json.
 * hf_byte_tokenizer writes a tokenizer folder under which any text becomes byte tokens inside the tiny models'
 * vocabulary (calibrate needs text). */
#ifndef FLM_TESTS_HF_PERTURB_H
#define FLM_TESTS_HF_PERTURB_H
#include <cjson/cJSON.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/types.h"
#include "convert/safetensors.h"
#include "testutil.h"

static bool hf_ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && !strcmp(s + n - m, suffix);
}

/* A copy of tests/data/hf-tiny/<name> (config.json, reference.json, perturbed.json; model.safetensors perturbed) in
 * a fresh folder; returns it (static). Every tensor must be F32. */
static const char *hf_perturbed_folder(const char *name) {
    static char dir[4096];
    char rel[256], path[4300];
    snprintf(dir, sizeof dir, "%s", tu_tmp("hf-perturbed", ""));
    assert_int_equal(mkdir(dir, 0755), 0);
    static const char *const copy[] = {"config.json", "reference.json", "perturbed.json"};
    for (int i = 0; i < 3; i++) {
        size_t len;
        snprintf(rel, sizeof rel, "hf-tiny/%s/%s", name, copy[i]);
        uint8_t *b = tu_read_file(tu_data(rel), &len);
        snprintf(path, sizeof path, "%s/%s", dir, copy[i]);
        tu_write_file(path, b, len);
        free(b);
    }
    flm_st_file *f = NULL;
    flm_error err;
    snprintf(rel, sizeof rel, "hf-tiny/%s/model.safetensors", name);
    if (flm_st_open(tu_data(rel), &f, &err)) fail_msg("%s", err.msg);
    cJSON *h = cJSON_CreateObject();
    uint64_t off = 0;
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const flm_st_tensor *t = &f->tensors[i];
        assert_int_equal(t->type, FLM_TYPE_F32);
        cJSON *e = cJSON_AddObjectToObject(h, t->name);
        cJSON_AddStringToObject(e, "dtype", "F32");
        cJSON *shape = cJSON_AddArrayToObject(e, "shape");
        for (uint32_t d = 0; d < t->n_dims; d++) cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)t->shape[d]));
        cJSON *o = cJSON_AddArrayToObject(e, "data_offsets");
        cJSON_AddItemToArray(o, cJSON_CreateNumber((double)off));
        cJSON_AddItemToArray(o, cJSON_CreateNumber((double)(off + t->nbytes)));
        off += t->nbytes;
    }
    char *js = cJSON_PrintUnformatted(h);
    size_t hl = strlen(js), len = 8 + hl + off;
    uint8_t *b = malloc(len);
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)((uint64_t)hl >> (8 * i));
    memcpy(b + 8, js, hl);
    uint8_t *p = b + 8 + hl;
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const flm_st_tensor *t = &f->tensors[i];
        const bool bias = hf_ends_with(t->name, ".bias"),
                   norm = hf_ends_with(t->name, ".weight") && (strstr(t->name, "norm") || strstr(t->name, "ln_f"));
        memcpy(p, t->data, t->nbytes);
        if (bias || norm) {
            unsigned k = 0;
            for (const char *c = t->name; *c; c++) k += (unsigned char)*c;
            k %= 97;
            for (uint64_t j = 0; j < t->nbytes / 4; j++) {
                double s = sin(0.7 * (double)j + 1.3 * (double)k);
                float v = (float)(bias ? 0.1 * s : 1.0 + 0.2 * s);
                memcpy(p + j * 4, &v, 4);
            }
        }
        p += t->nbytes;
    }
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    tu_write_file(path, b, len);
    free(b);
    free(js);
    cJSON_Delete(h);
    flm_st_close(f);
    return dir;
}

/* Remove what hf_perturbed_folder wrote. */
static void hf_remove_folder(const char *dir) {
    static const char *const files[] = {"config.json", "reference.json", "perturbed.json", "model.safetensors"};
    char path[4300];
    for (int i = 0; i < 4; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        remove(path);
    }
    rmdir(dir);
}

/* A byte-level BPE tokenizer folder for a 1024-token model: GPT-2's 256 byte symbols as ids 0..255, no merges (any
 * text tokenizes to its bytes, every id inside the tiny model's vocabulary); returns the folder (static). */
static const char *hf_byte_tokenizer(void) {
    static char dir[4096];
    snprintf(dir, sizeof dir, "%s", tu_tmp("hf-bytes", ""));
    assert_int_equal(mkdir(dir, 0755), 0);
    /* GPT-2's bytes_to_unicode: printable bytes map to themselves, the others to 256, 257, ... in byte order */
    cJSON *v = cJSON_CreateObject();
    for (int b = 0, extra = 0; b < 256; b++) {
        bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        unsigned cp = printable ? (unsigned)b : 256u + (unsigned)extra++;
        char key[4];
        if (cp < 0x80) key[0] = (char)cp, key[1] = 0;
        else key[0] = (char)(0xC0 | cp >> 6), key[1] = (char)(0x80 | (cp & 0x3F)), key[2] = 0;
        cJSON_AddNumberToObject(v, key, b);
    }
    char *js = cJSON_PrintUnformatted(v), path[4200];
    snprintf(path, sizeof path, "%s/vocab.json", dir);
    tu_write_file(path, js, strlen(js));
    snprintf(path, sizeof path, "%s/merges.txt", dir);
    tu_write_file(path, "#version: 0.2\n", 14);
    free(js);
    cJSON_Delete(v);
    return dir;
}

static void hf_remove_tokenizer(const char *dir) {
    char path[4200];
    snprintf(path, sizeof path, "%s/vocab.json", dir);
    remove(path);
    snprintf(path, sizeof path, "%s/merges.txt", dir);
    remove(path);
    rmdir(dir);
}

#endif
