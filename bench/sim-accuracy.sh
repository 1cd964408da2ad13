#!/usr/bin/env bash
# bench/sim-accuracy.sh [--rounds R] [--steps S] [--cases LIST]: issue 21's simulator-accuracy
# benchmark. On the emulated cluster (scripts/cluster: 2 hosts x 2 ranks, each host pinned to one
# core, loopback inside a host, a tc-tbf-shaped link between them), a GPT-2-width model runs a set
# of layouts and schedules -- dp, tp, ZeRO-1, Strand Interleaving on and off, the micro-batch count,
# 1F1B and the folded W pipeline, at two link rates -- S steps each (the first a warm-up) per round,
# R rounds, the cases alternating between rounds. Each case is also simulated by `dhelix simulate`
# from this machine's figures only: the cpu-emulated preset (its link rate scaled to the case's),
# every GEMM timed for its shape here (--measure-gemm), and the co-execution interference fitted
# from a `dhelix profile` of the tp=2 dp=2 layer pair taken on the same cluster before the runs
# (--profile: the compute slowdown beside a collective and the collectives' beside compute; the
# other cases reuse both). Prints predicted vs measured per case; last
# line: one JSON object with median_abs_error, max_abs_error, layouts, si_order_correct and the
# per-case figures. Needs root (scripts/cluster).
# Model: GPT-2's width (d 768, 12 heads, GELU MLP 3072) with 2 layers (4 for the pipelines), a
# 2,048-token vocabulary (the demo's tokenizer has 2,000), T = 128, micro-batch 1, 8 sequences per
# step (16 in the pipelines, so that the slots outnumber the stages).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${DHELIX_BUILD:-build}
rounds=3 steps=4 only=""
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --cases) only=$2; shift 2 ;;
    *) echo "bench/sim-accuracy.sh: unknown argument '$1' (use --rounds R --steps S --cases a,b,...)" >&2; exit 2 ;;
  esac
done
[ "$steps" -ge 2 ] || { echo "bench/sim-accuracy.sh: --steps $steps: need at least 2 (the first is a warm-up)" >&2; exit 2; }
cmake --build "$build" --target dhelix >/dev/null
bin="$PWD/$build/dhelix"
work=$(mktemp -d /tmp/dhelix_bench_simacc.XXXXXX)
trap 'rm -rf "$work"' EXIT
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1

model=(--model.family gpt --model.vocab_size 2048 --model.seq_len 128 --model.d_model 768 --model.n_heads 12
       --model.n_kv_heads 12 --model.ffn_hidden 3072 --model.tie_embeddings true --training.micro_batch_size 1
       --training.threads 1)
