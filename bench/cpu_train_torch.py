"""PyTorch eager CPU training of the GPT-2 124M shape, the peer of bench/cpu_train.cc.

Same model and batch as dhelix's "gpt2-124m" preset: 12 layers, d=768, 12 heads, V=50257,
1024 learned positions, LayerNorm (eps 1e-5), GELU (tanh), tied embeddings, causal attention
written in plain ops (q k^T, mask, softmax, p v), AdamW (0.9, 0.95, eps 1e-8, weight decay 0.1
on matrices only), global-norm clip 1.0, random tokens. Not here: torch.compile, fused kernels. --autocast runs the
forward (and so its backward) under torch.autocast("cpu", bfloat16), PyTorch's bf16 mixed precision.
Prints one line per step and, last, one JSON object: {"tokens_per_s": ..., "step_s": ...}.
With --serve it builds the model, prints "ready", then runs one step per "step" line read from
stdin and answers {"step_s": ..., "loss": ...}; dhelix_bench_cpu_train drives it that way under
/usr/bin/python3 with the same --threads, alternating its own steps with torch's so both see the
same machine load.
"""
import argparse
import json
import math
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, C, H):
        super().__init__()
        self.H = H
        self.ln1 = nn.LayerNorm(C, eps=1e-5)
        self.qkv = nn.Linear(C, 3 * C)
        self.out = nn.Linear(C, C)
        self.ln2 = nn.LayerNorm(C, eps=1e-5)
        self.fc = nn.Linear(C, 4 * C)
        self.proj = nn.Linear(4 * C, C)

    def forward(self, x, mask):
        B, T, C = x.shape
        D = C // self.H
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.H, D).transpose(1, 2) for t in (q, k, v))  # (B, H, T, D)
        s = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(D))  # (B, H, T, T)
        p = F.softmax(s.masked_fill(mask[:T, :T], float("-inf")), dim=-1)
        a = (p @ v).transpose(1, 2).reshape(B, T, C)
        x = x + self.out(a)
        return x + self.proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, V=50257, P=1024, C=768, L=12, H=12):
        super().__init__()
        self.wte = nn.Embedding(V, C)
        self.wpe = nn.Embedding(P, C)
        self.blocks = nn.ModuleList(Block(C, H) for _ in range(L))
        self.ln_f = nn.LayerNorm(C, eps=1e-5)
        self.register_buffer("mask", torch.ones(P, P, dtype=torch.bool).triu(1), persistent=False)
        for n, p in self.named_parameters():
            if p.dim() >= 2:
                nn.init.normal_(p, std=0.02)
            elif n.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx, targets):
        B, T = idx.shape
        x = self.wte(idx) + self.wpe(torch.arange(T))
        for b in self.blocks:
            x = b(x, self.mask)
        logits = F.linear(self.ln_f(x), self.wte.weight)  # tied LM head, (B, T, V)
        return F.cross_entropy(logits.view(B * T, -1), targets.reshape(-1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--micro-batches", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--serve", action="store_true")
    ap.add_argument("--autocast", action="store_true", help="bf16 autocast on the CPU (fp32 master weights)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    model = GPT()
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=6e-4, betas=(0.9, 0.95), eps=1e-8)
    V = model.wte.weight.shape[0]
    data = [torch.randint(0, V, (a.batch, a.seq + 1)) for _ in range(a.micro_batches)]

    def step():
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for d in data:
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.autocast):
                loss = model(d[:, :-1], d[:, 1:]) / a.micro_batches
            loss.backward()
            total += loss.item()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return time.perf_counter() - t0, total

    if a.serve:
        print("ready", flush=True)
        for line in sys.stdin:
            if line.strip() != "step":
                break
            dt, loss = step()
            print(json.dumps({"step_s": dt, "loss": loss}), flush=True)
        return
    times = []
    for s in range(a.warmup + a.steps):
        dt, total = step()
        if s >= a.warmup:
            times.append(dt)
        print(f"torch step {s + 1:>2} {dt:8.3f} s  loss {total:.4f}{'  (warmup)' if s < a.warmup else ''}", flush=True)
    step_s = statistics.median(times)
    tokens = a.batch * a.seq * a.micro_batches
    print(json.dumps({"tokens_per_s": tokens / step_s, "step_s": step_s, "torch": torch.__version__,
                      "threads": torch.get_num_threads()}))

if __name__ == "__main__":
    main()
