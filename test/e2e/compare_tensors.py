#!/usr/bin/env python3
"""Compares named tensors of two safetensors files (relative error in the
2-norm, as compare_runs.py does), one line per tensor, and a MISMATCH line
for each above the tolerance.

usage: compare_tensors.py A B NAME [NAME ...] [--rtol 1e-6]"""
import argparse, math, os, sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare_runs  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("a"); p.add_argument("b"); p.add_argument("names", nargs="+")
p.add_argument("--rtol", type=float, default=1e-6)
args = p.parse_args()
ta, tb = compare_runs.read_safetensors(args.a), compare_runs.read_safetensors(args.b)
bad = []
for name in args.names:
    if name not in ta or name not in tb:
        bad.append(f"{name}: missing")
        continue
    (sa, va), (sb, vb) = ta[name], tb[name]
    num = math.sqrt(sum((x - y) ** 2 for x, y in zip(va, vb)))
    den = max(math.sqrt(sum(x * x for x in va)), 1e-30)
    print(f"{name} rel diff {num / den:.2e}")
    if sa != sb or not num / den <= args.rtol:
        bad.append(f"{name}: rel diff {num / den:.2e} (shapes {sa}, {sb})")
for b in bad:
    print("MISMATCH:", b)
sys.exit(1 if bad else 0)
