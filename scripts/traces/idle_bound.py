#!/usr/bin/env python3
"""What a slack policy costs on a trace when nothing fragments.

Model (issue 19, item 5): memory is held in 2 MiB granules, one device call maps or unmaps one
granule, and an allocation can use any held granule (no address space, no fragmentation: what
the manager's IdleGranules::Slack would do in the best case). After every operation, held
granules are kept between what the live bytes need, ceil(live / 2 MiB), and
floor(live * (1 + r) / 2 MiB): raised to the first when below it (maps), lowered to the second
when above it (unmaps), left alone in between. For each slack r it prints held/live over time
(held summed after every operation over live summed), device calls per operation, and the
same with one call per change of what is held (a map or unmap of several granules at once,
which the shim's `vm_map` already allows: what mapping runs of granules would cost). It is a
best case for policies that follow the live bytes of the moment with one call per granule, not
for every conceivable policy (one that knew the future could keep memory through short dips).

    python3 scripts/traces/idle_bound.py traces/*.csv.gz
"""
import csv
import gzip
import os
import sys

GRANULE = 2 << 20
SLACKS = [0.125, 0.25, 0.5, 1.0, 2.0]


def lives(path):
    """Live bytes after every operation of a `seq,action,id,size,stream` trace."""
    opener = gzip.open if path.endswith(".gz") else open
    live, out = 0, []
    with opener(path, "rt") as f:
        for row in csv.DictReader(f):
            size = int(row["size"])
            live += size if row["action"] == "alloc" else -size
            out.append(live)
    return out


def bound(series, slack):
    """(held/live over time, calls per operation, changes per operation) of the model at
    `slack`."""
    held = calls = changes = held_sum = 0
    for live in series:
        low = -(-live // GRANULE)
        high = max(low, int(live * (1 + slack)) // GRANULE)
        new = min(max(held, low), high)
        calls += abs(new - held)
        changes += new != held
        held = new
        held_sum += held * GRANULE
    ops = max(1, len(series))
    return held_sum / max(1, sum(series)), calls / ops, changes / ops


def main(paths):
    print("No-fragmentation model: held/live over time · device calls per op, one per granule · "
          "one per change of what is held, by slack r (held ≤ live × (1 + r)).\n")
    print("| trace | " + " | ".join(f"r = {r}" for r in SLACKS) + " |")
    print("|---|" + "---:|" * len(SLACKS))
    for path in paths:
        series = lives(path)
        cells = [f"{t:.2f} · {c:.2f} · {n:.2f}" for t, c, n in (bound(series, r) for r in SLACKS)]
        name = os.path.basename(path).split(".")[0]
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main(sys.argv[1:])
