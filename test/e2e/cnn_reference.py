#!/usr/bin/env python3
"""Checks planc's convolution, pooling and classifier against PyTorch.

usage: cnn_reference.py INIT STEP0 LOG

INIT   the parameters before step 1 (--save-init) of Inputs/cnn-small.plan
STEP0  what the program observed in step 1 (--dump-step0): the images
       'input/x', the classes 'label/y', 'logits' and 'grad/<param>'
LOG    the program's stdout (its step lines)

The model is Inputs/cnn-small.plan written with torch.nn.functional (conv2d,
max_pool2d, avg_pool2d, batch_norm in training mode and group_norm: PyTorch's
definitions of padding, stride, dilation and groups), in float64 from
planc's initial weights and its step-1 batch.
Checks, as relative errors in the 2-norm: the logits, the step-1 loss and
every parameter's gradient. Tolerance 1e-5: planc computes in float32, and
the errors measured are about 3e-7; a wrong padding, stride or window
moves them to order 1. Prints one summary line, a MISMATCH line per failed
check."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare_runs  # noqa: E402
from gpt_reference import rel  # noqa: E402  (the 2-norm relative error)

import numpy as np
import torch
import torch.nn.functional as F

RTOL = 1e-5


def load(path):
    return {n: torch.tensor(np.asarray(v, np.float64).reshape(s))
            for n, (s, v) in compare_runs.read_safetensors(path).items()}


def model(p, x, y):
    h = F.conv2d(x, p["w1"], padding=1)
    h = F.relu(F.batch_norm(h, None, None, p["g1"], p["be1"], training=True,
                            eps=1e-5))
    h = F.max_pool2d(h, kernel_size=3, stride=2, padding=1)
    h = F.conv2d(h, p["w2"], groups=2, dilation=2, padding=2)
    h = F.relu(F.group_norm(h, 4, p["g2"], p["be2"], eps=1e-5))
    h = F.conv2d(h, p["w3"], p["b3"], stride=2, padding=(1, 0))
    h = F.avg_pool2d(h, kernel_size=(2, 1), stride=1)
    logits = h.flatten(1) @ p["fc_w"] + p["fc_b"]
    return logits, F.cross_entropy(logits, y)


def main():
    init_path, step0_path, log_path = sys.argv[1:4]
    params = load(init_path)
    step0 = load(step0_path)
    for t in params.values():
        t.requires_grad_(True)
    x = step0["input/x"]
    y = step0["label/y"].long()
    logits, loss = model(params, x, y)
    loss.backward()
    errors = []
    e_logits = rel(step0["logits"], logits.detach())
    loss1 = compare_runs.read_losses(log_path)[1]
    e_loss = abs(loss1 - loss.item()) / abs(loss.item())
    worst, worst_name = 0.0, ""
    for name, t in params.items():
        g = step0.get("grad/" + name)
        if g is None:
            errors.append(f"no gradient of {name} in {step0_path}")
            continue
        e = rel(g, t.grad)
        if e > worst or not np.isfinite(e):
            worst, worst_name = e, name
        if not e <= RTOL:
            errors.append(f"gradient of {name}: rel error {e:.2e} > {RTOL:g}")
    for what, e in (("logits", e_logits), ("step-1 loss", e_loss)):
        if not e <= RTOL:
            errors.append(f"{what}: rel error {e:.2e} > {RTOL:g}")
    classes = len(set(y.tolist()))
    print(f"cnn_reference: {len(params)} parameters, batch {len(y)} of "
          f"{classes} classes: logits rel err {e_logits:.1e}, step-1 loss rel "
          f"err {e_loss:.1e}, worst gradient rel err {worst:.1e} ({worst_name})")
    for e in errors:
        print("MISMATCH:", e)
    sys.exit(1 if errors else 0)


if __name__ == "__main__":
    main()
