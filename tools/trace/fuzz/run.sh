#!/usr/bin/env bash
# Fuzzes devcmd-trace's readers and the command layer with cargo-fuzz (libFuzzer): the targets
# csv, snapshot and gzip (devcmd-trace), and commands (Command operations on shim-std against a
# model; its failures are a panic of src/commands.rs),
# each for SECONDS (default 60), from the seeds in corpus/TARGET (read only: what the run finds is
# kept in a scratch folder and dropped). A target fails on a panic, an abort, a read holding more
# than 10 bytes of memory per byte of input (src/lib.rs), more than 1 GiB of RSS, or 10 s on one
# input; libFuzzer leaves the input in artifacts/TARGET/ and this script exits non-zero. Turn such
# an input into a regression test in tools/trace/tests/hostile.rs, then fix the reader.
# Usage: run.sh [SECONDS] [TARGET...]
# Needs a nightly toolchain (DEVCMD_FUZZ_TOOLCHAIN, default the nightly scripts/test runs miri
# with) and cargo-fuzz (installed from crates.io when missing).
set -euo pipefail
cd "$(dirname "$0")"

seconds="${1:-60}"
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(csv snapshot gzip commands)
toolchain="${DEVCMD_FUZZ_TOOLCHAIN:-nightly-2026-10-30}"

rustup toolchain list | grep -q "^$toolchain" || rustup toolchain install "$toolchain" --profile minimal
command -v cargo-fuzz >/dev/null 2>&1 || cargo install cargo-fuzz --locked

work=""
trap '[ -z "$work" ] || rm -rf "$work"' EXIT
for target in "${targets[@]}"; do
    work="$(mktemp -d)"
    # The seeds are committed (corpus/.gitignore keeps the *.bin ones); a missing folder is an
    # empty corpus, not a failure.
    mkdir -p "corpus/$target"
    echo "== fuzzing $target for ${seconds}s"
    cargo "+$toolchain" fuzz run "$target" "$work" "corpus/$target" -- \
        -max_total_time="$seconds" -rss_limit_mb=1024 -max_len=65536 -timeout=10 \
        -print_final_stats=1
    rm -rf "$work"
    work=""
done
echo "fuzz: ${targets[*]} ran ${seconds}s each without a finding"
