"""Quick check of the sm_90a grouped GEMM: TFLOP/s of mok's GEMM1 (gather + SwiGLU) and GEMM2
against torch._grouped_mm and cuBLAS dense on balanced routing. For the development loop; the
full comparison is bench_gemm.py."""
import os
import sys

import torch

import mok
from mok._ops import ops


def bench(fn, iters=20):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        ts.append(a.elapsed_time(b))
    return sorted(ts)[len(ts) // 2]


SHAPES = {"qwen3": (16384, 2048, 768, 128, 8), "mixtral": (8192, 4096, 14336, 8, 2), "dsv3": (8192, 7168, 2048, 32, 8)}


def main(names):
    rows = []
    for name in names:
        T, H, I, E, K = SHAPES[name]
        dev = "cuda"
        x = torch.randn(T, H, device=dev, dtype=torch.bfloat16)
        gate_up = torch.randn(E, 2 * I, H, device=dev, dtype=torch.bfloat16) * 0.02
        down = torch.randn(E, H, I, device=dev, dtype=torch.bfloat16) * 0.02
        idx = torch.rand(T, E, device=dev).argsort(-1)[:, :K]
        plan = mok.functional.moe_plan(idx, E)
        f1 = 2 * T * K * H * 2 * I
        f2 = 2 * T * K * I * H
        g1 = lambda: ops.grouped_mm_swiglu(x, plan.src_of_row, plan.row_of, K, gate_up, plan.offsets)  # noqa
        act = g1()[0]
        g2 = lambda: ops.grouped_mm(act, None, 1, down, plan.offsets, True)  # noqa
        # peer: torch._grouped_mm on rows sorted by expert (no padding)
        counts = torch.bincount(idx.flatten(), minlength=E)
        offs = counts.cumsum(0).to(torch.int32)
        xs = x.repeat_interleave(K, 0)[: T * K].contiguous()
        wt = gate_up.transpose(-2, -1)
        p1 = lambda: torch._grouped_mm(xs, wt, offs=offs)  # noqa
        a2 = torch.randn(T * K, I, device=dev, dtype=torch.bfloat16)
        p2 = lambda: torch._grouped_mm(a2, down.transpose(-2, -1), offs=offs)  # noqa
        d1 = torch.randn(T * K, H, device=dev, dtype=torch.bfloat16)
        w1 = torch.randn(H, 2 * I, device=dev, dtype=torch.bfloat16)
        c1 = lambda: d1 @ w1  # noqa
        for label, fn, fl in (("mok gemm1+swiglu", g1, f1), ("torch._grouped_mm gemm1", p1, f1),
                              ("cublas dense gemm1", c1, f1), ("mok gemm2", g2, f2),
                              ("torch._grouped_mm gemm2", p2, f2)):
            ms = bench(fn)
            rows.append((name, label, ms, fl / ms / 1e9))
        # correctness of the fast path against the SIMT kernel on the same inputs
        os.environ["MOK_DISABLE_SM90"] = "1"
        ref_act, ref_h = g1()
        ref_y = ops.grouped_mm(ref_act, None, 1, down, plan.offsets, True)
        os.environ.pop("MOK_DISABLE_SM90")
        act2, h2 = g1()
        y2 = ops.grouped_mm(act2, None, 1, down, plan.offsets, True)
        err = lambda a, b: float((a.float() - b.float()).norm() / b.float().norm())  # noqa
        print(f"{name}: sm90 vs simt rel err h {err(h2, ref_h):.2e} act {err(act2, ref_act):.2e} y {err(y2, ref_y):.2e}")
    print(f"{'shape':8} {'kernel':26} {'ms':>8} {'TFLOP/s':>8}")
    for r in rows:
        print(f"{r[0]:8} {r[1]:26} {r[2]:8.3f} {r[3]:8.1f}")


if __name__ == "__main__":
    main(sys.argv[1:] or list(SHAPES))
