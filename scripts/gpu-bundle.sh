#!/usr/bin/env bash
# scripts/gpu-bundle.sh: packs what the GPU checks need into .gpu/, to be carried to a machine with
# an NVIDIA GPU and run there by scripts/gpu-check.sh.
#
# The GPU machine has the CUDA runtime, cuBLAS, cuDNN and NCCL but none of Debian's build
# dependencies, so the checks run binaries built here: the two libraries (libpetra-core.so.0.1,
# libpetra.so.0.1, under their sonames), test-cuda, bench-cuda, petra-train and bench-pipeline (the
# CPU pipeline benchmark, which that quiet 16-core host runs undisturbed), in two variants (this
# machine's -march=native build, and a portable x86-64-v3 build for a processor without AVX-512),
# plus the two shared libraries that machine may lack (fmt, OpenMP's libgomp).
#
#   scripts/gpu-bundle.sh [native-build-dir] [portable-build-dir]     # default: build build-portable
#   (the portable build: meson setup build-portable -Dbuildtype=release -Dcpu_arch=x86-64-v3 &&
#    ninja -C build-portable tests/test-cuda bench-cuda bench-pipeline petra-train)
set -euo pipefail
cd "$(dirname "$0")/.."
native=${1:-build}
portable=${2:-build-portable}
bundle=.gpu
grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >> .git/info/exclude
rm -rf "$bundle"
mkdir -p "$bundle/lib"
for pair in "native:$native" "portable:$portable"; do
  variant=${pair%%:*} dir=${pair#*:}
  [ -f "$dir/petra-train" ] || { echo "gpu-bundle: no $dir/petra-train; skipping the $variant variant"; continue; }
  mkdir -p "$bundle/$variant"
  # The libraries under the names the binaries ask for (their sonames), not the symlinks' targets.
  cp -L "$dir/libpetra-core.so.0.1" "$dir/libpetra.so.0.1" "$bundle/$variant/"
  cp "$dir/tests/test-cuda" "$dir/bench-cuda" "$dir/bench-pipeline" "$dir/petra-train" "$bundle/$variant/"
  [ -f "$dir/tests/test-mpi" ] && cp "$dir/tests/test-mpi" "$bundle/$variant/"  # gpu-check's NCCL step
done
for lib in libfmt.so.9 libgomp.so.1; do
  cp -L "$(ldconfig -p | awk -v l="$lib" '$1 == l { print $NF; exit }')" "$bundle/lib/"
done
cp scripts/gpu-check.sh "$bundle/"
du -sh "$bundle"
