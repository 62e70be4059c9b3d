#!/usr/bin/env bash
# The GPU acceptance check (issue: real GPUs), meant for one H200 and under 8 minutes:
#   1. configure a fresh Release build for sm_90 with CUDA and NCCL required, build it
#      (warnings are the CI's business: -Werror stays off so that a new warning in an
#      optimized build cannot hide the GPU results);
#   2. check that the driver can run this build's CUDA (a GPU the driver shows but CUDA
#      cannot use is a FAIL, never a skip);
#   3. run `ctest -L gpu` (on a machine with a GPU, a skipped GPU test is a failure) and
#      check that every GPU test named below ran and passed; among them gpu_host_staged and
#      gpu_nccl_world run a session whose initialize and reductions use several 64-byte
#      buckets per dtype, with gradients from the caller's own stream;
#   4. run the harness on the GPU (NCCL, one rank per GPU) and host-staged with 8 ranks;
#   5. run the MPI+NCCL path under mpirun: the mpi_nccl test program with one process, and
#      the harness with one process per GPU, each given its own CUDA_VISIBLE_DEVICES as
#      SLURM and most launchers do;
#   6. run the benchmark's GPU rows when the benchmark has them;
#   7. print a short table, last.
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

# ---- 2. the driver ----------------------------------------------------------------------
# nvidia-smi's header names the newest CUDA the driver supports; the toolkit's major version
# must not be newer (CUDA's minor-version compatibility covers the rest).
if [ "$gpus" -gt 0 ]; then
    driver_cuda=$(nvidia-smi 2>/dev/null | sed -n 's/.*CUDA Version: *\([0-9][0-9.]*\).*/\1/p' | head -n 1)
    nvcc_bin=$(sed -n 's/^CMAKE_CUDA_COMPILER:[A-Z]*=//p' "$build/CMakeCache.txt" 2>/dev/null)
    toolkit_cuda=$("${nvcc_bin:-nvcc}" --version 2>/dev/null | sed -n 's/.*release \([0-9][0-9.]*\).*/\1/p')
    driver_version=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -n 1)
    if [ -z "$driver_cuda" ] || [ -z "$toolkit_cuda" ]; then
        record driver FAIL 0 "cannot tell: driver CUDA '${driver_cuda}', toolkit '${toolkit_cuda}'"
    elif [ "${driver_cuda%%.*}" -lt "${toolkit_cuda%%.*}" ]; then
        record driver FAIL 0 "driver $driver_version runs CUDA <= $driver_cuda; build is CUDA $toolkit_cuda"
        echo "FAIL: the NVIDIA driver $driver_version supports CUDA $driver_cuda, older than the" \
            "CUDA $toolkit_cuda this build uses: every GPU test would fail (install a newer driver)" >&2
    else
        record driver ok 0 "driver $driver_version (CUDA $driver_cuda), toolkit CUDA $toolkit_cuda"
    fi
fi

# ---- 3. ctest -L gpu ---------------------------------------------------------------------
# Every test of the gpu label; each must run and pass on a machine with a GPU.
gpu_tests="gpu_half_bits gpu_cast gpu_host_staged gpu_nccl_world gpu_nccl_reduce gpu_tinymoe harness_gpu gpu_shard"
if [ -d "$build/tests" ]; then
    run ctest 300 ctest --test-dir "$build" -L gpu --output-on-failure --timeout 240
    summary=$(grep -E "tests passed|tests failed" "$log/ctest.log" | tail -n 1)
    skipped=$(grep -c "(Skipped)" "$log/ctest.log")
    missing=""
    for t in $gpu_tests; do
        grep -qE "Test +#[0-9]+: $t \.+ +Passed" "$log/ctest.log" || missing="$missing $t"
    done
    if [ $rc -ne 0 ]; then
        record "ctest -L gpu" FAIL "$secs" "$summary"
    elif [ "$gpus" -gt 0 ] && [ "$skipped" -gt 0 ]; then
        record "ctest -L gpu" FAIL "$secs" "$skipped skipped on a machine with a GPU"
    elif [ "$gpus" -eq 0 ]; then
        record "ctest -L gpu" ok "$secs" "no GPU: $skipped skipped"
    elif [ -n "$missing" ]; then
        record "ctest -L gpu" FAIL "$secs" "did not pass:$missing"
    else
        record "ctest -L gpu" ok "$secs" "$summary"
    fi
    grep -E "^ *[0-9]+/[0-9]+ Test" "$log/ctest.log"
else
    record "ctest -L gpu" FAIL 0 "no build"
fi

# ---- 4. the harness ----------------------------------------------------------------------
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

# ---- 5. MPI + NCCL under mpirun -----------------------------------------------------------
mpirun_bin=$(command -v mpirun || true)
mpi_env=(env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    OMPI_MCA_rmaps_base_oversubscribe=1)
if [ -z "$mpirun_bin" ]; then
    record mpi-nccl "NOT RUN" 0 "no mpirun"
elif [ "$gpus" -eq 0 ]; then
    record mpi-nccl "NOT RUN" 0 "no GPU"
elif [ ! -x "$build/tests/mpi_nccl" ]; then
    record mpi-nccl FAIL 0 "no mpi_nccl test program (a build without MPI?)"
else
    run mpi-nccl 120 "${mpi_env[@]}" "$mpirun_bin" -np 1 "$build/tests/mpi_nccl"
    if [ $rc -eq 0 ]; then
        record mpi-nccl ok "$secs" "mpirun -np 1: NCCL bootstrapped over MPI"
    else
        record mpi-nccl FAIL "$secs" "rc $rc, see $log/mpi-nccl.log"
        tail -n 20 "$log/mpi-nccl.log"
    fi
    if [ -x "$harness" ]; then
        # one GPU per process, as SLURM gives it: each process sees only its own, as cuda:0
        nproc_gpu=$((gpus < 8 ? gpus : 8))
        run harness-mpi-nccl 180 "${mpi_env[@]}" "$mpirun_bin" -np "$nproc_gpu" sh -c \
            'CUDA_VISIBLE_DEVICES=${OMPI_COMM_WORLD_LOCAL_RANK:-0} exec "$0" "$@"' \
            "$harness" --out "$log/harness-mpi-nccl" --steps 2 --quiet --backend nccl \
            --ep "$nproc_gpu" --experts 8 --dtype bf16
        if [ $rc -eq 0 ]; then
            record harness-mpi-nccl ok "$secs" "mpirun -np $nproc_gpu, CUDA_VISIBLE_DEVICES per rank"
        else
            record harness-mpi-nccl FAIL "$secs" "rc $rc, see $log/harness-mpi-nccl.log"
            tail -n 20 "$log/harness-mpi-nccl.log"
        fi
    fi
fi

# ---- 6. the benchmark's GPU rows ---------------------------------------------------------
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

# ---- 7. the table ------------------------------------------------------------------------
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
