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
# per-case figures (si_pairs_resolved: the SI pairs whose measured step ranges do not overlap).
# Needs root (scripts/cluster). Two more cases run one rank per host (tp = 2 over 300 Mbit/s, SI
# on and off), simulated with the preset's whole-core figures and their own profile's interference.
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
# name | link rate | placement (2ph: 2 hosts x 2 ranks, a core per host; 1ph: 2 hosts x 1 rank) |
# overrides (layout, schedule, batch)
cases=(
  "dp4-si|1gbit|2ph|--model.n_layers 2 --parallel.dp 4 --training.micro_batches 2 --schedule.strand_interleaving on"
  "dp4-nosi|1gbit|2ph|--model.n_layers 2 --parallel.dp 4 --training.micro_batches 2 --schedule.strand_interleaving off"
  "dp4-zero-si|1gbit|2ph|--model.n_layers 2 --parallel.dp 4 --parallel.zero 1 --training.micro_batches 2 --schedule.strand_interleaving on"
  "tp2dp2-si|1gbit|2ph|--model.n_layers 2 --parallel.tp 2 --parallel.dp 2 --training.micro_batches 4 --schedule.strand_interleaving on"
  "tp2dp2-nosi|1gbit|2ph|--model.n_layers 2 --parallel.tp 2 --parallel.dp 2 --training.micro_batches 4 --schedule.strand_interleaving off"
  "tp2dp2-m8-si|1gbit|2ph|--model.n_layers 2 --parallel.tp 2 --parallel.dp 2 --training.micro_batches 8 --schedule.strand_interleaving on"
  "tp4-si|1gbit|2ph|--model.n_layers 2 --parallel.tp 4 --training.micro_batches 8 --schedule.strand_interleaving on"
  "tp4-nosi|1gbit|2ph|--model.n_layers 2 --parallel.tp 4 --training.micro_batches 8 --schedule.strand_interleaving off"
  "pp2dp2-1f1b|1gbit|2ph|--model.n_layers 4 --parallel.pp 2 --parallel.dp 2 --training.micro_batches 8 --schedule.pipeline 1f1b --schedule.strand_interleaving off"
  "pp2dp2-w|1gbit|2ph|--model.n_layers 4 --parallel.pp 2 --parallel.dp 2 --training.micro_batches 8 --schedule.pipeline w --schedule.strand_interleaving on"
  "dp4-si-300m|300mbit|2ph|--model.n_layers 2 --parallel.dp 4 --training.micro_batches 2 --schedule.strand_interleaving on"
  "tp2dp2-si-300m|300mbit|2ph|--model.n_layers 2 --parallel.tp 2 --parallel.dp 2 --training.micro_batches 4 --schedule.strand_interleaving on"
  "tp2dp2-nosi-300m|300mbit|2ph|--model.n_layers 2 --parallel.tp 2 --parallel.dp 2 --training.micro_batches 4 --schedule.strand_interleaving off"
  # One rank per host, a core each: tp = 2 across the 300 Mbit/s link, nothing on the core but the
  # rank's own threads -- the arrangement where Strand Interleaving has the wire to hide.
  "tp2-1ph-si-300m|300mbit|1ph|--model.n_layers 2 --parallel.tp 2 --training.micro_batches 4 --schedule.strand_interleaving on"
  "tp2-1ph-nosi-300m|300mbit|1ph|--model.n_layers 2 --parallel.tp 2 --training.micro_batches 4 --schedule.strand_interleaving off"
)
if [ -n "$only" ]; then
  keep=()
  for c in "${cases[@]}"; do [[ ",$only," == *",${c%%|*},"* ]] && keep+=("$c"); done
  [ ${#keep[@]} -gt 0 ] || { echo "bench/sim-accuracy.sh: --cases '$only' names no case" >&2; exit 2; }
  cases=("${keep[@]}")
fi
launch() {  # launch RATE PLACEMENT PROGRAM ARGS...
  local rate=$1 nph=${2%ph}; shift 2
  scripts/cluster --hosts 2 --rate "$rate" --np-per-host "$nph" --map-by slot --cpus "${DHELIX_CLUSTER_CPUS:-auto}" \
    --mpirun-arg --mca --mpirun-arg mpi_yield_when_idle --mpirun-arg 1 -- "$@"
}

# The interference: a profile of the tp=2 dp=2 layer pair on the cluster at 1 Gbit/s.
prof_args=(--config "$PWD/configs/demo.toml" "${model[@]}" --model.n_layers 2 --parallel.tp 2 --parallel.dp 2
           --training.micro_batches 4 --output.dir "$work/profile")
echo "profiling the tp=2 dp=2 layer pair on the cluster (interference calibration) ..."
launch 1gbit 2ph "$bin" profile "${prof_args[@]}" --out "$work/profile.json" --repeats 3 > "$work/profile.log" 2>&1 ||
  { tail -20 "$work/profile.log" >&2; exit 1; }
tail -1 "$work/profile.log"
"$bin" simulate "${prof_args[@]}" --cluster cpu-emulated --profile "$work/profile.json" --json "$work/fit.json" |
  grep interference
fitted() {  # fitted FIT.json KEY -> the fitted factor `dhelix simulate --json` recorded
  python3 -c "import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])" "$1" "$2"
}
slowdown=$(fitted "$work/fit.json" compute_slowdown) comm_slowdown=$(fitted "$work/fit.json" comm_slowdown)

# A preset per link rate: the cpu-emulated one with inter_bw at the same 0.92 of the line rate.
preset() {  # preset RATE PLACEMENT -> path
  local rate=$1 place=$2 bps
  case "$rate" in *gbit) bps=$(( ${rate%gbit} * 1000000000 )) ;; *mbit) bps=$(( ${rate%mbit} * 1000000 )) ;;
    *) echo "bad rate $rate" >&2; exit 2 ;; esac
  local f="$work/cpu-emulated-$rate-$place.toml"
  python3 - "$bps" configs/clusters/cpu-emulated.toml "$f" "$place" <<'PY'
