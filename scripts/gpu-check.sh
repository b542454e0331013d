#!/usr/bin/env bash
# scripts/gpu-check.sh: the GPU checks, run on a machine with an NVIDIA GPU from the bundle that
# scripts/gpu-bundle.sh made (.gpu/). Groups of checks, in the order of what a loan is for,
# correctness first (ONLY="group ..." runs some of them, in the order given):
#   tests     the cuda test suite (every op's kernels against ref::, cuBLAS, cuDNN);
#   training  petra-train on the GPU: RevNet18 width 64 on synthetic CIFAR-shaped data, batch 128,
#             300 steps, with backprop, revbackprop, revbackprop on cuDNN's convolution and batch
#             norm (--conv-impl cudnn: the anchor of petra's kernels), the same three in TF32
#             (--conv-math tf32), backprop on cuDNN with its deterministic and its fastest
#             algorithms, backprop with the direct weight gradient everywhere (--conv-weight
#             direct; the default, auto, takes Winograd's where run 12 timed it faster), backprop
#             with the forward and backward data in Winograd's domain too (--conv-forward winograd,
#             and auto: where estimated faster), backprop with split-K for the forward and
#             backward data of the 4x4 layers (--conv-split-k, FP32 and TF32),
#             revbackprop and TF32 backprop with batch norm in one pass (--batchnorm-one-pass),
#             PETRA, and PETRA on two streams of the one GPU (the concurrent
#             executor), twice: bit-identical to PETRA on one stream and from run to run;
#   bench     the kernels against cuDNN and the copy bandwidth (bench-cuda: ResNet-18 CIFAR
#             convolutions at batch 128, FP32 and TF32, every block tile forced too, and batch
#             norm; then scripts/conv_tiles.py's sums per pass);
#   sanitize  compute-sanitizer: memcheck on the cuda suite, racecheck and synccheck on its
#             backend-ops case (every op's kernels) and its batch-norm case (the one pass's
#             thread-block clusters);
#   profile   Nsight Compute's kernel times over a few revbackprop and backprop steps, summed per
#             kernel (PROFILE_METHODS="revbackprop backprop" by default);
#   stalls    Nsight Compute's warp stall reasons, scheduler and occupancy for a few launches of
#             the FP32 and TF32 convolution kernels (ncu-stalls-*.txt; not in the default list);
#   sass      the convolution kernels' machine code with, per instruction, how often it ran and
#             where its warps stalled (Nsight Compute's source counters on one launch each of
#             the FP32 and TF32 forward and weight passes, sass-*.csv; with SASS_CUOBJDUMP=1
#             also cuobjdump's listing of the whole library; not in the default list);
#   streams   how busy each stream is when PETRA's two stages share the GPU (each stream's busy
#             share, both at once, neither), and how busy backprop keeps its one stream, from
#             petra's CUPTI tracer or nsys (streams-<run>.txt);
#   pytorch   the PyTorch peer of the training runs (benchmarks/pytorch_gpu.py, eager on cuDNN,
#             FP32 and TF32), where the machine's python3 has PyTorch with CUDA;
#   fashion   the default Fashion-MNIST run (petra-train's defaults) on cuda:0: accuracy and time;
#   mpi       --mpi on the GPU, where mpirun exists (and NCCL between processes where there are
#             two GPUs or more);
#   pipeline  bench-pipeline on the idle CPUs (not in the default list; measured on 2026-11-30).
# Everything it prints also goes to OUT/gpu-check.log, the benchmarks' numbers to
# OUT/bench-cuda.json and OUT/pytorch-gpu.json, each training run's log to OUT/train-<name>.log
# and .jsonl, the GPU's utilisation per second to OUT/dmon.log. Default: every group but pipeline.
#
# It must end within 6 minutes on an H200 (a loan is 15 minutes, and a rerun must fit): every step
# runs under a timeout, and a step is skipped, saying so, when the whole script has used its budget
# (BUDGET seconds, default 330).
#
#   .gpu/gpu-check.sh [bundle-dir] [out-dir]         # defaults: .gpu and $OUT (else ./gpu-out)
#   ONLY="tests training" BUDGET=200 .gpu/gpu-check.sh
set -u
bundle=$(cd "${1:-.gpu}" && pwd)
out=${2:-${OUT:-gpu-out}}
budget=${BUDGET:-330}
mkdir -p "$out"
exec > >(tee "$out/gpu-check.log") 2>&1

