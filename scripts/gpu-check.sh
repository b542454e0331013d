#!/usr/bin/env bash
# scripts/gpu-check.sh: the GPU checks, run on a machine with an NVIDIA GPU from the bundle that
# scripts/gpu-bundle.sh made (.gpu/): the cuda test suite, the kernels' bandwidth (bench-cuda),
# bench-pipeline on that machine's idle CPUs, and the cuda suite again under compute-sanitizer's
# memcheck where the sanitizer works. Everything it prints also goes to OUT/gpu-check.log, the
# benchmarks' numbers to OUT/bench-cuda.json and OUT/bench-pipeline.json.
#
#   .gpu/gpu-check.sh [bundle-dir] [out-dir]         # defaults: .gpu and $OUT (else ./gpu-out)
set -u
bundle=$(cd "${1:-.gpu}" && pwd)
out=${2:-${OUT:-gpu-out}}
mkdir -p "$out"
exec > >(tee "$out/gpu-check.log") 2>&1

echo "== machine ($(date -u '+%Y-%m-%d %H:%M UTC'))"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
lscpu | grep -E 'Model name|^CPU\(s\)'
variant=portable
grep -qw avx512f /proc/cpuinfo && [ -d "$bundle/native" ] && variant=native
echo "binaries: $variant"

# The CUDA libraries: the toolkit's, or those of the Python wheels (site-packages/nvidia/*/lib).
libdirs=$(find /usr/local /opt -maxdepth 10 \( -name 'libcudart.so.13' -o -name 'libcublas.so.13' \
  -o -name 'libcublasLt.so.13' -o -name 'libcudnn.so.9' -o -name 'libnccl.so.2' \) 2>/dev/null |
  xargs -r -n1 dirname | sort -u | tr '\n' ':')
export LD_LIBRARY_PATH="$bundle/$variant:$bundle/lib:$libdirs${LD_LIBRARY_PATH:-}"
echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
ldd "$bundle/$variant/test-cuda" | grep 'not found' && echo "MISSING LIBRARIES (above)"

echo "== test-cuda"
"$bundle/$variant/test-cuda" --duration=true
echo "test-cuda exit code: $?"

echo "== bench-cuda"
"$bundle/$variant/bench-cuda" --json "$out/bench-cuda.json"
echo "bench-cuda exit code: $?"

echo "== bench-pipeline (CPU: 2 workers x 1 thread on an otherwise idle host)"
OMP_WAIT_POLICY=passive timeout 240 "$bundle/$variant/bench-pipeline" --json "$out/bench-pipeline.json"
echo "bench-pipeline exit code: $? (124: timed out)"

echo "== test-cuda under compute-sanitizer memcheck"
# --report-api-errors no: the suite asks for an impossible allocation on purpose (to check that it
# becomes OutOfMemoryError), which memcheck would otherwise count as an error.
if command -v compute-sanitizer > /dev/null; then
  timeout 150 compute-sanitizer --tool memcheck --leak-check full --report-api-errors no --error-exitcode 9 \
    "$bundle/$variant/test-cuda"
  echo "memcheck exit code: $? (0 clean, 9 errors found, 124 timed out)"
else
  echo "compute-sanitizer is not on the PATH"
fi
