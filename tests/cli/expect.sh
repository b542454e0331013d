# tests/cli/expect.sh: sourced by the petra-train scripts of tests/cli/ (bad_data.sh, input_errors.sh).
# Needs $train (the petra-train binary) and $status (0 before the first case; 1 once one fails).
#
# expect RC FRAGMENT ARGS...: petra-train ARGS exits RC and its output contains FRAGMENT; prints the
# line found, or FAIL with the whole output, and sets status=1 on failure.
expect() {
  local rc=$1 fragment=$2
  shift 2
  local out got
  out=$(timeout 120 "$train" "$@" 2>&1)
  got=$?
  if [ "$got" -ne "$rc" ] || ! grep -qF -- "$fragment" <<<"$out"; then
    echo "FAIL: petra-train $*: exit $got (expected $rc with '$fragment'), output: $out"
    status=1
  else
    echo "ok: exit $rc: $(grep -F -- "$fragment" <<<"$out" | head -n 1)"
  fi
}
