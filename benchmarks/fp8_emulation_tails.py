"""How far the blockwise FP8 layer's y lands from its float64 emulation, over many seeds: the tail that
tests/test_fp8_experts.py's tolerance (tol_forward) has to cover. Per case: the quantiles of
rel_err(y, emulation), how many seeds exceed the test's tolerance, the worst seed. With --grads also
the gradients of x, gate_up and down against the emulation's (the test's TOL_EMULATION): the worst
of the three per seed.

    python benchmarks/fp8_emulation_tails.py --seeds 300 --grads    # on the GPU machine
    python benchmarks/fp8_emulation_tails.py --seeds 20 --device cpu --cases T53,T150
"""
import argparse
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

import torch  # noqa: E402

import mok  # noqa: E402
import test_fp8_experts as T  # noqa: E402
from shapes import make_moe_inputs, rel_err  # noqa: E402


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, default=200)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--cases", default="", help="comma list of substrings of the case names (default: all)")
    p.add_argument("--grads", action="store_true", help="also the gradients (test tolerance TOL_EMULATION)")
    args = p.parse_args(argv)
    print(f"device {args.device}, torch {torch.__version__}, {args.seeds} seeds per case")
    print("| case | tol | median | p99 | max (seed) | over tol |")
    print("|---|---:|---:|---:|---:|---:|")
    for case in T.CASES:
        wanted = [c for c in args.cases.split(",") if c]
        if case.T == 0 or (wanted and not any(c in str(case) for c in wanted)):
            continue
        errs, grad_errs = [], []
        for seed in range(args.seeds):
            x, idx, w, gu, dn = make_moe_inputs(case, torch.bfloat16, device=args.device, seed=seed,
                                                requires_grad=args.grads)
            with torch.set_grad_enabled(args.grads):
                y = mok.functional.moe_experts(x, idx, w, gu, dn, recipe="blockwise")
            y_ref, leaves = T._emulate(x, idx, w, gu, dn)
            errs.append((rel_err(y, y_ref), seed))
            if args.grads:
                g = torch.randn_like(y)
                got = torch.autograd.grad(y, (x, gu, dn), g)
                x64, _w64, gu64, dn64 = leaves
                ref = torch.autograd.grad(y_ref, (x64, gu64, dn64), g.double().cpu())
                grad_errs.append((max(rel_err(a, b) for a, b in zip(got, ref)), seed))
        rows = [("y", T.tol_forward(case), errs)]
        if grad_errs:
            rows.append(("grads x, gate_up, down", T.TOL_EMULATION, grad_errs))
        for what, tol, found in rows:
            vals = sorted(e for e, _ in found)
            worst = max(found)
            over = sum(e >= tol for e, _ in found)
            print(f"| {case} {what} | {tol:.2e} | {statistics.median(vals):.2e} | "
                  f"{vals[int(0.99 * (len(vals) - 1))]:.2e} | {worst[0]:.2e} ({worst[1]}) | {over} |")


if __name__ == "__main__":
    main()
