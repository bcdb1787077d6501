#!/usr/bin/env bash
# Code footprint of the Cortex-M3 firmware host, attributed by symbol (llvm-nm), for BENCHMARKS.md.
# Usage: examples/firmware/footprint.sh [release|footprint]   (default: both)
#   release:   opt-level "z", LTO, codegen-units 1 (what run.sh runs)
#   footprint: the same without LTO, so the core's functions keep their own symbols
#   FEATURES=log footprint.sh ...   the image that logs as text through `log` (default: defmt)
#   FOOTPRINT_MAX_BYTES=49152 footprint.sh release   fails when the core's share is larger (CI)
# Usage: examples/firmware/footprint.sh compare
#   `.text` and `.rodata` of the release image with `log` and with `defmt`, side by side, on both
#   boards, and whether core::fmt float formatting is linked in.
set -euo pipefail
cd "$(dirname "$0")"
NM="$(command -v llvm-nm || command -v rust-nm)"
features="${FEATURES:-defmt}"
feature_args=(--no-default-features --features "$features")

if [ "${1:-}" = compare ]; then
  printf '%-22s %-6s %10s %10s  %s\n' board logging .text .rodata "float formatting"
  for target in thumbv7m-none-eabi aarch64-unknown-none; do
    for f in log defmt; do
      cargo build -q --release --locked --target "$target" --no-default-features --features "$f"
      elf="target/$target/release/devcmd-firmware"
      read -r text rodata < <(llvm-size -A "$elf" | awk '$1==".text"{t=$2} $1==".rodata"{r=$2} END{print t, r}')
      floats="$("$NM" --demangle "$elf" | grep -cE 'flt2dec|float_to_decimal|float_to_exponential|fmt::float' || true)"
      printf '%-22s %-6s %10s %10s  %s symbols\n' "$target" "$f" "$text" "$rodata" "$floats"
    done
  done
  exit 0
fi

for profile in "${@:-release footprint}"; do
  for p in $profile; do
    cargo build --profile "$p" --locked "${feature_args[@]}" >/dev/null 2>&1 \
      || cargo build --profile "$p" --locked "${feature_args[@]}"
    elf="target/thumbv7m-none-eabi/$p/devcmd-firmware"
    echo "== profile $p, features $features ($elf)"
    "$NM" -S --defined-only "$elf" | python3 -c '
import re, subprocess, sys

def demangle_v0(s):
    # Rust v0 mangling (the precompiled standard library): keep the identifiers, in order.
    out, i = [], 2
    while i < len(s):
        m = re.match(r"(\d+)_?", s[i:])
        if m and (i == 0 or not s[i - 1].isdigit()):
            n, j = int(m.group(1)), i + m.end()
            ident = s[j:j + n]
            if n > 0 and len(ident) == n and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", ident):
                out.append(ident)
                i = j + n
                continue
        i += 1
    return "::".join(out)

def demangle(s):
    if s.startswith("_R"):
        return demangle_v0(s)
    # Rust legacy mangling, as llvm-nm leaves it: _ZN...E, with $LT$-style escapes.
    m = re.match(r"_ZN(.*)E$", s)
    if not m:
        return s
    body, parts, i = m.group(1), [], 0
    while i < len(body) and body[i].isdigit():
        j = i
        while body[j].isdigit():
            j += 1
        n = int(body[i:j])
        parts.append(body[j:j + n])
        i = j + n
    if parts and re.fullmatch(r"h[0-9a-f]{16}", parts[-1]):
        parts.pop()
    name = "::".join(parts)
    for a, b in (("$LT$", "<"), ("$GT$", ">"), ("$RF$", "&"), ("$BP$", "*"), ("$u20$", " "),
                 ("$C$", ","), ("$u27$", "\x27"), ("$u5b$", "["), ("$u5d$", "]"), ("$u7b$", "{"),
                 ("$u7d$", "}"), ("$u3b$", ";"), ("$u2b$", "+"), ("$u22$", "\""), ("..", "::")):
        name = name.replace(a, b)
    return name.lstrip("_")

buckets = {}
order = ["devcmd (the core)", "generic code over the core'"'"'s types, in other crates",
         "firmware (shim, job, logger)", "core::fmt and number formatting",
         "hashbrown/foldhash", "compiler builtins (soft float, 64-bit division, memcpy)",
         "cortex-m, cortex-m-rt, semihosting, log/defmt, allocator", "other",
         "core::slice::sort (only the core sorts)"]
total = 0
top, rest = [], []
for line in sys.stdin:
    f = line.split()
    if len(f) < 4 or f[2] not in "tTwW":
        continue
    size, name = int(f[1], 16), demangle(f[3])
    total += size
    if re.match(r"^<?devcmd::", name):
        b = order[0]
        top.append((size, name))
    elif re.match(r"^<?devcmd_firmware", name):
        b = order[2]
    elif "devcmd::" in name:
        b = order[1]
    elif "core::slice::sort" in name:
        # Only the core sorts: a sort it instantiates (and the firmware calls) lands here.
        b = order[8]
    elif re.search(r"core::fmt|flt2dec|core::num::fmt|Display>::fmt|Debug>::fmt|fmt::float|fmt::num", name):
        b = order[3]
    elif "hashbrown" in name or "foldhash" in name:
        b = order[4]
    elif "compiler_builtins" in name or name.startswith("aeabi") or re.match(r"^_*(mem|aeabi)", name):
        b = order[5]
    elif re.search(r"cortex_m|semihosting|^log::|^<?defmt|_defmt|linked_list_allocator|embedded_alloc|critical_section|Reset|HardFault|DefaultHandler", name):
        b = order[6]
    else:
        b = order[7]
        rest.append((size, name))
    buckets[b] = buckets.get(b, 0) + size
print(f"  text in symbols: {total} B ({total / 1024:.1f} KiB)")
for b in order:
    v = buckets.get(b, 0)
    print(f"  {b:58} {v:7} B  {v / 1024:5.1f} KiB")
share = sum(buckets.get(order[i], 0) for i in (0, 1, 8))
print(f"  the core'"'"'s share (devcmd + generic code over its types + its sort): {share} B ({share / 1024:.1f} KiB)")
import os
limit = os.environ.get("FOOTPRINT_MAX_BYTES")
if limit and share > int(limit):
    print(f"footprint.sh: the core'"'"'s share is {share} B, over FOOTPRINT_MAX_BYTES={limit}: find what the change added (the largest functions below; a sort or a formatter instantiated anew is a common cause) and make the firmware not pay for it", file=sys.stderr)
    exit_code = 1
else:
    exit_code = 0
print("  largest devcmd functions:")
for size, name in sorted(top, reverse=True)[:8]:
    print(f"    {size:6} B  {name[:110]}")
print("  largest other functions:")
for size, name in sorted(rest, reverse=True)[:6]:
    print(f"    {size:6} B  {name[:110]}")
sys.exit(exit_code)
'
    llvm-size -A "$elf" 2>/dev/null | awk '$1 ~ /^\.(vector_table|text|rodata|data|bss)$/ {printf "  section %-14s %7d B\n", $1, $2}' || true
  done
done
