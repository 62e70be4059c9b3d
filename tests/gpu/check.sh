#!/usr/bin/env bash
# The GPU acceptance check, made for one command on a lent GPU machine (an H200 with about
# 15 minutes in all): everything it learns comes back even when a step fails or hangs.
#
#   probe      one line first: nvcc, CMake, BLAS, cmocka, NCCL and its version, MPI, the GPUs
#              and the driver
#   kit        the Debian packages of tests/gpu/kit.sh (.gpu-kit/) unpacked into a private
#              prefix in the build folder, never into /; CMake, pkg-config and the loader are
#              pointed at it
#   nccl       the machine's NCCL: NCCL_ROOT, a system install, or the Python wheel
#              (nvidia-nccl-cu*: its include folder and libnccl.so.2)
#   configure  Release for sm_90 (--arch), CUDA required, NCCL required when one was found,
#              MPI when present, -Werror off (warnings are the CI's business); an existing
#              build is configured again, not removed (--clean removes it)
#   build      only the GPU targets (gpu-check: the gpu tests, the harness, the benchmark)
#   driver     the driver runs this toolkit's CUDA (a GPU CUDA cannot use is a FAIL)
#   tests      each `gpu` test by name, each under its own limit; a program that skips
#              inside (cmocka's [ SKIPPED ]) is named in its row; one that skips whole on a
#              machine with a GPU fails
#   harness    NCCL with one rank per GPU (bf16; f32 with nf4), and --backend auto with 8
#              ranks; a refused NCCL run fails in a build that requires NCCL
#   mpi        the MPI+NCCL test and the harness under mpirun; NOT RUN in a build without MPI
#   bench      seldp-bench --gpu: raw ncclAllReduce beside seldp's allreduce and reduce
#
# Time: a total budget (--budget, default 540 s: inside one 10-minute command); each step
# runs under the smaller of its own cap and what is left, less 15 s kept for the end; a step
# with less than 5 s left is NOT RUN. Rows are printed as they are recorded, the last lines
# of a failed step's log with them, and the table again at the end. With $OUT set (the
# device run's return folder), $OUT/table.txt, $OUT/console.log and $OUT/logs.tar.gz (every
# step's log) are rewritten after every row, so a run cut short still returns what it did.
# NCCL_DEBUG=WARN unless set, so that a failure says why.
#
# Usage: tests/gpu/check.sh [--clean] [--budget S] [--build DIR] [--kit DIR] [--jobs N]
#                           [--arch SM] [--nccl auto|system|wheel|DIR] [--only-build]
#                           [--hide-system]
#   --only-build   stop after the build (tests/gpu/test_kit_build.sh)
#   --hide-system  configure as if the system had no BLAS, cmocka or pkg-config of its own
#                  (CMake ignores /usr for its searches, libm given by name): the proof, on a
#                  machine that has them, that the kit alone is enough
# Exit status: 0 when no row failed (rows the machine or the build cannot run are NOT RUN).
set -u

repo=$(cd "$(dirname "$0")/../.." && pwd)
build=$repo/build-gpucheck
kit=$repo/.gpu-kit
budget=${SELDP_CHECK_BUDGET:-540}
jobs=$(nproc 2>/dev/null || echo 4)
arch=90
nccl_from=auto
clean=0
only_build=0
hide_system=0
while [ $# -gt 0 ]; do
    case $1 in
    --clean) clean=1 ;;
    --budget) budget=$2 && shift ;;
    --build) build=$2 && shift ;;
    --kit) kit=$2 && shift ;;
    --jobs) jobs=$2 && shift ;;
    --arch) arch=$2 && shift ;;
    --nccl) nccl_from=$2 && shift ;;
    --only-build) only_build=1 ;;
    --hide-system) hide_system=1 ;;
    -h | --help) sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//' && exit 0 ;;
    *) echo "check.sh: unknown argument '$1' (see --help)" >&2 && exit 2 ;;
    esac
    shift
