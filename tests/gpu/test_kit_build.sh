#!/usr/bin/env bash
# The kit of tests/gpu/kit.sh is enough for the GPU build: tests/gpu/check.sh --only-build
# --hide-system configures with CMake ignoring the system's /usr for its searches (its BLAS,
# cmocka and pkg-config; libm given by name) and with NCCL laid out as the nvidia-nccl-cu*
# wheel lays it out (site-packages/nvidia/nccl/{include/nccl.h, lib/libnccl.so.2}, no
# unversioned link, found through python3), then builds the gpu-check targets. Checked:
# the kit fits a device run; CMake's BLAS, cblas.h, cmocka and pkg-config are the kit's and
# its NCCL the wheel's libnccl.so.2; the objects were compiled against the kit's cmocka.h
# and cblas.h (the Ninja dependency log), the programs load the kit's libraries (ldd with
# the environment check.sh writes), and gpu_half_bits runs and passes; gpu_cast loads and
# exits 77 without a GPU. Takes minutes (label slow). Exit status 77 (skipped) without the
# kit (tests/gpu/kit.sh downloads it), without nvcc, ninja or a system NCCL to lay out as
# a wheel.
set -u
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
kit=${SELDP_GPU_KIT:-$repo/.gpu-kit}
skip() {
    echo "skipped: $*"
    exit 77
}
[ -f "$kit/MANIFEST" ] || skip "no kit in $kit (run tests/gpu/kit.sh)"
command -v ninja >/dev/null || skip "no ninja"
command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ] || skip "no nvcc"
nccl_h=$(ls /usr/local/cuda/include/nccl.h /usr/include/nccl.h 2>/dev/null | head -n 1)
nccl_so=$(ls /usr/local/cuda/lib64/libnccl.so.2 /usr/lib/x86_64-linux-gnu/libnccl.so.2 2>/dev/null | head -n 1)
[ -n "$nccl_h" ] && [ -n "$nccl_so" ] || skip "no NCCL on this machine to lay out as a wheel"

tmp=$(mktemp -d)
trap '[ -n "${KEEP_TMP:-}" ] || rm -rf "$tmp"' EXIT
failures=0
passes=0
expect() { # DESCRIPTION COMMAND...
    local what=$1
    shift
    if "$@" >/dev/null 2>&1; then
        passes=$((passes + 1))
        echo "ok      $what"
    else
        failures=$((failures + 1))
        echo "FAILED  $what"
    fi
}

bytes=$(awk '{s += $4} END {print s}' "$kit/MANIFEST")
echo "kit: $(wc -l <"$kit/MANIFEST") packages, $((bytes >> 10)) KiB"
expect "the kit fits a device run (under 40 MiB of the 64 it may carry)" test "$bytes" -lt $((40 << 20))

wheel=$tmp/site-packages/nvidia/nccl
mkdir -p "$wheel/include" "$wheel/lib"
cp "$nccl_h" "$wheel/include/"
ln -s "$nccl_so" "$wheel/lib/libnccl.so.2"

b=$tmp/build
PYTHONPATH=$tmp/site-packages OUT=$tmp/out NCCL_ROOT='' bash "$here/check.sh" --only-build \
    --hide-system --nccl wheel --kit "$kit" --build "$b" --budget 1700 --jobs 2 \
    >"$tmp/check.txt" 2>&1
rc=$?
cat "$tmp/check.txt"
expect "check.sh configured and built the GPU targets" test "$rc" -eq 0
cache=$b/CMakeCache.txt
kp=$b/kit/usr
in_cache() { grep -q "^$1:[A-Z]*=$2\$" "$cache"; }
expect "BLAS: the kit's" in_cache BLAS_openblas_LIBRARY "$kp/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so"
expect "cblas.h: the kit's" in_cache SELDP_CBLAS_INCLUDE_DIR "$kp/include/x86_64-linux-gnu/openblas-pthread"
expect "cmocka: the kit's" in_cache pkgcfg_lib_CMOCKA_cmocka "$kp/lib/x86_64-linux-gnu/libcmocka.so"
expect "pkg-config: the kit's" in_cache PKG_CONFIG_EXECUTABLE "$kp/bin/pkgconf"
expect "NCCL: the wheel's libnccl.so.2" in_cache NCCL_LIBRARY "$wheel/lib/libnccl.so.2"
expect "NCCL: the wheel's headers" in_cache NCCL_INCLUDE_DIR "$wheel/include"
expect "the build took the Ninja generator" in_cache CMAKE_GENERATOR Ninja

deps() { ninja -C "$b" -t deps "$1" 2>/dev/null; }
cast_o=tests/gpu/CMakeFiles/gpu_cast.dir/test_cast.c.o
moe_o=$(cd "$b" && ls models/CMakeFiles/seldp_tinymoe.dir/*.o | head -n 1)
expect "gpu_cast compiled against the kit's cmocka.h" bash -c "ninja -C '$b' -t deps $cast_o | grep -qx ' *$kp/include/cmocka.h'"
expect "and not the system's" bash -c "! ninja -C '$b' -t deps $cast_o | grep -q ' /usr/include/cmocka.h'"
cblas_users=0
for o in $(cd "$b" && ls models/CMakeFiles/seldp_tinymoe.dir/*.o); do
    deps "$o" | grep -qx " *$kp/include/x86_64-linux-gnu/openblas-pthread/cblas.h" && cblas_users=$((cblas_users + 1))
    deps "$o" | grep -q " /usr/include/x86_64-linux-gnu/openblas-pthread/cblas.h" && cblas_users=-1000
done
expect "tiny-moe compiled against the kit's cblas.h only ($cblas_users objects, $moe_o...)" test "$cblas_users" -gt 0

# shellcheck disable=SC1091
. "$b/check-env.sh"
expect "gpu_cast loads the kit's cmocka" bash -c "ldd '$b/tests/gpu_cast' | grep -q 'libcmocka.so.0 => $kp/lib/x86_64-linux-gnu/libcmocka.so.0'"
expect "the harness loads the kit's OpenBLAS" bash -c "ldd '$b/bin/seldp-harness' | grep -q 'libopenblas.so.0 => $kp/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0'"
expect "and its libgfortran" bash -c "ldd '$b/bin/seldp-harness' | grep -q 'libgfortran.so.5 => $kp/lib/x86_64-linux-gnu/libgfortran.so.5'"
expect "and the wheel's libnccl.so.2" bash -c "ldd '$b/bin/seldp-harness' | grep -q 'libnccl.so.2 => $wheel/lib/libnccl.so.2'"
expect "nothing unresolved" bash -c "! ldd '$b/bin/seldp-harness' '$b/tests/gpu_cast' | grep -q 'not found'"
expect "gpu_half_bits runs and passes" "$b/tests/gpu_half_bits"
"$b/tests/gpu_cast" >/dev/null 2>&1
cast_rc=$?
expect "gpu_cast loads and runs (77 without a GPU, 0 with one: $cast_rc)" bash -c "[ $cast_rc -eq 77 ] || [ $cast_rc -eq 0 ]"
expect "the table came back in \$OUT" grep -q '^build  *ok ' "$tmp/out/table.txt"

echo "kit build: $passes passed, $failures failed"
[ $failures -eq 0 ]
