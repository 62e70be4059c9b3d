#!/usr/bin/env bash
# tests/gpu/check.sh's logic without a GPU machine: every program it calls (nvidia-smi, nvcc,
# cmake, ctest, the harness, the benchmark) is a stub in a folder put first on PATH, told
# what to answer by STUB_* variables, and a one-package kit is made with dpkg-deb. Checks:
#   no GPU        the probe line first; the kit unpacked into the build folder and its .pc
#                 files pointed at it; CMake pointed at the kit and at NCCL, only gpu-check
#                 built; every GPU row NOT RUN with the reason, MPI rows NOT RUN in a build
#                 without MPI; each row printed as recorded and the table again at the end;
#                 $OUT holds the table, the console and every log (at most 8 files, none in
#                 a folder); NCCL_DEBUG=WARN reaches the tests
#   rerun         the build folder and the unpacked kit kept; --clean removes them
#   a failure     a FAIL row with the reason, the last lines of its log on the console,
#                 exit status 1
#   with a GPU    a test skipped whole fails, one that skips inside is named, a refused
#                 NCCL harness run fails in a build that requires NCCL, the driver row
#   the budget    a hanging step is cut at what is left, the steps after it NOT RUN, and the
#                 whole run stays within its budget
# Exit status: 0 when every check holds; 77 (skipped) without dpkg-deb.
set -u
here=$(cd "$(dirname "$0")" && pwd)
check_sh=$here/check.sh
command -v dpkg-deb >/dev/null || {
    echo "no dpkg-deb: skipped"
    exit 77
}
tmp=$(mktemp -d)
trap '[ -n "${KEEP_TMP:-}" ] || rm -rf "$tmp"' EXIT
failures=0
passes=0
expect() { # DESCRIPTION COMMAND...: the command must succeed
    local what=$1
    shift
    if "$@" >/dev/null 2>&1; then
        passes=$((passes + 1))
        echo "ok      $what"
    else
        echo "FAILED  $what"
        failures=$((failures + 1))
    fi
}
row() { # FILE STEP RESULT NOTE_PART: a row line with that result and note
    grep -E "^$2 +$3 +[0-9]+  .*$4" "$1"
}

# ---- the stubs -----------------------------------------------------------------------------

bin=$tmp/bin
mkdir -p "$bin"
cat >"$bin/nvidia-smi" <<'EOF'
#!/usr/bin/env bash
[ "${STUB_GPUS:-0}" -gt 0 ] || exit 9
case "$*" in
*--query-gpu=name*) for i in $(seq "$STUB_GPUS"); do echo "NVIDIA H200"; done ;;
*--query-gpu=driver_version*) echo "580.65.06" ;;
*) echo "| NVIDIA-SMI 580.65.06   Driver Version: 580.65.06   CUDA Version: 13.0 |" ;;
esac
EOF
cat >"$bin/nvcc" <<'EOF'
#!/usr/bin/env bash
echo "Cuda compilation tools, release 13.0, V13.0.88"
EOF
cat >"$bin/cmake" <<'EOF'
#!/usr/bin/env bash
# configure: the cache and the summary lines; --build: the programs of the fake build
echo "cmake $*" >>"$STUB_LOG"
case $1 in
--version) echo "cmake version 3.28.3" ;;
--build)
    [ "${STUB_BUILD_RC:-0}" -eq 0 ] || { echo "error: the stub build failed"; exit 1; }
    mkdir -p "$2/bin" "$2/tests"
    cp "$STUB_DIR/seldp-harness" "$STUB_DIR/seldp-bench" "$2/bin/" ;;
