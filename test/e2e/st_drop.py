#!/usr/bin/env python3
"""Copies a safetensors file without the tensors whose names contain WORD,
and prints the names it dropped (sorted, one line).

usage: st_drop.py IN OUT WORD"""
import json, struct, sys

src, dst, word = sys.argv[1:4]
with open(src, "rb") as f:
    data = f.read()
(n,) = struct.unpack("<Q", data[:8])
header = json.loads(data[8:8 + n])
body = data[8 + n:]
out, parts, offset, dropped = {}, [], 0, []
for name, info in header.items():
    if name == "__metadata__":
        out[name] = info
        continue
    if word in name:
        dropped.append(name)
        continue
    b, e = info["data_offsets"]
    parts.append(body[b:e])
    out[name] = dict(info, data_offsets=[offset, offset + e - b])
    offset += e - b
text = json.dumps(out).encode()
text += b" " * (-len(text) % 8)
with open(dst, "wb") as f:
    f.write(struct.pack("<Q", len(text)) + text + b"".join(parts))
print(" ".join(sorted(dropped)))
