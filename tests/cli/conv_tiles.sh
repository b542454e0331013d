#!/usr/bin/env bash
# tests/cli/conv_tiles.sh SCRIPT RUN11_JSON WORKDIR: scripts/conv_tiles.py on tables whose sums are
# known. A made-up table of two FP32 forward layers, tiles in ms (bench-cuda's format since run
# 12): petra 1.0 + 2.0 = 3.000 ms with its tiles, fastest tiles 0.5 + 1.5 = 2.000, cuDNN 0.6 + 3.0
# = 3.600; shares 0.6 (under 70%) and 1.5, so 1 of 2 layers, and of the one 3x3 layer after the
# stem ("layer1 ... 3x3"), 1 of 1. The H200 table of 2026-12-04 run 11 (tiles in seconds, the older
# format) gives the sums docs/results-gpu.md quotes. A file without the table is refused.
set -uo pipefail
script=$1
run11=$2
dir=$3/conv-tiles
rm -rf "$dir" && mkdir -p "$dir" || exit 1
cat > "$dir/small.json" <<'JSON'
{"conv2d": [
 {"math": "fp32", "pass": "forward", "layer": "stem 3->64 3x3 32x32", "petra_ms": 1.0, "cudnn_ms": 0.6,
  "petra_share_of_cudnn": 0.6, "petra_ms_by_tile": [1.0, 0.5, 2.0, 3.0]},
 {"math": "fp32", "pass": "forward", "layer": "layer1 64->64 3x3 32x32", "petra_ms": 2.0, "cudnn_ms": 3.0,
  "petra_share_of_cudnn": 1.5, "petra_ms_by_tile": [2.0, 1.5, 2.5, 1.6]}
]}
JSON
# The weight pass with Winograd timed on one of two layers (bench-cuda since 2026-12-05): petra
# 2.0 + 1.0 = 3.000, Winograd 0.5 on the first: 1.500 with the faster per layer; shares 0.5 and
# 1.2 direct, 2.0 with Winograd: both layers at 70%.
cat > "$dir/winograd.json" <<'JSON'
{"conv2d": [
 {"math": "fp32", "pass": "weight", "layer": "layer3 256->256 3x3 8x8", "petra_ms": 2.0, "cudnn_ms": 1.0,
  "petra_share_of_cudnn": 0.5, "petra_ms_by_tile": [2.0, 2.0, 2.0, 2.0], "petra_winograd_ms": 0.5,
  "petra_winograd_share_of_cudnn": 2.0, "petra_direct_ms": 2.5},
 {"math": "fp32", "pass": "weight", "layer": "layer3 shortcut 1x1 s2", "petra_ms": 1.0, "cudnn_ms": 1.2,
  "petra_share_of_cudnn": 1.2, "petra_ms_by_tile": [1.0, 1.0, 1.0, 1.0]}
]}
JSON
# The TF32 forward timed without the channels-last copies on one of two layers (bench-cuda since
# 2026-12-05's third session): 3.0 there, 1.0 where it was not timed: 4.000 over 1 layer.
cat > "$dir/channels-last.json" <<'JSON'
{"conv2d": [
 {"math": "tf32", "pass": "forward", "layer": "layer1 64->64 3x3 32x32", "petra_ms": 2.0, "cudnn_ms": 1.0,
  "petra_share_of_cudnn": 0.5, "petra_ms_by_tile": [2.0, 2.0, 2.0, 2.0], "petra_nchw_ms": 3.0},
 {"math": "tf32", "pass": "forward", "layer": "stem 3->64 3x3 32x32", "petra_ms": 1.0, "cudnn_ms": 1.0,
  "petra_share_of_cudnn": 1.0, "petra_ms_by_tile": [1.0, 1.0, 1.0, 1.0]}
]}
JSON
# The TF32 128x128 tile's options (bench-cuda since 2026-12-06: a fifth and sixth tile, two
# blocks per multiprocessor and a K step of 32) on two weight layers, and Winograd's GEMM at
# 128x128 / two blocks / K step 32: tile 3 2.0 and 1.0, tile 4 1.5 and 0.9 (its own kernel on the
# first layer only), tile 5 1.8 and 1.2; the fastest of the first four tiles 2.0 + 1.0 = 3.000
# (with tile 4's 1.5 and 0.9, which the rule cannot pick, it would be 2.400); Winograd 0.8 / 0.6
# / 0.7.
cat > "$dir/options.json" <<'JSON'
{"conv2d": [
 {"math": "tf32", "pass": "weight", "layer": "layer2 128->128 3x3 16x16", "petra_ms": 2.0, "cudnn_ms": 1.0,
  "petra_share_of_cudnn": 0.5, "petra_ms_by_tile": [3.0, 3.0, 2.5, 2.0, 1.5, 1.8], "petra_winograd_ms": 0.7,
  "petra_winograd_share_of_cudnn": 1.4, "petra_winograd_128x128_ms": [0.8, 0.6, 0.7], "two_blocks_own_kernel": true},
 {"math": "tf32", "pass": "weight", "layer": "stem 3->64 3x3 32x32", "petra_ms": 1.0, "cudnn_ms": 1.0,
  "petra_share_of_cudnn": 1.0, "petra_ms_by_tile": [1.0, 1.0, 1.0, 1.0, 0.9, 1.2], "two_blocks_own_kernel": false}
]}
JSON
# The forward with K in slices on one of two layers (bench-cuda since 2026-12-06's ninth session):
# petra 1.0 + 2.0, split-K 0.6 on the first: 2.600, 1 of 1 layers faster.
cat > "$dir/split-k.json" <<'JSON'
{"conv2d": [
 {"math": "fp32", "pass": "forward", "layer": "layer4 512->512 3x3 4x4", "petra_ms": 1.0, "cudnn_ms": 1.0,
  "petra_share_of_cudnn": 1.0, "petra_ms_by_tile": [1.0, 1.0, 1.0, 1.0], "petra_split_k_ms": 0.6, "split_k_slices": 2},
 {"math": "fp32", "pass": "forward", "layer": "layer3 256->256 3x3 8x8", "petra_ms": 2.0, "cudnn_ms": 1.0,
  "petra_share_of_cudnn": 0.5, "petra_ms_by_tile": [2.0, 2.0, 2.0, 2.0]}
]}
JSON
echo '{"batchnorm": []}' > "$dir/other.json"
status=0
expect() {  # expect FILE PATTERN...: every pattern is a line of the output
  local file=$1
  shift
  local out
  out=$(python3 "$script" "$file" 2>&1)
  for pattern in "$@"; do
    if grep -qF -- "$pattern" <<<"$out"; then
      echo "ok: $(basename "$file"): $pattern"
    else
      echo "FAIL: $(basename "$file"): no line '$pattern' in:"
      echo "$out"
      status=1
    fi
  done
}
expect "$dir/small.json" "fp32 forward    3.000 /   2.000 /   3.600   1 of 2 layers, 1 of 1 3x3 after the stem"
expect "$dir/winograd.json" "fp32 weight     3.000 /   3.000 /   2.200   1 of 2 layers, 0 of 1 3x3 after the stem" \
  "fp32 weight     1.500 with Winograd where faster (1 layers: layer3 256->256 3x3 8x8); 2 of 2 layers at >= 70%" \
  "fp32 weight     3.500 with the direct product everywhere (the fastest tile per layer:   3.000)"
