#!/bin/bash
# How capture ran on the H200 for BENCHMARKS.md ("Capture on the H200 (issue 9)").
#
# The GPU machine has the NVIDIA driver and NVRTC but no Rust: build here, carry the binaries.
#   cargo build --release -p devcmd-examples --bin edge-host --bin graph-bench
#   mkdir -p .gpu-cap && cp target/release/{edge-host,graph-bench} examples/gpu-run-graph.sh .gpu-cap/
#   strip .gpu-cap/edge-host .gpu-cap/graph-bench   # .gpu-cap/ is git-ignored (.git/info/exclude)
# then, on the GPU machine, from the repository root: `bash .gpu-cap/gpu-run-graph.sh` with $OUT
# set to a folder for the logs. Runs in about 20 s. The conformance suite's capture groups ran in
# the same call, through the CUDA harness and scripts/gpu-conformance (one process per test).
set -u
OUT="${OUT:-/tmp}"
cd "$(dirname "$0")"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
echo "== edge-host --device cuda --graph"
timeout 30 ./edge-host --device cuda --graph --batches 400 > "$OUT/edge-graph.txt" 2>&1; echo "rc=$?" >> "$OUT/edge-graph.txt"
grep -E "device|copy path|graphs:|served|verified|rc=|edge-host:" "$OUT/edge-graph.txt"
echo "== edge-host --device cuda (eager)"
timeout 30 ./edge-host --device cuda --batches 400 > "$OUT/edge-eager.txt" 2>&1; echo "rc=$?" >> "$OUT/edge-eager.txt"
grep -E "served|verified|rc=|edge-host:" "$OUT/edge-eager.txt"
echo "== graph-bench"
timeout 60 ./graph-bench > "$OUT/graph-bench.md" 2> "$OUT/graph-bench.err"; echo "bench rc=$?"
cat "$OUT/graph-bench.md" "$OUT/graph-bench.err"
