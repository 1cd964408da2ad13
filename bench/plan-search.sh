#!/usr/bin/env bash
# bench/plan-search.sh [--seq T] [--repeats R] [--rounds N]: the SI planner end to end.
#  (a) search_s: search time for one Llama-70B-shaped layer pair (tp=8, SP) from a full profile
#      table priced by the cost model (bench/plan_search.cc, one process, no cluster).
#  (b) on the emulated cluster of bench/si-overlap.sh (two hosts at 1 Gbit/s, one rank each,
#      tp=2, GPT-2 124M shape, B=1, T=256, 4 micro-batches): `dhelix profile`, then `dhelix plan`
#      (top-k search + validation on the real layer pair), then one run timing training steps with
#      the searched plan and with the default plan, round-robin (planned_t_s, default_t_s).
# Prints a table, then one JSON line: {"search_s", "planned_t_s", "default_t_s", ...}. Needs root.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${DHELIX_BUILD:-build}
seq=256 repeats=3 rounds=3
while [ $# -gt 0 ]; do
  case "$1" in
    --seq) seq=$2; shift 2 ;;
    --repeats) repeats=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    *) echo "plan-search: unknown option '$1'" >&2; exit 2 ;;
  esac
done
cmake --build "$build" --target dhelix dhelix_bench_plan_search >/dev/null
dhelix=$PWD/$build/dhelix bench=$PWD/$build/bench/dhelix_bench_plan_search
tmp=$(mktemp -d /tmp/dhx-plan-search.XXXXXX); trap 'rm -rf "$tmp"' EXIT

echo "== (a) search time, Llama-70B layer pair from a profile table"
"$bench" | tee "$tmp/search.log"

# Same cluster recipe as bench/si-overlap.sh (mpi_yield_when_idle: see there).
cluster=(scripts/cluster --hosts 2 --rate 1gbit --np-per-host 1 --mpirun-arg --mca --mpirun-arg mpi_yield_when_idle
         --mpirun-arg 1 --)
run=(--model.preset gpt2-124m --model.seq_len "$seq" --training.micro_batch_size 1 --training.micro_batches 4
     --parallel.tp 2 --training.threads 1)

echo; echo "== (b1) dhelix profile on the emulated cluster (2 hosts, 1 Gbit/s, tp=2)"
t0=$(date +%s)
"${cluster[@]}" "$dhelix" profile "${run[@]}" --repeats "$repeats" --warmup 1 --out "$tmp/profile.json" 2>&1 \
  | grep -v '^cluster:' | tee "$tmp/profile.log"
profile_s=$(( $(date +%s) - t0 ))
echo; echo "== (b2) dhelix plan (top-4 search + validation on the real layer pair)"
"${cluster[@]}" "$dhelix" plan "${run[@]}" --profile "$tmp/profile.json" --top-k 4 --repeats 5 \
  --out "$tmp/plan.json" 2>&1 | grep -v '^cluster:' | tee "$tmp/plan.log"
echo; echo "== (b3) training steps: searched plan vs default plan, one run"
"${cluster[@]}" "$bench" --compare "$tmp/plan.json" --workdir "$tmp/work" --rounds "$rounds" "${run[@]}" 2>&1 \
  | grep -v '^cluster:' | tee "$tmp/compare.log"

python3 - "$tmp" "$profile_s" <<'PY'
import json, sys
tmp, profile_s = sys.argv[1], float(sys.argv[2])
last = lambda f: json.loads([l for l in open(f"{tmp}/{f}") if l.startswith("{")][-1])
s, c = last("search.log"), last("compare.log")
kept = [l for l in open(f"{tmp}/plan.log") if "<- kept" in l]
plan = json.load(open(f"{tmp}/plan.json"))
out = {"search_s": s["search_s"], "planned_t_s": c["planned_t_s"], "default_t_s": c["default_t_s"],
       "speedup_default_over_planned": c["default_t_s"] / c["planned_t_s"],
       "plan_source": plan["source"], "plan_blocks": len(plan["blocks"]), "profile_wall_s": profile_s}
print()
print("plan-search summary")
print(f"  {'search time, llama-70b pair (tp=8)':<40} {out['search_s']:.6f} s   (target < 1 s)")
print(f"  {'profile on the cluster (wall)':<40} {profile_s:.0f} s")
print(f"  {'kept plan':<40} {out['plan_source']}, {out['plan_blocks']} blocks")
print(f"  {'step, searched plan (gpt2-124m, tp=2)':<40} {out['planned_t_s']:.3f} s")
print(f"  {'step, default plan':<40} {out['default_t_s']:.3f} s")
print(f"  {'default / searched':<40} {out['speedup_default_over_planned']:.3f}")
print(json.dumps(out))
PY
