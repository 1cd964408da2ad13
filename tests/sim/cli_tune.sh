#!/usr/bin/env bash
# `dhelix tune`: a good run prints a ranked table and writes JSON; bad input exits 2 naming the value
# and a hint. Oracle: the documented exit codes (0 success, 2 bad input), the count of layouts of 4
# ranks (6 Megatron tp x pp x dp + 9 grids x*y*z*dp other than pure dp + 4 with cp cut out of dp = 19),
# the flag values named.
# --confirm runs `dhelix train` under mpirun for two 2-rank layouts of a tiny model (needs the data
# made by scripts/setup); oracle: each run's counted steps in the JSON, the per-rank traces --trace
# asks for, with the layout's collectives in them.
# Usage: cli_tune.sh DHELIX_BINARY SOURCE_DIR
set -u
bin=$1; cd "$2"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
verb=tune
source "$(dirname "${BASH_SOURCE[0]}")/../cli_lib.sh"

# 1. A ranked table of the 25 layouts of 4 ranks (6 Megatron, 12 3D grids with or without a
#    pipeline, and 7 with context parallelism cut out of their dp), and the JSON beside it.
out=$("$bin" tune --model gpt2-124m --gpus 4 --cluster cpu-emulated --global-batch 8 --seq 256 --top 30 \
      --json "$tmp/t.json" 2>&1); rc=$?
rows=$(grep -cE '^ +[0-9]+  (tp|x)=' <<<"$out")
excl=$(grep -cE '^  (tp|x)=' <<<"$out")
if [ $rc -eq 0 ] && grep -q "^   1  " <<<"$out" && [ $((rows + excl)) -eq 25 ] && [ -s "$tmp/t.json" ] \
   && /usr/bin/python3 -c "import json,sys; j=json.load(open(sys.argv[1])); assert len(j['ranked'])+len(j['excluded'])==25; s=[r['step_s'] for r in j['ranked']]; assert s==sorted(s)" "$tmp/t.json"; then
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
expect_bad explain_without_only "--explain" "--only" -- --model gpt2-124m --gpus 4 --cluster cpu-emulated --explain
expect_bad sparse_embed_value "--sparse-embed-grad 'maybe' must be on or off" -- --model gpt2-124m --gpus 4 --cluster cpu-emulated --sparse-embed-grad maybe
expect_bad trace_without_confirm "--trace is only for --confirm" -- --model gpt2-124m --gpus 4 --cluster cpu-emulated --trace
expect_bad fuse_epilogues_value "--fuse-epilogues 'yes' is not one of auto, on, off" -- --model gpt2-124m --gpus 4 --cluster cpu-emulated --fuse-epilogues yes

# 4a. --fuse-epilogues auto (training.fuse_epilogues' rule asked of the preset's devices) fuses on a
# GPU's preset and not on this machine's; on / off say so. Oracle: the documented rule, read back
# from the JSON's fuse_epilogues and the header line.
fused_of() {  # prints the JSON's fuse_epilogues and whether the header says fused, or "failed"
  local o; o=$("$bin" tune --model gpt2-124m --gpus 4 --global-batch 8 --seq 256 --json "$tmp/f.json" "$@" 2>&1) || { echo failed; return; }
  /usr/bin/python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['fuse_epilogues'], end=' ')" "$tmp/f.json"
  grep -q "GEMM epilogues fused" <<<"$o" && echo header || echo no-header
}
a=$(fused_of --cluster perlmutter-a100); b=$(fused_of --cluster cpu-emulated)
c=$(fused_of --cluster perlmutter-a100 --fuse-epilogues off); d=$(fused_of --cluster cpu-emulated --fuse-epilogues on)
if [ "$a" = "True header" ] && [ "$b" = "False no-header" ] && [ "$c" = "False no-header" ] && [ "$d" = "True header" ]; then
  ok fuse_epilogues_auto_follows_the_preset
else fail fuse_epilogues_auto_follows_the_preset; echo "gpu auto: $a; cpu auto: $b; gpu off: $c; cpu on: $d"; fi

# 4b. --sparse-embed-grad prices the trainer's sparse exchange where the trainer takes it. Oracle: the
# gating rule (StepModel.h sparse_embedding_applies: dp > 1 and tp = 1; here 256 tokens x dp 4 rows
# against 2 x 50257): the pure-dp layout's step gets shorter (the rows' all-gather is ~1% of the
# table's all-reduce), the tp = 2 layout's does not move.
for s in off on; do
  "$bin" tune --model gpt2-124m --gpus 4 --cluster cpu-emulated --global-batch 8 --seq 256 --sparse-embed-grad $s \
    --only "tp=1 pp=1 dp=4,tp=2 pp=1 dp=2" --json "$tmp/sparse_$s.json" >/dev/null 2>&1
