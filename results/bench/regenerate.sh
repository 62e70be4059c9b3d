#!/bin/sh
# Regenerate results/bench/: the benchmark figures of docs/benchmarks.md (tables, JSON lines,
# CSV, gnuplot PNG plots and README.md with the targets of the performance issue checked against
# them).
#
#   results/bench/regenerate.sh                      uses build/bin/seldp-bench (a Release build)
#   SELDP_BENCH_BIN=path/to/bin results/bench/regenerate.sh
#   SELDP_BENCH_OUT=/tmp/dir results/bench/regenerate.sh   writes there instead (a trial run)
#   SELDP_BENCH_QUICK=1 ...                          small sizes, few samples: checks the script
#   cmake --build build --target bench-results       the same, with that build
#   results/bench/regenerate.sh overlap sharded      only those sections (any of allreduce
#                                                    broadcast latency reduce costs sweeps
#                                                    overlap sharded); the other sections' files
#                                                    are kept, README.md is rebuilt from all, and
#                                                    runs.tsv keeps each file's date and load
#   results/bench/regenerate.sh readme               no run: README.md and the plots rebuilt
#   SELDP_BENCH_REPEAT=5 ...                         repetitions per run (default 3)
#   SELDP_BENCH_SETTLE=0 ...                         no wait for the load to settle before a
#                                                    run (default: up to 300 s)
#
# Every run is seldp-bench -r 3 (docs/benchmarks.md, Repeat mode): each committed figure is the
# median of three repetitions of the whole measurement, with their spread beside it.
# Takes 30-60 minutes on two cores and about 5 GiB of memory at its peak (the 1 GiB reduce).
# The gloo columns need torch with gloo, which seldp never depends on: on Debian or Ubuntu,
# apt-get install python3-torch (seldp-bench finds it through /usr/bin/python3).
# The machine should be otherwise idle: the load average before and after is recorded, and
# when it is above the core count at the start README.md says in its first lines that the
# figures were taken under load and are not the official ones. Before each run the script waits
# (up to SELDP_BENCH_SETTLE seconds) for the 1-minute load to fall to the core count: the rank
# threads of the run before (16 of them in the ranks sweep) hold it up for a minute or two.
set -eu

# the sections to run (none: all); the files of the others are kept, and README.md is rebuilt
# from every file
all_sections="allreduce broadcast latency reduce costs sweeps overlap sharded"
sections="$*"
# readme: no run, README.md and the plots rebuilt from the files there
if [ "$sections" = readme ]; then all_sections="$all_sections readme"; fi
[ -z "$sections" ] && sections=$all_sections
for s in $sections; do
    case " $all_sections " in
    *" $s "*) ;;
    *)
        echo "regenerate.sh: unknown section '$s' (expected nothing, or some of: $all_sections)" >&2
        exit 2
        ;;
    esac
done
want() { case " $sections " in *" $1 "*) return 0 ;; esac; return 1; }
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
bin=${SELDP_BENCH_BIN:-$root/build/bin}
out=${SELDP_BENCH_OUT:-$here}
quick=${SELDP_BENCH_QUICK:-}
bench=$bin/seldp-bench
if [ ! -x "$bench" ]; then
    echo "regenerate.sh: $bench not found; build first (cmake --preset default; cmake --build build)" >&2
    exit 2
fi
# Open MPI beside seldp when it is there; gloo always asked for (seldp-bench leaves its column
# out, with a note, when python3 cannot import torch)
compare="--compare gloo"
compare_small="" # small messages: gloo takes about 1 ms a call, thousands of calls a size
if [ -x "$bin/seldp-bench-mpi" ] && command -v mpirun >/dev/null 2>&1; then
    compare="--compare mpi,gloo"
    compare_small="--compare mpi"
else
    echo "regenerate.sh: no seldp-bench-mpi or mpirun: the MPI columns stay empty" >&2
fi

mkdir -p "$out"
cd "$out"
# the files of each section (other benchmarks keep theirs here, e.g. scale*)
section_names() {
    case "$1" in
    allreduce) echo allreduce ;;
    broadcast) echo broadcast ;;
    latency) echo latency latency_debug ;;
    reduce) echo reduce reduce_f32 reduce_bf16 reduce_f16 ;;
    costs) echo reduce_64m reduce_debug reduce_staged ;;
    sweeps) echo bucket_sweep ranks_sweep ;;
    overlap) echo overlap ;;
    sharded) echo reduce_scatter allgather ;;
    esac
}
for s in $sections; do
    for f in $(section_names "$s"); do rm -f "$f.csv" "$f.jsonl" "$f.txt"; done
done
rm -f allreduce_busbw.png broadcast_busbw.png latency.png bucket_sweep.png ranks_sweep.png
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
started=$(date -u '+%Y-%m-%d %H:%M UTC')
cores=$(nproc)
repeat="-r ${SELDP_BENCH_REPEAT:-3}"
[ -n "$quick" ] && repeat="-r ${SELDP_BENCH_REPEAT:-2}"
touch runs.tsv

settle_s=${SELDP_BENCH_SETTLE:-300}
[ -n "$quick" ] && settle_s=${SELDP_BENCH_SETTLE:-0}

