#!/usr/bin/env python3
"""Replay allocation traces (our CSV, gzipped or not) through the anchors, on a CUDA GPU.

    python3 scripts/traces/anchors.py OUT.json TRACE.csv.gz [TRACE..]   # every anchor, every trace
    python3 scripts/traces/anchors.py --replay ANCHOR TRACE             # one replay, in-process;
                                                                        # prints one JSON line

Each (anchor, trace) pair runs in a fresh process, so no allocator state carries over. All
operations go to one stream (the stream column is ignored). Live peak comes from the trace itself
(the largest sum of live `size`s), the same for every anchor; held/live = held_peak / live_peak.

Anchors:
- torch: PyTorch's caching allocator, default settings. alloc = `torch.empty(size,
  dtype=torch.uint8, device='cuda')`, free = drop the tensor. held_peak =
  `torch.cuda.max_memory_reserved()` after the replay.
- torch-expandable: the same with `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`
  (informational: a harder anchor that maps pages into a reserved range).
- cupy: CuPy's default pool (`cupy.cuda.MemoryPool()`), alloc = `pool.malloc(size)`, free = drop the
  MemoryPointer. held_peak = max of `pool.total_bytes()` read after every allocation.
- cuda-async: raw cudaMallocAsync/cudaFreeAsync (`cupy.cuda.runtime.mallocAsync(size, 0)` /
  `freeAsync(ptr, 0)`: no CuPy pool object, no rounding) on the legacy default stream, from the
  device's current (= default) memory pool with the release threshold as the driver sets it (0;
  read and recorded). Before the replay the pool's `cudaMemPoolAttrReservedMemHigh` and
  `UsedMemHigh` are reset (set to 0, which resets them to the current value); held_peak =
  `cudaMemPoolAttrReservedMemHigh` read right after the last operation, before any
  synchronization. `reserved_sampled_max` (the largest `cudaMemPoolAttrReservedMemCurrent` read
  after every allocation) and `used_high` (`cudaMemPoolAttrUsedMemHigh`, the pool's own live peak)
  are recorded alongside. The replay makes no synchronizing call; the threshold acts only at
  synchronization, so it cannot release memory during the replay.
- cuda-async-max: the same with the release threshold set to UINT64_MAX first (what CuPy's
  MemoryAsyncPool sets; it also rounds requests up to 512 bytes, which this replay does not).

ANCHORS=a,b in the environment picks a subset.

DRIVER_HELD=1 also reads the driver's used memory (cudaMemGetInfo: total less free) after every
allocation and records its peak less its value before the replay (`driver_held_peak`,
`driver_held_over_live`): what the device holds for the anchor, whatever its own counters say.
Run it with ANCHORS_PARALLEL=1 (other processes on the GPU would move the count), and
`trace-gpu` (examples) for devcmd's figure of the same kind.

`py_ns_per_op` is the wall time of the replay loop over ops: Python and binding overhead
dominate it; it is no allocator speed figure.
"""
import gc
import gzip
import json
import os
import subprocess
import sys
import time

ALL_ANCHORS = ["torch", "torch-expandable", "cupy", "cuda-async", "cuda-async-max"]
ANCHORS = [a for a in os.environ.get("ANCHORS", ",".join(ALL_ANCHORS)).split(",") if a]
MAIN = ("torch", "cupy", "cuda-async")
DRIVER_HELD = os.environ.get("DRIVER_HELD") == "1"


class DriverHeld:
    """The driver's used memory, sampled: `sample()` after every allocation when DRIVER_HELD."""

    def __init__(self, mem_get_info):
        self.get = mem_get_info
        free, total = self.get()
        self.start = total - free
        self.peak = 0

    def sample(self):
        free, total = self.get()
        used = total - free - self.start
        if used > self.peak:
            self.peak = used

    def record(self, r):
        r["driver_held_peak"] = int(self.peak)
        r["driver_measured"] = "cudaMemGetInfo: total - free, after every allocation, less before"


def read_trace(path):
    """Returns (ops, live_peak, allocs) with ops a list of (is_alloc, id, size)."""
    opener = gzip.open if path.endswith(".gz") else open
    ops = []
    live = {}
    live_bytes = live_peak = allocs = 0
    with opener(path, "rt") as f:
        header = f.readline().strip()
        if header != "seq,action,id,size,stream":
            raise SystemExit(f"{path}: line 1: header {header!r}, expected seq,action,id,size,stream")
        for lineno, line in enumerate(f, 2):
            parts = line.rstrip("\n").split(",")
            if len(parts) != 5:
                raise SystemExit(f"{path}: line {lineno}: {len(parts)} fields, expected 5")
            action, ident, size = parts[1], int(parts[2]), int(parts[3])
            if action == "alloc":
                if ident in live:
                    raise SystemExit(f"{path}: line {lineno}: id {ident} allocated while live")
                live[ident] = size
                live_bytes += size
                allocs += 1
                if live_bytes > live_peak:
                    live_peak = live_bytes
                ops.append((True, ident, size))
            elif action == "free":
                if ident not in live:
                    raise SystemExit(f"{path}: line {lineno}: free of id {ident}, not live")
                live_bytes -= live.pop(ident)
                ops.append((False, ident, 0))
            else:
                raise SystemExit(f"{path}: line {lineno}: action {action!r}")
    return ops, live_peak, allocs


