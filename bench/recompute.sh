#!/usr/bin/env bash
# bench/recompute.sh [ROUNDS=3] [cpu_train ARGS...]: activation recomputation's cost and saving on
# the GPT-2 124M shape (cpu_train: one process, B=4 T=256 by default, fp32, no PyTorch peer):
# training.recompute none, selective and full, one cpu_train process each, alternating in every
# round (none, selective, full; the order rotates by one each round) so drift hits all alike.
# Prints each mode's median tokens/s over the rounds with its spread (min..max), its peak
# activation MiB (deterministic) and the ratios to none; the last line is one JSON object.
# Run via: scripts/bench recompute [ROUNDS] [--batch B] [--seq T] ...
set -euo pipefail
cd "$(dirname "$0")/.."
build=${DHELIX_BUILD:-build}
rounds=3
if [ $# -gt 0 ] && [[ "$1" =~ ^[0-9]+$ ]]; then rounds=$1; shift; fi
[ "$rounds" -ge 1 ] || { echo "bench/recompute.sh: ROUNDS must be >= 1 (got $rounds)" >&2; exit 2; }
cmake --build "$build" --target dhelix_bench_cpu_train >/dev/null
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
modes=(none selective full)
for ((r = 0; r < rounds; ++r)); do
  for ((k = 0; k < 3; ++k)); do
    m=${modes[$(((k + r) % 3))]}
    echo "round $((r + 1))/$rounds: recompute=$m" >&2
    "$build/bench/dhelix_bench_cpu_train" --no-torch --recompute "$m" "$@" > "$tmp/$m.$r.log"
    tail -1 "$tmp/$m.$r.log" > "$tmp/$m.$r.json"
  done
done
python3 - "$tmp" "$rounds" <<'EOF'
import json, statistics, sys
tmp, rounds = sys.argv[1], int(sys.argv[2])
out = {"rounds": rounds, "modes": {}}
for m in ("none", "selective", "full"):
    runs = [json.load(open(f"{tmp}/{m}.{r}.json")) for r in range(rounds)]
    tps = [x["tokens_per_s"] for x in runs]
    out["modes"][m] = {"tokens_per_s_median": statistics.median(tps), "tokens_per_s_min": min(tps),
                       "tokens_per_s_max": max(tps), "peak_activation_mib": runs[0]["peak_activation_mib"]}
base = out["modes"]["none"]
print(f"{'recompute':<12}{'tokens/s (median)':>20}{'min..max':>18}{'peak act MiB':>15}{'time x':>9}{'act x':>8}")
for m, v in out["modes"].items():
    v["step_time_vs_none"] = base["tokens_per_s_median"] / v["tokens_per_s_median"]
    v["peak_activation_vs_none"] = v["peak_activation_mib"] / base["peak_activation_mib"]
    rng = f"{v['tokens_per_s_min']:.0f}..{v['tokens_per_s_max']:.0f}"
    print(f"{m:<12}{v['tokens_per_s_median']:>20.1f}{rng:>18}{v['peak_activation_mib']:>15.1f}"
          f"{v['step_time_vs_none']:>9.3f}{v['peak_activation_vs_none']:>8.3f}")
print(json.dumps(out))
EOF
