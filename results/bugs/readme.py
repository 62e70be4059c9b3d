#!/usr/bin/env python3
"""Assemble results/bugs/README.md from what regenerate.sh wrote (called by it).

usage: readme.py DIR HARNESS   (DIR: results/bugs; the catalog in DIR/catalog.md)
"""
import json
import os
import subprocess
import sys

here, harness = sys.argv[1], sys.argv[2]
bugs_bin = os.environ.get("SELDP_BUGS", os.path.join(os.path.dirname(harness), "seldp-bugs"))
bugs = json.loads(subprocess.run([bugs_bin, "--json"], check=True, capture_output=True,
                                 text=True).stdout)

# Where each bug is planted in the harness: the framework's own place for the mistake.
WHERE = {
    "aux-microbatch": "the router losses' factor of each micro-batch (`router_scale` in "
                      "harness/run/microbatch.c, `tm_model_set_router_scale`): N / N_m instead of "
                      "N / (M N_m), the division by the number of micro-batches left out.",
    "last-microbatch": "the export scale of every set (`hx_inject_scale`): the step's tokens "
                       "over the last micro-batch's, as if the loss had been normalized by the "
                       "last micro-batch's token count.",
    "found-inf-local": "the skip decision of the update (`hx_loss_scale_skips`): the dense "
                       "parameters follow a found_inf of the dense gradients only, the experts "
                       "one of the expert gradients only, each agreed over the world.",
    "ep-scale": "the export scale of the expert sets (`hx_inject_scale`): × the EP size on top "
                "of the correct normalization.",
    "rank-mean": "the weights and export scales of the dense sets: each rank's own token mean, "
                 "then a mean over the ranks with equal weights.",
    "world-div": "the export scale of the expert sets: ÷ the EP size (a mean over the world "
                 "instead of the expert-data group).",
    "tied-twice": "after the reductions, the tied embedding's gradient summed over its group a "
                  "second time (`hx_inject_after_reduce`).",
    "local-aux": "the load-balancing counts' all-reduce skipped (`hx_router_balance`): each data "
                 "shard's own f_e.",
    "router-tp": "the sequence-parallel set's reduction (`hx_inject_reduce`): each rank sums only "
                 "the members of its own TP rank (its data-parallel group) and divides by the "
                 "set's whole weight, as Megatron did for router and norm weights without the "
                 "`sequence_parallel` attribute (PR #619 adds it).",
    "aux-cp": "the scale the backward gives the router losses' gradient "
              "(`tm_set_router_loss_grad_scale`, set by `hx_inject_rank_model`): 1/cp for the "
              "load-balancing and the z-loss, as `MoEAuxLossAutoScaler`'s scale lacked the "
              "`cp_size` factor (PR #2237).",
    "aux-dp": "the same scale, 1/dp for the global-scope load-balancing loss: global counts, "
              "local probabilities, no × dp (PR #3769).",
    "norm-per-group": "`--clip-grad`'s norm (`hx_inject_norm`, `hx_inject_clip`): each rank's "
                      "norm of the gradients it holds, averaged over the world, as DeepSpeed's "
                      "`clip_grad_norm_` averages per-rank norms over the data-parallel group "
                      "(PR #8478 counts each expert once).",
    "edp1-skip": "the export scale of an expert set of one rank: the skipped reduction skips the "
                 "division by the dense data-parallel size too (× dp), as FSDP2 skipped the "
                 "reduce-scatter and its divide factor for a group of one (PR #167178).",
    "shared-expert-tp": "after each shared-expert gradient's export, before the data-parallel "
                        "reduction (`hx_inject_exported`): a sum over the TP group, the second "
                        "TP all-reduce of parameters marked as needing one.",
    "tied-zero": "the embedding set's reduce-scatter under `--zero 1` "
                 "(`hx_inject_zero_emb`, harness/check/inject_zero.c): each stage's data-parallel "
                 "reduce-scatter first, the embedding group's cross-stage sum of the whole tied "
                 "gradient after it, so a range holds one stage's sum plus the other stage's "
                 "unreduced local gradient (the embedding lies first in stage 0's buffer and "
                 "last in the last stage's, in different ranks' parts).",
    "half-accum": "every replica set's reduction (`hx_inject_reduce`): the members' inputs added "
                  "one after another, each partial sum rounded to the gradients' half dtype, "
                  "as a ring all-reduce in bf16 does; a mean rounds the quotient once more.",
}