import re, sys
bps, src, dst, place = float(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
t = open(src).read()
if place == "1ph":
    # One rank per host: the whole core's figures the preset's comments give for its half-core ones
    # (x2: memory, bandwidth, peak, sgemm, the optimizer's rate), one device per node.
    for key in ("memory_bytes", "mem_bw", "peak_flops_fp32", "gemm_flops_fp32", "optimizer_elems_per_s"):
        t = re.sub(rf"^{key} = ([0-9.e]+)", lambda m: f"{key} = {2 * float(m.group(1)):.6g}", t, count=1, flags=re.M)
    t = re.sub(r"^core_share = [0-9.e]+", "core_share = 1.0", t, count=1, flags=re.M)
    t = re.sub(r"^devices = [0-9]+", "devices = 1", t, count=1, flags=re.M)
# 0.92 x the line in bytes/s: the fraction Gloo reached of the tbf line (the preset's own comment).
t = re.sub(r"^inter_bw = [0-9.e]+", f"inter_bw = {0.92 * bps / 8:.6g}", t, count=1, flags=re.M)
t = re.sub(r'^name = "cpu-emulated"', 'name = "cpu-emulated-scaled"', t, count=1, flags=re.M)
open(dst, "w").write(t)
PY
  echo "$f"
}

# The one-rank-per-host cases: a profile of their tp=2 layer pair in that placement.
prof1=(--config "$PWD/configs/demo.toml" "${model[@]}" --model.n_layers 2 --parallel.tp 2 --training.micro_batches 4
       --output.dir "$work/profile1")
echo "profiling the tp=2 layer pair, one rank per host, 300 Mbit/s (interference calibration) ..."
launch 300mbit 1ph "$bin" profile "${prof1[@]}" --out "$work/profile1.json" --repeats 3 > "$work/profile1.log" 2>&1 ||
  { tail -20 "$work/profile1.log" >&2; exit 1; }
tail -1 "$work/profile1.log"
"$bin" simulate "${prof1[@]}" --cluster "$(preset 300mbit 1ph)" --profile "$work/profile1.json" --json "$work/fit1.json" |
  grep interference
slowdown1=$(fitted "$work/fit1.json" compute_slowdown) comm_slowdown1=$(fitted "$work/fit1.json" comm_slowdown)

