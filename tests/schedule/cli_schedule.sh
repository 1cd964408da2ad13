#!/usr/bin/env bash
# `dhelix schedule`: a W schedule is printed (every rank) and drawn as SVG; bad input exits 2 with
# every error named. Oracle: the documented exit codes (0 success, 2 bad input), the values and
# rules named in pipeline_spec_errors' messages, and the SVG's opening tag.
# Usage: cli_schedule.sh DHELIX_BINARY  (needs no data, no hardware)
set -u
bin=$1
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
verb=schedule
source "$(dirname "${BASH_SOURCE[0]}")/../cli_lib.sh"

# 1. A W schedule over 4 ranks, printed and drawn.
out=$("$bin" schedule --pp 4 --micro-batches 8 --pipeline w --svg "$tmp/w.svg" 2>&1); rc=$?
if [ $rc -eq 0 ] && grep -q "rank 3" <<<"$out" && grep -q "wrote $tmp/w.svg" <<<"$out" \
   && [ -f "$tmp/w.svg" ] && [ "$(head -c 4 "$tmp/w.svg")" = "<svg" ] && grep -q "rank 3</text>" "$tmp/w.svg"; then
  ok w_schedule_svg
else
  fail w_schedule_svg; echo "exit $rc"; echo "$out" | tail -15
fi

# 2. --help prints the usage and exits 0.
out=$("$bin" schedule --help 2>&1); rc=$?
if [ $rc -eq 0 ] && grep -q -- "--micro-batches" <<<"$out"; then ok help; else fail help; echo "$out"; fi

# 3. Bad input: exit 2, the bad value named; several errors all listed; no SVG written.
expect_bad unknown_pipeline "zigzag" -- --pipeline zigzag --svg "$tmp/bad.svg"
expect_bad two_spec_errors "model.n_layers=12 is not divisible by 2 x parallel.pp = 8" \
  "training.micro_batches=3 is below parallel.pp=4" -- --pp 4 --micro-batches 3 --pipeline w --layers 12
expect_bad non_integer_pp "--pp expects an integer, got 'x'" -- --pp x
expect_bad unknown_flag "unknown flag '--stages'" "--si 'maybe'" -- --stages 3 --si maybe
if [ -e "$tmp/bad.svg" ]; then fail no_svg_on_bad_input; else ok no_svg_on_bad_input; fi

summary
