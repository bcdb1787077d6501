#!/usr/bin/env python3
"""Builds a GPT-2 with transformers from a fixed seed and writes what the devcmd decoding host
(`gpt2 --check DIR`) compares itself against.

Needs torch and transformers (the GPU machine has both; nothing here installs them). Any size by
flags; the CI fixture (examples/fixtures/gpt2-tiny) was made with

    python3 scripts/gpt2/make_fixture.py --out examples/fixtures/gpt2-tiny \
        --layers 2 --embd 64 --heads 4 --vocab 256 --positions 64 \
        --batch 2 --prompt-len 8 --new-tokens 8

`--model DIR` instead reads an existing Hugging Face GPT-2 directory (config.json +
model.safetensors) and writes only the prompt and the references for it.

What DIR (--out) holds afterwards:

  config.json        GPT2Config, as transformers' save_pretrained writes it
  model.safetensors  the weights in the Hugging Face layout (transformers' save_pretrained:
                     `transformer.wte.weight`, `transformer.h.N.attn.c_attn.weight` ...; Conv1D
                     weights are [in, out]); the lm_head is tied to wte and NOT stored
  prompt.txt         the prompt: one line per batch row, token ids separated by spaces (every
                     row the same length: no padding, no attention mask)
  reference.json     what was run and what came out (below)
  logits-fp32.raw    transformers' fp32 logits of every greedy step: little-endian f32, laid out
                     [step][batch row][vocab], no header. Step s holds the logits that chose new
                     token s: step 0 is the last prompt position, step s > 0 the position fed
                     new token s-1.
  logits-fp16.raw    (unless --no-fp16, and only where CUDA is there) the same model in fp16 on
                     the GPU, fed the fp32 greedy tokens (teacher-forced, so both runs see the same
                     sequence), its logits as f32 in the same layout

reference.json fields: "format" (1), "batch", "prompt_len", "new_tokens", "vocab", "seed" (the
seed that was used: model and prompt), "prompt" ([batch][prompt_len] ids), "tokens_fp32"
([batch][new_tokens] greedy ids, fp32 on the CPU: the reference), "logits_fp32" (file name),
"min_top2_gap_fp32" (smallest gap between the top two logits over every step and row: the
margin a checked host's logits have before a greedy token could flip), "fp32_cuda_vs_cpu_max_abs"
(transformers on the GPU in fp32 against the CPU, where run), and with fp16: "logits_fp16",
"tokens_fp16" (the fp16 model's own greedy ids), "fp16_vs_fp32_max_abs" (max abs difference of
the teacher-forced fp16 logits against fp32: PyTorch's own fp16 error on this run),
"fp16_tokens_agree" (whether its own greedy ids equal fp32's), versions of torch and
transformers.

The fp32 reference runs on the CPU (no TF32, no reduced-precision reductions), with the eager
attention implementation. Random biases and layer-norm parameters (not transformers' zeros and
ones) make a kernel that drops one fail the check. With `--min-gap G` (default 2e-3) a seed whose
greedy steps come closer than G between the two best logits is skipped for the next one (the
check's tolerance is 1e-3, so a greedy token cannot flip within it); the seed used is recorded.
"""

import argparse
import json
import os
import struct
import sys
import time


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="directory to write (created)")
    p.add_argument("--model", help="an existing HF GPT-2 directory to reference instead of building one")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--embd", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--positions", type=int, default=64)
    p.add_argument("--inner", type=int, default=None, help="MLP width (default 4 x embd)")
    p.add_argument("--init-range", type=float, default=0.05, help="std of the weights' normal init")
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--prompt-len", type=int, default=8)
    p.add_argument("--new-tokens", type=int, default=8)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--min-gap", type=float, default=2e-3)
    p.add_argument("--tries", type=int, default=50, help="seeds tried for --min-gap")
    p.add_argument("--no-fp16", action="store_true")
    return p.parse_args()


def log(*a):
    print(*a, flush=True)


