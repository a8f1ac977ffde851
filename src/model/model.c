#include "model/model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compute/attention.h"
#include "format/flm.h"
#include "core/types.h"
#include "core/error.h"

uint64_t flm_weight_bytes(const flm_weight *w) { return (uint64_t)flm_row_bytes(w->type, w->n_in) * w->n_out; }

flm_status flm_hparams_check(const flm_hparams *hp, const char *what, flm_error *err) {
    const uint32_t lim = 1u << 20;
    if (!hp->d_model || !hp->d_ffn || !hp->n_layers || !hp->n_heads || !hp->n_kv_heads || !hp->n_vocab ||
        !hp->head_dim || !hp->d_embd || hp->d_model > lim || hp->d_embd > lim || hp->d_ffn > lim ||
        hp->n_layers > 4096 || hp->n_heads > 4096 || hp->head_dim > 4096 || hp->n_vocab > (1u << 24))
        return flm_fail(err, FLM_ERR_FORMAT,
                        "%s: hyper-parameters out of range (d_model %u, d_ffn %u, n_layers %u, n_heads %u, "
                        "n_kv_heads %u, head_dim %u, n_vocab %u)", what, hp->d_model, hp->d_ffn, hp->n_layers,
                        hp->n_heads, hp->n_kv_heads, hp->head_dim, hp->n_vocab);
    if (hp->head_dim > FLM_ATT_MAX_HEAD_DIM) /* attention's and the context shift's per-head scratch */
        return flm_fail(err, FLM_ERR_UNSUPPORTED, "%s: head_dim %u is above the %u flashlm supports", what,
                        hp->head_dim, FLM_ATT_MAX_HEAD_DIM);
    if (hp->n_heads % hp->n_kv_heads)
        return flm_fail(err, FLM_ERR_FORMAT, "%s: n_heads %u is not a multiple of n_kv_heads %u", what, hp->n_heads,
                        hp->n_kv_heads);
    if ((hp->arch && hp->arch->pos == FLM_POS_ROPE && hp->rope_dim == 0) || hp->rope_dim > hp->head_dim ||
        hp->rope_dim % 2)
        return flm_fail(err, FLM_ERR_FORMAT, "%s: rope dimension %u must be even, above 0 and at most head_dim %u",
                        what, hp->rope_dim, hp->head_dim);
    if (!(hp->norm_eps > 0.0f && hp->norm_eps < 1.0f) || !(hp->rope_theta > 0.0f) || !(hp->rope_theta_local > 0.0f))
        return flm_fail(err, FLM_ERR_FORMAT, "%s: norm epsilon %g or RoPE base %g out of range", what,
                        (double)hp->norm_eps, (double)hp->rope_theta);
    return FLM_OK;
}

/* "<arch>.<suffix>" into buf */
static const char *akey(char *buf, size_t cap, const flm_arch *a, const char *suffix) {
    snprintf(buf, cap, "%s.%s", a->name, suffix);
    return buf;
}

/* The architecture named by general.architecture, or an error naming it and the known ones. */
static flm_status find_arch(const flm_gguf_file *f, const flm_arch **out, flm_error *err) {
    char *arch = NULL;
    flm_status st = flm_gguf_get_str(f, "general.architecture", true, &arch, err);
    if (st) return st;
    *out = flm_arch_find(arch);
    if (!*out)
        st = flm_fail(err, FLM_ERR_UNSUPPORTED, "%s: architecture '%s' is not supported (supported: %s)", f->path,
                      arch, flm_arch_names());
    free(arch);
    return st;
}

