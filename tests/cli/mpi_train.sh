#!/usr/bin/env bash
# tests/cli/mpi_train.sh PETRA_TRAIN MPIRUN WORKDIR: petra-train --mpi under mpirun (2 processes, the
# stages split between them) writes the same log as one process on one worker, to the last digit
# of every loss and accuracy: the processes' parameters are the sequential executor's, bit for bit;
# likewise with the options against delay on (weight prediction, PipeMare's warm-up, compensation).
set -euo pipefail
train=$(realpath "$1")
compare=$(realpath "$(dirname "$0")/compare_runs.py")
mpirun=$2
dir=$3/mpi-train
rm -rf "$dir" && mkdir -p "$dir" && cd "$dir"
args=(--method petra --stages blocks --dataset synthetic --synthetic-size 256 --batch-size 32 --width 4 --threads 1 --epochs 2)
"$train" "${args[@]}" --devices cpu:0 --log-json one.jsonl > one.txt
OMP_NUM_THREADS=1 "$mpirun" --allow-run-as-root --oversubscribe -np 2 "$train" "${args[@]}" --mpi \
    --log-json two.jsonl > two.txt
python3 "$compare" logs one.jsonl two.jsonl 2 "two processes"
# The options against delay (docs/petra.md §12) read only the stage's own state: still bit for bit.
delay=(--weight-prediction linear --prediction-horizon 0.5 --delay-lr-warmup 8 --delay-compensation)
"$train" "${args[@]}" "${delay[@]}" --devices cpu:0 --log-json one-delay.jsonl > one-delay.txt
OMP_NUM_THREADS=1 "$mpirun" --allow-run-as-root --oversubscribe -np 2 "$train" "${args[@]}" "${delay[@]}" --mpi \
    --log-json two-delay.jsonl > two-delay.txt
python3 "$compare" logs one-delay.jsonl two-delay.jsonl 2 "two processes, options against delay"
