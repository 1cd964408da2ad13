#!/usr/bin/env bash
# The CUDA test binary's watchdog (test_sticky_errors.cc): a test still running after
# DHELIX_TEST_WATCHDOG_S seconds ends the process with exit 87 and a "[ HUNG ]" line naming it, and
# scripts/gpu-device's rerun helper takes it for the crasher to leave out. Oracle: the documented
# exit status and line; the helper's filter. Runs without a GPU (the watchdog does not need one).
# Usage: watchdog.sh TEST_BINARY SOURCE_DIR
set -u
bin=$1 src=$2
t=CudaStickyErrors.DISABLED_SleepsPastTheWatchdog
log=$(mktemp); trap 'rm -f "$log"' EXIT
start=$SECONDS
DHELIX_TEST_WATCHDOG_S=1 "$bin" --gtest_filter="$t" --gtest_also_run_disabled_tests > "$log" 2>&1
rc=$?
took=$(( SECONDS - start ))
fail=0
if [ $rc -eq 87 ] && grep -qF "[ HUNG     ] $t: no end after 1 s" "$log" && [ $took -lt 5 ]; then
  echo "ok   hung test ends the process (exit 87, ${took} s)"
else
  echo "FAIL hung test: exit $rc after ${took} s (want 87 within 5 s)"; tail -5 "$log"; fail=1
fi
want="-X*:$t"
got=$("$src/scripts/gpu-device" helper unfinished-filter '-X*' "$log")
if [ "$got" = "$want" ]; then echo "ok   the rerun leaves it out"; else echo "FAIL filter '$got', want '$want'"; fail=1; fi
exit $fail
