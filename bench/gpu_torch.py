"""The PyTorch side of the GPU training benchmark (issue 35), run on the lent GPU.

Two nanoGPT-style models written for the bench, trained on random tokens in bf16 autocast with
scaled_dot_product_attention and fused AdamW (fp32 masters and moments, as dhelix's GPU step):
  gpt2-124m: 12 layers, d=768, 12 heads, V=50257, 1024 learned positions, LayerNorm, GELU (tanh),
             tied embeddings (dhelix's "gpt2-124m" preset);
  llama-1b:  16 layers, d=2048, 32 heads, 8 kv heads (GQA), SwiGLU 8192, RMSNorm, RoPE (theta 5e5),
             V=32000, untied head (about 1.1B parameters).
For each model, in one process and alternating round by round: eager and torch.compile steps,
timed with CUDA events (median over the timed steps; each round's first steps are warm-up).
Also: cuBLAS's bf16 rate on the model's own GEMM shapes (every linear layer's forward, dgrad and
wgrad, timed with events, rotating inputs) and on 8192^3; the time per op class (GEMM, attention,
the rest) from torch.profiler over eager steps; peak GPU memory.
Model FLOPs per token: dhelix's one formula (ModelConfig::flops_per_token): 6 * (matmul parameters
including the LM head) + 6 * n_layers * T * d_model (causal attention, fwd+bwd).
Prints a table and, last, one JSON object; --out's file is rewritten after each model (a timeout
keeps the models already done).
"""
import argparse
import json
import math
import os
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

PEAK_BF16 = 989e12  # H100/H200 SXM dense bf16 (the MFU denominator)


MODELS = {
    "gpt2-124m": dict(family="gpt", L=12, C=768, H=12, Hkv=12, F=3072, V=50257, P=1024),
    "llama-1b": dict(family="llama", L=16, C=2048, H=32, Hkv=8, F=8192, V=32000, P=4096),
}


def flops_per_token(m, T):
    C, F_, L, V = m["C"], m["F"], m["L"], m["V"]
    D = C // m["H"]
    if m["family"] == "gpt":
        per_layer = C * 3 * C + C * C + 2 * C * F_
    else:
        per_layer = C * (m["H"] + 2 * m["Hkv"]) * D + m["H"] * D * C + 3 * C * F_
    matmul = per_layer * L + V * C
    return 6.0 * matmul + 6.0 * L * T * C


class GptBlock(nn.Module):
    def __init__(self, m):
        super().__init__()
        C = m["C"]
        self.H = m["H"]
        self.ln1, self.ln2 = nn.LayerNorm(C), nn.LayerNorm(C)
        self.qkv, self.out = nn.Linear(C, 3 * C), nn.Linear(C, C)
        self.fc, self.proj = nn.Linear(C, m["F"]), nn.Linear(m["F"], C)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.H, C // self.H).transpose(1, 2) for t in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, C)
        x = x + self.out(a)
        return x + self.proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


def rope(x, cos, sin):  # x (B, H, T, D), rotate_half convention
    D = x.shape[-1]
    x1, x2 = x[..., : D // 2], x[..., D // 2:]
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class LlamaBlock(nn.Module):
    def __init__(self, m):
        super().__init__()
        C, H, Hkv = m["C"], m["H"], m["Hkv"]
        self.H, self.Hkv, self.D = H, Hkv, C // H
        self.n1, self.n2 = nn.RMSNorm(C, eps=1e-5), nn.RMSNorm(C, eps=1e-5)
        self.qkv = nn.Linear(C, (H + 2 * Hkv) * self.D, bias=False)
        self.out = nn.Linear(C, C, bias=False)
        self.gu = nn.Linear(C, 2 * m["F"], bias=False)
        self.down = nn.Linear(m["F"], C, bias=False)

    def forward(self, x, cos, sin):
        B, T, C = x.shape
        q, k, v = self.qkv(self.n1(x)).split([self.H * self.D, self.Hkv * self.D, self.Hkv * self.D], dim=2)
        q = rope(q.view(B, T, self.H, self.D).transpose(1, 2), cos, sin)
        k = rope(k.view(B, T, self.Hkv, self.D).transpose(1, 2), cos, sin)
        v = v.view(B, T, self.Hkv, self.D).transpose(1, 2)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + self.out(a.transpose(1, 2).reshape(B, T, C))
        g, u = self.gu(self.n2(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(g) * u)


class Model(nn.Module):
    def __init__(self, m):
        super().__init__()
        self.m = m
        self.wte = nn.Embedding(m["V"], m["C"])
        if m["family"] == "gpt":
            self.wpe = nn.Embedding(m["P"], m["C"])
            self.blocks = nn.ModuleList(GptBlock(m) for _ in range(m["L"]))
            self.norm = nn.LayerNorm(m["C"])
            self.head = None  # tied
        else:
            self.blocks = nn.ModuleList(LlamaBlock(m) for _ in range(m["L"]))
            self.norm = nn.RMSNorm(m["C"], eps=1e-5)
            self.head = nn.Linear(m["C"], m["V"], bias=False)
            D = m["C"] // m["H"]
            inv = 1.0 / (500000.0 ** (torch.arange(0, D, 2).float() / D))
            t = torch.arange(m["P"]).float()
            f = torch.outer(t, inv)
            f = torch.cat((f, f), dim=-1)
            self.register_buffer("cos", f.cos(), persistent=False)
            self.register_buffer("sin", f.sin(), persistent=False)
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, idx, targets):
        B, T = idx.shape
        x = self.wte(idx)
        if self.m["family"] == "gpt":
            x = x + self.wpe(torch.arange(T, device=idx.device))
            for b in self.blocks:
                x = b(x)
            logits = F.linear(self.norm(x), self.wte.weight)
        else:
            cos, sin = self.cos[:T], self.sin[:T]
            for b in self.blocks:
                x = b(x, cos, sin)
            logits = self.head(self.norm(x))
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1))


