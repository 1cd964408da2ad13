#!/usr/bin/env bash
# `dhelix tune`: a good run prints a ranked table and writes JSON; bad input exits 2 naming the value
# and a hint. Oracle: the documented exit codes (0 success, 2 bad input), the count of layouts of 4
# ranks (6 Megatron tp x pp x dp + 9 grids x*y*z*dp other than pure dp = 15), the flag values named.
# Usage: cli_tune.sh DHELIX_BINARY  (no data, no hardware)
set -u
bin=$1
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fails=0; passes=0
ok()   { passes=$((passes+1)); echo "ok   $1"; }
fail() { fails=$((fails+1)); echo "FAIL $1"; }

expect_bad() {  # expect_bad NAME PATTERN... -- ARGS
  local name=$1; shift; local pats=()
  while [ "$1" != "--" ]; do pats+=("$1"); shift; done; shift
  out=$("$bin" tune "$@" 2>&1); rc=$?
  local good=1
  [ "$rc" -eq 2 ] || { echo "  exit code $rc, expected 2"; good=0; }
  for p in "${pats[@]}"; do grep -qF -- "$p" <<<"$out" || { echo "  message lacks '$p'"; good=0; }; done
  if [ $good -eq 1 ]; then ok "$name"; else fail "$name"; echo "$out" | tail -10; fi
}

# 1. A ranked table of the 15 layouts of 4 ranks, and the JSON beside it.
out=$("$bin" tune --model gpt2-124m --gpus 4 --cluster cpu-emulated --global-batch 8 --seq 256 --top 20 \
      --json "$tmp/t.json" 2>&1); rc=$?
rows=$(grep -cE '^ +[0-9]+  (tp|x)=' <<<"$out")
excl=$(grep -cE '^  (tp|x)=' <<<"$out")
if [ $rc -eq 0 ] && grep -q "^   1  " <<<"$out" && [ $((rows + excl)) -eq 15 ] && [ -s "$tmp/t.json" ] \
   && /usr/bin/python3 -c "import json,sys; j=json.load(open(sys.argv[1])); assert len(j['ranked'])+len(j['excluded'])==15; s=[r['step_s'] for r in j['ranked']]; assert s==sorted(s)" "$tmp/t.json"; then
  ok ranked_table_and_json
else
  fail ranked_table_and_json; echo "exit $rc rows $rows excluded $excl"; echo "$out" | tail -20
fi

# 2. A path works as --cluster; an indivisible batch excludes layouts with the reason.
out=$("$bin" tune --model gpt2-124m --gpus 4 --cluster "$(dirname "$0")/../../configs/clusters/perlmutter-a100.toml" \
      --global-batch 2 --seq 256 2>&1); rc=$?
if [ $rc -eq 0 ] && grep -q "batch 2 is not divisible by dp = 4" <<<"$out"; then ok excluded_reason; else
  fail excluded_reason; echo "$out" | tail -10; fi

# 3. --help exits 0.
out=$("$bin" tune --help 2>&1); rc=$?
if [ $rc -eq 0 ] && grep -q -- "--paper-compat" <<<"$out"; then ok help; else fail help; fi

# 4. Bad input: exit 2, the value named, a hint.
expect_bad unknown_model "unknown model preset 'gpt5'" "tune --help" -- --model gpt5 --gpus 4 --cluster cpu-emulated
expect_bad unknown_cluster "unknown cluster preset 'moon'" "perlmutter-a100" "hint" -- --model gpt2-124m --gpus 4 --cluster moon
expect_bad zero_gpus "--gpus expects a whole number >= 1, got '0'" -- --model gpt2-124m --gpus 0 --cluster cpu-emulated
expect_bad non_numeric "--top expects a whole number >= 1, got 'many'" -- --model gpt2-124m --gpus 4 --cluster cpu-emulated --top many
expect_bad missing "--cluster is required" -- --model gpt2-124m --gpus 4
expect_bad no_layout "no layout of 4 ranks" "hint" -- --model gpt2-124m --gpus 4 --cluster cpu-emulated --global-batch 3 --micro-batch-size 2
expect_bad bf16_on_cpu "cpu-emulated" "--precision" -- --model gpt2-124m --gpus 4 --cluster cpu-emulated --precision bf16
expect_bad measure_gemm_gpu "core_share" -- --model gpt2-124m --gpus 4 --cluster perlmutter-a100 --measure-gemm
expect_bad confirm_no_config "--confirm needs --config" -- --model gpt2-124m --gpus 4 --cluster cpu-emulated --confirm 3
expect_bad confirm_one_step "--confirm expects a whole number >= 2" -- --model gpt2-124m --gpus 4 --cluster cpu-emulated \
  --confirm 1 --config configs/demo.toml
expect_bad only_unknown "--only" "not a layout of 4 ranks" -- --model gpt2-124m --gpus 4 --cluster cpu-emulated --only "tp=3 pp=1 dp=1"
# --measure-gemm on this machine's preset: GEMMs timed for their shapes (oracle: it ranks and exits 0).
out=$("$bin" tune --model gpt2-124m --d-model 128 --layers 1 --heads 4 --seq 32 --gpus 2 --cluster cpu-emulated \
      --measure-gemm 2>&1) && grep -q "x=2 y=1 z=1 dp=1" <<<"$out" && ok measure_gemm || { echo "FAIL measure_gemm"; echo "$out" | tail -5; fails=$((fails+1)); }

echo "$passes passed, $fails failed"
[ $fails -eq 0 ]
