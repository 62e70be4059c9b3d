#!/usr/bin/env python3
"""Import circles of a source tree: the strongly connected components of its include graph.

A module is a .c file and the .h of the same name in the same folder (one node); a quoted
include resolves against the including file's folder, then every folder of the tree. Prints
each circle of more than one module and the largest size. Usage:

    harness/tools/include_cycles.py harness models src      # one report per tree
    harness/tools/include_cycles.py --max 2 harness          # exit 1 when a circle is longer
    harness/tools/include_cycles.py --files harness          # files, not modules, as nodes
"""
import os
import re
import sys

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def modules(root):
    files = []
    for d, _, names in os.walk(root):
        files += [os.path.join(d, n) for n in names if n.endswith((".c", ".h"))]
    return sorted(files)


FILES = False  # --files: every file its own node (only headers can form circles then)


def node(path):
    return path if FILES else os.path.splitext(path)[0]


def graph(root):
    files = modules(root)
    by_name = {}
    for f in files:
        by_name.setdefault(os.path.basename(f), []).append(f)
    edges = {}
    for f in files:
        src = node(f)
        edges.setdefault(src, set())
        with open(f, encoding="utf-8", errors="replace") as fh:
            text = fh.read()
        for inc in INCLUDE.findall(text):
            cand = os.path.normpath(os.path.join(os.path.dirname(f), inc))
            if cand not in files:
                hits = by_name.get(os.path.basename(inc), [])
                if not hits:
                    continue  # outside the tree (seldp/, models/ from harness/ ...)
                cand = hits[0]
            dst = node(cand)
            if dst != src:
                edges[src].add(dst)
    return edges


def sccs(edges):
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]
    sys.setrecursionlimit(10000)

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def main(argv):
    global FILES
    limit = None
    while argv and argv[0].startswith("--"):
        if argv[0] == "--files":
            FILES = True
            argv = argv[1:]
        elif argv[0] == "--max" and len(argv) > 1:
            limit = int(argv[1])
            argv = argv[2:]
        else:
            print("usage: include_cycles.py [--files] [--max N] [DIR...]", file=sys.stderr)
            return 2
    worst_all = 0
    for root in argv or ["harness", "models", "src"]:
        edges = graph(root)
        circles = [c for c in sccs(edges) if len(c) > 1]
        worst = max((len(c) for c in circles), default=1)
        worst_all = max(worst_all, worst)
        print(f"{root}: {len(edges)} modules, {len(circles)} circles, largest {worst}")
        for c in sorted(circles, key=len, reverse=True):
            print(f"  {len(c)}: " + " ".join(os.path.relpath(m, root) for m in c))
    if limit is not None and worst_all > limit:
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
