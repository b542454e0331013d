#!/usr/bin/env bash
# scripts/fuzz.sh [SECONDS] [TARGET...]: fuzzes petra's readers with clang's libFuzzer.
#
# Builds the fuzz targets of tests/fuzz/ (npy, idx, cifar, zip, checkpoint; all by default) in
# build-fuzz/ with clang++ -fsanitize=fuzzer,address,undefined (meson -Dfuzz=true, no CUDA, no
# OpenMP, no MPI), then runs each target for SECONDS (default 60), one after the other, starting
# from its seed corpus tests/fuzz/corpus/<target>/. New interesting inputs go to
# build-fuzz/fuzz-work/<target>/ (the seed corpus is only read); a finding (crash, exception other
# than petra::Error, sanitizer report, an input running past 20 s or allocating past 2 GB) is saved
# as build-fuzz/fuzz-findings/<target>-crash-... and makes the script exit 1. Add each finding,
# once fixed, to the seed corpus as corpus/<target>/finding-<what>: the cpu suite replays it.
#
# Prints per target the executions, the seconds and the corpus size (libFuzzer's final stats);
# the full logs are build-fuzz/fuzz-<target>.log. Needs clang++ with libFuzzer (Debian: clang-14).
set -uo pipefail
cd "$(dirname "$0")/.."

seconds=${1:-60}
shift || true
targets=("$@")
((${#targets[@]})) || targets=(npy idx cifar zip checkpoint)
command -v clang++ > /dev/null || { echo "fuzz: clang++ not found (libFuzzer comes with clang)" >&2; exit 2; }

dir=build-fuzz
if [ ! -f "$dir/build.ninja" ]; then
  CC=clang CXX=clang++ meson setup "$dir" --buildtype=debugoptimized -Dfuzz=true -Dcuda=disabled -Dopenmp=disabled \
    -Dmpi=disabled -Db_sanitize=address,undefined -Db_lundef=false || exit 2
fi
ninja -C "$dir" $(printf "tests/fuzz/fuzz-%s " "${targets[@]}") || exit 2

export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
status=0
mkdir -p "$dir/fuzz-findings"
for target in "${targets[@]}"; do
  work="$dir/fuzz-work/$target"
  log="$dir/fuzz-$target.log"
  mkdir -p "$work"
  echo "fuzz: $target for $seconds s"
  "$dir/tests/fuzz/fuzz-$target" -max_total_time="$seconds" -timeout=20 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$dir/fuzz-findings/$target-" "$work" "tests/fuzz/corpus/$target" > "$log" 2>&1
  rc=$?
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
  took=$(sed -n 's/^Done [0-9]* runs in \([0-9]*\) second.*/\1/p' "$log" | tail -n 1)
  corpus=$(grep -o 'corp: [0-9]*/[0-9a-zA-Z]*' "$log" | tail -n 1)
  if [ "$rc" -ne 0 ]; then
    status=1
    echo "fuzz: $target: FINDING after ${runs:-?} executions (exit $rc); see $log and $dir/fuzz-findings/"
    grep -m 3 -E "ERROR|SUMMARY|deadly|uncaught|timeout|out-of-memory" "$log" | sed 's/^/  /'
  else
    echo "fuzz: $target: ${runs:-?} executions in ${took:-$seconds} s, no finding (${corpus:-corp: ?})"
  fi
done
exit $status
