#!/usr/bin/env bash
# bench/si-overlap.sh [ARGS...]: the si_overlap program (bench/si_overlap.cc) on the emulated
# cluster — two hosts joined at 1 Gbit/s, one rank each, tp = 2 — so the tensor-parallel
# collectives are wire-bound and Strand Interleaving has something to hide. Defaults: GPT-2 124M
# shape, B=1, T=256, 4 micro-batches, 5 timed rounds after 1 warm-up. Needs root (scripts/cluster).
# mpi_yield_when_idle: Open MPI's blocking waits otherwise spin a full core while waiting on TCP;
# with two ranks on this 2-core machine a spinning comm thread takes the compute thread's core
# under SI (with blocking collectives it stretched the comm-only step ~4x: 10.5 s vs 2.6 s).
# Cores: each emulated host gets one of this machine's two cores (scripts/cluster --cpus auto), so
# under SI the comm thread's kernel TCP work (0.13-0.19 s of CPU per step for this shape's 300 MiB
# of tp traffic, measured) comes out of the same core's compute, as NCCL's SMs do on a GPU.
# DHELIX_CLUSTER_CPUS=none lets both hosts use both cores instead.
# Run via: scripts/bench si-overlap [--batch B] [--seq T] [--micro-batches M] [--steps N] [--trace P]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${DHELIX_BUILD:-build}
cmake --build "$build" --target dhelix_bench_si_overlap >/dev/null
exec scripts/cluster --hosts 2 --rate 1gbit --np-per-host 1 --cpus "${DHELIX_CLUSTER_CPUS:-auto}" --mpirun-arg --mca --mpirun-arg mpi_yield_when_idle \
  --mpirun-arg 1 -- "$PWD/$build/bench/dhelix_bench_si_overlap" \
  --preset gpt2-124m "$@"
