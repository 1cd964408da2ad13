#!/usr/bin/env bash
# bench/plan-wins.sh [--repeats R]: how often, and by how much, `dhelix plan`'s searched plans beat
# the default plan on this machine (issue 21). For each of several layer pairs on the emulated
# cluster (scripts/cluster: 2 hosts, one core each; shapes, sequence lengths, families, link rates
# and placements below): `dhelix profile`, then `dhelix plan --profile` -- the search, its
# candidates ranked by simulating the whole pair with the interference fitted from the profile,
# then every candidate and the default plan timed on the real layer pair, round-robin -- and the
# kept plan. Per case: the default's measured pair time, the best searched one's, their ratio, the
# kept plan, and whether the simulator's first candidate was the measured best of the searched
# (None when the simulated times of the candidates tie within 0.1%).
# Last line: one JSON object with cases, searched_kept (how many kept a searched plan), the median
# and best gain of the best searched plan over the default (measured), and the per-case figures.
# Needs root (scripts/cluster).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${DHELIX_BUILD:-build}
repeats=5
while [ $# -gt 0 ]; do
  case "$1" in
    --repeats) repeats=$2; shift 2 ;;
    *) echo "bench/plan-wins.sh: unknown argument '$1' (use --repeats R)" >&2; exit 2 ;;
  esac
done
cmake --build "$build" --target dhelix >/dev/null
bin="$PWD/$build/dhelix"
work=$(mktemp -d /tmp/dhelix_bench_planwins.XXXXXX)
trap 'rm -rf "$work"' EXIT
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1

gpt=(--model.preset gpt2-124m --model.vocab_size 2048)
llama=(--model.family llama --model.d_model 768 --model.n_heads 12 --model.n_kv_heads 4 --model.ffn_hidden 2048
       --model.vocab_size 2048)
# name | hosts x ranks per host | link | model + layout
cases=(
  "gpt-T128-tp2-x2hosts|1|1gbit|${gpt[*]} --model.seq_len 128 --parallel.tp 2"
  "gpt-T256-tp2-x2hosts|1|1gbit|${gpt[*]} --model.seq_len 256 --parallel.tp 2"
  "gpt-T128-tp2-x2hosts-300m|1|300mbit|${gpt[*]} --model.seq_len 128 --parallel.tp 2"
  "llama-T128-tp2-x2hosts|1|1gbit|${llama[*]} --model.seq_len 128 --parallel.tp 2"
  "gpt-T128-tp2dp2-inhost|2|1gbit|${gpt[*]} --model.seq_len 128 --parallel.tp 2 --parallel.dp 2"
)
common=(--training.micro_batch_size 1 --training.micro_batches 4 --training.threads 1)
for c in "${cases[@]}"; do
  IFS='|' read -r name per rate over <<< "$c"
  launch=(scripts/cluster --hosts 2 --rate "$rate" --np-per-host "$per" --map-by slot
          --mpirun-arg --mca --mpirun-arg mpi_yield_when_idle --mpirun-arg 1 --)
  echo "== $name"
  # shellcheck disable=SC2086
  "${launch[@]}" "$bin" profile "${common[@]}" $over --output.dir "$work/$name" --repeats 3 --out "$work/$name/profile.json" \
    > "$work/$name.profile.log" 2>&1 || { tail -20 "$work/$name.profile.log" >&2; exit 1; }
  # shellcheck disable=SC2086
  "${launch[@]}" "$bin" plan "${common[@]}" $over --output.dir "$work/$name" --profile "$work/$name/profile.json" \
    --top-k 4 --repeats "$repeats" --out "$work/$name/plan.json" --json "$work/$name/choice.json" \
    > "$work/$name.plan.log" 2>&1 || { tail -20 "$work/$name.plan.log" >&2; exit 1; }
  grep -E "interference|<- kept|^ +[0-9]+  (search|default)" "$work/$name.plan.log" || true
done

python3 - "$work" "${cases[@]}" <<'PY'
import json, statistics, sys
work, cases = sys.argv[1], sys.argv[2:]
rows = []
for c in cases:
    name = c.split("|")[0]
    j = json.load(open(f"{work}/{name}/choice.json"))
    cand = j["candidates"]
    default = [k for k in cand if k["source"] == "default"]
    searched = [k for k in cand if k["source"] != "default" and k["measured_s"] > 0]
    if not default or not searched:
        print(f"{name}: no default or no searched candidate timed"); continue
    d = default[0]["measured_s"]
    best = min(searched, key=lambda k: k["measured_s"])
    kept = cand[j["chosen"]]["source"]
    sim_first = searched[0]  # the candidates come in the simulator's order
    sims = [k["simulated_s"] for k in searched]
    tie = max(sims) - min(sims) <= 1e-3 * min(sims)  # the simulator cannot tell them apart
    rows.append({"case": name, "default_s": d, "best_searched_s": best["measured_s"],
                 "gain": round(d / best["measured_s"] - 1, 4), "kept": kept,
                 "sim_first_is_best": None if tie else sim_first is best, "candidates": len(searched),
                 "compute_slowdown": j.get("interference", {}).get("compute_slowdown")})
print(f"\n{'case':<28} {'default':>10} {'best searched':>14} {'gain':>7} {'kept':>10} {'sim 1st = best':>15}")  # None: simulated times tie
for r in rows:
    print(f"{r['case']:<28} {1e3 * r['default_s']:>8.2f}ms {1e3 * r['best_searched_s']:>12.2f}ms "
          f"{100 * r['gain']:>+6.1f}% {r['kept']:>10} {str(r['sim_first_is_best']):>15}")
gains = [r["gain"] for r in rows]
kept = sum(1 for r in rows if r["kept"] != "default")
print(f"a searched plan was kept in {kept} of {len(rows)} cases; best searched vs default: median "
      f"{100 * statistics.median(gains):+.1f}%, best {100 * max(gains):+.1f}%")
print(json.dumps({"cases": len(rows), "searched_kept": kept, "median_gain": round(statistics.median(gains), 4),
                  "best_gain": round(max(gains), 4), "per_case": rows}))
PY
