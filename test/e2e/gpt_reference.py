#!/usr/bin/env python3
"""Checks a planc-compiled GPT or Llama against an independent PyTorch model.

usage: gpt_reference.py PLAN INIT STEP0 LOG [--data GLOB]
                        [--model gpt|llama|mixtral] [--rope-theta 10000]
                        [--moe-unnormalised]
                        [--logits-rtol 5e-6] [--loss0-rtol 1e-5]
                        [--grad-rtol 1e-5] [--loss-rtol 1e-5]

PLAN   the .plan file that was compiled (dp = 1); its sizes (vocab, seq, d,
       heads, layers), batch, AdamW settings, grad_clip and lr_schedule are
       read from it
INIT   the parameters before step 1 (the program's --save-init)
STEP0  what the program observed in step 1 (--dump-step0): 'logits' and
       'grad/<param>'
LOG    the program's stdout ('step N/M | loss X | ...' lines)

The model is written here from the GPT-2 definition, not from planc's IR:
token + learned position embeddings, pre-norm blocks x + attn(ln_1(x)) and
x + mlp(ln_2(x)), causal multi-head self-attention with a fused qkv
projection (Conv1D convention, y = x @ W + b) split into q, k, v of width d
and heads of d / heads, GELU in its tanh form, a final layernorm and an LM
head tied to the token embedding; layernorm eps 1e-5. It runs in float64, so
the differences measured are planc's (float32) own.

With --model mixtral (the default for a plan importing models/mixtral.plan)
the Llama's MLP is a mixture of SwiGLU experts (MixtralLayer below: softmax
routing to each token's top_k experts, renormalised weights, the experts
run on their tokens with index_add).

With --model llama (the default for a plan importing models/llama.plan) the
model is a Llama written from its definition instead: token embeddings,
pre-norm blocks with RMSNorm (eps 1e-5, a weight, no bias), grouped-query
causal attention without biases whose query and key heads are rotated by
rotary position embeddings (rotate-half convention, base --rope-theta, the
angles from the sequence position), a SwiGLU MLP (silu(x W_gate) * x W_up)
W_down, a final RMSNorm and an untied LM head.

Checks, each as a relative error in the 2-norm (||a - b|| / ||b||, b the
reference):
  - step 1 at the initial weights: the logits, the loss, and every
    parameter's gradient (whole, before clipping);
  - the loss of each of the M steps of the log, after training the reference
    with the plan's AdamW (written out below with planrt's formulas: global
    norm clipping, bias-corrected moments, decoupled weight decay on 2-D
    parameters only, warmup + cosine lr schedule).
Prints one summary line with the worst errors, then a MISMATCH line per
failed check, and exits 1 if there is any.

The default tolerances are about 15x the errors measured on tiny-gpt (logits
3e-7, gradients 6e-7, losses 9e-7 over 10 steps). 1e-4 everywhere would miss
real mistakes: GELU in its erf form instead of tanh moves the logits by only
1.4e-5 and the gradients by 4e-5 at the initial weights (small
activations), and weight decay on 1-D parameters moves the loss of step 10
by 3e-5."""
import argparse
import glob
import math
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare_runs  # noqa: E402  (the shared log and safetensors readers)

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

DTYPE = torch.float64

# --- the plan's settings ------------------------------------------------------


