#!/usr/bin/env bash
# tests/cli/device_errors.sh PETRA_TRAIN: petra-train never trains somewhere else than asked.
# --devices cuda:7 (no such GPU here) must exit 6 (device error) with a message naming the device,
# for a synchronous and a pipelined method, before any training step. --devices cuda:0 does the same
# on a machine without a GPU; where there is one, it trains there (exit 0, "training on cuda:0").
# --conv-impl cudnn is refused (exit 2, naming --conv-impl) wherever a stage would run on the CPU (no
# --devices, cpu:N, cpu + cuda) and in a build without cuDNN; with --devices cuda:0 it gets past the
# flag and meets the device check (exit 6 here without a GPU). An unknown --conv-impl is exit 2.
# --cudnn-algorithms fastest without --conv-impl cudnn, or an unknown choice, is exit 2.
set -uo pipefail
train=$1
common=(--dataset synthetic --synthetic-size 64 --batch-size 32 --width 4 --threads 1 --epochs 1 --max-steps 2)
status=0
for method in backprop petra; do
  for device in cuda:7 cuda:0; do
    out=$("$train" "${common[@]}" --method "$method" --devices "$device" 2>&1)
    rc=$?
    if [ "$device" = cuda:0 ] && [ "$rc" -eq 0 ] && grep -q -- "training on cuda:0" <<<"$out"; then
      echo "ok: --method $method --devices cuda:0: a GPU is here, trained on it"
    elif [ "$rc" -ne 6 ] || ! grep -q -- "--devices $device" <<<"$out"; then
      echo "FAIL: --method $method --devices $device: exit $rc (expected 6), output: $out"
      status=1
    else
      echo "ok: --method $method --devices $device: exit 6: $(grep -- "--devices $device" <<<"$out" | head -n 1)"
    fi
  done
done

# expect_exit CODE PATTERN ARGS...: petra-train ARGS exits CODE and prints a line matching PATTERN.
expect_exit() {
  local code=$1 pattern=$2
  shift 2
  local out rc
  out=$("$train" "${common[@]}" "$@" 2>&1)
  rc=$?
  if [ "$rc" -eq "$code" ] && grep -q -- "$pattern" <<<"$out"; then
    echo "ok: $*: exit $rc: $(grep -- "$pattern" <<<"$out" | head -n 1)"
  else
    echo "FAIL: $*: exit $rc (expected $code and a line matching '$pattern'), output: $out"
    status=1
  fi
}
expect_exit 2 "--conv-impl" --method backprop --conv-impl cudnn
expect_exit 2 "--conv-impl" --method backprop --conv-impl cudnn --devices cpu:0
expect_exit 2 "--conv-impl" --method petra --conv-impl cudnn
expect_exit 2 "--conv-impl" --method petra --conv-impl cudnn --devices cpu:0,cuda:0
expect_exit 2 "--conv-impl" --method backprop --conv-impl tensorflow
# --conv-math tf32 is the GPUs' (the CPU kernels are FP32), and only fp32 and tf32 exist.
expect_exit 2 "--conv-math tf32 runs on CUDA devices only" --method backprop --conv-math tf32
expect_exit 2 "--conv-math tf32 runs on CUDA devices only" --method petra --conv-math tf32 --devices cpu:0,cuda:0
expect_exit 2 "--conv-math" --method backprop --conv-math bf16
expect_exit 0 "^final" --method backprop --conv-math fp32
# --conv-weight winograd is petra's CUDA weight gradient: GPUs only; direct or winograd.
expect_exit 2 "--conv-weight winograd runs on CUDA devices only" --method backprop --conv-weight winograd
expect_exit 2 "--conv-weight" --method backprop --conv-weight fft
# Not with cuDNN's convolutions (which choose their own algorithms); a build without cuDNN refuses
# --conv-impl cudnn first.
expect_exit 2 "--conv-weight winograd: petra's convolution kernels only\|--conv-impl cudnn: this petra was built without cuDNN" \
  --method backprop --devices cuda:0 --conv-impl cudnn --conv-weight winograd
expect_exit 0 "^final" --method backprop --conv-weight direct
# --conv-forward winograd (or auto) is petra's CUDA forward and backward data: GPUs and petra's kernels only.
expect_exit 2 "--conv-forward winograd runs on CUDA devices only" --method backprop --conv-forward winograd
expect_exit 2 "--conv-forward auto runs on CUDA devices only" --method backprop --conv-forward auto
expect_exit 2 "--conv-forward" --method backprop --conv-forward fft
expect_exit 2 "--conv-forward winograd: petra's convolution kernels only\|--conv-impl cudnn: this petra was built without cuDNN" \
  --method backprop --devices cuda:0 --conv-impl cudnn --conv-forward winograd
# --batchnorm-one-pass is petra's CUDA batch norm: GPUs and petra's kernels only.
expect_exit 2 "--batchnorm-one-pass runs on CUDA devices only" --method backprop --batchnorm-one-pass
expect_exit 2 "--batchnorm-one-pass: petra's batch norm kernels only\|--conv-impl cudnn: this petra was built without cuDNN" \
  --method backprop --devices cuda:0 --conv-impl cudnn --batchnorm-one-pass
# --conv-split-k is petra's CUDA forward and backward data: GPUs and petra's kernels only.
expect_exit 2 "--conv-split-k runs on CUDA devices only" --method backprop --conv-split-k
expect_exit 2 "--conv-split-k: petra's convolution kernels only\|--conv-impl cudnn: this petra was built without cuDNN" \
  --method backprop --devices cuda:0 --conv-impl cudnn --conv-split-k
# --cudnn-algorithms fastest times cuDNN's algorithms: it needs --conv-impl cudnn (with petra's
# kernels it would change nothing); deterministic (the default) passes anywhere.
expect_exit 2 "needs --conv-impl cudnn" --method backprop --cudnn-algorithms fastest
expect_exit 2 "--cudnn-algorithms" --method backprop --cudnn-algorithms fast
expect_exit 0 "^final" --method backprop --cudnn-algorithms deterministic
# The default, and petra named explicitly, train on the CPU as ever.
expect_exit 0 "^final" --method backprop --conv-impl petra
# cuda:0 passes the flag's check; without a GPU the device check answers (exit 6), and in a build
# without cuDNN the flag's (exit 2). With a GPU and cuDNN it trains.
out=$("$train" "${common[@]}" --method backprop --conv-impl cudnn --devices cuda:0 2>&1)
rc=$?
if [ "$rc" -eq 0 ] && grep -q "convolutions and batch norms: cudnn" <<<"$out"; then
  echo "ok: --conv-impl cudnn --devices cuda:0: a GPU with cuDNN is here, trained with cuDNN"
elif [ "$rc" -eq 6 ] && grep -q -- "--devices cuda:0" <<<"$out"; then
  echo "ok: --conv-impl cudnn --devices cuda:0: exit 6: $(grep -- "--devices cuda:0" <<<"$out" | head -n 1)"
elif [ "$rc" -eq 2 ] && grep -q "built without cuDNN" <<<"$out"; then
  echo "ok: --conv-impl cudnn --devices cuda:0: exit 2: this build has no cuDNN"
else
  echo "FAIL: --conv-impl cudnn --devices cuda:0: exit $rc, output: $out"
  status=1
fi
exit $status