# step NAME MAX_SECONDS COMMAND...: runs COMMAND under `timeout` for at most MAX_SECONDS, less if the
# budget is nearly spent, and prints its exit code (124: timed out) and how long it took. With
# STEP_LOG set, the command's output goes to that file instead.
step() {
  local name=$1 max=$2
  shift 2
  local left=$((budget - SECONDS))
  if [ "$left" -lt 15 ]; then
    echo "== $name: SKIPPED, the budget of ${budget} s is spent (${SECONDS} s so far)"
    return 0
  fi
  [ "$max" -gt "$left" ] && max=$left
  echo "== $name (at most ${max} s; ${SECONDS} s so far; $(date -u +%T))"
  local start=$SECONDS
  if [ -n "${STEP_LOG:-}" ]; then
    timeout "$max" "$@" > "$STEP_LOG" 2>&1
  else
    timeout "$max" "$@"
  fi
  local rc=$?
  echo "== $name: exit code $rc$([ "$rc" -eq 124 ] && echo ' (timed out)') after $((SECONDS - start)) s"
  return 0
}

echo "== machine ($(date -u '+%Y-%m-%d %H:%M UTC'))"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
lscpu | grep -E 'Model name|^CPU\(s\)'
variant=portable
grep -qw avx512f /proc/cpuinfo && [ -d "$bundle/native" ] && variant=native
bin="$bundle/$variant"
echo "binaries: $variant"

# The CUDA libraries: the toolkit's, or those of the Python wheels (site-packages/nvidia/*/lib).
libdirs=$(find /usr/local /opt -maxdepth 10 \( -name 'libcudart.so.13' -o -name 'libcublas.so.13' \
  -o -name 'libcublasLt.so.13' -o -name 'libcudnn.so.9' -o -name 'libnccl.so.2' \) 2>/dev/null |
  xargs -r -n1 dirname | sort -u | tr '\n' ':')
export LD_LIBRARY_PATH="$bin:$bundle/lib:$libdirs${LD_LIBRARY_PATH:-}"
# The bundle's Debian libraries (Open MPI's and theirs) only where the machine lacks one.
if ldd "$bin/petra-train" | grep -q 'not found'; then
  echo "missing on this machine: $(ldd "$bin/petra-train" | awk '/not found/ { print $1 }' | tr '\n' ' ')(the bundle's are used)"
  export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$bundle/fallback"
fi
echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
for program in test-cuda petra-train bench-cuda bench-pipeline; do
  ldd "$bin/$program" | grep 'not found' && echo "MISSING LIBRARIES of $program (above)"
done

# ---- the groups of checks (ONLY="tests training ..." runs some, in that order) -----------------

group_tests() {
  step "test-cuda" 60 "$bin/test-cuda" --duration=true
}

# Training on the GPU: RevNet18 (width 64, the paper's) on synthetic 3x32x32 images (CIFAR's shape),
# batch 128, one epoch of 38400 images = 300 steps (PETRA adds the 18 steps that drain its pipeline),
# no augmentation (the host's work stays small), then the test set (7680 images) on the GPU. The
# epoch line gives images/s; the next line the allocator's peak bytes on the GPU.
train() {
  local name=$1
  shift
  STEP_LOG="$out/train-$name.log" step "petra-train $name" 50 "$bin/petra-train" --dataset synthetic \
    --synthetic-size 38400 --model revnet18 --width 64 --batch-size 128 --epochs 1 --no-augment --threads 8 \
    --report-memory --log-json "$out/train-$name.jsonl" "$@"
  [ -f "$out/train-$name.log" ] && tr '\r' '\n' < "$out/train-$name.log" | grep -E "^training on|^placement|^epoch |peak memory|^final|^petra-train: " |
    tail -n 8
}

# The first lines of two runs' JSON logs: the same numbers, bit for bit?
same_numbers() {
  local label=$1 one=$2 two=$3
  [ -s "$one" ] && [ -s "$two" ] || return 0
  python3 - "$label" "$one" "$two" <<'PY'
import json, sys
label = sys.argv[1]
one, two = (json.loads(open(p).readline()) for p in sys.argv[2:4])
keys = ("train_loss", "test_loss", "test_accuracy")
same = all(one[k] == two[k] for k in keys)
print(f"== {label}: " + ", ".join(f"{k} {one[k]!r} vs {two[k]!r}" for k in keys)
      + (": BIT-IDENTICAL" if same else ": DIFFERENT (they must agree bit for bit)"))
PY
}

