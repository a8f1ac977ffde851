#!/usr/bin/env python3
"""hf_numpy.py - an independent NumPy forward pass of the tiny Hugging Face models (tests/data/hf-tiny) for
tests/test_hf_archs.c and tests/test_hf_opt.c.

Usage: hf_numpy.py DIR [--perturb] [--check] [--out FILE]
       hf_numpy.py --make-opt350m DIR   (writes the random OPT-350M-shaped model below into DIR with its reference)
  DIR       a folder of tests/data/hf-tiny (config.json, model.safetensors, reference.json)
  --perturb first replace every bias and every norm weight by the deterministic values below (the reference models
            were saved with transformers' initialization: biases 0, norm weights 1, so their answers cannot tell
            whether a bias or a norm weight is applied, or applied to the right place)
  --check   compare with reference.json (transformers' answers; meaningful without --perturb): print the relative
            error of the prompt's last logits and whether the 16 greedy ids agree; exit 1 when they do not
  --out     write {"prompt_ids", "greedy_ids", "prompt_last_logits", "made_with"} as JSON

The perturbation (tests/hf_perturb.h computes the same values in C): for the tensor named NAME (its safetensors name)
with element index i, k = (sum of NAME's bytes) % 97,
    bias:        v_i = 0.1 * sin(0.7 * i + 1.3 * k)
    norm weight: v_i = 1 + 0.2 * sin(0.7 * i + 1.3 * k)
computed in double and rounded to float32. A bias is a tensor whose name ends in ".bias"; a norm weight one whose name
ends in ".weight" and contains "norm" or "ln_f".

The forward pass follows transformers' modeling_opt.py (pre-LN, and OPT-350M's post-LN: do_layer_norm_before false
puts each layer's two LayerNorms after their residual adds, x = LN(x + attn(x)), x = LN(x + fc2(relu(fc1(x)))), and
the decoder has no final LayerNorm; word_embed_proj_dim != hidden_size adds project_in on the token embedding before
the positions are added and project_out before the tied classifier, both without bias), modeling_falcon.py
(parallel_attn, multi_query),
modeling_phi.py and modeling_persimmon.py, in float64, the whole sequence recomputed for each greedy step. It was
checked against reference.json for all four models (--check). Needs only NumPy.
"""
import json
import math
import struct
import sys

import numpy as np


def load_safetensors(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    head = json.loads(raw[8:8 + n])
    base = 8 + n
    out = {}
    for name, t in head.items():
        if name == "__metadata__":
            continue
        assert t["dtype"] == "F32", name
        s, e = t["data_offsets"]
        out[name] = np.frombuffer(raw[base + s:base + e], dtype="<f4").reshape(t["shape"]).copy()
    return out


def is_bias(name):
    return name.endswith(".bias")


def is_norm_weight(name):
    return name.endswith(".weight") and ("norm" in name or "ln_f" in name)


def perturb(w):
    for name, t in w.items():
        if not (is_bias(name) or is_norm_weight(name)):
            continue
        k = sum(name.encode()) % 97
        i = np.arange(t.size, dtype=np.float64)
        v = np.sin(0.7 * i + 1.3 * k)
        v = (0.1 * v) if is_bias(name) else (1.0 + 0.2 * v)
        w[name] = v.astype(np.float32).reshape(t.shape)


def f64(w):
    return {k: v.astype(np.float64) for k, v in w.items()}


def layer_norm(x, w, b, eps):
    m = x.mean(-1, keepdims=True)
    v = ((x - m) ** 2).mean(-1, keepdims=True)
    return (x - m) / np.sqrt(v + eps) * w + b


def rope(x, rd, theta):
    """x [T, H, hd]: NEOX (rotate_half) RoPE on the first rd dimensions of each head, position t for row t."""
    T = x.shape[0]
    inv = 1.0 / theta ** (np.arange(0, rd, 2, dtype=np.float64) / rd)
    ang = np.arange(T, dtype=np.float64)[:, None] * inv[None, :]
    cos = np.concatenate([np.cos(ang)] * 2, -1)[:, None, :]
    sin = np.concatenate([np.sin(ang)] * 2, -1)[:, None, :]
    r, p = x[..., :rd], x[..., rd:]
    half = rd // 2
    rot = np.concatenate([-r[..., half:], r[..., :half]], -1)
    return np.concatenate([r * cos + rot * sin, p], -1)


def attention(q, k, v):
    """q [T, H, hd], k and v [T, Hkv, hd]: causal softmax(q k^T / sqrt(hd)) v, as [T, H * hd]."""
    T, H, hd = q.shape
    g = H // k.shape[1]
    k = np.repeat(k, g, axis=1)
    v = np.repeat(v, g, axis=1)
    s = np.einsum("thd,shd->hts", q, k) / math.sqrt(hd)
    s = s + np.triu(np.full((T, T), -np.inf), 1)[None]
    s = np.exp(s - s.max(-1, keepdims=True))
    s /= s.sum(-1, keepdims=True)
    return np.einsum("hts,shd->thd", s, v).reshape(T, H * hd)


def gelu_erf(x):
    return 0.5 * x * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))


def gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def rope_params(cfg):
    rp = cfg.get("rope_parameters") or {}
    theta = rp.get("rope_theta", cfg.get("rope_theta", 10000.0))
    factor = rp.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0))
    return theta, factor


def forward(cfg, w, ids):
    """the last position's logits for ids"""
    mt = cfg["model_type"]
    d, H, L = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_hidden_layers"]
    hd, T = d // H, len(ids)
    lin = lambda x, n, bias=True: x @ w[n + ".weight"].T + (w[n + ".bias"] if bias and n + ".bias" in w else 0.0)
    if mt == "opt":
        p = "model.decoder."
        before = cfg.get("do_layer_norm_before", True)  # False: post-LN (OPT-350M)
        e = w[p + "embed_tokens.weight"][ids]
        if p + "project_in.weight" in w:  # word_embed_proj_dim != hidden_size: Linear without bias
            e = e @ w[p + "project_in.weight"].T
        x = e + w[p + "embed_positions.weight"][np.arange(T) + 2]
        ln = lambda v, n: layer_norm(v, w[n + ".weight"], w[n + ".bias"], 1e-5)
        for l in range(L):
            q = p + f"layers.{l}."
            h = ln(x, q + "self_attn_layer_norm") if before else x
            a = attention(lin(h, q + "self_attn.q_proj").reshape(T, H, hd), lin(h, q + "self_attn.k_proj").reshape(T, H, hd),
                          lin(h, q + "self_attn.v_proj").reshape(T, H, hd))
            x = x + lin(a, q + "self_attn.out_proj")
            if not before:
                x = ln(x, q + "self_attn_layer_norm")
            h = ln(x, q + "final_layer_norm") if before else x
            x = x + lin(np.maximum(lin(h, q + "fc1"), 0.0), q + "fc2")
            if not before:
                x = ln(x, q + "final_layer_norm")
        x = x[-1]
        if before:  # the decoder's final LayerNorm exists only with pre-LN
            x = ln(x, p + "final_layer_norm")
        if p + "project_out.weight" in w:
            x = x @ w[p + "project_out.weight"].T
        return x @ w.get("lm_head.weight", w[p + "embed_tokens.weight"]).T
    theta, factor = rope_params(cfg)
    rd = int(hd * factor)
    if mt == "falcon":
        eps = cfg.get("layer_norm_epsilon", 1e-5)
        x = w["transformer.word_embeddings.weight"][ids]
        for l in range(L):
            q = f"transformer.h.{l}."
            h = layer_norm(x, w[q + "input_layernorm.weight"], w[q + "input_layernorm.bias"], eps)
            qkv = lin(h, q + "self_attention.query_key_value").reshape(T, H + 2, hd)
            a = attention(rope(qkv[:, :H], rd, theta), rope(qkv[:, H:H + 1], rd, theta), qkv[:, H + 1:])
            f = lin(gelu_erf(lin(h, q + "mlp.dense_h_to_4h")), q + "mlp.dense_4h_to_h")
            x = x + lin(a, q + "self_attention.dense") + f
        x = layer_norm(x[-1], w["transformer.ln_f.weight"], w["transformer.ln_f.bias"], eps)
        return x @ w.get("lm_head.weight", w["transformer.word_embeddings.weight"]).T
    eps = cfg.get("layer_norm_eps", 1e-5)
    x = w["model.embed_tokens.weight"][ids]
    for l in range(L):
        q = f"model.layers.{l}."
        h = layer_norm(x, w[q + "input_layernorm.weight"], w[q + "input_layernorm.bias"], eps)
        if mt == "phi":
            Hkv = cfg.get("num_key_value_heads") or H
            qs = lin(h, q + "self_attn.q_proj").reshape(T, H, hd)
            ks = lin(h, q + "self_attn.k_proj").reshape(T, Hkv, hd)
            vs = lin(h, q + "self_attn.v_proj").reshape(T, Hkv, hd)
            a = attention(rope(qs, rd, theta), rope(ks, rd, theta), vs)
            f = lin(gelu_tanh(lin(h, q + "mlp.fc1")), q + "mlp.fc2")
            x = x + lin(a, q + "self_attn.dense") + f
        elif mt == "persimmon":
            qkv = lin(h, q + "self_attn.query_key_value").reshape(T, H, 3, hd)
            qs, ks, vs = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
            qs = layer_norm(qs, w[q + "self_attn.q_layernorm.weight"], w[q + "self_attn.q_layernorm.bias"], eps)
            ks = layer_norm(ks, w[q + "self_attn.k_layernorm.weight"], w[q + "self_attn.k_layernorm.bias"], eps)
            a = attention(rope(qs, rd, theta), rope(ks, rd, theta), vs)
            x = x + lin(a, q + "self_attn.dense")
            h = layer_norm(x, w[q + "post_attention_layernorm.weight"], w[q + "post_attention_layernorm.bias"], eps)
            x = x + lin(np.maximum(lin(h, q + "mlp.dense_h_to_4h"), 0.0) ** 2, q + "mlp.dense_4h_to_h")
        else:
            raise SystemExit(f"hf_numpy.py: model_type {mt} is not known")
    x = layer_norm(x[-1], w["model.final_layernorm.weight"], w["model.final_layernorm.bias"], eps)
    logits = x @ w.get("lm_head.weight", w["model.embed_tokens.weight"]).T
    return logits + w["lm_head.bias"] if "lm_head.bias" in w else logits


