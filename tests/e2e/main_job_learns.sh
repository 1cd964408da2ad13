#!/usr/bin/env bash
# The main job (the README's training command on configs/demo.toml) lowers the held-out loss well
# below its starting value within the run. Oracle: the run's own metrics file; "well below" =
# at least 1.5 nats lower than at step 0 (uniform over 2000 tokens is log 2000 = 7.6).
set -u
bin=$1; cd "$2"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
"$bin" train --config configs/demo.toml --output.dir "$tmp/run" > "$tmp/log" 2>&1 || { tail -30 "$tmp/log"; exit 1; }
grep -E "val loss|sample:" "$tmp/log"
python3 - "$tmp/run/metrics.jsonl" <<'PY'
import json, sys
vals = [json.loads(l)["val_loss"] for l in open(sys.argv[1]) if "val_loss" in l]
first, last = vals[0], vals[-1]
print(f"held-out loss: {first:.4f} -> {last:.4f}")
ok = last < first - 1.5
print("1 passed, 0 failed" if ok else "0 passed, 1 failed")
sys.exit(0 if ok else 1)
PY
