#!/usr/bin/env bash
# scripts/check-cpu-stack-vectors.sh [build-dir] [min-count]: lists the CPU kernels (functions of
# petra::kernels::cpu in libpetra-core) whose AVX-512 loads and stores touch the stack, most first:
# the count of instructions that name a zmm register and an address relative to %rsp or %rbp.
#
# Why: GCC keeps an array of __m512 accumulators (`__m512 acc[R][N]`) in memory whenever a loop
# over it is not unrolled, because that loop indexes it with a variable; a micro-kernel then zeroes
# its accumulators on the stack, loads them, and stores them back around its product loop (F(4x4)'s
# products did so until 2026-12-05, docs/results-cpu.md §1). `#pragma GCC unroll` on every loop
# over the array keeps it in registers. A function listed here is not necessarily wrong: one that
# needs more than 32 vector registers spills by necessity. Read its disassembly
# (`objdump -d --no-show-raw-insn` between its address and address + size from `nm -S`).
#
#   scripts/check-cpu-stack-vectors.sh            # build/, functions with more than 8
#   scripts/check-cpu-stack-vectors.sh build 0    # every function with any
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
min=${2:-8}
lib=$(ls "$build"/libpetra-core.so.*.*.* 2>/dev/null | head -1)
[ -n "$lib" ] || { echo "check-cpu-stack-vectors: no $build/libpetra-core.so (build first)"; exit 2; }
nm -S --defined-only "$lib" | awk '$3 ~ /^[tT]$/ && $4 ~ /kernels3cpu/ {print $1, $2, $4}' |
  while read -r addr size name; do
    end=$(printf '0x%x' $((0x$addr + 0x$size)))
    count=$(objdump -d --no-show-raw-insn --start-address=0x"$addr" --stop-address="$end" "$lib" |
              grep zmm | grep -c -E '\(%rsp\)|\(%rbp\)' || true)
    if [ "$count" -gt "$min" ]; then
      printf '%5d  %s\n' "$count" "$(echo "$name" | c++filt | cut -c1-160)"
    fi
  done | sort -rn