flm_status flm_hparams_from_gguf(const flm_gguf_file *f, flm_hparams *hp, flm_error *err) {
    memset(hp, 0, sizeof *hp);
    flm_status st;
    const flm_arch *a = NULL;
    if ((st = find_arch(f, &a, err))) return st;
    hp->arch = a;
    char k[128];
#define KEY(s) akey(k, sizeof k, a, s)
    if ((st = flm_gguf_get_u32(f, KEY("embedding_length"), true, &hp->d_model, err)) ||
        (st = flm_gguf_get_u32(f, KEY("feed_forward_length"), true, &hp->d_ffn, err)) ||
        (st = flm_gguf_get_u32(f, KEY("block_count"), true, &hp->n_layers, err)) ||
        (st = flm_gguf_get_u32(f, KEY("attention.head_count"), true, &hp->n_heads, err)))
        return st;
    hp->n_kv_heads = hp->n_heads;
    hp->n_ctx_train = 2048;
    hp->norm_eps = 1e-5f;
    hp->rope_theta = 10000.0f;
    hp->head_dim = hp->n_heads ? hp->d_model / hp->n_heads : 0;
    if ((st = flm_gguf_get_u32(f, KEY("attention.head_count_kv"), false, &hp->n_kv_heads, err)) ||
        (st = flm_gguf_get_u32(f, KEY("context_length"), true, &hp->n_ctx_train, err)) ||
        (st = flm_gguf_get_f32(f, KEY(a->norm == FLM_NORM_LAYER ? "attention.layer_norm_epsilon"
                                                                : "attention.layer_norm_rms_epsilon"),
                               true, &hp->norm_eps, err)) ||
        (st = flm_gguf_get_f32(f, KEY("rope.freq_base"), false, &hp->rope_theta, err)) ||
        (st = flm_gguf_get_u32(f, KEY("attention.key_length"), false, &hp->head_dim, err)))
        return st;
    uint32_t v_dim = hp->head_dim;
    if ((st = flm_gguf_get_u32(f, KEY("attention.value_length"), false, &v_dim, err))) return st;
    if (v_dim != hp->head_dim)
        return flm_fail(err, FLM_ERR_UNSUPPORTED, "%s: %s.attention.value_length %u differs from key_length %u",
                        f->path, a->name, v_dim, hp->head_dim);
    hp->rope_dim = hp->head_dim;
    if ((st = flm_gguf_get_u32(f, KEY("rope.dimension_count"), false, &hp->rope_dim, err))) return st;
    if (a->swa_period) {
        if ((st = flm_gguf_get_u32(f, KEY("attention.sliding_window"), true, &hp->n_swa, err))) return st;
        if (hp->n_swa == 0)
            return flm_fail(err, FLM_ERR_FORMAT, "%s: %s is 0", f->path, KEY("attention.sliding_window"));
    }
#undef KEY
    hp->rope_theta_local = a->rope_base_local > 0.0f ? a->rope_base_local : hp->rope_theta;
    hp->attn_scale = hp->head_dim ? 1.0f / sqrtf((float)hp->head_dim) : 0.0f;
    /* flashlm extension for synthetic ReLU models */
    char *act = NULL;
    if ((st = flm_gguf_get_str(f, "flashlm.ffn_activation", false, &act, err))) return st;
    hp->act = a->act;
    if (act) {
        if (!strcmp(act, "relu")) hp->act = FLM_ACT_RELU;
        else if (!strcmp(act, "silu")) hp->act = FLM_ACT_SILU;
        else {
            flm_status s = flm_fail(err, FLM_ERR_UNSUPPORTED, "%s: flashlm.ffn_activation '%s' is not silu or relu",
                                    f->path, act);
            free(act);
            return s;
        }
        free(act);
    }
    /* gated: the FFN has a gate projection. A GGUF holding FFN tensors says so by blk.0.ffn_gate.weight; a .flm's
     * resident GGUF holds none, and flm_model_from_flm takes it from the FFN regions' gate_type instead. */
    hp->gated = flm_gguf_find_tensor(f, "blk.0.ffn_gate.weight") || !flm_gguf_find_tensor(f, "blk.0.ffn_up.weight");
    /* a mixture of experts (Mixtral as llama, ...): no single FFN per layer to stream by neurons */
    if (flm_gguf_find_tensor(f, "blk.0.ffn_gate_inp.weight") || flm_gguf_find_tensor(f, "blk.0.ffn_up_exps.weight"))
        return flm_fail(err, FLM_ERR_UNSUPPORTED, "%s: a mixture-of-experts FFN (blk.0.ffn_gate_inp, ffn_*_exps) is "
                        "not supported: flashlm's FFN is one up/down (and gate) matrix per layer, streamed and "
                        "predicted by neurons, and a router choosing among experts is not that", f->path);
    if (!strcmp(a->name, "falcon") && flm_gguf_find_tensor(f, "blk.0.attn_norm_2.weight"))
        return flm_fail(err, FLM_ERR_UNSUPPORTED, "%s: Falcon with a second attention norm (attn_norm_2: the 40B "
                        "layout, new_decoder_architecture) is not supported; flashlm runs Falcon 7B's layout",
                        f->path);
    /* flashlm extension: post-LN (OPT-350M), written by flashlm convert from a Hugging Face folder */
    const flm_gguf_kv *na = flm_gguf_find_kv(f, "flashlm.norm_after");
    if (na) {
        if (na->type != GGUF_VT_BOOL)
            return flm_fail(err, FLM_ERR_FORMAT, "%s: key 'flashlm.norm_after': expected a bool", f->path);
        hp->norm_after = na->v.u64 != 0;
    }
    if (hp->norm_after && (a->norm != FLM_NORM_LAYER || (a->flags & (FLM_ARCH_PARALLEL | FLM_ARCH_POST_NORMS))))
        return flm_fail(err, FLM_ERR_UNSUPPORTED, "%s: flashlm.norm_after (post-LN) is supported for sequential "
                        "LayerNorm architectures (OPT), not %s", f->path, a->name);
    const flm_gguf_tensor *emb = flm_gguf_find_tensor(f, "token_embd.weight");
    if (!emb) return flm_fail(err, FLM_ERR_FORMAT, "%s: tensor 'token_embd.weight' is missing", f->path);
    if (emb->ne[1] > (1u << 24)) return flm_fail(err, FLM_ERR_FORMAT, "%s: token_embd.weight has too many rows", f->path);
    if (emb->ne[0] == 0 || emb->ne[0] > (1u << 20))
        return flm_fail(err, FLM_ERR_FORMAT, "%s: token_embd.weight has rows of %llu elements", f->path,
                        (unsigned long long)emb->ne[0]);
    hp->n_vocab = (uint32_t)emb->ne[1];
    hp->d_embd = (uint32_t)emb->ne[0]; /* d_model unless proj_in / proj_out (checked when binding) */
    return flm_hparams_check(hp, f->path, err);
}

