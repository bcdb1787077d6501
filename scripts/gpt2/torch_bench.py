#!/usr/bin/env python3
"""PyTorch's side of the GPT-2 decoding benchmark (issue 17): the same model directory the devcmd
host decodes (config.json + model.safetensors), the same prompt, greedy decoding on the GPU, two
ways:

  generate  transformers' `generate` (eager, its dynamic KV cache), timed per new token;
  graph     the best PyTorch does by hand: a plain PyTorch decode step (functional GPT-2 over the
            model's own tensors, a static KV cache of prompt + new tokens positions, the position
            in a device tensor, attention masked past it) captured once with torch.cuda.graph and
            replayed per token; the step writes its argmax into its own input, so a replay needs
            nothing from the host (as the devcmd host's recorded step).

For each: tokens/s over the decode steps (after the first new token), the time of each step
(median, p99, worst; generate: host time between tokens, as a streaming caller sees them; graph:
host time between replays that each end with the token read back), torch.cuda.max_memory_reserved()
and max_memory_allocated() with the weights loaded, and the greedy tokens; the hand-written step's
tokens are checked against generate's (and its logits against transformers' forward, fp32).

    python3 scripts/gpt2/torch_bench.py --model DIR --prompt-file DIR/prompt.txt --batch 1 \
        --new-tokens 128 --dtype fp16 --json out.json

Run on the H200 (BENCHMARKS.md, "GPT-2 small on the H200", keeps its figures). Each replay of the
hand-captured step is followed by its token's read-back before the next replay, so the host waits
once per token; devcmd's host keeps two reads in flight.
"""

import argparse
import json
import math
import statistics
import time


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--prompt-file", required=True, help="one row of token ids per line")
    p.add_argument("--batch", type=int, default=1, help="rows (a one-row prompt is repeated)")
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--dtype", choices=["fp16", "fp32"], default="fp16")
    p.add_argument("--repeat", type=int, default=3, help="timed runs of each method (best kept)")
    p.add_argument("--json", help="write the results here")
    return p.parse_args()


def spread(times_s):
    """Median, 99th percentile (nearest rank) and worst, in microseconds."""
    t = sorted(times_s)
    if not t:
        return None

    def at(q):
        return t[min(len(t), max(1, math.ceil(q * len(t)))) - 1]

    return {"median_us": statistics.median(t) * 1e6, "p99_us": at(0.99) * 1e6,
            "worst_us": t[-1] * 1e6, "steps": len(t)}


def read_prompt(path, batch):
    rows = [[int(t) for t in line.replace(",", " ").split()] for line in open(path)
            if line.strip() and not line.startswith("#")]
    if len(rows) == 1:
        rows = rows * batch
    rows = rows[:batch]
    assert len(rows) == batch and len({len(r) for r in rows}) == 1, "rows of one length"
    return rows


def bench_generate(torch, model, prompt, n):
    """transformers' generate, a timestamp per new token (a stopping criterion sees each)."""
    from transformers import StoppingCriteria, StoppingCriteriaList

    class Stamp(StoppingCriteria):
        def __init__(self):
            self.t = []

        def __call__(self, input_ids, scores, **kw):
            torch.cuda.synchronize()
            self.t.append(time.perf_counter())
            return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)

    stamp = Stamp()
    torch.cuda.synchronize()
    start = time.perf_counter()
    out = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=n,
                         do_sample=False, pad_token_id=0,
                         stopping_criteria=StoppingCriteriaList([stamp]))
    torch.cuda.synchronize()
    end = time.perf_counter()
    steps = [b - a for a, b in zip(stamp.t, stamp.t[1:])]
    return out[:, prompt.shape[1]:], stamp.t[0] - start if stamp.t else end - start, steps


