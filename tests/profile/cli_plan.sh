#!/usr/bin/env bash
# `dhelix plan` from the command line. Oracle: the documented exit codes (0 with a cost model for
# the papers' shapes, no dataset or world needed; 2 with one clear message for bad input) and the
# files it promises (plan JSON + SVG beside it).
# Usage: cli_plan.sh DHELIX_BINARY
set -u
bin=$(readlink -f "$1")
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
fails=0; passes=0
ok() { passes=$((passes+1)); echo "ok   $1"; }
bad() { fails=$((fails+1)); echo "FAIL $1"; [ -n "${2:-}" ] && echo "$2" | tail -15; }

expect2() {  # expect2 NAME PATTERN -- ARGS
  local name=$1 pat=$2; shift 3
  out=$("$bin" "$@" 2>&1); rc=$?
  if [ "$rc" -eq 2 ] && grep -q -- "$pat" <<<"$out"; then ok "$name"; else bad "$name (exit $rc, want 2 and '$pat')" "$out"; fi
}

# 1. Cost model, Llama-70B layer pair with tp=8: exit 0, plan JSON and SVG written.
out=$("$bin" plan --model.preset llama-70b --parallel.tp 8 --training.micro_batch_size 1 --model.seq_len 4096 \
      --cost-model h100-8gpu --top-k 3 --out "$tmp/p70/plan.json" 2>&1); rc=$?
if [ $rc -eq 0 ] && [ -s "$tmp/p70/plan.json" ] && [ -s "$tmp/p70/plan.svg" ] && grep -q "dhelix-si-plan" "$tmp/p70/plan.json"; then
  ok cost_model_70b
else bad "cost_model_70b (exit $rc)" "$out"; fi

# 1b. Context parallelism (cp = 2 beside tp = 8, a 8192-token sequence): the ring's steps are planned.
out=$("$bin" plan --model.preset llama-70b --parallel.tp 8 --parallel.cp 2 --training.micro_batch_size 1 \
      --model.seq_len 8192 --cost-model h100-8gpu --top-k 2 --out "$tmp/pcp/plan.json" 2>&1); rc=$?
if [ $rc -eq 0 ] && [ -s "$tmp/pcp/plan.json" ] && grep -q "cp send_recv cp.ring.kv.0" <<<"$out" \
   && grep -q "cp.ring.dkv.1" <<<"$out"; then
  ok cost_model_cp
else bad "cost_model_cp (exit $rc)" "$out"; fi

# 2. Bad input: a missing profile file, an unknown preset, neither source, a profile of another model.
expect2 missing_profile "does not exist" -- plan --profile "$tmp/none.json" --out "$tmp/x.json"
expect2 unknown_preset "unknown cluster preset .tpu-v9." -- plan --cost-model tpu-v9 --out "$tmp/x.json"
expect2 no_source "exactly one of" -- plan --out "$tmp/x.json"
tiny=(--model.n_layers 1 --model.d_model 64 --model.n_heads 4 --model.n_kv_heads 2 --model.ffn_hidden 128
      --model.seq_len 16 --model.vocab_size 200 --training.micro_batch_size 1 --training.threads 1)
if "$bin" profile "${tiny[@]}" --max-window 1 --repeats 1 --warmup 0 --out "$tmp/prof.json" > "$tmp/prof.log" 2>&1; then
  ok tiny_profile
  expect2 profile_of_other_model "profile was measured for another run" -- \
    plan "${tiny[@]}" --model.d_model 128 --profile "$tmp/prof.json" --out "$tmp/x.json"
else bad tiny_profile "$(cat "$tmp/prof.log")"; fi
[ ! -e "$tmp/x.json" ] && ok nothing_written || bad nothing_written

echo "$passes passed, $fails failed"
[ $fails -eq 0 ]
