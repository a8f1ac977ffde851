#!/bin/sh
# Instructions per 256 weights of each aarch64 vec_dot kernel, counted under qemu (no TCG plugins in Debian's static
# qemu-user): qemu-aarch64 -singlestep -d exec,nochain logs one line per guest instruction executed; bench/kernel_instr
# runs LEVEL's vec_dot of TYPE over REPS rows of 4096 weights, so (count(R2) - count(R1)) / ((R2 - R1) * 16) is the
# kernel's instructions per 256 weights (start-up and the activation's quantization cancel out).
#   bench/arm64_instr.sh [ARM64_BUILD] [LEVELS] [TYPES]    (defaults: build-arm64, "scalar neon dotprod", all)
set -eu
B=${1:-build-arm64}
LEVELS=${2:-scalar neon dotprod}
TYPES=${3:-q4_0 q4_1 q5_0 q5_1 q8_0 q2_k q3_k q4_k q5_k q6_k f16 f32}
QEMU=$(command -v qemu-aarch64-static || command -v qemu-aarch64)
log=$(mktemp /tmp/flashlm-arm64-instr.XXXXXX)
trap 'rm -f "$log"' EXIT
count() { # level type reps
    "$QEMU" -cpu max -singlestep -d exec,nochain -D "$log" "$B/kernel_instr" "$1" "$2" "$3" >/dev/null
    grep -c '^Trace' "$log"
}
printf '%-8s' type
for l in $LEVELS; do printf ' %8s' "$l"; done
echo
for t in $TYPES; do
    printf '%-8s' "$t"
    for l in $LEVELS; do
        a=$(count "$l" "$t" 2) b=$(count "$l" "$t" 6)
        printf ' %8.1f' "$(echo "($b - $a) / 64" | bc -l)"
    done
    echo
done
