#!/usr/bin/env bash
# `dhelix simulate` from the command line. Oracle: the documented exit codes (0 with the step's
# figures, a JSON and a trace; 2 with one clear message for bad input). The simulated numbers
# themselves are checked against closed forms and the step model in test_pair_sim.cc (StepSim).
# Usage: cli_simulate.sh DHELIX_BINARY SOURCE_DIR
set -u
bin=$(readlink -f "$1"); cd "$2"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
verb=simulate
source "$(dirname "${BASH_SOURCE[0]}")/../cli_lib.sh"

# 1. The demo model with tp = 2, SI on: the table, a JSON with the step's figures, a trace.
out=$("$bin" simulate --config configs/demo.toml --cluster cpu-emulated --gpus 2 --parallel.tp 2 \
      --training.micro_batch_size 4 --json "$tmp/s.json" --trace "$tmp/t.json" 2>&1); rc=$?
if [ $rc -eq 0 ] && grep -q "exposed communication" <<<"$out" && [ -s "$tmp/t.json" ] \
   && /usr/bin/python3 -c "import json,sys; j=json.load(open(sys.argv[1])); assert j['step_s'] > 0 and j['micro_batches'] == 2 and abs(j['step_s'] - j['body_s'] - j['tail_s']) < 1e-9 and 0 < j['mfu'] <= 1" "$tmp/s.json" \
   && /usr/bin/python3 -c "import json,sys; j=json.load(open(sys.argv[1])); ev=j['traceEvents'] if isinstance(j, dict) else j; assert len(ev) > 100" "$tmp/t.json"; then
  ok figures_json_trace
else fail figures_json_trace; echo "$out" | tail -10; fi

# 1a. training.fuse_epilogues = auto asked of the preset's devices: the demo model (Llama: its
#     residual adds fuse at tp = 1) is simulated fused on a GPU's preset, plain on this machine's,
#     and off / on say so. Oracle: the documented rule (JSON fuse_epilogues, the layout text); on a
#     GPU preset the fused step is shorter (the fused op keeps the GEMM's FLOPs and drops the
#     residual add's activation passes).
sim_fused() {  # $1: JSON out; the rest: flags
  local j=$1; shift
  "$bin" simulate --config configs/demo.toml --json "$j" "$@" >"$j.log" 2>&1
}
if sim_fused "$tmp/fa.json" --cluster h100-8gpu && sim_fused "$tmp/fo.json" --cluster h100-8gpu --training.fuse_epilogues off \
   && sim_fused "$tmp/fc.json" --cluster cpu-emulated && sim_fused "$tmp/fn.json" --cluster cpu-emulated --training.fuse_epilogues on \
   && grep -q "fused-epilogues" "$tmp/fa.json.log" && ! grep -q "fused-epilogues" "$tmp/fo.json.log" \
   && /usr/bin/python3 -c "
import json, sys
a, o, c, n = (json.load(open(x)) for x in sys.argv[1:])
assert (a['fuse_epilogues'], o['fuse_epilogues'], c['fuse_epilogues'], n['fuse_epilogues']) == (True, False, False, True)
assert a['step_s'] < o['step_s'], (a['step_s'], o['step_s'])" "$tmp/fa.json" "$tmp/fo.json" "$tmp/fc.json" "$tmp/fn.json"; then
  ok fuse_epilogues_auto_follows_the_preset
else fail fuse_epilogues_auto_follows_the_preset; tail -3 "$tmp"/f?.json.log; fi

# 1b. A W pipeline over 2 stages with co-execution: the bubble is reported.
out=$("$bin" simulate --config configs/demo.toml --cluster cpu-emulated --parallel.pp 2 --schedule.pipeline w \
      --training.micro_batches 4 --json "$tmp/w.json" 2>&1); rc=$?
if [ $rc -eq 0 ] && grep -q "pipeline bubble" <<<"$out" && grep -q "(sets the step)" <<<"$out" \
   && /usr/bin/python3 -c "import json,sys; j=json.load(open(sys.argv[1])); assert j['bubble_s'] > 0 and j['step_s'] > j['bubble_s'] and len(j['stages']) == 2 and abs(j['stages'][j['critical_stage']]['end_s'] + j['stages'][j['critical_stage']]['tail_s'] - j['step_s']) < 1e-9" "$tmp/w.json"; then
  ok pipeline_w
