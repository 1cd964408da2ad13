#!/usr/bin/env bash
# bench/cp-si.sh [ARGS...]: how much of context parallelism's ring traffic Strand Interleaving hides.
# The si_overlap program (bench/si_overlap.cc, --group cp) on the emulated cluster: two hosts joined
# at 1 Gbit/s, one rank each, cp = 2 (each host two of the four chunks of every sequence), so the
# ring attention's key/value exchanges (and the backward's travelling dK/dV) are wire-bound.
# Defaults: the demo preset (Llama, d 256, 4 layers, GQA 8/4 heads), B=1, a long sequence T=2048
# (1024 rows per rank; the preset's context is raised to it), 4 micro-batches, 5 timed rounds after
# 1 warm-up. One run measures, alternating, the step with SI off (T_off) and on (T_si), compute only
# (C: the ring's exchanges as local copies) and the exchanges alone (ring_s: the step's ring steps
# replayed back to back). The last line is one JSON object with t_off_s, t_si_s, compute_s, ring_s,
# hidden_fraction = (T_off - T_si) / min(C, ring), speedup and ideal_speedup (and si_overlap's other
# figures). T_off already overlaps each ring step with the same strand's attention step (the next
# keys travel while this step computes), as TransformerEngine does; SI adds the other strand's
# compute. Needs root (scripts/cluster). Cores, Open MPI's yield setting: as bench/si-overlap.sh.
# Run via: scripts/bench cp-si [--batch B] [--seq T] [--micro-batches M] [--steps N] [--trace P]
set -euo pipefail
cd "$(dirname "$0")/.."
exec bash bench/si-overlap.sh --group cp --preset demo --batch 1 --seq 2048 "$@"
