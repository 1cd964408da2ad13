#!/usr/bin/env bash
# scripts/bench dp-overlap [ROUNDS]: how much of the gradient traffic a step hides, on the emulated
# cluster (scripts/cluster: 2 hosts x 1 rank over a 1 Gbit/s tbf-shaped link), demo model, for
# dp=2 (bucketed dp all-reduce overlapped with backward) and tp=2 (sequence-parallel collectives
# under Strand Interleaving), and dp=2 again with the gradient buckets in bf16 on the wire (dp16).
# bench/dp-overlap.cc defines every figure; this script builds it, runs the layouts, prints their
# tables and, last, one JSON object:
#   {"dp_comm_hidden_fraction": ..., "dp": {...}, "dp_bf16_grads": {...}, "tp": {...}}
# Open MPI runs with mpi_yield_when_idle=1: a blocking collective otherwise spins its comm thread
# on a core the compute threads need (this machine has 2 cores for both hosts' ranks).
# Each emulated host gets one core (scripts/cluster --cpus auto); DHELIX_CLUSTER_CPUS=none lets
# both hosts use both cores. Needs root (network namespaces).
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-10}
BUILD=${DHELIX_BUILD:-build}
[ "$(id -u)" -eq 0 ] || { echo "dp-overlap: needs root for scripts/cluster (network namespaces)" >&2; exit 2; }
if [ ! -f "$BUILD/build.ninja" ] && [ ! -f "$BUILD/Makefile" ]; then
  gen=(); command -v ninja >/dev/null && gen=(-G Ninja)
  cmake -S . -B "$BUILD" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release >&2
fi
cmake --build "$BUILD" --target dhelix_bench_dp-overlap >&2
BIN=$(cd "$BUILD" && pwd)/bench/dhelix_bench_dp-overlap
work=$(mktemp -d /tmp/dhelix_dp_overlap.XXXXXX)
trap 'rm -rf "$work"' EXIT
yield=(--mpirun-arg --mca --mpirun-arg mpi_yield_when_idle --mpirun-arg 1)
for layout in dp dp16 tp; do
  scripts/cluster --hosts 2 --rate 1gbit --np-per-host 1 --cpus "${DHELIX_CLUSTER_CPUS:-auto}" "${yield[@]}" -- "$BIN" "$layout" "$work/$layout" "$ROUNDS" \
    > "$work/$layout.out"
  grep -v '^{' "$work/$layout.out" | grep -v '^cluster:' || true
  tail -n 1 "$work/$layout.out" > "$work/$layout.json"
done
python3 - "$work/dp.json" "$work/dp16.json" "$work/tp.json" <<'PY'
import json, sys
dp, dp16, tp = (json.load(open(p)) for p in sys.argv[1:4])
print(json.dumps({"dp_comm_hidden_fraction": dp["dp_comm_hidden_fraction"], "dp": dp, "dp_bf16_grads": dp16, "tp": tp}))
PY
