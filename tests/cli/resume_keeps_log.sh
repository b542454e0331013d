#!/usr/bin/env bash
# tests/cli/resume_keeps_log.sh PETRA_TRAIN WORKDIR: a resumed petra-train keeps the --log-json
# records of the epochs before its checkpoint. Trains 2 epochs with checkpoints, resumes to 3,
# and checks that the log then holds epochs 1, 2, 3 and one summary, in that order.
set -euo pipefail
train=$(realpath "$1")
dir=$2/resume-keeps-log
rm -rf "$dir" && mkdir -p "$dir" && cd "$dir"
args=(--method backprop --dataset synthetic --synthetic-size 128 --batch-size 32 --width 4 --threads 1
      --checkpoint-dir ck --log-json log.jsonl)
"$train" "${args[@]}" --epochs 2 > first.txt
"$train" "${args[@]}" --epochs 3 --resume > second.txt
grep -q "resumed from ck/epoch-000002 at epoch 3" second.txt
keys=$(python3 -c 'import json,sys; print(" ".join(str(json.loads(l).get("epoch","summary")) for l in open("log.jsonl")))')
if [ "$keys" != "1 2 3 summary" ]; then
  echo "resume_keeps_log: log.jsonl holds records [$keys], expected [1 2 3 summary]" >&2
  exit 1
fi
echo "log.jsonl after the resume: $keys"