def plan_settings(path):
    """The integer/real constants and the optimizer, grad_clip and lr_schedule
    settings of a plan (only the forms tiny-gpt.plan uses)."""
    text = re.sub(r"//[^\n]*", "", open(path).read())
    num = r"([-+]?[0-9.]+(?:[eE][-+]?[0-9]+)?)"
    consts = {}
    for m in re.finditer(r"^\s*(\w+)\s*=\s*" + num + r"\s*(?:/\s*" + num +
                         r")?\s*$", text, re.M):
        v = float(m.group(2)) / (float(m.group(3)) if m.group(3) else 1.0)
        consts[m.group(1)] = v
    s = {}
    for k in ["vocab", "seq", "d", "heads", "layers", "batch", "dp"]:
        if k not in consts:
            sys.exit(f"error: {path}: no '{k} = <integer>' setting")
        s[k] = int(consts[k])
    for k in ["kv_heads", "hidden", "experts", "top_k"]:  # Llama's, MoE's
        s[k] = int(consts[k]) if k in consts else None
    s["seed"] = int(consts.get("seed", 0))
    for k in ["moe_aux_loss", "moe_capacity_factor", "moe_bias_update"]:
        s[k] = consts.get(k)
    s["grad_clip"] = consts.get("grad_clip")
    m = re.search(r"adamw\(\s*lr\s*=\s*" + num + r"\s*,\s*betas\s*=\s*\[\s*" +
                  num + r"\s*,\s*" + num + r"\s*\]\s*,\s*eps\s*=\s*" + num +
                  r"\s*,\s*weight_decay\s*=\s*" + num + r"\s*\)", text)
    if not m:
        sys.exit(f"error: {path}: no 'optimizer = adamw(lr = .., betas = "
                 "[.., ..], eps = .., weight_decay = ..)'")
    s["lr"], s["beta1"], s["beta2"], s["eps"], s["weight_decay"] = map(
        float, m.groups())
    m = re.search(r"lr_schedule\s*=\s*cosine\(\s*warmup\s*=\s*" + num +
                  r"\s*,\s*min_lr\s*=\s*" + num + r"\s*,\s*decay_steps\s*=\s*" +
                  num + r"\s*\)", text)
    s["schedule"] = (int(m.group(1)), float(m.group(2)),
                     int(m.group(3))) if m else None
    m = re.search(r'data\s*=\s*shards\(\s*"([^"]+)"\s*\)', text)
    s["data"] = m.group(1) if m else None
    return s


def lr_at(s, step, run_steps):
    """planrt's schedule (planrt.h, set_lr_schedule), step from 1."""
    base = s["lr"]
    if s["schedule"] is None:
        return base
    warmup, min_lr, decay = s["schedule"]
    if warmup > 0 and step <= warmup:
        return base * step / warmup
    decay = decay if decay > 0 else run_steps
    p = min(1.0, max(0.0, (step - warmup) / max(1, decay - warmup)))
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * p)) * (base - min_lr)


# --- files ----------------------------------------------------------------------


def read_safetensors(path):
    """Name -> float32 array, with compare_runs.py's reader."""
    return {name: np.asarray(vals, np.float32).reshape(shape)
            for name, (shape, vals) in compare_runs.read_safetensors(path).items()}


def read_losses(path):
    """The losses of steps 1..M of a planrt log, in order."""
    losses = compare_runs.read_losses(path)
    total = int(re.search(r"step \d+/(\d+) \|", open(path).read()).group(1))
    if sorted(losses) != list(range(1, total + 1)):
        sys.exit(f"error: {path}: expected losses of steps 1..{total}, got "
                 f"steps {sorted(losses)}")
    return [losses[i] for i in range(1, total + 1)]


def read_token_stream(pattern):
    """The shards in sorted name order, concatenated (format: planrt.h,
    set_data_path)."""
    tokens = []
    for path in sorted(glob.glob(pattern)):
        with open(path, "rb") as f:
            raw = f.read()
        header = np.frombuffer(raw[:1024], dtype="<i4")
        if header[0] != 20240520 or header[1] != 1:
            sys.exit(f"error: {path}: not a version 1 token shard")
        n = int(header[2])
        tokens.append(np.frombuffer(raw[1024:1024 + 2 * n], dtype="<u2"))
    if not tokens:
        sys.exit(f"error: no file matches {pattern}")
    return np.concatenate(tokens).astype(np.int64)


def batch(stream, step, B, S):
    """Inputs and targets [B, S] of a step (from 1), as runtime/lib/tokens.cpp
    reads them."""
    per_step = B * S
    room = min(S, len(stream) - 1 - per_step)
    steps_per_epoch = (len(stream) - 1 - room) // per_step
    epoch, k = divmod(step - 1, steps_per_epoch)
    offset = (epoch * 7) % (room + 1) if room > 0 else 0
    pos = offset + k * per_step
    x = np.empty((B, S), np.int64)
    y = np.empty((B, S), np.int64)
    for g in range(B):
        w = stream[pos + g * S:pos + g * S + S + 1]
        x[g], y[g] = w[:S], w[1:]
    return torch.from_numpy(x), torch.from_numpy(y)


