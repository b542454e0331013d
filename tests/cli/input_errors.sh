#!/usr/bin/env bash
# tests/cli/input_errors.sh PETRA_TRAIN WORKDIR: every error caused by petra-train's input names the
# input and exits with its code: 2 for a flag, 5 for a checkpoint (3 for data files: bad_data.sh);
# never 1, which is left for petra's own bugs. Each case below once ended otherwise:
#   flags       --placement a,b (exit 1 from std::stoi), --width / --print-schedule / --epochs /
#               --synthetic-size too large (exit 1: "cannot allocate" or std::bad_alloc),
#               --message-timeout inf (accepted; the deadline overflowed)
#   checkpoints trainer.txt without next_epoch or with "next_epoch = x" (exit 1 from map::at and
#               std::stoll), a global_step that is not the epoch's (resumed silently at that step),
#               a checkpoint directory renamed to another epoch (resumed silently), a resume on
#               another --data-dir holding other data (resumed silently), an epoch ended by
#               --max-steps at its last mini-batch (checkpointed drained; resuming it exited 1)
# and these still work: the same data in another directory resumes; a checkpoint from before the
# data set's identity was recorded resumes with a note. The checkpoint files are edited together
# with their MANIFEST line, so that what is refused is the contents, not a checksum.
set -uo pipefail
# shellcheck source=tests/cli/expect.sh
source "$(dirname "$(realpath "$0")")/expect.sh"  # expect RC FRAGMENT ARGS...
train=$(realpath "$1")
dir=$2/input-errors
rm -rf "$dir" && mkdir -p "$dir" && cd "$dir" || exit 1
status=0

# edit CHECKPOINT FILE EXPRESSION: FILE (relative to CHECKPOINT) becomes the Python expression of its
# text `t`, and its MANIFEST line is rewritten to match.
edit() {
  python3 - "$@" <<'PY'
import os, sys, zlib
checkpoint, name, expression = sys.argv[1:]
path = os.path.join(checkpoint, name)
t = open(path).read()
open(path, "w").write(eval(expression))
data = open(path, "rb").read()
manifest = os.path.join(checkpoint, "MANIFEST")
lines = [f"{name} {len(data)} {zlib.crc32(data)}" if line.split(" ")[0] == name else line
         for line in open(manifest).read().splitlines()]
open(manifest, "w").write("\n".join(lines) + "\n")
PY
}

# npy_dataset DIR SEED: 16 gray 8x8 images, labels 0/1 (from SEED), classes.txt, a test set of 4.
npy_dataset() {
  python3 - "$@" <<'PY'
import os, random, struct, sys
directory, seed = sys.argv[1], int(sys.argv[2])
os.makedirs(directory, exist_ok=True)
def npy(name, descr, shape, data):
    header = "{'descr': '%s', 'fortran_order': False, 'shape': %s, }" % (descr, str(shape))
    header += " " * (117 - len(header)) + "\n"
    open(os.path.join(directory, name), "wb").write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode() + data)
rng = random.Random(seed)
for prefix, n in (("", 16), ("test_", 4)):
    npy(prefix + "images.npy", "|u1", (n, 8, 8), bytes(rng.randrange(256) for _ in range(n * 64)))
    npy(prefix + "labels.npy", "<i8", (n,), struct.pack(f"<{n}q", *[rng.randrange(2) for _ in range(n)]))
open(os.path.join(directory, "classes.txt"), "w").write("zero\none\n")
PY
}

synthetic=(--dataset synthetic --synthetic-size 64 --batch-size 16 --threads 1 --stages blocks)

# ---- flags: exit 2, naming the flag (and the limit)
expect 2 "--placement 'a,b': 'a' is not a worker index" "${synthetic[@]}" --method petra --placement a,b --epochs 0
expect 2 "--placement gives 3 workers for the model's 10 stages, each from 0 to 1" "${synthetic[@]}" --method petra \
  --placement 0,1,2 --epochs 0
expect 2 "--width: Value 100000 not in range 1 to 1024" "${synthetic[@]}" --width 100000 --epochs 0
expect 2 "--print-schedule: Value 1000000000000 not in range 1 to 100000" --print-schedule 1000000000000
expect 2 "--epochs 100000000000 of 4 mini-batches" "${synthetic[@]}" --method backprop --epochs 100000000000
expect 2 "--synthetic-size: Value 100000000000 not in range 1 to 10000000" --dataset synthetic --synthetic-size 100000000000
expect 2 "--message-timeout must be > 0 seconds and at most" "${synthetic[@]}" --message-timeout inf --epochs 0
# issue 16's options against delay (docs/petra.md §12): bad values and combinations
expect 2 "--weight-prediction" "${synthetic[@]}" --method petra --weight-prediction quadratic --epochs 0
expect 2 "--weight-prediction linear needs a pipelined method and sgd with 0 < momentum < 1" "${synthetic[@]}" \
  --method petra --weight-prediction linear --optimizer adam --epochs 0
