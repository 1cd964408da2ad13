#!/usr/bin/env bash
# A dying rank must take the whole MPI job down, quickly, with every rank exiting non-zero.
# Case 1: rank 1 SIGKILLs itself mid-loop. Case 2: rank 1 throws; main calls abort_world, whose
# message must name the rank and the last collective (EXPECTED_TEXT is an extended regex). Oracle: mpirun's status, elapsed time,
# no rank process left alive, no rank that finished normally.
# Case 3: a rank that never joins the world (bootstrap timeout), named by rank 0. Case 4: a rank
# that never arrives at a collective, named by the others' timeout.
# usage: mpi_failure_test.sh MPIRUN TEST_BINARY
set -u
MPIRUN=$1; BIN=$2; BOUND_S=30; NP=4
fail=0
alive() {  # a zombie (dead, not yet reaped by pid 1) counts as gone
  kill -0 "$1" 2>/dev/null && ! grep -q '^State:[[:space:]]*Z' "/proc/$1/status" 2>/dev/null
}
run_case() {  # run_case MODE EXPECTED_TEXT
  local mode=$1 want=$2 dir rc t0 t1 elapsed
  dir=$(mktemp -d)
  t0=$(date +%s.%N)
  timeout 90 "$MPIRUN" -np $NP --oversubscribe --bind-to none "$BIN" "$mode" "$dir" timeout_s=20 >"$dir/out" 2>&1
  rc=$?
  t1=$(date +%s.%N)
  elapsed=$(echo "$t1 - $t0" | bc)
  echo "[$mode] mpirun exit $rc after ${elapsed} s"
  if [ $rc -eq 0 ] || [ $rc -eq 124 ]; then echo "FAIL [$mode]: mpirun exit $rc (want non-zero, not a timeout)"; fail=1; fi
  if [ "$(echo "$elapsed > $BOUND_S" | bc)" = 1 ]; then echo "FAIL [$mode]: took ${elapsed} s > ${BOUND_S} s"; fail=1; fi
  local n=$(ls "$dir"/*.pid 2>/dev/null | wc -l)
  [ "$n" -eq $NP ] || { echo "FAIL [$mode]: only $n of $NP ranks started"; fail=1; }
  for f in "$dir"/*.pid; do
    [ -e "$f" ] || continue
    pid=$(cat "$f")
    for _ in $(seq 50); do alive "$pid" || break; sleep 0.1; done  # 5 s grace to die
    if alive "$pid"; then echo "FAIL [$mode]: $(basename "$f" .pid) (pid $pid) still alive"; kill -9 "$pid"; fail=1; fi
  done
  if ls "$dir"/*.exit0 >/dev/null 2>&1; then echo "FAIL [$mode]: a rank finished normally: $(ls "$dir"/*.exit0)"; fail=1; fi
  if ! grep -qE -- "$want" "$dir/out"; then echo "FAIL [$mode]: output lacks /$want/"; fail=1; fi
  echo "---- [$mode] mpirun output (first 15 lines) ----"; head -15 "$dir/out"
  rm -rf "$dir"
}
# A killed rank is reported by mpirun, or first by a rank whose Gloo connection to it closes (its
# abort message names the op, its sequence number and rank 1, the process that exited).
run_case kill-one "exited on signal 9|all_reduce f32\\[1024\\] on world\\[[0-9]/4\\] seq=[0-9]+ failed: .*(closed|reset) by peer.*\\(group rank 1 of world\\[[0-9]/4\\] exited\\)"
run_case throw-one "rank 1: injected failure at step 5; last collective: all_reduce f32\\[1024\\] on world\\[1/4\\] seq=4"
# late_case MODE EXPECTED_ERE: rank 1 is late by 60 s in MODE; with a 3 s timeout the job must end
# non-zero within the bound, with a message matching EXPECTED_ERE.
late_case() {
  local mode=$1 want=$2 out rc t0 elapsed
  t0=$(date +%s.%N)
  out=$(timeout 90 "$MPIRUN" -np 3 --oversubscribe --bind-to none "$BIN" "$mode" 60 timeout_s=3 2>&1)
  rc=$?
  elapsed=$(echo "$(date +%s.%N) - $t0" | bc)
  echo "[$mode] mpirun exit $rc after ${elapsed} s"
  if [ $rc -eq 0 ] || [ $rc -eq 124 ]; then echo "FAIL [$mode]: mpirun exit $rc"; fail=1; fi
  if [ "$(echo "$elapsed > $BOUND_S" | bc)" = 1 ]; then echo "FAIL [$mode]: took ${elapsed} s > ${BOUND_S} s"; fail=1; fi
  grep -qE -- "$want" <<<"$out" || { echo "FAIL [$mode]: output lacks /$want/"; echo "$out" | head -5; fail=1; }
}
# A rank that never joins (rank 1 starts MPI, then sleeps before creating the world): rank 0 names it.
late_case late-join "rank 0: rank 1 of the world did not join within 3 s"
# A rank alive but stuck elsewhere (rank 1 sleeps before its first all_reduce): the others'
# all_reduce times out naming rank 1 as not having started it (the arrival board).
late_case late-op "all_reduce f32\[1024\] on world\[[02]/3\] seq=0 .*group rank 1 \(world rank 1\) has not started it"
[ $fail -eq 0 ] && echo "mpi_failure_test: passed" || echo "mpi_failure_test: FAILED"
exit $fail
