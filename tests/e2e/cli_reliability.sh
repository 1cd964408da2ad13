#!/usr/bin/env bash
# Reliability of `dhelix train` (issue 17): nothing silently wrong, nothing lost. Each case was a
# path that exited 0 with a wrong result, or lost work; each now ends as README's exit-code table
# says. Oracles: the documented exit codes (0 success, 2 bad input, 3 diverged, 128+N stopped by
# signal N), the names the messages must give, the files left behind (checkpoints, `latest`,
# metrics rows), and for the graceful stop a bitwise comparison: the loss rows of a run stopped
# by SIGTERM and resumed equal those of an uninterrupted run.
# Usage: cli_reliability.sh DHELIX_BINARY SOURCE_DIR  (needs the data made by scripts/setup)
set -u
bin=$1; cd "$2"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fails=0; passes=0
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
# A tiny, quick run of the demo model: 2 layers, short windows, no eval, no sample.
small=(--config configs/demo.toml --model.n_layers 2 --model.seq_len 32 --training.micro_batch_size 2
       --training.eval_interval 0 --training.sample_tokens 0 --training.threads 1 --training.warmup_steps 2)

ok() { passes=$((passes+1)); echo "ok   $1"; }
bad() { fails=$((fails+1)); echo "FAIL $1"; [ -n "${2:-}" ] && echo "$2" | tail -15; }
# expect NAME CODE PATTERN... -- ARGS: exit code CODE and every PATTERN in the output.
expect() {
  local name=$1 code=$2; shift 2; local pats=()
  while [ "$1" != "--" ]; do pats+=("$1"); shift; done; shift
  out=$("$bin" "$@" 2>&1); rc=$?
  local why=""
  [ "$rc" -eq "$code" ] || why="exit code $rc, expected $code"
  for p in "${pats[@]}"; do grep -q -- "$p" <<<"$out" || why="$why; message lacks '$p'"; done
  if [ -z "$why" ]; then ok "$name"; else bad "$name: $why" "$out"; fi
}
latest() { cat "$1/checkpoints/latest" 2>/dev/null | tr -d '\n'; }

# 1. A checkpoint of a deeper model is refused, naming the extra tensors and the key that differs
#    (before: loaded, dropped two layers, saved the 2-layer model as latest, exit 0).
"$bin" train "${small[@]}" --model.n_layers 4 --training.steps 1 --output.dir "$tmp/deep" >"$tmp/deep.log" 2>&1 \
  || bad "setup deep run" "$(cat "$tmp/deep.log")"
expect extra_layers_refused 2 "model.layers.2" "n_layers = 4 in the checkpoint, 2 in this run" -- \
  train "${small[@]}" --training.steps 3 --output.dir "$tmp/deep" --checkpoint.resume latest
[ "$(latest "$tmp/deep")" = step_00000001 ] && ok extra_layers_latest_kept || bad "latest moved: $(latest "$tmp/deep")"
expect extra_layers_refused_by_sample 2 "model.layers.2" -- \
  sample "${small[@]}" --output.dir "$tmp/deep" --tokens 4

# 2. A byte flipped inside tensor data fails the checksum (before: loaded without complaint).
cp -r "$tmp/deep" "$tmp/flip"
f="$tmp/flip/checkpoints/step_00000001/model.safetensors"
size=$(stat -c %s "$f"); off=$((size - 100))
printf '\x5a' | dd of="$f" bs=1 seek=$off conv=notrunc status=none
expect flipped_byte 2 "fails its checksum" "model.safetensors" -- \
  train "${small[@]}" --model.n_layers 4 --training.steps 3 --output.dir "$tmp/flip" --checkpoint.resume latest

# 3. NaN mid-run, policy skip: step 3's gradient is poisoned; the step is skipped and counted, the
#    run goes on and ends 0 with finite checkpoints (before: NaN reached the weights).
DHELIX_FAULT_INJECT=0:3:nan-grad "$bin" train "${small[@]}" --training.steps 5 --checkpoint.interval 1 \
  --checkpoint.keep 0 --output.dir "$tmp/skip" >"$tmp/skip.log" 2>&1; rc=$?
if [ $rc -eq 0 ] && grep -q "step     3/5 .*SKIPPED" "$tmp/skip.log" \
   && grep -q '"skipped":true' "$tmp/skip/metrics.jsonl" && grep -q '"skipped_steps":1,"step":5' "$tmp/skip/metrics.jsonl" \
   && [ "$(latest "$tmp/skip")" = step_00000005 ]; then ok nan_skip
