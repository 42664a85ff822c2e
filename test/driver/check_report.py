"""Checks planc --report=json output against published formulas.

  check_report.py flops REPORT.json B s l h V RECOMPUTE [TOL]
      Narayanan et al. 2021 (SC'21, appendix): a GPT step's matmul FLOPs are
      72 B s l h^2 (1 + s/(6h) + V/(12 l h)) without recompute and
      96 B s l h^2 (1 + s/(6h) + V/(16 l h)) with full recompute.
      flops_by_kind.matmul + .attention must equal the executed formula
      exactly (to rounding), where our full recompute skips the layer's last
      matmul (the MLP's output projection: its output only feeds the residual
      add that ends the layer, and its gradient needs only its input and dY),
      so 8 B s l h^2 less than 96. With TOL, flops_per_step and
      model_flops_per_step (the 72 formula) must also be within TOL
      (relative): the layers' other ops (norms, biases, activations, residual
      adds, embedding, loss, optimizer) at one FLOP per element written.
  check_report.py table1 PAPER_TFLOPS REPORT.json [TOL]
      tflops_per_gpu within TOL (default 0.10) of the paper's; prints the row.
  check_report.py steptime PAPER_SECONDS REPORT.json [TOL]
      step_time_s within TOL (default 0.10) of a published iteration time.
  check_report.py faster BEST.json INPUT.json [--or-equal]
      The plan --autoplan wrote (BEST) fits and is predicted strictly faster
      than the input's (a planner that returns its input fails); --or-equal
      accepts equal times, for an input known to be the best already. An
      input that does not fit competes with nothing: the best must fit, at
      any time. Prints both step times (and the input's memory when it does
      not fit).
"""
import json
import sys


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def close(a, b, tol):
    return abs(a - b) <= tol * abs(b)


def flops(argv):
    report = json.load(open(argv[0]))
    B, s, l, h, V = (float(x) for x in argv[1:6])
    recompute = argv[6]
    tol = float(argv[7]) if len(argv) > 7 else None
    f72 = 72 * B * s * l * h * h * (1 + s / (6 * h) + V / (12 * l * h))
    f96 = 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))
    ours = f96 - 8 * B * s * l * h * h if recompute == "full" else f72
    k = report["flops_by_kind"]
    gemm = k["matmul"] + k["attention"]
    if not close(gemm, ours, 1e-12):
        fail(f"matmul + attention FLOPs {gemm:.17g} != {ours:.17g}")
    print(f"matmul + attention = formula: {gemm:.6g}")
    if tol is not None:
        want = f96 if recompute == "full" else f72
        for key, ref in (("flops_per_step", ours), ("model_flops_per_step", f72)):
            got = report[key]
            if not close(got, ref, tol):
                fail(f"{key} {got:.6g} vs {ref:.6g}: off by "
                     f"{abs(got - ref) / ref:.3g} > {tol}")
            print(f"{key} within {tol} of the formula "
                  f"({(got - ref) / ref:+.2e})")
        print(f"executed / Narayanan's {'96' if recompute == 'full' else '72'}"
              f" formula: {report['flops_per_step'] / want:.4f}")


def published(argv, key, fmt, unit):
    """The report's `key` within TOL (default 0.10) of a published value."""
    paper = float(argv[0])
    report = json.load(open(argv[1]))
    tol = float(argv[2]) if len(argv) > 2 else 0.10
    ours = report[key]
    print(f"paper {paper:{fmt}} ours {ours:{fmt}} {unit} ({ours / paper:.3f})")
    if not close(ours, paper, tol):
        fail(f"{ours:{fmt}} {unit.split()[0]} is not within {tol:.0%} of "
             f"{paper}{' s' if unit.startswith('s') else ''}")


def table1(argv):
    published(argv, "tflops_per_gpu", ".1f", "TFLOP/s per GPU")


def steptime(argv):
    published(argv, "step_time_s", ".2f", "s per step")


def faster(argv):
    """BEST.json INPUT.json [--or-equal] [--input-fits]: the best plan fits
    and is strictly faster, so that a planner returning its input fails;
    --or-equal only where the input is known to be the best plan already;
    --input-fits: the input must fit too (else a best plan that fits is
    enough)."""
    best, given = (json.load(open(p)) for p in argv[:2])
    or_equal = "--or-equal" in argv[2:]
    print(f"best {best['step_time_s']:.3f} s, input {given['step_time_s']:.3f} s,"
          f" {given['step_time_s'] / best['step_time_s']:.2f}x")
    if not best["fits"]:
        fail("the best plan does not fit")
    if not given["fits"] and "--input-fits" in argv[2:]:
        fail("the input does not fit (%.1f GB per rank)"
             % (given["memory_per_rank"]["peak"] / 1e9))
    if not given["fits"]:
        peak = given["memory_per_rank"]["peak"] / 1e9
        print(f"the input does not fit ({peak:.1f} GB per rank); the best "
              "plan fits")
        return
    if best["step_time_s"] > given["step_time_s"]:
        fail("the best plan is slower than the input's")
    if best["step_time_s"] == given["step_time_s"] and not or_equal:
        fail("the best plan is no faster than the input's")


if __name__ == "__main__":
    {"flops": flops, "table1": table1, "steptime": steptime,
     "faster": faster}[sys.argv[1]](
        sys.argv[2:])
