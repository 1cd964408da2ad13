#!/usr/bin/env bash
# A first SIGTERM honoured wherever it arrives (issue 36, item 4): before, only the training loop
# read it, and a signal during setup, evaluation, the final save, sampling, data preparation or
# profiling was ignored until a second one. Oracles: the exit code 143 (128 + SIGTERM), the message
# naming where the run stopped, the files left behind (the checkpoint `latest` names, no dataset or
# profile half-written, no temporary files), and for a stop during an evaluation a resume whose
# loss rows equal an uninterrupted run's bitwise.
# The signal is raised at a named point by the test hook DHELIX_FAULT_INJECT=0:POINT:sigterm (so
# the point is known), or sent from outside once the command's log shows it is in the phase.
# Usage: cli_stop_signal.sh DHELIX_BINARY SOURCE_DIR  (needs the data made by scripts/setup)
set -u
bin=$1; cd "$2"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fails=0; passes=0
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
small=(--config configs/demo.toml --model.n_layers 2 --model.seq_len 32 --training.micro_batch_size 2
       --training.threads 1 --training.warmup_steps 2 --training.steps 4 --training.eval_interval 2
       --training.eval_batches 2 --training.sample_tokens 8)
ok() { passes=$((passes+1)); echo "ok   $1"; }
bad() { fails=$((fails+1)); echo "FAIL $1"; [ -n "${2:-}" ] && echo "$2" | tail -15; }
latest() { cat "$1/checkpoints/latest" 2>/dev/null | tr -d '\n'; }
loss_rows() { grep -o '"loss":[^,]*' "$1"; }

# The uninterrupted run the resumed ones are compared with.
"$bin" train "${small[@]}" --output.dir "$tmp/full" >"$tmp/full.log" 2>&1 || bad "setup: uninterrupted run" "$(cat "$tmp/full.log")"

# point  expected message  expected latest
check_point() {
  local point=$1 msg=$2 want_latest=$3
  DHELIX_FAULT_INJECT=0:$point:sigterm "$bin" train "${small[@]}" --output.dir "$tmp/$point" >"$tmp/$point.log" 2>&1
  local rc=$?
  if [ $rc -eq 143 ] && grep -q "$msg" "$tmp/$point.log" && [ "$(latest "$tmp/$point")" = "$want_latest" ]; then
    ok "train_sigterm_at_$point"
  else
    bad "train_sigterm_at_$point (exit $rc, latest '$(latest "$tmp/$point")', want '$want_latest')" "$(tail -5 "$tmp/$point.log")"
  fi
}
# Setup and the evaluation before step 1: no step ran, nothing to save, no checkpoint.
check_point setup "stopped by SIGTERM before step 1: no step ran" ""
check_point eval0 "stopped by SIGTERM before step 1: no step ran" ""
# An evaluation after step 2 is cut short; step 2 is saved, and the resumed run matches bitwise.
check_point eval "stopped by SIGTERM after step 2: saved" step_00000002
grep -q "step 2 | val loss" "$tmp/eval.log" && bad "eval: the evaluation ran to its end" || ok eval_cut_short
"$bin" train "${small[@]}" --output.dir "$tmp/eval" --checkpoint.resume latest >>"$tmp/eval.log" 2>&1 \
  || bad "resume after a stop during evaluation" "$(tail -5 "$tmp/eval.log")"
if [ "$(loss_rows "$tmp/full/metrics.jsonl")" = "$(loss_rows "$tmp/eval/metrics.jsonl")" ]; then ok eval_stop_resume_bitwise
else bad eval_stop_resume_bitwise "$(diff <(loss_rows "$tmp/full/metrics.jsonl") <(loss_rows "$tmp/eval/metrics.jsonl"))"; fi
# During the final save: the save completes, then the run stops (no sample).
check_point save "stopped by SIGTERM after the last step, its checkpoint saved" step_00000004
grep -q "^sample:" "$tmp/save.log" && bad "save: sampled after the stop" || ok save_stop_skips_sample
# During the final sample: the text is cut short; the checkpoint was saved before.
check_point sample "stopped by SIGTERM while sampling" step_00000004

# dhelix sample from the saved run, SIGTERM sent while it generates a long text: exit 143 and the
# text so far.
"$bin" sample --config configs/demo.toml --model.n_layers 2 --model.seq_len 32 --output.dir "$tmp/full" \
  --checkpoint.dir "$tmp/full/checkpoints" --tokens 100000 >"$tmp/gen.log" 2>"$tmp/gen.err" &
pid=$!
# Sent once the text has begun (the sampler flushes each piece), not after a fixed sleep: on a loaded
# machine two seconds were not always enough to load the checkpoint, and a signal before the handler
# is installed ends the process without the message (a CI run of 2026-11-28 failed so). Its own file
# names: check_point sample's train log is $tmp/sample.log, and waiting on that (already full) file
# sent the signal before the sampler had even opened its stderr (CI runs of 2026-11-29 failed so).
for _ in $(seq 1 1200); do [ -s "$tmp/gen.log" ] && break; sleep 0.1; done
kill -TERM $pid; wait $pid; rc=$?
if [ $rc -eq 143 ] && grep -q "stopped by SIGTERM: the text above is cut short" "$tmp/gen.err" && [ -s "$tmp/gen.log" ]; then
  ok sample_sigterm
else bad "sample_sigterm (exit $rc)" "$(cat "$tmp/gen.err")"; fi

