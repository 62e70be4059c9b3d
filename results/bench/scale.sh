#!/bin/sh
# The harness at simulated scale: one checked step of a DeepSeek-V3-like layout, 256 experts,
# top-8, expert-parallel groups of 64, at worlds 64 to 4096 (one thread per rank), with the
# step's time split into ranks, reference, check and other, each phase's CPU time, and the
# run's peak RSS; the reference on one thread against the default (every core) at world
# REF_WORLD (2048), whose reports must agree bit for bit; and a lockstep sweep's cost per run
# against the same runs alone. Writes results/bench/scale.json, scale.md and (with gnuplot)
# scale.png.
#
#   results/bench/scale.sh                        uses build/bin/seldp-harness (a Release build)
#   SELDP_HARNESS_BIN=path/to/seldp-harness results/bench/scale.sh
#   SCALE_WORLDS="2048" results/bench/scale.sh    only some worlds
#   REF_WORLD=0 results/bench/scale.sh            no one-thread reference run
#   LOCKSTEP=0 results/bench/scale.sh             no lockstep measurement
#
# A timing script, not a test: it takes a few minutes on two cores and about 5 GiB of memory
# at world 2048. The machine should be otherwise idle; the load average before and after each
# run is recorded beside its figures, and the CPU times stay meaningful where wall times
# stretch with the load. Needs python3 (to read the reports) and GNU time (/usr/bin/time) for
# the peak RSS.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
harness=${SELDP_HARNESS_BIN:-$root/build/bin/seldp-harness}
worlds=${SCALE_WORLDS:-64 128 256 512 1024 2048 4096}
ref_world=${REF_WORLD:-2048}
lockstep=${LOCKSTEP:-1}
if [ ! -x "$harness" ]; then
    echo "scale.sh: $harness not found; build first (cmake --preset default; cmake --build build)" >&2
    exit 2
fi
if ! command -v python3 >/dev/null 2>&1; then
    echo "scale.sh: python3 is needed to read the reports" >&2
    exit 2
fi
timer=
if [ -x /usr/bin/time ]; then
    timer="/usr/bin/time -f %M -o"
else
    echo "scale.sh: no GNU time at /usr/bin/time: the peak RSS stays empty" >&2
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
started=$(date -u '+%Y-%m-%d %H:%M UTC')
commit=$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)

for world in $worlds; do
    args="--world $world --ep 64 --experts 256 --top-k 8 --steps 1"
    echo "== seldp-harness $args"
    cut -d' ' -f1-3 /proc/loadavg >"$work/load-before-$world"
    status=0
    if [ -n "$timer" ]; then
        # shellcheck disable=SC2086 # $timer and $args are word lists
        $timer "$work/rss-$world" "$harness" $args --out "$work/w$world" >"$work/out-$world" || status=$?
    else
        # shellcheck disable=SC2086
        "$harness" $args --out "$work/w$world" >"$work/out-$world" || status=$?
    fi
    cut -d' ' -f1-3 /proc/loadavg >"$work/load-after-$world"
    echo "$status" >"$work/status-$world"
    grep -E '^(step|result)' "$work/out-$world" || true
done

# the reference on one thread at ref_world, against the default's report of the same world
if [ "$ref_world" != 0 ]; then
    args="--world $ref_world --ep 64 --experts 256 --top-k 8 --steps 1 --reference-threads 1"
    echo "== seldp-harness $args"
    # shellcheck disable=SC2086
    "$harness" $args --out "$work/t1" >"$work/out-t1" || true
    grep -E '^(step|result)' "$work/out-t1" || true
fi

# a lockstep sweep against its runs alone: the ep preset at world 8, 20 steps
if [ "$lockstep" != 0 ]; then
    common="--world 8 --global-batch 256 --steps 20 --quiet"
    echo "== seldp-harness --sweep ep $common, then its runs alone"
    t0=$(date +%s.%N)
    # shellcheck disable=SC2086
    "$harness" --sweep ep $common --out "$work/sweep" >"$work/out-sweep" || true
    t1=$(date +%s.%N)
    echo "$t0 $t1" >"$work/sweep-time"
    for ep in 1 2 4 8; do
        a=$(date +%s.%N)
        # shellcheck disable=SC2086
        "$harness" --ep $ep $common --out "$work/alone-$ep" >/dev/null || true
        b=$(date +%s.%N)
        echo "$ep $a $b" >>"$work/alone-times"
    done
fi

# shellcheck disable=SC2086 # one argument per world
python3 - "$work" "$here" "$started" "$commit" "$ref_world" "$lockstep" $worlds <<'EOF'
import json, os, platform, sys

work, here, started, commit, ref_world, lockstep = sys.argv[1:7]
ref_world = int(ref_world)
worlds = [int(w) for w in sys.argv[7:]]

