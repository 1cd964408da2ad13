#!/usr/bin/env bash
# The lent GPU machine's one prepared script (scripts/gpu-device) can only run where a GPU is, and a
# GPU session has 15 minutes: a script broken in its syntax or its argument checks would cost one.
# Checked here without a GPU (nothing is built or packed): every shell and Python file it runs
# parses, bad arguments exit 2 naming the value before anything else happens, its JSON helpers and
# summary read the files written by hand below, and `run` goes through a test section end to end on
# a stub bundle (a hang, its rerun, the merged JSON, the summary, the exit status).
# Oracles: bash -n / Python's parser; the exit status and the message; the values written below.
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

# A test section whose process crashes reruns what it did not finish (test_section): the helpers
# that read a crashed part's log. Oracle: the gtest log lines written by hand below -- a part that
# ran A.One (OK), P/F.Two/0 (FAILED, a parameterized name), A.Skip (SKIPPED), then lost the context
# in B.Bad (the sticky listener's line, no end line); the rerun's part ended with its own JSON.
h=$(mktemp -d)
cat > "$h/part0.log" <<'LOG'
[==========] Running 6 tests from 3 test suites.
[ RUN      ] A.One
[       OK ] A.One (3 ms)
[ RUN      ] P/F.Two/0
[  FAILED  ] P/F.Two/0, where GetParam() = 4-byte object <02-00 00-00> (5 ms)
[ RUN      ] A.Skip
[  SKIPPED ] A.Skip (0 ms)
[ RUN      ] B.Bad
[ STICKY   ] B.Bad: cudaErrorIllegalAddress (an illegal memory access was encountered): the CUDA context is lost; ending the process (exit 86)
LOG
cat > "$h/part1.json" <<'JSON'
{"tests": 2, "failures": 0, "testsuites": [{"name": "B", "tests": 1, "failures": 0, "testsuite": [{"name": "Good", "status": "RUN", "result": "COMPLETED"}]},
 {"name": "C", "tests": 1, "failures": 0, "testsuite": [{"name": "Fine", "status": "RUN", "result": "COMPLETED"}]}]}
JSON
check "unfinished filter (negative)" 0 "-TrainerGpu*:A.One:P/F.Two/0:A.Skip:B.Bad" -- \
  "$root/scripts/gpu-device" helper unfinished-filter '-TrainerGpu*' "$h/part0.log"
check "unfinished filter (positive)" 0 "TrainerGpu*-A.One:P/F.Two/0:A.Skip:B.Bad" -- \
  "$root/scripts/gpu-device" helper unfinished-filter 'TrainerGpu*' "$h/part0.log"
check "crashers named" 0 "B.Bad (cudaErrorIllegalAddress" -- "$root/scripts/gpu-device" helper crashers "$h/part0.log"
: > "$h/empty.log"
check "no progress" 1 "" -- "$root/scripts/gpu-device" helper unfinished-filter '-X*' "$h/empty.log"
check "merge-tests" 0 "" -- "$root/scripts/gpu-device" helper merge-tests "$h/merged.json" "$h/part0.log:$h/none.json" \
  "$h/part1.log:$h/part1.json"
check "merged counts" 0 "" -- /usr/bin/python3 -c "
import json, sys
t = json.load(open(sys.argv[1]))
cases = {s['name'] + '.' + c['name']: c for s in t['testsuites'] for c in s['testsuite']}
assert t['tests'] == 6 and t['failures'] == 2, (t['tests'], t['failures'])
assert 'crashed: cudaErrorIllegalAddress' in cases['B.Bad']['failures'][0]['failure']
assert cases['P/F.Two/0']['failures'] and cases['A.Skip']['result'] == 'SKIPPED' and not cases['A.One'].get('failures')
assert 'B.Good' in cases and 'C.Fine' in cases" "$h/merged.json"
# passed (the kernels section's gate for the ordered-dQ study): every test of the name ran and
# passed; a failed or crashed one, or none run (a skip is not a run), is exit 1.
check "passed: all of them" 0 "" -- "$root/scripts/gpu-device" helper passed "$h/merged.json" A.One
check "passed: one crashed" 1 "" -- "$root/scripts/gpu-device" helper passed "$h/merged.json" B.
check "passed: only skipped" 1 "" -- "$root/scripts/gpu-device" helper passed "$h/merged.json" A.Skip
check "passed: none" 1 "" -- "$root/scripts/gpu-device" helper passed "$h/merged.json" OrderedDq
check "passed: two names" 0 "" -- "$root/scripts/gpu-device" helper passed "$h/merged.json" A.One C.Fine
check "passed: one of two ran none" 1 "" -- "$root/scripts/gpu-device" helper passed "$h/merged.json" A.One OrderedDq

