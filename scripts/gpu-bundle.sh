#!/usr/bin/env bash
# scripts/gpu-bundle.sh: packs what the GPU checks need into .gpu/, to be carried to a machine with
# an NVIDIA GPU and run there by scripts/gpu-check.sh.
#
# The GPU machine has the CUDA runtime, cuBLAS, cuDNN and NCCL but none of Debian's build
# dependencies, so the checks run binaries built here: the two libraries (libpetra-core.so.0.1,
# libpetra.so.0.1, under their sonames), test-cuda, test-mpi, bench-cuda, petra-train and
# bench-pipeline (the CPU pipeline benchmark, which that quiet 16-core host runs undisturbed), in
# two variants (this machine's -march=native build, and a portable x86-64-v3 build for a processor
# without AVX-512), the shared libraries that machine may lack (fmt, OpenMP's libgomp; Open MPI's
# as a fallback), the PyTorch peer and the Fashion-MNIST files (about 50 MiB in all: a device
# call carries at most 64).
#
#   scripts/gpu-bundle.sh [native-build-dir] [portable-build-dir]     # default: build build-portable
#   (the portable build: meson setup build-portable -Dbuildtype=release -Dcpu_arch=x86-64-v3 &&
#    ninja -C build-portable tests/test-cuda bench-cuda bench-pipeline petra-train)
#   GPU_BUNDLE_SKIP="portable fashion-mnist" scripts/gpu-bundle.sh    # leave parts out
#
# A device call carries the working tree and the bundle, at most 64 MiB together: the script prints
# the sum and, past it, what to leave out (the H200 host has AVX-512, so it runs the native
# binaries; the fashion group alone needs the dataset).
set -euo pipefail
cd "$(dirname "$0")/.."
native=${1:-build}
portable=${2:-build-portable}
bundle=.gpu
grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >> .git/info/exclude
rm -rf "$bundle"
mkdir -p "$bundle/lib"
skip=" ${GPU_BUNDLE_SKIP:-} "
for pair in "native:$native" "portable:$portable"; do
  variant=${pair%%:*} dir=${pair#*:}
  [[ "$skip" == *" $variant "* ]] && { echo "gpu-bundle: leaving out the $variant variant (GPU_BUNDLE_SKIP)"; continue; }
  [ -f "$dir/petra-train" ] || { echo "gpu-bundle: no $dir/petra-train; skipping the $variant variant"; continue; }
  mkdir -p "$bundle/$variant"
  # The libraries under the names the binaries ask for (their sonames), not the symlinks' targets.
  cp -L "$dir/libpetra-core.so.0.1" "$dir/libpetra.so.0.1" "$bundle/$variant/"
  cp "$dir/tests/test-cuda" "$dir/bench-cuda" "$dir/bench-pipeline" "$dir/petra-train" "$bundle/$variant/"
  [ -f "$dir/tests/test-mpi" ] && cp "$dir/tests/test-mpi" "$bundle/$variant/"  # gpu-check's NCCL step
  # gpu-check's streams group: the CUPTI kernel tracer (benchmarks/kernel_trace.cpp)
  [ -f "$dir/libpetra-kernel-trace.so" ] && cp "$dir/libpetra-kernel-trace.so" "$bundle/$variant/"
done
for lib in libfmt.so.9 libgomp.so.1; do
  cp -L "$(ldconfig -p | awk -v l="$lib" '$1 == l { print $NF; exit }')" "$bundle/lib/"
done
# Every other Debian library the binaries load (Open MPI's, which libpetra links when built with
# MPI, and theirs: hwloc, libevent, udev, zlib), except glibc, the C++ runtime and CUDA's: the GPU
# machine's image may lack them. gpu-check.sh puts this folder on the library path only when a
# binary would otherwise miss one, so that a machine's own Open MPI (and its mpirun) stays in charge.
mkdir -p "$bundle/fallback"
for program in "$bundle"/*/petra-train "$bundle"/*/test-mpi; do
  ldd "$program" | awk '$3 ~ /^\/(usr\/)?lib\/x86_64-linux-gnu\// { print $1, $3 }' |
    grep -vE '^(libc|libm|libdl|libpthread|librt|libstdc\+\+|libgcc_s|libfmt|libgomp)\.so' |
    while read -r name path; do cp -L "$path" "$bundle/fallback/$name"; done
done
# The PyTorch peer (benchmarks/pytorch_gpu.py and the network twin it imports), and the default
# dataset for the README's main job on the GPU (the GPU machine has no Debian datasets).
mkdir -p "$bundle/benchmarks"
cp benchmarks/pytorch_gpu.py benchmarks/compare_pytorch.py "$bundle/benchmarks/"
fashion=/usr/share/datasets/fashion-mnist
[ -d "$fashion" ] && [[ "$skip" != *" fashion-mnist "* ]] && cp -r "$fashion" "$bundle/fashion-mnist"
cp scripts/gpu-check.sh scripts/stream_busy.py scripts/conv_tiles.py "$bundle/"
# What a device call will carry: the bundle plus the tracked and untracked-not-ignored files.
bundle_kib=$(du -sk "$bundle" | cut -f1)
tree_kib=$(git ls-files -z --cached --others --exclude-standard | du -ck --files0-from=- 2> /dev/null | tail -n 1 | cut -f1)
total_mib=$(((bundle_kib + tree_kib) / 1024))
echo "gpu-bundle: $((bundle_kib / 1024)) MiB of bundle + $((tree_kib / 1024)) MiB of working tree = $total_mib MiB (a device call carries at most 64)"
if [ "$total_mib" -ge 64 ]; then
  echo "gpu-bundle: too large for one call: rerun with GPU_BUNDLE_SKIP=portable (the H200 host has AVX-512)" \
    "or GPU_BUNDLE_SKIP=fashion-mnist (only the fashion group needs it)"
fi