else fail pipeline_w; echo "$out" | tail -10; fi

# 1b'. --layout, as tune prints it, with dp from --gpus: the same step as the parallel.* flags; the
# memory split sums to its total.
out=$("$bin" simulate --config configs/demo.toml --cluster h100-8gpu --gpus 16 --layout "tp=2 pp=2" \
      --schedule.pipeline 1f1b --training.micro_batches 8 --json "$tmp/l1.json" 2>&1); rc=$?
out2=$("$bin" simulate --config configs/demo.toml --cluster h100-8gpu --parallel.tp 2 --parallel.pp 2 --parallel.dp 4 \
      --schedule.pipeline 1f1b --training.micro_batches 8 --json "$tmp/l2.json" 2>&1); rc2=$?
if [ $rc -eq 0 ] && [ $rc2 -eq 0 ] && grep -q "tp=2" <<<"$out" && grep -q "simulated in" <<<"$out" \
   && /usr/bin/python3 -c "
import json,sys
a=json.load(open(sys.argv[1])); b=json.load(open(sys.argv[2]))
assert a['step_s'] == b['step_s'] and a['memory_bytes'] == b['memory_bytes'], (a['step_s'], b['step_s'])
assert abs(sum(a['memory'].values()) - a['memory_bytes']) <= 1e-9 * a['memory_bytes']
assert a['simulated_in_s'] >= 0" "$tmp/l1.json" "$tmp/l2.json"; then
  ok layout_flag
else fail layout_flag; echo "$out" | tail -10; fi

# 1c. GEMMs timed on this machine (--measure-gemm): the step is priced and says so.
out=$("$bin" simulate --config configs/demo.toml --cluster cpu-emulated --measure-gemm --json "$tmp/g.json" 2>&1); rc=$?
if [ $rc -eq 0 ] && grep -q "GEMMs timed for their shapes" <<<"$out" \
   && /usr/bin/python3 -c "import json,sys; j=json.load(open(sys.argv[1])); assert j['step_s'] > 0" "$tmp/g.json"; then
  ok measure_gemm
else fail measure_gemm; echo "$out" | tail -10; fi

# 1d. Interference from a profile (--profile): a one-rank profile has no collective beside compute,
# so no slowdown can be fitted and the fit keeps 1 (the grid's first value; a larger one changes no
# simulated pair). A profile of another shape is refused.
tiny=(--config configs/demo.toml --model.n_layers 2 --model.d_model 64 --model.n_heads 4 --model.n_kv_heads 2
      --model.ffn_hidden 128 --model.seq_len 16 --model.vocab_size 200 --training.micro_batch_size 1 --training.threads 1)
"$bin" profile "${tiny[@]}" --repeats 1 --warmup 0 --out "$tmp/prof.json" >/dev/null 2>&1
out=$("$bin" simulate "${tiny[@]}" --cluster cpu-emulated --profile "$tmp/prof.json" --json "$tmp/p.json" 2>&1); rc=$?
if [ $rc -eq 0 ] && grep -q "interference from" <<<"$out" \
   && /usr/bin/python3 -c "import json,sys; j=json.load(open(sys.argv[1])); assert j['compute_slowdown'] == 1 and j['comm_slowdown'] == 1" "$tmp/p.json"; then
  ok profile_fit
else fail profile_fit; echo "$out" | tail -10; fi
out=$("$bin" simulate "${tiny[@]}" --cluster cpu-emulated --profile "$tmp/prof.json" --profile-op-times --json "$tmp/q.json" 2>&1); rc=$?
if [ $rc -eq 0 ] && grep -q "profiled single-op times" <<<"$out" \
   && /usr/bin/python3 -c "import json,sys; j=json.load(open(sys.argv[1])); assert j['step_s'] > 0" "$tmp/q.json"; then
  ok profile_op_times
