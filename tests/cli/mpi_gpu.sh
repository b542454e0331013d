#!/usr/bin/env bash
# tests/cli/mpi_gpu.sh PETRA_TRAIN MPIRUN WORKDIR [PETRA_TRAIN_EMULATED]: petra-train --mpi on GPUs
# (--devices, --transport; docs/distributed.md "GPUs and NCCL").
# 1. Arguments, under mpirun with 2 processes: a GPU that is not there exits 6 naming it (cuda:0
#    too where this machine has no GPU); --mpi --devices cpu:1 and --transport nccl without a GPU
#    exit 2 naming the flag; --transport without --mpi exits 2.
# 2. On the emulated GPUs (petra-train-emulated, where CUDA is built): PETRA on 2 processes, one
#    emulated GPU each (--devices cuda:0,cuda:1 --transport mpi: payloads staged through host
#    memory), logs what one process on cuda:0 logs, to the last digit; backprop as 2 replicas on 2
#    emulated GPUs (gradients averaged through host copies) ends with the parameters of one process
#    with --accumulation 2, within float tolerance; PETRA on 2 emulated GPUs resumed from its
#    epoch-2 checkpoint (messages in flight taken off the wire onto the GPU, saved, reloaded) ends
#    as the uninterrupted run, bit for bit; and --transport nccl with both processes on
#    cuda:0 exits 6 naming the two local ranks, before any NCCL call (NCCL refuses a shared GPU).
#    The emulated GPUs' memory is host memory that NCCL cannot use: NCCL itself runs only in
#    scripts/gpu-check.sh.
set -uo pipefail
train=$(realpath "$1")
compare=$(realpath "$(dirname "$0")/compare_runs.py")
mpirun=$2
dir=$3/mpi-gpu
emulated=${4:+$(realpath "$4")}
rm -rf "$dir" && mkdir -p "$dir" && cd "$dir"
status=0
common=(--method petra --dataset synthetic --synthetic-size 16 --batch-size 4 --width 2 --threads 1 --no-augment --stages blocks)
# expect RC FRAGMENT NP BINARY ARGS...: mpirun -np NP BINARY ARGS exits RC with FRAGMENT in its output.
expect() {
  local rc=$1 fragment=$2 np=$3
  shift 3
  local out got
  out=$(OMP_NUM_THREADS=1 timeout 120 "$mpirun" --allow-run-as-root --oversubscribe -np "$np" "$@" 2>&1)
  got=$?
  if [ "$got" -ne "$rc" ] || ! grep -qF -- "$fragment" <<<"$out"; then
    echo "FAIL: mpirun -np $np $*: exit $got (expected $rc with '$fragment'), output: $out"
    status=1
  else
    echo "ok: exit $rc: $(grep -F -- "$fragment" <<<"$out" | head -n 1)"
  fi
}
expect 6 "--devices cuda:63: no such GPU" 2 "$train" "${common[@]}" --epochs 1 --mpi --devices cuda:63
if ! nvidia-smi -L 2>/dev/null | grep -q "^GPU"; then
  expect 6 "--devices cuda:0: no such GPU" 2 "$train" "${common[@]}" --epochs 1 --mpi --devices cuda:0
fi
expect 2 "--mpi --devices cpu:1: under --mpi each process is one CPU worker" 2 "$train" "${common[@]}" --epochs 1 \
    --mpi --devices cpu:1
expect 2 "--transport nccl moves device tensors, but this process trains on cpu:0" 2 "$train" "${common[@]}" \
    --epochs 1 --mpi --transport nccl
out=$("$train" "${common[@]}" --epochs 1 --transport mpi 2>&1)
rc=$?
if [ "$rc" -eq 2 ] && grep -qF -- "--transport mpi carries the messages between the processes of --mpi" <<<"$out"; then
  echo "ok: exit 2: --transport without --mpi"
else
  echo "FAIL: --transport without --mpi: exit $rc: $out"
  status=1
fi

if [ -n "$emulated" ]; then
  run() { OMP_NUM_THREADS=1 timeout 240 "$mpirun" --allow-run-as-root --oversubscribe -np "$@"; }
  two=(--epochs 2 --log-json)
  "$emulated" "${common[@]}" "${two[@]}" one.jsonl --devices cuda:0 > one.txt 2>&1 || { cat one.txt; status=1; }
  run 2 "$emulated" "${common[@]}" "${two[@]}" two.jsonl --mpi --devices cuda:0,cuda:1 --transport mpi \
      > two.txt 2>&1 || { cat two.txt; status=1; }
  grep -q "messages over mpi" two.txt || { echo "FAIL: no transport line:"; cat two.txt; status=1; }
  python3 "$compare" logs one.jsonl two.jsonl 2 "two processes on two emulated GPUs" || status=1
  sync=(--method backprop --dataset synthetic --synthetic-size 32 --batch-size 4 --width 2 --epochs 1 --threads 1
        --no-augment)
  "$emulated" "${sync[@]}" --devices cuda:0 --accumulation 2 --save-params acc > acc.txt 2>&1 || { cat acc.txt; status=1; }
  run 2 "$emulated" "${sync[@]}" --mpi --replicas 2 --devices cuda:0,cuda:1 --transport mpi --save-params rep \
      > rep.txt 2>&1 || { cat rep.txt; status=1; }
  python3 "$compare" params acc rep 1e-4 "2 replicas on 2 emulated GPUs vs --accumulation 2" || status=1
  resume=(--method petra --dataset synthetic --synthetic-size 48 --batch-size 4 --width 2 --threads 1 --no-augment --stages blocks
          --epochs 3 --mpi --devices cuda:0,cuda:1 --transport mpi --checkpoint-dir ck)
  run 2 "$emulated" "${resume[@]}" --save-params whole > whole.txt 2>&1 || { cat whole.txt; status=1; }
  echo "epoch-000002" > ck/latest
  run 2 "$emulated" "${resume[@]}" --resume --save-params resumed > resumed.txt 2>&1 || { cat resumed.txt; status=1; }
  if grep -q "resumed from ck/epoch-000002 at epoch 3" resumed.txt && diff -r whole resumed > /dev/null; then
    echo "ok: resumed from epoch 2 on 2 emulated GPUs: parameters equal to the uninterrupted run"
  else
    echo "FAIL: the resumed run on 2 emulated GPUs differs:" && cat resumed.txt && status=1
  fi
  expect 6 "local ranks 0 and 1 of one host both train on cuda:0" 2 "$emulated" "${common[@]}" --epochs 1 --mpi \
      --devices cuda:0 --transport nccl
fi
exit $status
