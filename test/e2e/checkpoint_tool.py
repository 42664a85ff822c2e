#!/usr/bin/env python3
"""Reads planrt checkpoints (docs/checkpoints.md) independently of planrt.

usage: checkpoint_tool.py verify DIR
       checkpoint_tool.py compare DIR_A DIR_B [--rtol R] [--kind param|state]
       checkpoint_tool.py export DIR OUT.safetensors

DIR is a checkpoint (a step-NNNNNN directory with manifest.json). verify
checks every file's size and crc32 against the manifest and that the shards
of every tensor cover it exactly once; compare assembles the whole tensors of
two checkpoints (written under any plans) and compares them (relative error
in the 2-norm per tensor; exact with --rtol 0); export writes the whole
parameters as one safetensors file (what --save writes). Needs numpy."""
import argparse, json, struct, sys, zlib

import numpy as np


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8:8 + n]), data[8 + n:], data


def load(ckpt, check=True):
    """Whole tensors {kind/name: np.ndarray} of a checkpoint, and its manifest."""
    with open(f"{ckpt}/manifest.json") as f:
        m = json.load(f)
    assert m["format"] == "planrt-checkpoint" and m["version"] == 1, "not a checkpoint"
    files = {}
    for entry in m["files"]:
        header, body, raw = read_safetensors(f"{ckpt}/{entry['file']}")
        if check:
            if len(raw) != entry["bytes"]:
                sys.exit(f"error: {entry['file']}: {len(raw)} bytes, manifest says {entry['bytes']}")
            crc = "%08x" % (zlib.crc32(raw) & 0xffffffff)
            if crc != entry["crc32"]:
                sys.exit(f"error: {entry['file']}: crc32 {crc}, manifest says {entry['crc32']}")
            if header["__metadata__"]["step"] != str(m["step"]):
                sys.exit(f"error: {entry['file']}: step {header['__metadata__']['step']}")
        files[entry["file"]] = (header, body)
    out = {}
    for t in m["tensors"]:
        key = f"{t['kind']}/{t['name']}"
        whole = np.zeros(t["shape"], dtype=np.float32)
        count = np.zeros(t["shape"], dtype=np.int32)
        for s in t["shards"]:
            header, body = files[s["file"]]
            info = header[key]
            b, e = info["data_offsets"]
            block = np.frombuffer(body[b:e], dtype="<f4").reshape(info["shape"])
            index = [np.concatenate([np.arange(lo, hi) for lo, hi in dim])
                     for dim in s["ranges"]]
            assert [len(i) for i in index] == list(info["shape"]), key
            whole[np.ix_(*index)] = block
            count[np.ix_(*index)] += 1
        if check and not (count == 1).all():
            sys.exit(f"error: {key}: shards cover some elements {count.min()} "
                     f"to {count.max()} times")
        out[key] = whole
    return out, m


def main():
    p = argparse.ArgumentParser()
    p.add_argument("command", choices=["verify", "compare", "export"])
    p.add_argument("paths", nargs="+")
    p.add_argument("--rtol", type=float, default=1e-4)
    p.add_argument("--kind", choices=["param", "state"])
    a = p.parse_args()
    if a.command == "verify":
        tensors, m = load(a.paths[0])
        print(f"verified {len(m['files'])} files and {len(tensors)} tensors "
              f"of step {m['step']}")
        return
    if a.command == "export":
        tensors, m = load(a.paths[0])
        header, blobs, off = {}, [], 0
        for t in m["tensors"]:
            if t["kind"] != "param":
                continue
            v = tensors["param/" + t["name"]]
            if "export_rows" in t:
                v = v[: t["export_rows"]]
            b = np.ascontiguousarray(v, dtype="<f4").tobytes()
            header[t["name"]] = {"dtype": "F32", "shape": list(v.shape),
                                 "data_offsets": [off, off + len(b)]}
            blobs.append(b)
            off += len(b)
        h = json.dumps(header, separators=(",", ":")).encode()
        h += b" " * (-len(h) % 8)
        with open(a.paths[1], "wb") as f:
            f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
        print(f"exported {len(header)} parameters")
        return
    (ta, ma), (tb, mb) = load(a.paths[0]), load(a.paths[1])
    errors, worst = [], 0.0
    keys = [k for k in ta if not a.kind or k.startswith(a.kind + "/")]
    if set(keys) != {k for k in tb if not a.kind or k.startswith(a.kind + "/")}:
        errors.append("different tensors")
    for k in keys:
        if k not in tb or ta[k].shape != tb[k].shape:
            errors.append(f"{k}: missing or another shape")
            continue
        # NaN fails every comparison (num / den > rtol is False for it), so
        # a poisoned or diverged tensor must be caught before the norms.
        bad = [n for n, t in ((a.paths[0], ta[k]), (a.paths[1], tb[k]))
               if not np.isfinite(t).all()]
        if bad:
            errors.append(f"{k}: non-finite values in {', '.join(bad)}")
            continue
        num = float(np.linalg.norm((ta[k] - tb[k]).ravel()))
        den = max(float(np.linalg.norm(ta[k].ravel())), 1e-30)
        worst = max(worst, num / den)
        if num / den > a.rtol or (a.rtol == 0 and not np.array_equal(ta[k], tb[k])):
            errors.append(f"{k}: rel error {num / den:.2e}")
    print(f"compared {len(keys)} tensors of steps {ma['step']} and {mb['step']}; "
          f"worst rel {worst:.2e}")
    for e in errors:
        print("MISMATCH:", e)
    sys.exit(1 if errors else 0)


if __name__ == "__main__":
    main()