# Simulate every case (the machine is quiet: GEMM timings).
for c in "${cases[@]}"; do
  IFS='|' read -r name rate place over <<< "$c"
  ks=$slowdown kc=$comm_slowdown
  [ "$place" = 1ph ] && ks=$slowdown1 kc=$comm_slowdown1
  # shellcheck disable=SC2086
  "$bin" simulate --config "$PWD/configs/demo.toml" "${model[@]}" $over --cluster "$(preset "$rate" "$place")" \
    --measure-gemm --compute-slowdown "$ks" --comm-slowdown "$kc" --json "$work/sim_$name.json" > "$work/sim_$name.log" 2>&1 ||
    { cat "$work/sim_$name.log" >&2; exit 1; }
done

# Measure: round r starts at case r, so a slow spell of the machine does not fall on one case only.
n=${#cases[@]}
for r in $(seq 0 $((rounds - 1))); do
  for k in $(seq 0 $((n - 1))); do
    IFS='|' read -r name rate place over <<< "${cases[$(( (k + r) % n ))]}"
    dir="$work/run_${name}_$r"
    # shellcheck disable=SC2086
    if launch "$rate" "$place" "$bin" train --config "$PWD/configs/demo.toml" "${model[@]}" $over --training.steps "$steps" \
        --training.eval_interval 0 --training.sample_tokens 0 --training.log_interval 1 --checkpoint.interval 0 \
        --output.dir "$dir" --output.overwrite true > "$work/run_${name}_$r.log" 2>&1; then
      echo "  round $((r + 1)) $name done"
    else
      echo "  round $((r + 1)) $name FAILED:"; tail -8 "$work/run_${name}_$r.log"
    fi
  done
done

python3 - "$work" "$rounds" "$slowdown" "$comm_slowdown" "$slowdown1" "$comm_slowdown1" "${cases[@]}" <<'PY'
import json, os, statistics, sys
work, rounds = sys.argv[1], int(sys.argv[2])
slowdown, comm_slowdown, slowdown1, comm_slowdown1 = map(float, sys.argv[3:7])
cases = sys.argv[7:]
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
pairs, correct, resolved, resolved_right = [], 0, 0, 0
for r in rows:
    if "-si" in r["case"]:
        off = r["case"].replace("-si", "-nosi")
        if off in by:
            o = by[off]
            ok = (r["predicted_s"] < o["predicted_s"]) == (r["measured_s"] < o["measured_s"])
            # A measured order counts as resolved when the two cases' step ranges do not overlap;
            # otherwise it is a tie within this machine's step-to-step spread.
            sep = r["max_s"] < o["min_s"] or o["max_s"] < r["min_s"]
            pairs.append(f"{r['case']} vs {off}: simulated {o['predicted_s'] / r['predicted_s']:.3f}x, "
                         f"measured {o['measured_s'] / r['measured_s']:.3f}x {'right' if ok else 'WRONG'}"
                         f"{'' if sep else ' (measured ranges overlap: a tie)'}")
            correct += ok
            resolved += sep
            resolved_right += sep and ok
for p in pairs:
    print("SI on vs off:", p)
med = statistics.median(errs) if errs else None
print(f"median |error| {100 * med:.1f}%, worst {100 * max(errs):.1f}% over {len(rows)} cases; "
      f"SI order right in {correct}/{len(pairs)} pairs ({resolved_right}/{resolved} of those the measurement resolves); "
      f"interference: compute x{slowdown}, collectives x{comm_slowdown} (one rank per host: x{slowdown1}, x{comm_slowdown1})")
print(json.dumps({"median_abs_error": round(med, 4) if med is not None else None,
                  "max_abs_error": round(max(errs), 4) if errs else None, "layouts": len(rows),
                  "si_order_correct": len(pairs) > 0 and correct == len(pairs), "si_pairs": len(pairs),
                  "si_pairs_right": correct, "si_pairs_resolved": resolved, "si_pairs_resolved_right": resolved_right,
                  "compute_slowdown": slowdown, "comm_slowdown": comm_slowdown, "compute_slowdown_1ph": slowdown1,
                  "comm_slowdown_1ph": comm_slowdown1, "rounds": rounds, "per_case": rows}))
PY