# settle: wait up to $settle_s seconds for the 1-minute load to fall to the core count
settle() {
    waited=0
    while [ "$waited" -lt "$settle_s" ] &&
        awk -v l="$(cut -d' ' -f1 /proc/loadavg)" -v c="$cores" 'BEGIN { exit !(l > c) }'; do
        sleep 5
        waited=$((waited + 5))
    done
    [ "$waited" -gt 0 ] && echo "   (waited ${waited} s for the load to settle: $(cut -d' ' -f1-3 /proc/loadavg))"
    return 0
}

# run NAME ARGS...: one seldp-bench run into NAME.txt, NAME.jsonl and NAME.csv
run() {
    name=$1
    shift
    settle
    echo "== $name: seldp-bench $* $repeat"
    r_before=$(cut -d' ' -f1-3 /proc/loadavg)
    r_started=$(date -u '+%Y-%m-%d %H:%M UTC')
    "$bench" "$@" $repeat --out "$out/$name" | tee "$out/$name.txt"
    r_after=$(cut -d' ' -f1-3 /proc/loadavg)
    # runs.tsv: NAME, date, load before, load after, the command (one line per file)
    kept=$(mktemp)
    awk -F'\t' -v n="$name" '$1 != n' runs.tsv >"$kept"
    printf '%s\t%s\t%s\t%s\t%s\n' "$name" "$r_started" "$r_before" "$r_after" \
        "seldp-bench $* $repeat" >>"$kept"
    mv "$kept" runs.tsv
}

# Sizes: the real ones, or (SELDP_BENCH_QUICK) small ones that check the script end to end.
if [ -n "$quick" ]; then
    big="-b 1M -e 4M"; reps="-n 2 -w 1"; small="-b 8 -e 4K"; big_reduce="-b 8M -e 8M"
    mid_reduce="-b 4M -e 4M"; sweep_reduce="-b 4M -e 4M"; buckets="1M-4M"; ranks="1-3"
    dtype_reduce="-b 2M -e 4M"; tensors=200; rank_size="-b 4M -e 4M"
    overlap="-b 1M -e 4M -f 4 --bucket 256K,1M"
else
    big="-b 16M -e 256M"; reps="-n 7 -w 2"; small="-b 8 -e 64K"; big_reduce="-b 512M -e 512M"
    mid_reduce="-b 64M -e 64M"; sweep_reduce="-b 256M -e 256M"; buckets="1M-256M"; ranks="1-16"
    dtype_reduce="-b 16M -e 256M"; tensors=10000; rank_size="-b 64M -e 64M"
    overlap="-b 16M -e 64M -f 4 --bucket 1M,4M"
fi