done
if /usr/bin/python3 - "$tmp/sparse_off.json" "$tmp/sparse_on.json" <<'PY'
import json, sys
off, on = ({r["layout"]: r["step_s"] for r in json.load(open(p))["ranked"]} for p in sys.argv[1:])
assert on["tp=1 pp=1 dp=4"] < off["tp=1 pp=1 dp=4"], (on, off)
assert on["tp=2 pp=1 dp=2"] == off["tp=2 pp=1 dp=2"], (on, off)
PY
then ok sparse_embed_priced; else fail sparse_embed_priced; fi

# 5. --explain: the priced ops of each strand. Oracle: Megatron tp = 2 with sequence parallelism
# writes 4 collectives in a block's forward strand (all-gather before qkv and fc, reduce-scatter
# after out and proj) and the 6 strands of the embedding, a block and the head.
out=$("$bin" tune --model gpt2-124m --d-model 128 --layers 1 --heads 4 --seq 32 --gpus 2 --cluster cpu-emulated \
      --only "tp=2 pp=1 dp=1" --explain 2>&1); rc=$?
blk=$(sed -n '/^  block fwd/,/^  [a-z]* [fb][wd][d]* (/p' <<<"$out" | grep -cE ' comm tp +(all_gather|reduce_scatter) ')
strands=$(grep -cE '^  (embed|block|head) (fwd|bwd) \(' <<<"$out")
if [ $rc -eq 0 ] && [ "$blk" -eq 4 ] && [ "$strands" -eq 6 ]; then ok explain; else
  fail explain; echo "exit $rc block-fwd collectives $blk strands $strands"; echo "$out" | tail -30; fi

# --measure-gemm on this machine's preset: GEMMs timed for their shapes (oracle: it ranks and exits 0).
out=$("$bin" tune --model gpt2-124m --d-model 128 --layers 1 --heads 4 --seq 32 --gpus 2 --cluster cpu-emulated \
      --measure-gemm 2>&1) && grep -q "x=2 y=1 z=1 dp=1" <<<"$out" && ok measure_gemm || { echo "FAIL measure_gemm"; echo "$out" | tail -5; fails=$((fails+1)); }

# 6. --confirm with --trace: both layouts run 3 steps (2 counted), each rank writes its trace.
out=$("$bin" tune --model gpt2-124m --d-model 64 --layers 2 --heads 4 --vocab 2000 --seq 32 --gpus 2 --global-batch 4 \
      --cluster cpu-emulated --only "tp=2 pp=1 dp=1,tp=1 pp=1 dp=2" --confirm 3 --config configs/demo.toml \
      --workdir "$tmp/c" --trace --json "$tmp/c.json" 2>&1); rc=$?
if [ $rc -eq 0 ] && /usr/bin/python3 - "$tmp/c.json" "$tmp/c" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
runs = {c["layout"]: c for c in j["confirmed"]}
assert set(runs) == {"tp=2 pp=1 dp=1", "tp=1 pp=1 dp=2"}, runs
for label, c in runs.items():
    assert len(c["step_s"]) == 2 and c["measured_s"] > 0, c
    d = sys.argv[2] + "/" + label.replace(" ", "_").replace("=", "_")
    lanes = set()
    for r in (0, 1):
        t = json.load(open(f"{d}/trace.json.rank{r}"))["traceEvents"]
        lanes |= {e["args"]["name"] for e in t if e.get("name") == "thread_name"}
    want = "comm tp" if label.startswith("tp=2") else "comm dp"
    assert any(l.startswith(want) for l in lanes), (label, lanes)
PY
then ok confirm_with_traces; else fail confirm_with_traces; echo "exit $rc"; echo "$out" | tail -15; fi

# --recompute auto: layouts that need more memory than the device has without recomputation come
# back with the least recompute that fits (GPT-2 124M, 256 sequences of 1024 per micro-batch on 4 A100
# 40 GB: 19 of the 25 layouts need more without it), each named; with none they are excluded.
out=$("$bin" tune --model gpt2-124m --gpus 4 --cluster perlmutter-a100 --global-batch 1024 --micro-batch-size 256 \
      --json "$tmp/rc_none.json" 2>&1) && out2=$("$bin" tune --model gpt2-124m --gpus 4 --cluster perlmutter-a100 \
      --global-batch 1024 --micro-batch-size 256 --recompute auto --json "$tmp/rc_auto.json" 2>&1)
