#!/bin/sh
# The reshard run of results/reshard/README.md: train 3 steps at world 8, ep 4 and save; resume
# at world 4, ep 2 (experts re-owned, half the ranks) and train to step 6; compare its logical
# weights with an uninterrupted world-8 run to step 6. Writes the three reports, compare.md.
#
#   results/reshard/regenerate.sh       uses build/bin/seldp-harness
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
bin=${SELDP_HARNESS:-$root/build/bin/seldp-harness}
common="--dtype f32 --global-batch 512 --seed 1234"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

rm -rf "$here/save-w8ep4" "$here/resume-w4ep2" "$here/uninterrupted-w8ep4"
"$bin" --world 8 --ep 4 $common --steps 3 --save "$work/ckpt" --out "$here/save-w8ep4"
"$bin" --world 4 --ep 2 $common --steps 6 --resume "$work/ckpt" --save "$work/resumed" \
    --out "$here/resume-w4ep2"
"$bin" --world 8 --ep 4 $common --steps 6 --save "$work/uninterrupted" \
    --out "$here/uninterrupted-w8ep4"
cp "$work/ckpt/index.json" "$here/save-w8ep4/index.json"
python3 "$here/compare.py" "$work/resumed" "$work/uninterrupted" \
    "$here/resume-w4ep2/report.json" "$here/uninterrupted-w8ep4/report.json" > "$here/compare.md"
cat "$here/compare.md"
