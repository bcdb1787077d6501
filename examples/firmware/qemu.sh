#!/usr/bin/env bash
# Runs a devcmd-firmware image under QEMU and prints its log: decoded by defmt-print when the image
# logs through defmt, as text otherwise. The board comes from the image's target directory.
# Usage: qemu.sh ELF [ARG...]      (ARGs reach the job as its command line: `fault`)
# Exits with the image's exit status (0 verified, 1 failed, 2 device fault reported), or 124 when
# it ran past the time limit (a hang, a hard fault spinning).
# Cargo uses it as the runner: `cargo run --release [--target aarch64-unknown-none] [-- fault]`.
set -euo pipefail
elf="$1"
shift
case "$elf" in
    *thumbv7m-none-eabi*)
        qemu=(qemu-system-arm -cpu cortex-m3 -machine lm3s6965evb) ;;
    *aarch64-unknown-none*)
        qemu=(qemu-system-aarch64 -cpu cortex-a53 -machine virt -m 64M) ;;
    *)
        echo "qemu.sh: no board for $elf (expected a thumbv7m-none-eabi or aarch64-unknown-none image)" >&2
        exit 1 ;;
esac
command -v "${qemu[0]}" >/dev/null || { echo "qemu.sh: ${qemu[0]} is not installed" >&2; exit 1; }

raw="$(mktemp)"
console="$(mktemp)"
trap 'rm -f "$raw" "$console"' EXIT
semi="enable=on,target=native,chardev=semihosting,arg=devcmd-firmware"
for a in "$@"; do semi="$semi,arg=$a"; done
status=0
# The console is binary (defmt frames). QEMU 7 writes what the guest sends to its `:tt` handle on
# its own stdout; later versions send it to the semihosting chardev: both go to files, and the one
# that received the log is decoded.
timeout 60 "${qemu[@]}" -nographic -monitor none -serial none \
    -chardev "file,id=semihosting,path=$console" -semihosting-config "$semi" \
    -kernel "$elf" >"$raw" || status=$?
[ -s "$raw" ] || raw="$console"

sections="$(llvm-readelf -S "$elf" 2>/dev/null || readelf -S "$elf")"
if grep -q '\.defmt' <<<"$sections"; then
    command -v defmt-print >/dev/null || { echo "qemu.sh: defmt-print is not installed (cargo install defmt-print)" >&2; exit 1; }
    defmt-print --log-format '{L} {s}' -e "$elf" < "$raw"
else
    cat "$raw"
fi
exit "$status"
