#!/bin/sh
# run.sh BUILD SECONDS [TARGET...] — run each libFuzzer target of BUILD (configured with -DFLASHLM_FUZZ=ON, target
# fuzz_targets built) for SECONDS under ASan+UBSan on the seeds of make_seeds.sh, and fail on any finding.
#   BUILD/fuzz-seeds/fuzz_NAME   the seeds, made again each run
#   BUILD/fuzz-corpus/fuzz_NAME  what libFuzzer found interesting, kept between runs (delete it to start over)
#   BUILD/fuzz-artifacts/        crash-*, leak-*, timeout-*, oom-* inputs of a finding: copy each one to
#                                tests/fuzz/regress/fuzz_NAME/ once it is fixed, so CTest replays it
# Prints the executions per target (libFuzzer's stat::number_of_executed_units).
set -u
[ $# -ge 2 ] || { echo "usage: $0 BUILD SECONDS [TARGET...]" >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "$1" && pwd)
secs=$2
shift 2
targets=${*:-gguf flm tokenizer chat probe sparsity safetensors serve serve_http hf}
"$here/make_seeds.sh" "$build/flashlm" "$build/fuzz-seeds" || exit 1
mkdir -p "$build/fuzz-artifacts"
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
fail=0
summary=""
for t in $targets; do
    bin=$build/tests/fuzz/fuzz_$t
    [ -x "$bin" ] || { echo "run.sh: $bin is not built (cmake --build $build --target fuzz_targets)" >&2; exit 1; }
    mkdir -p "$build/fuzz-corpus/fuzz_$t"
    log=$build/fuzz-artifacts/fuzz_$t.log
    echo "== fuzz_$t: $secs s"
    nice -n 10 "$bin" -max_total_time="$secs" -timeout=20 -rss_limit_mb=4096 -print_final_stats=1 \
        -artifact_prefix="$build/fuzz-artifacts/fuzz_$t-" "$build/fuzz-corpus/fuzz_$t" "$build/fuzz-seeds/fuzz_$t" \
        >"$log" 2>&1
    rc=$?
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    # A timeout that the input does not reproduce is the machine stalling (a shared VM paused for seconds: libFuzzer
    # then sees one unit "run" for longer than -timeout), not a hang: replay the input 3 times under the same
    # timeout, and only a replay that times out or fails again is a finding.
    unit=$(sed -n "s/.*Test unit written to \(.*fuzz_$t-timeout-[0-9a-f]*\).*/\1/p" "$log" | tail -1)
    if [ $rc -ne 0 ] && [ -n "$unit" ] && grep -q "ERROR: libFuzzer: timeout" "$log"; then
        again=0
        for i in 1 2 3; do
            "$bin" -timeout=20 -rss_limit_mb=4096 "$unit" >>"$log.replay" 2>&1 || again=1
        done
        if [ $again -eq 0 ]; then
            echo "fuzz_$t: a unit passed the 20 s timeout, but its input ($unit) ran in time in 3 replays:" \
                 "the machine stalled; not a finding (log: $log)"
            mv "$unit" "$unit.stall"
            rc=0
        fi
    fi
    if [ $rc -ne 0 ]; then
        fail=1
        tail -60 "$log"
        summary="$summary
fuzz_$t: FINDING (exit $rc) after ${execs:-?} executions; see $log and $build/fuzz-artifacts/"
    else
        summary="$summary
fuzz_$t: ${execs:-?} executions in $secs s, no finding"
    fi
done
echo "$summary"
exit $fail