# What each pending bug needs of the step being built, and where its plant will go.
HOOKS = {
    "aux-microbatch": "`--micro-batches M`: call `tm_set_router_loss_grad_scale(model, M, M)` "
                      "in the micro-batch loop (the router losses' gradient not divided by M "
                      "while the language-model loss is), and add the hypothesis ×M to "
                      "`router_loss_scale` in diagnose.c (coefficients × M).",
    "last-microbatch": "`--micro-batches M`: the step's token normalizer (the global token "
                       "count in `hx_set_export_scale` and the dense weights) taken from the "
                       "last micro-batch's global tokens instead of the step's; the diagnosis "
                       "then sees every class off by one common factor (the step's tokens over "
                       "the last micro-batch's), which needs a branch beside the expert-scale "
                       "ones.",
    "tied-zero": "`--zero 1` with pp > 1: in the sharded optimizer's reduction, the embedding "
                 "group's cross-stage sum of the tied copy applied after the dense "
                 "reduce-scatter, on each stage's shard range (the two stages' ranges cover "
                 "different parts, so partial sums mix); the diagnosis: embed.weight's shards "
                 "off with every other gradient right.",
    "found-inf-local": "`--loss-scale` with `--inject-overflow STEP`: the skip decision taken "
                       "per optimizer (the dense sets' found_inf and the expert sets' apart, "
                       "never all-reduced over both); the post-step check then sees one group's "
                       "parameters stepped while the other's did not.",
}


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def report_rows(path):
    """The failed checks of a step-1 report and its diagnosis."""
    r = json.loads(read(path))
    rows = []
    for c in r["checks"]:
        if c.get("failed", 0) > 0:
            worst = c.get("worst")
            rows.append((c["name"], c["failed"], c["tested"],
                         "-" if worst is None else "%.3g" % worst, c.get("first_failure") or ""))
    return rows, r.get("diagnosis")


def sweep_rows(path):
    s = json.loads(read(path))
    out = []
    for i, r in enumerate(s["runs"]):
        ratio = max(r.get("lockstep_ratio") or [0]) if r.get("lockstep") else None
        checks = "PASS" if r["checks_passed"] else "FAIL (%d failed)" % r["failed_checks"]
        out.append((i + 1, r["name"], checks, "yes" if r["agrees"] else "**no**",
                    "-" if ratio is None else "%.3g" % ratio))
    return s, out


def cell(text):
    return text.replace("|", "\\|").replace("\n", " ")


print("# Planted framework bugs: each mistake, where it shows, and how the checks name it\n")
print("Every gradient mistake of the harness's known-bug table (`harness/check/bugs.c`, "
      "[docs/harness.md](../../docs/harness.md#planted-bugs)) planted with `--inject NAME` where "
      "the framework made it, on the layout where it shows: what the reference check reports "
      "at step 1 in f32 (half-accum: f16) and in bf16, and a lockstep sweep over layouts where "
      "it shows, beside the same sweep without the bug. Regenerate (about half a minute on "
      "two cores):\n")
print("```sh\nresults/bugs/regenerate.sh     # uses build/bin/seldp-harness and "
      "build/bin/seldp-bugs\n```\n")
print("tiny-moe with 8 experts, top-2, 2 layers; step-1 runs with the harness's default tokens "
      "per rank; sweeps 3 SGD steps, seed 1234, global batch 255 tokens, compared in lockstep "
      "(each run's step k from the first run's weights of step k). Each folder holds "
      "`step1-<dtype>/report.{md,json}` and the console (`step1-<dtype>.txt`), "
      "`sweep-bug/` and `sweep-clean/` (`sweep.md`, `sweep.json`, `sweep.png` and the gnuplot "
      "script and data it is drawn from).\n")
print("## Catalog\n")
print(read(os.path.join(here, "catalog.md")))

