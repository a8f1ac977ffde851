#!/bin/sh
# The 64-bit Arm build against the x86-64 one on real models (README "64-bit Arm"): bench/logits_dump evaluates the
# same prompt and 16 greedy tokens in both builds (the arm64 one under qemu-aarch64 -cpu max, at each Arm kernel
# level), and this compares every position's logits (python3, NumPy) and the greedy tokens.
#   scripts/check-arm64-logits.sh [X86_BUILD [ARM64_BUILD]]     (defaults: build, build-arm64)
# For stories260K (tests/data) and SmolLM2-135M (when pulled, ~/.cache/flashlm/models), checks that:
#   - the greedy tokens are identical at every level of both builds;
#   - every position's logits at each Arm level are as close to the x86 build's best level's as that level's are to
#     the x86 scalar reference's (the spread the kernels' contracts allow on x86 itself: int8 products exact, float
#     sums, the FFN activation's polynomial and softmax within float rounding, amplified by the model; limit: 1.5 times
#     that spread, at least 1e-3 of the row's largest |logit|), with the same argmax at every position;
#   - the two builds' scalar reference levels agree within 1e-5 (the same C code; libm's expf may differ by an ulp;
#     measured: bit for bit, on both models).
# Exit 1 on any difference beyond those.
set -eu
X86=${1:-build}
ARM=${2:-build-arm64}
QEMU=$(command -v qemu-aarch64-static || command -v qemu-aarch64 || true)
[ -n "$QEMU" ] || { echo "check-arm64-logits: qemu-aarch64 not found (make cross-arm64 installs it)" >&2; exit 1; }
for b in "$X86/logits_dump" "$ARM/logits_dump"; do
    [ -x "$b" ] || { echo "check-arm64-logits: $b missing (cmake --build ... --target logits_dump)" >&2; exit 1; }
done
tmp=$(mktemp -d /tmp/flashlm-arm64-logits.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fail=0
check() { # name model prompt levels
    name=$1 model=$2 prompt=$3 levels=$4
    [ -f "$model" ] || { echo "$name: $model not found: skipped"; return 0; }
    "$X86/logits_dump" "$model" "$prompt" 16 "$tmp/$name.x86.f32" > "$tmp/$name.x86.txt"
    FLASHLM_KERNELS=scalar "$X86/logits_dump" "$model" "$prompt" 16 "$tmp/$name.x86s.f32" > "$tmp/$name.x86s.txt"
    for lv in $levels; do
        t0=$(date +%s)
        FLASHLM_KERNELS=$lv "$QEMU" -cpu max "$ARM/logits_dump" "$model" "$prompt" 16 "$tmp/$name.$lv.f32" \
            > "$tmp/$name.$lv.txt"
        echo "$name: arm64 $(head -c 40 "$tmp/$name.$lv.txt" | head -1 | cut -d' ' -f2) under qemu: $(( $(date +%s) - t0 )) s"
    done
    echo "$name: x86 $(head -1 "$tmp/$name.x86.txt" | cut -d' ' -f2) greedy text: $(sed -n 3p "$tmp/$name.x86.txt")"
    python3 - "$tmp" "$name" <<'PY' || fail=1
import sys, numpy as np
tmp, name = sys.argv[1], sys.argv[2]
def load(tag):
    lines = open(f"{tmp}/{name}.{tag}.txt", encoding="utf-8", errors="replace").read().split("\n")
    head = lines[0].split()
    n_vocab, pos = int(head[3]), int(head[5])
    return np.fromfile(f"{tmp}/{name}.{tag}.f32", dtype="<f4").reshape(pos, n_vocab), head[1], lines[1]
bad = False
def rel(a, b):
    return float((np.abs(a - b).max(axis=1) / np.abs(b).max(axis=1)).max())
def cmp(tag_a, tag_b, tol):
    global bad
    a, la, ta = load(tag_a)
    b, lb, tb = load(tag_b)
    rel_ab = rel(a, b)
    am = int((a.argmax(axis=1) != b.argmax(axis=1)).sum())
    ok = a.shape == b.shape and rel_ab <= tol and am == 0 and ta == tb
    bad |= not ok
    print(f"{name}: arm64 {la} vs x86 {lb}: max |logit diff| / max |logit| {rel_ab:.3g} (limit {tol:.3g}) over "
          f"{a.shape[0]} positions, argmax differs at {am}, greedy tokens {'identical' if ta == tb else 'DIFFER'}: "
          f"{'ok' if ok else 'FAIL'}")
spread = rel(load("x86")[0], load("x86s")[0])
print(f"{name}: x86 {load('x86')[1]} vs x86 scalar: max |logit diff| / max |logit| {spread:.3g} (the x86 build's own spread)")
import os
for lv in ["scalar", "neon", "dotprod"]:
    if os.path.exists(f"{tmp}/{name}.{lv}.f32"):
        cmp(lv, "x86s", 1e-5) if lv == "scalar" else cmp(lv, "x86", max(1e-3, 1.5 * spread))
sys.exit(1 if bad else 0)
PY
}
# the scalar level of SmolLM2 under qemu takes minutes: set ARM64_LOGITS_LEVELS="scalar neon dotprod" for it
check stories260K tests/data/models/stories260K/stories260K.gguf "Once upon a time" "scalar neon dotprod"
check smollm2-135m "$HOME/.cache/flashlm/models/smollm2-135m.gguf" "The capital of France is" \
    "${ARM64_LOGITS_LEVELS:-neon dotprod}"
[ "$fail" -eq 0 ] && echo "check-arm64-logits: ok" || { echo "check-arm64-logits: FAILED" >&2; exit 1; }