expect "$dir/channels-last.json" "tf32 forward    4.000 without the channels-last copies (1 layers)"
expect "$dir/options.json" "tf32 weight     3.000 /   3.000 /   2.000   1 of 2 layers, 0 of 1 3x3 after the stem" \
  "tf32 weight   128x128 / K step 32:   3.000 /   3.000 (2 layers)" \
  "tf32 weight   128x128 / two blocks per multiprocessor:   2.000 /   1.500 (1 layers with a kernel of their own)" \
  "tf32 weight   Winograd at 128x128 / two blocks per multiprocessor / K step 32:   0.800 /   0.600 /   0.700 (1 layers)"
expect "$dir/split-k.json" "fp32 forward    2.600 with split-K where faster (1 of 1 layers: layer4 512->512 3x3 4x4)"
expect "$run11" \
  "fp32 forward    2.202 /   2.102 /   2.067   11 of 11 layers, 7 of 7 3x3 after the stem" \
  "fp32 weight     3.141 /   2.929 /   2.931   6 of 11 layers, 3 of 7 3x3 after the stem" \
  "tf32 data       2.427 /   2.012 /   1.110   3 of 11 layers, 0 of 7 3x3 after the stem"
if python3 "$script" "$dir/other.json" > "$dir/other.out" 2>&1; then
  echo "FAIL: a file without the conv2d table was accepted"
  status=1
elif grep -q "cannot read the conv2d table of" "$dir/other.out"; then
  echo "ok: a file without the conv2d table is refused, naming it"
else
  echo "FAIL: unexpected message:"; cat "$dir/other.out"; status=1
fi
exit $status