expect 2 "--prediction-horizon 0.5 scales the prediction of --weight-prediction linear" "${synthetic[@]}" \
  --method petra --prediction-horizon 0.5 --epochs 0
expect 2 "--prediction-horizon" "${synthetic[@]}" --method petra --weight-prediction linear --prediction-horizon -1 --epochs 0
expect 2 "--delay-lr-warmup" "${synthetic[@]}" --method petra --delay-lr-warmup -5 --epochs 0
expect 2 "--delay-lr-warmup scales the learning rates of delayed stages" "${synthetic[@]}" --method backprop \
  --delay-lr-warmup 10 --epochs 0

# ---- checkpoints: exit 5, naming the checkpoint, the file and what is wrong
run=("${synthetic[@]}" --width 2 --method petra --devices cpu:0 --epochs 2 --checkpoint-dir ck)
timeout 300 "$train" "${run[@]}" > first.txt 2>&1 || { echo "FAIL: the training run: $(cat first.txt)"; exit 1; }
[ -f ck/epoch-000001/MANIFEST ] && [ -f ck/epoch-000002/MANIFEST ] || { echo "FAIL: no checkpoints: $(ls ck)"; exit 1; }
cp -r ck ck.good
restore() { rm -rf ck && cp -r ck.good ck; echo "epoch-000001" > ck/latest; }

restore && edit ck/epoch-000001 trainer.txt 't.replace("next_epoch = 1\n", "")'
expect 5 "trainer.txt: no 'next_epoch'" "${run[@]}" --resume
restore && edit ck/epoch-000001 trainer.txt 't.replace("next_epoch = 1", "next_epoch = x")'
expect 5 "trainer.txt: 'next_epoch = x' is not an integer" "${run[@]}" --resume
restore && edit ck/epoch-000001 trainer.txt 't.replace("global_step = 4", "global_step = 9")'
expect 5 "global_step = 9 in its trainer.txt, but epoch 1 of this run starts at step 4" "${run[@]}" --resume
restore && mv ck/epoch-000001 ck/epoch-000003 && echo "epoch-000003" > ck/latest
expect 5 "holds the state after epoch 1 (next_epoch = 1 in its trainer.txt) but its directory is named otherwise" \
  "${run[@]}" --resume
restore && edit ck/epoch-000001 pipeline/channels.txt '"".join(l + "\n" for l in t.splitlines() if not l.startswith("forward 0 "))'
expect 5 "the channel from stage 0 up holds mini-batches [] but step 4 of the schedule has [3]" "${run[@]}" --resume
restore && edit ck/epoch-000001 optimizer/stage-03/optimizer_state.txt 't.replace("step_count", "step_kount")'
expect 5 "optimizer_state.txt line" "${run[@]}" --resume
restore
expect 0 "resumed from ck/epoch-000001 at epoch 2" "${run[@]}" --resume

# ---- the data set's identity: other data is refused, the same data elsewhere resumes
npy_dataset data-a 1 && npy_dataset data-b 2 && cp -r data-a data-a-copy
npy_run=(--dataset npy --batch-size 4 --width 2 --method backprop --epochs 2 --threads 1 --checkpoint-dir ck-npy)
timeout 300 "$train" "${npy_run[@]}" --data-dir data-a --max-steps 5 > npy.txt 2>&1 ||
  { echo "FAIL: the npy run: $(cat npy.txt)"; exit 1; }
expect 5 "was written on other data: data_test_images = [4, 1, 8, 8] uint8 crc32" "${npy_run[@]}" --data-dir data-b --resume
expect 5 "(its --data-dir was 'data-a')" "${npy_run[@]}" --data-dir data-b --resume
expect 0 "resumed from ck-npy/epoch-000001 at epoch 2" "${npy_run[@]}" --data-dir data-a-copy --resume
# A checkpoint written before the identity was recorded: resumed, with a note, as before.
rm -rf ck-npy && timeout 300 "$train" "${npy_run[@]}" --data-dir data-a --max-steps 5 > npy.txt 2>&1
edit ck-npy/epoch-000001 trainer.txt '"".join(l + "\n" for l in t.splitlines() if not l.startswith("data_"))'
expect 0 "note: the checkpoint predates petra's record of the data set's identity" "${npy_run[@]}" --data-dir data-b --resume

# ---- --max-steps ending a pipelined run at an epoch's last mini-batch: that epoch is not checkpointed
cut=("${synthetic[@]}" --width 2 --method petra --devices cpu:0 --epochs 2 --checkpoint-dir ck-cut)
timeout 300 "$train" "${cut[@]}" --max-steps 4 > cut.txt 2>&1 || { echo "FAIL: the cut run: $(cat cut.txt)"; exit 1; }
expect 5 "no checkpoint in ck-cut" "${cut[@]}" --resume
exit $status
