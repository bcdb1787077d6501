#!/usr/bin/env bash
# The trace campaign, run on the H200 (the device tool) from the repo root:
#
#   bash scripts/traces/gpu-campaign.sh 2>&1 | tee $OUT/campaign.log   # writes under $OUT
#                                                    # (default /tmp/traces-out)
#
# 1. captures every model's allocation trace into /tmp/traces-work/traces (scripts/traces/capture.py,
#    one process per model) and the small raw snapshot (snapshot-small.pickle + its CSV), and packs
#    them into $OUT/traces.tar at once (the device tool returns at most 8 files from $OUT);
# 2. generates the 9 RMM cells (scripts/traces/rmm.py) into /tmp/rmm (not under $OUT: too big);
# 3. replays every anchor on every trace and cell (scripts/traces/anchors.py, one process per
#    anchor per trace), JSON at $OUT/anchors.json, the table at $OUT/table.md.
#
# ONLY_ANCHORS=1 skips the capture and replays the traces in $TRACES_DIR (default $WORK/traces;
# TRACES_DIR=traces replays the ones stored in the repo).
set -u -o pipefail
OUT=${OUT:-/tmp/traces-out}
WORK=${WORK:-/tmp/traces-work}
T=${TRACES_DIR:-$WORK/traces}
RMM=${RMM_DIR:-/tmp/rmm}
mkdir -p "$OUT" "$T" "$RMM"
export PYTHONUNBUFFERED=1
here=$(cd "$(dirname "$0")" && pwd)

echo "== $(date -u +%Y-%m-%dT%H:%M:%SZ) gpu-campaign on $(hostname)"
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv,noheader || true
python3 - <<'EOF'
import torch, torchvision, transformers, cupy
print("torch", torch.__version__, "cuda", torch.version.cuda, "torchvision", torchvision.__version__,
      "transformers", transformers.__version__, "cupy", cupy.__version__,
      "cuda runtime", cupy.cuda.runtime.runtimeGetVersion(), "driver", cupy.cuda.runtime.driverGetVersion())
EOF

MODELS="resnet50-infer resnet18-train vit_b_16-infer bert-base-dynseq gpt2-generate gpt2-train fasterrcnn-infer"
if [ -z "${ONLY_ANCHORS:-}" ]; then
  echo "== capture $(date -u +%T)"
  start=$SECONDS
  python3 "$here/capture.py" --small "$T" > "$T/snapshot-small.log" 2>&1 &
  small=$!
  CAPTURE_PARALLEL=${CAPTURE_PARALLEL:-7} python3 "$here/capture.py" "$T" $MODELS
  wait $small || { echo "snapshot-small FAILED"; cat "$T/snapshot-small.log"; }
  tail -1 "$T/snapshot-small.log"
  echo "capture took $((SECONDS - start)) s"
  tar -C "$(dirname "$T")" -cf "$OUT/traces.tar" "$(basename "$T")"
fi

echo "== rmm cells $(date -u +%T)"
python3 "$here/rmm.py" "$RMM"

echo "== anchors $(date -u +%T)"
start=$SECONDS
paths=()
for m in $MODELS snapshot-small; do
  [ -f "$T/$m.csv.gz" ] && paths+=("$T/$m.csv.gz")
done
for n in 1000 10000 100000; do for m in 1 4 64; do paths+=("$RMM/rmm-N$n-max${m}MiB.csv.gz"); done; done
ANCHORS_PARALLEL=${ANCHORS_PARALLEL:-8} ANCHORS_TIMEOUT=${ANCHORS_TIMEOUT:-150} \
  python3 "$here/anchors.py" "$OUT/anchors.json" "${paths[@]}" > "$OUT/anchors.log" 2>&1
echo "anchors rc=$? took $((SECONDS - start)) s"
grep -E 'FAILED|Error' "$OUT/anchors.log" | head -20
python3 "$here/anchors.py" --table "$OUT/anchors.json" > "$OUT/table.md"

echo "== done $(date -u +%T)"
cat "$OUT/table.md"
