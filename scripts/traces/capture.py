#!/usr/bin/env python3
"""Capture allocation traces of real models through PyTorch's memory history, on a CUDA GPU.

    python3 scripts/traces/capture.py OUTDIR                 # every model, one process each
    python3 scripts/traces/capture.py OUTDIR MODEL [MODEL..] # only these
    python3 scripts/traces/capture.py --one MODEL OUTDIR     # one model in this process
    python3 scripts/traces/capture.py --small OUTDIR         # snapshot-small.pickle + its CSV
    python3 scripts/traces/capture.py --convert SNAPSHOT.pickle OUT.csv.gz

Models are built from configs with random weights (no network): torchvision `weights=None`,
transformers `XConfig()` + the model class. Each model runs in a fresh process: history is
enabled (`torch.cuda.memory._record_memory_history(enabled='all', context=None, stacks='python',
max_entries=MAX_ENTRIES)`: no stack frames are kept) *before* the model is moved to the GPU, so the
weights are in the trace; the model runs a few iterations; then every tensor is dropped (weights
too, so the trace ends with nothing live apart from what the libraries keep, such as cuBLAS
workspaces), the device is synchronized and `torch.cuda.memory._snapshot()` is converted.

Conversion (`convert`), from `snapshot['device_traces'][0]` (the trace of device 0, oldest first):

- `alloc` entries become `alloc` rows. Allocations are matched by address: an alloc at an address
  gets a new id (0, 1, 2, .. in order of allocation).
- The free of an allocation is its `free_completed` entry (the allocator has taken the block
  back; it differs from `free_requested` only when the block was used on another stream and
  waits for events). Only when a trace holds no `free_completed` entry at all are `free_requested`
  entries used instead. The other kind of free entry is ignored.
- A free whose address names no allocation seen in the trace (allocated before history was
  enabled) is dropped and counted (`dropped_frees`).
- `segment_alloc`, `segment_free`, `segment_map`, `segment_unmap`, `snapshot`, `oom` and any other
  action are ignored (counted in the JSON's `actions`).
- `size` is the entry's `size` field, in bytes (PyTorch records the size that was asked for, before
  its own rounding to 512 bytes; `size_multiple_of_512` in the JSON says how many are).
- `stream` is the entry's stream (a cudaStream_t value) renumbered 0, 1, .. in order of first
  appearance.

Output per model: OUTDIR/NAME.csv.gz (`seq,action,id,size,stream`, gzip with mtime 0) and
OUTDIR/NAME.json (model, what it does, ops, allocs, frees, live peak, what was dropped, the
snapshot's layout as observed).
"""
import gc
import gzip
import io
import json
import os
import pickle
import subprocess
import sys
import time

MAX_ENTRIES = 3_000_000


# ---------------------------------------------------------------- conversion (no torch needed)

def convert(snapshot, device=0):
    """Snapshot dict -> (rows, stats). rows: (action, id, size, stream)."""
    traces = snapshot["device_traces"][device]
    actions = {}
    for e in traces:
        actions[e["action"]] = actions.get(e["action"], 0) + 1
    free_action = "free_completed" if actions.get("free_completed") else "free_requested"
    live = {}  # addr -> (id, size, stream)
    streams = {}
    rows = []
    next_id = 0
    live_bytes = live_peak = live_count_peak = 0
    dropped_frees = dropped_bytes = 0
    alloc_over_live = 0
    size_mismatch = 0
    mult512 = 0
    for e in traces:
        a = e["action"]
        if a == "alloc":
            addr, size = e["addr"], int(e["size"])
            s = streams.setdefault(e.get("stream", 0), len(streams))
            if addr in live:
                # The previous allocation here was freed without an entry we saw.
                old = live.pop(addr)
                rows.append(("free", old[0], old[1], old[2]))
                live_bytes -= old[1]
                alloc_over_live += 1
            live[addr] = (next_id, size, s)
            rows.append(("alloc", next_id, size, s))
            next_id += 1
            if size % 512 == 0:
                mult512 += 1
            live_bytes += size
            if live_bytes > live_peak:
                live_peak = live_bytes
            if len(live) > live_count_peak:
                live_count_peak = len(live)
        elif a == free_action:
            addr = e["addr"]
            if addr not in live:
                dropped_frees += 1
                dropped_bytes += int(e.get("size", 0))
                continue
            ident, size, s = live.pop(addr)
            if int(e.get("size", size)) != size:
                size_mismatch += 1
            rows.append(("free", ident, size, s))
            live_bytes -= size
    stats = {
        "ops": len(rows),
        "allocs": next_id,
        "frees": len(rows) - next_id,
        "live_peak": live_peak,
        "live_count_peak": live_count_peak,
        "live_at_end": live_bytes,
        "live_count_at_end": len(live),
        "free_action_used": free_action,
        "dropped_frees": dropped_frees,
        "dropped_free_bytes": dropped_bytes,
        "alloc_over_live_address": alloc_over_live,
        "free_size_mismatch": size_mismatch,
        "size_multiple_of_512": mult512,
        "streams": len(streams),
        "trace_entries": len(traces),
        "actions": actions,
    }
    return rows, stats


