#!/usr/bin/env python3
"""Checks planc's convolution, pooling, classifier and batch norm's running
statistics and evaluation mode against PyTorch.

usage: cnn_reference.py INIT STEP0 LOG AFTER1 EVAL

INIT   the parameters and running statistics before step 1 (--save-init)
       of Inputs/cnn-small.plan
STEP0  what the program observed in step 1 (--dump-step0): the images
       'input/x', the classes 'label/y', 'logits' and 'grad/<param>'
LOG    the program's stdout (its step lines and the evaluation after step 1)
AFTER1 the parameters and running statistics after step 1 (--save)
EVAL   the first held-out batch of the evaluation after step 1
       (--dump-eval): 'input/x', 'label/y' and its 'logits'

The model is Inputs/cnn-small.plan written with torch.nn.functional (conv2d,
max_pool2d, avg_pool2d, batch_norm and group_norm: PyTorch's definitions of
padding, stride, dilation, groups and running statistics), in float64.
Checks, as relative errors in the 2-norm: from planc's initial weights and
its step-1 batch, the logits, the step-1 loss, every parameter's gradient
and the running mean and variance after the step (F.batch_norm in training
mode with momentum 0.3 updates them: the unbiased variance); from planc's
weights and running statistics after step 1, the evaluation's logits and
loss on its held-out batch (batch norm in evaluation mode). Tolerance 1e-5:
planc computes in float32, and the errors measured are about 3e-7; a wrong
padding, stride, window or statistic moves them to order 1. Prints one
summary line, a MISMATCH line per failed check."""
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


MOMENTUM = 0.3  # Inputs/cnn-small.plan's batch_norm


def model(p, x, y, running=(None, None), training=True):
    h = F.conv2d(x, p["w1"], padding=1)
    h = F.relu(F.batch_norm(h, running[0], running[1], p["g1"], p["be1"],
                            training=training, momentum=MOMENTUM, eps=1e-5))
    h = F.max_pool2d(h, kernel_size=3, stride=2, padding=1)
    h = F.conv2d(h, p["w2"], groups=2, dilation=2, padding=2)
    h = F.relu(F.group_norm(h, 4, p["g2"], p["be2"], eps=1e-5))
    h = F.conv2d(h, p["w3"], p["b3"], stride=2, padding=(1, 0))
    h = F.avg_pool2d(h, kernel_size=(2, 1), stride=1)
    logits = h.flatten(1) @ p["fc_w"] + p["fc_b"]
    return logits, F.cross_entropy(logits, y)


def is_running(name):
    return name.endswith(".running_mean") or name.endswith(".running_var")


def read_eval_loss(path):
    with open(path) as f:
        for line in f:
            if line.startswith("eval after step 1 | loss "):
                return float(line.split()[6])
    sys.exit(f"error: no 'eval after step 1 | loss X' line in {path}")


def main():
    init_path, step0_path, log_path, after_path, eval_path = sys.argv[1:6]
    loaded = load(init_path)
    params = {n: t for n, t in loaded.items() if not is_running(n)}
    running = [loaded["g1.running_mean"].clone(),
               loaded["g1.running_var"].clone()]
    step0 = load(step0_path)
    for t in params.values():
        t.requires_grad_(True)
    x = step0["input/x"]
    y = step0["label/y"].long()
    logits, loss = model(params, x, y, running)  # updates `running`
    loss.backward()
    errors = []
    # The running statistics after step 1, and the evaluation after it.
    after = load(after_path)
    e_running = max(rel(after["g1.running_mean"], running[0]),
                    rel(after["g1.running_var"], running[1]))
    ev = load(eval_path)
    with torch.no_grad():
        eval_logits, eval_loss = model(
            {n: t for n, t in after.items() if not is_running(n)},
            ev["input/x"], ev["label/y"].long(),
            (after["g1.running_mean"], after["g1.running_var"]),
            training=False)
    e_eval_logits = rel(ev["logits"], eval_logits)
    e_eval_loss = (abs(read_eval_loss(log_path) - eval_loss.item()) /
                   abs(eval_loss.item()))
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
    for what, e in (("logits", e_logits), ("step-1 loss", e_loss),
                    ("running statistics after step 1", e_running),
                    ("evaluation logits", e_eval_logits),
                    ("evaluation loss", e_eval_loss)):
        if not e <= RTOL:
            errors.append(f"{what}: rel error {e:.2e} > {RTOL:g}")
    classes = len(set(y.tolist()))
    print(f"cnn_reference: {len(params)} parameters, batch {len(y)} of "
          f"{classes} classes: logits rel err {e_logits:.1e}, step-1 loss rel "
          f"err {e_loss:.1e}, worst gradient rel err {worst:.1e} ({worst_name}); "
          f"running statistics after step 1 rel err {e_running:.1e}; "
          f"evaluation logits rel err {e_eval_logits:.1e}, loss rel err "
          f"{e_eval_loss:.1e}")
    for e in errors:
        print("MISMATCH:", e)
    sys.exit(1 if errors else 0)


if __name__ == "__main__":
    main()
