#!/usr/bin/env bash
# scripts/setup.sh: set petra up on a fresh Debian 12 machine, idempotently.
#   1. installs with apt-get only the packages that are missing,
#   2. configures build/ (release) if it is not configured yet,
#   3. compiles.
# Usage: scripts/setup.sh            (as root, or with sudo available)
#        scripts/setup.sh --with-torch   also Debian's PyTorch for benchmarks/compare_pytorch.py (python3-torch
#                                        for /usr/bin/python3, NumPy and OpenBLAS: ~600 MB; opt-in, CI does not need it)
# Environment: PETRA_BUILD_DIR (default build), PETRA_MESON_ARGS (extra meson setup args).
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(meson ninja-build pkg-config zlib1g-dev libeigen3-dev doctest-dev libcli11-dev
          nlohmann-json3-dev libfmt-dev libopenmpi-dev openmpi-bin dataset-fashion-mnist)
for arg in "$@"; do
  case "$arg" in
    # libopenblas0-pthread must be named under --no-install-recommends: without it torch falls back to
    # netlib's reference BLAS, ~30x slower (docs/profiling.md)
    --with-torch) packages+=(python3-torch python3-numpy libopenblas0-pthread) ;;
    *) echo "setup: unknown option '$arg' (known: --with-torch)" >&2; exit 2 ;;
  esac
done
missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if ((${#missing[@]})); then
  echo "setup: installing missing packages: ${missing[*]}"
  sudo_cmd=()
  [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "setup: all packages present"
fi

build_dir=${PETRA_BUILD_DIR:-build}
if [ ! -f "$build_dir/build.ninja" ]; then
  echo "setup: configuring $build_dir (release)"
  # shellcheck disable=SC2086
  meson setup "$build_dir" --buildtype=release ${PETRA_MESON_ARGS:-}
fi
echo "setup: compiling in $build_dir"
ninja -C "$build_dir"
echo "setup: done"
