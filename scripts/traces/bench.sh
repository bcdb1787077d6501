#!/usr/bin/env bash
# The memory benchmark of issue 10: every stored trace and every RMM cell replayed through
# devcmd-trace (configs `default` = granule pools, `pages` = whole pages), in one run, next to
# the anchors measured on the H200 on the very same traces (traces/anchors.json, written by
# scripts/traces/gpu-campaign.sh). Prints a markdown table.
#
#   bash scripts/traces/bench.sh            # builds devcmd-trace (release) first
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo build --release -q -p devcmd-trace
out=$(mktemp -d)
python3 scripts/traces/rmm.py "$out/rmm" >/dev/null
for t in traces/*.csv.gz "$out"/rmm/*.csv.gz; do
  n=$(basename "$t" .csv.gz)
  ./target/release/devcmd-trace "$t" -c default -c pages --json --timing-seconds 0.5 >"$out/$n.json"
done
python3 - "$out" <<'PY'
import glob, json, os, sys
out = sys.argv[1]
anchors = {}
for r in json.load(open("traces/anchors.json"))["results"]:
    anchors.setdefault(r["trace"], {})[r["anchor"]] = r["held_over_live"]
names = ["torch", "cupy", "cuda-async"]
print("| trace | live peak MiB | torch | cupy | cudaMallocAsync | best of the three | torch expandable (extra) | **devcmd granules** | devcmd pages | granules ≤ best? | ns/op warm (granules / pages) | smallest budget MiB (granules) |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|")
def key(f):
    n = os.path.basename(f)[:-5]
    return (n.startswith("rmm"), n)
for f in sorted(glob.glob(f"{out}/*.json"), key=key):
    n = os.path.basename(f)[:-5]
    d = json.load(open(f))
    c = {x["name"]: x for x in d["configs"]}
    a = anchors.get(n, {})
    best = min((a[k] for k in names if k in a), default=None)
    g, p = c["default"], c["pages"]
    cell = lambda k: f"{a[k]:.3f}" if k in a else "—"
    ok = "—" if best is None else ("yes" if g["held_over_live"] <= best else "**no**")
    mb = g.get("min_budget")
    print(f"| {n} | {d['live_peak']/2**20:.1f} | {cell('torch')} | {cell('cupy')} | {cell('cuda-async')} | "
          f"{'—' if best is None else f'{best:.3f}'} | {cell('torch-expandable')} | **{g['held_over_live']:.3f}** | "
          f"{p['held_over_live']:.3f} | {ok} | {g['ns_per_op']:.0f} / {p['ns_per_op']:.0f} | "
          f"{'—' if mb is None else f'{mb/2**20:.0f}'} |")
PY
