#!/bin/sh
# The sweeps of results/invariance/README.md: world-8 layouts (every ep in both orders, every
# framework preset) and worlds 1 to 8, without a bug and with each planted framework bug, and
# the load-balancing loss's two scopes. Every run trains the same
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
sweep clean-frameworks-f32 0 --sweep frameworks --world 8 --ep 4 --dtype f32
# the load-balancing loss in global scope (worlds 1-8) and in local scope (world 8): two
# objectives, each compared with its own first run, reported apart
sweep scope-aux-f32 0 --sweep "$here/scope.json" --aux-loss-coeff 0.01 --dtype f32
# local scope over worlds: its token sets are the data shards, so each world has its own
# objective and the sweep must deviate
sweep scope-local-worlds-f32 1 --sweep worlds --ep 4 --dtype f32 --aux-loss-coeff 0.01 \
    --aux-loss-scope local
sweep bug-ep-scale 1 --sweep ep --world 8 --dtype f32 --inject ep-scale
sweep bug-world-div 1 --sweep ep --world 8 --dtype f32 --inject world-div
sweep bug-rank-mean 1 --sweep worlds --ep 4 --dtype f32 --inject rank-mean
sweep bug-tied-twice 1 --sweep worlds --ep 4 --dtype f32 --inject tied-twice
sweep bug-local-aux 1 --sweep worlds --ep 4 --dtype f32 --aux-loss-coeff 0.01 --inject local-aux