*)
    while [ $# -gt 0 ]; do [ "$1" = -B ] && b=$2; shift; done
    mkdir -p "$b"
    echo "CMAKE_CUDA_COMPILER:FILEPATH=$STUB_DIR/../bin/nvcc" >"$b/CMakeCache.txt"
    echo "--   transport/CUDA        compiled"
    [ "${STUB_NCCL:-1}" -eq 1 ] && echo "--   transport/NCCL        compiled"
    [ "${STUB_MPI:-0}" -eq 1 ] && echo "--   transport/MPI         compiled"
    echo "-- Build files have been written to: $b" ;;
esac
EOF
cat >"$bin/ctest" <<'EOF'
#!/usr/bin/env bash
# -N: the list; -R ^name$: the test, as STUB_CTEST_<name> says (pass, fail, skip, inside, hang)
echo "ctest $* NCCL_DEBUG=${NCCL_DEBUG:-unset}" >>"$STUB_LOG"
name=""
for a in "$@"; do
    [ "$a" = -N ] && { for t in ${STUB_TESTS:-gpu_half_bits gpu_cast gpu_host_staged gpu_nccl_world gpu_nccl_reduce gpu_tinymoe harness_gpu gpu_shard}; do echo "  Test  #1: $t"; done; exit 0; }
    case $a in ^*\$) name=${a#^}; name=${name%\$} ;; esac
done
var=STUB_CTEST_$name
case ${!var:-pass} in
pass) echo "1/1 Test #1: $name ....   Passed    0.10 sec"; echo "100% tests passed, 0 tests failed out of 1" ;;
inside) echo "[  SKIPPED ] test_missing_rank_times_out"
    echo "1/1 Test #1: $name ....   Passed    0.10 sec" ;;
skip) echo "no CUDA device: skipped"; echo "1/1 Test #1: $name ....***Skipped   0.01 sec" ;;
fail) for i in $(seq 40); do echo "noise line $i"; done
    echo "[  ERROR   ] --- the failing assertion at line 42"
    echo "1/1 Test #1: $name ....***Failed    0.10 sec"; exit 8 ;;
hang) sleep 100 ;;
esac
EOF
stubs=$tmp/stubs
mkdir -p "$stubs"
cat >"$stubs/seldp-harness" <<'EOF'
#!/usr/bin/env bash
echo "seldp-harness $*" >>"$STUB_LOG"
if [ "${STUB_HARNESS:-pass}" = refuse ] && [[ " $* " == *" --backend nccl "* ]]; then
    echo "seldp-harness: --backend nccl: refused: seldp was built without NCCL"
    exit 2
fi
echo "PASS"
EOF
cat >"$stubs/seldp-bench" <<'EOF'
#!/usr/bin/env bash
[ "$1" = --help ] && { echo "      --gpu             the GPU rows"; exit 0; }
echo "nccl-raw allreduce 64M 1.0 ms"
EOF
chmod +x "$bin"/* "$stubs"/*

# a one-package kit: cmocka's header and its .pc file, which names /usr
pkg=$tmp/pkg
mkdir -p "$pkg/DEBIAN" "$pkg/usr/include" "$pkg/usr/lib/x86_64-linux-gnu/pkgconfig" "$tmp/kit"
printf 'Package: libcmocka-dev\nVersion: 1.1.5-2.1\nArchitecture: amd64\nMaintainer: none\nDescription: stub\n' \
    >"$pkg/DEBIAN/control"
echo "/* stub */" >"$pkg/usr/include/cmocka.h"
printf 'prefix=/usr\nName: cmocka\nVersion: 1.1.5\nLibs: -L/usr/lib/x86_64-linux-gnu -lcmocka\nCflags: -I/usr/include\n' \
    >"$pkg/usr/lib/x86_64-linux-gnu/pkgconfig/cmocka.pc"
dpkg-deb -b "$pkg" "$tmp/kit/libcmocka-dev_1.1.5-2.1_amd64.deb" >/dev/null
deb=$tmp/kit/libcmocka-dev_1.1.5-2.1_amd64.deb
echo "libcmocka-dev 1.1.5-2.1 amd64 $(stat -c %s "$deb") $(sha256sum "$deb" | cut -d' ' -f1) $(basename "$deb")" \
    >"$tmp/kit/MANIFEST"

# an NCCL as the wheel lays it out
mkdir -p "$tmp/nccl/include" "$tmp/nccl/lib"
printf '#define NCCL_MAJOR 2\n#define NCCL_MINOR 28\n#define NCCL_PATCH 9\n' >"$tmp/nccl/include/nccl.h"
touch "$tmp/nccl/lib/libnccl.so.2"

