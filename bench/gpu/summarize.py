#!/usr/bin/env python3
"""The GPU suite's table (bench/gpu/run.sh calls it on the GPU node).

usage: summarize.py DIR LOGS GPU OUT

DIR is what bench/gpu/prepare.sh made (ref/, plans/), LOGS the run's logs.
Prints one markdown table and writes OUT/table.md and OUT/results.json.
Exits 1 unless every correctness row holds. Standard library only.

Correctness rows, against the host target's run of the same plan:
  fp32: every step's loss within 1e-4 relative, every parameter tensor
        within 1e-3 (||gpu - host|| / ||host||);
  bf16, fp16: every step's loss within 2% of the host's fp32 run;
  memory: the peak planc planned for the device (the report's) against the
        peak planrt measured on the GPU (--log-json), both without what the
        libraries hold outside the plan (shown beside GPT-2's peak);
  memcheck, racecheck: compute-sanitizer finds no error in tiny-gpt and in
        two cases of the cp tiles;
  cp tiles: context parallelism's attention tiles against the host
        functors on every case of test/runtime/cuda/cp_attention_cases.h
        (fp32 within 1e-5; the 16-bit tensor-core tiles within 5e-3 bf16,
        1e-3 fp16).
Speed rows: GPT-2 124M (B 16, T 1024), the median of the steps after the
first two (tokens/s, step time, MFU against the card's dense peak for the
plan's precision), next to PyTorch on the same GPU in the same run and the
cost model's prediction for the same plan on that GPU."""
import json
import math
import os
import re
import statistics
import sys

HERE, LOGS, GPU, OUT = sys.argv[1:5]
sys.path.insert(0, HERE)
from compare_runs import read_losses, read_safetensors  # noqa: E402

# The SXM parts (docs/cost-model.md) have a cost-model entry; other
# variants (PCIe, NVL) have other peaks and none: no MFU.
def gpu_kind(name):
    if "H200" in name:
        return "h200"
    if "H100" in name and not any(v in name for v in ("PCIe", "NVL")):
        return "h100"
    if "A100-SXM" in name or "A100 SXM" in name:
        return "a100"
    return None


# Dense peaks, TFLOP/s: bf16, fp32 (no tensor cores), tf32 (as planc's
# TimeModel.cpp has them).
PEAKS = {"h200": (989.0, 67.0, 494.7), "h100": (989.0, 67.0, 494.7),
         "a100": (312.0, 19.5, 156.0)}
PEAK_INDEX = {"bf16": 0, "fp32": 1, "tf32": 2}
kind = gpu_kind(GPU)
rows, results, ok = [], {"gpu": GPU}, True


def rc(name):
    try:
        return int(open(os.path.join(LOGS, name + ".rc")).read())
    except (OSError, ValueError):
        return None


def last_error(name):
    try:
        lines = open(os.path.join(LOGS, name + ".log"),
                     errors="replace").read().splitlines()
    except OSError:
        return "no log"
    for line in reversed(lines):
        if "error" in line.lower() or "fault" in line.lower():
            return line.strip()[:160]
    return (lines[-1].strip()[:160] if lines else "no output")


def failure(name):
    """Why run `name` failed, with what its CUDA_LAUNCH_BLOCKING=1 rerun
    (run.sh's program) says where there was one."""
    text = f"exit {rc(name)}: {last_error(name)}"
    if rc(name + "-blocking") is not None:
        text += f"; blocking rerun: {last_error(name + '-blocking')}"
    return text


def json_lines(path):
    try:
        return [json.loads(l) for l in open(path) if l.strip()]
    except (OSError, ValueError):
        return []


def row(check, run, value, target, passed):
    global ok
    ok = ok and passed
    rows.append((check, run, value, target, "yes" if passed else "**NO**"))
    results.setdefault("rows", []).append(
        {"check": check, "run": run, "value": value, "target": target,
         "pass": passed})


def loss_errors(ref_log, log):
    a, b = read_losses(ref_log), read_losses(log)
    if set(a) != set(b):
        return None
    return max(abs(a[s] - b[s]) / max(abs(a[s]), 1e-30) for s in a)


def param_error(ref, mine):
    a, b = read_safetensors(ref), read_safetensors(mine)
    worst = 0.0
    for name, (shape, x) in a.items():
        if name not in b or b[name][0] != shape:
            return math.inf
        y = b[name][1]
        num = math.sqrt(sum((p - q) ** 2 for p, q in zip(x, y)))
        den = math.sqrt(sum(p * p for p in x)) or 1.0
        worst = max(worst, num / den if num == num else math.inf)
    return worst


