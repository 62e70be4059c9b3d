#!/usr/bin/env bash
# Run every libFuzzer target for SECONDS from its committed seed corpus.
#
#   tests/fuzz/run.sh BUILD_DIR [SECONDS]
#
# BUILD_DIR holds the targets (configure tests/fuzz with clang, see CMakeLists.txt). Inputs the
# fuzzer adds go to BUILD_DIR/corpus/<target> (the committed seeds are only read); a crash,
# leak, sanitizer report or timeout stops the target, leaves the input in
# BUILD_DIR/artifacts/<target>/ and makes this script fail. One summary line per target.
set -uo pipefail
build=${1:?usage: run.sh BUILD_DIR [SECONDS]}
seconds=${2:-30}
here=$(cd "$(dirname "$0")" && pwd)
status=0
for target in manifest layout safetensors megatron toml deepspeed groups sweep; do
    exe="$build/fuzz_$target"
    work="$build/corpus/$target"
    artifacts="$build/artifacts/$target"
    log="$build/fuzz_$target.log"
    mkdir -p "$work" "$artifacts"
    case $target in
        manifest) dict=manifest.dict; max_len=4096 ;;
        layout) dict=json.dict; max_len=4096 ;;
        safetensors) dict=json.dict; max_len=8192 ;;
        megatron) dict=megatron.dict; max_len=8192 ;;
        toml) dict=toml.dict; max_len=4096 ;;
        deepspeed | groups | sweep) dict=json.dict; max_len=8192 ;;
    esac
    "$exe" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len="$max_len" \
        -dict="$here/$dict" -artifact_prefix="$artifacts/" -print_final_stats=1 \
        "$work" "$here/corpus/$target" >"$log" 2>&1
    rc=$?
    runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$')
    cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1)
    found=$(ls "$artifacts" | wc -l)
    printf 'fuzz_%-12s %3ss  %10s runs  %s  corpus %s  findings %s  exit %s\n' "$target" \
        "$seconds" "${runs:-?}" "${cov:-cov: ?}" "$(ls "$work" | wc -l)" "$found" "$rc"
    if [ "$rc" -ne 0 ] || [ "$found" -ne 0 ]; then
        status=1
        grep -m1 -A25 -E 'ERROR: |runtime error|==ERROR|deadly signal|timeout after' "$log" || tail -30 "$log"
    fi
done
exit $status
