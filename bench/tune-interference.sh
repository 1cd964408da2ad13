#!/usr/bin/env bash
# bench/tune-interference.sh [--measured FILE] [--repeats R] [--prices N]: does charging the co-execution
# interference measured on the emulated cluster bring `dhelix tune`'s predictions closer to measured
# steps? 1. `dhelix profile` of the tune bench model's tp=2 dp=2 layer pair on the cluster
# (bench/lib/cluster4.sh: 2 hosts x 2 ranks, 1 Gbit/s), and `dhelix simulate --profile` fits the
# compute slowdown beside a collective and the collectives' beside compute on its pairs (Interference.h).
# 2. `dhelix tune --pipeline all --only` prices bench/tune-pipelines.sh's 12 configurations (tp=1 pp=2
# dp=2 and tp=2 pp=2 dp=1, each schedule, SI off and on) without interference and with the fitted
# factors (--compute-slowdown, --comm-slowdown), N rounds alternating (default 3; each call times the
# GEMM shapes anew, so the predictions vary run to run: their medians and ranges). 3. Both sets of
# predictions against the measured medians of a tune-pipelines run (FILE, default the committed
# bench/results/tune-pipelines-2026-11-29-cpu.json; measured on the same engine: only the pricing
# changed since). Prints per configuration measured, predicted without and with, and over all 12
# Kendall's tau, the median error and the schedule picks, each without and with; the SI rows'
# errors apart. Last line: one JSON object. Needs root (scripts/cluster). Nothing runs but the profile.
set -euo pipefail
cd "$(dirname "$0")/.."
measured=bench/results/tune-pipelines-2026-11-29-cpu.json repeats=3 prices=3
while [ $# -gt 0 ]; do
  case "$1" in
    --measured) measured=$2; shift 2 ;;
    --repeats) repeats=$2; shift 2 ;;
    --prices) prices=$2; shift 2 ;;
    *) echo "bench/tune-interference.sh: unknown argument '$1' (use --measured FILE --repeats R --prices N)" >&2
       exit 2 ;;
  esac
done
[ -f "$measured" ] || { echo "bench/tune-interference.sh: --measured '$measured' does not exist" >&2; exit 2; }
rounds=1 steps=1
source bench/lib/cluster4.sh  # launch, model, cluster4_setup
cluster4_setup tune-interference
for i in "${!model[@]}"; do [ "${model[$i]}" = "--layers" ] && model[$((i + 1))]=4; done
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1

# 1. The interference, fitted on a profile of the model's tp=2 dp=2 layer pair on the cluster.
cfg=(--config "$PWD/configs/demo.toml" --model.family gpt --model.vocab_size 2048 --model.seq_len 128
     --model.d_model 768 --model.n_heads 12 --model.n_kv_heads 12 --model.ffn_hidden 3072
     --model.tie_embeddings true --training.micro_batch_size 1 --model.n_layers 2 --parallel.tp 2
     --parallel.dp 2 --training.micro_batches 2 --output.dir "$work/profile")
echo "profiling the tp=2 dp=2 layer pair on the cluster ($repeats repeats) ..."
# shellcheck disable=SC2086  # $launch is the launcher's words
$launch "$bin" profile "${cfg[@]}" --out "$work/profile.json" --repeats "$repeats" > "$work/profile.log" 2>&1 ||
  { tail -20 "$work/profile.log" >&2; exit 1; }
tail -1 "$work/profile.log"
"$bin" simulate "${cfg[@]}" --cluster cpu-emulated --profile "$work/profile.json" --json "$work/fit.json" |
  grep interference
ks=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['compute_slowdown'])" "$work/fit.json")
kc=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['comm_slowdown'])" "$work/fit.json")

# 2. The 12 configurations priced without and with it, R rounds alternating (each call times the
# GEMM shapes anew, --measure-gemm: the medians over the rounds).
layouts="tp=1 pp=2 dp=2,tp=2 pp=2 dp=1"
for r in $(seq 1 "$prices"); do
  for si in off on; do
    "$bin" tune "${model[@]}" --pipeline all --si "$si" --only "$layouts" --top 6 \
      --json "$work/none_${si}_$r.json" > /dev/null
    "$bin" tune "${model[@]}" --pipeline all --si "$si" --only "$layouts" --top 6 \
      --compute-slowdown "$ks" --comm-slowdown "$kc" --json "$work/fitted_${si}_$r.json" > /dev/null
  done
