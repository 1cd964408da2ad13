#!/usr/bin/env bash
# `dhelix plan` from the command line. Oracle: the documented exit codes (0 with a cost model for
# the papers' shapes, no dataset or world needed; 2 with one clear message for bad input) and the
# files it promises (plan JSON + SVG beside it).
# `profile` and `plan` with --ranks threads (the layout's ranks as threads of one process, as ranks
# sharing one GPU run; here on the CPU): oracle, the same profile entries as the same layout run as
# processes under mpirun, and a validated plan with every candidate timed.
# Usage: cli_plan.sh DHELIX_BINARY [MPIRUN]
set -u
bin=$(readlink -f "$1")
mpirun=${2:-mpirun}
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
  # A profile measured with fp32 GEMMs and wire does not price a bf16 run (nor fits simulate's).
  expect2 profile_of_other_precision "precision: profile has 'fp32 GEMMs, fp32 wire', this run is 'bf16 GEMMs, bf16 wire'" -- \
    plan "${tiny[@]}" --training.precision bf16 --profile "$tmp/prof.json" --out "$tmp/x.json"
  expect2 profile_of_other_wire "this run is 'fp32 GEMMs, bf16 wire'" -- \
    simulate "${tiny[@]}" --comm.precision bf16 --cluster cpu-emulated --profile "$tmp/prof.json"
else bad tiny_profile "$(cat "$tmp/prof.log")"; fi
[ ! -e "$tmp/x.json" ] && ok nothing_written || bad nothing_written

# 3. Ranks as threads: a tp = 2 layer pair (two layers: folding pairs layer 1's forward with layer
# 2's backward), profiled in one process, then as two processes under mpirun.
tp2=(--model.n_layers 2 --model.d_model 64 --model.n_heads 4 --model.n_kv_heads 2 --model.ffn_hidden 128
     --model.seq_len 16 --model.vocab_size 200 --training.micro_batch_size 1 --training.threads 1 --parallel.tp 2)
entries() {  # the profile's entries without their times, and its machine line
  /usr/bin/python3 -c "import json,sys; p=json.load(open(sys.argv[1]))
print(json.dumps({k: [e[:-1] for e in p[k]] for k in ('solo_fwd', 'solo_bwd', 'pairs')}))" "$1"
}
out=$("$bin" profile "${tp2[@]}" --max-window 2 --repeats 1 --warmup 0 --ranks threads --out "$tmp/thr.json" 2>&1); rc=$?
if [ $rc -eq 0 ] && /usr/bin/python3 -c "import json,sys; m=json.load(open(sys.argv[1]))['meta']
assert m['machine'].endswith('backend local, 2 rank(s), ranks as threads of one process'), m['machine']
assert 'tp.ag.attn.qkv' in m['fwd_ops'] and 'tp.rs.mlp.fc.bwd' in m['bwd_ops']
import math; p = json.load(open(sys.argv[1]))
assert all(math.isfinite(e[-1]) and e[-1] > 0 for k in ('solo_fwd', 'solo_bwd', 'pairs') for e in p[k])" "$tmp/thr.json"; then
  ok threads_profile
  if out2=$(OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "$mpirun" --oversubscribe --bind-to none -np 2 \
            "$bin" profile "${tp2[@]}" --max-window 2 --repeats 1 --warmup 0 --out "$tmp/proc.json" 2>&1); then
    if [ "$(entries "$tmp/thr.json")" = "$(entries "$tmp/proc.json")" ]; then ok threads_profile_equals_processes
    else bad threads_profile_equals_processes "$(diff <(entries "$tmp/thr.json" | tr ']' '\n') <(entries "$tmp/proc.json" | tr ']' '\n') | head)"; fi
  else bad "threads_profile_equals_processes (mpirun failed)" "$out2"; fi
  out=$("$bin" plan "${tp2[@]}" --max-window 2 --repeats 1 --warmup 0 --profile "$tmp/thr.json" --ranks threads \
        --top-k 2 --out "$tmp/thr_plan.json" --json "$tmp/thr_cands.json" 2>&1); rc=$?
  if [ $rc -eq 0 ] && [ -s "$tmp/thr_plan.json" ] && /usr/bin/python3 -c "import json,sys; j=json.load(open(sys.argv[1]))
assert j['validated'] and len(j['candidates']) >= 2 and all(c['measured_s'] > 0 for c in j['candidates'])" "$tmp/thr_cands.json"; then
    ok threads_plan_validated
  else bad "threads_plan_validated (exit $rc)" "$out"; fi
else bad "threads_profile (exit $rc)" "$out"; fi
if out=$(OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "$mpirun" --oversubscribe --bind-to none -np 2 \
         "$bin" profile "${tp2[@]}" --ranks threads --out "$tmp/y.json" 2>&1); then
  bad "threads_under_mpirun (exit 0)" "$out"
elif grep -q "started by mpirun" <<<"$out"; then ok threads_under_mpirun
else bad "threads_under_mpirun (no message)" "$out"; fi
expect2 sm_split_without_gpu "it needs --ranks threads, training.device=cuda" -- \
  profile "${tp2[@]}" --ranks threads --sm-split off --out "$tmp/y.json"
expect2 ranks_with_cost_model "with --cost-model none is" -- plan "${tp2[@]}" --cost-model h100-8gpu --ranks threads \
  --out "$tmp/y.json"
expect2 ranks_without_validation "with --no-validate none is" -- plan "${tp2[@]}" --profile "$tmp/thr.json" --no-validate \
  --ranks threads --out "$tmp/y.json"
# (--ranks threads with comm.gpu_transport = nccl on a GPU exits 2 too; here the config refuses the
# GPU itself first, as this machine has none.)
expect2 ranks_bad_value "--ranks 'bogus' must be processes or threads" -- profile "${tp2[@]}" --ranks bogus --out "$tmp/y.json"
[ ! -e "$tmp/y.json" ] && ok nothing_written_threads || bad nothing_written_threads

echo "$passes passed, $fails failed"
[ $fails -eq 0 ]