/* Find a tensor and check its shape (n_in x n_out; n_out = 1 for vectors) and type. */
static flm_status bind(const flm_gguf_file *f, const char *name, uint64_t n_in, uint64_t n_out, bool f32_only,
                       flm_weight *w, flm_error *err) {
    const flm_gguf_tensor *t = flm_gguf_find_tensor(f, name);
    if (!t) return flm_fail(err, FLM_ERR_FORMAT, "%s: required tensor '%s' is missing", f->path, name);
    uint64_t rows = t->ne[1] * t->ne[2] * t->ne[3];
    if (t->ne[0] != n_in || rows != n_out)
        return flm_fail(err, FLM_ERR_FORMAT, "%s: tensor '%s' has shape [%llu, %llu], expected [%llu, %llu]", f->path,
                        name, (unsigned long long)t->ne[0], (unsigned long long)rows, (unsigned long long)n_in,
                        (unsigned long long)n_out);
    if (f32_only && t->type != FLM_TYPE_F32)
        return flm_fail(err, FLM_ERR_UNSUPPORTED, "%s: tensor '%s' must be f32, is %s", f->path, name,
                        flm_type_name(t->type));
    *w = (flm_weight){t->type, n_in, n_out, t->data};
    return FLM_OK;
}

/* Bind an optional f32 tensor: absent leaves w zeroed (data NULL). */
static flm_status bind_opt(const flm_gguf_file *f, const char *name, uint64_t n, flm_weight *w, flm_error *err) {
    if (!flm_gguf_find_tensor(f, name)) return FLM_OK;
    return bind(f, name, n, 1, true, w, err);
}

/* Rows first .. first + n - 1 of w (a view into the same bytes). */
static flm_weight row_range(const flm_weight *w, uint64_t first, uint64_t n) {
    flm_weight v = *w;
    v.n_out = n;
    if (w->data) v.data = (const uint8_t *)w->data + (size_t)(first * flm_row_bytes(w->type, w->n_in));
    return v;
}

/* Layer l's q, k and v projections (and their biases): attn_q, attn_k, attn_v, or a fused attn_qkv (llama.cpp's
 * falcon, phi2 and persimmon files) in the architecture's row order (arch.h, flm_qkv_layout). */
