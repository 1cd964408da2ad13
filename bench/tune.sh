#!/usr/bin/env bash
# bench/tune.sh [--rounds R] [--steps S]: issue 19's rank-agreement benchmark. On the emulated
# cluster (scripts/cluster: 2 hosts x 2 ranks, 1 Gbit/s between the hosts, loopback inside), every
# legal 4-rank layout of a GPT-2-class model -- Megatron tp x pp x dp and every 3D grid
# x * y * z * dp -- runs S steps (the first a warm-up) per round, R rounds, the layouts alternating
# between rounds; `dhelix tune --confirm` sets each median step beside the step model's prediction
# (configs/clusters/cpu-emulated.toml, GEMMs timed for their shapes here: --measure-gemm) and reports Kendall's tau, the top-1 regret and the median
# |error|. Then the 3D layout x=2 y=1 z=2 dp=1 with Strand Interleaving on and off, alternating, R
# rounds each. Last line: one JSON object with kendall_tau, top1_regret, median_abs_error, layouts,
# si_speedup_3d (median step SI off / SI on) and the per-layout figures. Needs root (scripts/cluster).
# Model: GPT-2's width (d 768, 12 heads) with 2 layers, a 2,048-token vocabulary (the demo's
# tokenizer has 2,000), T = 128, 8 sequences per step, micro-batch 1: a step of ~1-4 s here.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=3 steps=3
source bench/lib/cluster4.sh  # launch, model, cluster4_setup
cluster4_setup tune "$@"  # rounds, steps, bin, work
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
"$bin" tune "${model[@]}" --top 100 --confirm "$steps" --rounds "$rounds" --config "$PWD/configs/demo.toml" \
  --launch "$launch" --workdir "$work/all" --json "$work/all.json"

# Strand Interleaving on a 3D layout: on and off alternate, one round each at a time.
for r in $(seq 1 "$rounds"); do
  for si in on off; do
    "$bin" tune "${model[@]}" --only "x=2 y=1 z=2 dp=1" --si "$si" --confirm "$steps" --config "$PWD/configs/demo.toml" \
      --launch "$launch" --workdir "$work/si_$si" --json "$work/si_${si}_$r.json" | grep -E "round|predicted s" || true
  done
done
python3 - "$work" "$rounds" <<'PY'
import json, statistics, sys
work, rounds = sys.argv[1], int(sys.argv[2])
a = json.load(open(f"{work}/all.json"))
def steps(si):
    s = []
    for r in range(1, rounds + 1):
        for c in json.load(open(f"{work}/si_{si}_{r}.json"))["confirmed"]:
            s += c.get("step_s", [])
    return s
on, off = steps("on"), steps("off")
t_on, t_off = statistics.median(on), statistics.median(off)
print(f"3D x=2 y=1 z=2 dp=1: SI on median {t_on:.3f} s ({min(on):.3f}-{max(on):.3f}, {len(on)} steps), "
      f"SI off {t_off:.3f} s ({min(off):.3f}-{max(off):.3f}, {len(off)} steps): speedup {t_off / t_on:.3f}")
out = {"kendall_tau": round(a["kendall_tau"], 4), "top1_regret": round(a["top1_regret"], 4),
       "median_abs_error": round(a["median_abs_error"], 4), "layouts": a["layouts"],
       "si_speedup_3d": round(t_off / t_on, 4), "t_si_on_3d_s": round(t_on, 4), "t_si_off_3d_s": round(t_off, 4),
       "per_layout": [{"layout": c["layout"], "predicted_s": round(c["predicted_s"], 4),
                       "measured_s": round(c["measured_s"], 4) if "measured_s" in c else None}
                      for c in a["confirmed"]]}
print(json.dumps(out))
PY
