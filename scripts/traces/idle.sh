#!/usr/bin/env bash
# Giving back idle granules (issue 19, item 5): every stored trace replayed through devcmd-trace
# under each IdleGranules setting, with memory going back at once and with --fenced (what is
# let go waits for a fence, as on a device), then the same traces through a model with no
# fragmentation at all (scripts/traces/idle_bound.py): the fewest device calls any slack policy
# can make at a given held/live over time, with one call per 2 MiB granule. Prints markdown.
#
#   bash scripts/traces/idle.sh            # builds devcmd-trace (release) first
#   bash scripts/traces/idle.sh --spans    # the same, each setting also with map_spans (one
#                                          # device call for the granules a placement covers whole)
#   CARGO="flock /tmp/lock cargo" bash scripts/traces/idle.sh   # the build through a wrapper
set -euo pipefail
cd "$(dirname "$0")/../.."
${CARGO:-cargo} build --release -q -p devcmd-trace
out=$(mktemp -d)
# name|devcmd-trace arguments
settings=(
  "UpToPeak (default)|-c default"
  "Slack 64/64 (give-back)|-c give-back"
  "Slack 16/64|-c default --set idle_slack_per_64=16"
  "Slack 0/64|-c default --set idle_slack_per_64=0"
  "UpToPeak, --fenced|-c default --fenced"
  "Slack 64/64, --fenced|-c give-back --fenced"
  "Slack 0/64, --fenced|-c default --set idle_slack_per_64=0 --fenced"
)
if [ "${1:-}" = --spans ]; then
  settings=(
    "UpToPeak|-c default"
    "UpToPeak, spans|-c default --set map_spans=1"
    "Slack 64/64, spans|-c give-back --set map_spans=1"
    "Slack 16/64|-c default --set idle_slack_per_64=16"
    "Slack 16/64, spans (follow-live)|-c follow-live"
    "Slack 16/64, spans, --fenced|-c follow-live --fenced"
    "Slack 0/64, spans|-c default --set idle_slack_per_64=0 --set map_spans=1"
  )
fi
for t in traces/*.csv.gz; do
  n=$(basename "$t" .csv.gz)
  for i in "${!settings[@]}"; do
    # shellcheck disable=SC2086 # the arguments are split on purpose
    ./target/release/devcmd-trace "$t" ${settings[$i]#*|} --json --no-search \
      --timing-seconds 0.3 --no-progress >"$out/$n.$i.json"
  done
done
python3 - "$out" "${settings[@]}" <<'PY'
import glob, json, os, sys
out, names = sys.argv[1], [s.split("|")[0] for s in sys.argv[2:]]
traces = sorted({os.path.basename(f).split(".")[0] for f in glob.glob(f"{out}/*.json")})
print("Each cell: held/live over time · map+unmap calls per op (measured replay; warm replay) · "
      "held/live at the peak · ns/op warm.\n")
print("| trace | " + " | ".join(names) + " |")
print("|---|" + "---:|" * len(names))
for t in traces:
    cells = []
    for i in range(len(names)):
        c = json.load(open(f"{out}/{t}.{i}.json"))["configs"][0]
        cells.append(f"{c['held_over_live_time']:.2f} · {c['map_calls_per_op']:.2f}; "
                     f"{c['map_calls_per_op_warm']:.2f} · {c['held_over_live']:.3f} · "
                     f"{c['ns_per_op_warm']:.0f}")
    print(f"| {t} | " + " | ".join(cells) + " |")
PY
echo
[ "${1:-}" = --spans ] || python3 scripts/traces/idle_bound.py traces/*.csv.gz
