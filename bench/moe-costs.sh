#!/usr/bin/env bash
# bench/moe-costs.sh [--config C.toml]: issue 38's MoE cost check. One process, one thread: the
# config's model (default the moe demo; configs/demo.toml gives the dense twin) is trained for 6
# steps (the median of the last 4 is the measured step), its transformer layer's ops are each timed
# alone by `dhelix profile --max-window 1`, and `dhelix simulate --measure-gemm` prices the same
# step on this machine (a copy of the cpu-emulated preset with the whole core: core_share 1, as
# the run has). Printed: every layer op's measured and simulated time, busiest first, and the two
# steps. Nothing is fitted. Last line: one JSON object.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${DHELIX_BUILD:-build}
config=configs/moe-demo.toml
while [ $# -gt 0 ]; do
  case "$1" in
    --config) config=$2; shift 2 ;;
    *) echo "bench/moe-costs.sh: unknown argument '$1' (use --config C.toml)" >&2; exit 2 ;;
  esac
done
cmake --build "$build" --target dhelix >/dev/null
bin="$PWD/$build/dhelix"
work=$(mktemp -d /tmp/dhelix_bench_moe.XXXXXX)
trap 'rm -rf "$work"' EXIT
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
sed 's/^core_share = .*/core_share = 1.0/' configs/clusters/cpu-emulated.toml > "$work/cpu1.toml"
common=(--config "$config" --training.threads 1 --output.dir "$work/run")
"$bin" train "${common[@]}" --training.steps 6 --training.eval_interval 0 --training.sample_tokens 0 \
  > "$work/train.log" 2>&1 || { cat "$work/train.log" >&2; exit 1; }
"$bin" profile "${common[@]}" --max-window 1 --repeats 5 --out "$work/profile.json" > "$work/profile.log" 2>&1 ||
  { cat "$work/profile.log" >&2; exit 1; }
"$bin" simulate --config "$config" --cluster "$work/cpu1.toml" --measure-gemm --schedule.strand_interleaving off \
  --trace "$work/trace.json" --json "$work/sim.json" > "$work/sim.log" 2>&1 || { cat "$work/sim.log" >&2; exit 1; }
/usr/bin/python3 - "$work" "$config" <<'PY'
import collections, json, re, statistics, sys
work, config = sys.argv[1:3]
steps = [float(m.group(1)) for m in re.finditer(r"^step\s+\d+/\d+ \| loss .*\| ([0-9.]+) s$",
                                                  open(f"{work}/train.log").read(), re.M)]
measured = statistics.median(steps[2:])
prof = json.load(open(f"{work}/profile.json"))
name = lambda o: o if isinstance(o, str) else o["name"]
ops = {}
for key, names in (("solo_fwd", prof["meta"]["fwd_ops"]), ("solo_bwd", prof["meta"]["bwd_ops"])):
    for a, b, t in prof[key]:
        if b == a + 1:
            ops[name(names[a])] = t
trace = json.load(open(f"{work}/trace.json"))
events = trace["traceEvents"] if isinstance(trace, dict) else trace
L = json.load(open(f"{work}/sim.json"))
sim = collections.defaultdict(list)
for e in events:
    m = re.match(r"(\S+) mb\d+ u(\d+)$", e.get("name", ""))
    if e.get("ph") == "X" and m and m.group(1) in ops:
        sim[m.group(1)].append(e["dur"] * 1e-6)
rows = sorted(((ops[n], n, statistics.mean(sim[n])) for n in ops if sim.get(n)), reverse=True)
print(f"{config}: one process, one thread; each layer op alone (dhelix profile) against simulate --measure-gemm")
print(f"{'op':<26} {'measured ms':>12} {'simulated ms':>13} {'sim/meas':>9}")
for t, n, s in rows:
    print(f"{n:<26} {1e3 * t:>12.3f} {1e3 * s:>13.3f} {s / t if t > 0 else 0:>9.2f}")
lm, ls = sum(r[0] for r in rows), sum(r[2] for r in rows)
print(f"layer ops summed: measured {1e3 * lm:.2f} ms, simulated {1e3 * ls:.2f} ms ({ls / lm:.2f}x)")
print(f"step: measured {measured:.3f} s (median of steps 3-6: {', '.join(f'{s:.3f}' for s in steps[2:])}), "
      f"simulated {L['step_s']:.3f} s ({L['step_s'] / measured:.2f}x)")
print(json.dumps({"config": config, "measured_step_s": round(measured, 4), "simulated_step_s": round(L["step_s"], 4),
                  "sim_over_measured": round(L["step_s"] / measured, 3), "layer_ops_measured_ms": round(1e3 * lm, 3),
                  "layer_ops_simulated_ms": round(1e3 * ls, 3),
                  "ops": {n: {"measured_ms": round(1e3 * t, 3), "simulated_ms": round(1e3 * s, 3)} for t, n, s in rows}}))
PY
