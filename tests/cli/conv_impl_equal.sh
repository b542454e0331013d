#!/usr/bin/env bash
# tests/cli/conv_impl_equal.sh PETRA_TRAIN WORKDIR: a short training run on cuda:0 with
# --conv-impl cudnn gives the losses of the same run with --conv-impl petra, within float rounding.
# RevNet18 (width 8, reversible: the backward reconstructs every block's input, so both the forward
# and the inverse go through the chosen convolution and batch norm), 8 steps of SGD on synthetic
# CIFAR-shaped data, then the test set. The two implementations add in different orders, so the runs
# differ in the last bits of every op and the difference grows a little with each step: the bound is
# a relative 1e-3 on the mean training loss and the test loss. Skipped (exit 77) without a GPU or in a
# build without cuDNN.
set -uo pipefail
train=$(realpath "$1")
dir=$2/conv-impl-equal
rm -rf "$dir" && mkdir -p "$dir" && cd "$dir" || exit 1
common=(--dataset synthetic --synthetic-size 256 --model revnet18 --width 8 --batch-size 32 --epochs 1 --max-steps 8
        --no-augment --threads 2 --method revbackprop --devices cuda:0 --lr 0.05)
for impl in petra cudnn; do
  "$train" "${common[@]}" --conv-impl "$impl" --log-json "$impl.jsonl" > "$impl.log" 2>&1
  rc=$?
  if [ "$rc" -eq 6 ] && grep -q -- "--devices cuda:0" "$impl.log"; then
    echo "SKIP: no GPU here: $(grep -- "--devices cuda:0" "$impl.log" | head -n 1)"; exit 77
  fi
  if [ "$rc" -eq 2 ] && grep -q "built without cuDNN" "$impl.log"; then
    echo "SKIP: this petra was built without cuDNN"; exit 77
  fi
  [ "$rc" -eq 0 ] || { echo "FAIL: --conv-impl $impl exited $rc:"; cat "$impl.log"; exit 1; }
  grep -q "convolutions and batch norms: $impl" "$impl.log" ||
    { echo "FAIL: --conv-impl $impl: the log does not say which implementation ran:"; cat "$impl.log"; exit 1; }
done
python3 - petra.jsonl cudnn.jsonl <<'PY'
import json, sys
def first_epoch(path):
    return json.loads(open(path).readline())
a, b = first_epoch(sys.argv[1]), first_epoch(sys.argv[2])
status = 0
for key in ("train_loss", "test_loss"):
    diff = abs(a[key] - b[key]) / max(abs(a[key]), 1e-30)
    verdict = "ok" if diff <= 1e-3 else "FAIL"
    status |= verdict == "FAIL"
    print(f"{verdict}: {key}: petra {a[key]:.7f}, cudnn {b[key]:.7f}, relative difference {diff:.2e} (bound 1e-3)")
print(f"images/s: petra {a['images_per_second']:.0f}, cudnn {b['images_per_second']:.0f}")
sys.exit(status)
PY
