#!/usr/bin/env bash
# bench/pp.sh [ARGS...]: the pp program (bench/pp.cc) on the emulated cluster -- two hosts at
# 1 Gbit/s, one pipeline stage per host -- first with one rank per host (pp = 2), then with two
# (pp = 2 x tp = 2: the tp pair of a stage inside its host, the P2P between hosts). Each run
# prints its table and JSON line; this script prints, last, one JSON object with both
# ({"pp2": {...}, "pp2_tp2": {...}}). Defaults: GPT-2 124M shape with an 8,192-token vocabulary,
# B=1, T=256, 8 micro-batches, 3 timed rounds after a warm-up. Needs root (scripts/cluster).
# mpi_yield_when_idle: Open MPI's blocking waits otherwise spin a core (bench/si-overlap.sh).
# Run via: scripts/bench pp [--batch B] [--seq T] [--micro-batches N] [--rounds R]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${DHELIX_BUILD:-build}
cmake --build "$build" --target dhelix_bench_pp >/dev/null
prog="$PWD/$build/bench/dhelix_bench_pp"
out=$(mktemp)
trap 'rm -f "$out"' EXIT
declare -A json
for per_host in 1 2; do
  key=$([ "$per_host" = 1 ] && echo pp2 || echo pp2_tp2)
  scripts/cluster --hosts 2 --rate 1gbit --np-per-host "$per_host" --map-by slot --cpus "${DHELIX_CLUSTER_CPUS:-auto}" \
    --mpirun-arg --mca --mpirun-arg mpi_yield_when_idle --mpirun-arg 1 -- "$prog" "$@" | tee "$out"
  json[$key]=$(tail -1 "$out")
done
echo "{\"pp2\":${json[pp2]},\"pp2_tp2\":${json[pp2_tp2]}}"
