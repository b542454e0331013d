#!/bin/sh
# tests/consumer/check_consumer.sh BUILD_DIR SOURCE_DIR
# Installs the built petra into a temporary prefix, then compiles and runs two programs with only
# the flags pkg-config gives: consumer.cpp against `petra` (the whole library) and
# consumer_core.cpp against `petra-core` alone. For the second it checks, with readelf and nm, that
# the program needs libpetra-core but not libpetra, and that libpetra-core defines no symbol of the
# upper floors (petra::nn, petra::data, petra::pipeline) and needs no zlib.
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
libdir=$(pkg-config --define-variable=prefix="$stage$prefix" --variable=libdir petra)

build_and_run() {  # PACKAGE SOURCE OUTPUT
  flags=$(pkg-config --define-variable=prefix="$stage$prefix" --cflags --libs "$1")
  echo "pkg-config --cflags --libs $1: $flags"
  ${CXX:-c++} -std=c++20 -o "$3" "$2" $flags -Wl,-rpath,"$libdir" -Wl,--as-needed
  "$3"
}
build_and_run petra "$source/consumer.cpp" "$stage/consumer"
build_and_run petra-core "$source/consumer_core.cpp" "$stage/consumer_core"

needed=$(readelf -d "$stage/consumer_core" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
echo "consumer_core needs: $(echo $needed)"
echo "$needed" | grep -q '^libpetra-core\.so' || { echo "FAIL: consumer_core does not need libpetra-core"; exit 1; }
if echo "$needed" | grep -q '^libpetra\.so'; then echo "FAIL: consumer_core needs libpetra"; exit 1; fi
core=$(ls "$libdir"/libpetra-core.so.*.* | head -n 1)
core_needed=$(readelf -d "$core" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
echo "libpetra-core needs: $(echo $core_needed)"
if echo "$core_needed" | grep -Eq '^lib(z|fmt|petra)\.so'; then echo "FAIL: libpetra-core needs zlib, fmt or libpetra"; exit 1; fi
upper=$(nm -D --defined-only -C "$core" | grep -Ec 'petra::(nn|data|pipeline)::' || true)
echo "upper-floor symbols defined by libpetra-core: $upper"
[ "$upper" -eq 0 ] || { echo "FAIL: libpetra-core defines upper-floor symbols"; exit 1; }
soname=$(readelf -d "$core" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
echo "libpetra-core soname: $soname"
case "$soname" in libpetra-core.so.*) ;; *) echo "FAIL: libpetra-core has no versioned soname"; exit 1 ;; esac
