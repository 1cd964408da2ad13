#!/usr/bin/env bash
# bench/moe-si.sh [ARGS...]: how much of a MoE model's expert-parallel all-to-all traffic Strand
# Interleaving hides. The si_overlap program (bench/si_overlap.cc, --group ep) on the emulated
# cluster: two hosts joined at 1 Gbit/s, one rank each, dp = ep = 2 (each host half the experts and
# its own tokens), so the token all-to-alls are wire-bound. Defaults: the moe-demo preset (8 experts,
# top-2), B=4, T=128, 4 micro-batches, 5 timed rounds after 1 warm-up. One run measures, alternating,
# the step with SI off (T_off) and on (T_si), compute only (C: all-to-alls as local copies) and the
# all-to-alls alone (A2A: the step's exchanges replayed with balanced routing). The last line is one
# JSON object with t_off_s, t_si_s, compute_s, a2a_s, hidden_fraction = (T_off - T_si) / min(C, A2A),
# speedup and ideal_speedup (and si_overlap's other figures). Needs root (scripts/cluster).
# Cores, Open MPI's yield setting: as bench/si-overlap.sh.
# Run via: scripts/bench moe-si [--batch B] [--seq T] [--micro-batches M] [--steps N] [--trace P]
set -euo pipefail
cd "$(dirname "$0")/.."
# si-overlap.sh's launch with the ep group; the later --preset overrides its default.
exec bash bench/si-overlap.sh --group ep --preset moe-demo --batch 4 --seq 128 "$@"
