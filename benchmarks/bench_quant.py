"""FP8 quantisers against the device copy ceiling: mok.fp8.quantize for each recipe,
mok.fp8.quantize_rowcol (row-wise + column-wise copies from one read of x; on CUDA also each of its
kernels forced, MOK_QUANT_ROWCOL_STRIP=0 (one CTA per tile), 4 or 8 (strips), outputs checked bitwise
against the default's) and,
for comparison, the
same two copies made unfused (quantize(x) + quantize(x.t().contiguous())), mok.fp8.qdq_mxfp8 (the
MXFP8 recipe's bf16 rounding: row-wise, and row- and column-wise from one read), and a plain copy of
the same tensor (x.clone()), in one run on the same input, as TB/s of bytes read + written.

    python benchmarks/bench_quant.py                 # on the GPU
    python benchmarks/bench_quant.py --quick         # CPU smoke test

Bytes counted: the bf16 input once, the E4M3 codes and the scales once (the copy: the input read
and written once; rowcol: the input once, both code copies and both scale tensors; the unfused
rows count the same bytes as rowcol, so their TB/s is directly the speed-up's inverse). "vs copy"
is TB/s against the copy's TB/s. The L2 is flushed between timed calls."""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

import mok  # noqa: E402
from benchmarks import common  # noqa: E402

# name -> [M, N]: activations of the DeepSeek-V3 slice (T*K rows of H = 7168) and a weight.
SHAPES = {"act_dsv3": (65536, 7168), "act_qwen3": (131072, 2048), "weight_mixtral": (28672, 4096)}
QUICK_SHAPES = {"tiny": (256, 384)}
# name -> (T, top_k, E): the activation shapes as the layer makes them, gathered from x [T, N] through a plan
# (the FP8 layer's x_rows and d_rows passes: quantize_fp8_rowcol_gather)
GATHERS = {"act_dsv3": (8192, 8, 32), "act_qwen3": (16384, 8, 128), "tiny": (64, 2, 4)}
GATHER_BANDS = ("0", "1", "2", "4", "8")
COLUMNS = [("shape", "shape", ""), ("impl", "impl", ""), ("M", "M", ""), ("N", "N", ""), ("ms", "ms", ".3f"),
           ("tbps", "TB/s", ".2f"), ("vs_copy", "vs copy", ".2f")]