export STUB_LOG=$tmp/stub.log STUB_DIR=$stubs
# check NAME ARGS...: check.sh with the stubs first on PATH, its output in $tmp/NAME.txt,
# its $OUT in $tmp/NAME.out; sets rc and took
check() {
    local name=$1
    shift
    local t0=$SECONDS
    : >"$STUB_LOG"
    env -u NCCL_DEBUG PATH="$bin:$PATH" OUT="$tmp/$name.out" bash "$check_sh" --kit "$tmp/kit" \
        --nccl "$tmp/nccl" "$@" >"$tmp/$name.txt" 2>&1
    rc=$?
    took=$((SECONDS - t0))
}

# ---- no GPU ----------------------------------------------------------------------------------

b=$tmp/build
check nogpu --build "$b" --budget 120
t=$tmp/nogpu.txt
expect "no GPU: exit 0" test "$rc" -eq 0
expect "the probe line comes first" bash -c "head -n 1 '$t' | grep -q '^probe: nvcc 13.0 | cmake 3.28.3 | BLAS none | cmocka kit 1.1.5-2.1 |.*NCCL 2.28.9 (given $tmp/nccl).*GPU nvidia-smi shows no GPU'"
expect "the kit unpacked into the build folder" test -f "$b/kit/usr/include/cmocka.h"
expect "its .pc file points at the prefix" grep -q "^Cflags: -I$b/kit/usr/include\$" "$b/kit/usr/lib/x86_64-linux-gnu/pkgconfig/cmocka.pc"
expect "CMake pointed at the kit" grep -q -- "-DCMAKE_PREFIX_PATH=$b/kit/usr .*-DPKG_CONFIG_EXECUTABLE=$b/kit/usr/bin/pkgconf" "$STUB_LOG"
expect "CMake pointed at NCCL, required" grep -q -- "-DSELDP_WITH_NCCL=ON -DNCCL_ROOT=$tmp/nccl" "$STUB_LOG"
expect "only gpu-check built" grep -q -- "^cmake --build $b --target gpu-check -j" "$STUB_LOG"
expect "the kit row" row "$t" kit ok "1 packages in $b/kit"
expect "the host-only test ran" row "$t" gpu_half_bits ok "passed"
for s in driver gpu_cast gpu_host_staged gpu_nccl_world gpu_nccl_reduce gpu_tinymoe harness_gpu gpu_shard \
    harness-nccl harness-nccl-f32 harness-auto bench-gpu; do
    expect "$s NOT RUN, no GPU" row "$t" "$s" "NOT RUN" "no GPU \\(nvidia-smi shows no GPU\\)"
done
for s in mpi-nccl harness-mpi-nccl; do
    expect "$s NOT RUN in a build without MPI" row "$t" "$s" "NOT RUN" "a build without MPI"
done
expect "each row as recorded, and the table again" test "$(grep -c '^gpu_cast ' "$t")" -eq 2
expect "the table ends with the total" bash -c "tail -n 1 '$t' | grep -q '^total  *ok '"
expect "NCCL_DEBUG=WARN reaches the tests" grep -q "NCCL_DEBUG=WARN" "$STUB_LOG"
o=$tmp/nogpu.out
expect "\$OUT: the table" bash -c "grep -q '^gpu_tinymoe  *NOT RUN' '$o/table.txt' && grep -q '^total ' '$o/table.txt'"
expect "\$OUT: the console, probe line first" bash -c "head -n 1 '$o/console.log' | grep -q '^probe: '"
expect "\$OUT: the console to its last line" bash -c "tail -n 1 '$o/console.log' | grep -q '^total  *ok '"
expect "\$OUT: every log" bash -c "tar -tzf '$o/logs.tar.gz' | grep -q configure.log && tar -tzf '$o/logs.tar.gz' | grep -q build.log && tar -tzf '$o/logs.tar.gz' | grep -q gpu_half_bits.log"
expect "\$OUT: at most 8 files, none in a folder" bash -c "[ \$(find '$o' -mindepth 1 | wc -l) -le 8 ] && [ -z \"\$(find '$o' -mindepth 1 ! -type f)\" ]"