def make_trainer(m, compiled, seed):
    torch.manual_seed(seed)
    model = Model(m).cuda()
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                            lr=3e-4, betas=(0.9, 0.95), eps=1e-8, fused=True)
    fwd = torch.compile(model) if compiled else model

    def step(idx, tgt):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = fwd(idx, tgt)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    return model, step


def time_steps(step, batches, n):
    """Median step time (s) over n steps, timed with CUDA events; rotates the input batches."""
    times = []
    for i in range(n):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        idx, tgt = batches[i % len(batches)]
        s.record()
        loss = step(idx, tgt)
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) / 1e3)
    return times, float(loss)


def gemm_shapes(m, N):
    """(M, N, K) of every linear layer's forward, dgrad and wgrad in one step, with counts."""
    C, F_, L, V = m["C"], m["F"], m["L"], m["V"]
    D = C // m["H"]
    if m["family"] == "gpt":
        lin = [(C, 3 * C), (C, C), (C, F_), (F_, C)]
    else:
        lin = [(C, (m["H"] + 2 * m["Hkv"]) * D), (C, C), (C, 2 * F_), (F_, C)]
    shapes = {}
    for (i, o), cnt in [(x, L) for x in lin] + [((C, V), 1)]:
        for mnk in [(N, o, i), (N, i, o), (o, i, N)]:  # fwd, dgrad, wgrad
            shapes[mnk] = shapes.get(mnk, 0) + cnt
    return shapes


def cublas_rate(shapes, reps=20):
    """Total FLOPs / total time of the step's GEMMs through torch.matmul (cuBLAS), bf16."""
    flops = secs = 0.0
    per = []
    for (M, N, K), cnt in shapes.items():
        bufs = [(torch.randn(M, K, device="cuda", dtype=torch.bfloat16),
                 torch.randn(K, N, device="cuda", dtype=torch.bfloat16)) for _ in range(3)]
        for a, b in bufs:
            a @ b
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for r in range(reps):
            a, b = bufs[r % 3]
            a @ b
        e.record()
        e.synchronize()
        t = s.elapsed_time(e) / 1e3 / reps
        f = 2.0 * M * N * K
        per.append({"m": M, "n": N, "k": K, "count": cnt, "tflops": f / t / 1e12})
        flops += f * cnt
        secs += t * cnt
        del bufs
    return flops / secs, per


