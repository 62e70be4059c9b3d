#!/bin/sh
# The sweeps of results/invariance/README.md: world-8 layouts (every ep in both orders) and
# worlds 1 to 8, without a bug and with each planted framework bug. Every run trains the same
# logical model on the same tokens (--global-batch), so any deviation is the layout's doing.
# A sweep with a planted bug exits 1 (it must fail); any other status stops the script.
#
#   results/invariance/regenerate.sh       uses build/bin/seldp-harness
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
bin=${SELDP_HARNESS:-$root/build/bin/seldp-harness}
# 255 tokens: not a multiple of the world, so ranks hold 31 or 32 tokens (rank-mean shows)
common="--global-batch 255 --steps 5 --seed 1234"

sweep() { # sweep NAME EXPECTED-STATUS ARGS...
    name=$1
    want=$2
    shift 2
    rm -rf "${here:?}/$name"
    status=0
    "$bin" "$@" $common --out "$here/$name" || status=$?
    if [ "$status" -ne "$want" ]; then
        echo "regenerate.sh: sweep $name exited $status, expected $want" >&2
        exit 1
    fi
}

sweep clean-ep-f32 0 --sweep ep --world 8 --dtype f32
sweep clean-ep-bf16 0 --sweep ep --world 8 --dtype bf16
sweep clean-worlds-f32 0 --sweep worlds --ep 4 --dtype f32
sweep bug-ep-scale 1 --sweep ep --world 8 --dtype f32 --inject ep-scale
sweep bug-world-div 1 --sweep ep --world 8 --dtype f32 --inject world-div
sweep bug-rank-mean 1 --sweep worlds --ep 4 --dtype f32 --inject rank-mean
sweep bug-tied-twice 1 --sweep worlds --ep 4 --dtype f32 --inject tied-twice
