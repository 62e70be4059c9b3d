#!/usr/bin/env bash
# The GPU acceptance check (issue: real GPUs), meant for one H200 and under 8 minutes:
#   1. configure a fresh Release build for sm_90 with CUDA and NCCL required, build it
#      (warnings are the CI's business: -Werror stays off so that a new warning in an
#      optimized build cannot hide the GPU results);
#   2. run `ctest -L gpu` (on a machine with a GPU, a skipped GPU test is a failure);
#   3. run the harness on the GPU (NCCL, one rank per GPU) and host-staged with 8 ranks;
#   4. run the benchmark's GPU rows when the benchmark has them;
#   5. print a short table, last.
# Usage: tests/gpu/check.sh [BUILD_DIR]   (default: build-gpucheck in the repository)
# Exit status: 0 when nothing failed (steps the build cannot run are reported NOT RUN).
set -u

repo=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$repo/build-gpucheck}
jobs=$(nproc 2>/dev/null || echo 4)
log=$build-logs
start_all=$(date +%s)

rm -rf "$build" "$log"
mkdir -p "$log"

rows=()
failed=0
# record STEP RESULT SECONDS NOTE
record() {
    rows+=("$1|$2|$3|$4")
    if [ "$2" = FAIL ]; then failed=1; fi
}

# run STEP LIMIT_S COMMAND...: runs under a time limit, output to $log/STEP.log;
# sets $rc and $secs.
run() {
    local step=$1 limit=$2
    shift 2
    local t0
    t0=$(date +%s)
    timeout --signal=TERM --kill-after=10 "$limit" "$@" >"$log/$step.log" 2>&1
    rc=$?
    secs=$(($(date +%s) - t0))
    if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
        echo "[$step] timed out after ${limit}s; last lines:" >&2
        tail -n 20 "$log/$step.log" >&2
    fi
}

gpus=0
if command -v nvidia-smi >/dev/null 2>&1; then
    gpus=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | wc -l)
    nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv 2>/dev/null
fi
echo "GPUs: $gpus, build: $build, logs: $log"

# ---- 1. configure and build ------------------------------------------------------------
run configure 120 cmake -S "$repo" -B "$build" -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_CUDA_ARCHITECTURES=90 -DSELDP_WITH_CUDA=ON -DSELDP_WITH_NCCL=ON -DSELDP_WERROR=OFF
if [ $rc -ne 0 ]; then
    record configure FAIL "$secs" "see $log/configure.log"
    tail -n 30 "$log/configure.log"
else
    record configure ok "$secs" "sm_90, CUDA and NCCL required"
    run build 300 cmake --build "$build" -j "$jobs"
    if [ $rc -ne 0 ]; then
        record build FAIL "$secs" "see $log/build.log"
        grep -E "error|Error" "$log/build.log" | head -n 20
    else
        record build ok "$secs" "Release, -j$jobs"
    fi
fi

# ---- 2. ctest -L gpu ---------------------------------------------------------------------
if [ -d "$build/tests" ]; then
    run ctest 300 ctest --test-dir "$build" -L gpu --output-on-failure --timeout 240
    summary=$(grep -E "tests passed|tests failed" "$log/ctest.log" | tail -n 1)
    skipped=$(grep -c "(Skipped)" "$log/ctest.log")
    if [ $rc -ne 0 ]; then
        record "ctest -L gpu" FAIL "$secs" "$summary"
    elif [ "$gpus" -gt 0 ] && [ "$skipped" -gt 0 ]; then
        record "ctest -L gpu" FAIL "$secs" "$skipped skipped on a machine with a GPU"
    elif [ "$gpus" -eq 0 ]; then
        record "ctest -L gpu" ok "$secs" "no GPU: $skipped skipped"
    else
        record "ctest -L gpu" ok "$secs" "$summary"
    fi
    grep -E "^ *[0-9]+/[0-9]+ Test" "$log/ctest.log"
else
    record "ctest -L gpu" FAIL 0 "no build"
fi

# ---- 3. the harness ----------------------------------------------------------------------
harness=$build/bin/seldp-harness
harness_step() { # NAME NOTE ARGS...
    local name=$1 note=$2
    shift 2
    run "$name" 180 "$harness" --out "$log/$name" --steps 2 --quiet "$@"
    local result
    result=$(tail -n 1 "$log/$name.log")
    if [ $rc -eq 0 ]; then
        record "$name" ok "$secs" "$note"
    elif grep -qiE "unsupported|not (yet )?(supported|available)|refused|no GPU" "$log/$name.log" &&
        [ $rc -eq 2 ]; then
        record "$name" "NOT RUN" "$secs" "harness: ${result:0:60}"
    else
        record "$name" FAIL "$secs" "rc $rc: ${result:0:60}"
    fi
}
if [ ! -x "$harness" ]; then
    record harness "NOT RUN" 0 "no seldp-harness binary"
elif [ "$gpus" -eq 0 ]; then
    record harness "NOT RUN" 0 "no GPU"
else
    world=$((gpus < 8 ? gpus : 8))
    harness_step harness-nccl "NCCL, world $world, one rank per GPU" \
        --backend nccl --world "$world" --ep "$world" --experts 8 --dtype bf16
    harness_step harness-nccl-f32 "NCCL, world $world, fp32 nf4" \
        --backend nccl --world "$world" --ep "$world" --experts 8 --dtype f32 --quant nf4
    harness_step harness-auto "auto backend, world 8 (host-staged past #GPUs)" \
        --backend auto --world 8 --ep 4 --dtype bf16
fi

# ---- 4. the benchmark's GPU rows ---------------------------------------------------------
bench=$build/bin/seldp-bench
if [ ! -x "$bench" ]; then
    record bench-gpu "NOT RUN" 0 "no seldp-bench binary"
elif [ "$gpus" -eq 0 ]; then
    record bench-gpu "NOT RUN" 0 "no GPU"
elif ! "$bench" --help 2>&1 | grep -q -- "--gpu"; then
    record bench-gpu "NOT RUN" 0 "seldp-bench has no --gpu rows"
else
    run bench-gpu 240 "$bench" --gpu
    if [ $rc -eq 0 ]; then
        record bench-gpu ok "$secs" "rows in $log/bench-gpu.log"
        cat "$log/bench-gpu.log"
    else
        record bench-gpu FAIL "$secs" "rc $rc, see $log/bench-gpu.log"
    fi
fi

# ---- 5. the table ------------------------------------------------------------------------
total=$(($(date +%s) - start_all))
echo
printf '%-18s %-8s %6s  %s\n' step result seconds note
printf '%-18s %-8s %6s  %s\n' ------------------ -------- ------ ----------------------------
for row in "${rows[@]}"; do
    IFS='|' read -r step result secs note <<<"$row"
    printf '%-18s %-8s %6s  %s\n' "$step" "$result" "$secs" "$note"
done
printf '%-18s %-8s %6s  %s\n' total "$([ $failed -eq 0 ] && echo ok || echo FAIL)" "$total" \
    "GPUs: $gpus"
exit $failed
