#!/usr/bin/env bash
# valgrind memcheck over ctest labels (default: unit and contract).
#
#   tests/valgrind.sh [BUILD_DIR] [LABEL_REGEX]
#
# Configures and builds a Debug tree without sanitizers (valgrind and ASan do not mix) and
# without CUDA, NCCL or MPI, then runs every test of the labels under memcheck with the
# arguments and environment ctest would give it: invalid reads and writes, uses of
# uninitialized values, bad frees and definite or indirect leaks all count as errors. Prints
# one line per test and exits non-zero when any test fails or reports an error; each log is
# in BUILD_DIR/valgrind/<test>.log.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build-valgrind}
labels=${2:-'^(unit|contract)$'}
jobs=${VALGRIND_JOBS:-2}

cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Debug -DSELDP_WITH_CUDA=OFF \
    -DSELDP_WITH_NCCL=OFF -DSELDP_WITH_MPI=OFF >/dev/null
build=$(cd "$build" && pwd) # each test runs in its own working directory
mkdir -p "$build/valgrind"
cmake --build "$build" -j "$jobs" >/dev/null
# name, timeout, working directory, then the command line (under `env` with the test's
# environment), one test per line, tab-separated, as ctest would run it
# tests labelled `variant` rerun a program another test already runs under memcheck
ctest --test-dir "$build" -L "$labels" -LE '^variant$' --show-only=json-v1 | python3 -c '
import json, sys
for t in json.load(sys.stdin)["tests"]:
    props = {p["name"]: p["value"] for p in t.get("properties", [])}
    print("\t".join([t["name"], str(int(float(props.get("TIMEOUT", 300)))),
                     props.get("WORKING_DIRECTORY", "."), "env"]
                    + props.get("ENVIRONMENT", []) + t["command"]))
' >"$build/valgrind/tests.tsv"

run_one() {
    local name=$1 timeout=$2 dir=$3
    shift 3
    local log="$build/valgrind/$name.log" start=$SECONDS rc=0
    # "$@" is: env [VAR=value...] program [args...]
    local env=("$1")
    shift
    while [[ $# -gt 0 && $1 == *=* ]]; do
        env+=("$1")
        shift
    done
    # memcheck runs programs 10-50 times slower: scale each test's ctest timeout
    (cd "$dir" && "${env[@]}" timeout $((timeout * 20)) valgrind --tool=memcheck \
        --error-exitcode=99 --leak-check=full --show-leak-kinds=definite,indirect \
        --errors-for-leak-kinds=definite,indirect --fair-sched=yes --num-callers=30 \
        --log-file="$log" "$@" </dev/null >"$log.out" 2>&1) || rc=$?
    local errors
    errors=$(grep -o 'ERROR SUMMARY: [0-9]*' "$log" | tail -1 | grep -o '[0-9]*$' || echo '?')
    printf '%-32s %5ss  exit %-3s  memcheck errors %s\n' "$name" $((SECONDS - start)) "$rc" \
        "$errors"
    [ "$rc" -eq 0 ] && [ "$errors" = 0 ]
}

failed=0
total=0
while IFS=$'\t' read -r -a test; do
    total=$((total + 1))
    run_one "${test[@]}" || failed=$((failed + 1))
done <"$build/valgrind/tests.tsv"
echo "valgrind memcheck: $((total - failed)) of $total tests clean (labels $labels)"
[ "$failed" -eq 0 ]