static flm_status bind_qkv(const flm_gguf_file *f, const flm_hparams *hp, uint32_t l, flm_layer_weights *L,
                           flm_error *err) {
    const flm_arch *a = hp->arch;
    const uint64_t q_dim = (uint64_t)hp->n_heads * hp->head_dim, kv_dim = (uint64_t)hp->n_kv_heads * hp->head_dim;
    const bool bias = a->flags & FLM_ARCH_QKV_BIAS;
    char name[96];
    flm_status st;
    snprintf(name, sizeof name, "blk.%u.attn_qkv.weight", l);
    if (flm_gguf_find_tensor(f, name)) {
        flm_weight w, b = {0};
        if ((st = bind(f, name, hp->d_model, q_dim + 2 * kv_dim, false, &w, err))) return st;
        snprintf(name, sizeof name, "blk.%u.attn_qkv.bias", l);
        if ((st = bias ? bind(f, name, q_dim + 2 * kv_dim, 1, true, &b, err)
                       : bind_opt(f, name, q_dim + 2 * kv_dim, &b, err)))
            return st;
        if (a->qkv == FLM_QKV_PER_HEAD) {
            if (hp->n_kv_heads != hp->n_heads)
                return flm_fail(err, FLM_ERR_UNSUPPORTED, "%s: a %s attn_qkv is interleaved per head and needs as many "
                                "key/value heads as heads (%u, not %u)", f->path, a->name, hp->n_heads,
                                hp->n_kv_heads);
            L->wqkv = w;
            L->bqkv = b;
            return FLM_OK;
        }
        /* a bias vector is one row of n_out values: its elements are the rows' */
        L->wq = row_range(&w, 0, q_dim);
        L->wk = row_range(&w, q_dim, kv_dim);
        L->wv = row_range(&w, q_dim + kv_dim, kv_dim);
        if (b.data) {
            const float *bv = b.data;
            L->bq = (flm_weight){FLM_TYPE_F32, q_dim, 1, bv};
            L->bk = (flm_weight){FLM_TYPE_F32, kv_dim, 1, bv + q_dim};
            L->bv = (flm_weight){FLM_TYPE_F32, kv_dim, 1, bv + q_dim + kv_dim};
        }
        return FLM_OK;
    }
    static const char *const part[3] = {"attn_q", "attn_k", "attn_v"};
    flm_weight *W[3] = {&L->wq, &L->wk, &L->wv}, *B[3] = {&L->bq, &L->bk, &L->bv};
    for (int i = 0; i < 3; i++) {
        const uint64_t rows = i ? kv_dim : q_dim;
        snprintf(name, sizeof name, "blk.%u.%s.weight", l, part[i]);
        if ((st = bind(f, name, hp->d_model, rows, false, W[i], err))) return st;
        snprintf(name, sizeof name, "blk.%u.%s.bias", l, part[i]);
        /* the architecture's biases are required; llama files may carry optional ones too */
        if ((st = bias ? bind(f, name, rows, 1, true, B[i], err) : bind_opt(f, name, rows, B[i], err))) return st;
    }
    return FLM_OK;
}

