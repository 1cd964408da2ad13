#!/usr/bin/env bash
# bench/keep-gathered.sh [--rounds R] [--steps S]: AxoNN's weight caching (parallel.keep_gathered) on
# the emulated cluster (scripts/cluster: 2 hosts x 2 ranks, 1 Gbit/s between the hosts, loopback
# inside), the 3D layout x=2 y=1 z=2 dp=1 whose z channel is the step's busiest resource
# (bench/tune.sh). Four runs per round, alternating: every layer's gathered blocks kept or gathered
# again, each without and with full recompute (which gathers the blocks a third time); S steps a run
# (the first a warm-up), R rounds; `dhelix tune --confirm` sets each run's median step beside the step
# model's prediction (configs/clusters/cpu-emulated.toml, GEMMs timed here: --measure-gemm). Printed:
# median step (min-max) per run, the speedup of keeping (median gathering / median kept), the z bytes
# per rank the model counts, the memory it predicts. Last line: one JSON object. Needs root
# (scripts/cluster). Model: bench/tune.sh's (GPT-2's width, 2 layers, vocabulary 2,048, T = 128,
# 8 sequences a step, micro-batch 1), Strand Interleaving on.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=3 steps=4
source bench/lib/cluster4.sh  # launch, model, cluster4_setup
cluster4_setup keep-gathered "$@"  # rounds, steps, bin, work
model+=(--only "x=2 y=1 z=2 dp=1" --si on)
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
for r in $(seq 1 "$rounds"); do
  for rc in none full; do
    for keep in 0 2; do
      name="rc_${rc}_keep_${keep}"
      "$bin" tune "${model[@]}" --recompute "$rc" --keep-gathered "$keep" --confirm "$steps" \
        --config "$PWD/configs/demo.toml" --launch "$launch" --workdir "$work/$name" \
        --json "$work/${name}_$r.json" | grep -E "round|predicted s" || true
    done
  done
done
/usr/bin/python3 - "$work" "$rounds" <<'PY'
import json, statistics, sys
work, rounds = sys.argv[1], int(sys.argv[2])
out = {"layout": "x=2 y=1 z=2 dp=1", "si": "on", "runs": {}}
for rc in ("none", "full"):
    for keep in (0, 2):
        name = f"rc_{rc}_keep_{keep}"
        steps, pred, z, mem = [], None, None, None
        for r in range(1, rounds + 1):
            j = json.load(open(f"{work}/{name}_{r}.json"))
            for c in j["confirmed"]:
                steps += c.get("step_s", [])
                pred = c["predicted_s"]
            row = j["ranked"][0]
            z, mem = row["axes"]["z"]["bytes"], row["memory_bytes"]["total"]
        out["runs"][name] = {"recompute": rc, "keep_gathered": keep, "median_s": round(statistics.median(steps), 4),
                             "min_s": round(min(steps), 4), "max_s": round(max(steps), 4), "steps": len(steps),
                             "predicted_s": round(pred, 4), "z_bytes_per_rank": z, "memory_bytes": mem}
for rc in ("none", "full"):
    g, k = out["runs"][f"rc_{rc}_keep_0"], out["runs"][f"rc_{rc}_keep_2"]
    out[f"speedup_recompute_{rc}"] = round(g["median_s"] / k["median_s"], 4)
    out[f"predicted_speedup_recompute_{rc}"] = round(g["predicted_s"] / k["predicted_s"], 4)
    for name, v in (("gathering again", g), ("kept", k)):
        print(f"recompute {rc:<4} {name:<16} median {v['median_s']:.3f} s ({v['min_s']:.3f}-{v['max_s']:.3f}, "
              f"{v['steps']} steps), predicted {v['predicted_s']:.3f} s, z {v['z_bytes_per_rank'] / 2**20:.1f} MiB "
              f"per rank, memory {v['memory_bytes'] / 2**20:.0f} MiB")
    print(f"recompute {rc}: keeping the blocks speeds the step {out[f'speedup_recompute_{rc}']:.3f}x "
          f"(predicted {out[f'predicted_speedup_recompute_{rc}']:.3f}x)")
print(json.dumps(out))
PY