# petra's kernels against cuDNN's in two runs' JSON logs: the numbers, and images/s.
petra_vs_cudnn() {
  local label=$1 petra=$2 cudnn=$3
  [ -s "$petra" ] && [ -s "$cudnn" ] || return 0
  python3 - "$label" "$petra" "$cudnn" <<'PY'
import json, sys
label = sys.argv[1]
petra, cudnn = (json.loads(open(p).readline()) for p in sys.argv[2:4])
for key in ("train_loss", "test_loss", "test_accuracy"):
    print(f"== {label}: {key} {petra[key]:.5f} vs {cudnn[key]:.5f} "
          f"(relative difference {abs(petra[key] - cudnn[key]) / max(abs(cudnn[key]), 1e-30):.1e})")
print(f"== {label}: images/s {petra['images_per_second']:.0f} vs {cudnn['images_per_second']:.0f} "
      f"(petra at {petra['images_per_second'] / cudnn['images_per_second']:.2f}x cuDNN's; target >= 0.8x)")
PY
}

# images/s of several runs' JSON logs, side by side.
images_per_second() {
  local label=$1
  shift
  python3 - "$label" "$@" <<'PY'
import json, os, sys
parts = []
for path in sys.argv[2:]:
    if os.path.exists(path) and os.path.getsize(path) > 0:
        parts.append(f"{os.path.basename(path)[6:-6]} {json.loads(open(path).readline())['images_per_second']:.0f}")
print(f"== {sys.argv[1]}: images/s " + ", ".join(parts))
PY
}

group_training() {
  train backprop --method backprop --devices cuda:0
  train revbackprop --method revbackprop --devices cuda:0
  # The same run on cuDNN's convolution and batch norm: petra's kernels' images/s against cuDNN's.
  train revbackprop-cudnn --method revbackprop --devices cuda:0 --conv-impl cudnn
  petra_vs_cudnn "conv-impl petra vs cudnn (FP32)" "$out/train-revbackprop.jsonl" "$out/train-revbackprop-cudnn.jsonl"
  # TF32 on the tensor cores (PyTorch's default for convolutions), petra's kernels and cuDNN's.
  train backprop-tf32 --method backprop --devices cuda:0 --conv-math tf32
  train revbackprop-tf32 --method revbackprop --devices cuda:0 --conv-math tf32
  train revbackprop-cudnn-tf32 --method revbackprop --devices cuda:0 --conv-impl cudnn --conv-math tf32
  petra_vs_cudnn "conv-impl petra vs cudnn (TF32)" "$out/train-revbackprop-tf32.jsonl" \
    "$out/train-revbackprop-cudnn-tf32.jsonl"
  # Backprop on cuDNN, with its deterministic algorithms (petra's default) and with the fastest it
  # times (--cudnn-algorithms fastest, as PyTorch's cudnn.benchmark): what determinism costs, and
  # how far petra's stack is from PyTorch's (group pytorch) with cuDNN's kernels on both sides.
  train backprop-cudnn --method backprop --devices cuda:0 --conv-impl cudnn
  train backprop-cudnn-fastest --method backprop --devices cuda:0 --conv-impl cudnn --cudnn-algorithms fastest
  # petra's weight gradient without Winograd's F(2x2, 3x3) (--conv-weight direct; the default,
  # auto, takes Winograd's on the 3x3 stride-1 layers of 64+ channels, where run 12 timed it
  # faster): what the rule gains.
  train backprop-direct --method backprop --devices cuda:0 --conv-weight direct
  # The forward and backward data in Winograd's domain too (--conv-forward winograd, an option
  # until timed here): the forward and backward data of every 3x3 stride-1 layer (the stem's too) in
  # F(2x2, 3x3), beside the weight gradient's on those of 64+ channels; --conv-forward auto only
  # where run 12's numbers estimate it faster (64+ channels, planes up to 16x16, in TF32 8x8).
  train backprop-winograd-forward --method backprop --devices cuda:0 --conv-forward winograd
  train backprop-winograd-forward-auto --method backprop --devices cuda:0 --conv-forward auto
  # Split-K for the forward and backward data where the 128x128 tile leaves too few blocks (the
  # 4x4 layers; --conv-split-k, an option until timed here), in FP32 and TF32.
  train backprop-split-k --method backprop --devices cuda:0 --conv-split-k
  images_per_second "backprop, FP32" "$out/train-backprop.jsonl" "$out/train-backprop-direct.jsonl" \
    "$out/train-backprop-winograd-forward.jsonl" "$out/train-backprop-winograd-forward-auto.jsonl" \
    "$out/train-backprop-split-k.jsonl" "$out/train-backprop-cudnn.jsonl" \
    "$out/train-backprop-cudnn-fastest.jsonl"
  train backprop-tf32-split-k --method backprop --devices cuda:0 --conv-math tf32 --conv-split-k
  images_per_second "backprop TF32, split-K" "$out/train-backprop-tf32.jsonl" "$out/train-backprop-tf32-split-k.jsonl"
  # Batch norm in one pass (--batchnorm-one-pass: each channel kept in a thread-block cluster's shared
  # memory, one read of x and dy instead of two; off by default until timed here).
  train revbackprop-bn-one-pass --method revbackprop --devices cuda:0 --batchnorm-one-pass
  images_per_second "revbackprop, batch norm in two passes and in one" "$out/train-revbackprop.jsonl" \
    "$out/train-revbackprop-bn-one-pass.jsonl"
  train backprop-tf32-bn-one-pass --method backprop --devices cuda:0 --conv-math tf32 --batchnorm-one-pass
  images_per_second "backprop TF32, batch norm in two passes and in one" "$out/train-backprop-tf32.jsonl" \
    "$out/train-backprop-tf32-bn-one-pass.jsonl"
  train petra --method petra --devices cuda:0
  # PETRA's stages on two streams of the one GPU (two workers, the concurrent executor): the same
  # numbers as the sequential executor's on the same GPU, bit for bit, and from run to run.
  train petra-2-streams --method petra --devices cuda:0,cuda:0
  same_numbers "PETRA, 1 stream vs 2 streams" "$out/train-petra.jsonl" "$out/train-petra-2-streams.jsonl"
  train petra-2-streams-again --method petra --devices cuda:0,cuda:0
  same_numbers "PETRA on 2 streams, run to run" "$out/train-petra-2-streams.jsonl" "$out/train-petra-2-streams-again.jsonl"
}