# The interference section's JSON (interference-json): the fit, the profile's line and the plan kept,
# from files written by hand in the shapes `dhelix simulate --json`, `dhelix profile` and
# `dhelix plan --json` write; no fit: exit 1, the file still written with nulls.
cat > "$h/fit.json" <<'JSON'
{"step_s": 0.25, "compute_slowdown": 1.31, "comm_slowdown": 1.07, "interference_fit": {"calibration_pairs": 40, "held_back_pairs": 41, "held_back_median_error": 0.05, "held_back_median_error_without": 0.09}}
JSON
cat > "$h/profile.json" <<'JSON'
{"format": "dhelix-profile", "meta": {"machine": "gpu (16 cores), ops on cuda:0, backend local, 2 rank(s), ranks as threads of one process sharing cuda:0, 64 SMs each", "model": "m", "layout": "tp=2,sp,dp=1", "shapes": "B=4,T=1024", "timestamp": "t"}, "solo_fwd": [[0, 1, 1e-3]], "solo_bwd": [[0, 1, 2e-3], [1, 2, 1e-3]], "pairs": [[0, 1, 0, 1, 2.5e-3]]}
JSON
cat > "$h/plan.json" <<'JSON'
{"candidates": [{"source": "search", "blocks": 9, "predicted_s": 1e-3, "simulated_s": 1e-3, "measured_s": 1.2e-3}, {"source": "default", "blocks": 5, "predicted_s": 0, "simulated_s": 1.1e-3, "measured_s": 1.1e-3}], "chosen": 1, "validated": true}
JSON
echo '{"name": "H200"}' > "$h/device.json"
check "interference json" 0 "compute x1.31, collectives x1.07, plan kept default" -- "$root/scripts/gpu-device" helper \
  interference-json "$h/gi.json" "$h/fit.json" "$h/profile.json" "$h/plan.json" "$h/device.json" profile:0 fit:0 plan:0
check "interference json fields" 0 "" -- /usr/bin/python3 -c "
import json, sys
j = json.load(open(sys.argv[1]))
assert j['compute_slowdown'] == 1.31 and j['comm_slowdown'] == 1.07 and j['interference_fit']['held_back_pairs'] == 41
assert j['profile']['entries'] == 4 and 'ranks as threads' in j['profile']['machine'] and j['device']['name'] == 'H200'
assert j['plan']['kept'] == 'default' and j['plan']['searched_beats_default'] is False and j['plan']['validated']
assert j['steps'] == [{'step': 'profile', 'exit': 0}, {'step': 'fit', 'exit': 0}, {'step': 'plan', 'exit': 0}]" "$h/gi.json"
check "interference json without a fit" 1 "compute xNone" -- "$root/scripts/gpu-device" helper \
  interference-json "$h/gi2.json" "$h/none.json" "$h/profile.json" "$h/none.json" "$h/device.json" profile:124
check "interference json without a fit, written" 0 "" -- /usr/bin/python3 -c "
import json, sys
j = json.load(open(sys.argv[1]))
assert j['compute_slowdown'] is None and j['plan'] is None and j['steps'] == [{'step': 'profile', 'exit': 124}]" "$h/gi2.json"
cp "$h/gi.json" "$h/gpu-interference.json"
check "summary reads the interference" 0 "interference (tp = 2 profile, 4 entries): compute x1.31, collectives x1.07" -- \
  env GPU_SECTIONS=interference "$root/scripts/gpu-device" helper summary "$h" "$h"
# The kernels section's study rows beside the step's op they stand for: the ordered-dQ attention
# backward beside the step's "attention bwd" (a kernel bench JSON written by hand, its shape).
cat > "$h/gpu-kernels.json" <<'JSON'
{"device": "H200", "models": [{"model": "gpt2-124m", "batch": 16, "seq": 1024, "kernel_sum_s": 0.04, "gemm_s": 0.022, "attention_s": 0.0087, "rest_s": 0.0097, "kernel_sum_tokens_per_s": 409600, "gemm_flops_per_s": 5.5e14, "ops": [{"op": "attention bwd", "class": "attention", "s": 0.000590, "count": 12, "tflops": 109}, {"op": "attention bwd ordered dq", "class": "study", "s": 0.000420, "count": 12, "tflops": 153}], "gemm_algorithms": []}]}
JSON
check "summary: the ordered-dQ study row" 0 "study attention bwd ordered dq              420.0 us  vs  attention bwd    590.0 us" -- \
  env GPU_SECTIONS=kernels "$root/scripts/gpu-device" helper summary "$h" "$h"