# name | link rate | overrides (layout, schedule, batch)
cases=(
  "dp4-si|1gbit|--model.n_layers 2 --parallel.dp 4 --training.micro_batches 2 --schedule.strand_interleaving on"
  "dp4-nosi|1gbit|--model.n_layers 2 --parallel.dp 4 --training.micro_batches 2 --schedule.strand_interleaving off"
  "dp4-zero-si|1gbit|--model.n_layers 2 --parallel.dp 4 --parallel.zero 1 --training.micro_batches 2 --schedule.strand_interleaving on"
  "tp2dp2-si|1gbit|--model.n_layers 2 --parallel.tp 2 --parallel.dp 2 --training.micro_batches 4 --schedule.strand_interleaving on"
  "tp2dp2-nosi|1gbit|--model.n_layers 2 --parallel.tp 2 --parallel.dp 2 --training.micro_batches 4 --schedule.strand_interleaving off"
  "tp2dp2-m8-si|1gbit|--model.n_layers 2 --parallel.tp 2 --parallel.dp 2 --training.micro_batches 8 --schedule.strand_interleaving on"
  "tp4-si|1gbit|--model.n_layers 2 --parallel.tp 4 --training.micro_batches 8 --schedule.strand_interleaving on"
  "tp4-nosi|1gbit|--model.n_layers 2 --parallel.tp 4 --training.micro_batches 8 --schedule.strand_interleaving off"
  "pp2dp2-1f1b|1gbit|--model.n_layers 4 --parallel.pp 2 --parallel.dp 2 --training.micro_batches 8 --schedule.pipeline 1f1b --schedule.strand_interleaving off"
  "pp2dp2-w|1gbit|--model.n_layers 4 --parallel.pp 2 --parallel.dp 2 --training.micro_batches 8 --schedule.pipeline w --schedule.strand_interleaving on"
  "dp4-si-300m|300mbit|--model.n_layers 2 --parallel.dp 4 --training.micro_batches 2 --schedule.strand_interleaving on"
  "tp2dp2-si-300m|300mbit|--model.n_layers 2 --parallel.tp 2 --parallel.dp 2 --training.micro_batches 4 --schedule.strand_interleaving on"
  "tp2dp2-nosi-300m|300mbit|--model.n_layers 2 --parallel.tp 2 --parallel.dp 2 --training.micro_batches 4 --schedule.strand_interleaving off"
)
if [ -n "$only" ]; then
  keep=()
  for c in "${cases[@]}"; do [[ ",$only," == *",${c%%|*},"* ]] && keep+=("$c"); done
  [ ${#keep[@]} -gt 0 ] || { echo "bench/sim-accuracy.sh: --cases '$only' names no case" >&2; exit 2; }
  cases=("${keep[@]}")
fi
launch() {  # launch RATE PROGRAM ARGS...
  local rate=$1; shift
  scripts/cluster --hosts 2 --rate "$rate" --np-per-host 2 --map-by slot --cpus "${DHELIX_CLUSTER_CPUS:-auto}" \
    --mpirun-arg --mca --mpirun-arg mpi_yield_when_idle --mpirun-arg 1 -- "$@"
}

# The interference: a profile of the tp=2 dp=2 layer pair on the cluster at 1 Gbit/s.
prof_args=(--config "$PWD/configs/demo.toml" "${model[@]}" --model.n_layers 2 --parallel.tp 2 --parallel.dp 2
           --training.micro_batches 4 --output.dir "$work/profile")
echo "profiling the tp=2 dp=2 layer pair on the cluster (interference calibration) ..."
launch 1gbit "$bin" profile "${prof_args[@]}" --out "$work/profile.json" --repeats 3 > "$work/profile.log" 2>&1 ||
  { tail -20 "$work/profile.log" >&2; exit 1; }
tail -1 "$work/profile.log"
"$bin" simulate "${prof_args[@]}" --cluster cpu-emulated --profile "$work/profile.json" --json "$work/fit.json" |
  grep interference
slowdown=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['compute_slowdown'])" "$work/fit.json")
comm_slowdown=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['comm_slowdown'])" "$work/fit.json")

# A preset per link rate: the cpu-emulated one with inter_bw at the same 0.92 of the line rate.
preset() {  # preset RATE -> path
  local rate=$1 bps
  case "$rate" in *gbit) bps=$(( ${rate%gbit} * 1000000000 )) ;; *mbit) bps=$(( ${rate%mbit} * 1000000 )) ;;
    *) echo "bad rate $rate" >&2; exit 2 ;; esac
  local f="$work/cpu-emulated-$rate.toml"
  python3 - "$bps" configs/clusters/cpu-emulated.toml "$f" <<'PY'
import re, sys
bps, src, dst = float(sys.argv[1]), sys.argv[2], sys.argv[3]
t = open(src).read()
# 0.92 x the line in bytes/s: the fraction Gloo reached of the tbf line (the preset's own comment).
t = re.sub(r"^inter_bw = [0-9.e]+", f"inter_bw = {0.92 * bps / 8:.6g}", t, count=1, flags=re.M)
t = re.sub(r'^name = "cpu-emulated"', 'name = "cpu-emulated-scaled"', t, count=1, flags=re.M)
open(dst, "w").write(t)
PY
  echo "$f"
}

# Simulate every case (the machine is quiet: GEMM timings).
for c in "${cases[@]}"; do
  IFS='|' read -r name rate over <<< "$c"
  # shellcheck disable=SC2086
  "$bin" simulate --config "$PWD/configs/demo.toml" "${model[@]}" $over --cluster "$(preset "$rate")" \
    --measure-gemm --compute-slowdown "$slowdown" --comm-slowdown "$comm_slowdown" --json "$work/sim_$name.json" > "$work/sim_$name.log" 2>&1 ||
    { cat "$work/sim_$name.log" >&2; exit 1; }