# The PyTorch peer of the runs above (eager, cuDNN, FP32 then TF32), where python3 has CUDA PyTorch.
group_pytorch() {
  if python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2> /dev/null; then
    step "PyTorch peer (benchmarks/pytorch_gpu.py)" 60 python3 "$bundle/benchmarks/pytorch_gpu.py" \
      --json "$out/pytorch-gpu.json"
  else
    echo "== PyTorch peer: SKIPPED (python3 has no PyTorch with CUDA here)"
  fi
}

# 11 layer shapes x 4 passes x 2 implementations x (3 + 10) launches, plus the batch-norm table.
group_bench() {
  step "bench-cuda" 60 "$bin/bench-cuda" --json "$out/bench-cuda.json"
  # the convolution table summed per pass: petra's tiles against the fastest tile and cuDNN
  [ -s "$out/bench-cuda.json" ] && python3 "$bundle/conv_tiles.py" "$out/bench-cuda.json"
  return 0
}

# The README's main job on the GPU: petra-train's defaults (RevNet18 width 16, Fashion-MNIST,
# 4 epochs, PETRA) on cuda:0, from the copy of the dataset in the bundle.
group_fashion() {
  [ -d "$bundle/fashion-mnist" ] || { echo "== Fashion-MNIST: SKIPPED (not in the bundle)"; return 0; }
  STEP_LOG="$out/train-fashion-mnist.log" step "petra-train defaults on cuda:0 (Fashion-MNIST)" 90 \
    "$bin/petra-train" --devices cuda:0 --data-dir "$bundle/fashion-mnist" --threads 8 \
    --log-json "$out/train-fashion-mnist.jsonl"
  [ -f "$out/train-fashion-mnist.log" ] && tr '\r' '\n' < "$out/train-fashion-mnist.log" |
    grep -E "^training on|^epoch |^final|^petra-train: " | tail -n 8
}