done
case $build in /*) ;; *) build=$PWD/$build ;; esac
case $kit in /*) ;; *) kit=$PWD/$kit ;; esac

start=$(date +%s)
deadline=$((start + budget))
reserve=15
export NCCL_DEBUG=${NCCL_DEBUG:-WARN}
out=${OUT:-}

[ $clean -eq 1 ] && rm -rf "$build"
logs=$build-logs
rm -rf "$logs"
mkdir -p "$logs" "$build" || exit 2
[ -n "$out" ] && mkdir -p "$out"

# ---- rows, the table, and what goes back ---------------------------------------------------

rows=()
failed=0
row_line() { printf '%-20s %-8s %6s  %s\n' "$@"; }
table() {
    row_line step result seconds note
    row_line -------------------- -------- ------ ----------------------------------------
    local r
    for r in "${rows[@]}"; do
        IFS='|' read -r s res secs note <<<"$r"
        row_line "$s" "$res" "$secs" "$note"
    done
}
# Rewrite what $OUT holds: the table so far, the console, every log (at most 8 files).
publish() {
    [ -n "$out" ] || return 0
    table >"$out/table.txt.tmp" && mv "$out/table.txt.tmp" "$out/table.txt"
    cp "$logs/console.log" "$out/console.log.tmp" 2>/dev/null && mv "$out/console.log.tmp" "$out/console.log"
    tar -czf "$out/logs.tar.gz.tmp" -C "$logs" . 2>/dev/null
    # a return file holds 16 MiB at most: past 15, only each log's last 2,000 lines
    if [ "$(stat -c %s "$out/logs.tar.gz.tmp" 2>/dev/null || echo 0)" -gt $((15 << 20)) ]; then
        local short=$logs.short
        rm -rf "$short" && mkdir -p "$short"
        find "$logs" -name '*.log' | while read -r f; do tail -n 2000 "$f" >"$short/$(basename "$f")"; done
        tar -czf "$out/logs.tar.gz.tmp" -C "$short" . 2>/dev/null
        rm -rf "$short"
    fi
    mv "$out/logs.tar.gz.tmp" "$out/logs.tar.gz" 2>/dev/null
}
# record STEP RESULT SECONDS NOTE: kept for the table, printed now, published.
record() {
    rows+=("$1|$2|$3|${4//|/\/}")
    [ "$2" = FAIL ] && failed=1
    row_line "$1" "$2" "$3" "$4"
    publish
}
left() { echo $((deadline - $(date +%s))); }

# run STEP CAP COMMAND...: the command under min(CAP, what is left less the reserve), its
# output in $logs/STEP.log; sets rc (125: not run, no time left), secs and limit.
run() {
    local step=$1 cap=$2
    shift 2
    limit=$(($(left) - reserve))
    [ "$limit" -gt "$cap" ] && limit=$cap
    secs=0
    if [ "$limit" -lt 5 ]; then
        rc=125
        return
    fi
    local t0
    t0=$(date +%s)
    {
        echo "# $step: limit $limit s ($(left) s of the $budget s budget left): $*"
        timeout --signal=TERM --kill-after=5 "$limit" "$@" </dev/null
    } >"$logs/$step.log" 2>&1
    rc=$?
    secs=$(($(date +%s) - t0))
}
timed_out() { [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; }
# The last lines of a failed step's log, on the console.
tail_of() {
    echo "---- last lines of $1.log ----"
    tail -n "${2:-25}" "$logs/$1.log" 2>/dev/null | sed 's/^/  | /'
    echo "----"
}
# Record a step that ran: ok on rc 0, else FAIL with the reason and the log's tail.
verdict() { # STEP OK_NOTE
    if [ "$rc" -eq 125 ]; then
        record "$1" "NOT RUN" 0 "budget spent ($(left) s left of $budget)"
    elif [ "$rc" -eq 0 ]; then
        record "$1" ok "$secs" "$2"
    elif timed_out; then
        record "$1" FAIL "$secs" "timed out after ${limit} s"
        tail_of "$1"
    else
        record "$1" FAIL "$secs" "rc $rc: $(grep -m1 -iE 'error|fail|refused|abort' "$logs/$1.log" | cut -c1-90)"
        tail_of "$1"
    fi
}
# The table again, the console's last lines through tee, then what goes back; exit STATUS.
finish() {
    echo
    table
    exec >&- 2>&-
    wait "$tee_pid" 2>/dev/null
    publish
    exit "$1"
}
on_signal() {
    record interrupted FAIL $(($(date +%s) - start)) "check.sh stopped by a signal"
    finish 1
}
trap on_signal TERM INT

exec > >(tee -a "$logs/console.log") 2>&1
tee_pid=$!

# ---- the kit and NCCL (before the probe line, silently) -------------------------------------

multiarch=x86_64-linux-gnu
prefix=""
kit_note=""
kit_result=""
if [ -f "$kit/MANIFEST" ]; then
    prefix=$build/kit
    stamp=$(sha256sum "$kit/MANIFEST" | cut -d' ' -f1)
    if [ "$(cat "$prefix/.stamp" 2>/dev/null)" != "$stamp" ]; then
        rm -rf "$prefix" && mkdir -p "$prefix"
        kit_result=ok
        while read -r pkg version _arch _bytes sum file; do
            deb=$kit/$file
            if [ "$(sha256sum "$deb" 2>/dev/null | cut -d' ' -f1)" != "$sum" ]; then
                kit_result=FAIL
                kit_note="$file: missing or not the file MANIFEST names"
                break
            fi
            if command -v dpkg-deb >/dev/null; then
                dpkg-deb -x "$deb" "$prefix" || kit_result=FAIL
            else # no dpkg: a .deb is an ar archive whose data.tar.* holds the files
                member=$(ar t "$deb" | grep '^data\.tar')
                case $member in
                *.xz) unpack=(tar -xJ) ;;
                *.zst) unpack=(tar --zstd -x) ;;
                *.gz) unpack=(tar -xz) ;;
                *) unpack=(tar -x) ;;
                esac
                ar p "$deb" "$member" | "${unpack[@]}" -C "$prefix" || kit_result=FAIL
            fi
            [ $kit_result = FAIL ] && kit_note="could not unpack $file" && break
        done <"$kit/MANIFEST"
        if [ $kit_result = ok ]; then
            find "$prefix" -name '*.a' -delete # static archives: the build links shared ones
            # the .pc files name /usr: point them at the prefix
            find "$prefix" -name '*.pc' -exec sed -E -i \
                "s#(^|[=[:space:]])(-[IL])?/usr(/|\$)#\\1\\2$prefix/usr\\3#g" {} +
            echo "$stamp" >"$prefix/.stamp"
        fi
    else
        kit_result=ok
    fi
    [ $kit_result = ok ] && kit_note="$(wc -l <"$kit/MANIFEST") packages in $prefix"
else
    kit_result="NOT RUN"
    kit_note="no kit in $kit (tests/gpu/kit.sh makes one): the system's packages"
fi
if [ "$kit_result" = ok ]; then
    lib=$prefix/usr/lib/$multiarch
    export LD_LIBRARY_PATH=$lib:$lib/openblas-pthread${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    export PKG_CONFIG_LIBDIR=$lib/pkgconfig:$lib/openblas-pthread/pkgconfig:$prefix/usr/share/pkgconfig
    export PATH=$prefix/usr/bin:$PATH
else
    prefix=""
fi

kit_version() { # PACKAGE: its version in the kit's MANIFEST
    awk -v p="$1" '$1 == p {print $2}' "$kit/MANIFEST" 2>/dev/null
}
nccl_version() { # INCLUDE_DIR
    awk '/^#define NCCL_(MAJOR|MINOR|PATCH)[ \t]/ {v = v (v ? "." : "") $3} END {print v}' \
        "$1/nccl.h" 2>/dev/null
}
# NCCL: an include folder with nccl.h and a lib folder with libnccl.so or libnccl.so.2.
nccl_root=""
nccl_where=""
nccl_in() { # ROOT WHERE
    [ -f "$1/include/nccl.h" ] || return 1
    ls "$1"/lib*/libnccl.so* >/dev/null 2>&1 || return 1
    nccl_root=$1
    nccl_where=$2
}
find_nccl_system() {
    [ -n "${NCCL_ROOT:-}" ] && nccl_in "$NCCL_ROOT" "NCCL_ROOT $NCCL_ROOT" && return 0
    local d
    for d in "${CUDA_HOME:-/usr/local/cuda}" /usr/local/cuda /usr; do
        nccl_in "$d" "system $d" && return 0
    done
    [ -f /usr/include/nccl.h ] && ls /usr/lib/$multiarch/libnccl.so* >/dev/null 2>&1 &&
        nccl_root=/usr && nccl_where="system /usr" && return 0
    return 1
}
find_nccl_wheel() {
    local py d
    for py in python3 python; do
        command -v "$py" >/dev/null || continue
        for d in $("$py" -c 'import nvidia.nccl as m; print(" ".join(m.__path__))' 2>/dev/null); do
            nccl_in "$d" "wheel $d" && return 0
        done
    done
    return 1
}
case $nccl_from in
auto) find_nccl_system || find_nccl_wheel ;;
system) find_nccl_system ;;
wheel) find_nccl_wheel ;;
*) nccl_in "$nccl_from" "given $nccl_from" ;;
esac
if [ -n "$nccl_root" ]; then
    nccl_lib=$(dirname "$(ls "$nccl_root"/lib*/libnccl.so* | head -n 1)")
    export LD_LIBRARY_PATH=$nccl_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