if [ $? -eq 0 ] && grep -q "recompute" <<<"$out2" && /usr/bin/python3 -c "
import json,sys
a,b=(json.load(open(p)) for p in sys.argv[1:])
none_ranked={r['layout'] for r in a['ranked']}
auto={r['layout']: r['recompute'] for r in b['ranked']}
assert len(auto) > len(none_ranked), (len(auto), len(none_ranked))
assert all(auto[l] == 'none' for l in none_ranked), auto
assert any(v != 'none' for v in auto.values())
assert all(r['recompute'] == 'none' for r in a['ranked'])" "$tmp/rc_none.json" "$tmp/rc_auto.json"; then
  ok recompute_auto
else fail recompute_auto; echo "$out2" | head -8; fi

# --keep-gathered (AxoNN's weight caching) on AxoNN's 80B grid x=1 y=1 z=64 dp=16 (full recompute,
# 40 GiB A100s): auto keeps the most layers that fit. Oracle: the same layout with one layer more
# is excluded for memory, naming the kept layers; with none kept it fits with fewer bytes held and
# more moved over z (each kept layer skips its backward's and its recompute's gathers).
eighty=(--model gpt-18b --d-model 12288 --layers 42 --heads 96 --seq 2048 --global-batch 1024 --gpus 1024
        --cluster perlmutter-a100 --precision bf16 --recompute full --fuse-epilogues off --only "x=1 y=1 z=64 dp=16")
if "$bin" tune "${eighty[@]}" --keep-gathered auto --json "$tmp/keep_auto.json" >/dev/null 2>&1 &&
   "$bin" tune "${eighty[@]}" --keep-gathered 0 --json "$tmp/keep_0.json" >/dev/null 2>&1 &&
   k=$(/usr/bin/python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['ranked'][0]['keep_gathered'])" \
       "$tmp/keep_auto.json") && [ "$k" -ge 1 ] && [ "$k" -lt 42 ]; then
  out=$("$bin" tune "${eighty[@]}" --keep-gathered $((k + 1)) 2>&1); rc=$?
  if [ $rc -eq 2 ] && grep -q "does not fit memory" <<<"$out" && grep -q "first $((k + 1)) layer(s)" <<<"$out" &&
     /usr/bin/python3 -c "
import json,sys
a,z=(json.load(open(p))['ranked'][0] for p in sys.argv[1:])
assert a['memory_bytes']['activations'] > z['memory_bytes']['activations'], (a['memory_bytes'], z['memory_bytes'])
assert a['axes']['z']['bytes'] < z['axes']['z']['bytes'], (a['axes'], z['axes'])" "$tmp/keep_auto.json" "$tmp/keep_0.json"
  then ok keep_gathered_auto; else fail keep_gathered_auto; echo "exit $rc"; echo "$out" | tail -5; fi
else fail keep_gathered_auto; echo "auto kept '${k:-?}' layers"; fi
out=$("$bin" tune --model gpt2-124m --gpus 8 --cluster perlmutter-a100 --keep-gathered x2 2>&1); rc=$?
if [ $rc -eq 2 ] && grep -q -- '--keep-gathered "x2" is not a layer count' <<<"$out"; then ok keep_gathered_bad
else fail keep_gathered_bad; echo "exit $rc"; echo "$out" | tail -3; fi

# --pipeline all: each layout with pp > 1 priced under 1F1B, interleaved (v = 2) and the W, a row
# or an exclusion each (GPT-2's 12 layers: pp = 2 runs all three; pp = 4's 8 chunks do not divide
# them, so its W and interleaved rows are excluded naming the rule); the JSON names the schedule
# (null without a pipeline). Oracle: the chunk rule of schedule/Pipelines.h and the W's own sends
# (2 a micro-batch at pp = 2, 1F1B's 1). Then --confirm runs a W row with `dhelix train` (the run's
# config carries schedule.pipeline = w: its resolved config says so), and --virtual-stages without an
# interleaved schedule exits 2.
out=$("$bin" tune --model gpt2-124m --gpus 4 --cluster cpu-emulated --global-batch 8 --seq 256 --top 60 \
      --pipeline all --json "$tmp/pa.json" 2>&1); rc=$?
