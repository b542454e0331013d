#!/usr/bin/env bash
# tests/cli/mpi_resume.sh PETRA_TRAIN MPIRUN WORKDIR: checkpoints across processes. petra-train
# --mpi on 3 processes (the middle one sends and receives over MPI in both directions) trains 3
# epochs with a checkpoint after each; the pipeline is not flushed between epochs, so messages are
# on the wire at every checkpoint. Resuming from the epoch-2 checkpoint must give the uninterrupted
# run's epoch-3 numbers and its final parameters, bit for bit. Then a resume with another number
# of processes is refused (exit 5).
set -euo pipefail
train=$(realpath "$1")
mpirun=$2
dir=$3/mpi-resume
rm -rf "$dir" && mkdir -p "$dir" && cd "$dir"
args=(--method petra --stages blocks --dataset synthetic --synthetic-size 256 --batch-size 32 --width 4 --threads 1 --epochs 3
      --mpi --checkpoint-dir ck)
run() { OMP_NUM_THREADS=1 "$mpirun" --allow-run-as-root --oversubscribe -np "$@"; }
run 3 "$train" "${args[@]}" --log-json full.jsonl --save-params full-params > full.txt
ls ck
echo "epoch-000002" > ck/latest  # back to the end of epoch 2 (the newest two checkpoints are kept)
run 3 "$train" "${args[@]}" --resume --log-json resumed.jsonl --save-params resumed-params > resumed.txt
grep -q "resumed from ck/epoch-000002 at epoch 3" resumed.txt
python3 - <<'PY'
import json
keys = ["train_loss", "train_accuracy", "test_loss", "test_accuracy"]
def epoch3(name):
    records = [json.loads(l) for l in open(name) if '"epoch"' in l]
    return [r for r in records if r["epoch"] == 3][0]
a, b = epoch3("full.jsonl"), epoch3("resumed.jsonl")
for k in keys:
    assert a[k] == b[k], f"epoch 3 {k}: uninterrupted {a[k]}, resumed {b[k]}"
print("epoch 3: " + ", ".join(f"{k} {a[k]}" for k in keys) + " (equal)")
PY
diff -r full-params resumed-params
echo "final parameters: equal, $(ls full-params | wc -l) files"
status=0
run 2 "$train" "${args[@]}" --resume > wrong.txt 2> wrong.err || status=$?
if [ "$status" -ne 5 ] || ! grep -q "written by 3 process" wrong.err; then
  echo "mpi_resume: a resume on 2 processes of a 3-process checkpoint exited $status:" >&2
  cat wrong.err >&2
  exit 1
fi
echo "a resume on 2 processes is refused: $(grep -m1 'written by' wrong.err)"
