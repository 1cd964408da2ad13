#!/usr/bin/env bash
# bench/gpu-si-sim.sh: issue 39's last speed item -- does `dhelix simulate` with the preset
# measured on the lent GPU (configs/clusters/h100-measured.toml, or h200-measured.toml when the
# bench's device is an H200) predict the emulated runs of
# bench/gpu_si.cc (tp = 2 for the dense models, dp = ep = 2 for the MoE model, cp = 2 for a
# "NAME/cp" run at its long sequence; the two ranks as
# threads sharing one GPU, the link between them emulated at a known rate), SI off and on?
#   bench/gpu-si-sim.sh GPU_SI_JSON     (the bench's last line; e.g. bench/results/gpu-si-<date>-h100.json)
# The simulated cluster is that measured preset with two changes, both stated, neither fitted to the runs:
#   - each rank has its share of the device: peak_flops_bf16 scaled by its SMs over the device's
#     when the bench ran each rank in its own SM partition (sm_split "ranks": the SM count is the
#     run's; that the rate scales with it is an assumption, which the kernel bench's sm_partitions
#     study measures as half_over_whole), else halved (sm_split "off": the two ranks' kernels share
#     every SM -- an assumption); mem_bw
#     halved either way (the partitions split SMs, not the memory the ranks stream from: an
#     assumption). The bench's compute-only time C is printed beside the simulated compute to
#     check both;
#   - the tp (ep) link is the emulated one: intra_bw = the bench's link rate (the staged group holds
#     each op until its bytes at that rate have passed, as the simulator prices them) and
#     intra_latency 50 us per op (assumed: the staging copies' and the host op's fixed cost).
# A model whose run had no link emulated (the staging was already slower than the target share) is
# skipped: its link rate is not known. The step compared is the bench's: passes and gradient
# reductions without the optimizer (simulated step_s - optimizer_s); for the MoE and cp runs, whose
# bench step leaves out the gradients' dp (dp x cp) all-reduce, the passes alone (step_s - tail_s:
# the simulated step up to its last backward). Last line: one JSON object
# with sim_abs_error, the largest |simulated / measured - 1| over the models and SI off / on.
# On an H200 (the bench's device names it) the preset is h200-measured: its compute figures measured
# on the lent H200 and the H200's 4.8 TB/s (NVIDIA H200 datasheet); else h100-measured (an unknown
# device: an H100 assumed). The JSON's "preset" says which preset and bandwidth were used.
# Models the bench could not run (an "error" object) and runs without a known link rate or SM share
# are skipped with the reason; a model that simulate refuses is skipped with its message, the
# others still priced.
# Runs here or on the GPU machine (scripts/gpu-device run): the simulator needs no GPU. There
# scripts/gpu-device sets DHELIX_BIN (and DHELIX_BIN_LD_LIBRARY_PATH, the bundle's libraries, for it
# alone); here, without DHELIX_BIN, build/dhelix is built.
set -euo pipefail
cd "$(dirname "$0")/.."
measured=${1:?usage: bench/gpu-si-sim.sh GPU_SI_JSON}
bin=${DHELIX_BIN:-}
if [ -z "$bin" ]; then
  command -v cmake > /dev/null || { echo "bench/gpu-si-sim.sh: no cmake here to build dhelix: set DHELIX_BIN" >&2; exit 2; }
  build=${DHELIX_BUILD:-build}
  cmake --build "$build" --target dhelix >/dev/null
  bin="$PWD/$build/dhelix"
fi
work=$(mktemp -d /tmp/dhelix_bench_gpusisim.XXXXXX)
trap 'rm -rf "$work"' EXIT

/usr/bin/env python3 - "$measured" "$work" "$bin" <<'EOF'
import json, os, re, subprocess, sys
meas_file, work, bin_ = sys.argv[1], sys.argv[2], sys.argv[3]
meas = json.load(open(meas_file))
env = dict(os.environ)
if os.environ.get("DHELIX_BIN_LD_LIBRARY_PATH"):
    env["LD_LIBRARY_PATH"] = os.environ["DHELIX_BIN_LD_LIBRARY_PATH"]
# The measured preset of the bench's device: h200-measured (the lent H200's kernels, 4.8 TB/s), or
# h100-measured (the lent H100's, 3.35 TB/s).
device = meas.get("device") or ""
preset_name = "h200-measured" if "H200" in device else "h100-measured"
base_path = f"configs/clusters/{preset_name}.toml"
base = open(base_path).read()
mem_bw = float(re.search(r"^mem_bw = ([0-9.e+]+)", base, re.M).group(1))
mem_bw_source = (f"{preset_name}.toml: " + ("H200 SXM 4.8 TB/s (NVIDIA H200 datasheet)" if "H200" in device
                                            else "H100 SXM 3.35 TB/s (NVIDIA H100 datasheet)")
                 + ("" if device else "; the device is unknown, an H100 assumed"))

