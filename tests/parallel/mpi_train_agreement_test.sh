#!/usr/bin/env bash
# Multi-rank reliability of `dhelix train` (np 2, dp 2): ranks that resolved different runs are
# refused before any step; a stop signal that reaches one rank stops all of them after the same
# step, with a checkpoint; a non-finite gradient under training.nonfinite=stop ends every rank
# with exit 3; a model split over tp or pp ranks is sampled at the end. Oracles: mpirun's exit status (the README's table: 2 bad input, 3 diverged, 143
# SIGTERM), the message printed once (rank 0 only) naming the key and the rank that differs, the
# checkpoint left (`latest`), the resumed run's loss rows equal to an uninterrupted run's, and the
# end-of-run sample equal to `dhelix sample` on the checkpoint in one process.
# usage: mpi_train_agreement_test.sh MPIRUN DHELIX
set -u
MPIRUN=$1; DHELIX=$2
dir=$(mktemp -d /tmp/dhelix_train_agree.XXXXXX)
trap 'rm -rf "$dir"' EXIT
fail=0
source "$(dirname "$0")/tiny_corpus.sh"
tiny_corpus 5 2000 "$dir/corpus.txt"
args=(--model.vocab_size 256 --model.seq_len 32 --model.d_model 64 --model.n_layers 2 --model.n_heads 4
      --model.n_kv_heads 2 --model.ffn_hidden 176 --training.steps 6 --training.micro_batch_size 2
      --training.eval_interval 0 --training.sample_tokens 0 --training.threads 1 --parallel.dp 2
      --data.corpus "$dir/corpus.txt" --data.tokenizer "$dir/tok.model" --data.prefix "$dir/data")
"$DHELIX" data prepare "${args[@]}" > "$dir/prepare.out" 2>&1 || { cat "$dir/prepare.out"; echo "FAIL: data prepare"; exit 1; }
mpi=("$MPIRUN" --oversubscribe --bind-to none)
check() {  # check NAME WANT_RC RC OUTFILE PATTERN...
  local name=$1 want=$2 rc=$3 out=$4; shift 4
  local why=""
  [ "$rc" -eq "$want" ] || why="mpirun exit $rc, expected $want"
  for p in "$@"; do grep -qF -- "$p" "$out" || why="$why; output lacks '$p'"; done
  if [ -z "$why" ]; then echo "ok   $name"; else echo "FAIL $name: $why"; tail -20 "$out"; fail=1; fi
}

# 0. A configuration error every rank meets while reading the config (before the ranks connect)
#    is printed once, exit 2; one that only rank 1 meets is printed by rank 1 alone.
timeout 120 "${mpi[@]}" -np 2 "$DHELIX" train "${args[@]}" --output.dir "$dir/c" --model.n_heads 3 > "$dir/c.out" 2>&1
check config_error_shared 2 $? "$dir/c.out" "configuration error" "model.n_heads=3"
n=$(grep -cE "dhelix train: ([0-9]+ )?configuration error" "$dir/c.out")
[ "$n" = 1 ] && echo "ok   config_error_printed_once" || { echo "FAIL config error printed $n times"; fail=1; }
timeout 120 "${mpi[@]}" -np 1 "$DHELIX" train "${args[@]}" --output.dir "$dir/c" : \
  -np 1 "$DHELIX" train "${args[@]}" --output.dir "$dir/c" --training.bogus 1 > "$dir/c2.out" 2>&1
check config_error_one_rank 2 $? "$dir/c2.out" "training.bogus"
n=$(grep -cE "dhelix train: ([0-9]+ )?configuration error" "$dir/c2.out")
[ "$n" = 1 ] && echo "ok   config_error_one_rank_printed_once" || { echo "FAIL one-rank config error printed $n times"; fail=1; }

# 0b. A layout that does not fit the ranks mpirun started (3 ranks, the 2-rank dp layout): every
#     rank meets it, one message names the sizes, exit 2 (issue 36 item 8: it was printed by each rank).
timeout 120 "${mpi[@]}" -np 3 "$DHELIX" train "${args[@]}" --output.dir "$dir/w" > "$dir/w.out" 2>&1
check world_mismatch 2 $? "$dir/w.out" "world size 3 != the layout's 2 ranks" "mpirun -np 2"
n=$(grep -c "layout does not fit the MPI world" "$dir/w.out")
[ "$n" = 1 ] && echo "ok   world_mismatch_printed_once" || { echo "FAIL world mismatch printed $n times"; fail=1; }

