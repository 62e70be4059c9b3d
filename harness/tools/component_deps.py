#!/usr/bin/env python3
"""The harness's component graph: what each component folder's files include, against what
harness/CMakeLists.txt declares.

A component is a folder of harness/ with its own static library (harness/README.md); it
compiles with its own headers and those of the components its `_harness_deps_NAME` list
names. A file needs a component when it includes one of that component's headers, directly or
through the headers it includes. The build already fails on a component used but not listed;
this also fails on one listed but not used, so that the lists stay the graph. Usage:

    harness/tools/component_deps.py            # print the graph the includes make
    harness/tools/component_deps.py --check    # exit 1 when CMakeLists.txt says otherwise
"""
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
HARNESS = os.path.dirname(HERE)
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
DEPS = re.compile(r"^set\(_harness_deps_(\w+)((?:\s+\w+)*)\)", re.M)
COMPONENTS = re.compile(r"^set\(_harness_components((?:\s+\w+)+)\)", re.M)


def declared():
    with open(os.path.join(HARNESS, "CMakeLists.txt")) as f:
        text = f.read()
    found = COMPONENTS.search(text)
    if not found:
        sys.exit("component_deps.py: no set(_harness_components ...) in harness/CMakeLists.txt")
    names = found.group(1).split()
    deps = {name: set(rest.split()) for name, rest in DEPS.findall(text)}
    for name in names:
        if name not in deps:
            sys.exit(f"component_deps.py: no set(_harness_deps_{name} ...) in "
                     "harness/CMakeLists.txt")
    return names, deps


def headers(names):
    """Each header's (and .inc's) path by its name, and the component it lives in."""
    where = {}
    for c in names:
        for n in sorted(os.listdir(os.path.join(HARNESS, c))):
            if n.endswith((".h", ".inc")):
                where.setdefault(n, c)
    return where


def needs(names):
    where = headers(names)

    def reach(path, seen):
        with open(path) as f:
            for inc in INCLUDE.findall(f.read()):
                base = os.path.basename(inc)
                if base in where and (where[base], base) not in seen:
                    seen.add((where[base], base))
                    reach(os.path.join(HARNESS, where[base], base), seen)

    graph = {}
    for c in names:
        used = set()
        folder = os.path.join(HARNESS, c)
        for n in sorted(os.listdir(folder)):
            if not n.endswith((".c", ".h", ".inc")):
                continue
            seen = set()
            reach(os.path.join(folder, n), seen)
            used |= {comp for comp, _ in seen}
        used.discard(c)
        graph[c] = used
    return graph


def main():
    check = "--check" in sys.argv[1:]
    names, deps = declared()
    graph = needs(names)
    bad = 0
    for c in names:
        print(f"{c}: {' '.join(d for d in names if d in graph[c]) or '-'}")
        if check:
            missing = graph[c] - deps[c]
            extra = deps[c] - graph[c]
            if missing:
                print(f"  includes from {' '.join(sorted(missing))} without declaring it")
                bad = 1
            if extra:
                print(f"  declares {' '.join(sorted(extra))} without including from it")
                bad = 1
    return bad


if __name__ == "__main__":
    sys.exit(main())