else bad "nan_skip (exit $rc)" "$(cat "$tmp/skip.log")"; fi

# 4. NaN mid-run, policy stop: exit 3 naming the step and the tensor; `latest` stays at step 2.
DHELIX_FAULT_INJECT=0:3:nan-grad "$bin" train "${small[@]}" --training.steps 5 --checkpoint.interval 1 \
  --training.nonfinite stop --output.dir "$tmp/stop2" >"$tmp/stop2.log" 2>&1; rc=$?
if [ $rc -eq 3 ] && grep -q "step 3: loss" "$tmp/stop2.log" && grep -q "first non-finite gradient: 'layers\.[0-9]" "$tmp/stop2.log" \
   && grep -q "training.nonfinite=stop" "$tmp/stop2.log" \
   && [ "$(latest "$tmp/stop2")" = step_00000002 ] && [ ! -e "$tmp/stop2/checkpoints/step_00000003" ]; then ok nan_stop_latest_kept
else bad "nan_stop_latest_kept (exit $rc, latest $(latest "$tmp/stop2"))" "$(cat "$tmp/stop2.log")"; fi

# 5. A NaN weight makes every later step bad: skipped nonfinite_max_skips times in a row, then exit
#    3 with no checkpoint written; and a checkpoint due meanwhile is refused (exit 3), `latest` stays
#    at the last good one (before: "loss nan" every step, exit 0, the NaN checkpoint became latest).
DHELIX_FAULT_INJECT=0:2:nan-weight "$bin" train "${small[@]}" --training.steps 8 --training.nonfinite_max_skips 3 \
  --output.dir "$tmp/nanw" >"$tmp/nanw.log" 2>&1; rc=$?
if [ $rc -eq 3 ] && grep -q "3 steps in a row" "$tmp/nanw.log" && [ ! -e "$tmp/nanw/checkpoints/latest" ]; then ok nan_weight_stops
else bad "nan_weight_stops (exit $rc)" "$(cat "$tmp/nanw.log")"; fi
DHELIX_FAULT_INJECT=0:2:nan-weight "$bin" train "${small[@]}" --training.steps 8 --checkpoint.interval 1 \
  --checkpoint.keep 0 --output.dir "$tmp/nanw2" >"$tmp/nanw2.log" 2>&1; rc=$?
if [ $rc -eq 3 ] && grep -q "refusing to write a checkpoint at step 2" "$tmp/nanw2.log" \
   && [ "$(latest "$tmp/nanw2")" = step_00000001 ] && [ ! -e "$tmp/nanw2/checkpoints/step_00000002" ]; then ok nan_checkpoint_refused
else bad "nan_checkpoint_refused (exit $rc, latest $(latest "$tmp/nanw2"))" "$(cat "$tmp/nanw2.log")"; fi

# 6. A fresh run into a directory holding an earlier run refuses (before: truncated metrics and
#    moved latest back); --output.overwrite starts over.
before=$(md5sum "$tmp/skip/metrics.jsonl")
expect fresh_into_old_dir 2 "holds an earlier run" "checkpoint.resume latest" "output.overwrite" -- \
  train "${small[@]}" --training.steps 2 --output.dir "$tmp/skip"
[ "$before" = "$(md5sum "$tmp/skip/metrics.jsonl")" ] && ok old_metrics_untouched || bad old_metrics_untouched
expect overwrite_starts_over 0 "output.overwrite: deleted" -- \
  train "${small[@]}" --training.steps 2 --output.dir "$tmp/skip" --output.overwrite true
[ "$(latest "$tmp/skip")" = step_00000002 ] && [ "$(ls -d "$tmp"/skip/checkpoints/step_* | wc -l)" = 1 ] \
  && [ "$(wc -l <"$tmp/skip/metrics.jsonl")" = 2 ] && ok overwrite_clean || bad "overwrite_clean: $(ls "$tmp/skip/checkpoints")"

# 7. A config path that is a directory is refused (before: a full run on defaults).
expect config_is_directory 2 "not a regular file" -- train --config configs --output.dir "$tmp/cfgdir"

# 8. Tokenizer and data checked before step 1: a broken tokenizer, token ids over the vocabulary,
#    an unwritable trace path (before: found after training, or at the first save).
printf 'not a sentencepiece model' >"$tmp/broken.model"
expect broken_tokenizer 2 "broken.model" "sample_tokens 0" -- \
  train "${small[@]}" --training.sample_tokens 8 --data.tokenizer "$tmp/broken.model" --output.dir "$tmp/tok"
