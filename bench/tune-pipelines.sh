#!/usr/bin/env bash
# bench/tune-pipelines.sh [--rounds R] [--steps S]: `dhelix tune --pipeline all`'s ranking of the
# pipeline schedules against measured steps on the emulated cluster (bench/lib/cluster4.sh: 2 hosts
# x 2 ranks, 1 Gbit/s between them). The model is bench/tune.sh's with 4 layers (so the W's and
# interleaved v = 2's four chunks divide them at pp = 2); the layouts tp=1 pp=2 dp=2 and tp=2 pp=2
# dp=1, each under 1F1B, interleaved (v = 2) and the W, Strand Interleaving off and on: 12 runs a
# round, each `tune --confirm` run S steps (the first a warm-up), R rounds with SI off and on
# alternating. Prints, per layout and SI setting, the schedules' median measured steps (with their
# range) beside the predicted ones, whether the predicted fastest schedule is the measured fastest,
# and over all 12 configurations Kendall's tau and the median error. Last line: one JSON object.
# Needs root (scripts/cluster).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=3 steps=4
source bench/lib/cluster4.sh  # launch, model, cluster4_setup
cluster4_setup tune-pipelines "$@"  # rounds, steps, bin, work
# The 4-layer model (W and interleaved chunks divide it), both pipelined layouts of 4 ranks.
for i in "${!model[@]}"; do [ "${model[$i]}" = "--layers" ] && model[$((i + 1))]=4; done
layouts="tp=1 pp=2 dp=2,tp=2 pp=2 dp=1"
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
for r in $(seq 1 "$rounds"); do
  for si in off on; do
    "$bin" tune "${model[@]}" --pipeline all --si "$si" --only "$layouts" --top 6 --confirm "$steps" \
      --config "$PWD/configs/demo.toml" --launch "$launch" --workdir "$work/si_$si" \
      --json "$work/si_${si}_$r.json" | grep -E "round|agreement" || true
  done
done
/usr/bin/python3 - "$work" "$rounds" <<'PY'
import itertools, json, statistics, sys
work, rounds = sys.argv[1], int(sys.argv[2])
runs = {}
for si in ("off", "on"):
    for r in range(1, rounds + 1):
        j = json.load(open(f"{work}/si_{si}_{r}.json"))
        for c in j["confirmed"]:
            key = (c["layout"], c["pipeline"], si)
            v = runs.setdefault(key, {"steps": [], "predicted_s": c["predicted_s"]})
            v["steps"] += c.get("step_s", [])
out = {"model": "gpt2 width, 4 layers, vocab 2048, T 128, 8 sequences a step", "cluster": "2 hosts x 2 ranks, 1 Gbit/s",
       "runs": [], "schedule_pick": {}}
pred, meas = [], []
for (lay, pipe, si), v in sorted(runs.items()):
    if not v["steps"]:
        print(f"{lay} {pipe} SI {si}: no measured step (the run failed)")
        continue
    med = statistics.median(v["steps"])
    out["runs"].append({"layout": lay, "pipeline": pipe, "si": si, "median_s": round(med, 4),
                        "min_s": round(min(v["steps"]), 4), "max_s": round(max(v["steps"]), 4),
                        "steps": len(v["steps"]), "predicted_s": round(v["predicted_s"], 4)})
    pred.append(v["predicted_s"]), meas.append(med)
for lay in sorted({r["layout"] for r in out["runs"]}):
    for si in ("off", "on"):
        rows = [r for r in out["runs"] if r["layout"] == lay and r["si"] == si]
        if not rows:
            continue
        print(f"{lay}, SI {si}:")
        for r in sorted(rows, key=lambda r: r["median_s"]):
            print(f"  {r['pipeline']:<12} median {r['median_s']:.3f} s ({r['min_s']:.3f}-{r['max_s']:.3f}, "
                  f"{r['steps']} steps), predicted {r['predicted_s']:.3f} s ({100 * (r['predicted_s'] / r['median_s'] - 1):+.1f}%)")
        best_m = min(rows, key=lambda r: r["median_s"])["pipeline"]
        best_p = min(rows, key=lambda r: r["predicted_s"])["pipeline"]
        out["schedule_pick"][f"{lay}, SI {si}"] = {"predicted": best_p, "measured": best_m}
        print(f"  fastest: predicted {best_p}, measured {best_m}")
pairs = list(itertools.combinations(range(len(pred)), 2))
agree = sum((pred[i] - pred[j]) * (meas[i] - meas[j]) > 0 for i, j in pairs)
disagree = sum((pred[i] - pred[j]) * (meas[i] - meas[j]) < 0 for i, j in pairs)
out["kendall_tau"] = round((agree - disagree) / len(pairs), 3) if pairs else None
out["median_abs_error"] = round(statistics.median(abs(p / m - 1) for p, m in zip(pred, meas)), 3) if pred else None
out["picks_right"] = sum(v["predicted"] == v["measured"] for v in out["schedule_pick"].values())
print(f"over {len(pred)} configurations: Kendall tau {out['kendall_tau']}, median |error| "
      f"{100 * out['median_abs_error']:.1f}%, fastest schedule picked right in {out['picks_right']} of "
      f"{len(out['schedule_pick'])}")
print(json.dumps(out))
PY