def gathered_rows(name, N, gather, dev, args, copy_tbps):
    """The rowcol pass on gathered rows (x [T, N] read through a plan of random top-k routing, unweighted
    and weighted as the layer's x_rows and d_rows), the layer's MN-major column scales; on CUDA for each
    band width of the tile walk (MOK_QUANT_GATHER_BAND, performance log v51), outputs checked bitwise
    against band 0 (row-major). Bytes counted as for rowcol of the gathered tensor [M, N] (M = the plan's
    rows), so that reading x fewer than top_k times shows as more than the copy's speed."""
    T, K, E = gather
    x = torch.randn(T, N, device=dev, dtype=torch.bfloat16)
    topk = torch.rand(T, E, device=dev).topk(K, dim=1).indices
    plan = mok.functional.moe_plan(topk, E)
    w = torch.rand(T, K, device=dev, dtype=torch.float32)
    M = plan.src_of_row.numel()
    out = []
    for label, wt in (("", None), (" weighted", w)):
        def run(_i, wt=wt):
            return torch.ops.mok.quantize_fp8_rowcol_gather(x, plan.src_of_row, wt, K, "blockwise_1x128", True,
                                                            "blockwise_1x128")
        nbytes = 2 * M * N + sum(t.numel() * t.element_size() for t in run(0))
        bands = GATHER_BANDS if dev.type == "cuda" else ("default",)
        want = common.with_env("MOK_QUANT_GATHER_BAND", "0", run)(0) if dev.type == "cuda" else None
        for band in bands:
            fn = run if band == "default" else common.with_env("MOK_QUANT_GATHER_BAND", band, run)
            same = want is None or all(torch.equal(u.view(torch.uint8), v.view(torch.uint8))
                                       for u, v in zip(fn(0), want))
            t = common.bench(fn, dev, iters=args.iters, warmup=args.warmup, flush_l2=args.flush_l2)
            tbps = nbytes / t["median_ms"] / 1e9
            impl = f"rowcol gather{label} band {band}" + ("" if same else " (OUTPUTS DIFFER)")
            out.append(dict(shape=name, impl=impl, M=M, N=N, ms=t["median_ms"], tbps=tbps, vs_copy=tbps / copy_tbps))
        del want
    # recipe="mxfp8"'s gathered qdq (both bf16 copies, the plan's segments), bytes as 6 per gathered element
    def qdq(_i):
        return torch.ops.mok.qdq_mxfp8_gather(x, plan.src_of_row, None, K, plan.offsets, True, True)
    want = common.with_env("MOK_QUANT_GATHER_BAND", "0", qdq)(0) if dev.type == "cuda" else None
    for band in GATHER_BANDS if dev.type == "cuda" else ("default",):
        fn = qdq if band == "default" else common.with_env("MOK_QUANT_GATHER_BAND", band, qdq)
        same = want is None or all(torch.equal(u.view(torch.int16), v.view(torch.int16)) for u, v in zip(fn(0), want))
        t = common.bench(fn, dev, iters=args.iters, warmup=args.warmup, flush_l2=args.flush_l2)
        tbps = 6 * M * N / t["median_ms"] / 1e9
        impl = f"qdq mxfp8 gather rows+cols band {band}" + ("" if same else " (OUTPUTS DIFFER)")
        out.append(dict(shape=name, impl=impl, M=M, N=N, ms=t["median_ms"], tbps=tbps, vs_copy=tbps / copy_tbps))
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    common.add_common_args(p, "bench_quant", iters=20, warmup=3)
    args = p.parse_args(argv)
    dev, env = common.start_run(args)
    rows = []
    for name, (M, N) in (QUICK_SHAPES if args.quick else SHAPES).items():
        x = torch.randn(M, N, device=dev, dtype=torch.bfloat16)
        copy = common.bench(lambda _i: x.clone(), dev, iters=args.iters, warmup=args.warmup, flush_l2=args.flush_l2)
        copy_tbps = 4 * M * N / copy["median_ms"] / 1e9
        rows.append(dict(shape=name, impl="copy", M=M, N=N, ms=copy["median_ms"], tbps=copy_tbps, vs_copy=1.0))
        for recipe in mok.fp8.RECIPES:
            q, s = mok.fp8.quantize(x, recipe)
            nbytes = 2 * M * N + q.numel() + s.numel() * s.element_size()
            t = common.bench(lambda _i: mok.fp8.quantize(x, recipe), dev, iters=args.iters, warmup=args.warmup,
                             flush_l2=args.flush_l2)
            tbps = nbytes / t["median_ms"] / 1e9
            rows.append(dict(shape=name, impl=recipe, M=M, N=N, ms=t["median_ms"], tbps=tbps, vs_copy=tbps / copy_tbps))
        for recipe in mok.fp8.ROWCOL_RECIPES:
            rc = mok.fp8.quantize_rowcol(x, recipe)
            nbytes = 2 * M * N + sum(t.numel() * t.element_size() for t in rc)
            del rc
            impls = {"rowcol " + recipe: lambda _i: mok.fp8.quantize_rowcol(x, recipe),
                     "unfused " + recipe: lambda _i: (mok.fp8.quantize(x, recipe),
                                                      mok.fp8.quantize(x.t().contiguous(), recipe))}
            if dev.type == "cuda":
                # the launcher's kernel choices forced (MOK_QUANT_ROWCOL_STRIP: 0 = one CTA per tile, else
                # tiles per strip), outputs checked bitwise against the default's
                want = mok.fp8.quantize_rowcol(x, recipe)
                for label, value in (("per-tile", "0"), ("strip4", "4"), ("strip8", "8")):
                    fn = common.with_env("MOK_QUANT_ROWCOL_STRIP", value,
                                         lambda _i, r=recipe: mok.fp8.quantize_rowcol(x, r))
                    same = all(torch.equal(u.view(torch.uint8), v.view(torch.uint8)) for u, v in zip(fn(0), want))
                    impls[f"rowcol {label} {recipe}" + ("" if same else " (OUTPUTS DIFFER)")] = fn
                del want
            for impl, fn in impls.items():
                t = common.bench(fn, dev, iters=args.iters, warmup=args.warmup, flush_l2=args.flush_l2)
                tbps = nbytes / t["median_ms"] / 1e9
                rows.append(dict(shape=name, impl=impl, M=M, N=N, ms=t["median_ms"], tbps=tbps,
                                 vs_copy=tbps / copy_tbps))
        # the column-wise copy in 128 x 128 tiles (fp8_wgrad="tiled", v50), the layer's MN-major scales,
        # against the same call with 1 x 128 columns (its bytes: the fewer column scales)
        for col in ("blockwise_1x128", "blockwise_128x128"):
            fn = lambda _i, c=col: torch.ops.mok.quantize_fp8_rowcol(x, "blockwise_1x128", True, c)  # noqa: E731
            nbytes = 2 * M * N + sum(t.numel() * t.element_size() for t in fn(0))
            t = common.bench(fn, dev, iters=args.iters, warmup=args.warmup, flush_l2=args.flush_l2)
            tbps = nbytes / t["median_ms"] / 1e9
            rows.append(dict(shape=name, impl=f"rowcol mn cols {col}", M=M, N=N, ms=t["median_ms"], tbps=tbps,
                             vs_copy=tbps / copy_tbps))
        if name in GATHERS:
            rows += gathered_rows(name, N, GATHERS[name], dev, args, copy_tbps)
        # MXFP8 quantise-dequantise (the recipe="mxfp8" path): bf16 in, bf16 MXFP8-rounded copies out
        offsets = torch.tensor([0, M], dtype=torch.int32, device=dev)
        qdq = {"qdq mxfp8 rows": (lambda _i: mok.fp8.qdq_mxfp8(x), 4 * M * N),
               "qdq mxfp8 rows+cols": (lambda _i: mok.fp8.qdq_mxfp8(x, offsets=offsets, rows=True, cols=True),
                                       6 * M * N)}
        for impl, (fn, nbytes) in qdq.items():
            t = common.bench(fn, dev, iters=args.iters, warmup=args.warmup, flush_l2=args.flush_l2)
            tbps = nbytes / t["median_ms"] / 1e9
            rows.append(dict(shape=name, impl=impl, M=M, N=N, ms=t["median_ms"], tbps=tbps, vs_copy=tbps / copy_tbps))
        # the FP8 dgrad's W^T codes (mok._fp8_experts.transpose_expert_codes, v65): mok's byte transpose
        # against torch's strided copy, bytes read + written
        q = mok.fp8.quantize(x, "blockwise_128x128")[0].view(1, M, N)
        for impl, fn in (("transpose codes mok", lambda _i: torch.ops.mok.transpose_fp8_codes(q)),
                         ("transpose codes torch", lambda _i: q.transpose(1, 2).contiguous())):
            t = common.bench(fn, dev, iters=args.iters, warmup=args.warmup, flush_l2=args.flush_l2)
            tbps = 2 * M * N / t["median_ms"] / 1e9
            rows.append(dict(shape=name, impl=impl, M=M, N=N, ms=t["median_ms"], tbps=tbps, vs_copy=tbps / copy_tbps))
        # a weight's codes for the forward and the FP8 dgrad (x as one expert [1, M, N]; v66): one kernel
        # against the quantisation then the byte transpose, bytes as rowcol (input + both copies + scales)
        if M % 128 == 0:
            w = x.view(1, M, N)
            fused = lambda _i: torch.ops.mok.quantize_fp8_weight_rowcol(w)  # noqa: E731
            nbytes = 2 * M * N + sum(t.numel() * t.element_size() for t in fused(0))
            for impl, fn in (("weight codes fused", fused),
                             ("weight codes quant+transpose", lambda _i: torch.ops.mok.transpose_fp8_codes(
                                 mok.fp8_gemm.quantize_weight_blockwise(w)[0]))):
                t = common.bench(fn, dev, iters=args.iters, warmup=args.warmup, flush_l2=args.flush_l2)
                tbps = nbytes / t["median_ms"] / 1e9
                rows.append(dict(shape=name, impl=impl, M=M, N=N, ms=t["median_ms"], tbps=tbps,
                                 vs_copy=tbps / copy_tbps))
        q = w = None
        x = None  # frees the shape's input before the next (a del would hide x from the lambdas above for pyflakes)
        common.free_memory(dev)
    print("\n" + common.format_table(rows, COLUMNS))
    common.write_results(args.out, env, rows, COLUMNS, "FP8 quantisers against the copy ceiling",
                         ["TB/s = (bf16 input + E4M3 codes + scales) bytes / time; copy: 2 x input bytes.",
                          "rowcol: input + both code copies + both scale tensors; unfused: the same bytes, "
                          "two quantisations and a transpose.",
                          "qdq mxfp8: bf16 input + bf16 output(s) (rows: 4 bytes per element, rows+cols: 6).",
                          "transpose codes: 1-byte codes [M, N] -> [N, M], 2 bytes per element (read + write).",
                          "weight codes: 128 x 128 codes of x and of x^T (the FP8 forward's and dgrad's), bytes as "
                          "rowcol; quant+transpose: the same outputs by two passes.",
                          "rowcol gather: rows of x [T, N] through a top-k plan (M = its rows); bytes as rowcol of "
                          "the gathered [M, N]; band: MOK_QUANT_GATHER_BAND (0: tiles row-major)."])


if __name__ == "__main__":
    main()
