#!/usr/bin/env python3
"""Finds import circles between the files of a crate: no file may import a file that imports it
back, directly or through others.

Usage: scripts/import-cycles.py [CRATE_SRC_DIR]   (default core/src; exits 1 on a circle)

A file imports the file that *defines* each item it names through `crate::`, `super::`,
`self::` or child-module paths (in `use` declarations and inline), re-exports followed to their
definition; a `mod x;` declaration and a `pub use` re-export are not imports. Test modules (`#[cfg(test)] mod ...`) and files only
compiled for tests are left out: they may import what they test.
"""
import os
import re
import sys

root = sys.argv[1] if len(sys.argv) > 1 else "core/src"

def module_of(path):
    rel = os.path.relpath(path, root)[:-3].split(os.sep)
    if rel[-1] in ("lib", "mod"):
        rel = rel[:-1]
    return tuple(rel)

files = {}
for d, _, fs in os.walk(root):
    for f in fs:
        if f.endswith(".rs"):
            p = os.path.join(d, f)
            files[module_of(p)] = p

def strip(src):
    src = re.sub(r"//[^\n]*", "", src)
    # Drop `#[cfg(test)]` items (a test module or a test-only `mod x;`).
    out, i = [], 0
    while True:
        m = re.search(r"#\[cfg\((?:all\()?test[^\]]*\]\s*", src[i:])
        if not m:
            out.append(src[i:])
            break
        start = i + m.start()
        out.append(src[i:start])
        j = i + m.end()
        # skip one item: up to the matching brace or a semicolon
        depth = 0
        while j < len(src):
            c = src[j]
            if c == "{":
                depth += 1
            elif c == "}":
                depth -= 1
                if depth == 0:
                    j += 1
                    break
            elif c == ";" and depth == 0:
                j += 1
                break
            j += 1
        i = j
    return "".join(out)

test_only = set()
sources = {}
for mod, p in files.items():
    raw = open(p).read()
    for m in re.finditer(r"#\[cfg\((?:all\()?test[^\]]*\]\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;", raw):
        test_only.add(mod + (m.group(1),))
    sources[mod] = strip(raw)

# Definitions and re-exports per module.
defs = {mod: set(re.findall(r"\b(?:struct|enum|trait|type|fn|const|static|union|macro_rules!)\s+(\w+)", s)) for mod, s in sources.items()}
submods = {mod: set(re.findall(r"\bmod\s+(\w+)\s*[;{]", s)) for mod, s in sources.items()}

def parse_use_tree(tree, prefix):
    """Expands `a::{b, c::d as e}` into (path, alias) pairs."""
    tree = tree.strip()
    m = re.match(r"^([\w:]*?)(?:::)?\{(.*)\}$", tree, re.S)
    if m:
        base = prefix + [x for x in m.group(1).split("::") if x]
        parts, depth, cur = [], 0, ""
        for c in m.group(2):
            if c == "{":
                depth += 1
            elif c == "}":
                depth -= 1
            if c == "," and depth == 0:
                parts.append(cur)
                cur = ""
            else:
                cur += c
        parts.append(cur)
        out = []
        for part in parts:
            if part.strip():
                out += parse_use_tree(part, base)
        return out
    alias = None
    am = re.match(r"^(.*)\s+as\s+(\w+)$", tree)
    if am:
        tree, alias = am.group(1).strip(), am.group(2)
    path = prefix + [x for x in tree.split("::") if x]
    return [(path, alias or (path[-1] if path else None))]

reexports = {}
uses = {}
for mod, s in sources.items():
    reexports[mod] = {}
    uses[mod] = []
    for m in re.finditer(r"\b(pub(?:\([^)]*\))?\s+)?use\s+([^;]+);", s):
        for path, alias in parse_use_tree(m.group(2), []):
            if path and path[0] in submods[mod]:
                path = ["self"] + path
            if m.group(1) and alias and alias != "self":
                # A re-export is plumbing, not an import: names through it resolve to the
                # defining file.
                reexports[mod][alias] = path
            else:
                uses[mod].append(path)

def absolute(mod, path):
    if not path:
        return None
    if path[0] == "crate":
        return list(path[1:])
    if path[0] == "self":
        return list(mod) + list(path[1:])
    if path[0] == "super":
        base = list(mod)
        p = list(path)
        while p and p[0] == "super":
            base = base[:-1]
            p = p[1:]
        return base + p
    return None  # extern crate, core, alloc

def resolve(path, depth=0):
    """The module that defines the item `path` names (absolute), or the module itself."""
    if depth > 20 or path is None:
        return None
    # longest module prefix
    for cut in range(len(path), -1, -1):
        mod = tuple(path[:cut])
        if mod in files:
            rest = path[cut:]
            if not rest:
                return mod
            name = rest[0]
            if name in defs.get(mod, ()):
                return mod
            if name in reexports.get(mod, {}):
                target = absolute(mod, reexports[mod][name])
                if target is None:
                    return None
                return resolve(target + rest[1:], depth + 1)
            return mod
    return None

edges = {mod: set() for mod in files}
for mod, s in sources.items():
    if mod in test_only:
        continue
    paths = list(uses[mod])
    for m in re.finditer(r"\b((?:crate|super|self)(?:::\w+)+)", s):
        paths.append(m.group(1).split("::"))
    for path in paths:
        target = resolve(absolute(mod, path))
        if target is not None and target != mod and target in files and target not in test_only:
            # an item of a module file that only declares submodules counts as that file
            edges[mod].add(target)

# Tarjan's strongly connected components.
index, low, on, stack, sccs, counter = {}, {}, set(), [], [], [0]
sys.setrecursionlimit(10000)
def strong(v):
    index[v] = low[v] = counter[0]
    counter[0] += 1
    stack.append(v)
    on.add(v)
    for w in edges[v]:
        if w not in index:
            strong(w)
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
        if len(comp) > 1:
            sccs.append(comp)
for v in edges:
    if v not in index:
        strong(v)

name = lambda m: files[m][len(root) + 1:]
if not sccs:
    print(f"no import circle among the {len(files)} files of {root}")
    sys.exit(0)
for comp in sccs:
    print("circle:", ", ".join(sorted(name(m) for m in comp)))
    for m in sorted(comp):
        inner = sorted(name(t) for t in edges[m] if t in comp)
        print(f"  {name(m)} -> {', '.join(inner)}")
sys.exit(1)
