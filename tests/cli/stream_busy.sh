#!/usr/bin/env bash
# tests/cli/stream_busy.sh SCRIPT WORKDIR: scripts/stream_busy.py on traces whose answers are known.
# Two streams over [0, 1000) ns: stream 7 busy on [0, 600) as two overlapping kernels, stream 9 on
# [400, 1000); with the whole trace as the window (--window 0,1): stream 7 busy 60%, stream 9 60%,
# both 20%, some stream 100%, none 0%. The same trace in Nsight Systems' format (start, duration)
# gives the same lines. With the default window (30% to 90%: [300, 900)) stream 7 is busy on
# [300, 600), 50%, stream 9 on [400, 900), 83.3%, both on [400, 600), 33.3%, none 0%. A file with
# other columns is refused naming them.
set -uo pipefail
script=$1
dir=$2/stream-busy
rm -rf "$dir" && mkdir -p "$dir" || exit 1
cat > "$dir/cupti.csv" <<'CSV'
start_ns,end_ns,stream,kind,name
0,400,7,kernel,"void a<int, 2>(int)"
200,600,7,kernel,"b"
400,1000,9,memcpy,"copy kind 1, 64 bytes"
CSV
cat > "$dir/nsys.csv" <<'CSV'
Start (ns),Duration (ns),CorrId,GrdX,Strm,Name
0,400,1,1,7,a
200,400,2,1,7,b
400,600,3,1,9,[CUDA memcpy HtoD]
CSV
status=0
expect() {  # expect FILE WINDOW PATTERN...: every pattern is a line of the output
  local file=$1 window=$2
  shift 2
  local out
  out=$(python3 "$script" "$dir/$file" test --window "$window" 2>&1)
  for pattern in "$@"; do
    if grep -qF -- "$pattern" <<<"$out"; then
      echo "ok: $file --window $window: $pattern"
    else
      echo "FAIL: $file --window $window: no line '$pattern' in:"
      echo "$out"
      status=1
    fi
  done
}
for file in cupti.csv nsys.csv; do
  expect "$file" 0,1 "stream 7: busy  60.0% of the window (2 kernels and copies)" \
    "stream 9: busy  60.0% of the window (1 kernels and copies)" \
    "streams 7 and 9 both busy  20.0% of the window; some stream busy 100.0%, none   0.0%"
  expect "$file" 0.3,0.9 "stream 7: busy  50.0%" "stream 9: busy  83.3%" \
    "both busy  33.3% of the window; some stream busy 100.0%, none   0.0%"
done
# A gap: stream 9 only from 700 on leaves [600, 700) idle, 10% of the whole trace.
sed 's/^400,1000,9/700,1000,9/' "$dir/cupti.csv" > "$dir/gap.csv"
expect gap.csv 0,1 "both busy   0.0% of the window; some stream busy  90.0%, none  10.0%"
printf 'when,what\n1,2\n' > "$dir/other.csv"
out=$(python3 "$script" "$dir/other.csv" test 2>&1)
if [ $? -ne 0 ] && grep -q "unexpected columns" <<<"$out"; then
  echo "ok: other columns refused: $out"
else
  echo "FAIL: other columns: $out"
  status=1
fi
exit $status
