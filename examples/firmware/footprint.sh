#!/usr/bin/env bash
# Code footprint of the firmware host, attributed by symbol (llvm-nm), for BENCHMARKS.md.
# Usage: examples/firmware/footprint.sh [release|footprint]   (default: both)
#   release:   opt-level "z", LTO, codegen-units 1 (what run.sh runs)
#   footprint: the same without LTO, so the core's functions keep their own symbols
set -euo pipefail
cd "$(dirname "$0")"
NM="$(command -v llvm-nm || command -v rust-nm)"

for profile in "${@:-release footprint}"; do
  for p in $profile; do
    cargo build --profile "$p" --locked >/dev/null 2>&1 || cargo build --profile "$p" --locked
    elf="target/thumbv7m-none-eabi/$p/devcmd-firmware"
    echo "== profile $p ($elf)"
    "$NM" -S --defined-only "$elf" | python3 -c '
import re, subprocess, sys

def demangle(s):
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
         "cortex-m, cortex-m-rt, semihosting, log, allocator", "other"]
total = 0
top = []
for line in sys.stdin:
    f = line.split()
    if len(f) < 4 or f[2] not in "tTwW":
        continue
    size, name = int(f[1], 16), demangle(f[3])
    total += size
    if re.match(r"^<?devcmd::", name):
        b = order[0]
        top.append((size, name))
    elif "devcmd_firmware" in name:
        b = order[2]
    elif "devcmd::" in name:
        b = order[1]
    elif re.search(r"core::fmt|flt2dec|core::num::fmt|Display>::fmt|Debug>::fmt", name):
        b = order[3]
    elif "hashbrown" in name or "foldhash" in name:
        b = order[4]
    elif "compiler_builtins" in name or name.startswith("aeabi") or re.match(r"^_*(mem|aeabi)", name):
        b = order[5]
    elif re.search(r"cortex_m|semihosting|^log::|linked_list_allocator|embedded_alloc|critical_section|Reset|HardFault|DefaultHandler", name):
        b = order[6]
    else:
        b = order[7]
    buckets[b] = buckets.get(b, 0) + size
print(f"  text in symbols: {total} B ({total / 1024:.1f} KiB)")
for b in order:
    v = buckets.get(b, 0)
    print(f"  {b:58} {v:7} B  {v / 1024:5.1f} KiB")
print("  largest devcmd functions:")
for size, name in sorted(top, reverse=True)[:8]:
    print(f"    {size:6} B  {name[:110]}")
'
    llvm-size -A "$elf" 2>/dev/null | awk '$1 ~ /^\.(vector_table|text|rodata|data|bss)$/ {printf "  section %-14s %7d B\n", $1, $2}' || true
  done
done
