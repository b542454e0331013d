#!/usr/bin/env bash
# tests/cli/bad_data.sh PETRA_TRAIN WORKDIR: petra-train on hostile data files exits 3 (bad data)
# with a message naming the file, never 0, 1 or a crash; a --classes beyond the limit exits 2.
# The files are written here with printf (no Python, no NumPy):
#   - an IDX header whose dims multiply to 2^64 (65536 images of 2^24 x 2^24 in a 16-byte file),
#   - IDX files with 0 images,
#   - npy directories: no classes.txt, a label of 999999 against --classes 10, no test set for
#     --eval-only; and one good directory that must run (exit 0).
set -uo pipefail
# shellcheck source=tests/cli/expect.sh
source "$(dirname "$(realpath "$0")")/expect.sh"  # expect RC FRAGMENT ARGS...
train=$(realpath "$1")
dir=$2/bad-data
rm -rf "$dir" && mkdir -p "$dir" && cd "$dir" || exit 1
common=(--method backprop --devices cpu:0 --width 2 --batch-size 4 --threads 1)
status=0

be32() { printf "\\x$(printf %02x $(($1 >> 24 & 255)))\\x$(printf %02x $(($1 >> 16 & 255)))\\x$(printf %02x $(($1 >> 8 & 255)))\\x$(printf %02x $(($1 & 255)))"; }

# IDX: a 16-byte image file claiming 2^64 pixels; 65536 labels.
mkdir -p wrap empty
for split in train t10k; do
  { printf '\x00\x00\x08\x03'; be32 65536; be32 16777216; be32 16777216; } > "wrap/$split-images-idx3-ubyte"
  { printf '\x00\x00\x08\x01'; be32 65536; head -c 65536 /dev/zero; } > "wrap/$split-labels-idx1-ubyte"
  { printf '\x00\x00\x08\x03'; be32 0; be32 28; be32 28; } > "empty/$split-images-idx3-ubyte"
  { printf '\x00\x00\x08\x01'; be32 0; } > "empty/$split-labels-idx1-ubyte"
done
expect 3 "wrap/train-images-idx3-ubyte', byte 8: dim 1 (the height) is 16777216, above the limit" \
  --dataset mnist --data-dir wrap --eval-only "${common[@]}"
expect 3 "empty/train-images-idx3-ubyte', byte 4: the file holds no images" --dataset mnist --data-dir empty --epochs 1 "${common[@]}"
expect 3 "empty/train-images-idx3-ubyte', byte 4: the file holds no images" --dataset mnist --data-dir empty --epochs 1

# npy: a version-1.0 header padded to 128 bytes, then the data.
npy() {  # npy FILE DESCR SHAPE DATA(printf format)
  local dict="{'descr': '$2', 'fortran_order': False, 'shape': $3, }"
  { printf '\x93NUMPY\x01\x00\x76\x00'; printf '%-117s\n' "$dict"; printf "$4"; } > "$1"
}
pixels=$(printf '\\x%02x' $(seq 0 47))  # 4 images of 2x2x3, uint8 channels last
mkdir -p npy
npy npy/images.npy '|u1' '(4, 2, 2, 3)' "$pixels"
npy npy/labels.npy '<i8' '(4,)' '\x00\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00\x02\x00\x00\x00\x00\x00\x00\x00\x3f\x42\x0f\x00\x00\x00\x00\x00'
expect 3 "no classes.txt" --dataset npy --data-dir npy --epochs 0 "${common[@]}"
expect 3 "labels.npy', byte 152: label 999999 of sample 3 is outside [0, 10)" \
  --dataset npy --data-dir npy --epochs 0 --classes 10 "${common[@]}"
expect 2 "--classes: Value 200000 not in range" --dataset npy --data-dir npy --epochs 0 --classes 200000 "${common[@]}"
npy npy/labels.npy '<i8' '(4,)' '\x00\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00\x02\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00'
printf 'cat\ndog\nbird\n' > npy/classes.txt
expect 3 "has no test set, nothing to evaluate" --dataset npy --data-dir npy --eval-only "${common[@]}"
expect 0 "4 train / 0 test images" --dataset npy --data-dir npy --epochs 0 "${common[@]}"
exit $status
