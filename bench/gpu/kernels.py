#!/usr/bin/env python3
"""GPU time by kernel from ncu's raw CSV (--metrics gpu__time_duration.sum
--csv --page raw): kernels grouped by name, sorted by their total time.

usage: kernels.py NCU_CSV"""
import csv
import sys
from collections import defaultdict

total, count = defaultdict(float), defaultdict(int)
with open(sys.argv[1], newline="") as f:
    rows = [r for r in csv.reader(f) if r and not r[0].startswith("==")]
head = rows[0]
name_col = head.index("Kernel Name")
time_col = head.index("gpu__time_duration.sum")
unit = rows[1][time_col] if len(rows) > 1 else "ns"
scale = {"ns": 1e-6, "us": 1e-3, "usecond": 1e-3, "ms": 1.0, "msecond": 1.0,
         "nsecond": 1e-6, "s": 1e3, "second": 1e3}.get(unit, 1e-6)
for r in rows[2:]:
    try:
        t = float(r[time_col].replace(",", "")) * scale
    except (ValueError, IndexError):
        continue
    # The kernel families' own kernels sit in anonymous namespaces, whose
    # "(" would cut every name there at the family.
    name = r[name_col].replace("(anonymous namespace)::", "")
    name = name.replace("planrt::kernels::", "").split("(")[0][:110]
    total[name] += t
    count[name] += 1
all_ms = sum(total.values())
print(f"{all_ms:.1f} ms of kernel time in {sum(count.values())} launches")
print(f"{'ms':>9} {'%':>5} {'launches':>8}  kernel")
for name, t in sorted(total.items(), key=lambda kv: -kv[1]):
    print(f"{t:9.2f} {100 * t / all_ms:5.1f} {count[name]:8d}  {name}")
