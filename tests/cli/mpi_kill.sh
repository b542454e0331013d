#!/usr/bin/env bash
# tests/cli/mpi_kill.sh PETRA_TRAIN MPIRUN WORKDIR: a process of an --mpi run killed with SIGKILL in
# the middle of training makes the run stop: mpirun exits non-zero, with a message, within 30
# seconds, and no petra-train process is left behind (no hang).
set -euo pipefail
train=$(realpath "$1")
mpirun=$2
dir=$3/mpi-kill
rm -rf "$dir" && mkdir -p "$dir" && cd "$dir"
OMP_NUM_THREADS=1 "$mpirun" --allow-run-as-root --oversubscribe -np 2 "$train" --mpi --method petra \
    --dataset synthetic --synthetic-size 4096 --batch-size 32 --width 4 --threads 1 --epochs 100 --stages blocks \
    --message-timeout 20 --log-json "$dir/log.jsonl" > out.txt 2> err.txt &
launcher=$!
# The rank-1 process: a petra-train whose environment says so.
victim=""
for _ in $(seq 100); do
  for pid in $(pgrep -f "$dir/log.jsonl" || true); do
    if [ "$(cat /proc/"$pid"/comm 2>/dev/null)" = petra-train ] &&
       tr '\0' '\n' < /proc/"$pid"/environ 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=1"; then
      victim=$pid
    fi
  done
  [ -n "$victim" ] && break
  sleep 0.1
done
if [ -z "$victim" ]; then
  echo "mpi_kill: rank 1 never started" >&2
  kill -9 "$launcher" 2>/dev/null || true
  exit 1
fi
sleep 3  # well into training
kill -9 "$victim"
start=$(date +%s)
status=0
for _ in $(seq 600); do  # up to 60 s, to report a hang instead of hanging
  kill -0 "$launcher" 2>/dev/null || break
  sleep 0.1
done
if kill -0 "$launcher" 2>/dev/null; then
  echo "mpi_kill: mpirun still running 60 s after rank 1 was killed" >&2
  pkill -9 -f "$dir/log.jsonl" || true
  exit 1
fi
wait "$launcher" || status=$?
seconds=$(( $(date +%s) - start ))
echo "mpirun exited $status, ${seconds} s after rank 1 was killed; its message:"
grep -v '^\s*$' err.txt | head -5
left=$(pgrep -f "$dir/log.jsonl" || true)
[ "$status" -ne 0 ] || { echo "mpi_kill: mpirun exited 0" >&2; exit 1; }
[ "$seconds" -le 30 ] || { echo "mpi_kill: took ${seconds} s" >&2; exit 1; }
[ -s err.txt ] || { echo "mpi_kill: no message" >&2; exit 1; }
[ -z "$left" ] || { echo "mpi_kill: processes left: $left" >&2; kill -9 $left; exit 1; }
