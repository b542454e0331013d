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
compare=$(realpath "$(dirname "$0")/compare_runs.py")
mpirun=$2
dir=$3/mpi-replicas
rm -rf "$dir" && mkdir -p "$dir" && cd "$dir"
run() { OMP_NUM_THREADS=1 "$mpirun" --allow-run-as-root --oversubscribe -np "$@"; }
common=(--dataset synthetic --batch-size 32 --width 4 --threads 1 --stages blocks)

sync=("${common[@]}" --method backprop --synthetic-size 256 --epochs 2)
"$train" "${sync[@]}" --accumulation 2 --save-params one > one.txt
run 2 "$train" "${sync[@]}" --mpi --replicas 2 --save-params two > two.txt
python3 "$compare" params one two 1e-4 "backprop, 2 replicas vs accumulation 2"

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
python3 "$compare" logs whole.jsonl split.jsonl 3 "2 replicas x 2 stage groups"