def save_safetensors(path, tensors):
    """tensors: name -> float32 array; written in name order, little-endian, no metadata"""
    head, off, blobs = {}, 0, []
    for name in sorted(tensors):
        b = np.ascontiguousarray(tensors[name], dtype="<f4").tobytes()
        head[name] = {"dtype": "F32", "shape": list(tensors[name].shape), "data_offsets": [off, off + len(b)]}
        off += len(b)
        blobs.append(b)
    h = json.dumps(head, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def make_opt350m(d):
    """A random OPT-350M-shaped model in folder d: post-LN (do_layer_norm_before false, no final LayerNorm),
    word_embed_proj_dim 32 != hidden_size 64 (project_in / project_out, no bias), 3 layers, 4 heads, d_ffn 256, vocab
    1024, 256 positions, tied classifier. Weights N(0, 0.08), biases N(0, 0.05), LayerNorm weights 1 + N(0, 0.1),
    seed 350; the names and shapes are transformers' OPTForCausalLM's. Writes config.json, model.safetensors and a
    reference.json (prompt, 16 greedy ids, the prompt's last logits) by this file's forward pass."""
    import os
    os.makedirs(d, exist_ok=True)
    D, E, F, L, V, P = 64, 32, 256, 3, 1024, 256
    cfg = {"model_type": "opt", "architectures": ["OPTForCausalLM"], "activation_function": "relu",
           "hidden_size": D, "word_embed_proj_dim": E, "ffn_dim": F, "num_hidden_layers": L,
           "num_attention_heads": 4, "vocab_size": V, "max_position_embeddings": P, "do_layer_norm_before": False,
           "_remove_final_layer_norm": False, "enable_bias": True, "layer_norm_elementwise_affine": True,
           "tie_word_embeddings": True, "bos_token_id": 2, "eos_token_id": 2, "pad_token_id": 1, "dtype": "float32",
           "made_with": "tests/oracle/hf_numpy.py --make-opt350m (NumPy, seed 350)"}
    rng = np.random.default_rng(350)
    g = lambda *shape, s=0.08: rng.normal(0.0, s, shape).astype(np.float32)
    p = "model.decoder."
    w = {p + "embed_tokens.weight": g(V, E), p + "embed_positions.weight": g(P + 2, D),
         p + "project_in.weight": g(D, E, s=0.25), p + "project_out.weight": g(E, D, s=0.25)}
    for l in range(L):
        q = p + f"layers.{l}."
        for n in ("q_proj", "k_proj", "v_proj", "out_proj"):
            w[q + f"self_attn.{n}.weight"] = g(D, D)
            w[q + f"self_attn.{n}.bias"] = g(D, s=0.05)
        w[q + "fc1.weight"], w[q + "fc1.bias"] = g(F, D), g(F, s=0.05)
        w[q + "fc2.weight"], w[q + "fc2.bias"] = g(D, F), g(D, s=0.05)
        for n in ("self_attn_layer_norm", "final_layer_norm"):
            w[q + n + ".weight"] = (1.0 + g(D, s=0.1)).astype(np.float32)
            w[q + n + ".bias"] = g(D, s=0.05)
    json.dump(cfg, open(d + "/config.json", "w"), indent=2)
    save_safetensors(d + "/model.safetensors", w)
    ids = [2] + [int(v) for v in rng.integers(3, V, 7)]
    json.dump({"arch": "opt", "prompt_ids": ids, "greedy_ids": [], "prompt_last_logits": []},
              open(d + "/reference.json", "w"))
    return 0


def main(argv):
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    if argv[1] == "--make-opt350m":
        make_opt350m(argv[2])
        argv = [argv[0], argv[2], "--out", argv[2] + "/reference.json"]
    d = argv[1]
    cfg = json.load(open(d + "/config.json"))
    ref = json.load(open(d + "/reference.json"))
    w = load_safetensors(d + "/model.safetensors")
    if "--perturb" in argv:
        perturb(w)
    w = f64(w)
    ids = list(ref["prompt_ids"])
    last = forward(cfg, w, ids)
    greedy = []
    logits = last
    for _ in range(16):
        greedy.append(int(np.argmax(logits)))
        ids.append(greedy[-1])
        logits = forward(cfg, w, ids)
    ok = greedy == ref["greedy_ids"]
    rel = float(np.abs(last - np.array(ref["prompt_last_logits"])).max() / np.abs(ref["prompt_last_logits"]).max()) \
        if ref["prompt_last_logits"] else math.inf
    if "--check" in argv:
        print(f"{d}: against transformers: prompt's last logits relative max error {rel:.3g}; "
              f"greedy ids {'equal' if ok else 'differ: ' + str(greedy)}")
    if "--out" in argv:
        out = argv[argv.index("--out") + 1]
        json.dump({"prompt_ids": ref["prompt_ids"], "greedy_ids": greedy,
                   "prompt_last_logits": [float(v) for v in last],
                   "made_with": "tests/oracle/hf_numpy.py" + (" --perturb" if "--perturb" in argv else "") +
                                f", NumPy {np.__version__}, float64"}, open(out, "w"))
    return 0 if ("--check" not in argv or (ok and rel < 1e-5)) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