def read(name, default=""):
    path = os.path.join(work, name)
    return open(path).read().strip() if os.path.exists(path) else default

def cpu_model():
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()

def mem_gib():
    for line in open("/proc/meminfo"):
        if line.startswith("MemTotal"):
            return int(line.split()[1]) / 2**20
    return 0.0

phases = ["ranks", "reference", "check", "other"]
rows = []
for w in worlds:
    report = json.load(open(os.path.join(work, f"w{w}", "report.json")))
    step = report["steps"][0]
    t = step["time_s"]
    rss_kb = read(f"rss-{w}").splitlines()
    rss_kb = rss_kb[-1] if rss_kb else ""
    step_line = [l for l in read(f"out-{w}").splitlines() if l.startswith("step ")]
    rows.append({
        "world": w, "ep": 64, "experts": 256, "top_k": 8,
        "command": f"seldp-harness --world {w} --ep 64 --experts 256 --top-k 8 --steps 1",
        "passed": report["passed"] and read(f"status-{w}") == "0",
        "tokens": step["tokens"],
        "step_s": t["step"],
        "phases_s": {p: t[p] for p in phases},
        "cpu_s": t["cpu"],
        "rank_slowest_s": {k: t[k] for k in ("compute", "dispatch", "reduce")},
        "setup_s": report["time_s"]["setup"],
        "total_s": report["time_s"]["total"],
        "peak_rss_gib": int(rss_kb) / 2**20 if rss_kb.isdigit() else None,
        "load_before": read(f"load-before-{w}"),
        "load_after": read(f"load-after-{w}"),
        "step_line": step_line[0] if step_line else "",
    })

threads = None
if ref_world and ref_world in worlds and os.path.exists(os.path.join(work, "t1", "report.json")):
    one = json.load(open(os.path.join(work, "t1", "report.json")))
    many = json.load(open(os.path.join(work, f"w{ref_world}", "report.json")))
    def verdict(r):
        # what the reference decides: the checks and each step's figures, not the times
        steps = [{k: v for k, v in st.items() if k != "time_s"} for st in r["steps"]]
        checks = [{k: v for k, v in c.items() if "time" not in k} for c in r["checks"]]
        return json.dumps([checks, steps, r.get("tensor_classes")], sort_keys=True)
    t_one = one["steps"][0]["time_s"]["reference"]
    t_many = many["steps"][0]["time_s"]["reference"]
    threads = {"world": ref_world, "reference_s_one_thread": t_one,
               "reference_s_default": t_many, "threads_default": os.cpu_count(),
               "speedup": t_one / t_many if t_many > 0 else None,
               "same_bits": verdict(one) == verdict(many)}

lock = None
if lockstep != "0" and os.path.exists(os.path.join(work, "sweep-time")):
    t0, t1 = map(float, read("sweep-time").split())
    alone = {}
    for line in read("alone-times").splitlines():
        ep, a, b = line.split()
        alone[int(ep)] = float(b) - float(a)
    total = sum(alone.values())
    lock = {"command": "seldp-harness --sweep ep --world 8 --global-batch 256 --steps 20",
            "sweep_s": t1 - t0, "alone_s": alone, "alone_total_s": total,
            "overhead": (t1 - t0) / total if total > 0 else None}

machine = {"cpu": cpu_model(), "cores": os.cpu_count(), "memory_gib": round(mem_gib(), 1)}
out = {"started": started, "commit": commit, "machine": machine, "runs": rows,
       "reference_threads": threads, "lockstep": lock}
with open(os.path.join(here, "scale.json"), "w") as f:
    json.dump(out, f, indent=2)
    f.write("\n")

def s(x):
    return f"{x:.1f}"

md = [
    "# The harness at simulated scale",
    "",
    f"Regenerated by `results/bench/scale.sh` on {started} at commit {commit}: {machine['cpu']}, "
    f"{machine['cores']} cores, {machine['memory_gib']} GiB. One checked step (`--steps 1`, 64 +- 16 "
    "tokens per rank) of a DeepSeek-V3-like layout: 256 experts, top-8, expert-parallel groups of "
    "64 (`--ep 64`), one thread per rank, bf16 parameters, the host transport; the FP64 "
    "reference and its error scales on every core (`--reference-threads`, the default). Target "
    "at world 2048: the step in at most 20 s with at most 4 GiB peak RSS.",
    "",
    "The step's wall time splits into phases that add up to it (report.json `steps[].time_s`, and "
    "the step line): **ranks** (from the step's start until every rank has finished forward, "
    "backward and its reductions), **reference** (the replicas copied into one model, the FP64 "
    "reference and its error scales), **check** (every check of the step) and **other**. CPU is the "
    "process's user + system time in the phase: the ranks' during *ranks* (the main thread "
    "waits), the main thread's during the others. On a shared machine wall times stretch with "
    "the load while CPU times stay close to the work done; the load averages (1, 5, 15 min) "
    "before and after each run are in the last column.",
    "",
    "| world | tokens | step (s) | ranks (s) | reference (s) | check (s) | other (s) | ranks CPU user + sys (s) | reference CPU (s) | peak RSS (GiB) | setup (s) | result | load before -> after |",
    "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|",
]
for r in rows:
    p, c = r["phases_s"], r["cpu_s"]
    rss = f"{r['peak_rss_gib']:.2f}" if r["peak_rss_gib"] is not None else "-"
    md.append(
        f"| {r['world']} | {r['tokens']} | {s(r['step_s'])} | {s(p['ranks'])} | {s(p['reference'])} | "
        f"{s(p['check'])} | {s(p['other'])} | {s(c['ranks']['user'])} + {s(c['ranks']['sys'])} | "
        f"{s(c['reference']['user'] + c['reference']['sys'])} | {rss} | {s(r['setup_s'])} | "
        f"{'pass' if r['passed'] else '**FAIL**'} | {r['load_before']} -> {r['load_after']} |")
