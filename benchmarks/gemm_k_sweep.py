"""Per-tile overhead of mok's sm_90a grouped GEMM, measured: the same row space and N at several
contraction lengths K, timed against cuBLAS dense at equal FLOPs. Each CTA's time per tile is
a + b * K; the fitted intercept a is what a tile costs besides its K-blocks (epilogue, tile setup,
pipeline refill), the thing a ping-pong or overlapped epilogue would hide.

    python benchmarks/gemm_k_sweep.py                    # on the GPU: R = 131072 rows, E = 128, N = 2048
    python benchmarks/gemm_k_sweep.py --rows 16384 --experts 8 --n 4096
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from benchmarks import common  # noqa: E402
from mok._ops import ops  # noqa: E402

BM, BN = 128, 256  # the kernel's tile (csrc/cuda/gemm/grouped_gemm_sm90.cuh)


def cublas_kernels(fn):
    """Names of the GPU kernels fn launches (which tile shape and schedule cuBLAS picked)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sorted({e.key for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA})


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=131072, help="rows of the row space (a multiple of 128 per expert)")
    p.add_argument("--experts", type=int, default=128)
    p.add_argument("--n", type=int, default=2048)
    p.add_argument("--ks", default="256,512,768,1024,2048,4096")
    p.add_argument("--iters", type=int, default=20)
    args = p.parse_args(argv)
    dev = common.pick_device()
    if dev.type != "cuda":
        raise SystemExit("gemm_k_sweep.py times the sm_90a kernel: it needs a CUDA device")
    common.print_environment(common.environment(dev))
    R, E, N = args.rows, args.experts, args.n
    per = R // E // BM * BM
    offsets = torch.arange(E + 1, device=dev, dtype=torch.int32) * per
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    tiles = (R // BM) * ((N + BN - 1) // BN)
    rows, fit = [], []
    for k in (int(v) for v in args.ks.split(",")):
        a = torch.randn(R, k, device=dev, dtype=torch.bfloat16)
        b = torch.randn(E, N, k, device=dev, dtype=torch.bfloat16) * k**-0.5
        w = torch.randn(N, k, device=dev, dtype=torch.bfloat16)
        flops = 2.0 * (per * E) * N * k
        t_mok = common.bench(lambda _i: ops.grouped_mm(a, None, 1, b, offsets, True), dev, iters=args.iters,
                             warmup=3, flush_l2=True)["median_ms"]
        t_cub = common.bench(lambda _i: a[: per * E] @ w.t(), dev, iters=args.iters, warmup=3,
                             flush_l2=True)["median_ms"]
        if k == int(args.ks.split(",")[0]) or k == int(args.ks.split(",")[-1]):
            print(f"K={k}: cuBLAS runs {cublas_kernels(lambda: a[: per * E] @ w.t())}")
        us_tile = t_mok * 1e3 * sms / tiles
        fit.append((k, us_tile))
        rows.append(dict(K=k, mok_ms=t_mok, mok_tflops=flops / t_mok / 1e9, cublas_ms=t_cub,
                         cublas_tflops=flops / t_cub / 1e9, ratio=t_cub / t_mok, us_per_tile=us_tile))
        a = b = w = None  # (not del: pyflakes reads the lambdas above as using deleted names)
    n = len(fit)
    mk = sum(k for k, _ in fit) / n
    mt = sum(t for _, t in fit) / n
    slope = sum((k - mk) * (t - mt) for k, t in fit) / max(sum((k - mk) ** 2 for k, _ in fit), 1e-9)
    icpt = mt - slope * mk
    print(f"R={R} E={E} N={N}, {tiles} tiles of {BM}x{BN} on {sms} SMs; L2 flushed between calls")
    print(common.format_table(rows, [("K", "K", ""), ("mok_ms", "mok ms", ".3f"), ("mok_tflops", "mok TFLOP/s", ".0f"),
                                     ("cublas_ms", "cuBLAS ms", ".3f"), ("cublas_tflops", "cuBLAS TFLOP/s", ".0f"),
                                     ("ratio", "mok/cuBLAS", ".2f"), ("us_per_tile", "us per tile", ".2f")]))
    print(f"fit: us per tile = {icpt:.2f} + {slope * 64:.3f} per K-block of 64 "
          f"(the K-blocks alone would run at {2 * BM * BN * 64 * sms / (slope * 64) / 1e6:.0f} TFLOP/s)")


if __name__ == "__main__":
    main()
