#!/usr/bin/env python3
"""PyTorch (eager) training steps of the Mixtral-style model that planc
compiles (examples/models/mixtral.plan), written the way Hugging Face's
MixtralSparseMoeBlock runs its experts: per expert, the tokens routed to it
gathered, its swiglu MLP, and index_add_ of the weighted outputs.

usage: torch_moe.py VOCAB SEQ D HEADS KV_HEADS HIDDEN EXPERTS TOP_K LAYERS BATCH STEPS THREADS

Prints "torch VERSION: median X ms, Y tok/s": the median step time of
steps 3..STEPS, fp32 on the CPU, AdamW (foreach, or fused where this
PyTorch has it on the CPU) with gradient clipping at 1.0, random tokens.
Attention is scaled_dot_product_attention where this PyTorch has it
(causal; the key/value heads repeated for grouped-query attention), rotary embeddings in the
rotate-half convention; routing is softmax, top-k, renormalised."""
import inspect
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

(vocab, seq, d, heads, kv_heads, hidden, experts, top_k, layers, batch, steps,
 threads) = map(int, sys.argv[1:13])
torch.set_num_threads(threads)
torch.manual_seed(0)
HAS_SDPA = hasattr(F, "scaled_dot_product_attention")


def rmsnorm(x, w, eps=1e-5):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        hd = d // heads
        self.attn_norm = nn.Parameter(torch.ones(d))
        self.wqkv = nn.Linear(d, (heads + 2 * kv_heads) * hd, bias=False)
        self.wo = nn.Linear(heads * hd, d, bias=False)
        self.moe_norm = nn.Parameter(torch.ones(d))
        self.router = nn.Linear(d, experts, bias=False)
        self.w_gate = nn.Parameter(torch.randn(experts, d, hidden) * 0.02)
        self.w_up = nn.Parameter(torch.randn(experts, d, hidden) * 0.02)
        self.w_down = nn.Parameter(torch.randn(experts, hidden, d) * 0.02)
        inv = 1.0 / 10000.0**(torch.arange(0, hd, 2).float() / hd)
        ang = torch.arange(seq).float()[:, None] * inv[None, :]
        self.register_buffer("cos", torch.cat([ang.cos(), ang.cos()], -1))
        self.register_buffer("sin", torch.cat([ang.sin(), ang.sin()], -1))
        self.register_buffer(
            "mask", ~torch.tril(torch.ones(seq, seq, dtype=torch.bool)))

    def rope(self, x):
        h = x.shape[-1] // 2
        return x * self.cos + torch.cat([-x[..., h:], x[..., :h]], -1) * self.sin

    def forward(self, x):
        B, T, _ = x.shape
        hd = d // heads
        q, k, v = self.wqkv(rmsnorm(x, self.attn_norm)).split(
            [heads * hd, kv_heads * hd, kv_heads * hd], -1)
        q = self.rope(q.view(B, T, heads, hd).transpose(1, 2))
        k = self.rope(k.view(B, T, kv_heads, hd).transpose(1, 2))
        v = v.view(B, T, kv_heads, hd).transpose(1, 2)
        k = k.repeat_interleave(heads // kv_heads, 1)
        v = v.repeat_interleave(heads // kv_heads, 1)
        if HAS_SDPA:
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # PyTorch before 2.0
            att = (q @ k.transpose(-2, -1)) * hd**-0.5
            att = att.masked_fill(self.mask[:T, :T], float("-inf"))
            a = F.softmax(att, -1) @ v
        x = x + self.wo(a.transpose(1, 2).reshape(B, T, heads * hd))
        h = rmsnorm(x, self.moe_norm).reshape(B * T, d)
        probs = F.softmax(self.router(h), -1)
        w, chosen = probs.topk(top_k, -1)
        w = w / w.sum(-1, keepdim=True)
        out = torch.zeros_like(h)
        for e in range(experts):
            tok, slot = torch.where(chosen == e)
            if tok.numel() == 0:
                continue
            xe = h[tok]
            ye = (F.silu(xe @ self.w_gate[e]) * (xe @ self.w_up[e])) @ self.w_down[e]
            out.index_add_(0, tok, ye * w[tok, slot, None])
        return x + out.view(B, T, d)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList([Layer() for _ in range(layers)])
        self.norm = nn.Parameter(torch.ones(d))
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx, targets):
        x = self.embed(idx)
        for layer in self.layers:
            x = layer(x)
        logits = self.head(rmsnorm(x, self.norm))
        return F.cross_entropy(logits.view(-1, vocab), targets.view(-1))


model = Model()
kw = {}
params = inspect.signature(torch.optim.AdamW).parameters
if "fused" in params and torch.__version__ >= "2.4":
    kw["fused"] = True
elif "foreach" in params:
    kw["foreach"] = True
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95),
                        eps=1e-8, weight_decay=0.1, **kw)
times = []
for step in range(steps):
    idx = torch.randint(0, vocab, (batch, seq))
    tgt = torch.randint(0, vocab, (batch, seq))
    t0 = time.perf_counter()
    loss = model(idx, tgt)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    times.append(time.perf_counter() - t0)
ms = statistics.median(times[2:]) * 1e3
print(f"torch {torch.__version__.split('+')[0]}: median {ms:.1f} ms, "
      f"{batch * seq / ms * 1e3:.0f} tok/s")