def replay_torch(ops):
    import torch
    torch.cuda.init()
    torch.cuda.reset_peak_memory_stats()
    torch.cuda.synchronize()
    drv = DriverHeld(torch.cuda.mem_get_info) if DRIVER_HELD else None
    live = {}
    empty, u8 = torch.empty, torch.uint8
    t0 = time.perf_counter()
    for is_alloc, ident, size in ops:
        if is_alloc:
            live[ident] = empty(size, dtype=u8, device="cuda")
            if drv:
                drv.sample()
        else:
            del live[ident]
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    r = {
        "held_peak": torch.cuda.max_memory_reserved(),
        "allocator_live_peak": torch.cuda.max_memory_allocated(),
        "py_seconds": dt,
        "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
        "measured": "torch.cuda.max_memory_reserved()",
    }
    if drv:
        drv.record(r)
    try:
        segs = torch.cuda.memory._snapshot()["segments"]
        r["expandable_segments_seen"] = any(s.get("is_expandable") for s in segs)
    except Exception as e:  # informational only
        r["expandable_segments_seen"] = repr(e)
    live.clear()
    return r


def replay_cupy(ops):
    import cupy
    pool = cupy.cuda.MemoryPool()
    cupy.cuda.Device().synchronize()
    drv = DriverHeld(cupy.cuda.runtime.memGetInfo) if DRIVER_HELD else None
    live = {}
    held = 0
    malloc, total = pool.malloc, pool.total_bytes
    t0 = time.perf_counter()
    for is_alloc, ident, size in ops:
        if is_alloc:
            live[ident] = malloc(size)
            t = total()
            if t > held:
                held = t
            if drv:
                drv.sample()
        else:
            del live[ident]
    cupy.cuda.Device().synchronize()
    dt = time.perf_counter() - t0
    live.clear()
    r = {"held_peak": held, "py_seconds": dt, "cupy": cupy.__version__,
         "measured": "max of cupy.cuda.MemoryPool().total_bytes() after every allocation"}
    if drv:
        drv.record(r)
    return r


def replay_cuda_async(ops, threshold_max):
    import cupy
    rt = cupy.cuda.runtime
    RELEASE, RES_CUR, RES_HIGH, USED_CUR, USED_HIGH = 4, 5, 6, 7, 8
    dev = rt.getDevice()
    rt.memGetInfo()  # make sure the context exists
    handle = rt.deviceGetMemPool(dev)
    default = rt.deviceGetDefaultMemPool(dev)
    found_threshold = rt.memPoolGetAttribute(handle, RELEASE)
    if threshold_max:
        rt.memPoolSetAttribute(handle, RELEASE, (1 << 64) - 1)
    threshold = rt.memPoolGetAttribute(handle, RELEASE)
    rt.memPoolSetAttribute(handle, RES_HIGH, 0)
    rt.memPoolSetAttribute(handle, USED_HIGH, 0)
    start_reserved = rt.memPoolGetAttribute(handle, RES_CUR)
    rt.deviceSynchronize()
    drv = DriverHeld(rt.memGetInfo) if DRIVER_HELD else None
    live = {}
    sampled = 0
    malloc, free, get = rt.mallocAsync, rt.freeAsync, rt.memPoolGetAttribute
    stream = 0  # the legacy default stream
    t0 = time.perf_counter()
    for is_alloc, ident, size in ops:
        if is_alloc:
            live[ident] = malloc(size, stream)
            r = get(handle, RES_CUR)
            if r > sampled:
                sampled = r
            if drv:
                drv.sample()
        else:
            free(live.pop(ident), stream)
    high = get(handle, RES_HIGH)
    used_high = get(handle, USED_HIGH)
    dt = time.perf_counter() - t0
    for ptr in live.values():
        free(ptr, stream)
    rt.deviceSynchronize()
    r = {"held_peak": int(high), "reserved_sampled_max": int(sampled),
            "used_high": int(used_high), "reserved_at_start": int(start_reserved),
            "release_threshold": int(threshold), "release_threshold_found": int(found_threshold),
            "pool_is_default": handle == default,
            "py_seconds": dt, "cupy": cupy.__version__,
            "measured": "cudaMemPoolAttrReservedMemHigh of the device's current (default) pool, "
                        "reset before the replay, read right after its last operation; raw "
                        "cudaMallocAsync/cudaFreeAsync (cupy.cuda.runtime.mallocAsync/freeAsync) "
                        "on the legacy default stream; release threshold " + str(int(threshold))}
    if drv:
        drv.record(r)
    return r


