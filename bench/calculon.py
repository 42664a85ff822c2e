"""planc --report next to Calculon (calculon-ai/calculon) on the same plans.

  bench/calculon.py CALCULON_DIR PLANC PLAN...

For each plan: translates it into Calculon's application and execution JSON
(read from the plan's constants and sections, see translate()), runs
Calculon's single-configuration `llm` command with its systems/a100_80g.json
(or systems/h100_80g_nvl8.json for h100 plans), runs `planc --report=json`,
and prints step time, TFLOP/s per GPU, peak memory per GPU and the pipeline
bubble from both. Calculon is run from its checkout (it needs numpy and
pandas); nothing of it is copied here.
"""
import json
import os
import re
import subprocess
import sys
import tempfile


def constants(text):
    """Top-level `name = number` lines and `key = value` lines of sections."""
    out = {}
    for m in re.finditer(r"^\s*([a-z_]+)\s*=\s*([^\s/]+)", text, re.M):
        out.setdefault(m.group(1), m.group(2))
    return out


def translate(plan_path):
    text = open(plan_path).read()
    c = constants(text)
    num = lambda k, d=None: int(c[k]) if k in c else d
    tp, pp, dp = num("tp", 1), num("pp", 1), num("dp", 1)
    gpn = num("gpus_per_node", 8)
    order = re.search(r"order\s*=\s*\[([^\]]*)\]", text)
    order = [a.strip() for a in order.group(1).split(",")] if order else ["pp", "dp", "tp"]
    sizes = {"tp": tp, "pp": pp, "dp": dp}

    def net(axis):
        # 0 (NVLink) when the axis's group stays within a node: the product
        # of its size and the sizes of the axes inside it fits a node.
        inner = 1
        for a in reversed(order):
            inner *= sizes[a]
            if a == axis:
                break
        return 0 if inner <= gpn else 1

    d, heads = num("d"), num("heads")
    app = {"hidden": d, "feedforward": 4 * d, "seq_size": num("seq"),
           "attn_heads": heads, "attn_size": d // heads,
           "num_blocks": num("layers")}
    precision = c.get("precision", "fp32")
    recompute = {"full": "full", "selective": "attn_only"}.get(
        c.get("recompute", "none"), "none")
    exe = {
        "num_procs": tp * pp * dp, "tensor_par": tp, "pipeline_par": pp,
        "data_par": dp, "tensor_par_net": net("tp"),
        "pipeline_par_net": net("pp"), "data_par_net": net("dp"),
        "batch_size": num("batch"), "microbatch_size": num("micro_batch", 1),
        "datatype": {"fp16": "float16", "bf16": "bfloat16"}.get(precision, "float32"),
        # Our kernels are not fused; our GPT uses multi-head attention.
        "fused_activation": False, "attention_type": "multihead",
        "activation_recompute": recompute,
        "pipeline_interleaving": num("virtual_stages", 1),
        "optimizer_sharding": num("zero", 0) >= 1,
        "tensor_par_comm_type":
            "rs_ag" if c.get("sequence_parallel") == "true" else "ar",
        "tensor_par_overlap": "none", "seq_par_ag_redo": False,
        # With microbatches our dp all-reduce is after the step (no overlap).
        "data_par_overlap": False, "weight_offload": False,
        "activations_offload": False, "optimizer_offload": False,
        "training": True,
    }
    system = "h100_80g_nvl8.json" if c.get("gpu") == "h100" else "a100_80g.json"
    return app, exe, system


def main(calculon, planc, plans):
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for plan in plans:
            app, exe, system = translate(plan)
            a, e, s = (os.path.join(tmp, n) for n in ("app.json", "exe.json", "stats.json"))
            json.dump(app, open(a, "w"))
            json.dump(exe, open(e, "w"))
            env = dict(os.environ, PYTHONPATH=calculon)
            run = subprocess.run(
                [sys.executable, os.path.join(calculon, "bin", "calculon"), "llm",
                 a, e, os.path.join(calculon, "systems", system), s],
                capture_output=True, text=True, env=env)
            cal = json.load(open(s)) if run.returncode == 0 and os.path.exists(s) else None
            ours = json.loads(subprocess.run([planc, plan, "--report=json"],
                                             capture_output=True, text=True,
                                             check=True).stdout)
            n = ours["ranks"]
            row = [os.path.basename(plan), ours["step_time_s"],
                   ours["tflops_per_gpu"],
                   ours["memory_per_rank"]["peak"] / 2**30,
                   ours["time_breakdown_s"]["pipeline_wait"]]
            if cal:
                t = cal["total_time"]
                row += [t, ours["flops_per_step"] / n / t / 1e12,
                        cal["proc_mem_tier1_cap_req"] / 2**30, cal["bubble_time"]]
            else:
                row += [(run.stdout + run.stderr).strip().splitlines()[-1:] or ["failed"]]
            rows.append(row)
            if os.path.exists(s):
                os.remove(s)
    print("| plan | planc step s | planc TFLOP/s/GPU | planc GiB | planc pipeline wait s "
          "| Calculon step s | Calculon TFLOP/s/GPU | Calculon GiB | Calculon bubble s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        cells = [r[0]] + [f"{x:.2f}" if isinstance(x, float) else str(x) for x in r[1:]]
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