def write_csv(path, rows):
    buf = io.StringIO()
    buf.write("seq,action,id,size,stream\n")
    for seq, (a, i, size, s) in enumerate(rows):
        buf.write(f"{seq},{a},{i},{size},{s}\n")
    with open(path, "wb") as raw:
        with gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=9) as gz:
            gz.write(buf.getvalue().encode())


def layout(snapshot):
    """What the snapshot looks like: keys, entry keys per action, value types."""
    out = {"keys": sorted(snapshot.keys())}
    dt = snapshot.get("device_traces", [])
    out["device_traces"] = f"list of {len(dt)} lists (one per device), entries oldest first"
    per_action = {}
    for trace in dt:
        for e in trace:
            k = per_action.setdefault(e["action"], {})
            for key, v in e.items():
                k.setdefault(key, type(v).__name__)
    out["entry_keys_by_action"] = per_action
    segs = snapshot.get("segments", [])
    if segs:
        out["segment_keys"] = sorted(segs[0].keys())
        blocks = segs[0].get("blocks", [])
        if blocks:
            out["block_keys"] = sorted(blocks[0].keys())
    for k in snapshot:
        if k not in ("segments", "device_traces"):
            v = snapshot[k]
            out.setdefault("other", {})[k] = type(v).__name__ + (
                f" {sorted(v.keys())}" if isinstance(v, dict) else "")
    return out


# ---------------------------------------------------------------- the models (need torch)

def _torch():
    import torch
    return torch


def start_history(torch):
    kw = dict(enabled="all", context=None, stacks="python", max_entries=MAX_ENTRIES)
    torch.cuda.memory._record_memory_history(**kw)


def stop_history(torch):
    torch.cuda.memory._record_memory_history(enabled=None)


def m_resnet50_infer(torch):
    """torchvision resnet50, eval, batch 32 x 3x224x224 fp32, no_grad, 6 forward passes."""
    import torchvision
    model = torchvision.models.resnet50(weights=None).eval()
    start_history(torch)
    model = model.cuda()
    with torch.no_grad():
        for _ in range(6):
            x = torch.randn(32, 3, 224, 224, device="cuda")
            y = model(x)
            y.argmax(1).cpu()
            del x, y
    del model


def m_resnet18_train(torch):
    """torchvision resnet18, train, batch 64 x 3x224x224 fp32, cross-entropy, Adam (lr 1e-3,
    default foreach), 5 steps with backward, zero_grad(set_to_none=True)."""
    import torchvision
    model = torchvision.models.resnet18(weights=None).train()
    start_history(torch)
    model = model.cuda()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for _ in range(5):
        x = torch.randn(64, 3, 224, 224, device="cuda")
        t = torch.randint(0, 1000, (64,), device="cuda")
        loss = torch.nn.functional.cross_entropy(model(x), t)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        loss.item()
        del x, t, loss
    del model, opt


def m_vit_b16_infer(torch):
    """torchvision vit_b_16, eval, batch 32 x 3x224x224 fp32, no_grad, 6 forward passes."""
    import torchvision
    model = torchvision.models.vit_b_16(weights=None).eval()
    start_history(torch)
    model = model.cuda()
    with torch.no_grad():
        for _ in range(6):
            x = torch.randn(32, 3, 224, 224, device="cuda")
            y = model(x)
            y.argmax(1).cpu()
            del x, y
    del model


BERT_SEQS = [37, 128, 64, 256, 19, 512, 200, 90, 384, 150]


