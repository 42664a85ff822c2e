#!/usr/bin/env python3
"""Merges the per-rank Chrome traces of a planc-generated program's --trace
into one timeline: one process per rank (pid = rank, named "rank R (pp=.., dp=..)"
and sorted by rank), timestamps rebased so that the earliest event is at 0.
Pipeline units are slices named like planc --emit=schedule's (F3, B3, W3:
phase letter and microbatch; args stage, microbatch, phase), so the merged
file and the compiler's predicted schedule can be opened side by side in
Perfetto (ui.perfetto.dev) or chrome://tracing.

  merge-traces.py trace.json -o merged.json         # trace.rank*.json
  merge-traces.py t.rank0.json t.rank1.json -o merged.json
  merge-traces.py trace.json --step 3 --cat forward,backward,weight_grad

--step N keeps the events of step N only (on each rank, those within its
"step N" slice); --cat keeps the slices of the given
categories (step, data, forward, backward, weight_grad, collective,
collective_async, p2p, op). A file cut short by a crash (no closing "]")
is read up to its last complete event. Exit code 1 on an error.
"""
import argparse
import glob
import json
import os
import re
import sys


def rank_files(path):
    """trace.json -> trace.rank0.json, trace.rank1.json, ... (by rank)."""
    root, ext = os.path.splitext(path)
    if os.path.basename(root) == "":
        root, ext = path, ""
    found = glob.glob(glob.escape(root) + ".rank*" + glob.escape(ext))
    ranked = []
    for f in found:
        m = re.fullmatch(re.escape(root) + r"\.rank(\d+)" + re.escape(ext), f)
        if m:
            ranked.append((int(m.group(1)), f))
    return [f for _, f in sorted(ranked)]


def load(path):
    with open(path, encoding="utf-8") as f:
        text = f.read()
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        # Chrome's array format may lack its closing "]" (a run that was
        # killed): keep the complete lines.
        lines = text.rstrip().splitlines()
        while lines:
            body = "\n".join(lines).rstrip().rstrip(",")
            try:
                data = json.loads(body + "\n]")
                break
            except json.JSONDecodeError:
                lines.pop()
        else:
            raise ValueError(f"{path}: not a Chrome trace")
    if isinstance(data, dict):
        data = data.get("traceEvents", [])
    if not isinstance(data, list):
        raise ValueError(f"{path}: not a Chrome trace")
    return data


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("traces", nargs="+",
                    help="the --trace FILE (its .rankR files are found) or "
                         "the per-rank files")
    ap.add_argument("-o", "--output", default="-",
                    help="merged trace (default: stdout)")
    ap.add_argument("--step", type=int, help="keep only this step")
    ap.add_argument("--cat", help="comma-separated categories to keep")
    args = ap.parse_args()

    files = []
    for t in args.traces:
        if os.path.exists(t) and not rank_files(t):
            files.append(t)
        else:
            found = rank_files(t)
            if not found:
                sys.exit(f"error: no trace files for '{t}' (expected "
                         f"{os.path.splitext(t)[0]}.rank0"
                         f"{os.path.splitext(t)[1]}, ...)")
            files.extend(found)

    events, meta, info = [], [], {}
    for path in files:
        try:
            evs = load(path)
        except (OSError, ValueError) as e:
            sys.exit(f"error: {e}")
        pid = None
        for e in evs:
            if e.get("name") == "planrt_trace" and e.get("ph") == "M":
                pid = e["args"]["rank"]
                info[pid] = e["args"]
        for e in evs:
            if pid is not None:
                e["pid"] = pid
            (meta if e.get("ph") == "M" else events).append(e)

    if args.step is not None:
        # Each rank's own step slice: ranks enter and leave a step at
        # different times.
        name = f"step {args.step}"
        spans = {e["pid"]: (e["ts"], e["ts"] + e.get("dur", 0))
                 for e in events
                 if e.get("ph") == "X" and e.get("name") == name}
        if not spans:
            sys.exit(f"error: no '{name}' slice in the traces")
        events = [e for e in events if e["pid"] in spans and
                  spans[e["pid"]][0] <= e.get("ts", spans[e["pid"]][0])
                  <= spans[e["pid"]][1]]
    if args.cat:
        keep = set(args.cat.split(","))
        events = [e for e in events if e.get("cat") in keep]
    base = min((e["ts"] for e in events if "ts" in e), default=0)
    for e in events:
        if "ts" in e:
            e["ts"] = round(e["ts"] - base, 3)
    out = {
        "displayTimeUnit": "ms",
        "traceEvents": meta + events,
        "otherData": {"ranks": len(info), "epoch_us_of_ts_0": base,
                      "files": files},
    }
    text = json.dumps(out, separators=(",", ":")) + "\n"
    if args.output == "-":
        sys.stdout.write(text)
    else:
        with open(args.output, "w", encoding="utf-8") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
