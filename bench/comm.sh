#!/usr/bin/env bash
# bench/comm.sh [--rounds R] [ARGS...]: the comm program (bench/comm.cc) on the emulated cluster --
# two hosts at 1 Gbit/s, one rank per host -- for gloo and mpi alternately, R rounds each (default
# 2), so drift hits both alike. Prints each run's table, then per transport the median over rounds
# of each op and size, the CPU per GB, and the fraction of the link's line rate (125 MB/s) that
# all-reduce reaches at 1 MiB; last, one JSON object:
#   {"gloo": {"busbw_gbps": {op: {bytes: GB/s}}, "cpu_s_per_gb": x, "line_rate_fraction_1mib": f},
#    "mpi": {...}}
# Needs root (scripts/cluster). mpi_yield_when_idle: Open MPI's blocking waits otherwise spin.
# Run via: scripts/bench comm [--rounds R] [--iters N] [--max-mib M]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${DHELIX_BUILD:-build}
rounds=2
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds=$2; shift 2 ;;
    *) args+=("$1"); shift ;;
  esac
done
cmake --build "$build" --target dhelix_bench_comm >/dev/null
prog="$PWD/$build/bench/dhelix_bench_comm"
out=$(mktemp)
trap 'rm -f "$out"' EXIT
for r in $(seq 1 "$rounds"); do
  for t in gloo mpi; do
    scripts/cluster --hosts 2 --rate 1gbit --np-per-host 1 --map-by slot --cpus "${DHELIX_CLUSTER_CPUS:-auto}" \
      --mpirun-arg --mca --mpirun-arg mpi_yield_when_idle --mpirun-arg 1 -- "$prog" --transport "$t" "${args[@]}" \
      | tee /dev/stderr | tail -1 >> "$out"
  done
done
/usr/bin/python3 - "$out" <<'PY'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
res = {}
for t in ("gloo", "mpi"):
    rs = [r for r in runs if r["transport"] == t]
    bw = {}
    for op in rs[0]["busbw_gbps"]:
        bw[op] = {b: statistics.median(r["busbw_gbps"][op][b] for r in rs) for b in rs[0]["busbw_gbps"][op]}
    line = 1e9 / 8 / 1e9  # GB/s of a 1 Gbit/s link
    res[t] = {"busbw_gbps": bw, "cpu_s_per_gb": statistics.median(r["cpu_s_per_gb"] for r in rs),
              "line_rate_fraction_1mib": bw["all_reduce"][str(1 << 20)] / line,
              "rounds": len(rs)}
print("\nmedians over rounds (busbw GB/s; line rate 0.125)")
ops = list(res["gloo"]["busbw_gbps"])
sizes = list(res["gloo"]["busbw_gbps"][ops[0]])
print(f"{'op':<16}{'bytes':>10}{'gloo':>10}{'mpi':>10}")
for op in ops:
    for b in sizes:
        print(f"{op:<16}{b:>10}{res['gloo']['busbw_gbps'][op][b]:>10.4f}{res['mpi']['busbw_gbps'][op][b]:>10.4f}")
for t in res:
    print(f"{t}: cpu {res[t]['cpu_s_per_gb']:.3f} s/GB, all_reduce 1 MiB at {res[t]['line_rate_fraction_1mib']:.2f} of line rate")
print(json.dumps(res))
PY
