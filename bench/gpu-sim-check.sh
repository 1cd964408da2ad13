#!/usr/bin/env bash
# bench/gpu-sim-check.sh: issue 39, item 5 -- does `dhelix simulate` with the preset measured on the
# lent GPU (configs/clusters/h100-measured.toml or h200-measured.toml, from bench/gpu_preset.py on
# the kernel bench's JSON of that device) predict dhelix's own measured one-GPU training steps? The
# measured steps: a bench/results/gpu-train-<date>-<device>.json (bench/gpu_train.cc: one
# micro-batch's forward and backward, the gradient norm, one AdamW launch; GPT-2 124M B=16 and Llama
# ~1.1B B=4, T=1024; default the H100's of 2026-11-27). The same steps simulated on the measured
# preset of the file's device (h200-measured for an H200, else h100-measured) and, beside it, on
# h100-8gpu (the published systems' preset).
# Nothing is fitted to the steps: the preset's figures come from single-kernel timings. A one-GPU
# step has no communication, so this checks the compute side only. Last line: one JSON object.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${DHELIX_BUILD:-build}
cmake --build "$build" --target dhelix >/dev/null
bin="$PWD/$build/dhelix"
measured=${1:-bench/results/gpu-train-2026-11-27-h100.json}
work=$(mktemp -d /tmp/dhelix_bench_gpusim.XXXXXX)
trap 'rm -rf "$work"' EXIT

one=(--gpus 1 --sim.clusters_dir configs/clusters --training.micro_batches 1 --schedule.strand_interleaving off)
gpt2=(--config configs/gpt2-124m.toml --model.vocab_size 50257 --training.micro_batch_size 16)
llama=(--config configs/demo.toml --model.seq_len 1024 --model.vocab_size 32000 --model.d_model 2048 --model.n_layers 16
       --model.n_heads 32 --model.n_kv_heads 8 --model.ffn_hidden 8192 --training.micro_batch_size 4)
preset=$(/usr/bin/python3 -c "import json, sys; print('h200-measured' if 'H200' in json.load(open(sys.argv[1]))['device'] else 'h100-measured')" "$measured")
# Each measured row ran its programs fused or plain (gpu_train's "fuse_epilogues"; rows before
# 2026-11-28 have none: plain); each is compared with the simulation of the same programs.
for c in "$preset" h100-8gpu; do
  for fe in on off; do
    "$bin" simulate "${gpt2[@]}" "${one[@]}" --training.fuse_epilogues $fe --cluster $c \
      --json "$work/gpt2-124m-$c-$fe.json" > "$work/gpt2-$c-$fe.log"
    "$bin" simulate "${llama[@]}" "${one[@]}" --training.fuse_epilogues $fe --cluster $c \
      --json "$work/llama-1b-$c-$fe.json" > "$work/llama-$c-$fe.log"
  done
done
/usr/bin/python3 - "$measured" "$work" "$preset" <<'EOF'
import json, sys
meas = json.load(open(sys.argv[1]))
p = sys.argv[3]
out = {"measured_file": sys.argv[1], "device": meas["device"], "measured_preset": p, "models": []}
print(f"{'model':16s} {'measured':>10s} {p:>14s} {'err':>7s} {'h100-8gpu':>10s} {'err':>7s}")
for m in meas["models"]:
    fe = "on" if m.get("fuse_epilogues", False) else "off"
    row = {"model": m["model"], "gemm_algo": m.get("gemm_algo", "heuristic"), "fuse_epilogues": fe == "on",
           "measured_step_s": m["step_s"]}
    for c in (p, "h100-8gpu"):
        s = json.load(open(f"{sys.argv[2]}/{m['model']}-{c}-{fe}.json"))["step_s"]
        row[c] = {"step_s": s, "error": s / m["step_s"] - 1}
    out["models"].append(row)
    print(f"{m['model'] + (' fused' if fe == 'on' else ''):16s} {m['step_s']*1e3:9.2f}ms {row[p]['step_s']*1e3:12.2f}ms "
          f"{row[p]['error']*100:+6.1f}% {row['h100-8gpu']['step_s']*1e3:8.2f}ms {row['h100-8gpu']['error']*100:+6.1f}%")
out["max_abs_error_measured_preset"] = max(abs(r[p]["error"]) for r in out["models"])
print(json.dumps(out))
EOF
