#!/usr/bin/env bash
# serve_ab.sh — aggregate tokens/s of `flashlm serve --parallel 4` with 1, 2 and 4 concurrent clients (issue 31),
# each phase `serve_load.py URL --clients N --requests REQ --max-tokens TOK --stream`.
#
#   bench/serve_ab.sh ram BIN GGUF LLAMA_SERVER [ROUNDS REQ TOK]
#       in RAM: each round starts flashlm serve, then llama-server (-np 4), on the same GGUF with -c 2048 -t 2, one
#       warm-up request, then 4, 2 and 1 clients; prints each server's tokens/s per round and the 4-client ratio
#       (A/B/A/B: the load of a shared machine changes between runs). Defaults: 3 rounds, 12 requests, 48 tokens.
#   bench/serve_ab.sh flash BIN FLM [MEM ROUNDS REQ TOK]
#       from flash: one flashlm serve at --mem MEM (default 50%), rounds of 4, 2 and 1 clients alternating, with
#       the MB read from flash per generated token of each phase (/metrics). Defaults: 3 rounds, 4 requests, 32.
# PORT (default 8391) is the port used.
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
PORT=${PORT:-8391}
URL=http://127.0.0.1:$PORT
wait_up() { # PID: until the server answers /health, or it exits, or 300 s pass
  for _ in $(seq 300); do
    curl -s "$URL/health" | grep -q ok && return 0
    kill -0 "$1" 2> /dev/null || break
    sleep 1
  done
  echo "the server did not start (see /tmp/serve_ab.log)" >&2; return 1; }
load() { python3 "$HERE/serve_load.py" --clients "$1" --requests "$2" --max-tokens "$3" --stream "$URL" |
         grep -o '[0-9.]* generated tokens/s' | awk '{print $1}'; }
metric() { curl -s "$URL/metrics" | awk -v k="$1" '$1 == k {print $2}'; }
mode=${1:?usage: serve_ab.sh ram|flash ...}
if [ "$mode" = ram ]; then
  BIN=$2; G=$3; LS=$4; R=${5:-3}; Q=${6:-12}; T=${7:-48}
  one() {
    "${@:2}" > /tmp/serve_ab.log 2>&1 &
    local pid=$!
    wait_up $pid || { kill $pid 2> /dev/null; return 1; }
    python3 "$HERE/serve_load.py" --clients 1 --requests 1 --max-tokens 8 "$URL" > /dev/null
    local a b c
    a=$(load 4 "$Q" "$T"); b=$(load 2 "$Q" "$T"); c=$(load 1 "$Q" "$T")
    kill $pid; wait $pid 2> /dev/null
    echo "$1 $a $b $c"
  }
  for r in $(seq "$R"); do
    f=$(one flashlm "$BIN" serve -m "$G" --parallel 4 -c 2048 -t 2 --port "$PORT")
    l=$(one llama-server "$LS" -m "$G" -np 4 -c 2048 -t 2 --port "$PORT")
    [ -n "$f" ] && [ -n "$l" ] || { echo "round $r: a server did not start (see /tmp/serve_ab.log)" >&2; continue; }
    echo "$f" | awk '{printf "round '"$r"' flashlm      4: %7.2f  2: %7.2f  1: %7.2f tok/s  4/1 %.2f\n", $2, $3, $4, $2 / $4}'
    echo "$l" | awk '{printf "round '"$r"' llama-server 4: %7.2f  2: %7.2f  1: %7.2f tok/s  4/1 %.2f\n", $2, $3, $4, $2 / $4}'
    paste -d' ' <(echo "$f") <(echo "$l") | awk '{printf "round '"$r"' flashlm / llama-server with 4 clients: %.2f\n", $2 / $6}'
  done
elif [ "$mode" = flash ]; then
  BIN=$2; M=$3; MEM=${4:-50%}; R=${5:-3}; Q=${6:-4}; T=${7:-32}
  "$BIN" serve -m "$M" --mem "$MEM" --parallel 4 -c 2048 -t 2 --port "$PORT" --metrics > /tmp/serve_ab.log 2>&1 &
  pid=$!
  wait_up $pid || { kill $pid 2> /dev/null; exit 1; }
  phase() {
    local b0 t0 tps b1 t1
    b0=$(metric flashlm_flash_bytes_read_total); t0=$(metric flashlm_tokens_generated_total)
    tps=$(load "$1" "$Q" "$T")
    b1=$(metric flashlm_flash_bytes_read_total); t1=$(metric flashlm_tokens_generated_total)
    echo "$1 $tps $(awk -v b=$((b1 - b0)) -v t=$((t1 - t0)) 'BEGIN {printf "%.1f", b / 1e6 / (t > 0 ? t : 1)}')"
  }
  for r in $(seq "$R"); do phase 4; phase 2; phase 1; done |
    awk '{s[$1] += $2; n[$1]++; v[$1] = v[$1] " " $2; m[$1] = m[$1] " " $3}
         END {for (k = 4; k >= 1; k /= 2) printf "%d clients: mean %.2f tok/s (%s); MB read per generated token%s\n", k, s[k] / n[k], v[k], m[k];
              printf "4 clients / 1 client: %.2f\n", (s[4] / n[4]) / (s[1] / n[1])}'
  kill $pid; wait $pid 2> /dev/null
else
  echo "usage: serve_ab.sh ram BIN GGUF LLAMA_SERVER [ROUNDS REQ TOK] | flash BIN FLM [MEM ROUNDS REQ TOK]" >&2; exit 2
fi
