#!/usr/bin/env bash
# tests/cli/compare_pytorch_evaluate.sh PETRA_TRAIN COMPARE_PY WORKDIR: the PyTorch twin of the
# network, loaded with petra's saved parameters, reproduces petra-train's test loss and accuracy
# (compare_pytorch.py --mode evaluate, BN running statistics). Skipped (77) where Debian's
# python3-torch is not installed.
set -euo pipefail
train=$(realpath "$1")
compare=$(realpath "$2")
dir=$3/compare-pytorch-evaluate
if ! /usr/bin/python3 -c "import torch, numpy" 2> /dev/null; then
  echo "no PyTorch for /usr/bin/python3: skipped"
  exit 77
fi
rm -rf "$dir" && mkdir -p "$dir" && cd "$dir"
"$train" --method backprop --width 4 --epochs 1 --max-steps 30 --threads 1 \
  --save-params params --log-json log.jsonl > train.txt
python3 "$compare" --mode evaluate --skip-checks --width 4 --params params --json > evaluate.txt
python3 - <<'PY'
import json
petra = [json.loads(l) for l in open("log.jsonl") if '"epoch"' in l][-1]
text = open("evaluate.txt").read()
report = json.loads(text[text.index("{\n"):])
torch = report["running_statistics"]
print(f"petra: accuracy {petra['test_accuracy']:.4f} loss {petra['test_loss']:.6f}; "
      f"torch: accuracy {torch['test_accuracy']:.4f} loss {torch['test_loss']:.6f}; "
      f"batch statistics: accuracy {report['batch_statistics']['test_accuracy']:.4f}")
assert abs(petra["test_accuracy"] - torch["test_accuracy"]) <= 2e-4, "test accuracy differs"
assert abs(petra["test_loss"] - torch["test_loss"]) <= 1e-4 * max(1.0, petra["test_loss"]), "test loss differs"
PY
