#!/usr/bin/env python3
"""Compare two seldp checkpoints tensor by tensor (relative L2 error) and two reports' losses.

usage: compare.py RESUMED_DIR UNINTERRUPTED_DIR RESUMED_REPORT UNINTERRUPTED_REPORT
Prints a Markdown table. Reads the shards through index.json (offsets, dtype, shape)."""
import json
import math
import struct
import sys


def tensors(folder):
    index = json.load(open(f"{folder}/index.json"))
    out = {}
    for path, t in index["tensors"].items():
        with open(f"{folder}/{t['file']}", "rb") as f:
            f.seek(t["offsets"][0])
            raw = f.read(t["offsets"][1] - t["offsets"][0])
        if t["dtype"] == "F32":
            out[path] = struct.unpack(f"<{len(raw) // 4}f", raw)
        else:
            out[path] = raw
    return index, out


def main():
    resumed_dir, full_dir, resumed_report, full_report = sys.argv[1:5]
    ri, r = tensors(resumed_dir)
    fi, f = tensors(full_dir)
    print(f"# Resharded resume vs uninterrupted run (step {ri['step']})\n")
    print("Saved at world 8, ep 4 after step 3; resumed at world 4, ep 2; trained to step 6. "
          "The uninterrupted run trains world 8, ep 4 to step 6.\n")
    print(f"- token stream state: resumed `{ri['token_stream']['state']}`, "
          f"uninterrupted `{fi['token_stream']['state']}`"
          f" ({'identical' if ri['token_stream'] == fi['token_stream'] else 'DIFFERENT'})")
    rl = {s["step"]: s["loss"] for s in json.load(open(resumed_report))["steps"]}
    fl = {s["step"]: s["loss"] for s in json.load(open(full_report))["steps"]}
    print("\n| step | loss (resumed, world 4 ep 2) | loss (uninterrupted, world 8 ep 4) | rel. diff |")
    print("|---:|---:|---:|---:|")
    for step in sorted(rl):
        d = abs(rl[step] - fl[step]) / abs(fl[step])
        print(f"| {step} | {rl[step]:.9f} | {fl[step]:.9f} | {d:.2e} |")
    worst, worst_path, identical = 0.0, "-", 0
    for path, a in r.items():
        b = f[path]
        if a == b:
            identical += 1
            continue
        diff = math.sqrt(sum((x - y) ** 2 for x, y in zip(a, b)))
        norm = math.sqrt(sum(y * y for y in b))
        rel = diff / norm if norm else diff
        if rel > worst:
            worst, worst_path = rel, path
    print(f"\n{len(r)} logical tensors: {identical} bit-identical, largest relative error "
          f"{worst:.2e} (`{worst_path}`); FP32 tolerance 1e-05: "
          f"{'PASS' if worst <= 1e-5 else 'FAIL'}")


main()