# ---- a rerun keeps the build; --clean does not --------------------------------------------

touch "$b/kept" "$b/kit/usr/kept"
check rerun --build "$b" --budget 120
expect "rerun: the build folder kept" test -f "$b/kept"
expect "rerun: the unpacked kit kept" test -f "$b/kit/usr/kept"
check clean --build "$b" --budget 120 --clean
expect "--clean: the build folder made anew" test ! -e "$b/kept"
expect "--clean: the kit unpacked anew" test -f "$b/kit/usr/include/cmocka.h"

# ---- a failed step -------------------------------------------------------------------------

STUB_CTEST_gpu_half_bits=fail check fail --build "$tmp/b2" --budget 120
t=$tmp/fail.txt
expect "a failure: exit 1" test "$rc" -eq 1
expect "a failure: the row names the reason" row "$t" gpu_half_bits FAIL "rc 8: .*the failing assertion at line 42"
expect "a failure: the last lines of its log" bash -c "grep -q -- '---- last lines of gpu_half_bits.log' '$t' && grep -q '  | noise line 40' '$t'"
expect "a failure: the table says so" bash -c "tail -n 1 '$t' | grep -q '^total  *FAIL '"
STUB_BUILD_RC=1 check nobuild --build "$tmp/b3" --budget 120
expect "a failed build: FAIL and the tests NOT RUN" bash -c "grep -qE '^build +FAIL' '$tmp/nobuild.txt' && grep -qE '^gpu_cast +NOT RUN +0  no build' '$tmp/nobuild.txt'"

# ---- with a GPU ----------------------------------------------------------------------------

STUB_GPUS=1 STUB_HARNESS=refuse STUB_CTEST_gpu_cast=skip STUB_CTEST_gpu_nccl_world=inside \
    check gpu --build "$tmp/b4" --budget 120
t=$tmp/gpu.txt
expect "GPU: the probe names it" bash -c "head -n 1 '$t' | grep -q 'GPU 1x NVIDIA H200 | driver 580.65.06 (CUDA 13.0)'"
expect "GPU: the driver row" row "$t" driver ok "driver 580.65.06 \\(CUDA 13.0\\), toolkit CUDA 13.0"
expect "GPU: a test skipped whole fails" row "$t" gpu_cast FAIL "skipped whole on a machine with 1 GPU"
expect "GPU: a skip inside is named" row "$t" gpu_nccl_world ok "skipped inside: test_missing_rank_times_out"
expect "GPU: a refused NCCL run fails" row "$t" harness-nccl FAIL "refused: .*built without NCCL"
expect "GPU: the host-staged run passes" row "$t" harness-auto ok "auto, world 8"
expect "GPU: the bench rows" row "$t" bench-gpu ok "raw ncclAllReduce"
expect "GPU: exit 1" test "$rc" -eq 1

# ---- the budget ----------------------------------------------------------------------------

# 30 s less the 15 kept for the end: the hanging test gets what the first steps left of 15
STUB_GPUS=1 STUB_CTEST_gpu_half_bits=hang check budget --build "$tmp/b5" --budget 30
t=$tmp/budget.txt
expect "budget: the hanging step cut at what was left" row "$t" gpu_half_bits FAIL "timed out after [0-9]+ s"
for s in gpu_cast gpu_tinymoe harness-nccl bench-gpu; do
    expect "budget: $s after it NOT RUN" row "$t" "$s" "NOT RUN" "budget spent"
done
expect "budget: within the budget ($took s of 30)" test "$took" -le 32
expect "budget: the table still returned" grep -q '^total ' "$tmp/budget.out/table.txt"

echo "check.sh: $passes passed, $failures failed"
[ $failures -eq 0 ] || {
    for f in nogpu fail gpu budget; do
        echo "==== $f" && cat "$tmp/$f.txt"
    done
    exit 1
}
