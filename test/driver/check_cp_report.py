"""Prints the activations of a cp sweep's reports relative to cp = 1 and
the collectives over cp of each exchange (test/driver/report-cp.test)."""
import json
import os
import sys

d = sys.argv[1]
load = lambda n: json.load(open(os.path.join(d, n + ".json")))
base = load("cp1")["memory_per_rank"]["activations"]
print("cp 1: activations 1.000")
for c in (2, 4, 8):
    r = load("cp%d" % c)["memory_per_rank"]["activations"] / base
    print("cp %d: activations %.3f of cp 1" % (c, r))


def over_cp(name):
    return sorted(e["kind"] for e in load(name)["comm"] if e["axes"] == "cp")


print("cp 4 all_to_all: " + ", ".join(k + " over cp" for k in over_cp("cp4-a2a")))
print("cp 4 ring: " + ", ".join(k + " over cp" for k in over_cp("cp4-ring")))
print("cp 4 all_gather: " + ", ".join(k + " over cp" for k in over_cp("cp4")))