else fail profile_op_times; echo "$out" | tail -10; fi
expect_bad profile_op_times_alone "give --profile FILE too" -- "${tiny[@]}" --cluster cpu-emulated --profile-op-times
expect_bad profile_of_other_run "measured for another run" -- "${tiny[@]}" --model.d_model 128 --cluster cpu-emulated \
  --profile "$tmp/prof.json"
expect_bad profile_and_slowdown "not both" -- "${tiny[@]}" --cluster cpu-emulated --profile "$tmp/prof.json" \
  --compute-slowdown 2
expect_bad profile_missing "does not exist" -- "${tiny[@]}" --cluster cpu-emulated --profile "$tmp/none.json"

# 2. Bad input: exit 2, the values named.
expect_bad no_cluster "--cluster is required" -- --config configs/demo.toml
expect_bad gpus "--gpus 4 but the layout has 2 ranks" -- --config configs/demo.toml --cluster cpu-emulated --gpus 4 \
  --parallel.tp 2
expect_bad pipeline "schedule.pipeline" -- --config configs/demo.toml --cluster cpu-emulated --parallel.pp 2 \
  --schedule.pipeline zigzag
expect_bad precision "--precision 'fp8'" -- --config configs/demo.toml --cluster cpu-emulated --precision fp8
expect_bad slowdown "--compute-slowdown 0.5 must be >= 1" -- --config configs/demo.toml --cluster cpu-emulated \
  --compute-slowdown 0.5
expect_bad comm_slowdown "--comm-slowdown 0.5 must be >= 1" -- --config configs/demo.toml --cluster cpu-emulated \
  --comm-slowdown 0.5
expect_bad comm_slowdown_word "--comm-slowdown expects a number, got '2x'" -- --config configs/demo.toml \
  --cluster cpu-emulated --comm-slowdown 2x
expect_bad profile_and_comm_slowdown "not both" -- --config configs/demo.toml --cluster cpu-emulated \
  --profile "$tmp/prof.json" --comm-slowdown 2

# 3. --comm-slowdown: tp = 4 with SI (its group spans the two hosts' 1 Gbit/s link) has collectives
# in flight beside compute, so slowing them lengthens the step, and no run gets shorter by it
# (oracle: fluid sharing only ever delays a collective); the JSON records the factor. (At tp = 2,
# inside a host, the demo's collectives hide even 3x slower: the step moved by 2e-16 s.) The
# margin: 1%, where the step moved 12% when written.
"$bin" simulate --config configs/demo.toml --parallel.tp 4 --cluster cpu-emulated --json "$tmp/c1.json" >/dev/null 2>&1
"$bin" simulate --config configs/demo.toml --parallel.tp 4 --cluster cpu-emulated --comm-slowdown 3 \
  --json "$tmp/c3.json" >/dev/null 2>&1
if /usr/bin/python3 -c "import json,sys; a,b=(json.load(open(p)) for p in sys.argv[1:]); assert b['step_s'] > 1.01 * a['step_s'] and b['comm_slowdown'] == 3, (a['step_s'], b['step_s'])" "$tmp/c1.json" "$tmp/c3.json"; then
  ok comm_slowdown_lengthens
else fail comm_slowdown_lengthens; fi
# A preset's measured interference (device.comm_slowdown) is simulate's default: the same step as
# the flag gives, and it says whose; the flag overrides it.
sed 's/^\[device\]$/[device]\ncomm_slowdown = 3/' configs/clusters/cpu-emulated.toml > "$tmp/slow.toml"
out=$("$bin" simulate --config configs/demo.toml --parallel.tp 4 --cluster "$tmp/slow.toml" --json "$tmp/p3.json" 2>&1)
"$bin" simulate --config configs/demo.toml --parallel.tp 4 --cluster "$tmp/slow.toml" --comm-slowdown 1 \
  --json "$tmp/p1.json" >/dev/null 2>&1