def op_classes(step, batches, n=3):
    """Seconds per step by op class (GEMM, attention, rest) from torch.profiler's CUDA kernel times."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for i in range(n):
            step(*batches[i % len(batches)])
        torch.cuda.synchronize()
    out = {"gemm_s": 0.0, "attention_s": 0.0, "rest_s": 0.0}
    for ev in prof.key_averages():
        t = ev.device_time_total / 1e6 / n if hasattr(ev, "device_time_total") else ev.cuda_time_total / 1e6 / n
        name = ev.key.lower()
        if any(w in name for w in ("flash", "fmha", "attention", "sdpa", "cudnn")):
            out["attention_s"] += t
        elif any(w in name for w in ("gemm", "cutlass", "xmma", "nvjet", "sm90_", "matmul", "cublas")):
            out["gemm_s"] += t
        elif ev.device_type is not None and "cpu" not in str(ev.device_type).lower():
            out["rest_s"] += t
    return out


def bench_model(name, B, T, rounds, steps, warmup):
    m = MODELS[name]
    torch.cuda.reset_peak_memory_stats()
    g = torch.Generator(device="cuda").manual_seed(1)
    batches = [(torch.randint(0, m["V"], (B, T), device="cuda", generator=g),
                torch.randint(0, m["V"], (B, T), device="cuda", generator=g)) for _ in range(4)]
    res = {"model": name, "batch": B, "seq": T, "flops_per_token": flops_per_token(m, T)}
    trainers = {}
    t0 = time.time()
    for kind in ("eager", "compile"):
        trainers[kind] = make_trainer(m, kind == "compile", seed=0)
        trainers[kind][1](*batches[0])  # builds / compiles
        torch.cuda.synchronize()
    res["setup_s"] = time.time() - t0
    res["params"] = sum(p.numel() for p in trainers["eager"][0].parameters())
    times = {"eager": [], "compile": []}
    losses = {}
    for r in range(rounds):
        for kind in (("eager", "compile") if r % 2 == 0 else ("compile", "eager")):
            t, loss = time_steps(trainers[kind][1], batches, warmup + steps)
            times[kind] += t[warmup:]
            losses[kind] = loss
    tok = B * T
    for kind in ("eager", "compile"):
        med = statistics.median(times[kind])
        res[f"torch_{kind}_step_s"] = med
        res[f"torch_{kind}_spread"] = [min(times[kind]), max(times[kind])]
        res[f"torch_{kind}_tokens_per_s"] = tok / med
        res[f"torch_{kind}_mfu"] = tok / med * res["flops_per_token"] / PEAK_BF16
        res[f"torch_{kind}_last_loss"] = losses[kind]
    res["peak_bytes"] = torch.cuda.max_memory_allocated()
    res["torch_eager_op_classes"] = op_classes(trainers["eager"][1], batches)
    del trainers
    torch.cuda.empty_cache()
    rate, per = cublas_rate(gemm_shapes(m, B * T))
    res["cublas_model_shapes_flops"] = rate
    res["cublas_shapes"] = per
    # The same with the vocabulary padded to a multiple of 64 (as llm.c and dhelix's GPU head do):
    # V = 50257 makes the head's row stride odd, and cuBLAS runs those three GEMMs at ~130 TFLOP/s
    # (H200, 2026-11-26). The larger of the two rates is the denominator of cublas_fraction.
    padded = dict(m, V=(m["V"] + 63) // 64 * 64)
    rate_p, _ = cublas_rate(gemm_shapes(padded, B * T))
    res["cublas_model_shapes_padded_vocab_flops"] = rate_p
    best = max(rate, rate_p)
    for kind in ("eager", "compile"):
        res[f"torch_{kind}_cublas_fraction"] = res[f"torch_{kind}_tokens_per_s"] * res["flops_per_token"] / best
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="gpt2-124m,llama-1b")
    ap.add_argument("--batch", default="gpt2-124m=16,llama-1b=4", help="name=B,...")
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = True
    batch = dict(kv.split("=") for kv in a.batch.split(","))
    dev = torch.cuda.get_device_properties(0)
    out = {"device": dev.name, "sms": dev.multi_processor_count, "torch": torch.__version__,
           "date": time.strftime("%Y-%m-%d"), "peak_bf16_flops": PEAK_BF16}
    # The card's ceiling on random data, 8192^3 bf16.
    x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    y = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        x @ y
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(10):
        x @ y
    e.record()
    e.synchronize()
    out["cublas_8192_flops"] = 2 * 8192 ** 3 * 10 / (s.elapsed_time(e) / 1e3)
    del x, y
    out["models"] = []

    def save():
        if a.out:
            with open(a.out + ".tmp", "w") as f:
                json.dump(out, f, indent=1)
            os.replace(a.out + ".tmp", a.out)

    save()
    for name in a.models.split(","):
        r = bench_model(name, int(batch[name]), a.seq, a.rounds, a.steps, a.warmup)
        out["models"].append(r)
        save()
        print(f"{name:10s} B={r['batch']:3d} T={r['seq']} | eager {r['torch_eager_tokens_per_s']:10.0f} tok/s "
              f"(mfu {r['torch_eager_mfu']:.3f}) | compile {r['torch_compile_tokens_per_s']:10.0f} tok/s "
              f"(mfu {r['torch_compile_mfu']:.3f}) | cuBLAS on its shapes {r['cublas_model_shapes_flops'] / 1e12:6.1f} "
              f"TFLOP/s | peak {r['peak_bytes'] / 2**30:.1f} GiB | setup {r['setup_s']:.0f} s", flush=True)
    print(f"cuBLAS 8192^3: {out['cublas_8192_flops'] / 1e12:.0f} TFLOP/s on {out['device']}")
    print(json.dumps({k: v for k, v in out.items() if k != "models"} |
                     {"models": [{k: v for k, v in r.items() if k != "cublas_shapes"} for r in out["models"]]}))


if __name__ == "__main__":
    main()
