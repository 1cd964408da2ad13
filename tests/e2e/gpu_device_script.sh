#!/usr/bin/env bash
# The lent GPU machine's one prepared script (scripts/gpu-device) can only run where a GPU is, and a
# GPU session has 15 minutes: a script broken in its syntax or its argument checks would cost one.
# Checked here without a GPU (nothing is built, packed or unpacked): every shell and Python file it
# runs parses, and bad arguments exit 2 naming the value before anything else happens.
# Oracles: bash -n / Python's parser; the exit status and the message.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
fail=0
check() {  # NAME WANT_STATUS WANT_TEXT -- COMMAND...
  local name=$1 want=$2 text=$3
  shift 4
  local out rc
  out=$("$@" 2>&1)
  rc=$?
  if [ "$rc" != "$want" ] || ! grep -qF -- "$text" <<<"$out"; then
    echo "FAIL $name: exit $rc (want $want), output:"
    echo "$out" | head -20
    fail=1
  else
    echo "ok   $name"
  fi
}
for f in scripts/gpu-device bench/gpu-si-sim.sh; do
  check "bash -n $f" 0 "" -- bash -n "$root/$f"
done
check "gpu_torch.py parses" 0 "" -- /usr/bin/python3 -c "import ast, sys; ast.parse(open(sys.argv[1]).read())" \
  "$root/bench/gpu_torch.py"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
check "unknown section" 2 "names no section 'bogus'" -- env OUT="$out" DHELIX_GPU_ONLY=tests,bogus "$root/scripts/gpu-device" run
check "bad deadline" 2 "DHELIX_GPU_DEADLINE_S='abc'" -- env OUT="$out" DHELIX_GPU_DEADLINE_S=abc "$root/scripts/gpu-device" run
check "no command" 2 "usage: scripts/gpu-device" -- "$root/scripts/gpu-device"
check "unknown command" 2 "usage: scripts/gpu-device" -- "$root/scripts/gpu-device" frob
# Nothing was unpacked or written for the refused runs.
if [ -n "$(ls -A "$out")" ]; then
  echo "FAIL refused runs wrote into \$OUT: $(ls -A "$out")"
  fail=1
fi
exit $fail