# --- GPT-2 ------------------------------------------------------------------


class Conv1D(nn.Module):
    """GPT-2's projection: y = x @ weight + bias, weight [n_in, n_out]."""

    def __init__(self, n_in, n_out):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(n_in, n_out, dtype=DTYPE))
        self.bias = nn.Parameter(torch.zeros(n_out, dtype=DTYPE))

    def forward(self, x):
        return x @ self.weight + self.bias


def gelu_tanh(x):
    return 0.5 * x * (1.0 + torch.tanh(
        math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


# --- attention dropout ------------------------------------------------------
# attention(..., dropout = p): planrt's documented rule (planrt.h attention,
# dropout), written here from that text: the probability of query t, key u
# of head h in batch row b is kept, scaled by 1 / (1 - p) (in float32),
# when the top 32 bits of mix(key ^ mix(i)) are >= p * 2^32 (truncated),
# i = ((b H + h) S + t) S + u its index in the [B, H, S, S] probabilities,
# key = mix(seed ^ mix(step * 0x10001 + uid)), mix splitmix64's finalizer,
# uid the layer's (the model's attention dropouts in order: layer l's is l).
# The softmax's max and sum are those of the undropped scores.

M64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def mix64(x):
    x = (x + np.uint64(0x9e3779b97f4a7c15)) & M64
    x = ((x ^ (x >> np.uint64(30))) * np.uint64(0xbf58476d1ce4e5b9)) & M64
    x = ((x ^ (x >> np.uint64(27))) * np.uint64(0x94d049bb133111eb)) & M64
    return x ^ (x >> np.uint64(31))


ATTN_DROPOUT = {"p": 0.0, "seed": 0, "step": 1}


def attention_mask(uid, B, H, S):
    p = np.float32(ATTN_DROPOUT["p"])
    with np.errstate(over="ignore"):
        key = mix64(np.uint64(ATTN_DROPOUT["seed"]) ^ mix64(
            np.uint64(ATTN_DROPOUT["step"] * 0x10001 + uid)))
        i = np.arange(B * H * S * S, dtype=np.uint64)
        bits = mix64(key ^ mix64(i)) >> np.uint64(32)
    threshold = np.uint64(min(4294967295.0, float(p) * 4294967296.0))
    scale = float(np.float32(1.0) / (np.float32(1.0) - p))
    keep = (bits >= threshold).reshape(B, H, S, S)
    return torch.from_numpy(keep.astype(np.float64) * scale)


class CausalSelfAttention(nn.Module):

    def __init__(self, d, heads, max_seq):
        super().__init__()
        self.d, self.heads = d, heads
        self.uid = 0  # its attention dropout's
        self.c_attn = Conv1D(d, 3 * d)
        self.c_proj = Conv1D(d, d)
        self.register_buffer(
            "mask", torch.tril(torch.ones(max_seq, max_seq, dtype=torch.bool)))

    def forward(self, x):
        B, T, C = x.shape
        hd = C // self.heads
        q, k, v = self.c_attn(x).split(self.d, dim=2)
        q = q.view(B, T, self.heads, hd).transpose(1, 2)  # [B, H, T, hd]
        k = k.view(B, T, self.heads, hd).transpose(1, 2)
        v = v.view(B, T, self.heads, hd).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(hd)
        att = att.masked_fill(~self.mask[:T, :T], float("-inf"))
        att = F.softmax(att, dim=-1)
        if ATTN_DROPOUT["p"] > 0:
            att = att * attention_mask(self.uid, B, self.heads, T)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class MLP(nn.Module):

    def __init__(self, d):
        super().__init__()
        self.c_fc = Conv1D(d, 4 * d)
        self.c_proj = Conv1D(4 * d, d)

    def forward(self, x):
        return self.c_proj(gelu_tanh(self.c_fc(x)))


class Block(nn.Module):

    def __init__(self, d, heads, max_seq):
        super().__init__()
        self.ln_1 = nn.LayerNorm(d, eps=1e-5, dtype=DTYPE)
        self.attn = CausalSelfAttention(d, heads, max_seq)
        self.ln_2 = nn.LayerNorm(d, eps=1e-5, dtype=DTYPE)
        self.mlp = MLP(d)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlp(self.ln_2(x))
        return x


class GPT(nn.Module):

    def __init__(self, vocab, max_seq, d, heads, layers):
        super().__init__()
        self.wte = nn.Embedding(vocab, d, dtype=DTYPE)
        self.wpe = nn.Embedding(max_seq, d, dtype=DTYPE)
        self.h = nn.ModuleList(
            [Block(d, heads, max_seq) for _ in range(layers)])
        for uid, block in enumerate(self.h):
            block.attn.uid = uid
        self.ln_f = nn.LayerNorm(d, eps=1e-5, dtype=DTYPE)

    def forward(self, idx, targets):
        B, T = idx.shape
        pos = torch.arange(T, dtype=torch.long)
        x = self.wte(idx) + self.wpe(pos)[None]
        for block in self.h:
            x = block(x)
        logits = self.ln_f(x) @ self.wte.weight.t()  # tied LM head
        loss = F.cross_entropy(logits.reshape(B * T, -1), targets.reshape(-1))
        return logits, loss


# --- Llama ---------------------------------------------------------------------


def rmsnorm(x, weight, eps=1e-5):
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * weight


def rotary(x, theta):
    """x [B, heads, T, hd] rotated by position: the pair (i, i + hd/2) by
    t * theta^(-2i / hd) for position t (rotate-half)."""
    T, hd = x.shape[2], x.shape[3]
    inv_freq = 1.0 / theta**(torch.arange(0, hd, 2, dtype=DTYPE) / hd)
    angles = torch.arange(T, dtype=DTYPE)[:, None] * inv_freq[None, :]
    cos = torch.cat([angles.cos(), angles.cos()], dim=-1)
    sin = torch.cat([angles.sin(), angles.sin()], dim=-1)
    x1, x2 = x[..., :hd // 2], x[..., hd // 2:]
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


class LlamaLayer(nn.Module):

    def __init__(self, d, heads, kv_heads, hidden, theta):
        super().__init__()
        self.heads, self.kv_heads, self.theta = heads, kv_heads, theta
        hd = d // heads
        p = lambda *shape: nn.Parameter(torch.zeros(*shape, dtype=DTYPE))
        self.attn_norm, self.mlp_norm = p(d), p(d)
        self.wqkv = p(d, (heads + 2 * kv_heads) * hd)
        self.wo = p(heads * hd, d)
        self.w_gate, self.w_up, self.w_down = p(d, hidden), p(d, hidden), \
            p(hidden, d)

    def attention(self, x):
        B, T, _ = x.shape
        H, KV = self.heads, self.kv_heads
        hd = self.wqkv.shape[1] // (H + 2 * KV)
        q, k, v = (x @ self.wqkv).split([H * hd, KV * hd, KV * hd], dim=2)
        q = rotary(q.view(B, T, H, hd).transpose(1, 2), self.theta)
        k = rotary(k.view(B, T, KV, hd).transpose(1, 2), self.theta)
        v = v.view(B, T, KV, hd).transpose(1, 2)
        # Query head h attends with key/value head h // (H / KV).
        k = k.repeat_interleave(H // KV, dim=1)
        v = v.repeat_interleave(H // KV, dim=1)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(hd)
        causal = torch.tril(torch.ones(T, T, dtype=torch.bool))
        att = F.softmax(att.masked_fill(~causal, float("-inf")), dim=-1)
        return (att @ v).transpose(1, 2).reshape(B, T, H * hd) @ self.wo

    def forward(self, x):
        x = x + self.attention(rmsnorm(x, self.attn_norm))
        h = rmsnorm(x, self.mlp_norm)
        return x + (F.silu(h @ self.w_gate) * (h @ self.w_up)) @ self.w_down


class Llama(nn.Module):

    def __init__(self, vocab, d, heads, kv_heads, hidden, layers, theta):
        super().__init__()
        self.embed = nn.Parameter(torch.zeros(vocab, d, dtype=DTYPE))
        self.layers = nn.ModuleList([
            LlamaLayer(d, heads, kv_heads, hidden, theta)
            for _ in range(layers)])
        self.norm = nn.Parameter(torch.zeros(d, dtype=DTYPE))
        self.lm_head = nn.Parameter(torch.zeros(d, vocab, dtype=DTYPE))

    def forward(self, idx, targets):
        B, T = idx.shape
        x = self.embed[idx]
        for layer in self.layers:
            x = layer(x)
        logits = rmsnorm(x, self.norm) @ self.lm_head
        loss = F.cross_entropy(logits.reshape(B * T, -1), targets.reshape(-1))
        return logits, loss


class MixtralLayer(LlamaLayer):
    """The Llama layer with a sparse mixture of SwiGLU experts for its MLP:
    softmax over the router's logits, each token's top_k experts, their
    probabilities renormalised to sum to 1, and the experts' outputs summed
    with those weights (Mixtral's routing)."""

    def __init__(self, d, heads, kv_heads, hidden, theta, experts, top_k,
                 aux_loss=None, capacity_factor=None, bias_update=None):
        super().__init__(d, heads, kv_heads, hidden, theta)
        del self.mlp_norm, self.w_gate, self.w_up, self.w_down
        p = lambda *shape: nn.Parameter(torch.zeros(*shape, dtype=DTYPE))
        self.top_k, self.renormalise = top_k, True
        self.moe_norm = p(d)
        self.router = p(d, experts)
        self.w_gate, self.w_up = p(experts, d, hidden), p(experts, d, hidden)
        self.w_down = p(experts, hidden, d)
        # The balancing terms: the auxiliary loss of the last forward (added
        # to the loss for the backward), DeepSeek-V3's bias (updated after
        # each step from the step's load) and the per-sequence capacity.
        self.aux_coef, self.capacity_factor = aux_loss, capacity_factor
        self.bias_rate = bias_update
        self.register_buffer("bias", torch.zeros(experts, dtype=DTYPE))
        self.aux = torch.zeros((), dtype=DTYPE)
        self.load = torch.zeros(experts, dtype=DTYPE)

    def moe(self, h):
        B, T, d = h.shape
        E, K = self.router.shape[1], self.top_k
        probs = F.softmax(h @ self.router, dim=-1)  # [B, T, E]
        # The choice: by probability (the logits' order), or probability +
        # bias with bias balancing; the bias does not enter the weights.
        score = probs.detach() + self.bias if self.bias_rate else probs.detach()
        chosen = score.topk(K, dim=-1).indices  # [B, T, K]
        weights = probs.gather(-1, chosen)
        if self.renormalise:
            weights = weights / weights.sum(-1, keepdim=True)
        keep = torch.ones(B, T, K, dtype=torch.bool)
        if self.capacity_factor:
            # Per sequence, in token order: an expert takes at most C.
            C = max(1, min(T, math.ceil(self.capacity_factor * T * K / E)))
            for b in range(B):
                count = [0] * E
                for t in range(T):
                    for j in range(K):
                        e = int(chosen[b, t, j])
                        if count[e] < C:
                            count[e] += 1
                        else:
                            keep[b, t, j] = False
        counts = F.one_hot(chosen, E).sum(2).to(DTYPE)  # [B, T, E]
        self.load = counts.sum((0, 1))
        if self.aux_coef is not None:
            # Switch / GShard per sequence: E sum_e f_e P_e, f the share of
            # the sequence's T K choices, P the mean probability; averaged
            # over the sequences.
            f = counts.sum(1) / (T * K)
            P = probs.mean(1)
            self.aux = self.aux_coef * (E * (f * P).sum(-1)).mean()
        flat = h.reshape(B * T, d)
        w = (weights * keep).reshape(B * T, K)
        ch = chosen.reshape(B * T, K)
        out = torch.zeros_like(flat)
        for e in range(E):
            tok, slot = ((ch == e) & keep.reshape(B * T, K)).nonzero(
                as_tuple=True)
            if len(tok) == 0:
                continue
            xe = flat[tok]
            ye = (F.silu(xe @ self.w_gate[e]) * (xe @ self.w_up[e])) @ \
                self.w_down[e]
            out = out.index_add(0, tok, w[tok, slot, None] * ye)
        return out.reshape(B, T, d)

    def after_step(self):
        if self.bias_rate:
            self.bias += self.bias_rate * torch.sign(self.load.mean() -
                                                     self.load)

    def forward(self, x):
        x = x + self.attention(rmsnorm(x, self.attn_norm))
        return x + self.moe(rmsnorm(x, self.moe_norm))


def llama_names(layers):
    """planc's names (examples/models/llama.plan) -> this model's."""
    names = {"embed": "embed", "norm": "norm", "lm_head": "lm_head"}
    for i in range(layers):
        for n in ["attn_norm", "wqkv", "wo", "mlp_norm", "w_gate", "w_up",
                  "w_down"]:
            names[f"llama_layer.{i}.{n}"] = f"layers.{i}.{n}"
    return names


def mixtral_names(layers):
    """planc's names (examples/models/mixtral.plan) -> this model's."""
    names = {"embed": "embed", "norm": "norm", "lm_head": "lm_head"}
    for i in range(layers):
        for n in ["attn_norm", "wqkv", "wo", "moe_norm", "router", "w_gate",
                  "w_up", "w_down"]:
            names[f"mixtral_layer.{i}.{n}"] = f"layers.{i}.{n}"
    return names


def planc_names(layers):
    """planc's parameter name -> this model's parameter name. The plan
    (examples/models/gpt.plan) exports Hugging Face GPT-2's names, which are
    this module's names too, so the map is the identity; it is spelled out
    so that a renamed tensor fails loudly."""
    names = ["wte.weight", "wpe.weight", "ln_f.weight", "ln_f.bias"]
    per_layer = ["ln_1.weight", "ln_1.bias", "attn.c_attn.weight",
                 "attn.c_attn.bias", "attn.c_proj.weight", "attn.c_proj.bias",
                 "ln_2.weight", "ln_2.bias", "mlp.c_fc.weight",
                 "mlp.c_fc.bias", "mlp.c_proj.weight", "mlp.c_proj.bias"]
    for i in range(layers):
        names += [f"h.{i}.{n}" for n in per_layer]
    return {n: n for n in names}


# --- checks -------------------------------------------------------------------


def rel(a, b):
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    if not np.all(np.isfinite(a)):
        return float("inf")
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-300))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("plan")
    p.add_argument("init")
    p.add_argument("step0")
    p.add_argument("log")
    p.add_argument("--data", help="shard glob (default: the plan's, relative "
                   "to the current directory)")
    p.add_argument("--model", choices=["gpt", "llama", "mixtral"],
                   help="default: llama or mixtral when the plan imports "
                   "models/llama.plan or models/mixtral.plan, else gpt")
    p.add_argument("--rope-theta", type=float, default=10000.0)
    p.add_argument("--moe-unnormalised", action="store_true",
                   help="mixtral: weight the experts by their softmax "
                   "probabilities without renormalising them (a negative "
                   "check)")
    p.add_argument("--attn-dropout", type=float, default=0.0,
                   help="gpt: the plan's attention(..., dropout = p), every "
                   "layer (the mask as planrt documents it, the plan's seed)")
    p.add_argument("--logits-rtol", type=float, default=5e-6)
    p.add_argument("--loss0-rtol", type=float, default=1e-5)
    p.add_argument("--grad-rtol", type=float, default=1e-5)
    p.add_argument("--loss-rtol", type=float, default=1e-5)
    a = p.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))

    s = plan_settings(a.plan)
    ATTN_DROPOUT["p"] = a.attn_dropout
    ATTN_DROPOUT["seed"] = s["seed"]
    if s["dp"] != 1:
        sys.exit(f"error: {a.plan}: dp = {s['dp']}; this check needs dp = 1 "
                 "(the dumped logits are then the whole batch)")
    pattern = a.data or s["data"]
    if not pattern:
        sys.exit(f"error: {a.plan}: no 'data = shards(\"...\")' and no --data")
    B, S = s["batch"], s["seq"]
    stream = read_token_stream(pattern)
    init = read_safetensors(a.init)
    step0 = read_safetensors(a.step0)
    log_losses = read_losses(a.log)
    steps = len(log_losses)
    errors = []

    text = open(a.plan).read()
    kind = a.model or ("llama" if "llama.plan" in text else
                       "mixtral" if "mixtral.plan" in text else "gpt")
    if kind == "mixtral":
        model = Llama(s["vocab"], s["d"], s["heads"], s.get("kv_heads") or
                      s["heads"], s["hidden"], s["layers"], a.rope_theta)
        model.layers = nn.ModuleList([
            MixtralLayer(s["d"], s["heads"], s.get("kv_heads") or s["heads"],
                         s["hidden"], a.rope_theta, s["experts"], s["top_k"],
                         s["moe_aux_loss"], s["moe_capacity_factor"],
                         s["moe_bias_update"])
            for _ in range(s["layers"])])
        for layer in model.layers:
            layer.renormalise = not a.moe_unnormalised
        names = mixtral_names(s["layers"])
    elif kind == "llama":
        model = Llama(s["vocab"], s["d"], s["heads"], s.get("kv_heads") or
                      s["heads"], s["hidden"], s["layers"], a.rope_theta)
        names = llama_names(s["layers"])
    else:
        max_seq = init["wpe"].shape[0] if "wpe" in init else S
        model = GPT(s["vocab"], max_seq, s["d"], s["heads"], s["layers"])
        names = planc_names(s["layers"])
    params = dict(model.named_parameters())
    # A mixture of experts' bias (bias balancing) is state, not a
    # parameter: it starts at zero, as the reference's does.
    for n in [n for n in init if n.endswith(".expert_bias")]:
        if np.any(init.pop(n) != 0):
            errors.append(f"{n}: the experts' bias does not start at zero")
    if sorted(names.values()) != sorted(params):
        sys.exit("error: the name map does not cover the model: "
                 f"{sorted(set(params) ^ set(names.values()))}")
    if sorted(init) != sorted(names):
        errors.append("the program's parameters differ from the reference model's: "
                      f"only in planc {sorted(set(init) - set(names))}, "
                      f"only here {sorted(set(names) - set(init))}")
    with torch.no_grad():
        for pn, tn in names.items():
            if pn not in init:
                continue
            if tuple(init[pn].shape) != tuple(params[tn].shape):
                errors.append(f"{pn}: shape {list(init[pn].shape)}, the reference "
                              f"has {list(params[tn].shape)}")
                continue
            params[tn].copy_(torch.from_numpy(init[pn]).to(DTYPE))
    if errors:
        for e in errors:
            print("MISMATCH:", e)
        sys.exit(1)

    # Step 1 at the initial weights.
    def aux_total():
        """The MoE layers' auxiliary losses of the last forward (0 for
        others): in the gradient, not in the logged loss."""
        return sum((getattr(m, "aux", 0.0) for m in model.modules()
                    if isinstance(m, MixtralLayer)), torch.zeros((), dtype=DTYPE))

    x, y = batch(stream, 1, B, S)
    logits, loss = model(x, y)
    (loss + aux_total()).backward()
    if "logits" not in step0:
        errors.append(f"{a.step0} has no 'logits'")
        err_logits = float("inf")
    else:
        got = step0["logits"]
        ref = logits.detach().numpy()[:got.shape[0]]
        if got.shape != ref.shape:
            errors.append(f"logits: shape {list(got.shape)}, reference "
                          f"{list(ref.shape)}")
            err_logits = float("inf")
        else:
            err_logits = rel(got, ref)
    err_loss0 = rel(log_losses[0], loss.item())
    worst_grad, worst_grad_name = 0.0, "-"
    for pn, tn in names.items():
        key = "grad/" + pn
        if key not in step0:
            errors.append(f"{a.step0} has no '{key}'")
            continue
        ref = params[tn].grad.numpy()
        if step0[key].shape != ref.shape:
            errors.append(f"{key}: shape {list(step0[key].shape)}, reference "
                          f"{list(ref.shape)}")
            continue
        e = rel(step0[key], ref)
        if e > worst_grad or not math.isfinite(e):
            worst_grad, worst_grad_name = e, pn
        if not e <= a.grad_rtol:
            errors.append(f"gradient of {pn}: rel error {e:.2e} > "
                          f"{a.grad_rtol:g}")
    # The step's batch as the program read it: the same tokens as ours.
    for key, ref in (("input/tokens", x), ("label/targets", y)):
        if key in step0 and not np.array_equal(
                step0[key].astype(np.int64), ref.numpy()):
            errors.append(f"{key}: the program read a different batch")
    extra = sorted(k for k in step0
                   if k not in ("logits", "input/tokens", "label/targets")
                   and k[len("grad/"):] not in names)
    if extra:
        errors.append(f"{a.step0} has unexpected tensors {extra}")
    if not err_logits <= a.logits_rtol:
        errors.append(f"logits: rel error {err_logits:.2e} > "
                      f"{a.logits_rtol:g}")
    if not err_loss0 <= a.loss0_rtol:
        errors.append(f"step 1 loss: {log_losses[0]!r} vs reference "
                      f"{loss.item()!r} (rel error {err_loss0:.2e} > "
                      f"{a.loss0_rtol:g})")

    # `steps` steps of AdamW as planrt runs them (runtime/include/planrt/
    # kernels.h: ClipFn, AdamWFn): g *= min(1, clip / (||g|| + 1e-6)) over
    # all gradients; m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
    # w -= lr (m / (1 - b1^t) / (sqrt(v / (1 - b2^t)) + eps) + wd w), with wd
    # only on parameters of 2 or more dimensions.
    plist = [params[names[pn]] for pn in names]
    m = [torch.zeros_like(t) for t in plist]
    v = [torch.zeros_like(t) for t in plist]
    b1, b2, eps = s["beta1"], s["beta2"], s["eps"]
    ref_losses = []
    for step in range(1, steps + 1):
        if step > 1:
            for t in plist:
                t.grad = None
            ATTN_DROPOUT["step"] = step
            x, y = batch(stream, step, B, S)
            _, loss = model(x, y)
            (loss + aux_total()).backward()
        ref_losses.append(loss.item())
        with torch.no_grad():
            grads = [t.grad.clone() for t in plist]
            if s["grad_clip"]:
                norm = math.sqrt(sum(float((g * g).sum()) for g in grads))
                f = s["grad_clip"] / (norm + 1e-6)
                if f < 1.0:
                    grads = [g * f for g in grads]
            lr = lr_at(s, step, steps)
            bc1, bc2 = 1.0 - b1**step, 1.0 - b2**step
            for t, g, mi, vi in zip(plist, grads, m, v):
                mi.mul_(b1).add_((1.0 - b1) * g)
                vi.mul_(b2).add_((1.0 - b2) * g * g)
                wd = s["weight_decay"] if t.dim() >= 2 else 0.0
                t.sub_(lr * ((mi / bc1) / (torch.sqrt(vi / bc2) + eps) +
                             wd * t))
            for layer in model.modules():
                if isinstance(layer, MixtralLayer):
                    layer.after_step()
    worst_loss, worst_loss_step = 0.0, 0
    for i, (got, ref) in enumerate(zip(log_losses, ref_losses), 1):
        e = rel(got, ref)
        if e > worst_loss or not math.isfinite(e):
            worst_loss, worst_loss_step = e, i
        if not e <= a.loss_rtol:
            errors.append(f"step {i} loss: {got!r} vs reference {ref!r} "
                          f"(rel error {e:.2e} > {a.loss_rtol:g})")

    print(f"{kind}_reference: {len(names)} parameters, {steps} steps: logits rel "
          f"err {err_logits:.2e}, step-1 loss rel err {err_loss0:.2e}, worst "
          f"gradient rel err {worst_grad:.2e} ({worst_grad_name}), worst loss "
          f"rel err {worst_loss:.2e} (step {worst_loss_step}); losses "
          f"{log_losses[0]:.6f} -> {log_losses[-1]:.6f}")
    for e in errors:
        print("MISMATCH:", e)
    sys.exit(1 if errors else 0)


if __name__ == "__main__":
    main()
