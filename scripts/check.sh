#!/usr/bin/env bash
# scripts/check.sh --sanitize | --tsan [--jobs N]: petra under the sanitizers. Run it before every
# submission that touches the core (petra/, kernels/), the readers (data/, petra/npy.cpp) or the
# runtime (pipeline/).
#
#   --sanitize  build-asan/: ASan + UBSan (-Db_sanitize=address,undefined, debugoptimized, no CUDA,
#               no MPI, UBSan fatal). Runs the cpu suite (all but pkg-config-consumer, which compiles a
#               consumer without the sanitizers' runtime) and a short concurrent training run; then,
#               where CUDA's headers are installed, the CUDA kernels' emulated tests in
#               build-asan-emu/ (test-cuda-emulation alone, with ASan + UBSan).
#   --tsan      build-tsan/: TSan (-Db_sanitize=thread, debugoptimized, no CUDA, no MPI, no OpenMP: libgomp
#               is not built with TSan, and its own barriers show as races; the pipeline's threads,
#               channels and allocator are all petra's). Runs the tests of the threaded parts
#               (pipeline, trainer, synchronous, stream, allocator, data: the loader's prefetch
#               thread) and the short concurrent run.
#
# The short concurrent run: PETRA on two CPU workers (cpu:0, cpu:1), synthetic data, 2 epochs of 8
# mini-batches cut by --max-steps 12 with checkpoints, then resumed to the end: concurrent stages,
# channels, the checkpoint writer and every checkpoint reader. Any sanitizer report fails the script.
# The build directories are configured once and rebuilt incrementally. Exit status: 0 clean.
set -euo pipefail
cd "$(dirname "$0")/.."

mode=""
jobs=2
while (($#)); do
  case "$1" in
    --sanitize | --tsan) mode=$1 ;;
    --jobs) jobs=$2; shift ;;
    *) echo "usage: scripts/check.sh --sanitize | --tsan [--jobs N]" >&2; exit 2 ;;
  esac
  shift
done
[ -n "$mode" ] || { echo "usage: scripts/check.sh --sanitize | --tsan [--jobs N]" >&2; exit 2; }

common=(--buildtype=debugoptimized -Dcuda=disabled -Dmpi=disabled -Db_lundef=false)
if [ "$mode" = --sanitize ]; then
  dir=build-asan
  setup=(-Db_sanitize=address,undefined)
  export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1:strict_init_order=1}
  export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
else
  dir=build-tsan
  setup=(-Db_sanitize=thread -Dopenmp=disabled)
  export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1}
fi

if [ ! -f "$dir/build.ninja" ]; then
  echo "check: configuring $dir (${setup[*]})"
  meson setup "$dir" "${common[@]}" "${setup[@]}"
fi
echo "check: compiling in $dir"
ninja -C "$dir" -j "$jobs"

# The tests: under the sanitizers everything is 2-10x slower, hence the timeout multiplier.
if [ "$mode" = --sanitize ]; then
  mapfile -t tests < <(meson test -C "$dir" --list --suite cpu 2>/dev/null | sed -n 's/^petra:[^ ]* \/ //p' |
                       grep -vx 'pkg-config-consumer')
else
  tests=(pipeline trainer synchronous stream allocator data)
fi
echo "check: ${#tests[@]} tests under ${mode#--}: ${tests[*]}"
meson test -C "$dir" --num-processes "$jobs" --timeout-multiplier 8 --print-errorlogs "${tests[@]}"

# The short concurrent run, then its resume.
run_dir=$(mktemp -d "${TMPDIR:-/tmp}/petra-check-XXXXXX")
trap 'rm -rf "$run_dir"' EXIT
args=(--dataset synthetic --synthetic-size 256 --batch-size 32 --width 4 --epochs 2 --method petra
      --devices cpu:0,cpu:1 --stages blocks --placement 0,0,0,0,0,1,1,1,1,1 --message-timeout 300
      --checkpoint-dir "$run_dir/ck" --log-json "$run_dir/log.jsonl")
echo "check: petra-train ${args[*]} --max-steps 12"
"$dir/petra-train" "${args[@]}" --max-steps 12
echo "check: petra-train ... --resume"
"$dir/petra-train" "${args[@]}" --resume

# The CUDA kernels on the CPU (tests/emulation/: every kernel against ref::) under ASan + UBSan:
# build-asan-emu has CUDA's headers and cudart but builds only test-cuda-emulation (g++ compiles
# the .cu files against the emulation; no nvcc, no libpetra). Where CUDA is not installed there is
# nothing to emulate against, and the step says so.
if [ "$mode" = --sanitize ]; then
  if [ -f /usr/local/cuda/include/cuda_runtime.h ]; then
    if [ ! -f build-asan-emu/build.ninja ]; then
      echo "check: configuring build-asan-emu (CUDA's headers, ${setup[*]})"
      meson setup build-asan-emu --buildtype=debugoptimized -Dmpi=disabled -Db_lundef=false "${setup[@]}"
    fi
    ninja -C build-asan-emu -j "$jobs" tests/test-cuda-emulation
    mapfile -t emulated < <(meson test -C build-asan-emu --list --suite cpu 2>/dev/null |
                            sed -n 's/^petra:[^ ]* \/ //p' | grep -E '^(emulated-[a-z_0-9]+|emulation-layer)$' |
                            grep -vE '^emulated-device')
    echo "check: ${#emulated[@]} emulated kernel tests under sanitize: ${emulated[*]}"
    meson test -C build-asan-emu --no-rebuild --num-processes "$jobs" --timeout-multiplier 8 --print-errorlogs \
      "${emulated[@]}"
  else
    echo "check: no CUDA headers (/usr/local/cuda): the emulated kernels' tests skipped"
  fi
fi
echo "check: ${mode#--}: clean"
