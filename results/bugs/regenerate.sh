#!/bin/sh
# results/bugs/: every known framework bug of the harness (harness/check/bugs.c, docs/harness.md,
# Planted bugs) planted on the layout where it shows: the step-1 reports in f32 (half-accum:
# f16) and in bf16, a lockstep sweep over the layouts where it shows with the bug planted and
# the same sweep clean, and README.md assembled from them (readme.py). A bug whose option of
# the step does not exist yet is recorded with the refusal it gets; found-inf-local (loss
# scaling, f16 only, refused by sweeps) has its step-1 report in f16 and no sweep; tied-zero
# (--zero 1, which sweeps refuse) runs on each of its layouts apart instead (layouts.tsv).
#
#   results/bugs/regenerate.sh       uses build/bin/seldp-harness and build/bin/seldp-bugs
#
# A run or sweep with a planted bug exits 1 (it must fail), a clean one 0, a refused one 2;
# any other status stops the script. About half a minute on two cores. The sweeps' per-run
# reports are removed (sweep.json holds every run's numbers); run a sweep by hand for them.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
bin=${SELDP_HARNESS:-$root/build/bin/seldp-harness}
bugs=${SELDP_BUGS:-$root/build/bin/seldp-bugs}
for b in "$bin" "$bugs"; do
    if [ ! -x "$b" ]; then
        echo "regenerate.sh: $b not found; build first (cmake --preset ci -B build; cmake --build build)" >&2
        exit 2
    fi
done
# paths relative to the repository, so that none of the outputs names this checkout
cd "$root"
rel=results/bugs
# 255 tokens: not a multiple of the world, so ranks hold different counts (rank-mean shows)
common="--global-batch 255 --steps 3 --seed 1234"

expect() { # expect NAME WANTED-STATUS STATUS
    if [ "$3" -ne "$2" ]; then
        echo "regenerate.sh: $1 exited $3, expected $2" >&2
        exit 1
    fi
}

# the lockstep sweep of each bug: its layouts and the options the bug needs
sweep_of() {
    case $1 in
    ep-scale | world-div) echo "--sweep ep --world 8 --dtype f32" ;;
    rank-mean | tied-twice) echo "--sweep worlds --ep 4 --dtype f32" ;;
    local-aux) echo "--sweep worlds --ep 4 --dtype f32 --aux-loss-coeff 0.01" ;;
    router-tp) echo "--sweep $rel/sweeps/tp.json --dtype f32" ;;
    shared-expert-tp) echo "--sweep $rel/sweeps/tp.json --dtype f32 --shared-expert-ff 32" ;;
    aux-cp) echo "--sweep $rel/sweeps/cp.json --dtype f32 --aux-loss-coeff 0.1 --z-loss-coeff 0.01" ;;
    aux-dp) echo "--sweep worlds --ep 4 --dtype f32 --aux-loss-coeff 0.1" ;;
    norm-per-group) echo "--sweep ep --world 8 --dtype f32 --clip-grad 0.1" ;;
    edp1-skip) echo "--sweep $rel/sweeps/edp1.json --dtype f32" ;;
    half-accum) echo "--sweep worlds --ep 2 --dtype bf16" ;;
    aux-microbatch) echo "--sweep ep --world 8 --dtype f32 --micro-batches 5 --aux-loss-coeff 0.1" ;;
    last-microbatch) echo "--sweep ep --world 8 --dtype f32 --micro-batches 5" ;;
    *) echo "" ;;
    esac
}

for name in $("$bugs" --names); do
    dir=$here/$name
    rm -rf "${dir:?}"
    mkdir -p "$dir"
    demo=$("$bugs" --demo "$name")
    if "$bugs" --pending "$name" > /dev/null; then
        status=0
        # shellcheck disable=SC2086
        "$bin" $demo --inject "$name" --steps 1 --out none > /dev/null 2> "$dir/refused.txt" ||
            status=$?
        expect "$name (pending)" 2 "$status"
        continue
    fi
    first=f32
    if [ "$name" = half-accum ]; then
        first=f16
        status=0
        # shellcheck disable=SC2086
        "$bin" $demo --dtype f32 --inject "$name" --steps 1 --out none > /dev/null \
            2> "$dir/refused-f32.txt" || status=$?
        expect "$name f32" 2 "$status"
    fi
    dtypes="$first bf16"
    # loss scaling is f16's alone: found-inf-local shows in f16 and sweeps refuse it
    [ "$name" = found-inf-local ] && dtypes=f16
    for dt in $dtypes; do
        status=0
        # shellcheck disable=SC2086
        "$bin" $demo --dtype $dt --inject "$name" --steps 1 --out "$rel/$name/step1-$dt" \
            > "$dir/step1-$dt.txt" 2>&1 || status=$?
        expect "$name step 1 $dt" 1 "$status"
    done
    if [ "$name" = tied-zero ]; then
        # sweeps refuse --zero 1: the layouts where it shows, each run on its own, with and
        # without the bug
        : > "$dir/layouts.tsv"
        for layout in "--world 4 --pp 2 --ep 2" "--world 8 --pp 2 --ep 4" \
            "--world 8 --pp 4 --layers 4 --ep 2" "--framework megatron --world 8 --tp 2 --pp 2 --ep 2" \
            "--framework megatron --world 16 --tp 2 --pp 2 --ep 2"; do
            line="$layout"
            for kind in bug clean; do
                inject=""
                want=0
                if [ $kind = bug ]; then
                    inject="--inject $name"
                    want=1
                fi
                status=0
                # shellcheck disable=SC2086
                "$bin" $layout --zero 1 --dtype f32 $common $inject --out none > "$dir/run.txt" 2>&1 ||
                    status=$?
                expect "$name $layout ($kind)" $want "$status"
                result=$(sed -n 's/^result: \([A-Z]*\).*/\1/p' "$dir/run.txt")
                named=$(sed -n 's/^diagnosis: .*known bug \([a-z0-9-]*\).*/\1/p' "$dir/run.txt")
                line="$line	$result	${named:--}"
            done
            printf '%b\n' "$line" >> "$dir/layouts.tsv"
        done
        rm -f "$dir/run.txt"
    fi
    sw=$(sweep_of "$name")
    [ -n "$sw" ] || continue
    echo "seldp-harness $sw $common --inject $name" > "$dir/sweep.cmd"
    for kind in bug clean; do
        inject=""
        want=0
        if [ $kind = bug ]; then
            inject="--inject $name"
            want=1
        fi
        status=0
        # shellcheck disable=SC2086
        "$bin" $sw $common $inject --quiet --out "$rel/$name/sweep-$kind" > "$dir/sweep-$kind.txt" 2>&1 ||
            status=$?
        expect "$name sweep ($kind)" $want "$status"
        # sweep.json holds every run's numbers; the runs' own reports stay out of the tree
        rm -rf "${dir:?}/sweep-$kind/runs"
    done
done
"$bugs" --catalog > "$here/catalog.md"
python3 "$here/readme.py" "$here" "$bin" > "$here/README.md"
rm -f "$here/catalog.md"
echo "results/bugs: README.md and $("$bugs" --names | wc -l) folders"
