#!/usr/bin/env bash
# A rank that dies mid-step of a real `dhelix train` (np 2: dp 2, then pp 2 with the W) must take
# the whole job down,
# quickly, every rank exiting non-zero, with a message naming the rank and the last collective.
# The fault comes from the trainer's test hook DHELIX_FAULT_INJECT=RANK:STEP[:throw]
# (src/train/Trainer.cc): mid-backward of step 3, with dp buckets in flight.
#   kill:  rank 1 prints "rank 1: ... last collective: ..." and raises SIGKILL; mpirun reports the
#          signal and stops rank 0, or rank 0 sees the dp ring connection close and aborts first.
#   throw: rank 1 throws; `dhelix train` aborts the world with "rank 1: <why>; last collective: ...".
# Oracle: mpirun's exit status, elapsed time (bound 30 s, well under --comm.timeout_s 60
# so it is the failure path and not the timeout that ends the job), no rank process left alive,
# no rank that finished (no final checkpoint), and the expected lines in the output.
# usage: mpi_train_failure_test.sh MPIRUN DHELIX
set -u
MPIRUN=$1; DHELIX=$2; BOUND_S=30; NP=2
dir=$(mktemp -d /tmp/dhelix_train_failure.XXXXXX)
trap 'rm -rf "$dir"' EXIT
fail=0

# A small text corpus of random lowercase words; `dhelix data prepare` trains a 256-piece BPE on it.
source "$(dirname "$0")/tiny_corpus.sh"
tiny_corpus 11 3000 "$dir/corpus.txt"
args=(--model.vocab_size 256 --model.seq_len 32 --model.d_model 64 --model.n_layers 2 --model.n_heads 4
      --model.n_kv_heads 2 --model.ffn_hidden 176 --training.steps 50 --training.micro_batch_size 2
      --training.eval_interval 0 --training.sample_tokens 0 --training.threads 1
      --data.corpus "$dir/corpus.txt" --data.tokenizer "$dir/tok.model" --data.prefix "$dir/data"
      --output.dir "$dir/run")
"$DHELIX" data prepare "${args[@]}" > "$dir/prepare.out" 2>&1 || { cat "$dir/prepare.out"; echo "FAIL: data prepare"; exit 1; }

alive_ranks() {  # pids of rank processes of this test still alive (matched by our unique directory)
  for p in /proc/[0-9]*; do
    [ -r "$p/cmdline" ] || continue
    grep -q '^State:[[:space:]]*Z' "$p/status" 2>/dev/null && continue
    tr '\0' ' ' < "$p/cmdline" 2>/dev/null | grep -qF -- "--output.dir $dir/run" || continue
    tr '\0' ' ' < "$p/cmdline" | grep -qF "$MPIRUN" && continue
    basename "$p"
  done
}

layout=(--parallel.dp 2)
run_case() {  # run_case FAULT EXPECTED_TEXT...   (layout: the array above)
  local fault=$1 rc t0 t1 elapsed want; shift
  rm -rf "$dir/run"
  t0=$(date +%s.%N)
  DHELIX_FAULT_INJECT=$fault timeout 120 "$MPIRUN" -np $NP --oversubscribe --bind-to none \
    "$DHELIX" train "${args[@]}" "${layout[@]}" --comm.timeout_s 60 > "$dir/out" 2>&1
  rc=$?
  t1=$(date +%s.%N)
  elapsed=$(echo "$t1 - $t0" | bc)
  echo "[$fault] mpirun exit $rc after ${elapsed} s"
  if [ $rc -eq 0 ] || [ $rc -eq 124 ]; then echo "FAIL [$fault]: mpirun exit $rc (want non-zero, not a timeout)"; fail=1; fi
  if [ "$(echo "$elapsed > $BOUND_S" | bc)" = 1 ]; then echo "FAIL [$fault]: took ${elapsed} s > ${BOUND_S} s"; fail=1; fi
  grep -q "step     2/50" "$dir/out" || { echo "FAIL [$fault]: training never reached step 2 (fault fired too early?)"; fail=1; }
  if grep -q "step     3/50\|saved " "$dir/out"; then echo "FAIL [$fault]: a rank completed step 3 or saved a checkpoint"; fail=1; fi
  local left
  for _ in $(seq 50); do left=$(alive_ranks); [ -z "$left" ] && break; sleep 0.1; done  # 5 s grace
  if [ -n "$left" ]; then echo "FAIL [$fault]: rank processes still alive: $left"; kill -9 $left; fail=1; fi
  local alt found
  for want in "$@"; do  # "A||B": either text will do
    found=0
    while IFS= read -r alt; do grep -qF -- "$alt" "$dir/out" && found=1; done < <(echo "$want" | sed 's/||/\n/g')
    [ $found -eq 1 ] || { echo "FAIL [$fault]: output lacks '$want'"; fail=1; }
  done
  echo "---- [$fault] mpirun output (lines naming a rank) ----"; grep -i "rank\|signal" "$dir/out" | head -12
}

# The killed rank is reported by mpirun or, first, by rank 0 when its Gloo connection to rank 1
# closes (its abort message then names the op, and rank 1 when the address is rank 1's listener).
# combination: dp si (dp2 kill 1:3)
run_case 1:3 "rank 1: DHELIX_FAULT_INJECT: failing in step 3 (backward of unit 2) by SIGKILL; last collective: " \
  "exited on signal 9||by peer"
# combination: dp si (dp2 throw 1:3:throw)
run_case 1:3:throw "rank 1: DHELIX_FAULT_INJECT: failing in step 3 (backward of unit 2); last collective: "

# Pipeline: pp 2 with the folded W over 4 layers (stage 1 holds units 2 and 3, layers 2 and 3); the
# fault fires in stage 1's backward of unit 3 in the step's last micro-batch, while stage 0 waits
# for that micro-batch's gradient: rank 0's message names its pending receive on the pp group.
layout=(--parallel.pp 2 --schedule.pipeline w --model.n_layers 4 --training.micro_batches 4)
# combination: w si (pp2 w kill 1:3)
run_case 1:3 "rank 1: DHELIX_FAULT_INJECT: failing in step 3 (backward of unit 3) by SIGKILL; last collective: " \
  "exited on signal 9||by peer"
# combination: w si (pp2 w throw 1:3:throw)
run_case 1:3:throw "rank 1: DHELIX_FAULT_INJECT: failing in step 3 (backward of unit 3); last collective: " "on pp[1/2]"
[ $fail -eq 0 ] && echo "mpi_train_failure_test: passed" || echo "mpi_train_failure_test: FAILED"
exit $fail