done

# 3. Against the measured medians.
/usr/bin/python3 - "$work" "$measured" "$ks" "$kc" "$prices" <<'PY'
import itertools, json, statistics, sys
work, measured_path, ks, kc, prices = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
fit = json.load(open(f"{work}/fit.json"))
meas = {(r["layout"], r["pipeline"], r["si"]): r["median_s"] for r in json.load(open(measured_path))["runs"]}
pred = {"none": {}, "fitted": {}}
spread = {"none": {}, "fitted": {}}
for kind in pred:
    got = {}
    for si in ("off", "on"):
        for n in range(1, prices + 1):
            for r in json.load(open(f"{work}/{kind}_{si}_{n}.json"))["ranked"]:
                got.setdefault((r["layout"], r["pipeline"], si), []).append(r["step_s"])
    for k, v in got.items():
        pred[kind][k] = statistics.median(v)
        spread[kind][k] = (min(v), max(v))
keys = sorted(k for k in meas if k in pred["none"] and k in pred["fitted"])
out = {"measured": measured_path, "model": "gpt2 width, 4 layers, vocab 2048, T 128, 8 sequences a step",
       "cluster": "2 hosts x 2 ranks, 1 Gbit/s",
       "interference": {"compute_slowdown": ks, "comm_slowdown": kc,
                        **fit.get("interference_fit", {})},
       "runs": []}
print(f"interference fitted: compute x{ks}, collectives x{kc}")
print(f"{'configuration':<36} {'measured':>9} {'none':>9} {'fitted':>9}")
for k in keys:
    m, a, b = meas[k], pred["none"][k], pred["fitted"][k]
    print(f"{k[0] + ' ' + k[1] + ' SI ' + k[2]:<36} {m:>9.3f} {a:>9.3f} ({100 * (a / m - 1):+5.1f}%) "
          f"{b:>9.3f} ({100 * (b / m - 1):+5.1f}%)")
    out["runs"].append({"layout": k[0], "pipeline": k[1], "si": k[2], "median_s": m,
                        "predicted_s": round(a, 4), "predicted_interference_s": round(b, 4),
                        "predicted_range_s": [round(x, 4) for x in spread["none"][k]],
                        "predicted_interference_range_s": [round(x, 4) for x in spread["fitted"][k]]})
out["price_rounds"] = prices

def summary(kind):
    p = [pred[kind][k] for k in keys]
    m = [meas[k] for k in keys]
    pairs = list(itertools.combinations(range(len(p)), 2))
    agree = sum((p[i] - p[j]) * (m[i] - m[j]) > 0 for i, j in pairs)
    disagree = sum((p[i] - p[j]) * (m[i] - m[j]) < 0 for i, j in pairs)
    picks = 0
    for lay, si in {(k[0], k[2]) for k in keys}:
        rows = [k for k in keys if k[0] == lay and k[2] == si]
        picks += min(rows, key=lambda k: pred[kind][k]) == min(rows, key=lambda k: meas[k])
    si_err = [abs(pred[kind][k] / meas[k] - 1) for k in keys if k[2] == "on"]
    # SI's predicted gain per layout and schedule against the measured one
    gains = [(pred[kind][(l, s, "off")] / pred[kind][(l, s, "on")], meas[(l, s, "off")] / meas[(l, s, "on")])
             for l, s, si in keys if si == "off" and (l, s, "on") in meas]
    return {"kendall_tau": round((agree - disagree) / len(pairs), 3),
            "median_abs_error": round(statistics.median(abs(a / b - 1) for a, b in zip(p, m)), 3),
            "si_on_median_abs_error": round(statistics.median(si_err), 3),
            "si_gain_median_abs_error": round(statistics.median(abs(g - h) for g, h in gains), 3),
            "picks_right": picks}
out["without"], out["with_interference"] = summary("none"), summary("fitted")
for name in ("without", "with_interference"):
    s = out[name]
    print(f"{name:<18}: Kendall tau {s['kendall_tau']}, median |error| {100 * s['median_abs_error']:.1f}% "
          f"(SI on {100 * s['si_on_median_abs_error']:.1f}%), SI gain off/on median |error| "
          f"{s['si_gain_median_abs_error']:.3f}, fastest schedule picked in {s['picks_right']} of 4")
print(json.dumps(out))
PY