def build(torch, transformers, a, seed):
    cfg = transformers.GPT2Config(
        vocab_size=a.vocab,
        n_positions=a.positions,
        n_embd=a.embd,
        n_layer=a.layers,
        n_head=a.heads,
        n_inner=a.inner,
        activation_function="gelu_new",
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        layer_norm_epsilon=1e-5,
        initializer_range=a.init_range,
    )
    torch.manual_seed(seed)
    try:
        model = transformers.GPT2LMHeadModel(cfg, attn_implementation="eager")
    except TypeError:
        cfg._attn_implementation = "eager"
        model = transformers.GPT2LMHeadModel(cfg)
    with torch.no_grad():
        for name, prm in model.named_parameters():
            if name.endswith(".bias"):
                prm.copy_(torch.randn_like(prm) * 0.02)
            elif ".ln_" in name or name.startswith("transformer.ln_f") or "ln_f." in name:
                prm.copy_(1.0 + torch.randn_like(prm) * 0.1)
    model.eval()
    return model


def greedy(torch, model, prompt, steps, forced=None):
    """Greedy decoding with transformers' KV cache: logits [steps][batch][vocab] and tokens
    [batch][steps]. With `forced` ([batch][steps]), feeds those tokens instead of its own."""
    logits, tokens = [], []
    with torch.no_grad():
        out = model(input_ids=prompt, use_cache=True)
        for s in range(steps):
            step_logits = out.logits[:, -1, :].float()
            tok = step_logits.argmax(dim=-1)
            logits.append(step_logits.cpu())
            tokens.append(tok.cpu())
            if s + 1 == steps:
                break
            feed = tok if forced is None else forced[:, s].to(tok.device)
            out = model(input_ids=feed[:, None], past_key_values=out.past_key_values, use_cache=True)
    return torch.stack(logits), torch.stack(tokens, dim=1)


def top2_gap(torch, logits):
    top = torch.topk(logits, 2, dim=-1).values
    return float((top[..., 0] - top[..., 1]).min())


def write_raw(path, t):
    t = t.contiguous().float().cpu()
    try:
        t.numpy().astype("<f4").tofile(path)
    except Exception:  # no numpy: slower, same bytes
        with open(path, "wb") as f:
            f.write(struct.pack("<%df" % t.numel(), *t.flatten().tolist()))