if grep -q "collectives x3.00 beside compute (the preset's)" <<<"$out" && /usr/bin/python3 -c "
import json, sys
a, b, c, d = (json.load(open(p)) for p in sys.argv[1:])
assert b['comm_slowdown'] == 3 and b['step_s'] == a['step_s'], (a['step_s'], b['step_s'])
assert c['comm_slowdown'] == 1 and c['step_s'] == d['step_s'] < b['step_s'], (c['step_s'], d['step_s'])" \
  "$tmp/c3.json" "$tmp/p3.json" "$tmp/p1.json" "$tmp/c1.json"; then ok preset_interference
else fail preset_interference; echo "$out" | tail -4; fi
expect_bad layout_word "'tp2' is not an axis=count" -- --config configs/demo.toml --cluster cpu-emulated --layout "tp2 dp=1"
expect_bad layout_gpus "does not divide --gpus 6" -- --config configs/demo.toml --cluster cpu-emulated --gpus 6 \
  --layout "tp=4"
expect_bad layout_twice "--parallel.tp and --layout both set the layout" -- --config configs/demo.toml \
  --cluster cpu-emulated --layout "tp=2" --parallel.tp 2

# 4. Defaults a user can trust (issue 38): a GPU preset simulates in its native bf16 unless asked
# (the header says so), as `plan --cost-model` prices; --flops picks the counting convention
# (Megatron's counts attention twice what dhelix's does, so its MFU is higher on the same step).
"$bin" simulate --config configs/demo.toml --cluster h100-8gpu --json "$tmp/n.json" > "$tmp/n.out" 2>&1
"$bin" simulate --config configs/demo.toml --cluster h100-8gpu --precision fp32 --json "$tmp/f.json" >/dev/null 2>&1
"$bin" simulate --config configs/demo.toml --cluster h100-8gpu --flops megatron --json "$tmp/m.json" >/dev/null 2>&1
if grep -q "| bf16 (the preset's) |" "$tmp/n.out" && /usr/bin/python3 -c "
import json,sys
n,f,m=(json.load(open(p)) for p in sys.argv[1:])
assert n['precision'] == 'bf16' and f['precision'] == 'fp32' and f['step_s'] > n['step_s'], (n['step_s'], f['step_s'])
assert n['flops_convention'] == 'dhelix' and m['flops_convention'] == 'megatron' and m['mfu'] > n['mfu']
assert m['step_s'] == n['step_s']" "$tmp/n.json" "$tmp/f.json" "$tmp/m.json"; then
  ok native_precision_and_flops
else fail native_precision_and_flops; cat "$tmp/n.out" | head -3; fi

# 5. A layout that needs more memory per rank than the device has (GPT-2 124M, 272 sequences of 1024
# per micro-batch on one H100: ~82 GiB of activations): exit 2 with the figures (as tune excludes
# it), unless --allow-oom, which prints the step and marks it; full recompute makes it fit.
big=(--config configs/gpt2-124m.toml --training.micro_batch_size 272 --cluster h100-8gpu)
expect_bad oom "does not fit the device memory of cluster h100-8gpu" "GiB per rank" "--allow-oom" -- "${big[@]}"
out=$("$bin" simulate "${big[@]}" --allow-oom --json "$tmp/o.json" 2>&1); rc=$?
if [ $rc -eq 0 ] && grep -q "(does not fit)" <<<"$out" \
   && /usr/bin/python3 -c "import json,sys; j=json.load(open(sys.argv[1])); assert not j['fits'] and j['memory_bytes'] > j['memory_limit_bytes']" "$tmp/o.json"; then
  ok allow_oom
else fail allow_oom; echo "$out" | tail -5; fi
out=$("$bin" simulate "${big[@]}" --training.recompute full --json "$tmp/r.json" 2>&1); rc=$?
if [ $rc -eq 0 ] && grep -q "recompute=full" <<<"$out" \
   && /usr/bin/python3 -c "import json,sys; a,b=(json.load(open(p)) for p in sys.argv[1:]); assert b['fits'] and b['recompute'] == 'full' and b['step_s'] > a['step_s'] and b['memory_bytes'] < a['memory_bytes']" "$tmp/o.json" "$tmp/r.json"; then
  ok recompute_fits
else fail recompute_fits; echo "$out" | tail -5; fi

