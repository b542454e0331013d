#!/usr/bin/env bash
# scripts/check-spills.sh [build-dir]: compiles every CUDA source of kernels/cuda/ again, as the build
# does (the same nvcc command from the build's ninja file), with ptxas's resource report, and fails
# (exit 1) if any kernel of any target architecture spills registers to local memory or keeps a
# stack frame (an array in local memory): either is a silent slowdown of a hot kernel, so it is
# treated as a failure of the kernel benchmark (issue 12). The build itself only warns
# (-Xptxas=-warn-spills), so that another toolkit's different register allocation cannot stop a
# user's build. No GPU is needed; nvcc is.
#
#   scripts/check-spills.sh            # build/ by default
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
[ -f "$build/build.ninja" ] || { echo "check-spills: no $build/build.ninja (configure the build first)"; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
status=0
count=0
while IFS= read -r command; do
  source=$(grep -o '\.\./kernels/cuda/[a-z_0-9]*\.cu' <<<"$command" | head -n 1)
  [ -n "$source" ] || continue
  count=$((count + 1))
  # The build's own command, into a scratch object, with ptxas's per-kernel report.
  report=$(cd "$build" && eval "$(sed -E "s# -o [^ ]+# -Xptxas=-v -o $work/x.o#" <<<"$command")" 2>&1 || true)
  # ptxas -v: "Compiling entry function 'NAME' for 'sm_XX'", then "... N bytes spill stores, M bytes
  # spill loads" for it.
  # A stack frame is local memory too (a register array indexed at run time, as the TF32 k8 loop's
  # A operands once were): reported with the spills.
  spills=$(awk '/Compiling entry function/ { name = $7 " " $9 }
                /bytes spill stores/ { s = 0; f = 0
                                       for (i = 1; i <= NF; ++i) {
                                         if ($(i + 1) == "bytes" && $(i + 2) == "spill" && $(i + 3) == "stores,") s = $i
                                         if ($(i + 1) == "bytes" && $(i + 2) == "stack" && $(i + 3) == "frame,") f = $i
                                       }
                                       if (s + 0 > 0 || f + 0 > 0) print "  " name ": " $0 }' <<<"$report")
  if [ -n "$spills" ]; then
    echo "SPILLS in ${source#../}:"
    echo "$spills"
    status=1
  fi
done < <(ninja -C "$build" -t commands | grep -E '^nvcc .*kernels/cuda/[a-z_0-9]*\.cu')
verdict=$([ "$status" -eq 0 ] && echo 'no kernel spills or stack frames' || echo 'SPILLS or STACK FRAMES (above)')
echo "check-spills: $count CUDA sources compiled with ptxas's report: $verdict"
exit $status
