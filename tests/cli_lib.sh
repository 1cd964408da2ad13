# Shared by the `dhelix VERB` command-line tests (sourced): pass/fail counting and the bad-input
# check. Oracle of expect_bad: the documented exit code 2 and every PATTERN in the message.
# Before sourcing set: bin (the dhelix binary), verb (the command under test).
fails=0; passes=0
ok()   { passes=$((passes+1)); echo "ok   $1"; }
fail() { fails=$((fails+1)); echo "FAIL $1"; }

expect_bad() {  # expect_bad NAME PATTERN... -- ARGS  (runs: $bin $verb ARGS)
  local name=$1; shift; local pats=()
  while [ "$1" != "--" ]; do pats+=("$1"); shift; done; shift
  out=$("$bin" "$verb" "$@" 2>&1); rc=$?
  local good=1
  [ "$rc" -eq 2 ] || { echo "  exit code $rc, expected 2"; good=0; }
  for p in "${pats[@]}"; do grep -qF -- "$p" <<<"$out" || { echo "  message lacks '$p'"; good=0; }; done
  if [ $good -eq 1 ]; then ok "$name"; else fail "$name"; echo "$out" | tail -15; fi
}

# The last line of every such test: the counts, and the exit status.
summary() {
  echo "$passes passed, $fails failed"
  [ $fails -eq 0 ]
}