# 6. A straggler (--straggler RANK:FACTOR). One rank without communication: every op is compute, so
# the step takes exactly FACTOR times as long (closed form). Two pipeline stages: a slow rank slows
# the step, by at most FACTOR; the JSON names the rank. A rank outside the layout, or no factor: exit 2.
"$bin" simulate --config configs/demo.toml --cluster cpu-emulated --json "$tmp/s0.json" >/dev/null 2>&1
out=$("$bin" simulate --config configs/demo.toml --cluster cpu-emulated --straggler 0:1.5 --json "$tmp/s1.json" 2>&1)
"$bin" simulate --config configs/demo.toml --cluster cpu-emulated --parallel.pp 2 --schedule.pipeline 1f1b \
  --training.micro_batches 4 --json "$tmp/p0.json" >/dev/null 2>&1
"$bin" simulate --config configs/demo.toml --cluster cpu-emulated --parallel.pp 2 --schedule.pipeline 1f1b \
  --training.micro_batches 4 --straggler 1:1.2 --json "$tmp/p1.json" >/dev/null 2>&1
if grep -q "straggler: rank 0 computes 1.5x slower" <<<"$out" && /usr/bin/python3 -c "
import json,sys
a,b,c,d=(json.load(open(p)) for p in sys.argv[1:])
assert abs(b['step_s'] - 1.5 * a['step_s']) <= 1e-9 * b['step_s'], (a['step_s'], b['step_s'])
assert b['straggler_rank'] == 0 and d['straggler_rank'] == 1
assert c['step_s'] < d['step_s'] <= 1.2 * c['step_s'] * (1 + 1e-9), (c['step_s'], d['step_s'])" \
  "$tmp/s0.json" "$tmp/s1.json" "$tmp/p0.json" "$tmp/p1.json"; then
  ok straggler
else fail straggler; echo "$out" | head -3; fi
expect_bad straggler_rank "--straggler 2:1.1: the rank must be in 0..1" -- --config configs/demo.toml --cluster cpu-emulated \
  --parallel.pp 2 --straggler 2:1.1
expect_bad straggler_form "--straggler '3' is not RANK:FACTOR" -- --config configs/demo.toml --cluster cpu-emulated \
  --straggler 3

# 7. Uneven expert loads (--moe-imbalance F): the moe demo at dp = ep = 2 gets slower with F = 1.5,
#    the JSON says F; a dense model, or F above ep, exits 2 naming the values.
if "$bin" simulate --config configs/moe-demo.toml --cluster cpu-emulated --parallel.dp 2 --parallel.ep 2 \
     --json "$tmp/m1.json" >/dev/null 2>&1 &&
   "$bin" simulate --config configs/moe-demo.toml --cluster cpu-emulated --parallel.dp 2 --parallel.ep 2 \
     --moe-imbalance 1.5 --json "$tmp/m2.json" >/dev/null 2>&1 && /usr/bin/python3 -c "
import json, sys
a, b = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
assert a['moe_imbalance'] == 1 and b['moe_imbalance'] == 1.5, (a['moe_imbalance'], b['moe_imbalance'])
assert b['step_s'] > a['step_s'], (a['step_s'], b['step_s'])" "$tmp/m1.json" "$tmp/m2.json"; then
  ok moe_imbalance
else fail moe_imbalance; fi
expect_bad moe_imbalance_dense "--moe-imbalance 2 must be in 1..ep=1" "model.family=llama" -- --config configs/demo.toml \
  --cluster cpu-emulated --moe-imbalance 2
expect_bad moe_imbalance_range "--moe-imbalance 3 must be in 1..ep=2" -- --config configs/moe-demo.toml \
  --cluster cpu-emulated --parallel.dp 2 --parallel.ep 2 --moe-imbalance 3

