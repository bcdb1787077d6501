#!/bin/bash
# How the edge host and cuda-bench ran on the H200 for BENCHMARKS.md ("On the H200 (issue 8)").
#
# The GPU machine has the NVIDIA driver and NVRTC but no Rust: build here, carry the binaries.
#   cargo build --release -p devcmd-examples
#   mkdir -p .gpu/edge && cp target/release/{edge-host,cuda-bench} examples/gpu-run.sh .gpu/edge/
#   strip .gpu/edge/edge-host .gpu/edge/cuda-bench     # .gpu/ is git-ignored (.git/info/exclude)
# then, on the GPU machine, from the repository root: `bash .gpu/edge/gpu-run.sh` with $OUT set
# to a folder for the logs. Runs in about 30 s; prints the benchmark's tables last.
set -u
OUT="${OUT:-/tmp}"
cd "$(dirname "$0")"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,utilization.gpu --format=csv 2>&1 | tee "$OUT/smi.txt"
nproc; grep -m1 "model name" /proc/cpuinfo
echo "== edge-host --device cuda"
timeout 120 ./edge-host --device cuda > "$OUT/edge-cuda.txt" 2>&1; echo "rc=$?" >> "$OUT/edge-cuda.txt"
head -8 "$OUT/edge-cuda.txt"; grep -E "served|verified|rc=|edge-host:" "$OUT/edge-cuda.txt"
echo "== edge-host --device cuda --weights"
timeout 60 ./edge-host --device cuda --batches 20 --save-weights /tmp/w.bin > /dev/null 2>&1
timeout 120 ./edge-host --device cuda --weights /tmp/w.bin > "$OUT/edge-cuda-weights.txt" 2>&1; echo "rc=$?" >> "$OUT/edge-cuda-weights.txt"
grep -E "weights|copy path|served|verified|rc=|edge-host:" "$OUT/edge-cuda-weights.txt"
echo "== edge-host std on this machine"
timeout 60 ./edge-host --batches 100 2>&1 | grep -E "served|verified"
echo "== cuda-bench"
timeout 300 ./cuda-bench > "$OUT/bench.md" 2> "$OUT/bench.err"; echo "bench rc=$?"
cat "$OUT/bench.md"; cat "$OUT/bench.err"
nvidia-smi --query-gpu=clocks.sm,clocks.mem --format=csv,noheader
