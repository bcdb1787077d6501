#!/usr/bin/env python3
"""Writes a GPT-2 of any size with random weights in the Hugging Face layout (config.json +
model.safetensors), with nothing but Python's standard library: for timing and memory runs of the
decoding host (`gpt2 --model DIR`) where torch is not installed. The weights are not
transformers' (no reference logits): check correctness with make_fixture.py's models.

    python3 scripts/gpt2/random_model.py --out /tmp/gpt2-small            # GPT-2 small (124M)
    python3 scripts/gpt2/random_model.py --out /tmp/m --layers 4 --embd 256 --heads 8 --vocab 1000

Values: normal(0, 0.02) weights, biases normal(0, 0.02), layer-norm weights 1 + normal(0, 0.1);
drawn as a block of 2^20 values reused at random offsets (fast; enough for timing).
"""

import argparse
import json
import os
import random
import struct


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--embd", type=int, default=768)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--vocab", type=int, default=50257)
    p.add_argument("--positions", type=int, default=1024)
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args()
    rng = random.Random(a.seed)
    block = struct.pack("<%df" % (1 << 20), *(rng.gauss(0.0, 0.02) for _ in range(1 << 20)))
    ln = struct.pack("<%df" % 4096, *(1.0 + rng.gauss(0.0, 0.1) for _ in range(4096)))

    def values(n, source):
        out = bytearray()
        while len(out) < 4 * n:
            start = rng.randrange(0, len(source) // 4) * 4
            out += source[start : start + 4 * n - len(out)]
        return bytes(out)

    e, i = a.embd, 4 * a.embd
    tensors = [("transformer.wte.weight", [a.vocab, e], block), ("transformer.wpe.weight", [a.positions, e], block)]
    for l in range(a.layers):
        h = f"transformer.h.{l}."
        tensors += [
            (h + "ln_1.weight", [e], ln), (h + "ln_1.bias", [e], block),
            (h + "attn.c_attn.weight", [e, 3 * e], block), (h + "attn.c_attn.bias", [3 * e], block),
            (h + "attn.c_proj.weight", [e, e], block), (h + "attn.c_proj.bias", [e], block),
            (h + "ln_2.weight", [e], ln), (h + "ln_2.bias", [e], block),
            (h + "mlp.c_fc.weight", [e, i], block), (h + "mlp.c_fc.bias", [i], block),
            (h + "mlp.c_proj.weight", [i, e], block), (h + "mlp.c_proj.bias", [e], block),
        ]
    tensors += [("transformer.ln_f.weight", [e], ln), ("transformer.ln_f.bias", [e], block)]
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, shape, _ in tensors:
        n = 1
        for d in shape:
            n *= d
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + 4 * n]}
        offset += 4 * n
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for name, shape, source in tensors:
            n = 1
            for d in shape:
                n *= d
            f.write(values(n, source))
    config = {
        "model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "activation_function": "gelu_new",
        "vocab_size": a.vocab, "n_positions": a.positions, "n_embd": e, "n_layer": a.layers,
        "n_head": a.heads, "n_inner": None, "layer_norm_epsilon": 1e-5, "tie_word_embeddings": True,
        "scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False,
    }
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    print(f"wrote {a.out}: {offset} bytes of weights")


if __name__ == "__main__":
    main()