# the same environment for a shell on this machine: . BUILD/check-env.sh
{
    echo "export LD_LIBRARY_PATH='${LD_LIBRARY_PATH:-}'"
    [ -n "$prefix" ] && echo "export PKG_CONFIG_LIBDIR='$PKG_CONFIG_LIBDIR' PATH='$prefix/usr/bin':\$PATH"
    echo "export NCCL_DEBUG='$NCCL_DEBUG'"
} >"$build/check-env.sh"

# ---- the probe line ------------------------------------------------------------------------

gpus=0
gpu_note="no nvidia-smi"
driver_version=""
driver_cuda=""
if command -v nvidia-smi >/dev/null 2>&1; then
    names=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null)
    gpus=$(printf '%s' "$names" | grep -c .)
    driver_version=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -n 1)
    driver_cuda=$(nvidia-smi 2>/dev/null | sed -n 's/.*CUDA Version: *\([0-9][0-9.]*\).*/\1/p' | head -n 1)
    gpu_note="${gpus}x $(printf '%s' "$names" | head -n 1)"
    [ "$gpus" -eq 0 ] && gpu_note="nvidia-smi shows no GPU"
fi
nvcc_bin=$(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
nvcc_v=$("${nvcc_bin:-nvcc}" --version 2>/dev/null | sed -n 's/.*release \([0-9][0-9.]*\).*/\1/p')
cmake_v=$(cmake --version 2>/dev/null | sed -n '1s/.* //p')
have() { [ -n "$prefix" ] && [ -e "$prefix/$1" ]; }
if have "usr/include/$multiarch/openblas-pthread/cblas.h"; then
    blas="kit openblas $(kit_version libopenblas0-pthread)"
elif ls /usr/include/cblas.h /usr/include/*/cblas.h /usr/include/*/*/cblas.h >/dev/null 2>&1; then
    blas="system"
else
    blas="none"
fi
if have usr/include/cmocka.h; then
    cmocka="kit $(kit_version libcmocka-dev)"
elif [ -f /usr/include/cmocka.h ]; then cmocka="system"; else cmocka="none"; fi
mpirun_bin=$(command -v mpirun || true)
mpi=${mpirun_bin:+$("$mpirun_bin" --version 2>/dev/null | head -n 1)}
nccl_note=${nccl_root:+$(nccl_version "$nccl_root/include") ($nccl_where)}
echo "probe: nvcc ${nvcc_v:-none} | cmake ${cmake_v:-none} | BLAS $blas | cmocka $cmocka |" \
    "pkg-config $(have usr/bin/pkgconf && echo kit || command -v pkg-config || echo none) |" \
    "NCCL ${nccl_note:-none} | MPI ${mpi:-none} | GPU $gpu_note |" \
    "driver ${driver_version:-none}${driver_cuda:+ (CUDA $driver_cuda)} | budget $budget s"
echo "build: $build, logs: $logs${out:+, returned in $out}, NCCL_DEBUG=$NCCL_DEBUG"
record probe ok 0 "GPUs $gpus, nvcc ${nvcc_v:-none}, NCCL ${nccl_note:-none}"
record kit "$kit_result" 0 "$kit_note"
if [ -n "$nccl_root" ]; then
    record nccl ok 0 "$nccl_note"
elif [ "$gpus" -gt 0 ]; then
    record nccl FAIL 0 "no NCCL: not in NCCL_ROOT, /usr/local/cuda, /usr, nor a Python wheel"
else
    record nccl "NOT RUN" 0 "no NCCL found, no GPU"
fi

# ---- configure and build -------------------------------------------------------------------

args=(-S "$repo" -B "$build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="$arch"
    -DSELDP_WITH_CUDA=ON -DSELDP_WITH_MPI=AUTO -DSELDP_WERROR=OFF)
[ -f "$build/CMakeCache.txt" ] || ! command -v ninja >/dev/null || args+=(-G Ninja)
if [ -n "$nccl_root" ]; then
    args+=(-DSELDP_WITH_NCCL=ON -DNCCL_ROOT="$nccl_root")
else
    args+=(-DSELDP_WITH_NCCL=OFF)
fi
if [ -n "$prefix" ]; then
    args+=(-DCMAKE_PREFIX_PATH="$prefix/usr"
        -DCMAKE_LIBRARY_PATH="$prefix/usr/lib/$multiarch/openblas-pthread"
        -DPKG_CONFIG_EXECUTABLE="$prefix/usr/bin/pkgconf")
fi
if [ $hide_system -eq 1 ]; then
    hidden="/usr/include;/usr/include/$multiarch;/usr/include/$multiarch/openblas-pthread"
    hidden="$hidden;/usr/include/$multiarch/openblas;/usr/lib;/usr/lib/$multiarch"
    hidden="$hidden;/usr/lib/$multiarch/openblas-pthread;/lib;/lib/$multiarch"
    args+=(-DCMAKE_IGNORE_PREFIX_PATH=/usr -DCMAKE_IGNORE_PATH="$hidden"
        -DSELDP_MATH_LIB="$(ls /usr/lib/$multiarch/libm.so /lib/$multiarch/libm.so.6 2>/dev/null | head -n 1)")
fi
run configure 120 cmake "${args[@]}"
verdict configure "sm_$arch, CUDA required, NCCL $([ -n "$nccl_root" ] && echo required || echo off)"
compiled() { grep -qE "transport/$1 +compiled" "$logs/configure.log"; }
has_nccl=0 has_mpi=0
compiled NCCL && has_nccl=1
compiled MPI && has_mpi=1

built=0
if [ "$rc" -eq 0 ]; then
    run build 300 cmake --build "$build" --target gpu-check -j "$jobs"
    if [ "$rc" -ne 0 ] && [ "$rc" -ne 125 ] && grep -q "gpu-check" "$logs/build.log" &&
        grep -qiE "unknown target|no rule to make target" "$logs/build.log"; then
        record build FAIL "$secs" "no gpu-check target: CUDA was not compiled in"
    else
        verdict build "the gpu-check targets, -j$jobs"
        [ "$rc" -eq 0 ] && built=1
    fi
else
    record build "NOT RUN" 0 "configure failed"
fi
[ $only_build -eq 1 ] && finish $failed

# ---- the driver ----------------------------------------------------------------------------

no_gpu_reason="no GPU ($gpu_note)"
if [ "$gpus" -gt 0 ]; then
    toolkit=$("$(sed -n 's/^CMAKE_CUDA_COMPILER:[A-Z]*=//p' "$build/CMakeCache.txt" 2>/dev/null ||
        echo nvcc)" --version 2>/dev/null | sed -n 's/.*release \([0-9][0-9.]*\).*/\1/p')
    toolkit=${toolkit:-$nvcc_v}
    if [ -z "$driver_cuda" ] || [ -z "$toolkit" ]; then
        record driver FAIL 0 "cannot tell: driver CUDA '$driver_cuda', toolkit '$toolkit'"
    elif [ "${driver_cuda%%.*}" -lt "${toolkit%%.*}" ]; then
        record driver FAIL 0 "driver $driver_version runs CUDA <= $driver_cuda; the build is CUDA $toolkit"
    else
        record driver ok 0 "driver $driver_version (CUDA $driver_cuda), toolkit CUDA $toolkit"
    fi
else
    record driver "NOT RUN" 0 "$no_gpu_reason"
fi

# ---- the gpu tests, one by one -------------------------------------------------------------

listed=$(ctest --test-dir "$build" -N 2>/dev/null | sed -n 's/^ *Test *#[0-9]*: *//p')
nccl_tests=" gpu_nccl_world gpu_nccl_reduce "
for t in gpu_half_bits gpu_cast gpu_host_staged gpu_nccl_world gpu_nccl_reduce gpu_tinymoe \
    harness_gpu gpu_shard; do
    if [ $built -eq 0 ]; then
        record "$t" "NOT RUN" 0 "no build"
    elif ! printf '%s\n' "$listed" | grep -qx "$t"; then
        if [ $has_nccl -eq 1 ] || [[ $nccl_tests != *" $t "* ]]; then
            record "$t" FAIL 0 "not in this build's tests"
        else
            record "$t" "NOT RUN" 0 "a build without NCCL"
        fi
    elif [ "$gpus" -eq 0 ] && [ "$t" != gpu_half_bits ]; then
        record "$t" "NOT RUN" 0 "$no_gpu_reason"
    else
        run "$t" 240 ctest --test-dir "$build" -R "^$t\$" -V --timeout 230
        skips=$(sed -n 's/.*\[  SKIPPED \] *\([A-Za-z0-9_]*\).*/\1/p' "$logs/$t.log" 2>/dev/null |
            sort -u | tr '\n' ' ')
        if [ "$rc" -eq 0 ] && grep -q "\*\*\*Skipped\|(Skipped)" "$logs/$t.log" 2>/dev/null; then
            if [ "$gpus" -gt 0 ] && [ "$t" != gpu_half_bits ]; then
                record "$t" FAIL "$secs" "skipped whole on a machine with $gpus GPU(s)"
                tail_of "$t"
            else
                record "$t" "NOT RUN" "$secs" "skipped: $no_gpu_reason"
            fi
        else
            verdict "$t" "passed${skips:+; skipped inside: ${skips% }}"
        fi
    fi
done

# ---- the harness ---------------------------------------------------------------------------

harness=$build/bin/seldp-harness
harness_step() { # NAME NEEDS_NCCL NOTE ARGS...
    local name=$1 needs=$2 note=$3
    shift 3
    if [ $built -eq 0 ] || [ ! -x "$harness" ]; then
        record "$name" "NOT RUN" 0 "no seldp-harness"
        return
    elif [ "$gpus" -eq 0 ]; then
        record "$name" "NOT RUN" 0 "$no_gpu_reason"
        return
    elif [ "$needs" = nccl ] && [ $has_nccl -eq 0 ]; then
        record "$name" "NOT RUN" 0 "a build without NCCL (see the nccl row)"
        return
    fi
    run "$name" 150 "$harness" --out "$logs/$name" --steps 2 --quiet "$@"
    if [ "$rc" -eq 2 ] && grep -qiE "unsupported|not (yet )?(supported|available)|refused|no GPU" \
        "$logs/$name.log"; then
        if [ "$needs" = nccl ]; then # this build requires NCCL: a refusal is a failure
            record "$name" FAIL "$secs" "refused: $(tail -n 1 "$logs/$name.log" | cut -c1-80)"
            tail_of "$name"
        else
            record "$name" "NOT RUN" "$secs" "refused: $(tail -n 1 "$logs/$name.log" | cut -c1-70)"
        fi
        return
    fi
    verdict "$name" "$note"
}
world=$((gpus < 8 ? gpus : 8))
[ "$world" -lt 1 ] && world=1
harness_step harness-nccl nccl "NCCL, world $world, a rank per GPU, bf16" \
    --backend nccl --world "$world" --ep "$world" --experts 8 --dtype bf16
harness_step harness-nccl-f32 nccl "NCCL, world $world, f32, nf4" \
    --backend nccl --world "$world" --ep "$world" --experts 8 --dtype f32 --quant nf4
harness_step harness-auto any "auto, world 8 (host-staged past the GPUs)" \
    --backend auto --world 8 --ep 4 --dtype bf16

# ---- MPI + NCCL under mpirun ---------------------------------------------------------------

mpi_env=(env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    OMPI_MCA_rmaps_base_oversubscribe=1)
for step in mpi-nccl harness-mpi-nccl; do
    if [ $built -eq 0 ]; then
        record $step "NOT RUN" 0 "no build"
    elif [ $has_mpi -eq 0 ]; then
        record $step "NOT RUN" 0 "a build without MPI"
    elif [ -z "$mpirun_bin" ]; then
        record $step "NOT RUN" 0 "no mpirun"
    elif [ "$gpus" -eq 0 ]; then
        record $step "NOT RUN" 0 "$no_gpu_reason"
    elif [ $has_nccl -eq 0 ]; then
        record $step "NOT RUN" 0 "a build without NCCL"
    elif [ $step = mpi-nccl ]; then
        run $step 90 "${mpi_env[@]}" "$mpirun_bin" -np 1 "$build/tests/mpi_nccl"
        verdict $step "mpirun -np 1: NCCL bootstrapped over MPI"
    else
        # one GPU per process, as SLURM gives it: each process sees only its own, as cuda:0
        run $step 150 "${mpi_env[@]}" "$mpirun_bin" -np "$world" sh -c \
            'CUDA_VISIBLE_DEVICES=${OMPI_COMM_WORLD_LOCAL_RANK:-0} exec "$0" "$@"' \
            "$harness" --out "$logs/$step" --steps 2 --quiet --backend nccl --ep "$world" \
            --experts 8 --dtype bf16
        verdict $step "mpirun -np $world, CUDA_VISIBLE_DEVICES per rank"
    fi
done

# ---- the benchmark's GPU rows --------------------------------------------------------------

bench=$build/bin/seldp-bench
if [ $built -eq 0 ] || [ ! -x "$bench" ]; then
    record bench-gpu "NOT RUN" 0 "no seldp-bench"
elif [ "$gpus" -eq 0 ]; then
    record bench-gpu "NOT RUN" 0 "$no_gpu_reason"
elif ! "$bench" --help 2>&1 | grep -q -- "--gpu"; then
    record bench-gpu "NOT RUN" 0 "seldp-bench has no --gpu rows"
else
    run bench-gpu 150 "$bench" --gpu --maxbytes 64M --iters 5 --out "$logs/bench-gpu"
    verdict bench-gpu "rows in bench-gpu.log (raw ncclAllReduce beside seldp's)"
    [ "$rc" -eq 0 ] && cat "$logs/bench-gpu.log"
fi

# ---- the table, again ----------------------------------------------------------------------

rows+=("total|$([ $failed -eq 0 ] && echo ok || echo FAIL)|$(($(date +%s) - start))|GPUs $gpus, budget $budget s")
finish $failed