def parity(name, ref_name, loss_tol, param_tol):
    log = os.path.join(LOGS, name + ".log")
    ref_log = os.path.join(HERE, "ref", ref_name + ".log")
    if rc(name) != 0:
        row(f"{name} runs", "GPU", failure(name), "exit 0", False)
        return
    try:
        err = loss_errors(ref_log, log)
    except SystemExit as e:
        row(f"{name} losses", "GPU vs host", str(e), "", False)
        return
    if err is None:
        row(f"{name} losses", "GPU vs host", "steps differ", "", False)
        return
    row(f"{name} loss per step", f"GPU vs host {ref_name}", f"{err:.2e}",
        f"<= {loss_tol:g}", err <= loss_tol)
    if param_tol is not None:
        perr = param_error(os.path.join(HERE, "ref", ref_name + ".safetensors"),
                           os.path.join(LOGS, name + ".safetensors"))
        row(f"{name} parameters", f"GPU vs host {ref_name}", f"{perr:.2e}",
            f"<= {param_tol:g}", perr <= param_tol)


def memory(name):
    """The report's planned peak against the measured device peak."""
    if rc(name) != 0:
        return
    report = json.load(open(os.path.join(HERE, "plans",
                                         name + ".report.json")))
    summary = next((r for r in json_lines(os.path.join(LOGS, name + ".json"))
                    if r.get("type") == "summary"), None)
    if not summary:
        row(f"{name} memory", "planned vs measured", "no summary", "", False)
        return
    planned = report["memory_per_rank"]["peak"]
    measured = summary["memory"]["max_over_ranks"]["device_peak_bytes"]
    row(f"{name} memory", "planned vs measured",
        f"{planned} vs {measured} B", "equal", planned == measured)


def guarded(f, name, *args):
    """A row whose inputs are missing or malformed fails, naming why,
    instead of ending the table."""
    try:
        f(name, *args)
    except (OSError, ValueError, KeyError, SystemExit) as e:
        row(f"{name}", "GPU vs host", f"could not compare: {e}", "", False)


for p in ("tiny-gpt", "tiny-gpt-long", "tiny-gpt-mb", "tiny-gpt-drop",
          "tiny-llama", "tiny-mixtral"):
    guarded(parity, f"{p}-fp32", f"{p}-fp32", 1e-4, 1e-3)
guarded(parity, "resnet-small-fp32", "resnet-small-fp32", 1e-4, 1e-3)
# tiny-gpt fp32 without cuBLASLt's epilogues (PLANRT_GEMM_EPILOGUES=off).
guarded(parity, "tiny-gpt-fp32-noepi", "tiny-gpt-fp32", 1e-4, 1e-3)
for p in ("tiny-gpt-bf16", "tiny-gpt-fp16", "tiny-gpt-odd-bf16",
          "tiny-gpt-mb-bf16", "tiny-gpt-drop-bf16", "tiny-llama-bf16"):
    guarded(parity, p, p.rsplit("-", 1)[0] + "-fp32", 0.02, None)
# The same bf16 plan with attention on cuDNN and on planrt's tiles.
for p in ("tiny-gpt-long-bf16", "tiny-gpt-long-bf16-tiles"):
    guarded(parity, p, "tiny-gpt-long-fp32", 0.02, None)
for p in ("tiny-gpt-fp32", "tiny-gpt-long-fp32", "tiny-gpt-long-bf16",
          "tiny-gpt-bf16",
          "tiny-gpt-odd-bf16", "tiny-gpt-mb-fp32", "tiny-gpt-mb-bf16",
          "tiny-gpt-drop-fp32", "tiny-gpt-drop-bf16", "tiny-llama-fp32",
          "tiny-mixtral-fp32",
          "resnet-small-fp32"):
    guarded(memory, p)
def cp_tiles(name, kind, what, tolerance):
    """Context parallelism's attention on the GPU against the host
    functors: the tiles, or all_gather's whole attention on cuDNN."""
    m = re.search(r"cp " + kind + r": (\d+) cases, worst relative error (\S+)",
                  open(os.path.join(LOGS, name + ".log"),
                       errors="replace").read())
    value = (f"{m.group(2)} of the tolerance, worst of {m.group(1)} cases"
             if m else f"exit {rc(name)}: {last_error(name)}")
    row(what, "GPU vs host functors", value, tolerance,
        rc(name) == 0 and m is not None)


guarded(cp_tiles, "cp-tiles", "tiles", "cp attention tiles (all_gather, ring)",
        "<= 1 (fp32 1e-5; bf16 5e-3, fp16 1e-3)")
guarded(cp_tiles, "cp-cudnn", "cudnn", "cp all_gather and ring attention on cuDNN",
        "<= 1 (bf16 2e-2, fp16 3e-3)")
for tool, run in (("memcheck", "tiny-gpt fp32, 2 steps"),
                  ("racecheck", "tiny-gpt fp32, 1 step"),
                  ("cp-tiles-memcheck", "cp tiles, cases 5, 10, 11"),
                  ("cp-tiles-racecheck", "cp tiles, cases 5, 10, 11")):
    m = rc(tool)
    name = tool.replace("cp-tiles-", "")
    row(f"compute-sanitizer {name}", run,
        "clean" if m == 0 else f"exit {m}: {last_error(tool)}", "clean",
        m == 0)

def library_line(name, prefix):
    """What the run's line starting with `prefix` says ("attention: ":
    which attention ran; "gemm epilogues: ": which epilogues cuBLASLt ran)."""
    try:
        for line in open(os.path.join(LOGS, name + ".log"), errors="replace"):
            if line.startswith(prefix):
                return line[len(prefix):].strip()
    except OSError:
        pass
    return ""