# The train section's rows name the attention backward's form (--ordered-dq on: the default's Step again).
cat > "$h/gpu-train.json" <<'JSON'
{"device": "H200", "models": [{"model": "gpt2-124m", "gemm_algo": "heuristic", "fuse_epilogues": true, "epilogue_fusions": 36, "wgrad_gemm": "partials", "partial_wgrads_per_step": 24, "attention_bwd": "default", "batch": 16, "seq": 1024, "step_s": 0.040, "spread": [0.039, 0.041], "optimizer_s": 0.001, "tokens_per_s": 409600, "flops_per_token": 7.98e8, "mfu": 0.33, "last_loss": 10.5, "peak_bytes": 8809174080},
 {"model": "gpt2-124m", "gemm_algo": "heuristic", "fuse_epilogues": true, "epilogue_fusions": 36, "wgrad_gemm": "partials", "partial_wgrads_per_step": 24, "attention_bwd": "ordered_dq", "batch": 16, "seq": 1024, "step_s": 0.038, "spread": [0.037, 0.039], "optimizer_s": 0.001, "tokens_per_s": 431158, "flops_per_token": 7.98e8, "mfu": 0.35, "last_loss": 10.5, "peak_bytes": 8809174080}]}
JSON
check "summary: the train rows name the attention form" 0 "attn-bwd ordered_dq B=16 step 38.0 ms" -- \
  env GPU_SECTIONS=train "$root/scripts/gpu-device" helper summary "$h" "$h"
# A non-finite figure the bench wrote null (bench/BenchMain.h's json_finite) reads "null", and the
# row is still printed: a NaN loss must not hide the table.
cat > "$h/gpu-train.json" <<'JSON'
{"device": "H200", "models": [{"model": "gpt2-124m", "gemm_algo": "heuristic", "fuse_epilogues": true, "attention_bwd": "default", "batch": 16, "seq": 1024, "step_s": 0.040, "optimizer_s": null, "tokens_per_s": 409600, "mfu": null, "last_loss": null, "peak_bytes": 8809174080, "scratch_peak_bytes": 52428800}]}
JSON
check "summary: null figures" 0 "mfu null  peak 8.2 GiB (+0.05 scratch)  loss null" -- \
  env GPU_SECTIONS=train "$root/scripts/gpu-device" helper summary "$h" "$h"
# The SI section's rows: an overlap efficiency the bench leaves null (nothing left to hide) reads "null".
cat > "$h/gpu-si.json" <<'JSON'
{"device": "H200", "models": [{"model": "gpt2-124m", "sm_split": "ranks", "sms_per_rank": 66, "compute_s": 0.1, "comm_s": 0.08, "speedup": 1.21, "ideal_speedup": 1.5, "overlap_efficiency": 0.62, "extra_memory_fraction": 0.012, "sim_abs_error": 0.05},
 {"model": "llama-1b", "sm_split": "ranks", "sms_per_rank": 66, "compute_s": 0.2, "comm_s": 0.001, "speedup": 1.0, "ideal_speedup": 1.01, "overlap_efficiency": null, "extra_memory_fraction": 0.0, "sim_abs_error": null}]}
JSON
check "summary: an SI row" 0 "speedup 1.210 (ideal 1.500) overlap eff 0.62  extra mem +1.2%  sim_abs_error 0.050" -- \
  env GPU_SECTIONS=si "$root/scripts/gpu-device" helper summary "$h" "$h"
check "summary: a null overlap efficiency" 0 "speedup 1.000 (ideal 1.010) overlap eff null  extra mem +0.0%" -- \
  env GPU_SECTIONS=si "$root/scripts/gpu-device" helper summary "$h" "$h"
# pick-json: a bench's final line, else (killed) the rows of its model_result lines -- an object (the
# kernel bench) or a list of rows (the train bench) -- with the device from the script's own query
# and "partial"; exit 1 then, and with neither no file at all.
printf '%s\n' 'gpt2-124m B=16: step 40 ms' '{"model_result":{"model":"gpt2-124m","s":0.04}}' \
  '{"model_result":[{"model":"llama-1b","a":1},{"model":"llama-1b","a":2}]}' '{"model_res' > "$h/killed.log"
check "pick-json: rebuilt from model_result lines" 1 "no final JSON line; 3 row(s) kept" -- "$root/scripts/gpu-device" helper \
  pick-json "$h/killed.log" "$h/picked.json" "$h/device.json"
