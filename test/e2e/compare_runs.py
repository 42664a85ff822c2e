#!/usr/bin/env python3
"""Compares two training runs of a compiled plan: the per-step losses printed
by planrt and the final parameters written with --save (safetensors).

usage: compare_runs.py REF_LOG REF_PARAMS OTHER_LOG OTHER_PARAMS
                       [--loss-rtol 1e-5] [--param-rtol 1e-4] [--losses-only]
                       [--grad-norm-rtol R]

--losses-only compares the losses alone (the PARAMS arguments are not
read): for runs whose arithmetic differs on purpose, such as a bf16 run
against the fp32 one, where AdamW turns rounding-level gradient differences
of near-zero gradients into parameter updates of the learning rate's size.

Parameters (and batch norm's running statistics, which --save writes with
them) are compared as ||a - b|| / ||a|| per tensor (relative error in the
2-norm), losses step by step as |a - b| / |a|, and the evaluations
(--eval-every lines) by their loss, like a step's, and accuracy. Exits 1 with a report of
every mismatch. Uses only the standard library.

The gradient norms ("| grad norm G |", before clipping) are compared step by
step where both logs print them, at --grad-norm-rtol (default: the loss
tolerance) plus one unit of the last printed digit (planrt prints 5
significant digits, coarser than 1e-5): AdamW's first updates are about
lr * sign(g), so a gradient with a wrong scale barely moves the losses and
parameters of a short run, but it moves the norm."""
import argparse, json, math, re, struct, sys


def read_losses(path):
    losses = {}
    with open(path) as f:
        for line in f:
            m = re.match(r"step (\d+)/\d+ \| loss (\S+) \|", line)
            if m:
                losses[int(m.group(1))] = float(m.group(2))
    if not losses:
        sys.exit(f"error: no 'step N/M | loss X' lines in {path}")
    return losses


def read_grad_norms(path):
    """{step: (norm, resolution)} of the step lines that print a gradient
    norm; resolution is one unit of the last printed digit."""
    norms = {}
    with open(path) as f:
        for line in f:
            m = re.match(r"step (\d+)/\d+ \| loss \S+ \| grad norm (\S+) \|", line)
            if m:
                text = m.group(2)
                mant, _, exp = text.lower().partition("e")
                digits = len(mant.partition(".")[2])
                try:
                    unit = 10.0 ** (int(exp or 0) - digits)
                except ValueError:  # nan, inf
                    unit = 0.0
                norms[int(m.group(1))] = (float(text), unit)
    return norms


def read_evals(path):
    """{step: (loss, accuracy)} of the 'eval after step S | loss L | acc A'
    lines (--eval-every)."""
    evals = {}
    with open(path) as f:
        for line in f:
            m = re.match(r"eval after step (\d+) \| loss (\S+) \| acc (\S+) \|",
                         line)
            if m:
                evals[int(m.group(1))] = (float(m.group(2)), m.group(3))
    return evals


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    body = data[8 + n:]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] != "F32":
            sys.exit(f"error: {path}: {name} has dtype {info['dtype']}, expected F32")
        b, e = info["data_offsets"]
        vals = struct.unpack(f"<{(e - b) // 4}f", body[b:e])
        out[name] = (info["shape"], vals)
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("ref_log"); p.add_argument("ref_params")
    p.add_argument("log"); p.add_argument("params")
    p.add_argument("--loss-rtol", type=float, default=1e-5)
    p.add_argument("--param-rtol", type=float, default=1e-4)
    p.add_argument("--losses-only", action="store_true")
    p.add_argument("--grad-norm-rtol", type=float,
                   help="default: --loss-rtol")
    a = p.parse_args()
    errors = []
    ref, got = read_losses(a.ref_log), read_losses(a.log)
    if ref.keys() != got.keys():
        errors.append(f"different steps: {sorted(ref)} vs {sorted(got)}")
    worst_loss = 0.0
    for step in sorted(ref.keys() & got.keys()):
        r, g = ref[step], got[step]
        if not (math.isfinite(r) and math.isfinite(g)):
            errors.append(f"step {step}: non-finite loss {r} vs {g}")
            continue
        rel = abs(r - g) / max(abs(r), 1e-30)
        worst_loss = max(worst_loss, rel)
        if rel > a.loss_rtol:
            errors.append(f"step {step}: loss {r!r} vs {g!r} (rel {rel:.2e})")
    gref, ggot = read_grad_norms(a.ref_log), read_grad_norms(a.log)
    gn_rtol = a.loss_rtol if a.grad_norm_rtol is None else a.grad_norm_rtol
    worst_gn = 0.0
    for step in sorted(gref.keys() & ggot.keys()):
        (r, ur), (g, ug) = gref[step], ggot[step]
        if not (math.isfinite(r) and math.isfinite(g)):
            errors.append(f"step {step}: non-finite grad norm {r} vs {g}")
            continue
        rel = abs(r - g) / max(abs(r), 1e-30)
        worst_gn = max(worst_gn, rel)
        if abs(r - g) > gn_rtol * abs(r) + max(ur, ug):
            errors.append(f"step {step}: grad norm {r!r} vs {g!r} (rel {rel:.2e})")
    # Evaluations (--eval-every): losses like the steps', accuracies as
    # printed (4 decimals).
    eref, egot = read_evals(a.ref_log), read_evals(a.log)
    if eref.keys() != egot.keys():
        errors.append(f"different evaluations: after steps {sorted(eref)} "
                      f"vs {sorted(egot)}")
    worst_eval = 0.0
    for step in sorted(eref.keys() & egot.keys()):
        (r, ra), (g, ga) = eref[step], egot[step]
        rel = abs(r - g) / max(abs(r), 1e-30)
        if not math.isfinite(rel):
            errors.append(f"evaluation after step {step}: loss {r} vs {g}")
            continue
        worst_eval = max(worst_eval, rel)
        if rel > a.loss_rtol:
            errors.append(f"evaluation after step {step}: loss {r!r} vs "
                          f"{g!r} (rel {rel:.2e})")
        if ra != ga:
            errors.append(f"evaluation after step {step}: accuracy {ra} vs {ga}")
    pr, pg = ({}, {}) if a.losses_only else (read_safetensors(a.ref_params),
                                              read_safetensors(a.params))
    if pr.keys() != pg.keys():
        errors.append(f"different parameters: {sorted(pr)} vs {sorted(pg)}")
    worst_param = 0.0
    for name in sorted(pr.keys() & pg.keys()):
        (sr, vr), (sg, vg) = pr[name], pg[name]
        if sr != sg:
            errors.append(f"{name}: shape {sr} vs {sg}")
            continue
        num = math.sqrt(sum((x - y) ** 2 for x, y in zip(vr, vg)))
        den = max(math.sqrt(sum(x * x for x in vr)), 1e-30)
        if not math.isfinite(num):
            errors.append(f"{name}: non-finite values")
            continue
        worst_param = max(worst_param, num / den)
        if num / den > a.param_rtol:
            errors.append(f"{name}: relative difference {num / den:.2e}")
    print(f"compared {len(ref)} steps and {len(pr)} parameters: worst loss "
          f"rel diff {worst_loss:.2e}, worst parameter rel diff {worst_param:.2e}"
          + (f"; {len(eref)} evaluations: worst loss rel diff {worst_eval:.2e}"
             if eref else "")
          + (f"; {len(gref.keys() & ggot.keys())} grad norms: worst rel diff "
             f"{worst_gn:.2e}" if gref.keys() & ggot.keys() else ""))
    for e in errors:
        print("MISMATCH:", e)
    sys.exit(1 if errors else 0)


if __name__ == "__main__":
    main()