# Speed.
speed, notes = [], []
for prec in ("bf16", "tf32", "fp32"):
    name = f"gpt2-{prec}"
    if rc(name) != 0:
        speed.append((f"planc {prec}", failure(name), "", "", "", ""))
        ok = False  # a speed run that fails is a failure of the suite
        continue
    recs = json_lines(os.path.join(LOGS, name + ".json"))
    steps = [r for r in recs if r.get("type") == "step"][2:]
    summary = next((r for r in recs if r.get("type") == "summary"), {})
    if not steps:
        speed.append((f"planc {prec}", "no steps", "", "", "", ""))
        continue
    ms = statistics.median(r["step_time_s"] for r in steps) * 1e3
    tok = statistics.median(r["tokens_per_s"] for r in steps)
    flops = summary.get("step_flops_per_rank") or 0
    peak = PEAKS.get(kind, (0, 0, 0))[PEAK_INDEX[prec]] * 1e12
    mfu = flops / (ms / 1e3) / peak if flops and peak else float("nan")
    mem = summary.get("memory", {}).get("max_over_ranks", {}).get(
        "device_peak_bytes", 0)
    lib = summary.get("memory", {}).get("max_over_ranks", {}).get(
        "library_bytes", 0)
    attention = library_line(name, "attention: ")
    epilogues = library_line(name, "gemm epilogues: ")
    for label, text in (("attention", attention), ("gemm epilogues", epilogues)):
        if text:
            notes.append(f"- {name}: {label}: {text}")
    try:
        rep = json.load(open(os.path.join(
            HERE, "plans", f"{name}.{kind}.report.json")))
        pred = f"{rep['step_time_s'] * 1e3:.1f} ms, {rep['memory_per_rank']['peak'] / 1e9:.2f} GB"
        outside = rep["memory_per_rank"].get("outside_plan", 0)
        if outside:
            pred += f" (+ at most {outside / 1e9:.2f} GB libraries)"
    except (OSError, ValueError, KeyError):
        pred = f"no report for this GPU ({kind or 'unknown kind'})"
    speed.append((f"planc {prec}", f"{ms:.1f} ms", f"{tok:.0f}",
                  f"{100 * mfu:.1f}%" if mfu == mfu else "n/a",
                  f"{mem / 1e9:.2f} GB" +
                  (f" (+{lib / 1e9:.2f} GB libraries)" if lib else ""),
                  pred))
    results[name] = {"ms": ms, "tokens_per_s": tok, "mfu": mfu,
                     "peak_bytes": mem, "library_bytes": lib,
                     "attention": attention, "epilogues": epilogues,
                     "predicted": pred}
for name, label in (("torch-bf16-eager", "PyTorch eager bf16 autocast"),
                    ("torch-tf32-eager", "PyTorch eager fp32 (TF32)"),
                    ("torch-bf16-compile", "PyTorch compile bf16 autocast")):
    text = ""
    try:
        text = open(os.path.join(LOGS, name + ".log")).read()
    except OSError:
        pass
    m = re.search(r"median ([\d.]+) ms, (\d+) tok/s(?:, peak ([\d.]+) GB)?",
                  text)
    if rc(name) != 0 or not m:
        speed.append((label, f"exit {rc(name)}: {last_error(name)}", "", "",
                      "", ""))
        continue
    ms, tok = float(m.group(1)), int(m.group(2))
    speed.append((label, f"{ms:.1f} ms", f"{tok}", "", f"{m.group(3)} GB",
                  ""))
    results[name] = {"ms": ms, "tokens_per_s": tok}

lines = [f"GPU: {GPU}", "",
         "| check | run | value | target | holds |", "|---|---|---|---|---|"]
lines += ["| " + " | ".join(r) + " |" for r in rows]
peaks = (f"bf16 {PEAKS[kind][0]:g}, fp32 {PEAKS[kind][1]:g}, tf32 "
         f"{PEAKS[kind][2]:g} TFLOP/s of "
         f"the {kind}" if kind in PEAKS else
         "none known for this GPU: no MFU")
lines += ["", "GPT-2 124M, B 16, T 1024, one GPU; medians of the steps after "
          "the first two. MFU: model FLOPs against the dense peak of the "
          f"run's precision ({peaks}).", "",
          "| run | step | tokens/s | MFU | peak memory | planc --report "
          "predicts |", "|---|---|---|---|---|---|"]
lines += ["| " + " | ".join(r) + " |" for r in speed]
cp_speed = library_line("cp-speed", "cp speed ")
if cp_speed:
    notes.append(f"- cp all_gather attention {cp_speed} (planc's cost "
                 "model: the tiles 8 to 11 times cuDNN's time)")
if notes:
    lines += [""] + notes
table = "\n".join(lines)
print(table)
with open(os.path.join(OUT, "table.md"), "w") as f:
    f.write(table + "\n")
results["pass"] = ok
with open(os.path.join(OUT, "results.json"), "w") as f:
    json.dump(results, f, indent=1)
sys.exit(0 if ok else 1)