check "pick-json: the rebuilt file" 0 "" -- /usr/bin/python3 -c "
import json, sys
j = json.load(open(sys.argv[1]))
assert [m['model'] for m in j['models']] == ['gpt2-124m', 'llama-1b', 'llama-1b'] and 'partial' in j, j" "$h/picked.json"
echo '{"device": "H200", "models": [{"model": "gpt2-124m"}]}' >> "$h/killed.log"
check "pick-json: the final line" 0 "" -- "$root/scripts/gpu-device" helper pick-json "$h/killed.log" "$h/picked.json"
check "pick-json: the final line's file" 0 "" -- /usr/bin/python3 -c "
import json, sys
j = json.load(open(sys.argv[1]))
assert j == {'device': 'H200', 'models': [{'model': 'gpt2-124m'}]}, j" "$h/picked.json"
echo 'nothing' > "$h/empty-bench.log"
check "pick-json: nothing" 1 "no final JSON line and no model_result line" -- "$root/scripts/gpu-device" helper \
  pick-json "$h/empty-bench.log" "$h/picked.json"
if [ -e "$h/picked.json" ]; then echo "FAIL pick-json: nothing, yet the old file is still there"; fail=1; fi
# bench/gpu_preset.py turns that JSON into the preset's [device] interference keys (and refuses one
# without a fit), beside the kernel figures from a committed kernel bench.
check "gpu_preset.py interference keys" 0 "compute_slowdown = 1.31" -- /usr/bin/python3 "$root/bench/gpu_preset.py" \
  "$root/bench/results/gpu-kernels-2026-11-27-h100.json" --interference "$h/gi.json"
check "gpu_preset.py refuses no fit" 2 "has no interference fit" -- /usr/bin/python3 "$root/bench/gpu_preset.py" \
  "$root/bench/results/gpu-kernels-2026-11-27-h100.json" --interference "$h/gi2.json"