# 1. Rank 1 launched with another depth: refused before step 1, one message, exit 2.
timeout 120 "${mpi[@]}" -np 1 "$DHELIX" train "${args[@]}" --output.dir "$dir/a" --comm.timeout_s 30 : \
  -np 1 "$DHELIX" train "${args[@]}" --output.dir "$dir/a" --comm.timeout_s 30 --model.n_layers 4 > "$dir/a.out" 2>&1
check config_mismatch 2 $? "$dir/a.out" "model.n_layers: rank 1 differ" "did not resolve the same run"
n=$(grep -c "did not resolve the same run" "$dir/a.out")
[ "$n" = 1 ] && echo "ok   config_mismatch_reported_once" || { echo "FAIL config_mismatch printed $n times"; fail=1; }
grep -q "step     1/" "$dir/a.out" && { echo "FAIL config_mismatch: a step ran"; fail=1; }

# 2. SIGTERM raised in rank 1 only, in step 3: every rank stops after step 3 with a checkpoint
#    (exit 143); the resumed run's losses equal an uninterrupted run's, bitwise.
timeout 120 "${mpi[@]}" -np 2 "$DHELIX" train "${args[@]}" --output.dir "$dir/full" > "$dir/full.out" 2>&1
check uninterrupted 0 $? "$dir/full.out"
# combination: dp si (sigterm_one_rank)
DHELIX_FAULT_INJECT=1:3:sigterm timeout 120 "${mpi[@]}" -np 2 "$DHELIX" train "${args[@]}" --output.dir "$dir/t" \
  > "$dir/t.out" 2>&1
check sigterm_one_rank 143 $? "$dir/t.out" "stopped by SIGTERM after step 3"
[ "$(cat "$dir/t/checkpoints/latest" 2>/dev/null)" = step_00000003 ] && echo "ok   sigterm_checkpoint" \
  || { echo "FAIL sigterm_checkpoint: latest '$(cat "$dir/t/checkpoints/latest" 2>/dev/null)'"; fail=1; }
timeout 120 "${mpi[@]}" -np 2 "$DHELIX" train "${args[@]}" --output.dir "$dir/t" --checkpoint.resume latest \
  > "$dir/t2.out" 2>&1
check sigterm_resume 0 $? "$dir/t2.out" "resumed from"
if [ "$(grep -o '"loss":[^,]*' "$dir/full/metrics.jsonl")" = "$(grep -o '"loss":[^,]*' "$dir/t/metrics.jsonl")" ]; then
  echo "ok   sigterm_resume_bitwise"; else echo "FAIL sigterm_resume_bitwise"; fail=1; fi

# 2b. SIGTERM to the launcher, as a batch scheduler sends it (issue 36 item 5): plain mpirun passes it
#     to the ranks, which save and exit 143, but mpirun itself returns 1; scripts/launch passes it on
#     the same way and exits 143, with the checkpoint saved. The run is long; the signal goes once
#     step 2 is in the metrics.
launch=$(cd "$(dirname "$0")/../.." && pwd)/scripts/launch
long=("${args[@]}" --training.steps 100000)
# combination: dp si (launch_sigterm)
MPIRUN=$MPIRUN "$launch" --oversubscribe --bind-to none -np 2 "$DHELIX" train "${long[@]}" --output.dir "$dir/L" \
  > "$dir/L.out" 2>&1 &
lpid=$!
for _ in $(seq 1 1200); do grep -q '"step":2,' "$dir/L/metrics.jsonl" 2>/dev/null && break; sleep 0.1; done
kill -TERM $lpid; wait $lpid
check launch_sigterm 143 $? "$dir/L.out" "stopped by SIGTERM after step"
[ -n "$(cat "$dir/L/checkpoints/latest" 2>/dev/null)" ] && echo "ok   launch_sigterm_checkpoint" \
  || { echo "FAIL launch_sigterm_checkpoint: no latest"; fail=1; }

# 3. A NaN gradient on rank 1 (before the dp reduction) under nonfinite=stop: exit 3 everywhere.
# combination: dp si (nan_stop_all_ranks)
DHELIX_FAULT_INJECT=1:2:nan-grad timeout 120 "${mpi[@]}" -np 2 "$DHELIX" train "${args[@]}" --output.dir "$dir/n" \
  --training.nonfinite stop > "$dir/n.out" 2>&1
