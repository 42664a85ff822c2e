#!/usr/bin/env python3
"""Checks a --save-dtype bf16 file against the f32 --save of the same run.

usage: check_save_dtype.py F32.safetensors BF16.safetensors

Every tensor of the bf16 file must be dtype BF16 with the f32 file's shape,
and its bits must equal PyTorch's conversion of the f32 values
(torch.Tensor.to(torch.bfloat16): round to nearest even). Prints
"N tensors match PyTorch's bf16 rounding"; exits 1 on any difference."""
import json
import struct
import sys

import torch


def load(path):
    blob = open(path, "rb").read()
    n = struct.unpack("<Q", blob[:8])[0]
    header = json.loads(blob[8:8 + n])
    data = blob[8 + n:]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        dtype = {"F32": torch.float32, "BF16": torch.bfloat16}[info["dtype"]]
        out[name] = (info["dtype"], torch.frombuffer(
            bytearray(data[begin:end]), dtype=dtype).reshape(info["shape"]))
    return out


f32, bf16 = load(sys.argv[1]), load(sys.argv[2])
problems = []
if f32.keys() != bf16.keys():
    problems.append(f"tensor names differ: {sorted(f32.keys() ^ bf16.keys())}")
for name in sorted(f32.keys() & bf16.keys()):
    dt, t = bf16[name]
    ref = f32[name][1].to(torch.bfloat16)
    if dt != "BF16":
        problems.append(f"{name}: dtype {dt}, want BF16")
    elif t.shape != ref.shape:
        problems.append(f"{name}: shape {list(t.shape)}, want {list(ref.shape)}")
    elif not torch.equal(t.view(torch.int16), ref.view(torch.int16)):
        problems.append(f"{name}: bits differ from PyTorch's bf16 rounding")
for p in problems:
    print("MISMATCH: " + p)
if problems:
    sys.exit(1)
print(f"{len(f32)} tensors match PyTorch's bf16 rounding")