for b in bugs:
    name = b["name"]
    d = os.path.join(here, name)
    print("\n## %s\n" % name)
    print("- **The mistake**: %s." % b["mistake"])
    print("- **Shipped in**: %s." % (b["citation"] or "no public issue; a mistake of the same "
                                     "family"))
    print("- **Shows on**: %s." % b["needs"])
    print("- **What the checks see**: %s." % b["signature"])
    if b["pending"]:
        print("- **Status: pending** — needs `%s`, which is not built yet; refused:\n"
              % b["pending"])
        print("  ```\n  $ seldp-harness %s --inject %s\n  %s  ```\n" %
              (b["demo"], name, read(os.path.join(d, "refused.txt"))))
        print("- **Hook it needs**: %s" % HOOKS.get(name, ""))
        continue
    print("- **Where it is planted**: %s" % WHERE.get(name, ""))
    first = "f16" if name in ("half-accum", "found-inf-local") else "f32"
    print("\n```sh\nseldp-harness %s --inject %s --dtype %s --steps 1\n```\n" %
          (b["demo"], name, first))
    if name == "half-accum":
        print("In f32 it is refused: `%s`\n" % read(os.path.join(d, "refused-f32.txt")).strip())
    print("**At step 1** (the checks that failed, failed/tested, worst error/bound):\n")
    print("| dtype | check | failed | worst | first failure |\n|---|---|---:|---:|---|")
    diags = []
    for dt in ((first,) if name == "found-inf-local" else (first, "bf16")):
        rows, diag = report_rows(os.path.join(d, "step1-" + dt, "report.json"))
        diags.append((dt, diag))
        for (check, failed, tested, worst, ff) in rows:
            print("| %s | %s | %d/%d | %s | %s |" % (dt, check, failed, tested, worst,
                                                    cell(ff)))
    print()
    for dt, diag in diags:
        print("> **diagnosis (%s)**: %s\n>" % (dt, diag))
    print()
    layouts = os.path.join(d, "layouts.tsv")
    if os.path.exists(layouts):
        print("No lockstep sweep: sweeps refuse `--zero 1`. Each layout where it shows, run "
              "on its own for 3 steps in f32 (`--zero 1 --global-batch 255 --seed 1234`), with "
              "`--inject %s` and clean:\n" % name)
        print("| layout | with the bug | diagnosis names | clean | diagnosis names |")
        print("|---|---|---|---|---|")
        for row in read(layouts).splitlines():
            f = row.split("\t")
            print("| `%s` | %s | %s | %s | %s |" % tuple(f[:5]))
        print()
        continue
    if not os.path.exists(os.path.join(d, "sweep.cmd")):
        print("No sweep: loss scaling is f16's alone and sweeps refuse it; the post-step check "
              "of the step above is where it shows.\n")
        continue
    sw, bug_rows = sweep_rows(os.path.join(d, "sweep-bug", "sweep.json"))
    _, clean_rows = sweep_rows(os.path.join(d, "sweep-clean", "sweep.json"))
    cmd = read(os.path.join(d, "sweep.cmd")).strip()
    print("**Lockstep sweep** over layouts where it shows (with `--inject %s`: %s; the same "
          "sweep clean: %s):\n" % (name, sw["result"],
                                    json.loads(read(os.path.join(d, "sweep-clean",
                                                                 "sweep.json")))["result"]))
    print("```sh\n%s\n```\n" % cmd)
    print("| # | run | checks (bug) | agrees (bug) | largest lockstep ratio (bug) | "
          "checks (clean) | agrees (clean) | largest lockstep ratio (clean) |")
    print("|---|---|---|---|---:|---|---|---:|")
    for a, c in zip(bug_rows, clean_rows):
        print("| %d | %s | %s | %s | %s | %s | %s | %s |" % (a[0], a[1], a[2], a[3], a[4], c[2],
                                                          c[3], c[4]))
    print("\n| with `--inject %s` | clean |\n|---|---|" % name)
    print("| ![%s](%s/sweep-bug/sweep.png) | ![clean](%s/sweep-clean/sweep.png) |" %
          (name, name, name))
