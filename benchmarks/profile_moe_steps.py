"""Where the time of mok's expert MLP goes: each kernel of the forward and backward chain timed on
its own (same inputs, L2 flushed), next to its floor (FLOPs at the cuBLAS rate, or bytes at the copy
rate). The sum should match bench_moe_layer.py's fwd+bwd; the largest gap to the floor is the next
kernel to fuse or speed up.

    python benchmarks/profile_moe_steps.py --shape qwen3_30b_a3b      # on the GPU
    python benchmarks/profile_moe_steps.py --quick                    # CPU smoke test

The chain is the one mok.functional.moe_experts runs in training (docs/kernels.md): plan, gather of
x, GEMM1 (+SwiGLU), GEMM2, combine; backward: gather of dy, dgrad GEMM2, the scaled SwiGLU backward
(with the router-weight gradient), wgrad GEMM2, dgrad GEMM1, combine of dx, wgrad GEMM1."""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

import mok  # noqa: E402
from mok._ops import ops  # noqa: E402

SHAPES = {
    "qwen3_30b_a3b": (16384, 2048, 768, 128, 8),
    "mixtral_8x7b": (8192, 4096, 14336, 8, 2),
    "dsv3_ep8_slice": (8192, 7168, 2048, 32, 8),
    "olmoe": (16384, 2048, 1024, 64, 8),
    "gpt_oss_20b_like": (8192, 2880, 2880, 32, 4),
    "quick": (64, 64, 32, 4, 2),
}

# Ceilings measured on the H200 (DESIGN.md): cuBLAS bf16 dense and the device copy (read + write).
GEMM_TFLOPS = 775.0
COPY_TBPS = 4.18


def steps(T, H, I, E, K, device):
    bf = dict(device=device, dtype=torch.bfloat16)
    x = torch.randn(T, H, **bf)
    gate_up = torch.randn(E, 2 * I, H, **bf) * H**-0.5
    down = torch.randn(E, H, I, **bf) * I**-0.5
    idx = torch.rand(T, E, device=device).argsort(-1)[:, :K]
    w = torch.rand(T, K, device=device)
    dy = torch.randn(T, H, **bf)
    plan = mok.functional.moe_plan(idx, E)
    R = plan.src_of_row.shape[0]
    P = T * K  # real rows
    # the chain of mok.functional.moe_experts in training (mok/_down_combine.py for the backward)
    x_rows = ops.gather_rows(x, plan.src_of_row, None, K, plan.row_of)
    act, h = ops.grouped_mm_swiglu(x, plan.src_of_row, plan.row_of, K, gate_up, plan.offsets, x_rows)
    rows = ops.grouped_mm(act, None, 1, down, plan.offsets, True)
    d_rows = ops.gather_rows(dy, plan.src_of_row, None, K, plan.row_of)
    d_z = ops.grouped_mm(d_rows, None, 1, down, plan.offsets, False)
    d_h, z, _ = ops.swiglu_scaled_backward(h, d_z, plan.src_of_row, w)
    d_xr = ops.grouped_mm(d_h, None, 1, gate_up, plan.offsets, False)
    b2 = 2  # bytes per bf16
    gemm = lambda n, k: ("flops", 2.0 * P * n * k)  # noqa: E731
    return [
        # name, callable, floor kind, floor amount
        ("plan", lambda: mok.functional.moe_plan(idx, E), "bytes", 3 * P * 4 + R * 4),
        ("fwd gather x_rows", lambda: ops.gather_rows(x, plan.src_of_row, None, K, plan.row_of), "bytes",
         (P + T) * H * b2),
        ("fwd GEMM1 + SwiGLU", lambda: ops.grouped_mm_swiglu(x, plan.src_of_row, plan.row_of, K, gate_up,
                                                              plan.offsets, x_rows), *gemm(2 * I, H)),
        ("fwd GEMM2", lambda: ops.grouped_mm(act, None, 1, down, plan.offsets, True), *gemm(H, I)),
        ("fwd combine", lambda: ops.combine(rows, plan.row_of, plan.src_of_row, w), "bytes", (P + T) * H * b2),
        ("bwd gather dy", lambda: ops.gather_rows(dy, plan.src_of_row, None, K, plan.row_of), "bytes",
         (P + T) * H * b2),
        ("bwd dgrad GEMM2", lambda: ops.grouped_mm(d_rows, None, 1, down, plan.offsets, False), *gemm(I, H)),
        ("bwd scaled SwiGLU backward (+ d topk_w)", lambda: ops.swiglu_scaled_backward(h, d_z, plan.src_of_row, w),
         "bytes", P * (2 * I + I + 2 * I + I) * b2),
        ("bwd wgrad GEMM2", lambda: ops.grouped_mm_wgrad(d_rows, z, None, 1, plan.offsets), *gemm(I, H)),
        ("bwd dgrad GEMM1", lambda: ops.grouped_mm(d_h, None, 1, gate_up, plan.offsets, False), *gemm(H, 2 * I)),
        ("bwd combine dx", lambda: ops.combine(d_xr, plan.row_of, plan.src_of_row, None), "bytes", (P + T) * H * b2),
        ("bwd wgrad GEMM1", lambda: ops.grouped_mm_wgrad(d_h, x_rows, None, 1, plan.offsets), *gemm(2 * I, H)),
    ]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", default="qwen3_30b_a3b", choices=sorted(SHAPES))
    p.add_argument("--quick", action="store_true", help="tiny shape (CPU smoke test)")
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--device", default=None)
    args = p.parse_args(argv)
    device = common.pick_device(args.device)
    shape = "quick" if args.quick else args.shape
    T, H, I, E, K = SHAPES[shape]
    common.print_environment(common.environment(device))
    rows, total = [], 0.0
    with torch.no_grad():
        for name, fn, kind, amount in steps(T, H, I, E, K, device):
            ms = common.bench(lambda _i: fn(), device, iters=args.iters, warmup=2, flush_l2=True)["median_ms"]
            floor = amount / (GEMM_TFLOPS * 1e9) if kind == "flops" else amount / (COPY_TBPS * 1e9)
            total += ms
            rows.append(dict(step=name, ms=ms, floor_ms=floor, x_floor=ms / floor if floor > 0 else float("nan")))
    rows.append(dict(step="total", ms=total, floor_ms=sum(r["floor_ms"] for r in rows), x_floor=float("nan")))
    cols = [("step", "step", ""), ("ms", "ms", ".3f"), ("floor_ms", "floor ms", ".4f"), ("x_floor", "x floor", ".1f")]
    print(f"\n{shape}: T={T} H={H} I={I} E={E} K={K}, bf16, one kernel (or op) per row")
    print(common.format_table(rows, cols))


if __name__ == "__main__":
    main()