class StaticDecoder:
    """A plain PyTorch GPT-2 decode step over a static KV cache, captured into one CUDA graph."""

    def __init__(self, torch, model, batch, prompt_len, positions):
        F = torch.nn.functional
        self.torch, self.F = torch, F
        c = model.config
        t = model.transformer
        self.E, self.H = c.n_embd, c.n_head
        self.D = self.E // self.H
        self.eps = c.layer_norm_epsilon
        self.wte, self.wpe = t.wte.weight, t.wpe.weight
        self.head = model.lm_head.weight
        self.layers = t.h
        self.lnf = t.ln_f
        dev, dt = self.wte.device, self.wte.dtype
        self.T = positions
        L = len(self.layers)
        self.K = torch.zeros(L, batch, self.H, positions, self.D, device=dev, dtype=dt)
        self.V = torch.zeros_like(self.K)
        self.tok = torch.zeros(batch, dtype=torch.long, device=dev)
        self.pos = torch.zeros(1, dtype=torch.long, device=dev)
        self.prompt = torch.zeros(prompt_len, batch, dtype=torch.long, device=dev)
        self.prompt_len = prompt_len
        self.arange = torch.arange(positions, device=dev)
        self.scale = 1.0 / (self.D ** 0.5)
        self.graph = None

    def step(self):
        torch, F = self.torch, self.F
        B, E, H, D = self.tok.shape[0], self.E, self.H, self.D
        # The prompt's token while inside it, else the previous argmax.
        p = torch.clamp(self.pos, max=self.prompt_len - 1)
        tok = torch.where(self.pos < self.prompt_len, self.prompt.index_select(0, p)[0], self.tok)
        x = self.wte[tok] + self.wpe[self.pos]
        mask = (self.arange > self.pos).view(1, 1, 1, self.T)
        for l, blk in enumerate(self.layers):
            h = F.layer_norm(x, (E,), blk.ln_1.weight, blk.ln_1.bias, self.eps)
            qkv = torch.addmm(blk.attn.c_attn.bias, h, blk.attn.c_attn.weight)
            q, k, v = qkv.view(B, 3, H, D).unbind(1)
            self.K[l].index_copy_(2, self.pos, k.unsqueeze(2))
            self.V[l].index_copy_(2, self.pos, v.unsqueeze(2))
            s = torch.matmul(q.unsqueeze(2), self.K[l].transpose(-1, -2)) * self.scale
            s = s.masked_fill(mask, float("-inf"))
            a = torch.matmul(torch.softmax(s.float(), dim=-1).to(s.dtype), self.V[l])
            x = x + torch.addmm(blk.attn.c_proj.bias, a.reshape(B, E), blk.attn.c_proj.weight)
            h = F.layer_norm(x, (E,), blk.ln_2.weight, blk.ln_2.bias, self.eps)
            f = F.gelu(torch.addmm(blk.mlp.c_fc.bias, h, blk.mlp.c_fc.weight), approximate="tanh")
            x = x + torch.addmm(blk.mlp.c_proj.bias, f, blk.mlp.c_proj.weight)
        h = F.layer_norm(x, (E,), self.lnf.weight, self.lnf.bias, self.eps)
        self.logits = h @ self.head.t()
        self.tok.copy_(self.logits.argmax(dim=-1))
        self.pos.add_(1)

    def capture(self):
        torch = self.torch
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):  # warm-up, as torch.cuda.graph asks
            for _ in range(3):
                self.step()
        torch.cuda.current_stream().wait_stream(s)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.step()

    def run(self, prompt_rows, n, keep_logits=False):
        """Greedy decoding of n new tokens: the prompt's steps, then one per token; each new token
        is read back (as a caller streaming tokens would)."""
        torch = self.torch
        self.prompt.copy_(torch.tensor(prompt_rows, device=self.tok.device).t())
        self.pos.zero_()
        self.K.zero_()
        self.V.zero_()
        P = self.prompt_len
        tokens, logits, stamps = [], [], []
        torch.cuda.synchronize()
        start = time.perf_counter()
        for i in range(P + n - 1):
            self.graph.replay()
            if i + 1 >= P:
                tokens.append(self.tok.cpu())  # waits for the replay
                stamps.append(time.perf_counter())
                if keep_logits:
                    logits.append(self.logits.float().cpu())
        first = stamps[0] - start
        steps = [b - a for a, b in zip(stamps, stamps[1:])]
        return torch.stack(tokens, dim=1), logits, first, steps


def main():
    a = parse()
    import torch
    import transformers

    dtype = torch.float16 if a.dtype == "fp16" else torch.float32
    torch.backends.cuda.matmul.allow_tf32 = False
    model = transformers.GPT2LMHeadModel.from_pretrained(a.model, dtype=dtype).cuda().eval()
    # Greedy to the end, as the devcmd host decodes: no stop at an end-of-text token.
    model.generation_config.eos_token_id = None
    rows = read_prompt(a.prompt_file, a.batch)
    prompt = torch.tensor(rows, device="cuda")
    B, P, n = len(rows), len(rows[0]), a.new_tokens
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    result = {"dtype": a.dtype, "batch": B, "prompt_len": P, "new_tokens": n,
              "weights_bytes": weights, "torch": torch.__version__,
              "transformers": transformers.__version__, "gpu": torch.cuda.get_device_name()}

    with torch.no_grad():
        # generate: one warm-up, then the best of --repeat.
        torch.cuda.reset_peak_memory_stats()
        bench_generate(torch, model, prompt, n)
        best = None
        for _ in range(a.repeat):
            toks, first, steps = bench_generate(torch, model, prompt, n)
            if best is None or sum(steps) < sum(best[2]):
                best = (toks, first, steps)
        toks, first, steps = best
        result["generate"] = {
            "tokens_per_s": B * len(steps) / sum(steps) if steps else 0.0,
            "first_token_ms": first * 1e3, "step": spread(steps),
            "max_memory_reserved": torch.cuda.max_memory_reserved(),
            "max_memory_allocated": torch.cuda.max_memory_allocated(),
            "tokens": toks.tolist(),
        }
        gen_tokens = toks.cpu()

        # The hand-captured graph.
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        dec = StaticDecoder(torch, model, B, P, P + n - 1)
        dec.prompt.copy_(prompt.t())
        dec.capture()
        best = None
        for _ in range(a.repeat + 1):  # the first run is a warm-up
            got = dec.run(rows, n)
            if best is None or sum(got[3]) < sum(best[3]):
                best = got
        toks, _, first, steps = best
        result["graph"] = {
            "tokens_per_s": B * len(steps) / sum(steps) if steps else 0.0,
            "first_token_ms": first * 1e3, "step": spread(steps),
            "max_memory_reserved": torch.cuda.max_memory_reserved(),
            "max_memory_allocated": torch.cuda.max_memory_allocated(),
            "kv_cache_bytes": 2 * dec.K.numel() * dec.K.element_size(),
            "tokens": toks.tolist(),
            "tokens_agree_with_generate": bool(torch.equal(toks, gen_tokens)),
        }
        if a.dtype == "fp32":  # the hand-written step against transformers' own logits
            _, logits, _, _ = dec.run(rows, n, keep_logits=True)
            ref = model(prompt).logits[:, -1, :].float().cpu()
            result["graph"]["first_logits_max_abs_vs_transformers"] = float((logits[0] - ref).abs().max())

    print(json.dumps({k: v for k, v in result.items()}, indent=1))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