# ---- 9. reduce-scatter and all-gather (the sharded optimizer's collectives) ---------------
# Run them and write their section of README.md into sharded.md (kept beside the tables, so
# that a full run and `regenerate.sh sharded` both end README.md with it).
sharded_sizes="-b 16M -e 256M"
[ -n "$quick" ] && sharded_sizes="-b 1M -e 4M"
sharded_run() {
    s_before=$(cut -d' ' -f1-3 /proc/loadavg)
    s_started=$(date -u '+%Y-%m-%d %H:%M UTC')
    run reduce_scatter -o reduce_scatter $sharded_sizes -f 2 $reps --ranks 2,4 $compare_small
    run allgather -o allgather $sharded_sizes -f 2 $reps --ranks 2,4 $compare_small
    s_after=$(cut -d' ' -f1-3 /proc/loadavg)
    sharded_section >sharded.md
}
# One table per op: seldp beside Open MPI, the copies and B; the targets at 2 ranks (bound
# fraction >= 0.80, >= 3x MPI's busbw).
sharded_table() { # CSV MPI_CALL
    awk -F, -v call="$2" '
        NR == 1 { next }
        $2 == "seldp-host" { key = $3 "," $4; s[key] = $7; f[key] = $8; b[key] = $18; t[key] = $5
                             mc[key] = $19; st[key] = $20; k[++n] = key }
        $2 == "mpi" { m[$3 "," $4] = $7; mt[$3 "," $4] = $5 }
        END {
            print "| ranks | size per rank | seldp (us) | seldp busbw (GB/s) | " call " (us) | MPI busbw | seldp / MPI | memcpy (GB/s) | streaming copy (GB/s) | B (GB/s) | bound fraction | targets (2 and 4 ranks: >= 0.80, >= 3x MPI) |"
            print "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"
            for (i = 1; i <= n; i++) {
                key = k[i]; split(key, a, ",")
                ratio = (key in m && m[key] > 0) ? s[key] / m[key] : 0
                ok = (a[1] != 2 && a[1] != 4) ? "no target" : \
                     (f[key] >= 0.80 ? "bound ok" : "**bound missed**") ", " \
                     (ratio >= 3 ? "MPI ok" : (key in m ? "**MPI missed**" : "no MPI"))
                printf "| %d | %d MiB | %.0f | %.2f | %s | %s | %s | %.1f | %.1f | %.1f | %.2f | %s |\n",
                    a[1], a[2] / 1048576, t[key], s[key],
                    (key in mt ? sprintf("%.0f", mt[key]) : "-"),
                    (key in m ? sprintf("%.2f", m[key]) : "-"),
                    (ratio > 0 ? sprintf("%.1fx", ratio) : "-"), mc[key], st[key], b[key],
                    f[key], ok
            }
        }' "$1"
}
sharded_section() {
    s_loaded=$(awk -v l="${s_before%% *}" -v c="$cores" 'BEGIN { print (l > c ? 1 : 0) }')
    cat <<EOF
<!-- section 9: written by results/bench/regenerate.sh (alone: regenerate.sh sharded) -->
## 9. Reduce-scatter and all-gather: the sharded optimizer's collectives (targets at 2 and 4 ranks: bound fraction >= 0.80; seldp busbw >= 3x Open MPI's MPI_Reduce_scatter_block / MPI_Allgather)

Measured on $s_started, load average $s_before before and $s_after after (1, 5, 15 min) on
$cores cores$([ "$s_loaded" = 1 ] && echo ": **under load, not the official figures**")$([ -n "$quick" ] && echo ", with the small sizes of SELDP_BENCH_QUICK"):
\`seldp-bench -o reduce_scatter $sharded_sizes -f 2 $reps --ranks 2,4 $compare_small $repeat\` and the same
with \`-o allgather\` (\`reduce_scatter.txt\`, \`allgather.txt\`).

\`seldp_comm_reduce_scatter\` and \`seldp_comm_allgather_counts\` with equal blocks, timed as
nccl-tests times ncclReduceScatter and ncclAllGather: the size N is a rank's input
(reduce-scatter) or output (all-gather), busbw = algbw (n-1)/n. The host transport reads only a
rank's block of every input and writes it into the rank's output (reduce-scatter), or reads its
block once and writes it into every rank's output (all-gather), so both move at least (n+1) N
bytes: bound fraction = ((n+1) N / B) / time, with B the better of the two copies of the same
run (section 1). Open MPI's MPI_Reduce_scatter_block (F32 SUM) and MPI_Allgather run under
mpirun with the same ranks, sizes and timing rule. The sharded sessions
(\`seldp_shard_reduce_scatter\`, \`seldp_shard_allgather_params\`) make one such pass over the
session's tensors (their fused path).

Reduce-scatter, F32 SUM:

$(sharded_table reduce_scatter.csv MPI_Reduce_scatter_block)

All-gather:

$(sharded_table allgather.csv MPI_Allgather)
EOF
}

# 1. allreduce F32 SUM, 16-256 MiB per rank, 2 and 4 ranks, beside the copies, MPI and gloo
want allreduce && run allreduce -o allreduce $big -f 2 $reps --ranks 2,4 $compare
# 2. broadcast, the same sizes
want broadcast && run broadcast -o broadcast $big -f 2 $reps --ranks 2,4 $compare
# 3. small messages: latency at 2 and 4 ranks, and the same in the collectives' debug mode
if want latency; then
    run latency -o allreduce $small -f 2 -n 15 -w 50 --ranks 2,4 --no-bound $compare_small
    SELDP_DEBUG_COLLECTIVES=1 run latency_debug -o allreduce $small -f 2 -n 15 -w 50 --ranks 2,4 --no-bound
fi
if want reduce; then
    # 4. a session reduce of 10,000 mixed BF16/F32 tensors, 512 MiB per rank (1 GiB in all)
    run reduce -o reduce $big_reduce --ranks 2 $reps --tensors $tensors -d mixed
    # 5. the reduce in F32 and in BF16 over the 16-256 MiB sweep, 2 and 4 ranks
    run reduce_f32 -o reduce $dtype_reduce -f 2 --ranks 2,4 -n 5 -w 1 --tensors 1000 -d f32
    run reduce_bf16 -o reduce $dtype_reduce -f 2 --ranks 2,4 -n 5 -w 1 --tensors 1000 -d bf16
    run reduce_f16 -o reduce $dtype_reduce -f 2 --ranks 2,4 -n 5 -w 1 --tensors 1000 -d f16
fi
# 6. what the collectives' debug mode and cfg.staged_commit cost: the reduce of 64 MiB per
#    rank three times, plain, with SELDP_DEBUG_COLLECTIVES=1 and with --staged-commit
if want costs; then
    run reduce_64m -o reduce $mid_reduce --ranks 2,4 $reps --tensors $tensors -d mixed
    SELDP_DEBUG_COLLECTIVES=1 run reduce_debug -o reduce $mid_reduce --ranks 2,4 $reps --tensors $tensors -d mixed
    run reduce_staged -o reduce $mid_reduce --ranks 2,4 $reps --tensors $tensors -d mixed --staged-commit
fi
# 7. sweeps: bucket size (the reduce of 256 MiB per rank) and rank count (allreduce 64 MiB)
if want sweeps; then
    run bucket_sweep -o reduce $sweep_reduce --ranks 2 -n 5 -w 1 --tensors $tensors -d mixed --bucket $buckets
    run ranks_sweep -o allreduce $rank_size --ranks $ranks -n 5 -w 1
fi
# 8. the overlapped reduction against a backward of sleeps 0.5, 1 and 2 times its communication
want overlap && run overlap -o overlap $overlap --compute-ratio 0.5,1,2 --ranks 2 $reps
# 9. reduce-scatter and all-gather, 16-256 MiB per rank, 2 and 4 ranks, beside Open MPI
want sharded && sharded_run

load_after=$(cut -d' ' -f1-3 /proc/loadavg)

# ---- plots ------------------------------------------------------------------------------
if command -v gnuplot >/dev/null 2>&1; then
    # gnuplot draws a line through consecutive rows only: sort each series together
    plots=$(mktemp -d)
    trap 'rm -rf "$plots"' EXIT
    for f in allreduce broadcast latency bucket_sweep ranks_sweep; do
        tail -n +2 "$f.csv" | sort -t, -k1,1 -k2,2 -k3,3n -k11,11n -k4,4n >"$plots/$f.csv"
    done
    (cd "$plots" && gnuplot -e "out='$out'" -) <<'EOF'
set datafile separator ","
set terminal pngcairo size 900,560 noenhanced font ",10"
set grid
set key top left
set logscale x 2
set format x "%.0b %BB"
MiB = 1048576.0

# The busbw the memory-bandwidth bound allows, from B of the seldp rows (column 18, the
# better of the memcpy and streaming copies):
# allreduce 2nB/B -> algbw B/(2n) -> busbw B(n-1)/n^2; broadcast nB/B -> busbw B/n.
set output out."/allreduce_busbw.png"
set title "allreduce F32 SUM: busbw per rank count (host-staged threads vs Open MPI processes)"
set xlabel "bytes per rank"; set ylabel "busbw (GB/s)"
plot for [P in "2 4"] "allreduce.csv" using ($3==P+0 && strcol(2) eq "seldp-host" ? $4 : 1/0):7 \
         with linespoints lw 2 title sprintf("seldp-host, %s ranks", P), \
     for [P in "2 4"] "allreduce.csv" using ($3==P+0 && strcol(2) eq "mpi" ? $4 : 1/0):7 \
         with linespoints dt 2 title sprintf("Open MPI, %s ranks", P), \
     for [P in "2 4"] "allreduce.csv" using ($3==P+0 && strcol(2) eq "gloo" ? $4 : 1/0):7 \
         with linespoints dt 4 title sprintf("gloo, %s ranks", P), \
     for [P in "2 4"] "allreduce.csv" using ($3==P+0 && strcol(2) eq "seldp-host" ? $4 : 1/0):($18*($3-1)/$3**2) \
         with lines dt 3 title sprintf("memory bound (B), %s ranks", P)

set output out."/broadcast_busbw.png"
set title "broadcast: busbw per rank count"
plot for [P in "2 4"] "broadcast.csv" using ($3==P+0 && strcol(2) eq "seldp-host" ? $4 : 1/0):7 \
         with linespoints lw 2 title sprintf("seldp-host, %s ranks", P), \
     for [P in "2 4"] "broadcast.csv" using ($3==P+0 && strcol(2) eq "mpi" ? $4 : 1/0):7 \
         with linespoints dt 2 title sprintf("Open MPI, %s ranks", P), \
     for [P in "2 4"] "broadcast.csv" using ($3==P+0 && strcol(2) eq "gloo" ? $4 : 1/0):7 \
         with linespoints dt 4 title sprintf("gloo, %s ranks", P), \
     for [P in "2 4"] "broadcast.csv" using ($3==P+0 && strcol(2) eq "seldp-host" ? $4 : 1/0):($18/$3) \
         with lines dt 3 title sprintf("memory bound (B), %s ranks", P)

set output out."/latency.png"
set title "small allreduce, 2 ranks: time per call"
set logscale y 10
set ylabel "time (us)"
plot "latency.csv" using (strcol(2) eq "seldp-host" && $3 == 2 ? $4 : 1/0):5 with linespoints lw 2 title "seldp-host", \
     "latency.csv" using (strcol(2) eq "mpi" && $3 == 2 ? $4 : 1/0):5 with linespoints dt 2 title "Open MPI", \
     "latency.csv" using (strcol(2) eq "gloo" && $3 == 2 ? $4 : 1/0):5 with linespoints dt 4 title "gloo"
unset logscale y

set output out."/bucket_sweep.png"
set title "reduce of 10,000 mixed BF16/F32 tensors (256 MiB per rank, 2 ranks) by bucket size"
set xlabel "bucket size"; set ylabel "time (ms)"; set y2label "reduce / raw allreduce"
set y2tics; set ytics nomirror; set yrange [0:*]; set y2range [0:2]
set key top right
plot "bucket_sweep.csv" using (strcol(1) eq "reduce" && strcol(2) eq "seldp-host" ? $11 : 1/0):($5/1000) \
         with linespoints lw 2 title "seldp_session_reduce (fused: one rendezvous)", \
     "bucket_sweep.csv" using (strcol(1) eq "reduce" && strcol(2) eq "seldp-host" ? $11 : 1/0):($13/1000) \
         with linespoints dt 3 title "one raw F32 allreduce of the same bytes, sampled in turns", \
     "bucket_sweep.csv" using (strcol(17) eq "raw: bucketed" ? $11 : 1/0):($5/1000) \
         with linespoints dt 2 title "raw F32 allreduces, one per bucket", \
     "bucket_sweep.csv" using (strcol(1) eq "reduce" && strcol(2) eq "seldp-host" ? $11 : 1/0):($5/$13) \
         axes x1y2 with linespoints lw 1 title "reduce / raw (right)"
unset y2tics; unset y2label; set ytics mirror; set yrange [*:*]

unset logscale x
set format x "%g"
set output out."/ranks_sweep.png"
set title "allreduce F32 SUM, 64 MiB per rank, simulated ranks on 2 cores"
set xlabel "ranks"; set ylabel "GB/s"; set y2label "fraction of the memory bound"
set y2tics; set ytics nomirror; set y2range [0:*]
set key top right
plot "ranks_sweep.csv" using (strcol(2) eq "seldp-host" ? $3 : 1/0):($6*2*$3) with linespoints lw 2 title "seldp: 2 n size / time (bytes moved per second)", \
     "ranks_sweep.csv" using (strcol(2) eq "memcpy" ? $3 : 1/0):7 with linespoints dt 3 title "memcpy (read + written)", \
     "ranks_sweep.csv" using (strcol(2) eq "stream" ? $3 : 1/0):7 with linespoints dt 4 title "streaming copy (read + written)", \
     "ranks_sweep.csv" using (strcol(2) eq "seldp-host" ? $3 : 1/0):8 axes x1y2 with linespoints dt 2 title "bound fraction (right)"
EOF
else
    echo "regenerate.sh: gnuplot not found: no plots" >&2
fi

# ---- README.md -----------------------------------------------------------------------------
cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')
mem=$(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo)
version=$("$bench" --gpu 2>/dev/null | sed -n 's/^# seldp-bench --gpu: //p')
copy=$(sed -n 's/.*a streaming copy (\(.*\))$/\1/p' allreduce.txt | head -n 1)
# the highest 1-minute load any kept file was measured under (runs.tsv), or this run's
maxload=$(awk -F'\t' -v l="${load_before%% *}" '{ split($3, a, " "); if (a[1] + 0 > m) m = a[1] + 0 }
    END { print (NR ? m : l) + 0 }' runs.tsv)
loaded=$(awk -v l="$maxload" -v c="$cores" 'BEGIN { print (l > c ? 1 : 0) }')
gloo_note=$(grep -h -m1 '^# no gloo column' allreduce.txt | sed 's/^# no gloo column[^:]*: //')

# side by side: ranks, size, seldp busbw, MPI, gloo, seldp/MPI, memcpy, stream, B, fraction,
# targets (fraction >= MIN2 at 2 ranks and >= MIN4 at more; seldp >= RATIO x MPI)
side_by_side() { # CSV MIN2 MIN4 RATIO
    awk -F, -v min2="$2" -v min4="$3" -v minr="$4" '
        NR == 1 { next }
        $2 == "seldp-host" { key = $3 "," $4; s[key] = $7; f[key] = $8; b[key] = $18
                             mc[key] = $19; st[key] = $20; k[++n] = key
                             sp[key] = ($21 > 1 ? sprintf("%.0f%%, %.2f-%.2f", 100 * $24, $25, $26) : "-") }
        $2 == "mpi" { m[$3 "," $4] = $7 }
        $2 == "gloo" { g[$3 "," $4] = $7 }
        END {
            print "| ranks | size per rank | seldp busbw (GB/s) | MPI busbw | gloo busbw | seldp / MPI | memcpy (GB/s) | streaming copy (GB/s) | B (GB/s) | bound fraction | spread, fraction range | targets |"
            print "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"
            for (i = 1; i <= n; i++) {
                key = k[i]; split(key, a, ",")
                minf = a[1] == 2 ? min2 : min4
                ratio = (key in m && m[key] > 0) ? s[key] / m[key] : 0
                ok = (f[key] >= minf ? "bound ok" : "**bound missed**") " (>= " minf "), " \
                     (ratio >= minr ? "MPI ok" : (key in m ? "**MPI missed**" : "no MPI"))
                printf "| %d | %d MiB | %.2f | %s | %s | %s | %.1f | %.1f | %.1f | %.2f | %s | %s |\n",
                    a[1], a[2] / 1048576, s[key], (key in m ? sprintf("%.2f", m[key]) : "-"),
                    (key in g ? sprintf("%.2f", g[key]) : "-"),
                    (ratio > 0 ? sprintf("%.1fx", ratio) : "-"), mc[key], st[key], b[key],
                    f[key], sp[key], ok
            }
        }' "$1"
}

latency_table() {
    awk -F, '
        FNR == 1 { next }
        FILENAME ~ /debug/ { if ($2 == "seldp-host") d[$3 "," $4] = $5; next }
        $2 == "seldp-host" { s[$3 "," $4] = $5; k[++n] = $3 "," $4 }
        $2 == "mpi" { m[$3 "," $4] = $5 }
        $2 == "gloo" { g[$3 "," $4] = $5 }
        END {
            print "| ranks | size | seldp (us) | MPI (us) | gloo (us) | seldp / MPI | target (<= 1x MPI) | seldp, debug mode (us) | debug / plain |"
            print "|---:|---:|---:|---:|---:|---:|---|---:|---:|"
            for (i = 1; i <= n; i++) {
                key = k[i]; split(key, a, ","); b = a[2]
                r = (key in m && m[key] > 0) ? s[key] / m[key] : 0
                printf "| %d | %s | %.2f | %s | %s | %s | %s | %s | %s |\n", a[1],
                    (b >= 1024 ? (b / 1024) " KiB" : b " B"), s[key],
                    (key in m ? sprintf("%.2f", m[key]) : "-"),
                    (key in g ? sprintf("%.2f", g[key]) : "-"),
                    (r > 0 ? sprintf("%.2f", r) : "-"),
                    (r == 0 ? "no MPI" : (r <= 1 ? "ok" : "**missed**")),
                    (key in d ? sprintf("%.2f", d[key]) : "-"),
                    (key in d && s[key] > 0 ? sprintf("%.2fx", d[key] / s[key]) : "-")
            }
        }' latency.csv latency_debug.csv
}

reduce_rows() { # CSV...: one table row per reduce row
    awk -F, '
        FNR == 1 { next }
        $1 == "reduce" && $2 == "seldp-host" {
            printf "| %d | %d | %s | %.1f MiB | %.1f | %.1f | %.2fx | %.1f | %.2f | %.1f MiB | %.1f MiB | %s |\n",
                $3, $12, $10, $4 / 1048576, $13 / 1000, $5 / 1000, $5 / $13, $18, $8,
                $15 / 1048576, $16 / 1048576, ($5 / $13 <= 1.25 ? "time ok" : "**time missed**") ", " \
                ($15 <= $16 ? "memory ok" : "**memory missed**")
        }' "$@"
}
half_rows() { # the F16 reduce's time against BF16's at the same ranks and size (target 1.15x)
    awk -F, '
        FNR == 1 { next }
        $1 == "reduce" && $2 == "seldp-host" {
            key = $3 "," $4
            if (FILENAME ~ /bf16/) b[key] = $5; else if (!(key in f)) { f[key] = $5; order[++n] = key }
        }
        END {
            for (i = 1; i <= n; i++) {
                k = order[i]; split(k, p, ",")
                if (!(k in b)) continue
                printf "| %d | %.1f MiB | %.2f | %.2f | %.2fx | %s |\n", p[1], p[2] / 1048576,
                    b[k] / 1000, f[k] / 1000, f[k] / b[k], (f[k] <= 1.15 * b[k] ? "ok" : "**missed**")
            }
        }' reduce_bf16.csv reduce_f16.csv
}

overlap_table() {
    # every ratio against the fastest communication of its bytes and bucket (column 27,
    # over_max: the bench's own figure; the comm columns are each session's)
    awk -F, '
        function mib(b) { return b >= 1048576 ? (b / 1048576) " MiB" : (b / 1024) " KiB" }
        NR == 1 || $1 != "overlap" { next }
        $2 == "compute" { k = ++n; size[k] = $4; bucket[k] = $11; layers[k] = $12 }
        { t[n, $2] = $5; x[n, $2] = $27; sp[n, $2] = ($21 > 1 ? sprintf("%.0f%%", 100 * $24) : "-") }
        END {
            print "| size per rank | bucket | layers | compute / best comm | compute (ms) | comm (ms) | comm, staged (ms) | overlap (ms) | overlap / max(compute, best comm) | spread | staged (ms) | staged / max | target (default <= 1.2x max) |"
            print "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"
            for (k = 1; k <= n; k++) {
                c = t[k, "compute"]; m = t[k, "comm"]; o = t[k, "overlap"]
                ms = t[k, "comm_staged"]; st = t[k, "staged"]
                ro = x[k, "overlap"]; rs = x[k, "staged"]
                printf "| %s | %s | %d | %.2f | %.1f | %.1f | %.1f | %.1f | %.3fx | %s | %.1f | %.3fx | %s |\n",
                    mib(size[k]), mib(bucket[k]), layers[k], c / (m < ms ? m : ms), c / 1000,
                    m / 1000, ms / 1000, o / 1000, ro, sp[k, "overlap"], st / 1000, rs,
                    (ro <= 1.2 ? "ok" : "**missed**")
            }
        }' overlap.csv
}

reduce_header="| ranks | tensors | dtype | bytes per rank | raw allreduce (ms) | reduce (ms) | reduce / raw | B (GB/s) | bound fraction | extra memory per rank | budget per rank | targets |
|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"

# the reduce of 64 MiB per rank plain, in the debug mode and with staged_commit
cost_table() {
    awk -F, '
        FNR == 1 { next }
        $1 != "reduce" || $2 != "seldp-host" { next }
        FILENAME ~ /debug/ { d[$3] = $5; next }
        FILENAME ~ /staged/ { t[$3] = $5; next }
        { p[$3] = $5; k[++n] = $3 }
        END {
            print "| ranks | reduce (ms) | SELDP_DEBUG_COLLECTIVES=1 (ms) | debug / plain | cfg.staged_commit (ms) | staged / plain |"
            print "|---:|---:|---:|---:|---:|---:|"
            for (i = 1; i <= n; i++) {
                r = k[i]
                printf "| %d | %.1f | %s | %s | %s | %s |\n", r, p[r] / 1000,
                    (r in d ? sprintf("%.1f", d[r] / 1000) : "-"),
                    (r in d ? sprintf("%.2fx", d[r] / p[r]) : "-"),
                    (r in t ? sprintf("%.1f", t[r] / 1000) : "-"),
                    (r in t ? sprintf("%.2fx", t[r] / p[r]) : "-")
            }
        }' reduce_64m.csv reduce_debug.csv reduce_staged.csv
}

{
    cat <<EOF
# seldp-bench results

EOF
    if [ "$loaded" = 1 ] || [ -n "$quick" ]; then
        cat <<EOF
**Not the official figures: measured under load (a 1-minute load average up to $maxload at
the start of a run, on $cores cores; each file's in the table below)$([ -n "$quick" ] && echo ", with the small sizes of SELDP_BENCH_QUICK"). Rerun
\`results/bench/regenerate.sh\` on an idle machine.**

EOF
    fi
    cat <<EOF
Regenerated by \`results/bench/regenerate.sh\` (or \`cmake --build build --target bench-results\`),
last on $started (sections: $sections): $cpu, $cores cores, $mem, load average $load_before
before and $load_after after (1, 5, 15 min), seldp $version. The machine is shared with other
work: run to run, figures move by 10-30%, and under a heavy load single rows drop far more; run
it on an idle machine. Each run is \`seldp-bench $repeat\` (the repeat mode of
docs/benchmarks.md): every figure is the median of that many repetitions of the whole measurement,
each of them the median of its samples, and the spread (slowest - fastest) / median of the
repetitions is given beside the main figures; every result is validated (\`#wrong\` = 0).
Each file's own date, load and command:

| file | measured | load before | load after | command |
|---|---|---|---|---|
$(awk -F'\t' '{ printf "| %s | %s | %s | %s | `%s` |\n", $1, $2, $3, $4, $5 }' runs.tsv)

Conventions (docs/benchmarks.md, nccl-tests): sizes are bytes per rank, algbw = size / time, busbw =
algbw * 2(n-1)/n for an allreduce and algbw for a broadcast.

**The bound.** B is the machine's best copy bandwidth, measured in the same run: the n rank
threads each copy their own buffer of the same size at once, counted as bytes read + bytes
written per second, once with non-temporal (streaming) stores ($copy, fenced with
\`_mm_sfence\`: the \`stream\` rows) and once with glibc's \`memcpy\` (the \`memcpy\` rows);
B is the better of the two. The streaming copy is the one seldp's host transport moves large
payloads with (\`src/simd/host_copy.c\`: the source prefetched, a line of each of four pages in
turn, as glibc does for its largest copies), so a fraction is what the collective's rendezvous,
slicing and arithmetic leave of a plain copy by the same threads. An in-process allreduce of N bytes on n ranks must move at least
2 n N bytes (each slice's owner reads the n inputs of its slice and writes the sum into the n
outputs) and a broadcast n N; bound fraction = (bytes / B) / time. \`memcpy\` alone is not the
bound: below its non-temporal threshold (a large share of the last-level cache) glibc writes
with ordinary stores, and the CPU reads every destination line before writing it
(read-for-ownership), so it moves 3 bytes for every 2 counted and understates what memory can
do; against it seldp's kernels, which stream the outputs they do not read, read 1.3-1.6 "of the
bound" in earlier runs. A fraction above 1 now means that the bound was mis-measured (a size
that fits in the cache, a load that changed between the samples), not that the code beat
memory. The copies and the collective are sampled in turns, so that all see the same load.
This CPU reports a 300 MiB last-level cache: up to 64 MiB per rank the copies' buffers and the
collective's partly stay in it, and whichever ran last evicts the other's, so B and the
fractions of 16-64 MiB (4 ranks: 16-32 MiB) move by up to 2x from run to run; the rows of 128
MiB and more are the steady ones.

seldp's ranks are threads of one process pinned one per core when they fit; Open MPI's are
processes (mpirun --oversubscribe, bound to cores by mpirun when they fit) and gloo's are
processes of torch.multiprocessing (\`seldp-bench-gloo.py\`, a file:// rendezvous, one thread
each), on the same machine, sizes and timing rule. With 4 ranks on 2 cores all oversubscribe.
gloo: ${gloo_note:+not measured in this run: }${gloo_note:-measured (the gloo columns)}.

Files: \`NAME.txt\` (the table seldp-bench printed), \`NAME.jsonl\` (one JSON object per row, with
\`bound_GBps\`, \`memcpy_GBps\` and \`stream_GBps\`), \`NAME.csv\`, and the plots
\`allreduce_busbw.png\`, \`broadcast_busbw.png\`, \`latency.png\`, \`bucket_sweep.png\`,
\`ranks_sweep.png\`; \`scale.*\` are results/bench/scale.sh's (the 2,048-rank layout), but for \`scale_notes.md\`, the measurements by hand between its runs.

## 1. Allreduce, F32 SUM (targets, issue 33: median bound fraction >= 0.90 at 2 ranks and >= 0.80 at 4 from 64 MiB up; seldp busbw >= 5x MPI)

$(side_by_side allreduce.csv 0.90 0.80 5)

## 2. Broadcast (targets: bound fraction >= 0.85; >= 3x MPI_Bcast from 16 MiB up)

$(side_by_side broadcast.csv 0.85 0.85 3)

## 3. Small messages (target: no slower than Open MPI up to 64 KiB), and the debug mode

The last two columns: the same allreduces with \`SELDP_DEBUG_COLLECTIVES=1\` (every collective
first agrees on a fingerprint of the call through an allgather), a separate run.

$(latency_table)

## 4. Session reduce of a realistic selection (targets: <= 1.25x one raw allreduce of the same bytes; extra memory <= one bucket + FP32 staging of the half inputs)

10,000 tensors (40% vectors, 50% mid-size matrices, 10% large), half BF16 and half F32 by
count, weights are token counts (W not a power of two), 25 MiB buckets. The raw allreduce is
an F32 allreduce of the same bytes; the copies of the bound, the raw allreduce and the reduce
are sampled in turns. The reduce runs in place on the caller's tensors (F32 kernel for F32,
exact BF16 upcast and round-to-nearest-even for BF16, 1/W through doubles). Extra memory is
the peak RSS during the reductions (VmHWM, reset before them) minus the RSS before, per rank.

$reduce_header
$(reduce_rows reduce.csv)

F32, BF16 and F16 selections (1,000 tensors) over the 16-256 MiB sweep; the bound fraction of a
reduce counts the bytes of its gradients (BF16: half those of F32 for the same elements):

$reduce_header
$(reduce_rows reduce_f32.csv reduce_bf16.csv reduce_f16.csv)

F16 against BF16 (the same elements and bytes; F16 takes the same fused register path with F16C
conversions, target: within 1.15x of BF16's time):

| ranks | bytes per rank | BF16 reduce (ms) | F16 reduce (ms) | F16 / BF16 | target |
|---:|---:|---:|---:|---:|---|
$(half_rows)

## 5. What the debug mode and staged_commit cost

The session reduce of section 4 at 64 MiB per rank, three runs: plain, with
\`SELDP_DEBUG_COLLECTIVES=1\` (the agreement of every collective's fingerprint, issue #15), and
with \`cfg.staged_commit\` (\`--staged-commit\`: results staged in FP32 and committed only once
every rank confirmed).

$(cost_table)

## 6. Sweeps

Bucket size (\`bucket_sweep.png\`, \`bucket_sweep.txt\`): on the host transport a reduction is one
rendezvous whatever the bucket (the fused path reduces each bucket in turn inside it), so the
bucket should not matter; each reduce is sampled in turns with one raw allreduce of the same
bytes, and their ratio takes out the drift of the machine's memory bandwidth from one bucket
to the next. The last column is what one raw allreduce per bucket costs (sampled on its own).

| bucket | reduce (ms) | raw allreduce in turns (ms) | reduce / raw | raw, one allreduce per bucket (ms) |
|---:|---:|---:|---:|---:|
$(awk -F, 'NR > 1 && $1 == "reduce" && $2 == "seldp-host" { r[$11] = $5; w[$11] = $13; k[++n] = $11 }
          NR > 1 && $17 == "raw: bucketed" { b[$11] = $5 }
          END { for (i = 1; i <= n; i++) printf "| %d MiB | %.1f | %.1f | %.2f | %s |\n", k[i] / 1048576,
                    r[k[i]] / 1000, w[k[i]] / 1000, r[k[i]] / w[k[i]],
                    (k[i] in b ? sprintf("%.1f", b[k[i]] / 1000) : "-") }' bucket_sweep.csv)

Rank count (\`ranks_sweep.png\`, \`ranks_sweep.txt\`): simulated ranks on $cores cores, one size
per rank (ranks beyond the cores time-share them and sleep between phases).

$(awk -F, 'NR > 1 && $2 == "seldp-host" { printf "- %d rank%s: busbw %.2f GB/s, B %.1f GB/s, bound fraction %.2f\n", $3, ($3 > 1 ? "s" : ""), $7, $18, $8 }' ranks_sweep.csv)

## 7. Overlap with backward (target: a step within 1.2x max(compute, communication) for a backward comparable to the communication)

\`seldp-bench --op overlap --compute-ratio 0.5,1,2\` (\`overlap.txt\`): 2 ranks, a model of
layers of one bucket each, whose backward sleeps per layer (a sleep, not a loop: it leaves the
cores to the progress threads, as a GPU's backward does) for a total of 0.5, 1 and 2 times the
communication alone (timed first; a sleep overshoots, so the compute / comm column is the
measured one). comm: the overlapped reduction alone (start, every mark at once, finish);
overlap: start, each layer marked as its backward ends, finish. Two sessions: the default, in
place (\`cfg.overlap_in_place\`, true by default: each bucket's results written into the
gradients as it completes, after a copy of them is kept; any failure puts them back, so the
container is unchanged by a failure) and the staged one (\`cfg.overlap_in_place = false\`:
every result staged until finish's final agreement, then copied into the gradients; nothing
is written before every bucket has succeeded). The staged commit is a copy of every result
after the last bucket, on the critical path: on the host transport, whose communication is
itself memory traffic on the same cores, about a third of the communication, which is the
staged rows' excess when the backward is as long as the communication. In place, what is left
after the last mark is the last bucket, so few large buckets (4 MiB buckets of 16 MiB: 4
layers) leave a larger tail. Every overlapped time is set against max(compute, the fastest
communication of the same bytes and bucket: the least comm or comm_staged row of any ratio),
per repetition, and the table gives the median of the repetitions' figures
(\`over_max\`); the target is the default session's.

A communication measured alone at several times its usual time for a whole run (one of four
runs of issue 33 measured 45 ms against 15-19 ms) is the machine's load, not a cold buffer:
the page faults of a run do not grow with its samples (the buffers are touched before the
timing), while one busy process pinned to one of the two cores doubles the communication
alone (12.4 ms to 23.9 ms; 19.5 ms with SELDP_BENCH_PIN=0): each rank's thread and its
session's progress thread are pinned to the rank's core, so a process holding that core holds
the rank's share of every bucket, and the other rank waits for it. The host takes the cores
too: this machine is a guest on shared cores, and each repetition's line of \`seldp-bench -r\`
gives the share of the CPUs' time the hypervisor gave to other guests (steal). On 2026-12-03,
with nothing else running, runs whose repetitions saw 5 to 15 % steal were slow and scattered
(the communication alone 26-31 ms, slowest repetitions 2-3x that), while eight runs minutes
later at under 1 % steal were steady (compute 15.0-16.7 ms, communication 15.1-16.0 ms, the
overlapped step 1.05-1.10x) with no outlier: the 45 ms outlier is most likely time the host
took from the rank threads, which no setting of the benchmark removes. The spread column shows
how far the repetitions of this run moved.

$(overlap_table)

## 8. GPU rows

\`seldp-bench --gpu\` (raw ncclAllReduce, seldp's allreduce and reduce on NCCL, host-staged with
device buffers) needs a GPU; where there is none it prints:

    $("$bench" --gpu 2>&1 | tail -n 1)

EOF
    cat sharded.md
} >README.md

echo "results/bench: done in $out (load average $load_before before, $load_after after)"