# Every rank thread that runs or waits for a core counts in the load average, so the figures
# after a run (and before the next) are mostly this program's own: only the load before the
# first run tells whether other work shared the machine.
first = rows[0]["load_before"] if rows and rows[0]["load_before"] else ""
if first and float(first.split()[0]) > machine["cores"]:
    md += ["", f"**The machine was shared during these runs**: the 1-minute load average was "
           f"{float(first.split()[0]):.1f} on {machine['cores']} cores before the first, so the wall "
           "times are stretched by other work; the CPU columns are the better measure of this "
           "program's own cost."]
md += ["", "The load averages after a run count its own rank threads (thousands of them, runnable "
       "or waiting for a core), not other work."]
md += ["", "Where the time goes: *ranks* is the FP32 model's forward and backward on every rank "
       "(OpenBLAS sgemm, the router, the experts), the alltoallv dispatch and the reductions "
       "through the host transport's rendezvous; its system CPU is mostly the wake-ups of "
       "sleeping rank threads. *reference* is OpenBLAS dgemm over the tokens routed to each "
       "expert, once for the values and about three times as much for the error scales, the "
       "experts and the router's token blocks spread over the reference's threads. Setup (joining the world, splitting the groups, building the "
       "models and initializing the sessions) is not part of the step.", ""]
if threads:
    md += [f"The reference at world {threads['world']} on one thread took "
           f"{threads['reference_s_one_thread']:.1f} s, on the default {threads['threads_default']} "
           f"threads {threads['reference_s_default']:.1f} s ({threads['speedup']:.2f}x); the two "
           f"reports' checks and step figures are "
           f"{'the same bits' if threads['same_bits'] else '**not the same**'}.", ""]
if lock:
    md += [f"A lockstep sweep (`{lock['command']}`: four runs, each run twice, in lockstep and "
           f"free) took {lock['sweep_s']:.1f} s against {lock['alone_total_s']:.1f} s for the "
           f"same four runs alone: {lock['overhead']:.2f}x, "
           f"{(lock['sweep_s'] - lock['alone_total_s']) / 4:.1f} s more per run.", ""]
md += ["Measurements by hand between regenerations (single runs, each with its date, commit and "
       "load): [scale_notes.md](scale_notes.md).", ""]
md += ["Step lines as printed:", ""]
md += ["    " + r["step_line"] for r in rows]
md.append("")
with open(os.path.join(here, "scale.md"), "w") as f:
    f.write("\n".join(md))
with open(os.path.join(work, "scale.dat"), "w") as f:
    for r in rows:
        p = r["phases_s"]
        f.write(f"{r['world']} {r['step_s']} {p['ranks']} {p['reference']} {p['check']} "
                f"{r['peak_rss_gib'] or 0}\n")
print("\n".join(md))
EOF

if command -v gnuplot >/dev/null 2>&1; then
    gnuplot <<EOF
set terminal pngcairo size 900,560 noenhanced font ",10"
set output "$here/scale.png"
set logscale xy 2
set xlabel "world (ranks)"
set ylabel "seconds (one checked step)"
set y2label "peak RSS (GiB)"
set y2tics
set logscale y2 2
set key left top
set grid
set title "seldp-harness, 256 experts, top-8, ep 64: one step against world size"
plot "$work/scale.dat" using 1:2 with linespoints title "step", \
     "" using 1:3 with linespoints title "ranks", \
     "" using 1:4 with linespoints title "reference", \
     "" using 1:5 with linespoints title "check", \
     "" using 1:6 axes x1y2 with linespoints dashtype 2 title "peak RSS"
EOF
else
    echo "scale.sh: no gnuplot: scale.png not drawn" >&2
fi