done

# Measure: round r starts at case r, so a slow spell of the machine does not fall on one case only.
n=${#cases[@]}
for r in $(seq 0 $((rounds - 1))); do
  for k in $(seq 0 $((n - 1))); do
    IFS='|' read -r name rate over <<< "${cases[$(( (k + r) % n ))]}"
    dir="$work/run_${name}_$r"
    # shellcheck disable=SC2086
    if launch "$rate" "$bin" train --config "$PWD/configs/demo.toml" "${model[@]}" $over --training.steps "$steps" \
        --training.eval_interval 0 --training.sample_tokens 0 --training.log_interval 1 --checkpoint.interval 0 \
        --output.dir "$dir" --output.overwrite true > "$work/run_${name}_$r.log" 2>&1; then
      echo "  round $((r + 1)) $name done"
    else
      echo "  round $((r + 1)) $name FAILED:"; tail -8 "$work/run_${name}_$r.log"
    fi
  done
done

python3 - "$work" "$rounds" "$slowdown" "$comm_slowdown" "${cases[@]}" <<'PY'
import json, os, statistics, sys
work, rounds, slowdown, comm_slowdown, cases = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]), sys.argv[5:]
rows = []
for c in cases:
    name, rate, _ = c.split("|", 2)
    sim = json.load(open(f"{work}/sim_{name}.json"))
    steps = []
    for r in range(rounds):
        path = f"{work}/run_{name}_{r}/metrics.jsonl"
        if not os.path.exists(path):
            continue
        for line in open(path):
            try:
                j = json.loads(line)
            except ValueError:
                continue
            if "step_s" in j and j.get("step", 0) >= 2:
                steps.append(j["step_s"])
    if not steps:
        print(f"{name}: no measured steps")
        continue
    meas = statistics.median(steps)
    rows.append({"case": name, "link": rate, "predicted_s": round(sim["step_s"], 4), "measured_s": round(meas, 4),
                 "min_s": round(min(steps), 4), "max_s": round(max(steps), 4), "steps": len(steps),
                 "error": round((sim["step_s"] - meas) / meas, 4)})
print(f"\n{'case':<18} {'link':>8} {'simulated s':>12} {'measured s':>11} {'(min-max, n)':>22} {'error':>8}")
for r in rows:
    print(f"{r['case']:<18} {r['link']:>8} {r['predicted_s']:>12.3f} {r['measured_s']:>11.3f} "
          f"{'(%.2f-%.2f, %d)' % (r['min_s'], r['max_s'], r['steps']):>22} {100 * r['error']:>+7.1f}%")
errs = [abs(r["error"]) for r in rows]
by = {r["case"]: r for r in rows}
pairs, correct = [], 0
for r in rows:
    if "-si" in r["case"]:
        off = r["case"].replace("-si", "-nosi")
        if off in by:
            o = by[off]
            ok = (r["predicted_s"] < o["predicted_s"]) == (r["measured_s"] < o["measured_s"])
            pairs.append(f"{r['case']} vs {off}: simulated {o['predicted_s'] / r['predicted_s']:.3f}x, "
                         f"measured {o['measured_s'] / r['measured_s']:.3f}x {'right' if ok else 'WRONG'}")
            correct += ok
for p in pairs:
    print("SI on vs off:", p)
med = statistics.median(errs) if errs else None
print(f"median |error| {100 * med:.1f}%, worst {100 * max(errs):.1f}% over {len(rows)} cases; "
      f"SI order right in {correct}/{len(pairs)} pairs; interference: compute x{slowdown}, collectives x{comm_slowdown}")
print(json.dumps({"median_abs_error": round(med, 4) if med is not None else None,
                  "max_abs_error": round(max(errs), 4) if errs else None, "layouts": len(rows),
                  "si_order_correct": len(pairs) > 0 and correct == len(pairs), "si_pairs": len(pairs),
                  "si_pairs_right": correct, "compute_slowdown": slowdown, "comm_slowdown": comm_slowdown, "rounds": rounds, "per_case": rows}))
PY