def preset(link_bytes_per_s, flops_share, path):
    t = base
    def scale(key, f):
        nonlocal t
        m = re.search(rf"^{key} = ([0-9.e+]+)", t, re.M)
        t = t[:m.start(1)] + f"{float(m.group(1)) * f:g}" + t[m.end(1):]
    def put(key, value):
        nonlocal t
        m = re.search(rf"^{key} = ([^ #\n]+)", t, re.M)
        t = t[:m.start(1)] + value + t[m.end(1):]
    scale("peak_flops_bf16", flops_share)
    scale("mem_bw", 0.5)
    put("intra_bw", f"{link_bytes_per_s:g}")
    put("intra_latency", "50e-6")
    put('name', f'"{preset_name}-shared-by-2"')
    open(path, "w").write(f"# derived by bench/gpu-si-sim.sh: {preset_name}, {flops_share:.3f} of the SMs and half the "
                          f"memory bandwidth ({mem_bw:g} B/s) per rank, the emulated link\n" + t)

gpt2 = ["--config", "configs/gpt2-124m.toml", "--model.vocab_size", "50257"]
llama = ["--config", "configs/demo.toml", "--model.seq_len", "1024", "--model.vocab_size", "32000",
         "--model.d_model", "2048", "--model.n_layers", "16", "--model.n_heads", "32", "--model.n_kv_heads", "8",
         "--model.ffn_hidden", "8192"]
moe = ["--config", "configs/moe-demo.toml", "--model.vocab_size", "32000", "--model.d_model", "1024",
       "--model.n_layers", "8", "--model.n_heads", "16", "--model.n_kv_heads", "4", "--model.ffn_hidden", "2816",
       "--model.n_experts", "8", "--model.top_k", "2"]
out = {"measured_file": meas_file, "device": meas.get("device"),
       "preset": {"base": base_path, "name": preset_name, "mem_bw_device": mem_bw,
                  "mem_bw_source": mem_bw_source, "mem_bw_per_rank": mem_bw / 2},
       "models": []}
errs = []
def skip(row, why):
    row["skipped"] = why
    out["models"].append(row)
    print(f"{row['model']}: skipped, {why}")
for m in meas["models"]:
    row = {"model": m.get("model")}
    if "error" in m:
        skip(row, "the bench's run of this model failed")
        continue
    row["link_gbit"] = m["link_gbit"]
    if m["link_gbit"] <= 0:
        skip(row, "no link emulated (the staging alone was slower than the target share)")
        continue
    p = f"{work}/{m['model'].replace('/', '_')}.toml"
    split = m.get("sm_split", meas.get("sm_split", "off")) == "ranks"
    if split and not meas.get("device_sms"):
        skip(row, "the device's SM count is unknown (the bench's final line is missing): the partition's share of "
                  "the SMs is not known")
        continue
    share = m["sms_per_rank"] / meas["device_sms"] if split else 0.5
    row["flops_share"] = share
    preset(m["link_gbit"] * 1e9 / 8, share, p)
    is_moe, is_cp = m.get("axis") == "ep", m.get("axis") == "cp"
    model_keys = moe if is_moe else gpt2 if m["model"].startswith("gpt2-124m") else llama
    layout = "dp=2 ep=2" if is_moe else "cp=2" if is_cp else "tp=2"
    keys = model_keys + [
        "--training.micro_batch_size", str(m["batch"]), "--training.micro_batches", str(m["micro_batches"]),
        "--model.seq_len", str(m["seq"]), "--layout", layout, "--gpus", "2",
        "--cluster", p]
    refused = None
    for si, key in (("off", "si_off_s"), ("on", "si_on_s")):
        j = f"{work}/{m['model'].replace('/', '_')}-{si}.json"
        r = subprocess.run([bin_, "simulate", *keys, "--schedule.strand_interleaving", si, "--json", j],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
        if r.returncode != 0:
            refused = f"dhelix simulate (SI {si}) exit {r.returncode}: " + " ".join(r.stderr.split())[-300:]
            break
        s = json.load(open(j))
        sim = s["step_s"] - (s["tail_s"] if is_moe or is_cp else s["optimizer_s"])
        err = sim / m[key] - 1
        row[f"si_{si}"] = {"measured_s": m[key], "simulated_s": sim, "error": err,
                           "simulated_compute_s": s["compute_s"], "simulated_exposed_s": s["exposed_s"]}
    if refused:
        row.pop("si_off", None)
        skip(row, refused)
        continue
    row["sim_abs_error"] = max(abs(row["si_off"]["error"]), abs(row["si_on"]["error"]))
    errs.append(row["sim_abs_error"])
    row["measured_compute_s"] = m["compute_s"]
    out["models"].append(row)
    print(f"{m['model']:10s} link {m['link_gbit']:.2f} Gbit/s: SI off {m['si_off_s']*1e3:.2f} ms measured, "
          f"{row['si_off']['simulated_s']*1e3:.2f} simulated ({row['si_off']['error']*100:+.1f}%); SI on "
          f"{m['si_on_s']*1e3:.2f} / {row['si_on']['simulated_s']*1e3:.2f} ({row['si_on']['error']*100:+.1f}%); "
          f"compute {m['compute_s']*1e3:.2f} measured, {row['si_off']['simulated_compute_s']*1e3:.2f} simulated")
out["sim_abs_error"] = max(errs) if errs else None
print(json.dumps(out))
EOF
