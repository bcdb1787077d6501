#!/usr/bin/env python3
"""Writes the test fixtures of devcmd-trace next to this script (committed; rerun to regenerate).

- tiny.csv, tiny.csv.gz: a small transformer-like trace (weights kept live, steps of activations
  of mixed sizes freed in shuffled order, one large buffer mid-trace), ids numbered in alloc order.
- snapshot-tiny.pickle: the same operations as a PyTorch memory snapshot (what
  torch.cuda.memory._dump_snapshot writes: a dict with `device_traces`, one list per device; here a
  second, empty device), with addresses reused as PyTorch's caching allocator does, free_requested
  and free_completed pairs, segment events, a snapshot and an oom entry, and a free of a block
  allocated before the recording began, all of which the converter ignores or skips. Pickle
  protocol 4.
"""
import gzip, os, pickle, random

HERE = os.path.dirname(os.path.abspath(__file__))
KIB, MIB = 1 << 10, 1 << 20
rng = random.Random(7)

ops = []  # (action, id, size)
live = {}
next_id = 1


def alloc(size):
    global next_id
    i = next_id
    next_id += 1
    live[i] = size
    ops.append(("alloc", i, size))
    return i


def free(i):
    ops.append(("free", i, live.pop(i)))


weights = [alloc(rng.choice([1, 2, 3, 4, 6, 9]) * MIB + rng.randrange(0, 64) * KIB) for _ in range(12)]
carry = []
for step in range(24):
    acts = []
    for _ in range(rng.randrange(8, 20)):
        kind = rng.random()
        if kind < 0.5:
            size = rng.randrange(1, 64) * 512  # small
        elif kind < 0.9:
            size = rng.randrange(1, 48) * 64 * KIB  # medium
        else:
            size = rng.randrange(2, 7) * MIB + rng.randrange(0, 1024) * 256
        acts.append(alloc(size))
    if step == 10:
        big = alloc(24 * MIB)
    if step == 18:
        free(big)
    rng.shuffle(acts)
    keep = acts[:2]
    for i in acts[2:]:
        free(i)
    for i in carry:
        free(i)
    carry = keep
for i in carry:
    free(i)
# the weights stay live to the end

with open(os.path.join(HERE, "tiny.csv"), "w") as f:
    f.write("seq,action,id,size,stream\n")
    for seq, (a, i, s) in enumerate(ops):
        f.write(f"{seq},{a},{i},{s},0\n")
with open(os.path.join(HERE, "tiny.csv"), "rb") as src:
    data = src.read()
with gzip.GzipFile(os.path.join(HERE, "tiny.csv.gz"), "wb", mtime=0) as f:
    f.write(data)

# The snapshot: addresses reused LIFO per size, as a caching allocator would.
frames = [{"filename": "model.py", "line": 12, "name": "forward"},
          {"filename": "torch/nn/modules/module.py", "line": 1532, "name": "_call_impl"}]
entries = [
    {"action": "segment_alloc", "addr": 0x7F0000000000, "size": 2 * MIB, "stream": 0, "time_us": 0, "frames": frames},
    # allocated before the recording began: its free is skipped
    {"action": "free_requested", "addr": 0x7EFF00000000, "size": 512, "stream": 0, "time_us": 1, "frames": []},
    {"action": "free_completed", "addr": 0x7EFF00000000, "size": 512, "stream": 0, "time_us": 1, "frames": []},
]
free_addrs = {}
addr_of = {}
top = 0x7F0000000000
for t, (a, i, s) in enumerate(ops, start=2):
    if a == "alloc":
        pool = free_addrs.get(s, [])
        if pool:
            addr = pool.pop()
        else:
            addr = top
            top += (s + 0xFFFFF) // 0x100000 * 0x100000
            entries.append({"action": "segment_alloc", "addr": addr, "size": s, "stream": 0, "time_us": t, "frames": frames})
        addr_of[i] = addr
        entries.append({"action": "alloc", "addr": addr, "size": s, "stream": 0, "time_us": t, "frames": frames})
    else:
        addr = addr_of.pop(i)
        entries.append({"action": "free_requested", "addr": addr, "size": s, "stream": 0, "time_us": t, "frames": frames})
        entries.append({"action": "free_completed", "addr": addr, "size": s, "stream": 0, "time_us": t, "frames": []})
        free_addrs.setdefault(s, []).append(addr)
    if t == 100:
        entries.append({"action": "snapshot", "addr": 0, "size": 0, "stream": 0, "time_us": t})
entries.append({"action": "oom", "addr": 0, "size": 64 * MIB, "stream": 0, "time_us": 10**6, "device_free": 0})
snapshot = {
    "segments": [],
    "device_traces": [entries, []],
    "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": ""},
}
with open(os.path.join(HERE, "snapshot-tiny.pickle"), "wb") as f:
    pickle.dump(snapshot, f, protocol=4)
print(f"{len(ops)} ops, {len(entries)} snapshot entries")