# Nsight Compute's kernel times over a few steps of revbackprop and of backprop (RevNet18 width 64,
# batch 128, petra's kernels), summed per kernel name: where a training step's device time goes.
# Launches are replayed one at a time (--clock-control none: the card's clocks as found;
# --cache-control none: the L2 as the previous kernel left it, as in a real step; run 4 flushed it
# before every launch, which slowed the small kernels most), so only the durations count.
group_profile() {
  local ncu method
  ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda*/bin/ncu 2> /dev/null | head -n 1)
  if [ -z "$ncu" ]; then
    echo "== ncu not found: profile skipped"
    return 0
  fi
  for method in ${PROFILE_METHODS:-revbackprop backprop}; do
    STEP_LOG="$out/ncu-$method.csv" step "ncu: kernel times of $method steps" 90 "$ncu" --clock-control none \
      --cache-control none --metrics gpu__time_duration.sum --launch-skip 2000 --launch-count 1200 --csv \
      --print-summary per-kernel "$bin/petra-train" --dataset synthetic --synthetic-size 2560 --model revnet18 \
      --width 64 --batch-size 128 --epochs 1 --no-augment --threads 8 --method "$method" --devices cuda:0
    ncu_summary "$out/ncu-$method.csv"
  done
}

# Why the convolution kernels run at the rate they do: Nsight Compute's warp-state, scheduler and
# occupancy sections on a few launches of petra's FP32 and TF32 implicit GEMMs inside a revbackprop
# run (after 300 convolutions: past the first steps), the stall reasons of each (ncu-stalls-*.txt).
group_stalls() {
  local ncu pattern math
  ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda*/bin/ncu 2> /dev/null | head -n 1)
  [ -n "$ncu" ] || { echo "== ncu not found: stalls skipped"; return 0; }
  for math in fp32 tf32; do
    pattern='implicit_gemm<'
    [ "$math" = tf32 ] && pattern='implicit_gemm_tf32<'
    STEP_LOG="$out/ncu-stalls-$math.txt" step "ncu: stall reasons of the $math convolution" 90 "$ncu" \
      --clock-control none --kernel-name-base demangled --kernel-name "regex:$pattern" --launch-skip 300 \
      --launch-count 3 --section SpeedOfLight --section Occupancy --section LaunchStats --section SchedulerStats \
      --metrics 'regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio' \
      "$bin/petra-train" --dataset synthetic --synthetic-size 1280 --model revnet18 --width 64 \
      --batch-size 128 --epochs 1 --no-augment --threads 8 --method revbackprop --devices cuda:0 --conv-math "$math"
    [ -s "$out/ncu-stalls-$math.txt" ] && grep -E "implicit_gemm|stalled_[a-z_]+_per_issue_active\.ratio +[^ ]+ +[0-9.]*[1-9]|No Eligible|Issued Warp|Active Warps Per|Achieved Occupancy|Registers Per|Block Limit (Reg|Shared)|Compute \(SM\) Throughput|Memory Throughput|Duration" \
      "$out/ncu-stalls-$math.txt" | sed -E 's/ +/ /g; s/smsp__average_warps_issue_stalled_//; s/_per_issue_active.ratio//;
        s/petra::kernels::cuda::(\(anonymous namespace\)::|conv2d_tiling::)?//g; s/\(int\)//g' | cut -c1-160 | head -n 75
  done
}

