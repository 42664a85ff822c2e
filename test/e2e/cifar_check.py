#!/usr/bin/env python3
"""Makes CIFAR-10-format files, or checks what a program read from them.

usage: cifar_check.py make DIR           writes DIR/data_batch_1.bin (20
                                         records) and data_batch_2.bin (13)
       cifar_check.py check DIR STEP0 B  step 1's 'input/images' and
                                         'label/labels' (--dump-step0) must be
                                         records 0..B-1, decoded as
                                         docs/runtime.md says

The records are random bytes from a fixed seed, classes 0-9."""
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare_runs  # noqa: E402

MEAN = (0.4914, 0.4822, 0.4465)
STD = (0.2470, 0.2435, 0.2616)


def records(d):
    out = []
    for name in sorted(os.listdir(d)):
        data = open(os.path.join(d, name), "rb").read()
        out += [data[i:i + 3073] for i in range(0, len(data), 3073)]
    return out


def main():
    if sys.argv[1] == "make":
        rng = random.Random(7)
        os.makedirs(sys.argv[2], exist_ok=True)
        for name, n in (("data_batch_1.bin", 20), ("data_batch_2.bin", 13)):
            with open(os.path.join(sys.argv[2], name), "wb") as f:
                for _ in range(n):
                    f.write(bytes([rng.randrange(10)]) +
                            bytes(rng.randrange(256) for _ in range(3072)))
        return
    d, step0, batch = sys.argv[2], sys.argv[3], int(sys.argv[4])
    recs = records(d)[:batch]
    got = compare_runs.read_safetensors(step0)
    _, images = got["input/images"]
    _, labels = got["label/labels"]
    bad = 0
    for r, rec in enumerate(recs):
        if labels[r] != rec[0]:
            bad += 1
        for c in range(3):
            for i in range(1024):
                want = (rec[1 + c * 1024 + i] / 255.0 - MEAN[c]) / STD[c]
                if abs(images[(r * 3 + c) * 1024 + i] - want) > 1e-5:
                    bad += 1
    print(f"cifar_check: {len(recs)} records, {bad} mismatches")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
