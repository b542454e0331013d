#!/bin/sh
# tests/consumer/check_consumer.sh BUILD_DIR CONSUMER_CPP
# Installs the built petra into a temporary prefix, then compiles and runs a consumer program
# with only the flags pkg-config gives: proof that petra links as a dependency.
set -eu
build=$1
source=$2
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
meson install -C "$build" --no-rebuild --quiet --destdir "$stage" >/dev/null
pc=$(find "$stage" -name petra.pc | head -n 1)
[ -n "$pc" ] || { echo "petra.pc was not installed"; exit 1; }
export PKG_CONFIG_PATH="$(dirname "$pc")"
prefix=$(pkg-config --variable=prefix petra)   # where it would be installed; it lies under $stage
flags=$(pkg-config --define-variable=prefix="$stage$prefix" --cflags --libs petra)
libdir=$(pkg-config --define-variable=prefix="$stage$prefix" --variable=libdir petra)
echo "pkg-config --cflags --libs petra: $flags"
${CXX:-c++} -std=c++20 -o "$stage/consumer" "$source" $flags -Wl,-rpath,"$libdir"
"$stage/consumer"
