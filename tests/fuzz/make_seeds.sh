#!/bin/sh
# make_seeds.sh FLASHLM OUTDIR — the seed corpora of the fuzz targets, built at run time (models are never
# committed): OUTDIR/fuzz_NAME/ gets the committed seeds of tests/fuzz/seeds/fuzz_NAME plus
#   fuzz_gguf       tiny synthetic models (flashlm synth), the first 16 KiB of stories260K (tests/data) and the first
#                   64 KiB of every pulled model (their headers: metadata, the start of the vocabulary)
#   fuzz_flm        the tiny models converted (flashlm convert), one calibrated, each with control bytes that fix the
#                   checksums and open a context in ram / naive / hybrid / sparse mode (fuzz_flm.c)
#   fuzz_sparsity   the predictor region of the calibrated tiny model
#   fuzz_chat       tokenizer.chat_template of every pulled model
#   fuzz_tokenizer  lines of tests/data/text for every tokenizer index, with and without special-token parsing
#   fuzz_safetensors the head of tests/data/hf-tiny's OPT model.safetensors
#   fuzz_serve      only its committed seeds (requests as OpenAI's SDK sends them)
#   fuzz_serve_http, fuzz_hf   only their committed seeds (request heads; crafted Hugging Face folders)
# the fixtures are tests/data (FLM_DATA_DIR overrides); the model cache is flashlm pull's.
set -eu
[ $# -eq 2 ] || { echo "usage: $0 FLASHLM OUTDIR" >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
flm=$1
out=$2
data=${FLM_DATA_DIR:-$here/../data}
if [ -n "${FLASHLM_CACHE:-}" ]; then cache=$FLASHLM_CACHE; else cache=${XDG_CACHE_HOME:-$HOME/.cache}/flashlm; fi
tool="python3 $here/seedtool.py"
work=$out/.work
mkdir -p "$work"
for t in gguf flm tokenizer chat probe sparsity safetensors serve serve_http hf; do
    mkdir -p "$out/fuzz_$t"
    [ -d "$here/seeds/fuzz_$t" ] && cp "$here/seeds/fuzz_$t/"* "$out/fuzz_$t/" 2>/dev/null || true
done

# tiny synthetic models: a ReLU q8_0 one and a SiLU f16 one with grouped-query attention
"$flm" synth "$work/tiny.gguf" --d-model 32 --d-ffn 64 --layers 2 --heads 2 --vocab 259 --type q8_0 --calib 8 \
    -f >/dev/null 2>&1
"$flm" synth "$work/tiny-silu.gguf" --d-model 32 --d-ffn 32 --layers 1 --heads 4 --kv-heads 2 --vocab 259 \
    --type f16 --act silu --calib 8 -f >/dev/null 2>&1
cp "$work/tiny.gguf" "$work/tiny-silu.gguf" "$out/fuzz_gguf/"
stories=$data/models/stories260K/stories260K.gguf
[ -f "$stories" ] && head -c 16384 "$stories" > "$out/fuzz_gguf/stories260K-16k"
for m in smollm2-135m gemma-3-270m qwen2.5-coder-0.5b qwen2.5-coder-1.5b; do
    g=$cache/models/$m.gguf
    [ -f "$g" ] || continue
    head -c 65536 "$g" > "$out/fuzz_gguf/$m-64k"
    $tool chat-template "$g" "$out/fuzz_chat/$m"
done

# .flm files: control byte bit 0 = fix checksums, bits 1-3 = mode, bit 4 = no O_DIRECT (fuzz_flm.c)
"$flm" convert "$work/tiny.gguf" "$work/tiny.flm" --force >/dev/null 2>&1
"$flm" convert "$work/tiny-silu.gguf" "$work/tiny-silu.flm" --force >/dev/null 2>&1
cp "$work/tiny.flm" "$work/tiny-cal.flm"
text=$data/text/tinystories_sample.txt
[ -f "$text" ] || text=$here/seeds/fuzz_tokenizer/t0-00
"$flm" calibrate "$work/tiny-cal.flm" --text "$text" >/dev/null 2>&1 || true
for ctl in 00 01 03 05 07 0b 15 17; do
    $tool prefix $ctl "$work/tiny.flm" "$out/fuzz_flm/tiny-$ctl"
    $tool prefix $ctl "$work/tiny-silu.flm" "$out/fuzz_flm/tiny-silu-$ctl"
done
for ctl in 01 09; do $tool prefix $ctl "$work/tiny-cal.flm" "$out/fuzz_flm/tiny-cal-$ctl"; done
$tool region "$work/tiny-cal.flm" 3 "$out/fuzz_sparsity/tiny-cal"

# tokenizer inputs: byte 0 = tokenizer index, byte 1 = flags (fuzz_tokenizer.c)
p=""
for i in 00 01 02 03 04 05 06 07 08 09 0a 0b; do p="$p${p:+,}${i}00,${i}02"; done
for f in sentences.txt wiki.test.raw; do
    [ -f "$data/text/$f" ] && mkdir -p "$work/lines-$f" && $tool lines 4 "$p" "$data/text/$f" "$work/lines-$f" &&
        cp "$work/lines-$f/"* "$out/fuzz_tokenizer/"
done
# safetensors: the tiny OPT of tests/data/hf-tiny, its first 4 KiB (the header and some data) and whole
opt=$data/hf-tiny/opt-125m-style/model.safetensors
[ -f "$opt" ] && head -c 4096 "$opt" > "$out/fuzz_safetensors/opt-tiny-4k"
rm -rf "$work"
for t in gguf flm tokenizer chat probe sparsity safetensors serve serve_http hf; do
    echo "make_seeds: fuzz_$t: $(ls "$out/fuzz_$t" | wc -l) seeds"
done
