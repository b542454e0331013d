#!/usr/bin/env bash
# scripts/mpi-scaling.sh: run from a scratch directory (it writes its logs there); PETRA_TRAIN names the
# binary (default: build/petra-train of this checkout).
set -euo pipefail
train=${PETRA_TRAIN:-$(realpath "$(dirname "$0")/../build/petra-train")}
# images/s of petra-train --mpi with 1, 2 and 4 processes (interleaved, 2 rounds); epoch 2 (the pipeline is full).
for round in 1 2; do
  for np in 1 2 4; do
    OMP_NUM_THREADS=1 mpirun --allow-run-as-root --oversubscribe -np $np "$train" --mpi --method petra \
      --dataset synthetic --synthetic-size 4096 --batch-size 64 --width 16 --threads 1 --epochs 2 \
      --log-json r$round-np$np.jsonl > r$round-np$np.txt 2>&1
    python3 -c "
import json; r=[json.loads(l) for l in open('r$round-np$np.jsonl') if '\"epoch\"' in l]; print('round $round np $np', round(r[1]['images_per_second'],1), 'load', open('/proc/loadavg').read().split()[0])"
  done
done