def m_bert_base_dynseq(torch):
    """transformers BertModel from BertConfig() (bert-base: 12 layers, 768 hidden), eval, fp32,
    no_grad, 10 batches of 16 sequences, lengths 37,128,64,256,19,512,200,90,384,150 (each batch
    padded to its length, attention mask with random padding)."""
    from transformers import BertConfig, BertModel
    model = BertModel(BertConfig()).eval()
    start_history(torch)
    model = model.cuda()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for L in BERT_SEQS:
            ids = torch.randint(0, 30522, (16, L), generator=g).cuda()
            lens = torch.randint(max(1, L // 2), L + 1, (16,), generator=g)
            mask = (torch.arange(L)[None, :] < lens[:, None]).long().cuda()
            out = model(input_ids=ids, attention_mask=mask)
            out.last_hidden_state[:, 0].sum().item()
            del ids, mask, out
    del model


def m_gpt2_generate(torch):
    """transformers GPT2LMHeadModel from GPT2Config() (124M), eval, fp32, greedy generate: batch
    8, prompt 32 tokens, 128 new tokens (min_new_tokens=128), KV cache (DynamicCache) growing
    each step; two generate calls."""
    from transformers import GPT2Config, GPT2LMHeadModel
    cfg = GPT2Config()
    model = GPT2LMHeadModel(cfg).eval()
    start_history(torch)
    model = model.cuda()
    g = torch.Generator().manual_seed(0)
    for _ in range(2):
        ids = torch.randint(0, cfg.vocab_size, (8, 32), generator=g).cuda()
        mask = torch.ones_like(ids)
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=128,
                             min_new_tokens=128, do_sample=False, use_cache=True,
                             pad_token_id=cfg.eos_token_id)
        assert out.shape[1] == 32 + 128, out.shape
        out.cpu()
        del ids, mask, out
    del model


def m_gpt2_train(torch):
    """transformers GPT2LMHeadModel from GPT2Config() (124M), train, fp32, batch 8 x 512 tokens,
    LM loss, AdamW (lr 1e-4, default foreach), 4 steps with backward."""
    from transformers import GPT2Config, GPT2LMHeadModel
    cfg = GPT2Config()
    model = GPT2LMHeadModel(cfg).train()
    start_history(torch)
    model = model.cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(0)
    for _ in range(4):
        ids = torch.randint(0, cfg.vocab_size, (8, 512), generator=g).cuda()
        out = model(input_ids=ids, labels=ids)
        opt.zero_grad(set_to_none=True)
        out.loss.backward()
        opt.step()
        out.loss.item()
        del ids, out
    del model, opt


FRCNN_SIZES = [[(480, 640), (600, 800)], [(375, 500), (720, 1280)], [(800, 800), (512, 384)],
               [(1024, 768), (300, 400)]]


def m_fasterrcnn_infer(torch):
    """torchvision fasterrcnn_resnet50_fpn (weights=None, weights_backbone=None), eval, fp32,
    no_grad, 4 batches of 2 images of varying sizes (480x640+600x800, 375x500+720x1280,
    800x800+512x384, 1024x768+300x400; the model resizes to min side 800 / max 1333)."""
    import torchvision
    model = torchvision.models.detection.fasterrcnn_resnet50_fpn(
        weights=None, weights_backbone=None).eval()
    start_history(torch)
    model = model.cuda()
    with torch.no_grad():
        for batch in FRCNN_SIZES:
            imgs = [torch.rand(3, h, w, device="cuda") for h, w in batch]
            out = model(imgs)
            [o["boxes"].cpu() for o in out]
            del imgs, out
    del model


MODELS = {
    "resnet50-infer": m_resnet50_infer,
    "resnet18-train": m_resnet18_train,
    "vit_b_16-infer": m_vit_b16_infer,
    "bert-base-dynseq": m_bert_base_dynseq,
    "gpt2-generate": m_gpt2_generate,
    "gpt2-train": m_gpt2_train,
    "fasterrcnn-infer": m_fasterrcnn_infer,
}


def capture_one(name, outdir):
    torch = _torch()
    torch.manual_seed(0)
    torch.cuda.init()
    fn = MODELS[name]
    t0 = time.time()
    fn(torch)
    gc.collect()
    torch.cuda.synchronize()
    snap = torch.cuda.memory._snapshot()
    stop_history(torch)
    rows, stats = convert(snap)
    path = os.path.join(outdir, name + ".csv.gz")
    write_csv(path, rows)
    stats.update({
        "name": name,
        "what": " ".join(fn.__doc__.split()),
        "file": name + ".csv.gz",
        "bytes_gz": os.path.getsize(path),
        "max_entries": MAX_ENTRIES,
        "history_full": stats["trace_entries"] >= MAX_ENTRIES,
        "seconds": round(time.time() - t0, 1),
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(0),
        "snapshot_layout": layout(snap),
    })
    try:
        import torchvision
        stats["torchvision"] = torchvision.__version__
    except Exception:
        pass
    try:
        import transformers
        stats["transformers"] = transformers.__version__
    except Exception:
        pass
    with open(os.path.join(outdir, name + ".json"), "w") as f:
        json.dump(stats, f, indent=1)
    print(f"{name}: ops={stats['ops']} allocs={stats['allocs']} live_peak={stats['live_peak']} "
          f"({stats['live_peak'] / 2**20:.1f} MiB) dropped_frees={stats['dropped_frees']} "
          f"live_at_end={stats['live_at_end']} streams={stats['streams']} "
          f"entries={stats['trace_entries']} gz={stats['bytes_gz']} {stats['seconds']}s",
          flush=True)


def capture_small(outdir):
    """A tiny MLP (64 -> 128 -> 10, batch 8), two training steps with SGD: the raw snapshot
    pickle as torch.cuda.memory._dump_snapshot writes it, and its CSV."""
    torch = _torch()
    torch.manual_seed(0)
    torch.cuda.init()
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    start_history(torch)
    model = model.cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for _ in range(2):
        x = torch.randn(8, 64, device="cuda")
        t = torch.randint(0, 10, (8,), device="cuda")
        loss = torch.nn.functional.cross_entropy(model(x), t)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        loss.item()
        del x, t, loss
    del model, opt
    gc.collect()
    torch.cuda.synchronize()
    pk = os.path.join(outdir, "snapshot-small.pickle")
    torch.cuda.memory._dump_snapshot(pk)
    stop_history(torch)
    convert_file(pk, os.path.join(outdir, "snapshot-small.csv.gz"),
                 os.path.join(outdir, "snapshot-small.json"))


def convert_file(pickle_path, csv_path, json_path=None):
    with open(pickle_path, "rb") as f:
        snap = pickle.load(f)
    rows, stats = convert(snap)
    write_csv(csv_path, rows)
    stats["file"] = os.path.basename(csv_path)
    stats["from"] = os.path.basename(pickle_path)
    stats["pickle_bytes"] = os.path.getsize(pickle_path)
    stats["snapshot_layout"] = layout(snap)
    # Every entry of the small snapshot, verbatim, so the reader's author sees the exact layout.
    stats["device_trace_0"] = [{k: (v if isinstance(v, (int, float, str, type(None))) else repr(v))
                                for k, v in e.items()} for e in snap["device_traces"][0]]
    if json_path:
        with open(json_path, "w") as f:
            json.dump(stats, f, indent=1, default=str)
    print(f"{os.path.basename(pickle_path)}: ops={stats['ops']} allocs={stats['allocs']} "
          f"live_peak={stats['live_peak']} dropped_frees={stats['dropped_frees']} "
          f"pickle={stats['pickle_bytes']}B", flush=True)


def main(argv):
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    if argv[0] == "--one":
        capture_one(argv[1], argv[2])
        return 0
    if argv[0] == "--small":
        os.makedirs(argv[1], exist_ok=True)
        capture_small(argv[1])
        return 0
    if argv[0] == "--convert":
        convert_file(argv[1], argv[2], argv[3] if len(argv) > 3 else None)
        return 0
    outdir = argv[0]
    names = argv[1:] or list(MODELS)
    os.makedirs(outdir, exist_ok=True)
    parallel = int(os.environ.get("CAPTURE_PARALLEL", "4"))
    timeout = float(os.environ.get("CAPTURE_TIMEOUT", "200"))
    procs, failed = [], []
    pending = list(names)
    while pending or procs:
        while pending and len(procs) < parallel:
            n = pending.pop(0)
            log = open(os.path.join(outdir, n + ".log"), "w")
            p = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--one", n, outdir],
                                 stdout=log, stderr=subprocess.STDOUT)
            procs.append((n, p, log, time.time()))
        time.sleep(0.5)
        for item in list(procs):
            n, p, log, t0 = item
            if p.poll() is None and time.time() - t0 > timeout:
                p.kill()
            if p.poll() is not None:
                p.wait()
                log.close()
                procs.remove(item)
                with open(os.path.join(outdir, n + ".log")) as f:
                    text = f.read()
                if p.returncode != 0:
                    failed.append(n)
                    print(f"{n}: FAILED rc={p.returncode}\n{text[-3000:]}", flush=True)
                else:
                    print(text.strip().splitlines()[-1], flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
