#!/usr/bin/env python3
"""Prints the GPT-2 decoding table of issue 17 from the JSON summaries of one run: the devcmd
host's (`gpt2 --json`, files devcmd-*.json) and PyTorch's (`torch_bench.py --json`, files
torch-*.json), all in DIR.

    python3 scripts/gpt2/table.py DIR

One row per (method, dtype, batch): tokens/s over the decode steps, µs per step (median, p99,
worst), the memory held at the peak (devcmd: device pages held; PyTorch:
torch.cuda.max_memory_reserved()), and for devcmd the bytes live after the last step (weights +
cache + buffers + the GEMM library's workspace), the held/live ratio, and held against the live
bytes without the workspace (weights + cache + activations); then devcmd's speed-ups against
PyTorch at equal dtype and batch.
"""

import glob
import json
import os
import sys


def mib(b):
    return f"{b / 2**20:.1f}" if b else "-"


def main():
    d = sys.argv[1] if len(sys.argv) > 1 else "."
    rows = []
    for path in sorted(glob.glob(os.path.join(d, "devcmd-*.json"))):
        s = json.load(open(path))
        st = s.get("step_us") or {}
        check = s.get("check") or {}
        rows.append({
            "method": "devcmd "
            + ("graph, updated per step" if s.get("graph_update") else "graph" if s["graph"] else "eager")
            + ("" if s["kv"] == "ahead" else " (kv grow)"),
            "dtype": {"f32": "fp32", "f16": "fp16"}[s["dtype"]], "batch": s["batch"],
            "tps": s["decode_tokens_per_s"], "median": st.get("median"), "p99": st.get("p99"),
            "worst": st.get("worst"), "held": s["held_peak_bytes"], "live": s["live_bytes"],
            # live without the GEMM library's workspace: weights + cache + activations.
            "model": s["live_bytes"] - s.get("library_scratch_bytes", 0),
            "check": ("ok" if check.get("passed") else "FAIL") if check else "-",
        })
    for path in sorted(glob.glob(os.path.join(d, "torch-*.json"))):
        s = json.load(open(path))
        for key, name in (("generate", "PyTorch generate"), ("graph", "PyTorch CUDA graph (by hand)")):
            if key not in s:
                continue
            m = s[key]
            st = m.get("step") or {}
            rows.append({
                "method": name, "dtype": s["dtype"], "batch": s["batch"], "tps": m["tokens_per_s"],
                "median": st.get("median_us"), "p99": st.get("p99_us"), "worst": st.get("worst_us"),
                "held": m["max_memory_reserved"], "live": None, "model": None,
                "check": "-" if key == "generate" else ("tokens = generate" if m.get("tokens_agree_with_generate") else "tokens DIFFER"),
            })
    f = lambda v, p=1: "-" if v is None else f"{v:.{p}f}"
    print("| method | dtype | batch | tokens/s | µs/step median | p99 | worst | held MiB | live MiB | held/live "
          "| held / (weights + cache + activations) | check |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in sorted(rows, key=lambda r: (r["dtype"], r["batch"], r["method"])):
        ratio = f"{r['held'] / r['live']:.3f}" if r["live"] else "-"
        model = f"{r['held'] / r['model']:.3f}" if r["model"] else "-"
        print(f"| {r['method']} | {r['dtype']} | {r['batch']} | {f(r['tps'])} | {f(r['median'])} | "
              f"{f(r['p99'])} | {f(r['worst'])} | {mib(r['held'])} | {mib(r['live'])} | {ratio} | {model} | "
              f"{r['check']} |")
    print()
    for dt in sorted({r["dtype"] for r in rows}):
        for b in sorted({r["batch"] for r in rows}):
            get = lambda m: next((r for r in rows if r["method"] == m and r["dtype"] == dt and r["batch"] == b), None)
            dg, de = get("devcmd graph"), get("devcmd eager")
            tg, tgen = get("PyTorch CUDA graph (by hand)"), get("PyTorch generate")
            parts = []
            if dg and tg:
                parts.append(f"devcmd graph / PyTorch graph {dg['tps'] / tg['tps']:.2f}x")
            if de and tgen:
                parts.append(f"devcmd eager / generate {de['tps'] / tgen['tps']:.2f}x")
            if dg and de:
                parts.append(f"devcmd graph / eager {dg['tps'] / de['tps']:.2f}x")
            if dg and tg:
                parts.append(f"held: devcmd {mib(dg['held'])} MiB vs PyTorch graph {mib(tg['held'])} MiB")
            if parts:
                print(f"{dt}, batch {b}: " + "; ".join(parts))


if __name__ == "__main__":
    main()