expect token_ids_over_vocab 2 "token id" "model.vocab_size=1000" -- \
  train "${small[@]}" --model.vocab_size 1000 --output.dir "$tmp/vocab"
touch "$tmp/afile"
expect unwritable_trace 2 "output.trace" "afile" -- \
  train "${small[@]}" --output.trace "$tmp/afile/trace.json" --output.dir "$tmp/trace"
for d in tok vocab trace; do [ -e "$tmp/$d/metrics.jsonl" ] && bad "$d: a step ran before the check"; done

# 9. A model too large for this machine's memory: exit 2 with the figures (before: exit 1).
expect too_large 2 "available" "per rank" -- \
  train "${small[@]}" --model.d_model 65536 --model.n_heads 64 --model.n_kv_heads 64 --model.ffn_hidden 262144 \
  --output.dir "$tmp/huge"

# 10. SIGTERM mid-run: the step finishes, a checkpoint is saved, exit 143; the resumed run's loss
#     rows equal an uninterrupted run's bitwise, and metrics keep no duplicate rows. (a) The
#     signal raised in step 5 by the test hook, so the step is known; (b) one sent from outside.
"$bin" train "${small[@]}" --training.steps 12 --output.dir "$tmp/full" >"$tmp/full.log" 2>&1 \
  || bad "setup uninterrupted run" "$(cat "$tmp/full.log")"
DHELIX_FAULT_INJECT=0:5:sigterm "$bin" train "${small[@]}" --training.steps 12 --output.dir "$tmp/term" \
  >"$tmp/term.log" 2>&1; rc=$?
if [ $rc -eq 143 ] && grep -q "stopped by SIGTERM after step 5" "$tmp/term.log" && [ "$(latest "$tmp/term")" = step_00000005 ]
then ok sigterm_saves; else bad "sigterm_saves (exit $rc, latest '$(latest "$tmp/term")')" "$(cat "$tmp/term.log")"; fi
"$bin" train "${small[@]}" --training.steps 12 --output.dir "$tmp/term" --checkpoint.resume latest >>"$tmp/term.log" 2>&1 \
  || bad "resume after SIGTERM" "$(tail -5 "$tmp/term.log")"
loss_rows() { grep -o '"loss":[^,]*' "$1" ; }
if [ "$(loss_rows "$tmp/full/metrics.jsonl")" = "$(loss_rows "$tmp/term/metrics.jsonl")" ] \
   && [ "$(grep -c '"loss"' "$tmp/term/metrics.jsonl")" = 12 ]; then ok sigterm_resume_bitwise
else bad "sigterm_resume_bitwise" "$(diff <(loss_rows "$tmp/full/metrics.jsonl") <(loss_rows "$tmp/term/metrics.jsonl"))"; fi
"$bin" train "${small[@]}" --training.steps 1000000 --output.dir "$tmp/term2" >"$tmp/term2.log" 2>&1 &
pid=$!
for _ in $(seq 1 600); do grep -q '"step":3,' "$tmp/term2/metrics.jsonl" 2>/dev/null && break; sleep 0.1; done
kill -TERM $pid; wait $pid; rc=$?
if [ $rc -eq 143 ] && grep -q "stopped by SIGTERM" "$tmp/term2.log" && [ -n "$(latest "$tmp/term2")" ]; then ok sigterm_external
else bad "sigterm_external (exit $rc)" "$(tail -5 "$tmp/term2.log")"; fi

# 11. A kill -9 mid-prune (an older build deleting a step directory in place, or this one's
#     renamed .del-<pid>) leaves debris; the next start removes it and keep counts every step.
d="$tmp/full/checkpoints"
mkdir -p "$d/step_00000001" && echo partial >"$d/step_00000001/model.safetensors"   # no state.json
mkdir -p "$d/step_00000002.del-999999" && echo partial >"$d/step_00000002.del-999999/x"
expect prune_debris_cleaned 0 "removed" -- \
  train "${small[@]}" --training.steps 14 --checkpoint.keep 2 --checkpoint.interval 1 --output.dir "$tmp/full" \
  --checkpoint.resume latest
left=$(cd "$d" && ls | tr '\n' ' ')
[ "$left" = "latest step_00000013 step_00000014 " ] && ok prune_clean_dir || bad "prune_clean_dir: left '$left'"

echo "$passes passed, $fails failed"
[ $fails -eq 0 ]