if [ $rc -eq 0 ] && grep -q "tp=1 pp=2 dp=2 w " <<<"$out" && /usr/bin/python3 - "$tmp/pa.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
rows = {(r["layout"], r["pipeline"]): r for r in j["ranked"]}
assert {("tp=1 pp=2 dp=2", k) for k in ("1f1b", "interleaved", "w")} <= set(rows), sorted(rows)
assert rows[("tp=1 pp=1 dp=4", None)]["virtual_stages"] == 1
w, f = rows[("tp=1 pp=2 dp=2", "w")], rows[("tp=1 pp=2 dp=2", "1f1b")]
assert abs(w["axes"]["pp"]["bytes"] - 2 * f["axes"]["pp"]["bytes"]) < 1e-6 * f["axes"]["pp"]["bytes"], (w["axes"], f["axes"])
ex = {(e["layout"], e["pipeline"]): e["reason"] for e in j["excluded"]}
assert "is not divisible by 2 x parallel.pp = 8" in ex[("tp=1 pp=4 dp=1", "w")], ex
assert "parallel.pp x schedule.virtual_stages = 4 x 2 = 8" in ex[("tp=1 pp=4 dp=1", "interleaved")], ex
PY
then ok pipeline_all; else fail pipeline_all; echo "exit $rc"; echo "$out" | tail -8; fi
out=$("$bin" tune --model gpt2-124m --d-model 64 --layers 4 --heads 4 --vocab 2000 --seq 32 --gpus 2 --global-batch 4 \
      --cluster cpu-emulated --pipeline w --only "tp=1 pp=2 dp=1 w" --confirm 3 --config configs/demo.toml \
      --workdir "$tmp/w" --json "$tmp/w.json" 2>&1); rc=$?
if [ $rc -eq 0 ] && grep -q '^pipeline = "w"' "$tmp/w/tp_1_pp_2_dp_1_w/config.toml" && /usr/bin/python3 -c "
import json, sys
c = json.load(open(sys.argv[1]))['confirmed']
assert len(c) == 1 and c[0]['pipeline'] == 'w' and len(c[0]['step_s']) == 2, c" "$tmp/w.json"; then ok confirm_w
else fail confirm_w; echo "exit $rc"; echo "$out" | tail -8; fi
expect_bad virtual_stages_not_interleaved "--virtual-stages applies to --pipeline interleaved" -- --model gpt2-124m \
  --gpus 4 --cluster cpu-emulated --pipeline w --virtual-stages 3

# Co-execution interference: --compute-slowdown prices the SI step slower (never faster) and says so,
# the JSON carries the factors and each row's interference_s; a factor below 1 exits 2 naming it.
out=$("$bin" tune --model gpt2-124m --d-model 256 --layers 4 --heads 4 --gpus 4 --cluster cpu-emulated --si on \
      --only "tp=2 pp=1 dp=2" --json "$tmp/i0.json" 2>&1) &&
out=$("$bin" tune --model gpt2-124m --d-model 256 --layers 4 --heads 4 --gpus 4 --cluster cpu-emulated --si on \
      --only "tp=2 pp=1 dp=2" --compute-slowdown 2 --json "$tmp/i2.json" 2>&1); rc=$?
if [ $rc -eq 0 ] && grep -q "co-execution interference: compute x2.00" <<<"$out" && /usr/bin/python3 -c "
import json, sys
a, b = (json.load(open(f)) for f in sys.argv[1:3])
assert b['interference'] == {'compute_slowdown': 2.0, 'comm_slowdown': 1.0}, b['interference']
ra, rb = a['ranked'][0], b['ranked'][0]
assert rb['step_s'] > ra['step_s'] and rb['interference_s'] > 0 and ra['interference_s'] == 0, (ra, rb)
assert abs(rb['step_s'] - ra['step_s'] - rb['interference_s']) < 1e-9 * rb['step_s'], (ra, rb)" "$tmp/i0.json" "$tmp/i2.json"
then ok interference; else fail interference; echo "exit $rc"; echo "$out" | tail -8; fi
expect_bad interference_below_one "--compute-slowdown" "0.5" -- --model gpt2-124m --gpus 4 --cluster cpu-emulated \
  --compute-slowdown 0.5
expect_bad interference_paper_compat "--paper-compat ranks by AxoNN's closed form" -- --model gpt2-124m --gpus 4 \
  --cluster perlmutter-a100 --paper-compat --comm-slowdown 2

summary
