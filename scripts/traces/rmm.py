#!/usr/bin/env python3
"""The RMM grid of BENCHMARKS.md's first table, written as traces in our plain CSV format.

Generates the same op sequences as benches/alloc/src/trace.rs (`generate(num, max, cap, seed)`):
SplitMix64 seeded with the cell's seed; each of the 2*N steps draws `size = 1 + next() % max`,
then (if something is live) `chance = next() % 100` and allocates when `chance < 73`, fewer than N
allocations were made so far and `live_bytes + size < cap`; with nothing live it always allocates;
otherwise it frees entry `next() % live_count` of the live list by swap-remove. After the 2*N
steps the remaining live allocations are freed, last first.

In the CSV, allocation ids are 0, 1, 2, .. in order; a free names the id of the swap-removed
entry; `stream` is always 0. The files are gzipped with mtime 0, so they are byte-identical from
run to run.

    python3 scripts/traces/rmm.py OUTDIR            # the 9 cells: rmm-N<n>-max<m>MiB.csv.gz
    python3 scripts/traces/rmm.py OUTDIR --cells 1000:1,10000:64 [--cap-gib 4] [--seed 1]
    python3 scripts/traces/rmm.py --ops N MAX_MIB   # print the op list as trace.rs's Op values
                                                    # (Alloc(size) / Free(index)), for comparison
    python3 scripts/traces/rmm.py --stats           # allocs, ops, live peak of every cell

Pure Python, no dependencies.
"""
import gzip
import io
import os
import sys

MASK = (1 << 64) - 1
MIB = 1 << 20
GIB = 1 << 30
ALLOC_PERCENT = 73
GRID = [(n, m) for n in (1000, 10000, 100000) for m in (1, 4, 64)]


class SplitMix64:
    def __init__(self, seed):
        self.state = seed & MASK

    def next_u64(self):
        self.state = (self.state + 0x9E3779B97F4A7C15) & MASK
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
        return z ^ (z >> 31)

    def below(self, n):
        return self.next_u64() % n


def generate(num, max_bytes, cap, seed):
    """Returns (ops, allocs, live_peak, live_count_peak); ops are ('alloc', id, size) or
    ('free', id, size, index) where index is the position in the swap-removed live list."""
    rng = SplitMix64(seed)
    ops = []
    live = []  # [(id, size)]
    live_bytes = live_peak = live_count_peak = 0
    allocs = 0
    for _ in range(2 * num):
        size = 1 + rng.below(max_bytes)
        if not live:
            do_alloc = True
        else:
            chance = rng.below(100)
            do_alloc = chance < ALLOC_PERCENT and allocs < num and live_bytes + size < cap
        if do_alloc:
            ops.append(('alloc', allocs, size))
            live.append((allocs, size))
            allocs += 1
            live_bytes += size
            live_peak = max(live_peak, live_bytes)
            live_count_peak = max(live_count_peak, len(live))
        else:
            index = rng.below(len(live))
            last = live.pop()
            if index < len(live):
                removed = live[index]
                live[index] = last
            else:
                removed = last
            live_bytes -= removed[1]
            ops.append(('free', removed[0], removed[1], index))
    while live:
        index = len(live) - 1
        ident, size = live.pop()
        ops.append(('free', ident, size, index))
    return ops, allocs, live_peak, live_count_peak


def cell_name(num, max_mib):
    return f"rmm-N{num}-max{max_mib}MiB"


def write_csv(path, ops):
    buf = io.StringIO()
    buf.write("seq,action,id,size,stream\n")
    for seq, op in enumerate(ops):
        buf.write(f"{seq},{op[0]},{op[1]},{op[2]},0\n")
    with open(path, "wb") as raw:
        with gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=6) as gz:
            gz.write(buf.getvalue().encode())


def parse_cells(s):
    cells = []
    for part in s.split(","):
        n, m = part.split(":")
        cells.append((int(n), int(m)))
    return cells


def main(argv):
    cap_gib, seed, cells = 4, 1, list(GRID)
    args = list(argv)
    if "--cap-gib" in args:
        i = args.index("--cap-gib")
        cap_gib = int(args[i + 1])
        del args[i:i + 2]
    if "--seed" in args:
        i = args.index("--seed")
        seed = int(args[i + 1])
        del args[i:i + 2]
    if "--cells" in args:
        i = args.index("--cells")
        cells = parse_cells(args[i + 1])
        del args[i:i + 2]
    cap = cap_gib * GIB
    if args and args[0] == "--ops":
        num, max_mib = int(args[1]), int(args[2])
        ops, *_ = generate(num, max_mib * MIB, cap, seed)
        out = sys.stdout
        for op in ops:
            out.write(f"Alloc({op[2]})\n" if op[0] == "alloc" else f"Free({op[3]})\n")
        return 0
    if args and args[0] == "--stats":
        for num, max_mib in cells:
            ops, allocs, peak, cpeak = generate(num, max_mib * MIB, cap, seed)
            print(f"{num} {max_mib} allocs={allocs} ops={len(ops)} live_peak={peak} "
                  f"live_peak_mib={peak / MIB:.1f} live_count_peak={cpeak}")
        return 0
    if len(args) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    outdir = args[0]
    os.makedirs(outdir, exist_ok=True)
    for num, max_mib in cells:
        ops, allocs, peak, cpeak = generate(num, max_mib * MIB, cap, seed)
        path = os.path.join(outdir, cell_name(num, max_mib) + ".csv.gz")
        write_csv(path, ops)
        print(f"{path}: ops={len(ops)} allocs={allocs} live_peak={peak} "
              f"({peak / MIB:.1f} MiB) live_count_peak={cpeak}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
