#!/usr/bin/env bash
# tests/cli/emulated_gpu_train.sh PETRA_TRAIN_EMULATED WORKDIR: petra-train on the emulated GPUs
# (petra-train-emulated: petra-train's own objects linked with the emulated device,
# tests/emulation/emulated_device.hpp), with the command lines of scripts/gpu-check.sh shrunk to
# what the emulation runs in seconds: the same flags (synthetic CIFAR-shaped data, --no-augment,
# --report-memory, --log-json) for backprop, revbackprop and PETRA on cuda:0, PETRA on two streams
# of cuda:0 and on cuda:0 + cuda:1. Each must exit 0, say where it trained, print images/s and the
# peak memory on the GPU, the per-stage memory table, and a JSON log with the epoch's numbers.
set -euo pipefail
train=$(realpath "$1")
dir=$2/emulated-gpu-train
rm -rf "$dir" && mkdir -p "$dir" && cd "$dir"
common=(--dataset synthetic --synthetic-size 8 --model revnet18 --width 2 --batch-size 4 --epochs 1 --no-augment
        --threads 1 --report-memory --stages blocks)
run() {
  local name=$1
  shift
  if ! "$train" "${common[@]}" --log-json "$name.jsonl" "$@" > "$name.log" 2>&1; then
    echo "FAIL: $name exited non-zero:" && cat "$name.log" && return 1
  fi
  for pattern in "^training on cuda:0" "^epoch 1/1: .* img/s" "peak memory on cuda:0.*: [0-9.]* MB" "peak MB per stage"; do
    grep -q -- "$pattern" "$name.log" || { echo "FAIL: $name: no line matching '$pattern':"; cat "$name.log"; return 1; }
  done
  python3 -c 'import json,sys; r=json.loads(open(sys.argv[1]).readline()); assert r["images_per_second"] > 0, r' \
    "$name.jsonl"
  echo "ok: $name: $(grep -E '^epoch 1/1' "$name.log" | cut -c1-120)"
}
run backprop --method backprop --devices cuda:0
run revbackprop --method revbackprop --devices cuda:0
run petra --method petra --devices cuda:0
run petra-2-streams --method petra --devices cuda:0,cuda:0
run petra-2-gpus --method petra --devices cuda:0,cuda:1 --placement 0,0,0,0,0,1,1,1,1,1
grep -q "peak memory on cuda:0 + cuda:1" petra-2-gpus.log || { echo "FAIL: petra-2-gpus: memory not of both GPUs"; exit 1; }
# Batch norm in one pass (--batchnorm-one-pass: each channel in a thread-block cluster's shared memory
# under the emulation's small bounds): the banner says so, and the epoch's loss is revbackprop's up
# to the rounding of the statistics' other order of additions.
run revbackprop-one-pass --method revbackprop --devices cuda:0 --batchnorm-one-pass
grep -q "one-pass batch norm" revbackprop-one-pass.log || { echo "FAIL: the banner does not name the one pass"; exit 1; }
python3 - revbackprop.jsonl revbackprop-one-pass.jsonl <<'PY'
import json, sys
two, one = (json.loads(open(path).readline()) for path in sys.argv[1:])
assert abs(one["train_loss"] - two["train_loss"]) <= 1e-3 * abs(two["train_loss"]), (one["train_loss"], two["train_loss"])
print(f"ok: one-pass batch norm: train loss {one['train_loss']:.6f} against {two['train_loss']:.6f}")
PY
# The forward and backward data in Winograd's domain (--conv-forward winograd: every 3x3 stride-1
# layer's, under the option): the banner says so, and the epoch's loss is backprop's up to the
# transforms' roundings.
run backprop-winograd-forward --method backprop --devices cuda:0 --conv-forward winograd
grep -q "Winograd forward and backward data" backprop-winograd-forward.log ||
  { echo "FAIL: the banner does not name the Winograd forward"; exit 1; }
python3 - backprop.jsonl backprop-winograd-forward.jsonl <<'PY'
import json, sys
direct, winograd = (json.loads(open(path).readline()) for path in sys.argv[1:])
assert abs(winograd["train_loss"] - direct["train_loss"]) <= 1e-3 * abs(direct["train_loss"]), \
    (winograd["train_loss"], direct["train_loss"])
assert winograd["train_loss"] != direct["train_loss"], "the same loss to the last bit: did Winograd run?"
print(f"ok: Winograd forward: train loss {winograd['train_loss']:.6f} against {direct['train_loss']:.6f}")
PY
# Split-K for the forward and backward data (--conv-split-k): the banner says so; no layer of this
# small model has a 128 x 128 tile's rows and columns to split (more than 64 each), so the epoch is
# backprop's to the last bit (the split itself: tests/emulation/test_emulated_conv2d.cpp).
run backprop-split-k --method backprop --devices cuda:0 --conv-split-k
grep -q "split-K forward and backward data" backprop-split-k.log || { echo "FAIL: the banner does not name split-K"; exit 1; }
python3 - backprop.jsonl backprop-split-k.jsonl <<'PY'
import json, sys
plain, split = (json.loads(open(path).readline()) for path in sys.argv[1:])
assert split["train_loss"] == plain["train_loss"], (split["train_loss"], plain["train_loss"])
summary = json.loads(open(sys.argv[2]).read().splitlines()[-1])["summary"]
assert summary["conv_split_k"] is True, summary
print(f"ok: split-K: train loss {split['train_loss']:.6f}, backprop's")
PY
# No such GPU: exit 6 as on any machine.
set +e
"$train" "${common[@]}" --method petra --devices cuda:2 > no-such-gpu.log 2>&1
rc=$?
set -e
[ "$rc" -eq 6 ] && grep -q -- "--devices cuda:2: no such GPU" no-such-gpu.log ||
  { echo "FAIL: --devices cuda:2 gave exit $rc:"; cat no-such-gpu.log; exit 1; }
echo "ok: --devices cuda:2: exit 6"
# --conv-impl cudnn: the emulated GPU has no cuDNN (tests/emulation/emulated_gpu_libraries.cpp), so the
# first convolution is refused with exit 6 naming cuDNN, never run with petra's kernels instead.
set +e
"$train" "${common[@]}" --method backprop --devices cuda:0 --conv-impl cudnn > conv-impl-cudnn.log 2>&1
rc=$?
set -e
if [ "$rc" -eq 6 ] && grep -q "cuDNN cannot run on the emulated GPU" conv-impl-cudnn.log; then
  echo "ok: --conv-impl cudnn on the emulated GPU: exit 6"
elif [ "$rc" -eq 2 ] && grep -q "built without cuDNN" conv-impl-cudnn.log; then
  echo "ok: --conv-impl cudnn: exit 2, this build has no cuDNN"
else
  echo "FAIL: --conv-impl cudnn on the emulated GPU gave exit $rc:"; cat conv-impl-cudnn.log; exit 1
fi