# 8. What the step is of (issue 38): the header describes the model the config shapes, so a config
#    without model.preset is not called "demo" (oracle: the GPT parameter count by hand, tied head:
#    L (4C + 3C^2 + 3C + C^2 + C + 2CF + F + C) + V C + T C + 2C); "N ranks as K rank classes", K the
#    pipeline stages times the replica classes (2 stages; with a straggler, its replica and the
#    others'); the JSON says ranks, rank_classes and recompute_layers (0: every layer).
cat > "$tmp/gpt.toml" <<'TOML'
[model]
family = "gpt"
vocab_size = 1000
seq_len = 128
d_model = 512
n_layers = 6
n_heads = 8
n_kv_heads = 8
ffn_hidden = 2048
TOML
gpt=(--config "$tmp/gpt.toml" --cluster cpu-emulated --parallel.pp 2 --parallel.dp 4 --schedule.pipeline 1f1b
     --training.micro_batches 4 --training.micro_batch_size 1)
out=$("$bin" simulate "${gpt[@]}" --json "$tmp/h1.json" 2>&1); rc=$?
out2=$("$bin" simulate "${gpt[@]}" --straggler 3:1.1 --training.recompute full --training.recompute_layers 2 \
       --json "$tmp/h2.json" 2>&1); rc2=$?
if [ $rc -eq 0 ] && [ $rc2 -eq 0 ] && ! grep -q "demo" <<<"$out" && grep -q "8 ranks as 2 rank classes" <<<"$out" \
   && grep -q "8 ranks as 4 rank classes" <<<"$out2" && /usr/bin/python3 -c "
import json, sys
L, C, F, V, T = 6, 512, 2048, 1000, 128
n = L * (4*C + 3*C*C + 3*C + C*C + C + 2*C*F + F + C) + V*C + T*C + 2*C
head = sys.argv[3].splitlines()[0]
assert f'simulate: gpt of {n / 1e6:.1f}M parameters (6 layers, d_model 512, heads 8/8, ffn 2048, vocab 1000)' in head, head
a, b = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
assert a['model'] == {'preset': None, 'family': 'gpt', 'layers': 6, 'd_model': 512, 'parameters': n}, a['model']
assert (a['ranks'], a['rank_classes'], b['ranks'], b['rank_classes']) == (8, 2, 8, 4)
assert len(b['replica_classes']) == 2 and b['rank_classes'] == len(b['stages']) * len(b['replica_classes'])
assert (a['recompute'], a['recompute_layers'], b['recompute'], b['recompute_layers']) == ('none', 0, 'full', 2)" \
  "$tmp/h1.json" "$tmp/h2.json" "$out"; then
  ok header_model_rank_classes
else fail header_model_rank_classes; echo "$out" | head -2; echo "$out2" | tail -2; fi
# A preset is named when the model has its shape (GPT-2 124M: 124,439,808 parameters), and said to
# be reshaped when the config's keys changed it (configs/gpt2-124m.toml's 8,192-piece vocabulary).
out=$("$bin" simulate --config configs/gpt2-124m.toml --model.vocab_size 50257 --cluster h100-8gpu 2>&1)
out2=$("$bin" simulate --config configs/gpt2-124m.toml --cluster h100-8gpu 2>&1)
if grep -q "^simulate: gpt2-124m: gpt of 124.4M parameters (12 layers, d_model 768" <<<"$out" \
   && grep -q "^simulate: gpt of 92.1M parameters (.*vocab 8192) (preset gpt2-124m reshaped by the config)" <<<"$out2"; then
  ok header_preset_named
else fail header_preset_named; echo "$out" | head -1; echo "$out2" | head -1; fi

# 9. The out-of-memory refusal's threshold. Oracle: simulate's own per-rank figure (memory_bytes,
#    an integer of bytes): on the h100-8gpu preset with memory_bytes set to that figure less one byte
#    it exits 2; at the figure, or a byte more, it fits (the rule: needed <= the device's memory).
"$bin" simulate --config configs/demo.toml --cluster h100-8gpu --json "$tmp/e.json" >/dev/null 2>&1
peak=$(/usr/bin/python3 -c "import json,sys; m=json.load(open(sys.argv[1]))['memory_bytes']; assert m == int(m); print(int(m))" "$tmp/e.json")
for d in -1 0 1; do
  sed "s/^memory_bytes = [0-9e.]*/memory_bytes = $((peak + d))/" configs/clusters/h100-8gpu.toml > "$tmp/edge$d.toml"
