#!/usr/bin/env bash
# The GPT-2 decoding benchmark of issue 17 in one run, on a GPU machine with torch and
# transformers: a GPT-2 (small by default) made from a seed with transformers' references, the
# devcmd host checked against them (fp32 and fp16, eager and graphs), then timed against
# PyTorch (generate, and a hand-captured CUDA-graph decode) at batch 1 and 8, fp16 and fp32;
# prints one table (scripts/gpt2/table.py).
#
# Usage (repository root): GPT2=path/to/gpt2 OUT=dir scripts/gpt2/bench.sh
#   GPT2     the host's release binary, built on an x86-64 Linux with
#            `cargo build --release -p devcmd-examples --bin gpt2` (it links only libc: the driver,
#            NVRTC and cuBLAS load at run time) [default: target/release/gpt2]
#   OUT      where the model, the references and the JSON summaries go [default: /tmp/gpt2-bench]
#   DEVICE   cuda, or std for a dry run on a CPU [default: cuda]
#   MODEL_FLAGS  make_fixture.py's size flags [default: GPT-2 small]
#   PROMPT_LEN, NEW_TOKENS  [default: 32, 128]
#   TRIES    make_fixture.py's seeds to try for clear greedy gaps before it settles for any
#            (--min-gap 0) [default: 10; each try runs transformers, about 10 s for GPT-2 small]
# Run on the H200: BENCHMARKS.md, "GPT-2 small on the H200", keeps its tables.
set -euo pipefail
cd "$(dirname "$0")/../.."
GPT2="${GPT2:-target/release/gpt2}"
OUT="${OUT:-/tmp/gpt2-bench}"
DEVICE="${DEVICE:-cuda}"
MODEL_FLAGS="${MODEL_FLAGS:---layers 12 --embd 768 --heads 12 --vocab 50257 --positions 1024}"
PROMPT_LEN="${PROMPT_LEN:-32}"
NEW_TOKENS="${NEW_TOKENS:-128}"
TRIES="${TRIES:-10}"
mkdir -p "$OUT"
model="$OUT/model"

echo "== the model and transformers' references (batch 8, fp32 on the CPU, fp16 on the GPU)"
# shellcheck disable=SC2086
python3 scripts/gpt2/make_fixture.py --out "$model" $MODEL_FLAGS --batch 8 \
    --prompt-len "$PROMPT_LEN" --new-tokens "$NEW_TOKENS" --tries "$TRIES" \
    || python3 scripts/gpt2/make_fixture.py --out "$model" $MODEL_FLAGS --batch 8 \
        --prompt-len "$PROMPT_LEN" --new-tokens "$NEW_TOKENS" --min-gap 0
head -n 1 "$model/prompt.txt" > "$OUT/prompt1.txt"

dtypes="f32"
[ "$DEVICE" = cuda ] && dtypes="f32 f16"
status=0
echo "== devcmd: the checks (batch 8)"
for dt in $dtypes; do
    for graph in "" --graph; do
        "$GPT2" --device "$DEVICE" --dtype "$dt" --check "$model" $graph \
            --json "$OUT/check-$dt${graph:+-graph}.json" | grep -E "^(device|GEMMs|check|decode)" \
            || status=1
    done
done
echo "== devcmd: timed runs"
for dt in $dtypes; do
    for b in 1 8; do
        prompt="$model/prompt.txt"
        [ "$b" = 1 ] && prompt="$OUT/prompt1.txt"
        # --graph-update: the step recorded again per token, against the position on the device.
        for graph in "" --graph --graph-update; do
            "$GPT2" --device "$DEVICE" --dtype "$dt" --model "$model" --prompt-file "$prompt" \
                --batch "$b" --new-tokens "$NEW_TOKENS" $graph \
                --json "$OUT/devcmd-$dt-b$b${graph:+-${graph#--}}.json" | grep -E "^(decode|memory:)"
        done
        # The KV cache grown as the sequence grows (doubling, the step recorded again into the
        # same graph), against the cache held ahead above.
        "$GPT2" --device "$DEVICE" --dtype "$dt" --model "$model" --prompt-file "$prompt" \
            --batch "$b" --new-tokens "$NEW_TOKENS" --graph --kv grow \
            --json "$OUT/devcmd-$dt-b$b-graph-kvgrow.json" | grep -E "^(decode|memory:)"
    done
done
if [ "$DEVICE" = cuda ] && command -v nvcc > /dev/null; then
    # Where a graph step's time goes, from the device's view: each kernel and cuBLAS call of the
    # f16 batch-1 step alone inside a CUDA graph (scripts/gpt2/probe.cu); the step's own time is
    # the devcmd graph row of the table.
    echo "== the step's kernels in graphs (f16, batch 1)"
    nvcc -O3 -arch=sm_90 -I examples/src/gpt2 -o "$OUT/probe" scripts/gpt2/probe.cu -lcublas \
        && timeout 300 "$OUT/probe" | tee "$OUT/probe.txt" || status=1
elif [ "$DEVICE" = cuda ]; then
    echo "== no nvcc here: the kernel probe (scripts/gpt2/probe.cu) is skipped"
fi
if [ "$DEVICE" = cuda ]; then
    echo "== PyTorch"
    for dt in fp32 fp16; do
        for b in 1 8; do
            prompt="$model/prompt.txt"
            [ "$b" = 1 ] && prompt="$OUT/prompt1.txt"
            python3 scripts/gpt2/torch_bench.py --model "$model" --prompt-file "$prompt" \
                --batch "$b" --new-tokens "$NEW_TOKENS" --dtype "$dt" \
                --json "$OUT/torch-$dt-b$b.json" > /dev/null || status=1
        done
    done
fi
echo
python3 scripts/gpt2/table.py "$OUT"
exit "$status"
