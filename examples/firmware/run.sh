#!/usr/bin/env bash
# The bare-metal hosts under QEMU, as CI runs them. For each board the image is built (release,
# defmt) and run twice through qemu.sh, which decodes its defmt log with defmt-print:
#   - the whole job: it must exit 0 and its log must equal expected/BOARD.log;
#   - with `fault` (a DMA descriptor fails mid-job): it must exit 2 and its log must equal
#     expected/BOARD-fault.log;
#   - with `panic`: it must exit 1 and print its PANIC line (not hang).
# In expected/, `<N>` stands for any integer: the figures that move with the code's layout (heap,
# stack, bookkeeping bytes). Everything else is compared exactly, so a changed or garbled message
# fails. The defmt image must also carry no core::fmt float formatting.
# Usage: run.sh [BOARD...]           boards: lm3s6965evb (Cortex-M3), virt-aarch64 (default: both)
#        DEVCMD_BLESS=1 run.sh       rewrites expected/ from this run (then review the diff)
set -euo pipefail
cd "$(dirname "$0")"

boards=("$@")
[ ${#boards[@]} -gt 0 ] || boards=(lm3s6965evb virt-aarch64)

for tool in defmt-print llvm-nm; do
    command -v "$tool" >/dev/null || { echo "run.sh: $tool is not installed (scripts/test installs it)" >&2; exit 1; }
done

# Compares a decoded log with its expected text (`<N>`: any integer); with DEVCMD_BLESS=1 writes
# the expected text instead, the moving figures replaced by `<N>`.
compare() {
    python3 - "$1" "$2" <<'PY'
import os, re, sys
got_path, want_path = sys.argv[1], sys.argv[2]
got = open(got_path).read().splitlines()
MOVING = ("bookkeeping:", "ram:")
def bless(line):
    if line.startswith(MOVING):
        return re.sub(r"\d+", "<N>", line)
    return re.sub(r"heap used \d+ B", "heap used <N> B", line)
if os.environ.get("DEVCMD_BLESS"):
    open(want_path, "w").write("\n".join(bless(l) for l in got) + "\n")
    print(f"run.sh: wrote {want_path}")
    sys.exit(0)
want = open(want_path).read().splitlines()
def matches(pattern, line):
    rx = "^" + re.escape(pattern).replace(re.escape("<N>"), r"-?\d+") + "$"
    return re.match(rx, line) is not None
bad = [(i, w, g) for i, (w, g) in enumerate(zip(want, got)) if not matches(w, g)]
if len(want) != len(got):
    bad.append((min(len(want), len(got)), f"<{len(want)} lines>", f"<{len(got)} lines>"))
if bad:
    print(f"run.sh: the log differs from {want_path}:", file=sys.stderr)
    for i, w, g in bad[:10]:
        print(f"  line {i + 1}:\n    expected: {w}\n    got:      {g}", file=sys.stderr)
    sys.exit(1)
print(f"run.sh: the log matches {want_path} ({len(got)} lines)")
PY
}

# Runs `elf` with the job's arguments, expects exit status `want`, compares its log.
run_case() {
    local elf="$1" want="$2" expected="$3"
    shift 3
    local log status=0
    log="$(mktemp)"
    ./qemu.sh "$elf" "$@" >"$log" || status=$?
    cat "$log"
    if [ "$status" -ne "$want" ]; then
        echo "run.sh: $elf ${*:-} exited with status $status, expected $want" >&2
        rm -f "$log"
        exit 1
    fi
    compare "$log" "$expected" || { rm -f "$log"; exit 1; }
    rm -f "$log"
}

for board in "${boards[@]}"; do
    case "$board" in
        lm3s6965evb) target=thumbv7m-none-eabi ;;
        virt-aarch64) target=aarch64-unknown-none ;;
        *) echo "run.sh: unknown board $board (lm3s6965evb, virt-aarch64)" >&2; exit 1 ;;
    esac
    rustup target list --installed 2>/dev/null | grep -qx "$target" || rustup target add "$target"
    cargo build --release --locked --target "$target"
    elf="target/$target/release/devcmd-firmware"
    floats="$(llvm-nm --demangle "$elf" | grep -E 'flt2dec|float_to_decimal|float_to_exponential|fmt::float' || true)"
    if [ -n "$floats" ]; then
        echo "run.sh: the defmt image of $board carries core::fmt float formatting:" >&2
        echo "$floats" >&2
        exit 1
    fi
    echo "== $board: the whole job"
    run_case "$elf" 0 "expected/$board.log"
    echo "== $board: a DMA descriptor fails mid-job"
    run_case "$elf" 2 "expected/$board-fault.log" fault
    echo "== $board: a panic"
    status=0
    panicked="$(./qemu.sh "$elf" panic)" || status=$?
    echo "$panicked"
    if [ "$status" -ne 1 ] || ! grep -q '^devcmd-firmware: PANIC: ' <<<"$panicked"; then
        echo "run.sh: a panic on $board exited with status $status (expected 1 and a PANIC line)" >&2
        exit 1
    fi
done
echo "run.sh: bare-metal hosts verified under QEMU (${boards[*]})"
