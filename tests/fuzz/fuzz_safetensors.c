/* fuzz_safetensors.c — the safetensors reader (src/convert/safetensors.c) on arbitrary bytes: the header length, the
 * JSON header, each entry's dtype, shape and data_offsets. On success every tensor's bytes must lie inside the input,
 * agree with its shape and dtype, and no two tensors may overlap; every byte of every tensor is read (ASan catches a
 * range the checks let through). On failure the error has a message. Seeds: tests/fuzz/seeds/fuzz_safetensors (small
 * hand-made files) and make_seeds.sh (the head of tests/data/hf-tiny's OPT). */
#include "fuzz_common.h"

#include "flashlm.h"
#include "convert/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    flm_st_file *f = NULL;
    flm_error err;
    err.msg[0] = 0;
    flm_status st = flm_st_open_buffer("fuzz.safetensors", data, size, &f, &err);
    if (st) {
        fz_check(f == NULL && err.msg[0], "an error without a message, or a file");
        return 0;
    }
    fz_check(f != NULL, "no file");
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const flm_st_tensor *t = &f->tensors[i];
        fz_check(t->name && t->name[0], "tensor %llu without a name", (unsigned long long)i);
        fz_check(t->n_dims <= FLM_ST_MAX_DIMS, "rank %u", t->n_dims);
        uint64_t n = 1;
        for (uint32_t d = 0; d < t->n_dims; d++) n *= t->shape[d];
        fz_check(n == t->n_elements, "element count");
        uint64_t es = t->type == FLM_TYPE_F32 ? 4 : 2;
        fz_check(t->nbytes == n * es, "byte size");
        fz_check(t->data >= data && t->nbytes <= size && (uint64_t)(t->data - data) <= size - t->nbytes,
                 "tensor '%s' outside the input", t->name);
        volatile uint8_t sink = 0;
        for (uint64_t b = 0; b < t->nbytes; b++) sink ^= t->data[b];
        (void)sink;
        for (uint64_t j = 0; j < i; j++) {
            const flm_st_tensor *u = &f->tensors[j];
            bool apart = !t->nbytes || !u->nbytes || t->data + t->nbytes <= u->data || u->data + u->nbytes <= t->data;
            fz_check(apart, "tensors '%s' and '%s' overlap", t->name, u->name);
        }
        fz_check(flm_st_find(f, t->name) != NULL, "find");
    }
    flm_st_close(f);
    return 0;
}
