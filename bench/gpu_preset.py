#!/usr/bin/env python3
"""A cluster preset's device figures from a measured GPU kernel bench (issue 39, item 5).

Reads bench/results/gpu-kernels-<date>-<device>.json (bench/gpu_kernels.cc: every kernel of a GPT-2
124M and a Llama ~1.1B training step, timed alone on the step's shapes) and prints the [device]
keys the simulator prices compute with, each with how it was obtained:

  gemm_efficiency           the fraction of peak that, with the preset's tile and wave quantization
                            (gemm_units, gemm_tile: CostModel.h's GemmTiling), reproduces the
                            measured time of all the step's GEMMs of both models together (one
                            number: per-shape differences remain, printed per model)
  attention_efficiency      causal attention forward, measured FLOPs / (time x peak), in the
  attention_bwd_efficiency  programs' count (forward 2 B T^2 H D, backward 2.5x: the bench counts alike)
  optimizer_elems_per_s     parameters / the AdamW launch's time (the gradient norm is not in it)

With --interference FILE (scripts/gpu-device's gpu-interference.json: `dhelix simulate --profile`'s
fit on a tp = 2 layer pair profiled with two rank threads sharing the GPU, each in its own SM
partition, their collectives staged through host memory by the copy engines), also:

  compute_slowdown          a compute op beside a collective runs this many times slower
  comm_slowdown             a collective beside compute, likewise

each with the fit's held-back error; a file without a fit (its profile or fit failed) exits 2.

usage: bench/gpu_preset.py bench/results/gpu-kernels-2026-11-27-h100.json [--peak 989e12]
       [--units 132] [--tile 256,128] [--interference gpu-interference.json]
"""
import argparse
import json
import math

# The bench's models (bench/gpu_kernels.cc kModels); rows N = batch x seq from the JSON.
MODELS = {
    "gpt2-124m": dict(llama=False, L=12, C=768, H=12, Hkv=12, F=3072, V=50257),
    "llama-1b": dict(llama=True, L=16, C=2048, H=32, Hkv=8, F=8192, V=32000),
}


def params(m):  # as bench/gpu_kernels.cc Model::params
    C, H, Hkv, F, V, L = m["C"], m["H"], m["Hkv"], m["F"], m["V"], m["L"]
    D = C // H
    if m["llama"]:
        return L * (C * (H + 2 * Hkv) * D + C * C + C * 2 * F + F * C + 2 * C) + 2 * V * C + C
    return L * (C * 3 * C + 3 * C + C * C + C + C * F + F + F * C + C + 4 * C) + V * C + 1024 * C + 2 * C


def tile_eff(m, n, units, tm, tn):  # CostModel.cc GemmTiling::efficiency, one GEMM
    tiles = math.ceil(m / tm) * math.ceil(n / tn)
    waves = math.ceil(tiles / units)
    return m * n / (tiles * tm * tn) * tiles / (waves * units)


def gemm_shapes(m, N):
    """{op name prefix: (I, O)} of the bench's linear layers."""
    D = m["C"] // m["H"]
    Vp = (m["V"] + 63) // 64 * 64
    return {
        "qkv": (m["C"], (m["H"] + 2 * m["Hkv"]) * D),
        "attn out": (m["C"], m["C"]),
        ("gate+up" if m["llama"] else "fc"): (m["C"], (2 if m["llama"] else 1) * m["F"]),
        ("down" if m["llama"] else "proj"): (m["F"], m["C"]),
        "lm head": (m["C"], Vp),
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("kernels_json")
    ap.add_argument("--peak", type=float, default=989e12, help="the device's dense bf16 peak FLOP/s")
    ap.add_argument("--units", type=int, default=132)
    ap.add_argument("--tile", default="256,128")
    ap.add_argument("--interference", help="scripts/gpu-device's gpu-interference.json")
    a = ap.parse_args()
    fit = None
    if a.interference:
        fit = json.load(open(a.interference))
        if fit.get("compute_slowdown") is None or fit.get("comm_slowdown") is None:
            ap.exit(2, f"bench/gpu_preset.py: {a.interference} has no interference fit (its steps: "
                       f"{fit.get('steps')}); rerun scripts/gpu-device's interference section\n")
    tm, tn = (int(x) for x in a.tile.split(","))
    d = json.load(open(a.kernels_json))
    # GEMMs: time at efficiency e is sum(count * flops / (peak * e * tile_eff)) = measured sum.
    ideal_total, measured_total = 0.0, 0.0
    per_model = {}
    attn = {"fwd": [0.0, 0.0], "bwd": [0.0, 0.0]}  # [flops x count, seconds x count]
    adam = []
    for mj in d["models"]:
        m = MODELS[mj["model"]]
        N = mj["batch"] * mj["seq"]
        shapes = gemm_shapes(m, N)
        ideal, measured = 0.0, 0.0
        for o in mj["ops"]:
            name, cls = o["op"], o["class"]
            if cls == "gemm":
                base, kind = name.rsplit(" ", 1)
                I, O = shapes[base]
                flops = 2.0 * N * I * O
                C = {"fwd": (N, O), "dgrad": (N, I), "wgrad": (I, O)}[kind]
                ideal += o["count"] * flops / (a.peak * tile_eff(C[0], C[1], a.units, tm, tn))
                measured += o["count"] * o["s"]
            elif cls == "attention":
                k = "fwd" if name.endswith("fwd") else "bwd"
                attn[k][0] += o["count"] * o["tflops"] * 1e12 * o["s"]
                attn[k][1] += o["count"] * o["s"]
            elif name == "adamw":
                adam.append(params(m) / o["s"])
        per_model[mj["model"]] = ideal / measured
        ideal_total += ideal
        measured_total += measured
    e = ideal_total / measured_total
    print(f"# from {a.kernels_json} ({d['device']}), peak {a.peak:.4g} FLOP/s, tiles {tm}x{tn} on {a.units} units")
    print(f"gemm_efficiency = {e:.3f}   # both models' GEMMs together; alone: "
          + ", ".join(f"{k} {v:.3f}" for k, v in per_model.items()))
    fe = attn["fwd"][0] / attn["fwd"][1] / a.peak
    be = attn["bwd"][0] / attn["bwd"][1] / a.peak
    print(f"attention_efficiency = {fe:.3f}   # forward, {attn['fwd'][0] / attn['fwd'][1] / 1e12:.1f} TFLOP/s")
    print(f"attention_bwd_efficiency = {be:.3f}   # backward, {attn['bwd'][0] / attn['bwd'][1] / 1e12:.1f} TFLOP/s")
    if adam:
        print(f"optimizer_elems_per_s = {sum(adam) / len(adam):.3g}   # AdamW: " +
              ", ".join(f"{x:.3g}" for x in adam))
    if fit:
        f, p = fit.get("interference_fit") or {}, fit.get("profile") or {}
        src = (f"# fitted by dhelix simulate --profile on {a.interference}: {p.get('model')} {p.get('layout')} "
               f"{p.get('shapes')}, {p.get('timestamp')}; held-back pairs' median error "
               f"{f.get('held_back_median_error')} (without it {f.get('held_back_median_error_without')})")
        print(f"compute_slowdown = {fit['compute_slowdown']:.3g}   {src}")
        print(f"comm_slowdown = {fit['comm_slowdown']:.3g}   # the same fit")


if __name__ == "__main__":
    main()
