#!/usr/bin/env bash
# Builds the firmware host and runs it on a Cortex-M3 under QEMU (lm3s6965evb, semihosting).
# Fails unless the firmware exits 0 and prints its VERIFIED line.
set -euo pipefail
cd "$(dirname "$0")"

command -v qemu-system-arm >/dev/null || { echo "run.sh: qemu-system-arm is not installed" >&2; exit 1; }
rustup target list --installed 2>/dev/null | grep -qx thumbv7m-none-eabi \
    || rustup target add thumbv7m-none-eabi

cargo build --release --locked
elf=target/thumbv7m-none-eabi/release/devcmd-firmware

log="$(mktemp)"
trap 'rm -f "$log"' EXIT
status=0
timeout 60 qemu-system-arm -cpu cortex-m3 -machine lm3s6965evb -nographic \
    -semihosting-config enable=on,target=native -kernel "$elf" 2>&1 | tee "$log" || status=$?
if [ "$status" -ne 0 ]; then
    echo "run.sh: the firmware exited with status $status" >&2
    exit 1
fi
if ! grep -q '^devcmd-firmware: VERIFIED' "$log"; then
    echo "run.sh: the firmware exited 0 but printed no VERIFIED line" >&2
    exit 1
fi
echo "run.sh: firmware verified under QEMU"