# dhelix data prepare, SIGTERM while it tokenizes a corpus (ten copies of the KJV, a few seconds):
# exit 143 naming the phase, no .bin/.idx written and no temporary .bin left.
mkdir -p "$tmp/data"
for _ in 1 2 3 4 5 6 7 8 9 10; do cat data/kjv.txt; done >"$tmp/data/big.txt"
cp data/kjv_bpe.model "$tmp/data/tok.model"; touch "$tmp/data/tok.model"   # newer than the corpus: not retrained
"$bin" data prepare --config configs/demo.toml --data.corpus "$tmp/data/big.txt" --data.tokenizer "$tmp/data/tok.model" \
  --data.prefix "$tmp/data/big" >"$tmp/data.log" 2>&1 &
pid=$!
for _ in $(seq 1 300); do grep -q "tokenizing" "$tmp/data.log" && break; sleep 0.02; done
kill -TERM $pid; wait $pid; rc=$?
left=$(cd "$tmp/data" && ls | tr '\n' ' ')
if [ $rc -eq 143 ] && grep -q "stopped by SIGTERM during data prepare (tokenizing" "$tmp/data.log" \
   && [ "$left" = "big.txt tok.model " ]; then ok data_prepare_sigterm
else bad "data_prepare_sigterm (exit $rc, files: $left)" "$(tail -3 "$tmp/data.log")"; fi

# dhelix profile, SIGTERM once it times entries: exit 143 naming the phase, no profile written.
profile_sigterm() {  # NAME OUT ARGS...: the profile of ARGS, stopped while it times entries
  local name=$1 out=$2; shift 2
  "$bin" profile "$@" --repeats 20 --out "$out" >"$out.log" 2>&1 &
  local pid=$! rc
  for _ in $(seq 1 600); do grep -q "entries x" "$out.log" && break; sleep 0.05; done
  sleep 0.5
  kill -TERM $pid; wait $pid; rc=$?
  if [ $rc -eq 143 ] && grep -q "stopped by SIGTERM during profiling" "$out.log" && [ ! -e "$out" ]; then
    ok "$name"
  else bad "$name (exit $rc)" "$(tail -3 "$out.log")"; fi
}
profile_sigterm profile_sigterm "$tmp/profile.json" --config configs/demo.toml --model.n_layers 2 --training.threads 1

# The same with tp = 2's ranks as threads of the one process (--ranks threads): every rank thread
# stops, exit 143 naming the phase, no profile written. Then `plan --ranks threads` on a profile,
# SIGTERM while it times the candidates: exit 143 within 10 s (comm.timeout_s: no rank thread left
# waiting in a collective), no plan written. (A stop that reaches one rank thread in the search and
# the other in the timing, which the rethrow in apps/CmdPlan.cc settle_error ends, is a race this
# test does not force.)
tp2=(--config configs/demo.toml --model.n_layers 2 --training.threads 1 --parallel.tp 2 --comm.timeout_s 10)
profile_sigterm profile_threads_sigterm "$tmp/tprofile.json" "${tp2[@]}" --ranks threads
if "$bin" profile "${tp2[@]}" --ranks threads --max-window 2 --repeats 1 --warmup 0 --out "$tmp/tp.json" \
     >"$tmp/tp.log" 2>&1; then
  "$bin" plan "${tp2[@]}" --ranks threads --profile "$tmp/tp.json" --max-window 2 --repeats 2000 \
    --out "$tmp/tplan.json" >"$tmp/tplan.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 600); do grep -q "fitting the co-execution" "$tmp/tplan.log" && break; sleep 0.05; done
  sleep 1
  start=$SECONDS
  kill -TERM $pid; wait $pid; rc=$?
  if [ $rc -eq 143 ] && [ $((SECONDS - start)) -lt 10 ] && grep -q "stopped by SIGTERM" "$tmp/tplan.log" \
     && [ ! -e "$tmp/tplan.json" ]; then
    ok plan_threads_sigterm
  else bad "plan_threads_sigterm (exit $rc after $((SECONDS - start)) s)" "$(tail -3 "$tmp/tplan.log")"; fi
else bad "plan_threads_sigterm (no profile)" "$(tail -3 "$tmp/tp.log")"; fi

# dhelix tune --confirm, SIGTERM while its training run is in flight: the signal is passed to the run,
# which saves and stops (exit 143, a checkpoint); tune then stops naming the round and the layout.
"$bin" tune --model demo --gpus 1 --cluster cpu-emulated --top 1 --confirm 100000 --config configs/demo.toml \
  --launch env --workdir "$tmp/tune" >"$tmp/tune.log" 2>&1 &
pid=$!
for _ in $(seq 1 1200); do grep -qs '"step":2,' "$tmp"/tune/*/metrics.jsonl && break; sleep 0.1; done
kill -TERM $pid; wait $pid; rc=$?
run=$(ls -d "$tmp"/tune/*/ 2>/dev/null | head -1)
if [ $rc -eq 143 ] && grep -q "stopped by SIGTERM during tune --confirm (round 1 of 1" "$tmp/tune.log" \
   && [ -n "$run" ] && [ -n "$(latest "$run")" ] && grep -q "stopped by SIGTERM after step" "$tmp"/tune/*.log; then
  ok tune_confirm_sigterm
else bad "tune_confirm_sigterm (exit $rc, run '$run')" "$(tail -3 "$tmp/tune.log"; tail -3 "$tmp"/tune/*.log)"; fi

echo "$passes passed, $fails failed"
[ $fails -eq 0 ]