# The machine code the convolution kernels run, instruction by instruction, with how often each
# ran and its warps' stall samples: what to shorten in the K loop (this machine has no disassembler;
# ptxas's own is not shipped, so the profile is where the code is read). One launch of each kernel
# past the first steps of a revbackprop run; then the source page as CSV (sass-<math>-<pass>.csv).
group_sass() {
  local ncu math pass pattern dis
  dis=$(command -v cuobjdump || ls /usr/local/cuda*/bin/cuobjdump 2> /dev/null | head -n 1)
  if [ -n "$dis" ] && [ -n "${SASS_CUOBJDUMP:-}" ]; then  # the whole library's SASS: ~90 MB, 20 s
    STEP_LOG="$out/sass-cuobjdump.txt" step "cuobjdump: the convolution kernels' SASS" 30 "$dis" -sass \
      "$bin/libpetra-core.so.0.1" || true
  fi
  ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda*/bin/ncu 2> /dev/null | head -n 1)
  [ -n "$ncu" ] || { echo "== ncu not found: sass skipped"; return 0; }
  for math in ${SASS_MATHS:-tf32 fp32}; do
    for pass in ${SASS_PASSES:-ForwardProblem WeightProblem}; do
      pattern="implicit_gemm<.*$pass"
      [ "$math" = tf32 ] && pattern="implicit_gemm_tf32<.*$pass"
      STEP_LOG="$out/sass-$math-$pass.log" step "ncu: source counters of the $math $pass kernel" 60 "$ncu" \
        --clock-control none --kernel-name-base demangled --kernel-name "regex:$pattern" --launch-skip 40 \
        --launch-count 1 --section SourceCounters --section WarpStateStats -f -o "$out/sass-$math-$pass" \
        "$bin/petra-train" --dataset synthetic --synthetic-size 1280 --model revnet18 --width 64 \
        --batch-size 128 --epochs 1 --no-augment --threads 8 --method revbackprop --devices cuda:0 --conv-math "$math"
      [ -s "$out/sass-$math-$pass.ncu-rep" ] || continue
      "$ncu" -i "$out/sass-$math-$pass.ncu-rep" --page source --csv --print-source sass > "$out/sass-$math-$pass.csv" 2>&1 ||
        "$ncu" -i "$out/sass-$math-$pass.ncu-rep" --page source --csv > "$out/sass-$math-$pass.csv" 2>&1
      echo "== sass-$math-$pass.csv: $(wc -l < "$out/sass-$math-$pass.csv") lines; $(head -c 300 "$out/sass-$math-$pass.csv" | head -n 2 | tr '\n' ' ')"
      rm -f "$out/sass-$math-$pass.ncu-rep"
    done
  done
}

# The per-kernel sums of one ncu CSV, the largest first.
ncu_summary() {
  [ -s "$1" ] && python3 - "$1" <<'PY'
import csv, sys
rows = [r for r in csv.reader(l for l in open(sys.argv[1], errors="replace") if l.startswith('"'))]
if not rows:
    sys.exit("== ncu: no CSV in its output")
head, body = rows[0], rows[1:]
def col(*names):
    for n in names:
        if n in head:
            return head.index(n)
    return None
name, calls, avg, unit = col("Kernel Name", "Function Name"), col("Invocations"), col("Average"), col("Metric Unit")
if None in (name, calls, avg):
    sys.exit(f"== ncu: unexpected columns {head}")
scale = {"nsecond": 1e-6, "usecond": 1e-3, "msecond": 1.0, "second": 1e3}
totals = {}
for r in body:
    try:
        ms = float(r[avg].replace(",", "")) * scale.get(r[unit] if unit is not None else "nsecond", 1e-6) * int(r[calls])
    except (ValueError, IndexError):
        continue
    key = r[name].split("(")[0][:90]
    totals[key] = totals.get(key, (0.0, 0))
    totals[key] = (totals[key][0] + ms, totals[key][1] + int(r[calls]))
whole = sum(t for t, _ in totals.values())
print(f"== ncu: {sum(c for _, c in totals.values())} launches, {whole:.1f} ms of kernels; the largest:")
for key, (t, c) in sorted(totals.items(), key=lambda kv: -kv[1][0])[:18]:
    print(f"   {t:8.2f} ms {100 * t / whole:5.1f}%  {c:5d} x  {key}")
PY
}