check nan_stop_all_ranks 3 $? "$dir/n.out" "training diverged: step 2"
n=$(grep -c "training diverged" "$dir/n.out")
[ "$n" = 1 ] && echo "ok   nan_reported_once" || { echo "FAIL nan reported $n times"; fail=1; }

# 4. The sample at the end of a run whose model is split over pipeline stages (the W, pp 2), tp 2 or
#    the 3D grid's x axis:
#    gathered to rank 0, it equals `dhelix sample` on the run's checkpoint in one process.
for lay in "--parallel.pp 2 --schedule.pipeline w --model.n_layers 4" "--parallel.tp 2" "--parallel.tp_x 2"; do
  # combination: w si (sample_split_model pp2 w)
  # combination: tp si (sample_split_model tp2)
  # combination: 3d si (sample_split_model tp_x2)
  # shellcheck disable=SC2086
  timeout 120 "${mpi[@]}" -np 2 "$DHELIX" train "${args[@]}" --parallel.dp 1 $lay --training.steps 2 \
    --training.sample_tokens 10 --output.dir "$dir/s" --output.overwrite true > "$dir/s.out" 2>&1
  check "sample_split_model ($lay)" 0 $? "$dir/s.out" "sample: "
  want=$(grep '^sample: ' "$dir/s.out" | sed 's/^sample: //')
  # shellcheck disable=SC2086
  got=$("$DHELIX" sample "${args[@]}" --parallel.dp 1 $lay --output.dir "$dir/s" --tokens 10 --seed 1234 2>&1)
  [ -n "$want" ] && [ "$want" = "$got" ] && echo "ok   sample_equals_single_process ($lay)" \
    || { echo "FAIL sample ($lay): run printed '$want', dhelix sample '$got'"; fail=1; }
done

# 5. A 3D layout that does not fit this machine's memory (tp_z 2 halves the weights, not enough):
#    refused before any step, exit 2, with the estimate's figures.
timeout 120 "${mpi[@]}" -np 2 "$DHELIX" train "${args[@]}" --parallel.dp 1 --parallel.tp_z 2 --model.d_model 65536 \
  --model.n_heads 64 --model.n_kv_heads 64 --model.ffn_hidden 262144 --output.dir "$dir/m" > "$dir/m.out" 2>&1
check grid3d_too_large 2 $? "$dir/m.out" "available" "per rank"
grep -q "step     1/" "$dir/m.out" && { echo "FAIL grid3d_too_large: a step ran"; fail=1; }

# 6. Profile and plan a 3D layer (tp_x 2 x tp_z 2, np 4) on the real process groups, then train with
#    the searched plan: the plan only reorders ops, so the losses equal the default plan's bitwise.
g3=(--parallel.dp 1 --parallel.tp_x 2 --parallel.tp_z 2 --training.steps 3)
timeout 300 "${mpi[@]}" -np 4 "$DHELIX" profile "${args[@]}" "${g3[@]}" --max-window 2 --repeats 1 --warmup 0 \
  --out "$dir/p3/prof.json" > "$dir/p3.out" 2>&1
check grid3d_profile 0 $? "$dir/p3.out" "entries timed"
timeout 300 "${mpi[@]}" -np 4 "$DHELIX" plan "${args[@]}" "${g3[@]}" --profile "$dir/p3/prof.json" --out "$dir/p3/plan.json" \
  --repeats 1 --warmup 0 >> "$dir/p3.out" 2>&1
check grid3d_plan 0 $? "$dir/p3.out" "wrote $dir/p3/plan.json"
# combination: 3d si (grid3d_searched_plan_bitwise)
for with in default searched; do
  extra=(); [ $with = searched ] && extra=(--schedule.plan "$dir/p3/plan.json")
  timeout 300 "${mpi[@]}" -np 4 "$DHELIX" train "${args[@]}" "${g3[@]}" "${extra[@]}" --output.dir "$dir/p3/$with" \
    > "$dir/p3_$with.out" 2>&1
  check "grid3d_train_$with" 0 $? "$dir/p3_$with.out" "step     3/3"
done
if [ "$(grep -o '"loss":[^,]*' "$dir/p3/default/metrics.jsonl")" = "$(grep -o '"loss":[^,]*' "$dir/p3/searched/metrics.jsonl")" ]
then echo "ok   grid3d_searched_plan_bitwise"; else echo "FAIL grid3d_searched_plan_bitwise"; fail=1; fi

[ $fail -eq 0 ] && echo "mpi_train_agreement_test: passed" || echo "mpi_train_agreement_test: FAILED"
exit $fail