/* Bind the tensors of f into m (names as in llama.cpp's GGUF files); FFN matrices only when !ffn_external. */
static flm_status load_model(const flm_gguf_file *f, bool ffn_external, flm_model *m, flm_error *err) {
    flm_status st;
    if ((st = flm_hparams_from_gguf(f, &m->hp, err))) return st;
    const flm_hparams *hp = &m->hp;
    const flm_arch *a = hp->arch;
    /* every layer's tensors are bound below: one past the block count would be left out without a word */
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const char *nm = f->tensors[i].name;
        if (strncmp(nm, "blk.", 4) || nm[4] < '0' || nm[4] > '9') continue;
        char *end;
        const unsigned long l = strtoul(nm + 4, &end, 10);
        if (*end == '.' && l >= hp->n_layers)
            return flm_fail(err, FLM_ERR_FORMAT, "%s: tensor %s belongs to layer %lu, but %s.block_count says %u "
                            "layers (the model would run without it)", f->path, nm, l, a->name, hp->n_layers);
    }
    snprintf(m->arch, sizeof m->arch, "%s", a->name);
    const uint64_t q_dim = (uint64_t)hp->n_heads * hp->head_dim;
    if ((st = bind(f, "token_embd.weight", hp->d_embd, hp->n_vocab, false, &m->tok_embd, err))) return st;
    /* post-LN: the last layer's norm already ends the stack; a final norm is optional (OPT-350M has none) */
    const bool out_norm = !hp->norm_after || flm_gguf_find_tensor(f, "output_norm.weight");
    if (out_norm && (st = bind(f, "output_norm.weight", hp->d_model, 1, true, &m->output_norm, err))) return st;
    if (out_norm && a->norm == FLM_NORM_LAYER &&
        (st = bind(f, "output_norm.bias", hp->d_model, 1, true, &m->output_norm_b, err)))
        return st;
    /* OPT-350M's project_in / project_out: both, exactly when the embedding's width differs from d_model (or both
     * present at equal widths) */
    const bool pin = flm_gguf_find_tensor(f, "proj_in.weight"), pout = flm_gguf_find_tensor(f, "proj_out.weight");
    if (pin != pout || (hp->d_embd != hp->d_model && !pin))
        return flm_fail(err, FLM_ERR_FORMAT, "%s: token_embd.weight has rows of %u elements for d_model %u: "
                        "proj_in.weight and proj_out.weight must both be present (they are %s and %s)", f->path,
                        hp->d_embd, hp->d_model, pin ? "present" : "missing", pout ? "present" : "missing");
    if (pin && ((st = bind(f, "proj_in.weight", hp->d_embd, hp->d_model, false, &m->proj_in, err)) ||
                (st = bind(f, "proj_out.weight", hp->d_model, hp->d_embd, false, &m->proj_out, err))))
        return st;
    if (a->pos == FLM_POS_LEARNED &&
        (st = bind(f, "position_embd.weight", hp->d_model, hp->n_ctx_train, false, &m->pos_embd, err)))
        return st;
    if (flm_gguf_find_tensor(f, "output.weight")) {
        if ((st = bind(f, "output.weight", hp->d_embd, hp->n_vocab, false, &m->output, err))) return st;
    } else {
        m->output = m->tok_embd; /* tied */
    }
    if ((a->flags & FLM_ARCH_OUT_BIAS) && (st = bind(f, "output.bias", hp->n_vocab, 1, true, &m->output_b, err)))
        return st;
    m->layers = calloc(hp->n_layers, sizeof *m->layers);
    if (!m->layers) return flm_fail(err, FLM_ERR_NOMEM, "out of memory");
    for (uint32_t l = 0; l < hp->n_layers; l++) {
        flm_layer_weights *L = &m->layers[l];
        char name[96];
#define BIND(field, suffix, n_in, n_out, f32)                                                                    \
    snprintf(name, sizeof name, "blk.%u." suffix ".weight", l);                                                  \
    if ((st = bind(f, name, n_in, n_out, f32, &L->field, err))) return st;
#define BIND_REQ(field, suffix, n)                                                                               \
    snprintf(name, sizeof name, "blk.%u." suffix, l);                                                            \
    if ((st = bind(f, name, n, 1, true, &L->field, err))) return st;
        BIND(attn_norm, "attn_norm", hp->d_model, 1, true)
        if ((st = bind_qkv(f, hp, l, L, err))) return st;
        BIND(wo, "attn_output", q_dim, hp->d_model, false)
        /* parallel archs may have no FFN norm (Falcon 7B, Phi-2): the FFN then reads attn_norm's output */
        snprintf(name, sizeof name, "blk.%u.ffn_norm.weight", l);
        const bool ffn_norm = !(a->flags & FLM_ARCH_PARALLEL) || flm_gguf_find_tensor(f, name);
        if (ffn_norm) {
            BIND(ffn_norm, "ffn_norm", hp->d_model, 1, true)
        }
        if (!ffn_external) {
            BIND(ffn_up, "ffn_up", hp->d_model, hp->d_ffn, false)
            snprintf(name, sizeof name, "blk.%u.ffn_gate.weight", l);
            if (hp->gated) {
                BIND(ffn_gate, "ffn_gate", hp->d_model, hp->d_ffn, false)
            } else if (flm_gguf_find_tensor(f, name)) {
                return flm_fail(err, FLM_ERR_FORMAT, "%s: tensor '%s' present but layer 0 has no FFN gate", f->path,
                                name);
            }
            BIND(ffn_down, "ffn_down", hp->d_ffn, hp->d_model, false)
        }
        if (a->flags & FLM_ARCH_QK_NORM) {
            BIND_REQ(q_norm, "attn_q_norm.weight", hp->head_dim)
            BIND_REQ(k_norm, "attn_k_norm.weight", hp->head_dim)
            if (a->norm == FLM_NORM_LAYER) {
                BIND_REQ(q_norm_b, "attn_q_norm.bias", hp->head_dim)
                BIND_REQ(k_norm_b, "attn_k_norm.bias", hp->head_dim)
            }
        }
        if (a->flags & FLM_ARCH_POST_NORMS) {
            BIND_REQ(post_attn_norm, "post_attention_norm.weight", hp->d_model)
            BIND_REQ(post_ffn_norm, "post_ffw_norm.weight", hp->d_model)
        }
        if (a->norm == FLM_NORM_LAYER) {
            BIND_REQ(attn_norm_b, "attn_norm.bias", hp->d_model)
            if (ffn_norm) {
                BIND_REQ(ffn_norm_b, "ffn_norm.bias", hp->d_model)
            }
        }
        if (a->flags & FLM_ARCH_O_BIAS) {
            BIND_REQ(bo, "attn_output.bias", hp->d_model)
        }
        if (a->flags & FLM_ARCH_FFN_BIAS) { /* resident in a .flm too (not FFN region data) */
            BIND_REQ(ffn_up_b, "ffn_up.bias", hp->d_ffn)
            BIND_REQ(ffn_down_b, "ffn_down.bias", hp->d_model)
        }
        L->swa = a->swa_period && (l + 1) % a->swa_period != 0;
#undef BIND
#undef BIND_REQ
    }
    if ((st = flm_tokenizer_from_gguf(f, &m->tok, err))) return st;
    if (flm_tokenizer_n_vocab(m->tok) != hp->n_vocab)
        return flm_fail(err, FLM_ERR_FORMAT, "%s: tokenizer has %u tokens but token_embd.weight has %u rows", f->path,
                        flm_tokenizer_n_vocab(m->tok), hp->n_vocab);
    return FLM_OK;
}

