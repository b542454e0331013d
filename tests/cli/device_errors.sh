#!/usr/bin/env bash
# tests/cli/device_errors.sh PETRA_TRAIN: petra-train never trains somewhere else than asked.
# --devices cuda:7 (no such GPU here) must exit 6 (device error) with a message naming the device,
# for a synchronous and a pipelined method, before any training step. --devices cuda:0 does the same
# on a machine without a GPU; where there is one, it trains there (exit 0, "training on cuda:0").
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
exit $status
