#!/usr/bin/env bash
# ab.sh ROUNDS MODEL LABEL=BIN[:VAR=VALUE ...] ... — decode tokens/s of several builds or settings, interleaved
# (A/B/A/B: on a shared machine the load changes between runs). Each run is
#   BIN bench -m ~/.cache/flashlm/models/MODEL.gguf --modes ram -t ${T:-2} --prompt-tokens 16 --gen-tokens ${G:-32}
# with the environment VAR=VALUE set, and gives 1000 / the median token's total ms. Prints per label the mean and
# every run. Example:
#   bench/ab.sh 4 smollm2-135m main=../main/build/flashlm pool=build/flashlm "omp=build/flashlm:FLASHLM_THREADS=omp"
set -uo pipefail
R=$1; M=$2; shift 2
tmp=$(mktemp -d)
for r in $(seq "$R"); do
  for spec in "$@"; do
    label=${spec%%=*}; rest=${spec#*=}; bin=${rest%%:*}; envs=""; [[ $rest == *:* ]] && envs=${rest#*:}
    rm -f "$tmp/b.json"
    env $envs "$bin" bench -m ~/.cache/flashlm/models/"$M".gguf --modes ram -t "${T:-2}" --prompt-tokens 16 \
      --gen-tokens "${G:-32}" --json "$tmp/b.json" >/dev/null 2>&1
    python3 -c 'import json,sys; r=json.load(open(sys.argv[1]))["modes"][0]; print(sys.argv[2], "%.2f" % (1000/r["median"]["total_ms"]))' \
      "$tmp/b.json" "$label" 2>/dev/null || echo "$label nan"
  done
done | awk '{v[$1]=v[$1]" "$2; s[$1]+=$2; n[$1]++} END {for (k in v) printf "%-12s mean %.2f :%s\n", k, s[k]/n[k], v[k]}'
rm -rf "$tmp"
