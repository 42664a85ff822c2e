"""Checks what a generated program writes for people and tools
(runtime-ux.test). Exits 1 with the reason on a mismatch.

  check_ux.py json RUN.log LOG.jsonl [--mfu]
      every step line of RUN.log has a --log-json object with the same step
      and loss (and lr / grad norm where the line has them); the last object
      is the summary with memory by kind; with --mfu every step's mfu is a
      number equal to step_flops_per_rank / step_time_s / peak_flops.
  check_ux.py trace BASE RANKS
      BASE with .rankR before its extension parses for R < RANKS; each holds
      step slices, F/B unit slices with stage/microbatch/phase, collectives
      and send/recv with axis and bytes, all on pid = R.
  check_ux.py merged FILE RANKS
      one pid per rank, F0 and B0 on every rank.
"""
import json
import math
import os
import re
import sys


def fail(msg):
    print(f"FAILED: {msg}")
    sys.exit(1)


def check_json(log, jsonl, mfu):
    lines = {}
    with open(log) as f:
        for line in f:
            m = re.match(r"step (\d+)/(\d+) \| loss (\S+) \|", line)
            if m:
                lines[int(m.group(1))] = (float(m.group(3)), line)
    objs = []
    with open(jsonl) as f:
        for n, line in enumerate(f, 1):
            try:
                objs.append(json.loads(line))
            except json.JSONDecodeError as e:
                fail(f"{jsonl}:{n}: not JSON: {e}")
    if not lines:
        fail(f"no step lines in {log}")
    steps = [o for o in objs if o.get("type") == "step"]
    if objs[-1].get("type") != "summary":
        fail("the last object is not the summary")
    if sorted(o["step"] for o in steps) != sorted(lines):
        fail(f"steps {[o['step'] for o in steps]} vs lines {sorted(lines)}")
    keys = {"step", "loss", "lr", "grad_norm", "tokens_per_s", "step_time_s",
            "mfu", "elapsed_s"}
    for o in steps:
        if not keys <= o.keys():
            fail(f"step {o.get('step')}: missing {keys - o.keys()}")
        loss, line = lines[o["step"]]
        if o["loss"] != loss:
            fail(f"step {o['step']}: loss {o['loss']!r} vs line {loss!r}")
        m = re.search(r"\| grad norm (\S+) \|", line)
        if m and not math.isclose(o["grad_norm"], float(m.group(1)),
                                  rel_tol=1e-4):
            fail(f"step {o['step']}: grad norm {o['grad_norm']} vs {line}")
        m = re.search(r"\| lr (\S+)", line)
        if m and not math.isclose(o["lr"], float(m.group(1)), rel_tol=1e-3):
            fail(f"step {o['step']}: lr {o['lr']} vs {line}")
        if not (o["step_time_s"] > 0 and o["elapsed_s"] >= 0):
            fail(f"step {o['step']}: times {o}")
    s = objs[-1]
    if s["final_loss"] != lines[max(lines)][0]:
        fail(f"summary final_loss {s['final_loss']} vs the last line")
    mem = s["memory"]
    for kind in ("rank0", "max_over_ranks"):
        for k in ("params_bytes", "optimizer_state_bytes",
                  "step_arena_peak_bytes"):
            if not (isinstance(mem[kind][k], int) and mem[kind][k] > 0):
                fail(f"summary memory {kind} {k}: {mem[kind].get(k)}")
    if mfu:
        for o in steps:
            want = (s["step_flops_per_rank"] / o["step_time_s"] /
                    s["peak_flops"])
            if o["mfu"] is None or not math.isclose(o["mfu"], want,
                                                    rel_tol=1e-2):
                fail(f"step {o['step']}: mfu {o['mfu']} vs {want}")
    else:
        if any(o["mfu"] is not None for o in steps) or s["mfu"] is not None:
            fail("an mfu without a peak FLOP/s")
    print(f"json ok: {len(steps)} steps, losses equal, summary with memory")


def check_trace(base, ranks):
    root, ext = os.path.splitext(base)
    for r in range(ranks):
        path = f"{root}.rank{r}{ext}"
        with open(path) as f:
            events = json.load(f)
        xs = [e for e in events if e.get("ph") == "X"]
        if any(e["pid"] != r for e in events):
            fail(f"{path}: an event with pid != {r}")
        steps = [e for e in xs if e["cat"] == "step"]
        units = [e for e in xs if e["cat"] in ("forward", "backward",
                                                "weight_grad")]
        colls = [e for e in xs if e["cat"] == "collective"]
        p2p = [e for e in xs if e["cat"] == "p2p"]
        names = {e["name"] for e in units}
        if not steps:
            fail(f"{path}: no step slices")
        if not {"F0", "B0"} <= names:
            fail(f"{path}: no F0/B0 unit slices (got {sorted(names)})")
        for e in units:
            a = e["args"]
            if e["name"] != e["name"][0] + str(a["microbatch"]) or \
                    "stage" not in a or a["phase"] != e["cat"]:
                fail(f"{path}: unit slice {e}")
        if not colls or not all("axis" in e["args"] and e["args"]["bytes"] > 0
                                for e in colls if e["name"] != "collective_wait"):
            fail(f"{path}: no collectives with axis and bytes")
        if not p2p or not all(e["args"]["axis"] == "pp" and
                              e["args"]["bytes"] > 0 for e in p2p):
            fail(f"{path}: no send/recv with axis and bytes")
        for e in units + colls + p2p:
            if not any(s["ts"] <= e["ts"] and
                       e["ts"] + e["dur"] <= s["ts"] + s["dur"] + 1e-3
                       for s in steps):
                fail(f"{path}: {e['name']} outside every step slice")
        print(f"rank {r}: {len(steps)} steps, {len(units)} units "
              f"({' '.join(sorted(names))}), {len(colls)} collectives "
              f"({' '.join(sorted({e['name'] for e in colls}))}), "
              f"{len(p2p)} send/recv")


def check_merged(path, ranks):
    with open(path) as f:
        d = json.load(f)
    xs = [e for e in d["traceEvents"] if e.get("ph") == "X"]
    pids = sorted({e["pid"] for e in xs})
    if pids != list(range(ranks)):
        fail(f"pids {pids}, want 0..{ranks - 1}")
    for r in range(ranks):
        names = {e["name"] for e in xs if e["pid"] == r}
        if not {"F0", "B0"} <= names:
            fail(f"rank {r}: no F0/B0 in the merged trace")
    if min(e["ts"] for e in xs) != 0:
        fail("the merged trace does not start at 0")
    print(f"merged ok: pids {pids}")


def main():
    mode = sys.argv[1]
    if mode == "json":
        check_json(sys.argv[2], sys.argv[3], "--mfu" in sys.argv[4:])
    elif mode == "trace":
        check_trace(sys.argv[2], int(sys.argv[3]))
    elif mode == "merged":
        check_merged(sys.argv[2], int(sys.argv[3]))
    else:
        fail(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
