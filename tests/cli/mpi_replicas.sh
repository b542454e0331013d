#!/usr/bin/env bash
# tests/cli/mpi_replicas.sh PETRA_TRAIN MPIRUN WORKDIR: data-parallel replicas (--replicas).
# 1. Backprop on 2 processes as 2 replicas (replica r trains mini-batches r, r + 2, ...; gradients
#    averaged before each update) ends with the parameters of one process averaging the same pairs
#    of mini-batches with --accumulation 2 (batch norm sees the same 32 images per mini-batch either
#    way), within float tolerance; the running statistics differ by design and are not compared.
# 2. PETRA as 2 replicas x 2 stage groups (4 processes) equals 2 replicas of the whole pipeline
#    (2 processes) bit for bit, with --accumulation 2 and an odd number of mini-batches per epoch
#    so that accumulation windows are open at the checkpoints; and resumed from its epoch-2
#    checkpoint it ends as the uninterrupted run, bit for bit.
set -euo pipefail
train=$(realpath "$1")
mpirun=$2
dir=$3/mpi-replicas
rm -rf "$dir" && mkdir -p "$dir" && cd "$dir"
run() { OMP_NUM_THREADS=1 "$mpirun" --allow-run-as-root --oversubscribe -np "$@"; }
common=(--dataset synthetic --batch-size 32 --width 4 --threads 1 --stages blocks)

sync=("${common[@]}" --method backprop --synthetic-size 256 --epochs 2)
"$train" "${sync[@]}" --accumulation 2 --save-params one > one.txt
run 2 "$train" "${sync[@]}" --mpi --replicas 2 --save-params two > two.txt
python3 - <<'PY'
import ast, os, struct
def load(path):  # a little-endian float32 or float64 .npy, as petra writes it
    data = open(path, "rb").read()
    n = struct.unpack("<H", data[8:10])[0]
    header = ast.literal_eval(data[10:10 + n].decode())
    code = {"<f4": "f", "<f8": "d"}[header["descr"]]
    count = (len(data) - 10 - n) // struct.calcsize(code)
    return struct.unpack(f"<{count}{code}", data[10 + n:])
worst, exact, n = 0.0, 0, 0
for name in sorted(os.listdir("one")):
    if "running" in name or "num_batches" in name:
        continue  # batch norm's running statistics: per replica by design
    a, b = load(os.path.join("one", name)), load(os.path.join("two", name))
    assert len(a) == len(b), name
    scale = max(max(abs(x) for x in a), 1e-3)
    worst = max(worst, max(abs(x - y) for x, y in zip(a, b)) / scale)
    exact += int(a == b)
    n += 1
print(f"backprop, 2 replicas vs accumulation 2: {n} parameters, {exact} bit-identical, "
      f"largest difference {worst:.2e} of the parameter's scale")
assert n > 0 and worst < 1e-4, worst
PY

delayed=("${common[@]}" --method petra --synthetic-size 320 --accumulation 2 --epochs 3 --mpi --replicas 2)
run 2 "$train" "${delayed[@]}" --log-json whole.jsonl --save-params whole > whole.txt
run 4 "$train" "${delayed[@]}" --checkpoint-dir ck --log-json split.jsonl --save-params split > split.txt
diff -r whole split
echo "petra, 2 replicas x 2 stage groups = 2 replicas x 1 group: parameters equal ($(ls split | wc -l) files)"
echo "epoch-000002" > ck/latest
run 4 "$train" "${delayed[@]}" --checkpoint-dir ck --resume --save-params resumed > resumed.txt
grep -q "resumed from ck/epoch-000002 at epoch 3" resumed.txt
diff -r split resumed
echo "resumed from epoch 2 on 4 processes: parameters equal to the uninterrupted run"
python3 - <<'PY'
import json
a = [json.loads(l) for l in open("whole.jsonl") if '"epoch"' in l]
b = [json.loads(l) for l in open("split.jsonl") if '"epoch"' in l]
keys = ["train_loss", "train_accuracy", "test_loss", "test_accuracy"]
assert [[r[k] for k in keys] for r in a] == [[r[k] for k in keys] for r in b], (a, b)
print("logs equal: " + "; ".join(f"epoch {r['epoch']} train loss {r['train_loss']:.6f}" for r in a))
PY