flm_status flm_model_from_gguf(flm_gguf_file *f, flm_model **out, flm_error *err) {
    *out = NULL;
    flm_model *m = calloc(1, sizeof *m);
    if (!m) { flm_gguf_close(f); return flm_fail(err, FLM_ERR_NOMEM, "out of memory"); }
    m->gguf = f;
    flm_status st = load_model(f, false, m, err);
    if (st) { flm_model_free(m); return st; }
    *out = m;
    return FLM_OK;
}

flm_status flm_model_check_regions(const flm_file *f, flm_hparams *hp, flm_error *err) {
    if (f->n_layers != hp->n_layers) /* before ffn[0]: a file without FFN regions has none (hp->n_layers >= 1) */
        return flm_fail(err, FLM_ERR_FORMAT, "%s: %u FFN regions for %u layers", f->path, f->n_layers, hp->n_layers);
    hp->gated = f->ffn[0]->gate_type != FLM_GATE_NONE; /* every layer must agree: checked below */
    for (uint32_t l = 0; l < hp->n_layers; l++) {
        const flm_region *r = f->ffn[l];
        flm_bundle_layout b = flm_bundle_layout_of(hp->d_model, r->up_type, r->gate_type, r->down_type, hp->gated);
        if (r->n_records != hp->d_ffn || b.record_bytes != r->record_bytes || b.up_bytes == 0 || b.down_bytes == 0 ||
            (hp->gated && b.gate_bytes == 0))
            return flm_fail(err, FLM_ERR_FORMAT, "%s: FFN region of layer %u: %u records of %llu bytes do not match "
                            "d_ffn %u, d_model %u and its types", f->path, l, r->n_records,
                            (unsigned long long)r->record_bytes, hp->d_ffn, hp->d_model);
        if (hp->gated != (r->gate_type != FLM_GATE_NONE))
            return flm_fail(err, FLM_ERR_FORMAT, "%s: FFN region of layer %u is %s but layer 0's is %s", f->path, l,
                            hp->gated ? "ungated" : "gated", hp->gated ? "gated" : "ungated");
    }
    return FLM_OK;
}

flm_status flm_model_from_flm(const flm_file *f, flm_model **out, flm_error *err) {
    *out = NULL;
    flm_model *m = calloc(1, sizeof *m);
    if (!m) return flm_fail(err, FLM_ERR_NOMEM, "out of memory");
    flm_status st = load_model(f->meta, true, m, err);
    if (!st) st = flm_model_check_regions(f, &m->hp, err);
    for (uint32_t l = 0; !st && l < m->hp.n_layers; l++) {
        const flm_region *r = f->ffn[l];
        flm_layer_weights *L = &m->layers[l];
        L->ffn_up = (flm_weight){r->up_type, m->hp.d_model, m->hp.d_ffn, NULL};
        L->ffn_gate = m->hp.gated ? (flm_weight){r->gate_type, m->hp.d_model, m->hp.d_ffn, NULL} : (flm_weight){0};
        L->ffn_down = (flm_weight){r->down_type, m->hp.d_model, m->hp.d_ffn, NULL}; /* stored by columns */
    }
    if (st) { flm_model_free(m); return st; }
    *out = m;
    return FLM_OK;
}

void flm_model_free(flm_model *m) {
    if (!m) return;
    flm_tokenizer_free(m->tok);
    free(m->layers);
    flm_gguf_close(m->gguf);
    free(m);
}