# `run` itself, on a stub bundle (DHELIX_GPU_BUNDLE, DHELIX_GPU_TMP): a test binary written here in
# bash that prints gtest's lines. Its first run passes A.One, skips A.Skip and hangs in B.Hang (the
# watchdog's "[ HUNG ]" line, exit 87, no JSON); the rerun (its filter must leave those three out)
# runs the other three -- passes C.Fine and F.Last, fails D.Fail -- lists the disabled E.DISABLED_X
# (status NOTRUN) and exits 1 with its JSON. Oracles: the merged tests.json (6 run, 2 failed, 1
# skipped, 1 disabled, B.Hang's failure naming the hang), the summary's lines, the exit status (the
# first part's, 87), DHELIX_REQUIRE_GPU=1 and a watchdog in the binary's environment, logs.tar.gz.
# Then the same with the first run 6 s long and a deadline that leaves no time for the rerun
# (50 s less the 25 kept): the three tests it never started are counted as not reached.
st=$h/stub
mkdir -p "$st/bin"
cat > "$st/bin/test_kernels_cuda" <<'STUB'
#!/usr/bin/env bash
filter="" json=""
for a in "$@"; do
  case $a in --gtest_filter=*) filter=${a#--gtest_filter=} ;; --gtest_output=json:*) json=${a#--gtest_output=json:} ;; esac
done
echo "call filter=$filter require=${DHELIX_REQUIRE_GPU:-} watchdog=${DHELIX_TEST_WATCHDOG_S:-}" >> "$STUB_CALLS"
if [[ $filter != *B.Hang* ]]; then
  echo "[==========] Running 6 tests from 6 test suites."
  echo "[ RUN      ] A.One"; echo "[       OK ] A.One (1 ms)"
  echo "[ RUN      ] A.Skip"; echo "[  SKIPPED ] A.Skip (0 ms)"
  echo "[ RUN      ] B.Hang"
  sleep "${STUB_SLEEP:-0}"
  echo "[ HUNG     ] B.Hang: still running after 90 s (watchdog); ending the process (exit 87)"
  exit 87
fi
echo "[==========] Running 3 tests from 3 test suites."
echo "[ RUN      ] C.Fine"; echo "[       OK ] C.Fine (1 ms)"
echo "[ RUN      ] D.Fail"; echo "x.cc:1: Failure"; echo "[  FAILED  ] D.Fail (1 ms)"
echo "[ RUN      ] F.Last"; echo "[       OK ] F.Last (1 ms)"
cat > "$json" <<'J'
{"tests": 3, "failures": 1, "disabled": 1, "testsuites": [
 {"name": "C", "tests": 1, "failures": 0, "testsuite": [{"name": "Fine", "status": "RUN", "result": "COMPLETED"}]},
 {"name": "D", "tests": 1, "failures": 1, "testsuite": [{"name": "Fail", "status": "RUN", "result": "COMPLETED", "failures": [{"failure": "x.cc:1", "type": ""}]}]},
 {"name": "E", "tests": 1, "failures": 0, "disabled": 1, "testsuite": [{"name": "DISABLED_X", "status": "NOTRUN", "result": "SUPPRESSED"}]},
 {"name": "F", "tests": 1, "failures": 0, "testsuite": [{"name": "Last", "status": "RUN", "result": "COMPLETED"}]}]}
J
exit 1
STUB
chmod +x "$st/bin/test_kernels_cuda"
/usr/bin/python3 -c "
import sys, tarfile
with tarfile.open(sys.argv[1], 'w:xz') as t:
    t.add(sys.argv[2], arcname='bin')" "$h/bundle.tar.xz" "$st/bin"
# DEADLINE [ENV...]: run -- its output in $rout, its status in $rrc, the stub's calls in $h/calls.
stub_run() {
  local deadline=$1
  shift
  rm -rf "$h/out" "$h/tmp" && mkdir -p "$h/out" "$h/tmp"
  : > "$h/calls"
  # (nvidia-smi and the driver probe find nothing here: their lines say so, and run goes on.)
  rout=$(cd "$root" && env OUT="$h/out" DHELIX_GPU_ONLY=tests DHELIX_GPU_DEADLINE_S="$deadline" \
    DHELIX_GPU_BUNDLE="$h/bundle.tar.xz" DHELIX_GPU_TMP="$h/tmp" STUB_CALLS="$h/calls" "$@" scripts/gpu-device run 2>&1)
  rrc=$?
}
want() {  # NAME TEXT: the run's output has TEXT
  if grep -qF -- "$2" <<<"$rout"; then echo "ok   run: $1"; else echo "FAIL run: $1: no '$2' in:"; echo "$rout" | tail -30; fail=1; fi
}
stub_run 0120
if [ $rrc -eq 87 ]; then echo "ok   run: exit status 87 (the first part's)"; else echo "FAIL run: exit $rrc, want 87"; fail=1; fi
want "the rerun" "part 0 ended with exit 87; crashed: B.Hang (still running after 90 s"
want "the counts" "tests.json: 6 selected, 2 failed, 1 skipped, 1 disabled"
want "the hang named" "FAILED B.Hang"
want "the failure named" "FAILED D.Fail"
want "the skip named" "skipped A.Skip"
want "the first exit" "(the section's first run ended with exit 87)"
want "an unstamped bundle" "UNSTAMPED BUNDLE"
check "run: the stub's calls" 0 "" -- /usr/bin/python3 -c "
import sys
calls = open(sys.argv[1]).read().splitlines()
assert len(calls) == 2, calls
assert calls[1].startswith('call filter=-TrainerGpu*:A.One:A.Skip:B.Hang '), calls[1]
for c in calls:
    assert ' require=1 ' in c, c
    assert int(c.rsplit('watchdog=', 1)[1]) >= 20, c" "$h/calls"
check "run: tests.json" 0 "" -- /usr/bin/python3 -c "
import json, sys
t = json.load(open(sys.argv[1]))
cases = {s['name'] + '.' + c['name']: c for s in t['testsuites'] for c in s['testsuite']}
assert (t['tests'], t['failures'], t['disabled'], t.get('not_reached')) == (6, 2, 1, None), t
assert sorted(cases) == ['A.One', 'A.Skip', 'B.Hang', 'C.Fine', 'D.Fail', 'F.Last'], sorted(cases)
assert 'crashed: still running after 90 s' in cases['B.Hang']['failures'][0]['failure'], cases['B.Hang']" "$h/out/tests.json"
if [ -s "$h/out/logs.tar.gz" ]; then echo "ok   run: logs.tar.gz"; else echo "FAIL run: no logs.tar.gz"; fail=1; fi
stub_run 50 STUB_SLEEP=6
if [ $rrc -eq 87 ]; then echo "ok   run, no time to rerun: exit status 87"; else echo "FAIL run, no time to rerun: exit $rrc, want 87"; fail=1; fi
want "no time for the rerun" "tests part 1: skipped, no time left"
want "not reached counted" "tests.json: 3 selected, 1 failed, 1 skipped, 0 disabled, 3 NOT REACHED"
rm -rf "$h"
exit $fail
