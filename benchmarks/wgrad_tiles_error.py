"""How far the FP8 weight gradient lands from exact math with the activation's column-wise copy in
1 x 128 blocks (fp8_wgrad=True) and in 128 x 128 tiles (fp8_wgrad="tiled"), on activations shaped like
real ones: Gaussian, a few outlier channels (the "massive activations" of LLMs, 100x to 10000x the
rest), outlier tokens, and SwiGLU outputs (heavy-tailed). CPU only (the C core is the definition of
the op; the CUDA kernel equals it within fp32 accumulation, tests/test_fp8_gemm.py).

    python benchmarks/wgrad_tiles_error.py                 # markdown table on stdout
    python benchmarks/wgrad_tiles_error.py --rows 4096 --seed 1

d_w = g^T x over R rows of one expert (g [R, M] the incoming gradient, Gaussian; x [R, N] the
activation), both bf16; the FP8 op's result against float64 math on the same bf16 inputs. 'rest'
is the error over the columns that are not outlier channels: with outliers the Frobenius norm is
theirs, while the tiles' coarser scale costs the small channels precision."""
import argparse
import sys

import torch

import mok


def activations(kind, R, N, gen):
    x = torch.randn(R, N, generator=gen)
    outliers = torch.zeros(N, dtype=torch.bool)
    if kind.startswith("channels"):
        factor = float(kind.split("x")[1])
        outliers[torch.randperm(N, generator=gen)[: max(1, N // 128)]] = True  # one per 128-column block
        x[:, outliers] *= factor
    elif kind.startswith("tokens"):
        factor = float(kind.split("x")[1])
        x[torch.rand(R, generator=gen) < 0.01] *= factor
    elif kind == "swiglu":
        gate, up = torch.randn(R, N, generator=gen) * 2, torch.randn(R, N, generator=gen) * 2
        x = torch.nn.functional.silu(gate) * up
    return x.bfloat16(), outliers


def rel(a, b):
    return ((a - b).norm() / b.norm().clamp_min(1e-300)).item()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=2048)
    p.add_argument("--m", type=int, default=256, help="gradient channels (d_w rows)")
    p.add_argument("--n", type=int, default=512, help="activation channels (d_w columns)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    gen = torch.Generator().manual_seed(args.seed)
    R, M, N = args.rows, args.m, args.n
    offsets = torch.tensor([0, R], dtype=torch.int32)
    g = torch.randn(R, M, generator=gen).bfloat16()
    _, g_col = mok.fp8_gemm.quantize_rowcol_for_wgrad(g)
    print(f"# d_w = g^T x, R={R}, M={M}, N={N}, seed {args.seed}; relative Frobenius error against float64\n")
    print("| activation x | 1 x 128, all | 1 x 128, rest | tiles, all | tiles, rest | tiles / 1 x 128 (rest) |")
    print("|---|---:|---:|---:|---:|---:|")
    for kind in ("gaussian", "channels x100", "channels x1000", "channels x10000", "tokens x100", "swiglu"):
        x, outliers = activations(kind, R, N, gen)
        exact = g.double().t() @ x.double()
        errs = []
        for col in ("blockwise_1x128", "blockwise_128x128"):
            _, x_col = mok.fp8_gemm.quantize_rowcol_for_wgrad(x, col)
            d_w = mok.fp8_gemm.grouped_mm_wgrad_blockwise(*g_col, *x_col, offsets)[0].double()
            rest = ~outliers
            errs += [rel(d_w, exact), rel(d_w[:, rest], exact[:, rest])]
        print(f"| {kind} | {errs[0]:.2e} | {errs[1]:.2e} | {errs[2]:.2e} | {errs[3]:.2e} | {errs[3] / errs[1]:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