# How busy each stream is when PETRA's two stages share the GPU (two workers, `--devices
# cuda:0,cuda:0`), and how busy the one stream of backprop is (the GPU's idle share: the time the
# host leaves it waiting): every kernel, copy and memset with its stream and its start and end on
# the GPU's clock, from petra's CUPTI tracer (benchmarks/kernel_trace.cpp, loaded by the driver
# through CUDA_INJECTION64_PATH) or else Nsight Systems (the H200 images have only Nsight
# Compute's copy of the nsys CLI, which could not import its own trace on 2026-12-04); the script
# merges each stream's intervals over the steady steps (from 30% to 90% of the trace: past the
# warm-up, before the drain and the test-set evaluation) and prints each stream's busy share of
# that window, the share where both run at once, and where neither does (scripts/stream_busy.py).
trace_busy() {
  local name=$1 work=/tmp/petra-trace/$1 trace
  shift
  rm -rf "$work" && mkdir -p "$work"
  local run=("$bin/petra-train" --dataset synthetic --synthetic-size 7680 --model revnet18 --width 64
             --batch-size 128 --epochs 1 --no-augment --threads 8 "$@")
  if [ -f "$bin/libpetra-kernel-trace.so" ]; then
    STEP_LOG="$out/trace-$name.log" step "CUPTI trace: $name" 90 env CUDA_INJECTION64_PATH="$bin/libpetra-kernel-trace.so" \
      PETRA_KERNEL_TRACE="$work/trace.csv" \
      LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}:/usr/local/cuda/lib64:/usr/local/cuda/targets/x86_64-linux/lib:/usr/local/cuda/extras/CUPTI/lib64" \
      "${run[@]}"
    trace=$work/trace.csv
    grep -h 'petra-kernel-trace' "$out/trace-$name.log" | head -n 3
  else
    local nsys
    nsys=$(command -v nsys || ls /opt/nvidia/nsight-systems/*/bin/nsys /usr/local/cuda*/bin/nsys \
      /opt/nvidia/nsight-compute/*/host/target-linux-x64/nsys 2> /dev/null | head -n 1)
    [ -n "$nsys" ] || { echo "== no CUPTI tracer in the bundle and no nsys: the streams' busy shares are not measured"; return 0; }
    STEP_LOG="$out/nsys-$name.log" step "nsys: $name" 90 "$nsys" profile --trace cuda --sample none \
      --cpuctxsw none --force-overwrite true --output "$work/trace" "${run[@]}"
    [ -f "$work/trace.nsys-rep" ] || { echo "== nsys: no report (see nsys-$name.log)"; return 0; }
    STEP_LOG="$out/nsys-stats-$name.log" step "nsys: $name, the GPU trace as CSV" 60 "$nsys" stats \
      --report cuda_gpu_trace --format csv --force-export true --output "$work/csv" "$work/trace.nsys-rep"
    trace=$(ls "$work"/csv*cuda_gpu_trace*.csv 2> /dev/null | head -n 1)
  fi
  [ -s "$trace" ] || { echo "== $name: no trace"; return 0; }
  python3 "$bundle/stream_busy.py" "$trace" "$name" | tee "$out/streams-$name.txt"
}

group_streams() {
  trace_busy petra-2-streams --method petra --devices cuda:0,cuda:0
  trace_busy backprop --method backprop --devices cuda:0
}

# compute-sanitizer on the cuda suite: memcheck on all of it, racecheck (shared-memory races) and
# synccheck (barriers) on the backend-ops case, which runs every op's kernels, the shared-memory
# ones (convolution tiles, reductions, batch norm's trees) included. Exit 9: errors found. No leak
# check: the caching allocator keeps its blocks (and cuBLAS its handles) until the process ends, by
# design, which --leak-check full reports as 117 leaks (2026-12-04). --report-api-errors no: the
# suite asks for an impossible allocation on purpose (to check that it becomes OutOfMemoryError).
group_sanitize() {
  for dir in /usr/local/cuda/bin /usr/local/cuda-13*/bin; do
    command -v compute-sanitizer > /dev/null || { [ -x "$dir/compute-sanitizer" ] && export PATH="$PATH:$dir"; }
  done
  if ! command -v compute-sanitizer > /dev/null; then
    echo "== compute-sanitizer is not on the PATH: skipped"
    return 0
  fi
  local sanitizer=(compute-sanitizer --report-api-errors no --error-exitcode 9)
  step "test-cuda under compute-sanitizer memcheck" 60 "${sanitizer[@]}" --tool memcheck "$bin/test-cuda"
  step "backend ops under compute-sanitizer racecheck" 60 "${sanitizer[@]}" --tool racecheck \
    "$bin/test-cuda" --test-case='backend ops*'
  step "backend ops under compute-sanitizer synccheck" 45 "${sanitizer[@]}" --tool synccheck \
    "$bin/test-cuda" --test-case='backend ops*'
  # the batch-norm case runs the one pass: thread-block clusters, their barriers and peers' memory
  step "batch norm (the one pass's clusters) under compute-sanitizer racecheck" 45 "${sanitizer[@]}" --tool racecheck \
    "$bin/test-cuda" --test-case="cuda: petra's batch norm*"
  step "batch norm (the one pass's clusters) under compute-sanitizer synccheck" 45 "${sanitizer[@]}" --tool synccheck \
    "$bin/test-cuda" --test-case="cuda: petra's batch norm*"
}

