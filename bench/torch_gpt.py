#!/usr/bin/env python3
"""PyTorch (eager) training steps of the GPT that planc compiles, written
the way a PyTorch user would write it for speed today (nanoGPT's style).

usage: torch_gpt.py VOCAB SEQ D HEADS LAYERS BATCH STEPS THREADS [DEVICE [DTYPE [MODE]]]

DEVICE is cpu (default) or cuda; DTYPE float32 (default), tf32 (float32
with TF32 matrix products, on cuda) or bfloat16 (autocast to bf16 with fp32
weights, as mixed-precision training runs); MODE eager (default) or compile
(torch.compile of the model; its compilation happens in the first steps,
which the median leaves out).
Prints "torch VERSION: median X ms, Y tok/s, peak Z GB, MODE" (peak on cuda
only):
the median step time of steps 3..STEPS.

The model is examples/models/gpt.plan's GPT-2 (tied head, tanh GELU, fp32
master weights) trained with AdamW (lr 1e-4, betas 0.9/0.95, weight decay
0.1) and gradient clipping at 1.0 on random tokens (the speed does not
depend on the data). Where this PyTorch has them it uses its fastest eager
building blocks, so planc is compared with PyTorch at its best without
compilation: scaled_dot_product_attention (flash attention on CPU and GPU),
the fused tanh GELU, nn.Linear / F.layer_norm, and the fused AdamW (foreach
on PyTorch before 2.4). The arithmetic is the one test/e2e/gpt_reference.py
checks planc against."""
import inspect
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

vocab, seq, d, heads, layers, batch, steps, threads = map(int, sys.argv[1:9])
device = sys.argv[9] if len(sys.argv) > 9 else "cpu"
dtype = sys.argv[10] if len(sys.argv) > 10 else "float32"
mode = sys.argv[11] if len(sys.argv) > 11 else "eager"
if dtype == "tf32":
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
torch.set_num_threads(threads)
torch.manual_seed(0)
HAS_SDPA = hasattr(F, "scaled_dot_product_attention")


def gelu(x):
    try:
        return F.gelu(x, approximate="tanh")
    except TypeError:  # PyTorch before 1.12
        return 0.5 * x * (1.0 + torch.tanh(0.7978845608028654 *
                                           (x + 0.044715 * x * x * x)))


class Attention(nn.Module):

    def __init__(self):
        super().__init__()
        self.c_attn = nn.Linear(d, 3 * d)
        self.c_proj = nn.Linear(d, d)
        self.register_buffer("mask",
                             torch.tril(torch.ones(seq, seq, dtype=torch.bool)))

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(d, dim=2)
        q, k, v = (t.view(B, T, heads, C // heads).transpose(1, 2)
                   for t in (q, k, v))
        if HAS_SDPA:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (C // heads)**-0.5
            att = att.masked_fill(~self.mask[:T, :T], float("-inf"))
            y = F.softmax(att, dim=-1) @ v
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class Block(nn.Module):

    def __init__(self):
        super().__init__()
        self.ln_1 = nn.LayerNorm(d)
        self.attn = Attention()
        self.ln_2 = nn.LayerNorm(d)
        self.c_fc = nn.Linear(d, 4 * d)
        self.c_proj = nn.Linear(4 * d, d)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.c_proj(gelu(self.c_fc(self.ln_2(x))))


class GPT(nn.Module):

    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(seq, d)
        self.h = nn.ModuleList([Block() for _ in range(layers)])
        self.ln_f = nn.LayerNorm(d)
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.normal_(p, std=0.02)

    def forward(self, idx, targets):
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)[None]
        for block in self.h:
            x = block(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)  # tied head
        return F.cross_entropy(logits.view(-1, vocab), targets.view(-1))


model = GPT().to(device)
step_model = torch.compile(model) if mode == "compile" else model
kw = {}
params = inspect.signature(torch.optim.AdamW).parameters
if "fused" in params and (device == "cuda" or torch.__version__ >= "2.4"):
    kw["fused"] = True
elif "foreach" in params:
    kw["foreach"] = True
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95),
                        eps=1e-8, weight_decay=0.1, **kw)
cuda = device == "cuda"


def sync():
    if cuda:
        torch.cuda.synchronize()


times = []
for step in range(steps):
    x = torch.randint(0, vocab, (batch, seq), device=device)
    y = torch.randint(0, vocab, (batch, seq), device=device)
    sync()
    t0 = time.perf_counter()
    opt.zero_grad(set_to_none=True)
    with torch.autocast(device_type=device, dtype=torch.bfloat16,
                        enabled=dtype == "bfloat16"):
        loss = step_model(x, y)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    sync()
    times.append((time.perf_counter() - t0) * 1e3)
# torch.compile compiles during the first steps (and again when autocast's
# state differs); the median of the later steps is the steady state.
median = statistics.median(times[2:] if mode == "eager" else times[3:])
line = (f"torch {torch.__version__.split('+')[0]}: median {median:.2f} ms, "
        f"{batch * seq / median * 1e3:.0f} tok/s")
if cuda:
    line += f", peak {torch.cuda.max_memory_allocated() / 1e9:.2f} GB"
line += f", {mode}"
print(line)