def main():
    a = parse_args()
    started = time.time()
    import torch
    import transformers

    log(f"torch {torch.__version__}, transformers {transformers.__version__}, cuda {torch.cuda.is_available()}")
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.set_num_threads(min(8, os.cpu_count() or 1))
    os.makedirs(a.out, exist_ok=True)

    chosen = None
    for seed in range(a.seed, a.seed + (1 if a.model else a.tries)):
        if a.model:
            model = transformers.GPT2LMHeadModel.from_pretrained(a.model, attn_implementation="eager").float().eval()
        else:
            model = build(torch, transformers, a, seed)
        vocab = model.config.vocab_size
        g = torch.Generator().manual_seed(seed)
        prompt = torch.randint(0, vocab, (a.batch, a.prompt_len), generator=g)
        logits, tokens = greedy(torch, model, prompt, a.new_tokens)
        gap = top2_gap(torch, logits)
        log(f"seed {seed}: smallest top-2 gap {gap:.3e}")
        if gap >= a.min_gap or a.model:
            chosen = (seed, model, prompt, logits, tokens, gap)
            break
    if chosen is None:
        sys.exit(f"no seed in {a.seed}..{a.seed + a.tries} keeps the top-2 gap above {a.min_gap}")
    seed, model, prompt, logits, tokens, gap = chosen
    log(f"attention implementation: {getattr(model.config, '_attn_implementation', '?')}")
    try:  # the manual loop is what generate does: check it picks the same tokens
        gen = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=a.new_tokens,
                             do_sample=False, pad_token_id=0)
        log(f"transformers' generate agrees with the greedy loop: {torch.equal(gen[:, a.prompt_len:], tokens)}")
    except Exception as e:
        log(f"generate failed (the loop's own tokens stand): {e!r}")

    if not a.model:
        model.save_pretrained(a.out)
        for extra in ("generation_config.json",):
            p = os.path.join(a.out, extra)
            if os.path.exists(p):
                os.remove(p)
        st = os.path.join(a.out, "model.safetensors")
        from safetensors.torch import load_file, save_file

        sd = load_file(st)
        log("tensors:", ", ".join(f"{k}{list(v.shape)}" for k, v in sorted(sd.items())))
        if any(k.endswith("lm_head.weight") for k in sd):
            sd = {k: v for k, v in sd.items() if not k.endswith("lm_head.weight")}
            save_file(sd, st, metadata={"format": "pt"})
            log("dropped the tied lm_head.weight from model.safetensors")
        # The file must give back the same model.
        again = transformers.GPT2LMHeadModel.from_pretrained(a.out, attn_implementation="eager").eval()
        l2, t2 = greedy(torch, again, prompt, a.new_tokens)
        assert torch.equal(t2, tokens), "the saved model decodes differently"
        log(f"reloaded from {a.out}: max abs logit diff {float((l2 - logits).abs().max()):.3e}")

    with open(os.path.join(a.out, "prompt.txt"), "w") as f:
        for row in prompt.tolist():
            f.write(" ".join(map(str, row)) + "\n")
    write_raw(os.path.join(a.out, "logits-fp32.raw"), logits)
    ref = {
        "format": 1,
        "batch": a.batch,
        "prompt_len": a.prompt_len,
        "new_tokens": a.new_tokens,
        "vocab": model.config.vocab_size,
        "seed": seed,
        "layout": "little-endian f32 [step][batch row][vocab]; step s chose new token s",
        "prompt": prompt.tolist(),
        "tokens_fp32": tokens.tolist(),
        "logits_fp32": "logits-fp32.raw",
        "min_top2_gap_fp32": gap,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }

    if torch.cuda.is_available():
        try:
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False
            gpu = model.to("cuda")
            lc, tc = greedy(torch, gpu, prompt.cuda(), a.new_tokens)
            ref["fp32_cuda_vs_cpu_max_abs"] = float((lc - logits).abs().max())
            ref["fp32_cuda_tokens_agree"] = bool(torch.equal(tc, tokens))
            log(f"fp32 on the GPU against the CPU: max abs {ref['fp32_cuda_vs_cpu_max_abs']:.3e}")
            if not a.no_fp16:
                half = gpu.half()
                _, own = greedy(torch, half, prompt.cuda(), a.new_tokens)
                forced_logits, _ = greedy(torch, half, prompt.cuda(), a.new_tokens, forced=tokens.cuda())
                write_raw(os.path.join(a.out, "logits-fp16.raw"), forced_logits)
                ref["logits_fp16"] = "logits-fp16.raw"
                ref["tokens_fp16"] = own.tolist()
                ref["fp16_tokens_agree"] = bool(torch.equal(own, tokens))
                ref["fp16_vs_fp32_max_abs"] = float((forced_logits - logits).abs().max())
                log(f"fp16 (teacher-forced) against fp32: max abs {ref['fp16_vs_fp32_max_abs']:.3e}; own greedy tokens agree: {ref['fp16_tokens_agree']}")
        except Exception as e:  # the fp32 reference stands without the GPU's figures
            log(f"GPU runs failed: {e!r}")
            ref["gpu_error"] = repr(e)
    with open(os.path.join(a.out, "reference.json"), "w") as f:
        json.dump(ref, f, indent=1)
        f.write("\n")
    log(f"tokens (fp32): {tokens.tolist()}")
    log(f"wrote {a.out} in {time.time() - started:.1f} s: " + ", ".join(
        f"{n} {os.path.getsize(os.path.join(a.out, n))} B" for n in sorted(os.listdir(a.out))))


if __name__ == "__main__":
    main()