# --mpi on the GPU (docs/distributed.md, "GPUs and NCCL"). NCCL refuses two ranks of a communicator
# on one GPU, so one GPU allows NCCL with one process only: test-mpi's NCCL case (communicators
# bootstrapped through MPI, an all-reduce) and petra-train --transport nccl on 1 process; then 2
# processes on the one GPU with --transport mpi (payloads through host copies), and --transport
# nccl on 2 processes, which must exit 6 naming the shared GPU. Needs Open MPI's mpirun there.
group_mpi() {
  if ! command -v mpirun > /dev/null || [ ! -x "$bin/test-mpi" ]; then
    echo "== --mpi on the GPU: SKIPPED (no mpirun on this machine, or no test-mpi in the bundle)"
    return 0
  fi
  mpi=(mpirun --allow-run-as-root --oversubscribe)
  step "test-mpi on 1 process (its NCCL case on cuda:0)" 40 "${mpi[@]}" -np 1 "$bin/test-mpi"
  small=(--method petra --dataset synthetic --synthetic-size 2560 --model revnet18 --width 16 --batch-size 128
         --epochs 1 --no-augment --threads 4)
  mpi_train() {
    local name=$1 np=$2
    shift 2
    STEP_LOG="$out/train-$name.log" step "petra-train $name" 60 "${mpi[@]}" -np "$np" "$bin/petra-train" \
      "${small[@]}" --log-json "$out/train-$name.jsonl" "$@"
    [ -f "$out/train-$name.log" ] && tr '\r' '\n' < "$out/train-$name.log" |
      grep -E "^training on|^--mpi|^epoch |^final|petra-train: |Duplicate|local ranks" | tail -n 6
  }
  mpi_train mpi-1-nccl 1 --mpi --devices cuda:0 --transport nccl
  mpi_train mpi-2-host-copies 2 --mpi --devices cuda:0 --transport mpi
  same_numbers "--mpi, 1 process vs 2 processes sharing the GPU (host copies)" "$out/train-mpi-1-nccl.jsonl" \
    "$out/train-mpi-2-host-copies.jsonl"
  mpi_train mpi-2-nccl-shared-gpu 2 --mpi --devices cuda:0 --transport nccl  # expected: exit 6
  # Two GPUs or more: what one GPU cannot run, NCCL messages between processes. test-mpi's NCCL case
  # then also sends payloads both ways between ranks 0 and 1; the training run must end at the bits
  # of the one-process run above (the same bits as the host-copy run).
  local gpus
  gpus=$(nvidia-smi -L 2> /dev/null | grep -c '^GPU ')
  if [ "${gpus:-0}" -ge 2 ]; then
    step "test-mpi on 2 processes, one GPU each (NCCL payloads between them)" 40 "${mpi[@]}" -np 2 "$bin/test-mpi"
    mpi_train mpi-2-nccl 2 --mpi --devices cuda:0,cuda:1 --transport nccl
    same_numbers "--mpi, 1 process vs 2 processes on 2 GPUs over NCCL" "$out/train-mpi-1-nccl.jsonl" \
      "$out/train-mpi-2-nccl.jsonl"
  else
    echo "== NCCL between processes: SKIPPED (${gpus:-0} GPU(s); NCCL needs one per process)"
  fi
}

# PETRA's pipeline on the GPU machine's idle CPUs (measured on 2026-11-30; not in the default list).
group_pipeline() {
  step "bench-pipeline (CPU: 2 workers x 1 thread on an otherwise idle host)" 40 \
    env OMP_WAIT_POLICY=passive "$bin/bench-pipeline" --json "$out/bench-pipeline.json"
}

groups=${ONLY:-tests training bench sanitize profile streams pytorch fashion mpi}
echo "== groups: $groups"
# The GPU's utilisation once a second (nvidia-smi dmon: the share of time a kernel ran, and memory
# traffic), with the time of day, to set beside the steps' start times above.
dmon_pid=
if command -v nvidia-smi > /dev/null; then
  nvidia-smi dmon -s u -o T > "$out/dmon.log" 2>&1 &
  dmon_pid=$!
fi
for group in $groups; do
  if declare -F "group_$group" > /dev/null; then
    "group_$group"
  else
    echo "== unknown group '$group' (tests training bench sanitize profile stalls streams pytorch fashion mpi pipeline)"
  fi
done

[ -n "$dmon_pid" ] && kill "$dmon_pid" 2> /dev/null
echo "== done in ${SECONDS} s (budget ${budget} s)"