def replay(anchor, path):
    ops, live_peak, allocs = read_trace(path)
    gc.disable()
    if anchor in ("torch", "torch-expandable"):
        r = replay_torch(ops)
    elif anchor == "cupy":
        r = replay_cupy(ops)
    elif anchor == "cuda-async":
        r = replay_cuda_async(ops, False)
    elif anchor == "cuda-async-max":
        r = replay_cuda_async(ops, True)
    else:
        raise SystemExit(f"unknown anchor {anchor}")
    r.update({"anchor": anchor, "trace": os.path.basename(path), "ops": len(ops),
              "allocs": allocs, "live_peak": live_peak,
              "held_over_live": r["held_peak"] / live_peak if live_peak else None,
              "driver_held_over_live": (r["driver_held_peak"] / live_peak
                                        if live_peak and "driver_held_peak" in r else None),
              "py_ns_per_op": r.pop("py_seconds") / max(1, len(ops)) * 1e9})
    return r


def trace_name(path):
    b = os.path.basename(path)
    for ext in (".csv.gz", ".csv"):
        if b.endswith(ext):
            return b[: -len(ext)]
    return b


def run_all(out_json, paths, parallel, timeout):
    jobs = [(p, a) for p in paths for a in ANCHORS]
    results, procs = [], []
    pending = list(jobs)
    while pending or procs:
        while pending and len(procs) < parallel:
            path, anchor = pending.pop(0)
            env = dict(os.environ)
            env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
            env.pop("PYTORCH_ALLOC_CONF", None)
            if anchor == "torch-expandable":
                env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
            p = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--replay", anchor, path],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
            procs.append((path, anchor, p, time.time()))
        time.sleep(0.2)
        for item in list(procs):
            path, anchor, p, t0 = item
            if p.poll() is None and time.time() - t0 > timeout:
                p.kill()
            if p.poll() is not None:
                procs.remove(item)
                out, err = p.communicate()
                rec = {"anchor": anchor, "trace": trace_name(path)}
                if p.returncode == 0 and out.strip():
                    rec.update(json.loads(out.strip().splitlines()[-1]))
                    rec["trace"] = trace_name(path)
                else:
                    rec["error"] = f"rc={p.returncode}: {err[-1500:]}"
                    print(f"{trace_name(path)} {anchor}: FAILED {rec['error']}", flush=True)
                results.append(rec)
                if "held_peak" in rec:
                    drv = rec.get("driver_held_over_live")
                    drv = f" driver-held/live={drv:.3f}" if drv is not None else ""
                    print(f"{rec['trace']:<24} {anchor:<17} held={rec['held_peak']:>12} "
                          f"live={rec['live_peak']:>12} held/live={rec['held_over_live']:.3f}{drv}",
                          flush=True)
    order = {trace_name(p): i for i, p in enumerate(paths)}
    results.sort(key=lambda r: (order.get(r["trace"], 1 << 30), ALL_ANCHORS.index(r["anchor"])))
    with open(out_json, "w") as f:
        json.dump({"anchors": ANCHORS, "note": __doc__.strip(), "results": results}, f, indent=1)
    return results


def table(results):
    anchors = [a for a in ALL_ANCHORS if any(r["anchor"] == a for r in results)]
    by = {}
    meta = {}
    for r in results:
        by.setdefault(r["trace"], {})[r["anchor"]] = r.get("held_over_live")
        if "ops" in r:
            meta[r["trace"]] = (r["ops"], r["allocs"], r["live_peak"])
    lines = ["| trace | ops | allocs | live peak MiB | " + " | ".join(anchors)
             + " | best of " + ", ".join(MAIN) + " | best of all |",
             "|---|---:|---:|---:|" + "---:|" * len(anchors) + "---|---|"]
    for t, row in by.items():
        ops, allocs, live = meta.get(t, (0, 0, 0))
        cells = [f"{row[a]:.3f}" if row.get(a) is not None else "fail" for a in anchors]
        main3 = {a: row[a] for a in MAIN if row.get(a) is not None}
        every = {a: row[a] for a in anchors if row.get(a) is not None}
        best = min(main3, key=main3.get) if main3 else "-"
        best_all = min(every, key=every.get) if every else "-"
        lines.append(f"| {t} | {ops} | {allocs} | {live / 2**20:.1f} | " + " | ".join(cells)
                     + f" | {best} {main3.get(best, float('nan')):.3f}"
                     + f" | {best_all} {every.get(best_all, float('nan')):.3f} |")
    return "\n".join(lines)


def main(argv):
    if len(argv) >= 3 and argv[0] == "--replay":
        print(json.dumps(replay(argv[1], argv[2])), flush=True)
        return 0
    if len(argv) >= 2 and argv[0] == "--table":
        with open(argv[1]) as f:
            print(table(json.load(f)["results"]))
        return 0
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    parallel = int(os.environ.get("ANCHORS_PARALLEL", "8"))
    timeout = float(os.environ.get("ANCHORS_TIMEOUT", "240"))
    results = run_all(argv[0], argv[1:], parallel, timeout)
    print(table(results))
    return 0 if all("held_peak" in r for r in results) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