done
expect_bad oom_by_one_byte "does not fit the device memory" -- --config configs/demo.toml --cluster "$tmp/edge-1.toml"
if "$bin" simulate --config configs/demo.toml --cluster "$tmp/edge0.toml" --json "$tmp/e0.json" >/dev/null 2>&1 \
   && "$bin" simulate --config configs/demo.toml --cluster "$tmp/edge1.toml" --json "$tmp/e1.json" >/dev/null 2>&1 \
   && /usr/bin/python3 -c "
import json, sys
p = int(sys.argv[3])
for path, limit in ((sys.argv[1], p), (sys.argv[2], p + 1)):
    j = json.load(open(path))
    assert j['fits'] and j['memory_bytes'] == p and j['memory_limit_bytes'] == limit, (path, j['memory_bytes'], j['memory_limit_bytes'])" \
  "$tmp/e0.json" "$tmp/e1.json" "$peak"; then
  ok oom_threshold_fits
else fail oom_threshold_fits; fi

# 10. simulate and plan --cost-model agree by default (issue 38): plan prices each candidate by the
#     whole step simulated on the preset in its native precision; simulate with the plan it kept, in
#     its default precision, gives that step exactly (the same figures, summed in the same order),
#     and in fp32 it does not (the comparison can fail).
mkdir -p "$tmp/plan"
if "$bin" plan --config configs/demo.toml --parallel.tp 2 --cost-model h100-8gpu --top-k 3 --out "$tmp/plan/plan.json" \
     --json "$tmp/plan/pj.json" >/dev/null 2>&1 \
   && "$bin" simulate --config configs/demo.toml --parallel.tp 2 --cluster h100-8gpu --schedule.plan "$tmp/plan/plan.json" \
     --json "$tmp/ps.json" >/dev/null 2>&1 \
   && "$bin" simulate --config configs/demo.toml --parallel.tp 2 --cluster h100-8gpu --schedule.plan "$tmp/plan/plan.json" \
     --precision fp32 --json "$tmp/pf.json" >/dev/null 2>&1 && /usr/bin/python3 -c "
import json, sys
p, s, f = (json.load(open(x)) for x in sys.argv[1:])
kept = p['candidates'][p['chosen']]['simulated_s']
assert s['precision'] == 'bf16' and abs(s['step_s'] - kept) <= 1e-12 * kept, (s['step_s'], kept)
assert f['step_s'] > 1.5 * kept, (f['step_s'], kept)" "$tmp/plan/pj.json" "$tmp/ps.json" "$tmp/pf.json"; then
  ok plan_and_simulate_agree
else fail plan_and_simulate_agree; fi

# 10b. A plan priced on a GPU's preset is made for the fused programs a run there trains (GPT's GELU
#      fuses at tp = 2): simulate on that preset takes it; on this machine's preset (plain programs)
#      it is refused, exit 2, naming training.fuse_epilogues. Oracle: the documented rule and the
#      plan's op lists (check_op_list).
g=(--config configs/demo.toml --model.family gpt --model.n_kv_heads 8 --parallel.tp 2)
if "$bin" plan "${g[@]}" --cost-model h100-8gpu --top-k 2 --out "$tmp/gplan/plan.json" >"$tmp/gplan.log" 2>&1 \
   && grep -q "fused-epilogues" "$tmp/gplan.log" \
   && "$bin" simulate "${g[@]}" --cluster h100-8gpu --schedule.plan "$tmp/gplan/plan.json" >/dev/null 2>&1; then
  out=$("$bin" simulate "${g[@]}" --cluster cpu-emulated --schedule.plan "$tmp/gplan/plan.json" 2>&1); rc=$?
  if [ $rc -eq 2 ] && grep -q "training.fuse_epilogues" <<<"$out"; then ok plan_for_fused_programs
  else fail plan_for_fused_programs; echo "exit $rc"; echo "$out" | tail -3; fi
else fail plan_for_fused_programs; tail -3 "$tmp/gplan.log"; fi

summary
